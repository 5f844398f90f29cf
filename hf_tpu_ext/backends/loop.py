"""The one training loop of the backends that run their own (TensorFlow, Keras 3): :class:`StepLoop`.

A backend keeps only its compiled step behind :class:`StepBackend` (run ``k`` steps from global step ``s`` ->
their mean losses; its batches of a call, put on its devices; evaluate; save a checkpoint; keep the best weights;
the learning rate at a step; whether a signal was seen). Everything else is decided here, once:

* device calls of ``--steps_per_execution`` steps, cut at each epoch's end and the run's last step; logging,
  evaluation and checkpoints at call boundaries by :func:`hf_tpu_ext.cadence.crossed`;
* the logging window (every logged loss is the mean of the per-step losses since the previous entry, carried
  over a resume by the checkpoint's ``loss_window``), the steady (median) step time, tokens/s and MFU
  (:class:`LoopMeter`), the progress bar;
* best-model tracking (:class:`hf_tpu_ext.best_metric.BestTracker`);
* a signal is a save: at the next call boundary (after that call's logs, evaluation and scheduled checkpoint)
  the step reached is checkpointed unless it was, then ``KeyboardInterrupt``
  (:func:`hf_tpu_ext.interrupts.check`); the final checkpoint of a finished run (a signal during the last call
  or its save does not raise: the run goes on to its export within the grace budget); the segment's results.

No framework is imported here: tests drive the loop with a pure-Python backend (tests/test_step_loop.py).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Sequence, Tuple

from hf_tpu_ext import interrupts
from hf_tpu_ext.backends.base import run_progress
from hf_tpu_ext.backends.trackio_log import log_entry
from hf_tpu_ext.cadence import crossed, executions, is_epoch_end
from hf_tpu_ext.outputs import data_place, format_log_entry
from hf_tpu_ext.step_window import StepWindow

logger = logging.getLogger("hf_tpu_ext")

#: per-step times kept for the steady rate (the last ones only, in a window allocated once: memory stays flat
#: from the first step however long the run is)
STEADY_WINDOW = 10_000

Call = Tuple[int, int]  # (first global step, steps) of one device call


class BatchSource(Protocol):
    """The batches of the calls in order: ``get((start, k))`` -> what :meth:`StepBackend.run_steps` takes."""

    def get(self, call: Call) -> Any: ...

    def close(self) -> None: ...


class StepBackend(Protocol):
    """What a backend gives :class:`StepLoop`: its compiled step and the few things only it can do.

    Attributes:
        model: the framework model (callbacks' model; ``model.stop_training`` ends the loop).
        steps_per_execution: optional: optimizer steps per device call, when the backend owns that number (its
            batches are stacked to it); without it the loop reads ``args.steps_per_execution``.
    """

    model: Any

    def open_batches(self, calls: Iterable[Call]) -> BatchSource:
        """The batches of ``calls`` (each ``(first global step, steps)``), built and put on the devices ahead."""

    def run_steps(self, batch: Any, start: int, k: int) -> Sequence[float]:
        """Run ``k`` optimizer steps from global step ``start``; the ``k`` per-step mean losses, once done."""

    def learning_rate(self, step: int) -> float:
        """The learning rate at global ``step``."""

    def evaluate(self) -> Dict[str, float]:
        """``eval_loss``, ``perplexity``, ``eval_accuracy`` (and probe scores); {} without a validation split."""

    def save(self, step: int, fields: Dict[str, Any]) -> None:
        """Checkpoint global ``step`` as one unit (the run's ``on_save`` included); ``fields``: the loop's own
        metadata to keep with it (:meth:`StepLoop.checkpoint_fields`: ``loss_window``, ``fit_metrics``)."""

    def keep_best(self, step: int, key: str, value: float) -> None:
        """Keep the model weights of the new best evaluation (``--load_best_model_at_end``)."""

    def signalled(self) -> bool:
        """Whether a SIGINT/SIGTERM was seen (by any process of the run: every process calls it at once)."""

    def write_scalars(self, entry: Dict[str, Any]) -> None:
        """The log entry into the backend's TensorBoard writer (nothing without ``--report_to tensorboard``)."""


class Unbuffered:
    """A :class:`BatchSource` that builds each call's batch when asked (``produce(start, k)``), no thread."""

    def __init__(self, produce: Callable[[int, int], Any]):
        self.produce = produce

    def get(self, call: Call) -> Any:
        return self.produce(*call)

    def close(self) -> None:
        return None


def restored_loss_window(meta: Optional[Dict[str, Any]], step: int) -> Tuple[float, int]:
    """``(loss sum, steps)`` of the logging window a checkpoint's metadata (``loss_window``) kept at ``step``;
    ``(0.0, 0)`` for another step or a checkpoint written before the window was kept."""
    window = (meta or {}).get("loss_window") or {}
    if step > 0 and int((meta or {}).get("global_step", -1)) == int(step) and int(window.get("steps", 0)) > 0:
        return float(window["loss_sum"]), int(window["steps"])
    return 0.0, 0


class LoopMeter:
    """Loss sums and step times of one loop (one process's segment of the run).

    Args:
        tokens_per_step: global batch x sequence length (tokens per optimizer step).
        window: ``(loss sum, steps)`` of the logging window restored with the checkpoint.
        rate_of_first_call: a log entry with only the first (compiling) call in its window still gives
            tokens/s (of that call; the TensorFlow backend's entries); False: none until a steady call ran.
    """

    def __init__(self, tokens_per_step: int, window=(0.0, 0), rate_of_first_call: bool = False):
        self.tokens_per_step = int(tokens_per_step)
        self.window_loss, self.window_n = float(window[0]), int(window[1])
        self.rate_of_first_call = rate_of_first_call
        self.train_loss_sum, self.train_loss_n = 0.0, 0
        self.window_times: List[float] = []  # seconds per step since the last log entry
        self.steady = StepWindow(STEADY_WINDOW)  # (seconds, 1) per step: a window of steps, not of calls
        self.first_step: Optional[float] = None  # seconds of the first call (tracing + compilation), whatever N
        self.first_steps = 0  # optimizer steps of that call
        self.steps_run = 0
        self.tokens_per_second: Optional[float] = None
        self.t_start = time.perf_counter()

    def add(self, losses: Sequence[float], seconds: float) -> None:
        """One device call of ``len(losses)`` optimizer steps that took ``seconds`` (the per-step mean losses)."""
        n = len(losses)
        per_step = seconds / max(n, 1)
        if self.first_step is None:  # the run's first call is left out of the rates when later calls exist
            self.first_step = float(seconds)  # its wall time is the first step's: N=4 is not a quarter of it
            self.first_steps = n
        else:
            self.window_times += [per_step] * n
            self.steady.add_steps(per_step, n)
        total = float(sum(losses))
        self.steps_run += n
        self.train_loss_sum += total
        self.train_loss_n += n
        self.window_loss += total
        self.window_n += n

    def log_entry(self, step: int, learning_rate: float, place: Dict[str, Any], mfu_of: Callable) -> Dict[str, Any]:
        """The log entry at ``step`` (the window's mean loss, tokens/s of its median step, MFU); resets the window.
        ``place``: :func:`~hf_tpu_ext.backends.base.run_progress` of the step (``epoch`` or ``stream_passes``).
        Only the first (compiling) call in the window: no ``tokens_per_second``/``mfu`` unless
        ``rate_of_first_call``."""
        entry = {"loss": round(self.window_loss / max(self.window_n, 1), 6), "learning_rate": learning_rate,
                 **place, "step": step}
        times = self.window_times
        if not times and self.rate_of_first_call and self.first_step is not None:
            times = [self.first_step / max(self.first_steps, 1)]
        if times:
            # rounded once: the log line and the progress bar show the same figure
            self.tokens_per_second = round(self.tokens_per_step / max(statistics.median(times), 1e-9), 1)
            entry["tokens_per_second"] = self.tokens_per_second
            mfu = mfu_of(self.tokens_per_second)
            if mfu is not None:
                entry["mfu"] = round(mfu, 4)
        self.window_loss, self.window_n, self.window_times = 0.0, 0, []
        return entry

    def steady_rate(self) -> float:
        """Tokens per median training step (0.0 before any step)."""
        if self.first_step is None:
            return 0.0
        if not self.steady:  # only the first call: its steps' mean (compilation included)
            return self.tokens_per_step * self.steps_run / max(self.first_step, 1e-9)
        return self.tokens_per_step / max(self.steady.median(), 1e-9)

    def results(self, step: int, steps_per_epoch: int, global_batch_size: int, mfu_of: Callable) -> Dict[str, Any]:
        """The segment's figures: ``train_loss``, ``train_runtime`` (s), wall-time rates, the steady rate, MFU
        (``mfu``, ``mfu_peak_flops``, ``mfu_peak_source`` or ``mfu_note``), ``global_step``, ``epoch``,
        ``tokens_seen``."""
        runtime = time.perf_counter() - self.t_start
        steady = self.steady_rate()
        return {
            **mfu_of.summary(steady),
            "train_loss": self.train_loss_sum / max(self.train_loss_n, 1),
            "train_runtime": runtime,
            "train_steps_per_second": self.steps_run / max(runtime, 1e-9),
            "train_samples_per_second": self.steps_run * global_batch_size / max(runtime, 1e-9),
            "train_tokens_per_second": self.steps_run * self.tokens_per_step / max(runtime, 1e-9),
            # tokens per median training step (the figure the log lines show); train_*_per_second above are the
            # segment's wall-time rates (transformers' meaning)
            "steady_tokens_per_second": steady,
            "global_step": step,
            "epoch": step / steps_per_epoch,
            "tokens_seen": step * self.tokens_per_step,
        }

    def window_fields(self) -> Dict[str, Any]:
        """``{"loss_window": {"loss_sum", "steps"}}``: the logging window, for a checkpoint's metadata."""
        return {"loss_window": {"loss_sum": float(self.window_loss), "steps": int(self.window_n)}}


def format_entry(entry: Dict[str, Any], explain: bool = True) -> str:
    """:func:`hf_tpu_ext.outputs.format_log_entry` (``explain``: say what the steady rate is); an entry after only
    the first, compiling call has no steady rate: ``step 1 (epoch 0.01): loss 6.2278, lr 5e-05 | no steady rate yet
    (only the compiling first call ran)``."""
    if "loss" in entry and "learning_rate" in entry and "tokens_per_second" not in entry:
        return (f"step {entry['step']}{data_place(entry)}: loss {entry['loss']:.4f}, "
                f"lr {entry['learning_rate']:.3g} | no steady rate yet (only the compiling first call ran)")
    return format_log_entry(entry, explain)


class StepLoop:
    """One ``fit`` of a backend's compiled step (see the module doc): :meth:`run`, then :meth:`finish`.

    Args:
        steps: the backend's :class:`StepBackend`.
        args: the training arguments (``steps_per_execution``, ``logging_steps``, ``eval_strategy``,
            ``eval_steps``, ``save_strategy``, ``save_steps``, ``eval_on_start``, ``load_best_model_at_end``,
            ``disable_tqdm``).
        plan: ``steps_per_epoch``, ``total_steps``, ``global_batch_size``, ``seq_length`` (a
            :class:`~hf_tpu_ext.backends.base.RunPlan`).
        callbacks: a Keras ``CallbackList`` (tf_keras or Keras 3) the loop fires the epoch and batch hooks of.
        log_history: the run's log history, appended to in place.
        start_step: the global step trained from; window: the restored logging window ``(loss sum, steps)``.
        mfu_of: ``mfu_of(tokens_per_second) -> fraction or None`` with ``mfu_of.summary(rate)``
            (:class:`hf_tpu_ext.mfu.MFUMeter`).
        best: the run's :class:`~hf_tpu_ext.best_metric.BestTracker` (None: no best model).
        saved_step: the step whose checkpoint exists already (the one restored; None: none), never saved twice.
        is_chief: this process logs and shows the progress bar; trackio: the initialised ``trackio`` module of
            ``--report_to trackio`` (None: not used).
        batch_end_after_eval: ``on_train_batch_end`` after the call's evaluation and checkpoint, its logs with the
            evaluation (tf_keras); False: right after the call (Keras 3: a callback's batch clock covers the
            call only).
        rate_of_first_call: see :class:`LoopMeter`.
        passes_of: ``passes_of(step)``, a ``--streaming`` run's passes over the stream after ``step``
            (:meth:`~hf_tpu_ext.backends.base.Backend.data_passes`): its log entries say them, not an epoch.
    """

    def __init__(self, steps: StepBackend, args, plan, callbacks, log_history: List[Dict[str, Any]],
                 start_step: int, window=(0.0, 0), mfu_of: Optional[Callable] = None, best=None,
                 saved_step: Optional[int] = None, is_chief: bool = True, trackio=None,
                 batch_end_after_eval: bool = False, rate_of_first_call: bool = False,
                 passes_of: Optional[Callable[[int], Optional[int]]] = None):
        self.steps, self.args, self.plan, self.callbacks = steps, args, plan, callbacks
        self.log_history = log_history
        self.start_step = self.step = int(start_step)
        # a StepBackend that owns its steps per call (the Keras trainer) says it; else --steps_per_execution
        self.n = int(getattr(steps, "steps_per_execution", None) or getattr(args, "steps_per_execution", 1) or 1)
        self.meter = LoopMeter(plan.global_batch_size * plan.seq_length, window, rate_of_first_call)
        self.mfu_of = mfu_of if mfu_of is not None else _no_mfu
        self.best, self.saved_step, self.is_chief, self.trackio = best, saved_step, is_chief, trackio
        self.batch_end_after_eval = batch_end_after_eval
        self.passes_of = passes_of
        self.logs: Dict[str, Any] = {}

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        """``on_train_begin``, the evaluation of ``--eval_on_start``, then train to the plan's last step (or a
        callback's ``stop_training``, or a signal); returns the global step reached.

        Raises:
            FloatingPointError: a non-finite training loss (the message names the step).
        """
        cb, spe, total = self.callbacks, self.plan.steps_per_epoch, self.plan.total_steps
        step = self.start_step
        progress = self._progress()
        batches = self.steps.open_batches(executions(step, total, spe, self.n))
        try:
            cb.on_train_begin()
            if self.args.eval_on_start and step == 0:
                self.evaluate_and_log(0)
            epoch, epoch_started = step // spe, False
            for start, k in executions(step, total, spe, self.n):
                # a signal is a save: seen at this call boundary (after the last call's logs, evaluation and
                # scheduled checkpoint), the loop ends and finish() checkpoints this step
                if self.steps.signalled():
                    break
                if not epoch_started:
                    cb.on_epoch_begin(epoch)
                    epoch_started = True
                batch_index = step - epoch * spe
                cb.on_train_batch_begin(batch_index)
                step = self._call(batches.get((start, k)), start, k, batch_index, progress)
                if is_epoch_end(step, spe, total):
                    if self.args.eval_strategy == "epoch" and "eval_loss" not in self.logs:
                        self.logs.update(self.evaluate_and_log(step))
                    if self.args.save_strategy == "epoch":
                        self.save(step)
                    cb.on_epoch_end(epoch, dict(self.logs))
                    epoch, epoch_started = epoch + 1, False
                if getattr(self.steps.model, "stop_training", False):
                    break
        finally:
            batches.close()
            if progress is not None:
                progress.close()
        return step

    def _call(self, batch, start: int, k: int, batch_index: int, progress) -> int:
        """One device call of ``k`` steps and what follows it at its boundary; returns the step reached."""
        args = self.args
        t_call = time.perf_counter()
        losses = [float(x) for x in self.steps.run_steps(batch, start, k)]  # waits for the steps
        self.meter.add(losses, time.perf_counter() - t_call)
        bad = [i for i, x in enumerate(losses) if not math.isfinite(x)]
        if bad:
            raise FloatingPointError(
                f"Training loss became {losses[bad[0]]} at global step {start + bad[0] + 1}; lower "
                "--learning_rate or use --warmup_ratio. The last checkpoint in output_dir is intact.")
        prev, step = start, start + k
        self.step = step
        interrupts.kill_for_test("train_step", step)  # tests: a SIGTERM/SIGKILL after step N (train_step@N)
        self._after_call(prev, step, sum(losses) / k, progress, k)
        if not self.batch_end_after_eval:
            self.callbacks.on_train_batch_end(batch_index + k - 1, self.logs)
        if args.eval_strategy == "steps" and crossed(prev, step, args.eval_steps):
            self.logs.update(self.evaluate_and_log(step))
        if args.save_strategy == "steps" and crossed(prev, step, args.save_steps):
            self.save(step)
        if self.batch_end_after_eval:
            self.callbacks.on_train_batch_end(batch_index + k - 1, self.logs)
        return step

    def _after_call(self, prev: int, step: int, loss: float, progress, k: int) -> None:
        """The call's ``logs`` (for callbacks), the log entry when the logging cadence is crossed, the progress bar."""
        spe, total = self.plan.steps_per_epoch, self.plan.total_steps
        lr = float(self.steps.learning_rate(step))
        self.logs = {"loss": loss, "learning_rate": lr, "global_step": step, "epoch": step / spe}
        if crossed(prev, step, self.args.logging_steps) or step == total:
            self.log(self.meter.log_entry(step, lr, self.place(step), self.mfu_of))
        if progress is not None:
            progress.update(k)
            postfix = {"loss": f"{loss:.4f}"}
            if self.meter.tokens_per_second is not None:
                postfix["tokens/s"] = f"{self.meter.tokens_per_second:,.0f}"
            progress.set_postfix(postfix)

    def _progress(self):
        if not self.is_chief or getattr(self.args, "disable_tqdm", False):
            return None
        from tqdm.auto import tqdm

        # no rate of tqdm's own: the one throughput figure is the logged one (training steps only)
        return tqdm(total=self.plan.total_steps, initial=self.start_step, desc="train", unit="step",
                    dynamic_ncols=True, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]")

    # ------------------------------------------------------------------ what the boundaries do
    def evaluate_and_log(self, step: int) -> Dict[str, float]:
        """Evaluate, log the entry at ``step``, keep the weights of a new best (``--load_best_model_at_end``)."""
        metrics = self.steps.evaluate()
        if metrics:
            self.log(dict(metrics, **self.place(step), step=step))
            if self.best is not None and self.best.offer(metrics, step) and getattr(
                    self.args, "load_best_model_at_end", False):
                self.steps.keep_best(step, self.best.key, self.best.value)
        return metrics

    def place(self, step: int) -> Dict[str, Any]:
        """The log entries' ``epoch`` (or a stream's ``stream_passes``) at ``step``: :func:`run_progress`."""
        streamed = self.passes_of is not None and getattr(self.plan, "streaming", False)
        return run_progress(self.plan, step, self.passes_of(step) if streamed else None)

    def log(self, entry: Dict[str, Any]) -> None:
        """One log entry: the log history, the console (chief), TensorBoard, trackio (chief)."""
        self.log_history.append(entry)
        if self.is_chief:
            explain = "tokens_per_second" in entry and not getattr(self, "_rate_explained", False)
            logger.info(format_entry(entry, explain))  # what the steady rate is: said on its first line only
            self._rate_explained = getattr(self, "_rate_explained", False) or explain
        self.steps.write_scalars(entry)
        if self.is_chief:
            log_entry(self.trackio, entry)

    def save(self, step: int) -> None:
        """The checkpoint unit of ``step``: the backend writes it with the loop's fields
        (:meth:`checkpoint_fields`), then it counts as saved (never saved twice). A second signal waits for it."""
        with interrupts.shielded():  # a second signal waits for the checkpoint to be whole
            self.steps.save(step, self.checkpoint_fields(step))
            self.saved_step = step

    def checkpoint_fields(self, step: int) -> Dict[str, Any]:
        """What a checkpoint of ``step`` keeps of this loop: ``loss_window`` (``{"loss_sum", "steps"}``, the
        logging window so far: a resume off a logging boundary logs the same means) and, once a step was timed,
        ``fit_metrics`` (:meth:`results` plus ``first_step_seconds``; JSON numbers and strings only: a resume
        that only finishes the export still reports them)."""
        fields: Dict[str, Any] = self.meter.window_fields()
        if self.meter.first_step is not None:
            figures = dict(self.results(step), first_step_seconds=self.meter.first_step)
            fields["fit_metrics"] = {k: v for k, v in figures.items()
                                     if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        return fields

    def finish(self, step: int) -> None:
        """After :meth:`run`: checkpoint ``step`` unless it is (the final checkpoint: a finished run can be
        extended and pushed; after a signal, the step reached), then raise after a signal that stopped the run
        before its last step (one after it lets the run finish its export and card within the grace budget).

        Raises:
            KeyboardInterrupt: after SIGINT/SIGTERM (:func:`hf_tpu_ext.interrupts.check`), once ``step`` is saved,
                when ``step`` is short of the plan's last step.
        """
        signalled = self.steps.signalled()
        if step != self.saved_step:
            if signalled and step < self.plan.total_steps:
                logger.info("signal received: saving step %d before stopping", step)
            self.save(step)
        if step < self.plan.total_steps:
            interrupts.check()

    def results(self, step: int) -> Dict[str, Any]:
        """The segment's figures so far (:meth:`LoopMeter.results`)."""
        return self.meter.results(step, self.plan.steps_per_epoch, self.plan.global_batch_size, self.mfu_of)


def _no_mfu(tokens_per_second: float) -> None:
    return None


_no_mfu.summary = lambda rate: {"mfu_note": "MFU left out: no FLOP count for this run"}
