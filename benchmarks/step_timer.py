"""A ``tf_keras`` callback that times every training step from the host clock, for the benchmarks.

It is registered as ``bench_step_timer`` when this module is imported, so ``hf-tpu train
--callbacks ...,bench_step_timer`` and a plain ``model.fit(callbacks=[StepTimer()])`` are timed the same way.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict, List, Optional

import tf_keras

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.errors import ArgumentError

#: every StepTimer built by ``from_run`` (``hf-tpu train`` builds callbacks itself; the benchmark reads them here)
INSTANCES: List["StepTimer"] = []


def summarize_intervals(intervals: List[float], warmup_steps: int) -> Dict[str, Any]:
    """Steady-state numbers of a list of per-step wall times.

    Args:
        intervals: seconds per optimizer step, in order; ``intervals[0]`` holds tracing/compilation.
        warmup_steps: leading steps left out of the steady state (>= 1 so the compiling step is out).

    Returns:
        dict with ``steps_measured`` (int), ``ms_per_step`` (median of the steady steps, ms),
        ``ms_per_step_mean`` (mean of the steady steps, ms: periodic costs such as saves count here),
        ``first_step_seconds`` (s) and ``compile_seconds`` (first step minus the median step, s).

    Raises:
        ArgumentError: ``warmup_steps < 1`` or no step is left after the warm-up.
    """
    if warmup_steps < 1:
        raise ArgumentError(f"warmup_steps must be >= 1 (the first step compiles), got {warmup_steps}.")
    steady = intervals[warmup_steps:]
    if not steady:
        raise ArgumentError(
            f"Only {len(intervals)} timed steps for a warm-up of {warmup_steps}; run more steps (--steps)."
        )
    median = statistics.median(steady)
    return {
        "steps_measured": len(steady),
        "ms_per_step": median * 1e3,
        "ms_per_step_mean": statistics.fmean(steady) * 1e3,
        "first_step_seconds": intervals[0],
        "compile_seconds": max(intervals[0] - median, 0.0),
    }


@register_callback("bench_step_timer", "Benchmarks: host wall time of every training step (begin to next begin).")
class StepTimer(tf_keras.callbacks.Callback):
    """Record the wall time of each optimizer step, from one ``on_train_batch_begin`` to the next.

    Measuring begin-to-begin counts everything the training loop does per step: the train-function call,
    logging, checkpointing and every other callback's hooks, wherever this callback sits in the list.
    It reads nothing from the device (both the hf-tpu trainer and ``model.fit`` with default settings
    wait for each step's loss on the host, so the clock follows the device). Assumes one optimizer step
    per call (``steps_per_execution=1``).

    Attributes:
        begins: ``time.perf_counter()`` seconds at each ``on_train_batch_begin``.
        intervals: seconds per step (``begins[i+1] - begins[i]``); the last step has no interval.
        cpu_begins: ``time.process_time()`` at the same points (this process's CPU seconds, all threads: under
            contention a steadier comparison than wall time; ``summary``'s ``cpu_ms_per_step``).
    """

    def __init__(self):
        super().__init__()
        self.begins: List[float] = []
        self.cpu_begins: List[float] = []
        self.first_step_end_wall: Optional[float] = None  # time.time() when the first step finished

    @classmethod
    def from_run(cls, run) -> "StepTimer":
        """Build one for an ``hf-tpu train`` run and remember it in :data:`INSTANCES`."""
        timer = cls()
        INSTANCES.append(timer)
        return timer

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.perf_counter())
        self.cpu_begins.append(time.process_time())

    def on_train_batch_end(self, batch, logs=None):
        if self.first_step_end_wall is None:
            self.first_step_end_wall = time.time()

    def first_step_latency(self) -> Optional[float]:
        """Seconds from this process's start (``psutil``) to the end of the first training step (None before it)."""
        if self.first_step_end_wall is None:
            return None
        import psutil

        return self.first_step_end_wall - psutil.Process().create_time()

    @property
    def intervals(self) -> List[float]:
        return [b - a for a, b in zip(self.begins, self.begins[1:])]

    def summary(self, warmup_steps: int) -> Dict[str, Any]:
        """:func:`summarize_intervals` of this run, plus ``cpu_ms_per_step`` (median process CPU ms of the same
        steady steps)."""
        summary = summarize_intervals(self.intervals, warmup_steps)
        summary["cpu_ms_per_step"] = median_cpu_ms(self.cpu_begins, warmup_steps)
        return summary


def median_cpu_ms(cpu_begins: List[float], warmup_steps: int) -> Optional[float]:
    """Median process CPU milliseconds per steady step from ``time.process_time()`` at each step's begin."""
    import statistics

    steady = [b - a for a, b in zip(cpu_begins, cpu_begins[1:])][max(1, warmup_steps):]
    return statistics.median(steady) * 1e3 if steady else None


def last_instance() -> Optional[StepTimer]:
    """The StepTimer the latest ``hf-tpu train`` run built (None if it had none)."""
    return INSTANCES[-1] if INSTANCES else None
