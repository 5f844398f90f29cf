"""The Keras backend's training loop: device calls of ``--steps_per_execution`` optimizer steps.

One call runs ``N = --steps_per_execution`` optimizer steps (:func:`hf_tpu_ext.backends.keras.step.make_multi_step`:
a ``lax.fori_loop`` over ``N`` stacked global batches inside the one jitted program), cut short at an epoch's end
and at the run's last step, as the TensorFlow backend cuts its calls (:func:`executions`). Logging, evaluation,
checkpoints, signals and the callbacks' batch hooks happen at call boundaries: a cadence that ``N`` does not
divide fires at the first boundary past each multiple (``_crossed``, the TensorFlow backend's rule), so
``--logging_steps 10 --steps_per_execution 4`` logs at steps 12, 20, 32, ... Every logged loss is the mean of the
per-step losses since the previous entry, whatever ``N``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np

from hf_tpu_ext import interrupts
from hf_tpu_ext.backends.keras.meter import LoopMeter

logger = logging.getLogger("hf_tpu_ext")


def crossed(prev_step: int, step: int, every: int) -> bool:
    """True when a multiple of ``every`` lies in ``(prev_step, step]`` (a call of several steps may jump over it)."""
    return every > 0 and step // every > prev_step // every


def executions(start: int, total: int, steps_per_epoch: int, steps_per_execution: int) -> Iterator[Tuple[int, int]]:
    """``(first global step, steps)`` of each device call from ``start`` to ``total``: ``steps_per_execution``
    steps, fewer at an epoch's end and at ``total`` (the TensorFlow backend's cut)."""
    step = int(start)
    while step < total:
        n = min(int(steps_per_execution), total - step, (step // steps_per_epoch + 1) * steps_per_epoch - step)
        yield step, n
        step += n


def stack_batches(batches: List[Dict[str, np.ndarray]], steps: int) -> Dict[str, np.ndarray]:
    """``steps`` batches ``[A, B/A, ...]`` as one ``[steps, A, B/A, ...]`` batch; missing ones (a short call) are
    zeros, never trained on (the call's step count stops the loop before them)."""
    out = {}
    for key in batches[0]:
        values = [b[key] for b in batches]
        values += [np.zeros_like(values[0])] * (steps - len(values))
        out[key] = np.stack(values)
    return out


class TrainLoop:
    """One ``fit`` of :class:`~hf_tpu_ext.backends.keras.backend.KerasBackend` (see the module doc).

    Args:
        backend: the built backend (its state, steps, callbacks' model, ``_save``/``_log``/... hooks).
        callbacks: a ``keras.callbacks.CallbackList``.
        on_save: the run's save hook; start_step: the global step trained from; window: the restored logging
        window ``(loss sum, steps)``.
    """

    def __init__(self, backend, callbacks, on_save, start_step: int, window=(0.0, 0)):
        self.b, self.cb, self.on_save = backend, callbacks, on_save
        self.start_step = int(start_step)
        self.n = int(getattr(backend.args, "steps_per_execution", 1) or 1)
        plan = backend.plan
        self.meter = LoopMeter(plan.global_batch_size * plan.seq_length, window)
        self.logs: Dict[str, Any] = {}

    # ------------------------------------------------------------------ device calls
    def produce(self, item: Tuple[int, int]):
        """The device batch of one call (runs in the prefetch thread)."""
        from hf_tpu_ext.backends.keras.step import split_micro_batches

        b = self.b
        start, k = item
        micro = [split_micro_batches(b.train_batches(s), b.accumulation) for s in range(start, start + k)]
        if b.on_tensorflow:
            from hf_tpu_ext.backends.keras.step_tf import to_tensors

            return [to_tensors(m) for m in micro]
        if self.n == 1:
            return b.placement.put_batch(micro[0], axis=1)
        return b.placement.put_batch(stack_batches(micro, self.n), axis=2)

    def execute(self, batch, start: int, k: int) -> np.ndarray:
        """Run ``k`` optimizer steps from global step ``start``; their mean losses (float64 ``[k]``), once done."""
        b = self.b
        if b.on_tensorflow:  # Keras on TensorFlow: one compiled step per optimizer step, called k times
            out = [b.train_step(one) for one in batch]
            sums, counts = [float(s) for s, _ in out], [float(c) for _, c in out]
        elif self.n == 1:
            b.state, loss_sum, count = b.train_step(b.state, batch, np.int32(start))
            sums, counts = [float(loss_sum)], [float(count)]
        else:
            b.state, loss_sums, cnts = b.train_step(b.state, batch, np.int32(start), np.int32(k))
            sums, counts = np.asarray(loss_sums, np.float64)[:k], np.asarray(cnts, np.float64)[:k]
        return np.asarray(sums, np.float64) / np.maximum(np.asarray(counts, np.float64), 1.0)

    # ------------------------------------------------------------------ the loop
    def run(self, prefetch, progress) -> int:
        """Train to the plan's last step (or a callback's ``stop_training``); returns the global step reached.

        Raises:
            KeyboardInterrupt: after SIGINT/SIGTERM, once the step reached is checkpointed.
            FloatingPointError: a non-finite training loss (the message names the step).
        """
        b, cb, args = self.b, self.cb, self.b.args
        spe, total = b.plan.steps_per_epoch, b.plan.total_steps
        step = self.start_step
        epoch, epoch_started = step // spe, False
        for start, k in executions(step, total, spe, self.n):
            # a signal is a save: at this call boundary (after the call's logs, evaluation and scheduled
            # checkpoint) write this step's checkpoint if none was, then stop with KeyboardInterrupt
            b._stop_if_signalled(step, self.start_step, self.on_save)
            if not epoch_started:
                cb.on_epoch_begin(epoch)
                epoch_started = True
            batch_index = step - epoch * spe
            cb.on_train_batch_begin(batch_index)
            batch = prefetch.get((start, k))
            t_call = time.perf_counter()
            losses = self.execute(batch, start, k)  # waits for the steps
            self.meter.add(losses.tolist(), time.perf_counter() - t_call)
            bad = np.flatnonzero(~np.isfinite(losses))
            if bad.size:
                raise FloatingPointError(
                    f"Training loss became {losses[bad[0]]} at global step {start + int(bad[0]) + 1}; lower "
                    "--learning_rate or use --warmup_ratio. The last checkpoint in output_dir is intact.")
            prev, step = step, step + k
            b._step = step
            interrupts.kill_for_test("train_step", step)  # tests: a SIGTERM/SIGKILL after step N (train_step@N)
            self._after_call(prev, step, float(np.mean(losses)), progress, k)
            # before evaluation and checkpoints: a callback's batch clock and compile watch cover the call only
            cb.on_train_batch_end(batch_index + k - 1, self.logs)
            if args.eval_strategy == "steps" and crossed(prev, step, args.eval_steps):
                self.logs.update(b._evaluate_and_log(step))
            if args.save_strategy == "steps" and crossed(prev, step, args.save_steps):
                b._save(step, self.on_save)
            if step % spe == 0 or step == total:
                if args.eval_strategy == "epoch" and "eval_loss" not in self.logs:
                    self.logs.update(b._evaluate_and_log(step))
                if args.save_strategy == "epoch":
                    b._save(step, self.on_save)
                cb.on_epoch_end(epoch, dict(self.logs))
                epoch, epoch_started = epoch + 1, False
            if getattr(b.model, "stop_training", False):
                break
        return step

    def _after_call(self, prev: int, step: int, loss: float, progress, k: int) -> None:
        """The call's ``logs`` (for callbacks), the log entry when the logging cadence is crossed, the progress bar."""
        b, args = self.b, self.b.args
        spe, total = b.plan.steps_per_epoch, b.plan.total_steps
        lr = b.schedule.value(step)
        self.logs = {"loss": loss, "learning_rate": lr, "global_step": step, "epoch": step / spe}
        if crossed(prev, step, args.logging_steps) or step == total:
            b._log(self.meter.log_entry(step, lr, step / spe, b.mfu_of))
        if progress is not None:
            progress.update(k)
            postfix = {"loss": f"{loss:.4f}"}
            if self.meter.tokens_per_second is not None:
                postfix["tokens/s"] = f"{self.meter.tokens_per_second:,.0f}"
            progress.set_postfix(postfix)
