"""SIGINT/SIGTERM, owned here for the whole process: a signal is a save.

One module holds every signal decision of hf-tpu-ext (the training run, the backends' loops, the Hub push
session and the push callbacks of plain ``model.fit``/``Trainer`` scripts ask it, none installs a handler of
its own):

* :class:`handling` -- the training run's handler for SIGINT and SIGTERM, around all its phases. The
  **first** signal is recorded (:func:`received`) and starts the grace budget (:func:`set_grace`,
  ``--save_on_signal_timeout``: on a preemptible VM or Kubernetes, SIGTERM comes ~30 s before SIGKILL):

  - inside :func:`deferring` (a backend loop whose ``checks_interrupts`` is true, or a bounded wait for
    pushes) nothing is raised: the loop finishes the step in progress, writes that step's checkpoint and
    raises ``KeyboardInterrupt`` through :func:`check`; the run then waits for the pushes at most
    :func:`seconds_left` and exits 128 + signum (130: SIGINT, 143: SIGTERM) with the resume line;
  - elsewhere (data loading, export) it raises ``KeyboardInterrupt`` at once.

  A **second** signal raises ``KeyboardInterrupt`` at once, anywhere: the run stops waiting and exits --
  except inside :func:`shielded` (a checkpoint being written): there it is raised when the save is complete,
  so the checkpoint the resume line and ``training_summary.json`` name is whole; a third signal raises at once.

  Raising from a handler lands anywhere -- inside TensorFlow's checkpoint saver ("Exiting device scope
  without proper scope nesting") or an eager op that swallows it -- which is why the first signal is only
  recorded while a loop polls.

* :func:`on_signal` -- for code that holds resources over a run (the Hub push session): ``callback(signum)``
  is called once, at the first signal, in the main thread, inside the handler (keep it short, never block or
  raise; e.g. note the deadline ``time.monotonic() + seconds_left()`` and return). It returns a handle whose
  ``remove()`` unregisters; bound methods are held weakly (a registered object can still be collected).
  Outside a run (a plain script with a push callback) the first registration also installs a SIGTERM
  handler: it calls the callbacks, then raises ``SystemExit(143)`` so ``finally`` blocks and ``atexit`` run
  (SIGTERM's default would end the process with no cleanup); SIGINT stays Python's ``KeyboardInterrupt``.

* :func:`kill_for_test` -- the test hooks ``HF_TPU_EXT_TEST_KILL_AT=<phase>`` (:data:`KILL_ENV`): SIGKILL this
  process at a named moment (the training run's phases; ``checkpoint_weights``: a checkpoint's weight files are
  written, its trainer state is not), and ``HF_TPU_EXT_TEST_SIGNAL_AT=<phase>`` (:data:`SIGNAL_ENV`): send it
  SIGTERM there, once (what a preemption at that moment does). Only tests set them. The points are
  :data:`FAULT_POINTS`; a name not among them (at a call site or in either variable) raises ``ValueError``.

A wait after a signal (:func:`wait_until`) leaves :func:`exit_reserve` seconds of the grace budget for the exit
itself (closing the pusher, ``training_summary.json``), so the process is gone within the budget whatever the
Hub's latency.

State is per process (signals are delivered to the main thread only).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import weakref
from typing import Callable, Iterator, List, Optional

logger = logging.getLogger("hf_tpu_ext")

KILL_ENV = "HF_TPU_EXT_TEST_KILL_AT"
SIGNAL_ENV = "HF_TPU_EXT_TEST_SIGNAL_AT"
#: every fault-injection point, in the order a run reaches them: ``data`` (the data are ready, the model is not
#: built), ``train_step`` (a device call ended; ``train_step@N``: at step N), ``checkpoint_weights`` (a checkpoint's
#: weights written, its trainer state not), ``saved`` (a checkpoint and its trainer state written), ``train`` (after
#: the first checkpoint), ``checkpoint`` (after the last checkpoint, before the export), ``export`` (half-way
#: through it), ``card`` (the card written), ``push`` (the final push in flight), ``after_results`` (every phase
#: done, before the exit)
FAULT_POINTS = ("data", "train_step", "checkpoint_weights", "saved", "train", "checkpoint", "export", "card", "push",
                "after_results")
#: the grace budget when none is set: fits the 30 s between SIGTERM and SIGKILL on preemptible TPU VMs and in
#: Kubernetes' default ``terminationGracePeriodSeconds``, with 5 s left for the exit itself
DEFAULT_GRACE_SECONDS = 25.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)

_received: Optional[int] = None  # the first signal number received since reset()
_received_at: Optional[float] = None  # time.monotonic() of the first signal
_count = 0
_deferring = False
_shielding = False  # inside shielded(): a checkpoint is being written
_shield_deferred: Optional[int] = None  # a signal shielded() held back, raised when the save is done
_grace = DEFAULT_GRACE_SECONDS
_callbacks: List["_Callback"] = []
_lock = threading.Lock()
_run_handler_active = False
_fallback_previous = None  # the SIGTERM handler the fallback replaced (outside a run)
_fallback_installed = False
_test_signal_sent = False  # the SIGTERM of the test hook was sent (once per run)


def reset() -> None:
    """Forget received signals (at the start of a run); the grace budget and callbacks stay."""
    global _received, _received_at, _count, _deferring, _test_signal_sent, _shielding, _shield_deferred
    _received, _received_at, _count, _deferring, _test_signal_sent = None, None, 0, False, False
    _shielding, _shield_deferred = False, None


def set_grace(seconds: Optional[float]) -> None:
    """The grace budget: seconds from the first signal until the process should be gone (``None``: default).

    Raises:
        ValueError: a negative or non-finite number.
    """
    global _grace
    value = DEFAULT_GRACE_SECONDS if seconds is None else float(seconds)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"the grace budget must be a finite number of seconds >= 0, got {seconds!r}")
    _grace = value


def grace() -> float:
    """The grace budget in seconds (see :func:`set_grace`)."""
    return _grace


def exit_reserve() -> float:
    """Seconds of the grace budget a wait after a signal leaves for the exit: a tenth of it, at most 2 s."""
    return min(2.0, 0.1 * _grace)


def record(signum: int) -> int:
    """Note a signal (the first one starts the grace budget and calls the :func:`on_signal` callbacks).

    Returns:
        How many signals were received since :func:`reset` (1 for the first).
    """
    global _received, _received_at, _count
    first = _received is None
    if first:
        _received, _received_at = int(signum), time.monotonic()
    _count += 1
    if first:
        _notify(int(signum))
    return _count


def received() -> Optional[int]:
    """The first signal number received since :func:`reset` (``signal.SIGINT``/``SIGTERM``), or None."""
    return _received


def count() -> int:
    """Signals received since :func:`reset` (a second one means: stop waiting, exit at once)."""
    return _count


def seconds_left() -> Optional[float]:
    """Seconds left of the grace budget since the first signal (>= 0), or ``None`` before any signal."""
    if _received_at is None:
        return None
    return max(0.0, _grace - (time.monotonic() - _received_at))


@contextlib.contextmanager
def deferring(enabled: bool = True) -> Iterator[None]:
    """While inside, a first signal is recorded, not raised; the loop calls :func:`check` at safe points."""
    global _deferring
    before, _deferring = _deferring, bool(enabled)
    try:
        yield
    finally:
        _deferring = before


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Around a checkpoint write: a second signal inside does not cut it short; it is raised as
    ``KeyboardInterrupt`` once the block finishes (a third one raises at once: the user insists).

    Why: a double Ctrl+C lands 0-30 ms apart, inside the signal's own save; raised there it left a checkpoint
    without its trainer state while the run still printed the resume line for it (issue 31).

    Raises:
        KeyboardInterrupt: a second signal came while inside (after the block), or a third one (at once).
    """
    global _shielding, _shield_deferred
    before, _shielding = _shielding, True
    try:
        yield
    finally:
        _shielding = before
        held = _shield_deferred
        if not before:
            _shield_deferred = None
    if held is not None and not before:
        raise KeyboardInterrupt(f"{signal.Signals(held).name} (second signal)")


def check() -> None:
    """Raise ``KeyboardInterrupt`` (named after the signal) when a signal was received; call at safe points.

    Raises:
        KeyboardInterrupt: SIGINT or SIGTERM was received.
    """
    if _received is not None:
        raise KeyboardInterrupt(signal.Signals(_received).name)


def wait_until(done: Callable[[], bool], timeout: Optional[float], poll: float = 0.1) -> bool:
    """Wait until ``done()`` is true, at most ``timeout`` seconds (``None``: no limit), or -- once a signal was
    received, before or during the wait -- at most what is left of the grace budget less :func:`exit_reserve`.
    A first signal does not stop the wait (it is deferred); a second one raises ``KeyboardInterrupt``.

    Returns:
        ``done()`` at the end.
    """
    end = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
    with deferring(True):
        while not done():
            now = time.monotonic()
            left = seconds_left()
            left = None if left is None else left - exit_reserve()
            if (end is not None and now >= end) or (left is not None and left <= 0):
                break
            limit = min(x for x in (poll, left, None if end is None else end - now) if x is not None)
            time.sleep(max(0.0, limit))
    return bool(done())


# ---------------------------------------------------------------------------------------------- handlers
class handling:
    """The training run's SIGINT/SIGTERM handler while inside (see the module doc); restores the old ones.

    Reentrant use is not supported (one run per process at a time). Outside the main thread it installs
    nothing (signals are delivered to the main thread only).
    """

    def __init__(self, grace_seconds: Optional[float] = None):
        self.previous = {}
        self.grace_seconds = grace_seconds

    @property
    def received(self) -> Optional[int]:
        return _received

    @staticmethod
    def _handler(signum, frame):
        global _shield_deferred
        n = record(signum)
        if n == 1 and _deferring:
            return
        if _shielding and n <= 2:  # the save in progress finishes first (shielded())
            _shield_deferred = signum
            return
        name = signal.Signals(signum).name
        raise KeyboardInterrupt(name if _count == 1 else f"{name} (second signal)")

    def __enter__(self) -> "handling":
        global _run_handler_active
        reset()
        if self.grace_seconds is not None:
            set_grace(self.grace_seconds)
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handler)
            _run_handler_active = True
        return self

    def __exit__(self, *exc):
        global _run_handler_active
        for sig, old in self.previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        _run_handler_active = False
        return False


class finished:
    """After a completed run (its files written, its pushes settled): a SIGINT/SIGTERM while the results are
    shown is noted, not raised -- nothing is left to save, and dying by the signal would end a finished run
    with 143 and no word (issue 31). ``late`` is the signal number noted (or None).

    On exit the old handlers come back (an in-process caller keeps its own), unless ``then`` is given: then
    ``then(signum)`` handles a signal for the rest of the process (the console script's teardown, ~2.5 s after
    a TensorFlow run, where the old handlers would still end the complete run with 143 or a traceback). Outside
    the main thread it installs nothing."""

    def __init__(self, then: Optional[Callable[[int], None]] = None):
        self.late: Optional[int] = None
        self.previous = {}
        self.then = then

    def _note(self, signum, frame):
        self.late = self.late or int(signum)

    def __enter__(self) -> "finished":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self.previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc):
        then = self.then
        for sig, old in self.previous.items():
            if then is not None:
                signal.signal(sig, lambda signum, frame: then(int(signum)))
            else:
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
        return False


class _Callback:
    def __init__(self, callback: Callable[[int], None]):
        self._ref = (weakref.WeakMethod(callback) if hasattr(callback, "__self__") and hasattr(callback, "__func__")
                     else (lambda cb=callback: cb))

    def get(self) -> Optional[Callable[[int], None]]:
        return self._ref()

    def remove(self) -> None:
        """Unregister (idempotent); the SIGTERM fallback is removed with the last callback."""
        with _lock:
            if self in _callbacks:
                _callbacks.remove(self)
            last = not any(c.get() is not None for c in _callbacks)
        if last:
            _remove_fallback()


def on_signal(callback: Callable[[int], None]) -> _Callback:
    """Call ``callback(signum)`` at the first SIGINT/SIGTERM (see the module doc); returns a handle with ``remove()``.

    Outside a run's :class:`handling`, SIGTERM gets a handler that calls the callbacks and raises
    ``SystemExit(143)`` (the previous Python-level handler, if any, is called instead of raising).
    """
    handle = _Callback(callback)
    with _lock:
        _callbacks[:] = [c for c in _callbacks if c.get() is not None]
        _callbacks.append(handle)
    _install_fallback()
    return handle


def _notify(signum: int) -> None:
    with _lock:
        callbacks = [c.get() for c in _callbacks]
    for cb in callbacks:
        if cb is None:
            continue
        try:
            cb(signum)
        except Exception:  # a callback must not turn a signal into another error
            logger.debug("signal callback %r failed", cb, exc_info=True)


def _fallback_sigterm(signum, frame):
    """SIGTERM outside a run (a plain script pushing with a callback): tell the callbacks, then unwind."""
    first = _received is None
    if first:
        record(signum)
    previous = _fallback_previous
    if callable(previous):
        return previous(signum, frame)
    raise SystemExit(128 + signum)


def _install_fallback() -> None:
    global _fallback_previous, _fallback_installed
    if _fallback_installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
        if current is handling._handler or _run_handler_active:
            return  # the run's handler already calls the callbacks
        if current in (signal.SIG_DFL, None) or callable(current):
            _fallback_previous = current if callable(current) else None
            signal.signal(signal.SIGTERM, _fallback_sigterm)
            _fallback_installed = True
    except (ValueError, OSError):  # not the main interpreter / no signals here
        pass


def _remove_fallback() -> None:
    global _fallback_previous, _fallback_installed
    if not _fallback_installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is _fallback_sigterm:
            signal.signal(signal.SIGTERM, _fallback_previous or signal.SIG_DFL)
    except (ValueError, OSError):
        pass
    _fallback_previous, _fallback_installed = None, False


# ---------------------------------------------------------------------------------------------- test hook
def kill_for_test(phase: str, step: Optional[int] = None) -> None:
    """SIGKILL this process when ``HF_TPU_EXT_TEST_KILL_AT`` names ``phase``, SIGTERM it (once) when
    ``HF_TPU_EXT_TEST_SIGNAL_AT`` does (tests only; see the module doc); ``phase@N`` only when ``step`` is ``N``
    (e.g. ``checkpoint_weights@20``: while saving step 20).

    Raises:
        ValueError: ``phase``, or the point a variable names, is not one of :data:`FAULT_POINTS` (a misspelt
            point would otherwise never fire, and the test that set it would pass without its fault).
    """
    global _test_signal_sent
    if phase not in FAULT_POINTS:
        raise ValueError(f"kill_for_test: {phase!r} is not a fault-injection point; one of {', '.join(FAULT_POINTS)}.")
    if _names(os.environ.get(SIGNAL_ENV), phase, step) and not _test_signal_sent:
        _test_signal_sent = True
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode, as a SIGTERM from outside
    if _names(os.environ.get(KILL_ENV), phase, step):
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


def _names(wanted: Optional[str], phase: str, step: Optional[int]) -> bool:
    """Whether a test hook's ``<phase>[@step]`` value names ``phase`` (at ``step``)."""
    name, _, at = (wanted or "").partition("@")
    if name and name not in FAULT_POINTS:
        raise ValueError(f"{wanted!r} names no fault-injection point; use one of {', '.join(FAULT_POINTS)}[@step].")
    return name == phase and (not at or (step is not None and int(at) == int(step)))
