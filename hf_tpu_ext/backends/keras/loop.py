"""The Keras backend's compiled step behind :class:`hf_tpu_ext.backends.loop.StepBackend` (:class:`KerasSteps`).

The loop itself (cadence, logging window, best model, signal save, final checkpoint) is the one of
:mod:`hf_tpu_ext.backends.loop`. Here: one device call runs ``N = --steps_per_execution`` optimizer steps
(:func:`hf_tpu_ext.backends.keras.step.make_multi_step`: a ``lax.fori_loop`` over ``N`` stacked global batches
inside the one jitted program); its batches are built and put on the devices by a background thread two calls
ahead (:class:`hf_tpu_ext.data.numpy_batches.Prefetcher`); several processes agree on a signal at each call
boundary.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from hf_tpu_ext import interrupts

logger = logging.getLogger("hf_tpu_ext")


def stack_batches(batches: List[Dict[str, np.ndarray]], steps: int) -> Dict[str, np.ndarray]:
    """``steps`` batches ``[A, B/A, ...]`` as one ``[steps, A, B/A, ...]`` batch; missing ones (a short call) are
    zeros, never trained on (the call's step count stops the loop before them)."""
    out = {}
    for key in batches[0]:
        values = [b[key] for b in batches]
        values += [np.zeros_like(values[0])] * (steps - len(values))
        out[key] = np.stack(values)
    return out


class KerasSteps:
    """:class:`~hf_tpu_ext.backends.keras.backend.KerasBackend`'s step, data, checkpoint and best-model calls.

    Args:
        backend: the built backend (its state, compiled steps, placement, schedule).
        on_save: the run's save hook ``on_save(step, checkpoint folder)``.
    """

    def __init__(self, backend, on_save):
        self.b, self.on_save = backend, on_save
        self.n = int(getattr(backend.args, "steps_per_execution", 1) or 1)

    @property
    def model(self):
        return self.b.model

    # ------------------------------------------------------------------ device calls
    def open_batches(self, calls: Iterable[Tuple[int, int]]):
        from hf_tpu_ext.data.numpy_batches import Prefetcher

        return Prefetcher(self.produce, calls, depth=2)

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

    def run_steps(self, batch, start: int, k: int) -> np.ndarray:
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
        b._step = start + k
        return np.asarray(sums, np.float64) / np.maximum(np.asarray(counts, np.float64), 1.0)

    def learning_rate(self, step: int) -> float:
        return self.b.schedule.value(step)

    def evaluate(self) -> Dict[str, float]:
        return self.b.evaluate()

    def write_scalars(self, entry: Dict[str, Any]) -> None:
        if self.b.summary_writer is not None:
            self.b.summary_writer.scalars(entry)

    # ------------------------------------------------------------------ saves and signals
    def save(self, step: int, fields: Dict[str, Any]) -> None:
        """``checkpoint-<step>/`` (process 0 writes) with the loop's ``fields``, then the run's ``on_save`` (its
        trainer state completes it)."""
        path = self.b.save(step, fields)
        if path is not None:
            interrupts.kill_for_test("checkpoint_weights", step)  # weights written, trainer state not yet
            self.on_save(step, path)
            logger.info("saved checkpoint %s", path)  # complete only now: its trainer state is written

    def keep_best(self, step: int, key: str, value: float) -> None:
        from hf_tpu_ext.backends.keras.best import keep_best

        keep_best(self.b, step, key, value)

    def signalled(self) -> bool:
        """Whether a SIGINT/SIGTERM was seen (:func:`hf_tpu_ext.interrupts.received`) by any process.

        Several processes agree (:meth:`~hf_tpu_ext.backends.keras.placement.Placement.any_process`, called by all
        at the same call boundary): a signal seen by one stops all at this step; a process that saw none records a
        SIGTERM, so every process saves the one checkpoint and exits 143."""
        import signal

        seen = interrupts.received() is not None
        placement = self.b.placement
        if placement is not None:
            seen = placement.any_process(seen)
        if seen and interrupts.received() is None:
            logger.info("another process received a signal: stopping at step %d with it", self.b._step)
            interrupts.record(signal.SIGTERM)
        return seen
