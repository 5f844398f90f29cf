"""The Keras backend's train state and compiled step behind :class:`hf_tpu_ext.backends.loop.StepBackend`
(:class:`KerasTrainer`).

The loop itself (cadence, logging window, best model, signal save, final checkpoint) is the one of
:mod:`hf_tpu_ext.backends.loop`. Here: one device call runs ``N = --steps_per_execution`` optimizer steps
(:func:`hf_tpu_ext.backends.keras.step.make_multi_step`: a ``lax.fori_loop`` over ``N`` stacked global batches
inside the one jitted program); its batches are built and put on the devices by a background thread two calls
ahead (:class:`hf_tpu_ext.data.numpy_batches.Prefetcher`); several processes agree on a signal at each call
boundary.
"""

from __future__ import annotations

import logging
import signal
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from hf_tpu_ext import interrupts
from hf_tpu_ext.backends.keras import step_tf
from hf_tpu_ext.backends.keras.best import keep_best
from hf_tpu_ext.backends.keras.tensor_files import variables_from_arrays
from hf_tpu_ext.backends.keras.step import (jit_eval_step, jit_train_step, make_eval_step, make_multi_step,
                                            make_train_step, split_micro_batches, state_to_host)
from hf_tpu_ext.data.numpy_batches import Prefetcher
from hf_tpu_ext.distributed import OWN_LINE

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


class KerasTrainer:
    """The Keras backend's training state and compiled steps, and its side of the shared step loop
    (:class:`~hf_tpu_ext.backends.loop.StepBackend`).

    Owns what the step needs and changes: the train state ``(trainable, non_trainable, optimizer variables)``
    (replicated by ``placement``; Keras-on-TensorFlow: the Keras variables themselves, ``state`` None), the global
    step reached, the compiled train/eval steps (built here, once, from the run's
    :class:`~hf_tpu_ext.precision.PrecisionPlan`) and ``steps_per_execution`` (read once, here; the step loop and
    the stacked batches use this one value).

    Args:
        backend: the built :class:`~hf_tpu_ext.backends.keras.backend.KerasBackend` (its model, optimizer, data,
            schedule, evaluation and checkpoint writing, through their public members).
        precision: the run's precision plan (``bf16_dots``: the XLA:CPU dot routing of the step).
        seed: the run's seed (dropout keys); accumulation: micro-batches per step.
        steps_per_execution: ``--steps_per_execution`` (optimizer steps per device call; None or 0: 1).
    """

    def __init__(self, backend, precision, seed: int, accumulation: int, steps_per_execution: Optional[int]):
        self.b, self.on_save = backend, None
        self.placement, self.on_tensorflow = backend.placement, backend.on_tensorflow
        self.accumulation = int(accumulation)
        self.n = self.steps_per_execution = int(steps_per_execution or 1)
        self.step = 0
        self.state = None
        model, optimizer = backend.model, backend.optimizer
        if self.on_tensorflow:
            self.train_step = step_tf.make_train_step(model, optimizer, self.accumulation)
            self.eval_step = step_tf.make_eval_step(model)
        else:
            step = make_train_step(model, optimizer, int(seed), self.accumulation, bf16_dots=precision.bf16_dots)
            self.train_step = jit_train_step(make_multi_step(step, self.n) if self.n > 1 else step, self.placement)
            self.eval_step = jit_eval_step(make_eval_step(model, bf16_dots=precision.bf16_dots))
        model.train_function = self.train_step  # the recompile guard watches this function
        self.state_from_variables()

    @property
    def model(self):
        return self.b.model

    # ------------------------------------------------------------------ state <-> Keras variables
    def _variables(self):
        return (self.b.model.trainable_variables, self.b.model.non_trainable_variables, self.b.optimizer.variables)

    def state_from_variables(self) -> None:
        """The train state from the Keras variables (after building or restoring them); no-op on TensorFlow."""
        if self.on_tensorflow:  # the TensorFlow step updates the variables themselves
            return
        self.state = tuple(self.placement.put_replicated([v.value for v in vs]) for vs in self._variables())

    def variables_from_state(self) -> None:
        """Write the train state back into the Keras variables (export, callbacks reading weights)."""
        if self.on_tensorflow:
            return
        for variables, values in zip(self._variables(), self.state):  # one array on the host at a time
            variables_from_arrays(variables, values)

    def host_state(self) -> Tuple[list, list, list]:
        """``(trainable, non_trainable, optimizer)`` values as NumPy (a device read every process takes part in)."""
        if self.on_tensorflow:
            from keras import ops  # Keras is imported by now (the backend's setup)

            return tuple([ops.convert_to_numpy(v.value) for v in vs] for vs in self._variables())
        return state_to_host(self.state)

    def eval_sums(self, batch) -> Tuple[float, float, float]:
        """``(loss sum, correct, count)`` of one host evaluation batch ``[B, ...]`` (this process's rows)."""
        if self.on_tensorflow:
            out = self.eval_step(step_tf.to_tensors(batch))
        else:
            out = self.eval_step(self.state[0], self.state[1], self.placement.put_batch(batch, axis=0))
        return tuple(float(x) for x in out)

    # ------------------------------------------------------------------ device calls
    def open_batches(self, calls: Iterable[Tuple[int, int]]):
        return Prefetcher(self.produce, calls, depth=2)

    def produce(self, item: Tuple[int, int]):
        """The device batch of one call (runs in the prefetch thread)."""
        start, k = item
        batches = self.b.train_batches
        micro = [split_micro_batches(batches(s), self.accumulation) for s in range(start, start + k)]
        if self.on_tensorflow:
            return [step_tf.to_tensors(m) for m in micro]
        if self.n == 1:
            return self.placement.put_batch(micro[0], axis=1)
        return self.placement.put_batch(stack_batches(micro, self.n), axis=2)

    def run_steps(self, batch, start: int, k: int) -> np.ndarray:
        """Run ``k`` optimizer steps from global step ``start``; their mean losses (float64 ``[k]``), once done."""
        if self.on_tensorflow:  # Keras on TensorFlow: one compiled step per optimizer step, called k times
            out = [self.train_step(one) for one in batch]
            sums, counts = [float(s) for s, _ in out], [float(c) for _, c in out]
        elif self.n == 1:
            self.state, loss_sum, count = self.train_step(self.state, batch, np.int32(start))
            sums, counts = [float(loss_sum)], [float(count)]
        else:
            self.state, loss_sums, cnts = self.train_step(self.state, batch, np.int32(start), np.int32(k))
            sums, counts = np.asarray(loss_sums, np.float64)[:k], np.asarray(cnts, np.float64)[:k]
        self.step = start + k
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
        keep_best(self.b, step, key, value)

    def signalled(self) -> bool:
        """Whether a SIGINT/SIGTERM was seen (:func:`hf_tpu_ext.interrupts.received`) by any process.

        Several processes agree (:meth:`~hf_tpu_ext.backends.keras.placement.Placement.any_process`, called by all
        at the same call boundary): a signal seen by one stops all at this step; a process that saw none records a
        SIGTERM, so every process saves the one checkpoint and exits 143."""
        seen = interrupts.received() is not None
        placement = self.placement
        if placement is not None:
            seen = placement.any_process(seen)
        if seen and interrupts.received() is None:
            logger.info("another process received a signal: stopping at step %d with it", self.step,
                        extra=OWN_LINE)  # only this process knows: tagged [process i] on the others
            interrupts.record(signal.SIGTERM)
        return seen
