"""When something periodic happens in a loop of device calls: the one definition every writer reads.

A device call may run several optimizer steps (``--steps_per_execution N``), so the loop only sees the steps
at call boundaries. A cadence of ``every`` steps (logging, evaluation, checkpoints) fires at the first boundary
at or past each multiple of ``every`` (:func:`crossed`): ``--logging_steps 10 --steps_per_execution 4`` logs at
steps 12, 20, 32, ... Calls are cut at each epoch's end and at the run's last step (:func:`executions`), so
epoch-end work always sees its step. No framework, no I/O.
"""

from __future__ import annotations

from typing import Iterator, Tuple


def crossed(prev_step: int, step: int, every: int) -> bool:
    """True when a multiple of ``every`` lies in ``(prev_step, step]`` (a call of several steps may jump over it).

    Args:
        prev_step: the global step before the call; step: the global step after it (``>= prev_step``).
        every: the cadence in steps; ``<= 0`` (or None-like 0) never fires.
    """
    return every > 0 and step // every > prev_step // every


def executions(start: int, total: int, steps_per_epoch: int, steps_per_execution: int) -> Iterator[Tuple[int, int]]:
    """``(first global step, steps)`` of each device call from ``start`` to ``total``: ``steps_per_execution``
    steps, fewer at an epoch's end and at ``total``."""
    step = int(start)
    while step < total:
        n = min(int(steps_per_execution), total - step, (step // steps_per_epoch + 1) * steps_per_epoch - step)
        yield step, n
        step += n


def is_epoch_end(step: int, steps_per_epoch: int, total_steps: int) -> bool:
    """Whether global ``step`` closes an epoch (or the run)."""
    return step % steps_per_epoch == 0 or step == total_steps
