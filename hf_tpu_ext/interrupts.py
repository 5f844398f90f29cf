"""Deferred SIGINT/SIGTERM: a training loop stops at its next step boundary, not inside TensorFlow.

Raising ``KeyboardInterrupt`` from a signal handler lands it anywhere: inside TensorFlow's checkpoint saver
(which then fails with "Exiting device scope without proper scope nesting" and writes nothing), or inside an
eager op, where TensorFlow may swallow it and training goes on. So while a loop that polls :func:`check` runs
(:func:`deferring` is on), the run's handler only records the signal (:func:`record`); the loop calls
:func:`check` at its safe points (after each train-function call, after evaluations and checkpoints) and
raises ``KeyboardInterrupt`` there. The run's handler raises at once for a second signal (a loop stuck in one
step, or a wait for pending pushes that should stop).

State is per process (signals are delivered to the main thread only).
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator, Optional

_received: Optional[int] = None  # the first signal number received since reset()
_count = 0
_deferring = False


def reset() -> None:
    """Forget received signals (at the start of a run)."""
    global _received, _count, _deferring
    _received, _count, _deferring = None, 0, False


def record(signum: int) -> int:
    """Note a signal; returns how many were received since :func:`reset` (1 for the first)."""
    global _received, _count
    if _received is None:
        _received = int(signum)
    _count += 1
    return _count


def received() -> Optional[int]:
    """The first signal number received since :func:`reset` (``signal.SIGINT``/``SIGTERM``), or None."""
    return _received


def is_deferring() -> bool:
    """True while a loop that polls :func:`check` runs (a first signal is only recorded then)."""
    return _deferring


@contextlib.contextmanager
def deferring(enabled: bool = True) -> Iterator[None]:
    """While inside, a first signal is recorded, not raised; the loop calls :func:`check` at safe points."""
    global _deferring
    before, _deferring = _deferring, bool(enabled)
    try:
        yield
    finally:
        _deferring = before


def check() -> None:
    """Raise ``KeyboardInterrupt`` (named after the signal) when a signal was received; call at safe points.

    Raises:
        KeyboardInterrupt: SIGINT or SIGTERM was received.
    """
    if _received is not None:
        raise KeyboardInterrupt(signal.Signals(_received).name)
