"""Which process does what in a distributed run (accelerate-style helpers, TensorFlow flavour).

The chief is the process that writes the output folder and talks to the Hub. Work that every replica
must take part in (collective ops, checkpoint writes under MultiWorkerMirroredStrategy) must never sit
inside a chief-only branch.

JAX's multi-process start (the Keras backend): :func:`jax_distributed_arguments` reads ``JAX_NUM_PROCESSES``/
``JAX_PROCESS_ID`` (jax 0.10 reads only ``JAX_COORDINATOR_ADDRESS``) and the time-outs, and
:func:`initialize_jax_distributed` joins the processes, refusing bad input in one line.
"""

from __future__ import annotations

import atexit
import enum
import functools
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from typing import Callable, List, Optional


class DistributedType(str, enum.Enum):
    """The kind of ``tf.distribute`` strategy a run uses (mirrors accelerate's ``DistributedType``)."""

    NO = "NO"  # one device: OneDeviceStrategy / default strategy
    MULTI_DEVICE = "MULTI_DEVICE"  # MirroredStrategy over several local GPUs (or logical CPUs in tests)
    MULTI_WORKER = "MULTI_WORKER"  # MultiWorkerMirroredStrategy, TF_CONFIG set
    TPU = "TPU"  # TPUStrategy


def tf_config() -> dict:
    """The parsed ``TF_CONFIG`` environment variable (``{}`` when unset).

    Raises:
        ValueError: ``TF_CONFIG`` is set but is not JSON.
    """
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}); see the tf.distribute multi-worker guide.") from None


def process_index() -> int:
    """This process's index among the processes of a run: 0 is the chief. The one answer every module asks.

    In order: a multi-host JAX run (``jax.distributed.initialize`` done: ``jax.process_index()``); torch_xla's
    global ordinal when its runtime is loaded; an initialized ``torch.distributed`` group's rank; the
    ``RANK`` variable torchrun/accelerate set; ``TF_CONFIG`` (``chief`` is 0; ``worker`` i is i, or i + 1 when
    the cluster has a chief; other task types (``ps``, ``evaluator``) are never the chief). Nothing is imported
    or initialized to answer: only frameworks the process already loaded are asked.

    Raises:
        ValueError: ``TF_CONFIG`` is set but is not JSON.
    """
    import sys

    jax_distributed = sys.modules.get("jax._src.distributed")
    state = getattr(jax_distributed, "global_state", None)
    if state is not None and getattr(state, "client", None) is not None:
        return int(getattr(state, "process_id", 0) or 0)
    xla_runtime = sys.modules.get("torch_xla.runtime")
    if xla_runtime is not None:
        try:
            return int(xla_runtime.global_ordinal())
        except Exception:  # the runtime is not initialized in this process
            pass
    torch_distributed = sys.modules.get("torch.distributed")
    if torch_distributed is not None:
        try:
            if torch_distributed.is_available() and torch_distributed.is_initialized():
                return int(torch_distributed.get_rank())
        except Exception:
            pass
    if os.environ.get("JAX_PROCESS_ID", "").strip().isdigit():  # before jax.distributed.initialize (the run lock)
        return int(os.environ["JAX_PROCESS_ID"])
    if os.environ.get("RANK", "").strip().isdigit():
        return int(os.environ["RANK"])
    cfg = tf_config()
    task = cfg.get("task") or {}
    if not task:
        return 0
    task_type, index = task.get("type"), int(task.get("index", 0))
    if task_type == "chief":
        return 0
    if task_type == "worker":
        return index + (1 if "chief" in (cfg.get("cluster") or {}) else 0)
    return -1  # ps / evaluator tasks: not a training process that writes


def is_main_process() -> bool:
    """True on the chief (:func:`process_index` is 0): the process that writes the output folder and pushes."""
    return process_index() == 0


def on_main_process(fn):
    """Decorator: run ``fn`` only on the chief; other processes get ``None``.

    Use it only for host-side work (files, Hub requests), never around collective ops.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if is_main_process():
            return fn(*args, **kwargs)
        return None

    return wrapper


#: ``jax.distributed.initialize``'s own variable (the coordinator, ``host:port``; jax reads it itself)
JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
#: process count and this process's id: read here (jax 0.10 reads neither) and passed as arguments
JAX_NUM_PROCESSES, JAX_PROCESS_ID = "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
#: seconds to wait for every process to join (jax's ``initialization_timeout``; its default is 300)
JAX_INITIALIZATION_TIMEOUT = "HF_TPU_JAX_INITIALIZATION_TIMEOUT"
#: seconds without a heartbeat after which a process counts as lost and the others stop (default 30)
JAX_HEARTBEAT_TIMEOUT = "HF_TPU_JAX_HEARTBEAT_TIMEOUT"
DEFAULT_HEARTBEAT_TIMEOUT = 30
#: seconds the other processes wait at exit for process 0 (export, card, final push; jax's default is 300, which
#: a slow final push outlasts: they then abort with a C++ stack trace after a good run); a lost process 0 still
#: ends the wait within the heartbeat time-out (:class:`LostProcessWatch`)
JAX_SHUTDOWN_TIMEOUT = "HF_TPU_JAX_SHUTDOWN_TIMEOUT"
DEFAULT_SHUTDOWN_TIMEOUT = 3600


def _int_variable(environ, name: str, minimum: int):
    raw = str(environ.get(name, "")).strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(f"{name}={raw!r} is not an integer >= {minimum}: set it to one, or unset it.")
    return value


def jax_distributed_arguments(environ=None) -> dict:
    """Keyword arguments of ``jax.distributed.initialize`` from the environment (no JAX import).

    ``JAX_COORDINATOR_ADDRESS`` is left to JAX (it reads it itself); ``JAX_NUM_PROCESSES`` and
    ``JAX_PROCESS_ID`` become ``num_processes``/``process_id`` (absent on a TPU slice, Slurm or Open MPI: JAX finds
    them); ``HF_TPU_JAX_INITIALIZATION_TIMEOUT``, ``HF_TPU_JAX_HEARTBEAT_TIMEOUT`` and
    ``HF_TPU_JAX_SHUTDOWN_TIMEOUT`` (seconds) become ``initialization_timeout``, ``heartbeat_timeout_seconds``
    (default 30, so a lost process stops the others within a minute instead of JAX's 100 s; the watch's time-out,
    see :func:`initialize_jax_distributed`) and ``shutdown_timeout_seconds`` (default 3600: how long the others
    wait at exit for process 0's export and final push).

    Raises:
        ValueError: a variable is not an integer in range, the id is not below the count, or one of the two is
            set without the other (one line naming the variables).
    """
    env = os.environ if environ is None else environ
    count = _int_variable(env, JAX_NUM_PROCESSES, 1)
    index = _int_variable(env, JAX_PROCESS_ID, 0)
    if (count is None) != (index is None):
        raise ValueError(f"{JAX_NUM_PROCESSES} and {JAX_PROCESS_ID} go together: set both (0 <= id < count) "
                         "or neither (a TPU slice finds them itself).")
    if count is not None and index >= count:
        raise ValueError(f"{JAX_PROCESS_ID}={index} is not below {JAX_NUM_PROCESSES}={count}: "
                         f"number the processes 0 .. {count - 1}.")
    out = {"heartbeat_timeout_seconds": _int_variable(env, JAX_HEARTBEAT_TIMEOUT, 1) or DEFAULT_HEARTBEAT_TIMEOUT,
           "shutdown_timeout_seconds": _int_variable(env, JAX_SHUTDOWN_TIMEOUT, 1) or DEFAULT_SHUTDOWN_TIMEOUT}
    timeout = _int_variable(env, JAX_INITIALIZATION_TIMEOUT, 1)
    if timeout is not None:
        out["initialization_timeout"] = timeout
    if count is not None:
        out.update(num_processes=count, process_id=index)
    return out


def wait_for_coordinator(address: str, timeout: float, poll: float = 0.5) -> None:
    """Wait until ``address`` (``host:port``) accepts a TCP connection, at most ``timeout`` seconds.

    Why: jax 0.10's client aborts the whole process (a C++ ``LOG(FATAL)``, exit 134, a stack trace) when the
    coordinator does not answer in time; checked here first, a process other than 0 fails with one line instead.

    Raises:
        ValueError: the address is not ``host:port``, or nothing accepted a connection within ``timeout``.
    """
    host, _, port = str(address).strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{JAX_COORDINATOR_ADDRESS}={address!r} is not host:port (e.g. 10.0.0.2:8476).")
    deadline = time.monotonic() + float(timeout)
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(5.0, max(0.1, timeout))):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise ValueError(
                    f"The JAX coordinator {address} ({JAX_COORDINATOR_ADDRESS}) did not answer within the "
                    f"{timeout:g} s time-out ({JAX_INITIALIZATION_TIMEOUT}): {err.strerror or err}. Start process 0 "
                    "first and give every process the same address (host:port of process 0).") from None
        time.sleep(poll)


def initialize_jax_distributed() -> None:
    """``jax.distributed.initialize`` with :func:`jax_distributed_arguments`; a process other than 0 first waits
    for the coordinator (:func:`wait_for_coordinator`). Must run before anything touches JAX's devices.

    Raises:
        ValueError: a bad variable, an unreachable coordinator (the time-out named), or JAX's own refusal (one
            line each).
    """
    import jax

    kwargs = jax_distributed_arguments()
    address = os.environ.get(JAX_COORDINATOR_ADDRESS, "").strip()
    timeout = kwargs.get("initialization_timeout", 300)
    logging.getLogger("hf_tpu_ext").info(
        "jax.distributed: process %s of %s, coordinator %s (time-out %d s, lost-process heartbeat %d s)",
        kwargs.get("process_id", "?"), kwargs.get("num_processes", "?"), address or "found by JAX", timeout,
        kwargs["heartbeat_timeout_seconds"])
    if address and kwargs.get("process_id", 0) > 0:
        wait_for_coordinator(address, timeout)
    watch_timeout = kwargs["heartbeat_timeout_seconds"]
    kwargs["heartbeat_timeout_seconds"] = watch_timeout + JAX_HEARTBEAT_MARGIN  # the watch's line comes first
    try:
        jax.distributed.initialize(**kwargs)
        start_lost_process_watch(watch_timeout)
    except (ValueError, RuntimeError) as err:  # e.g. "Number of processes must be defined."
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise ValueError(f"jax.distributed.initialize refused (coordinator {address or 'found by JAX'}): {reason} "
                         f"Set {JAX_COORDINATOR_ADDRESS}, {JAX_NUM_PROCESSES} and {JAX_PROCESS_ID} on every process, "
                         "or run on a TPU slice, Slurm or Open MPI (found by JAX).") from None
    while _AFTER_INITIALIZE:  # e.g. the run lock, now that this host knows its id (errors are theirs: unchanged)
        _AFTER_INITIALIZE.pop(0)()


#: what waits for this host's process id (:func:`after_jax_initialize`)
_AFTER_INITIALIZE: List[Callable[[], None]] = []
#: ``HF_TPU_JAX_DISTRIBUTED=1``: this process is one of several (JAX finds the cluster: a TPU slice, Slurm, MPI)
JAX_DISTRIBUTED_SWITCH = "HF_TPU_JAX_DISTRIBUTED"


def jax_process_id_pending(environ=None) -> bool:
    """Whether this process will learn its id from ``jax.distributed.initialize`` and has not yet: JAX's
    multi-process start is asked for (``HF_TPU_JAX_DISTRIBUTED=1``, or ``JAX_COORDINATOR_ADDRESS`` without
    ``JAX_PROCESS_ID``: Slurm, Open MPI) and JAX is not initialized. Until then :func:`process_index` cannot say
    whether this host is the chief."""
    env = os.environ if environ is None else environ
    state = getattr(sys.modules.get("jax._src.distributed"), "global_state", None)
    if state is not None and getattr(state, "client", None) is not None:
        return False
    if str(env.get(JAX_PROCESS_ID, "")).strip():
        return False
    asked = str(env.get(JAX_DISTRIBUTED_SWITCH, "")).strip().lower() in ("1", "true", "yes")
    return asked or bool(str(env.get(JAX_COORDINATOR_ADDRESS, "")).strip())


def after_jax_initialize(fn: Callable[[], None]) -> None:
    """Call ``fn()`` once :func:`initialize_jax_distributed` has joined the processes (this host's id known)."""
    _AFTER_INITIALIZE.append(fn)


def cancel_after_jax_initialize(fn: Callable[[], None]) -> None:
    """Drop ``fn`` from what waits for the id (the run ended before JAX was initialized)."""
    if fn in _AFTER_INITIALIZE:
        _AFTER_INITIALIZE.remove(fn)


#: key-value store keys of the lost-process watch: ``<prefix><process id>`` holds a beat count, ``exited`` at exit
HEARTBEAT_KEY_PREFIX = "hf_tpu_ext/heartbeat/"
#: ``<prefix><process id>``: ``ip:port`` of the process's liveness port (see :meth:`LostProcessWatch.listen`)
ALIVE_KEY_PREFIX = "hf_tpu_ext/alive/"
#: seconds JAX's own heartbeat time-out is set past the watch's, so the watch's line comes first
JAX_HEARTBEAT_MARGIN = 15
#: exit status after a lost process (the run stops; a rerun resumes from the last checkpoint)
LOST_PROCESS_EXIT = 1


class LostProcessWatch:
    """Stops this process with one line when another process of the run is lost (killed, its host gone).

    Why: jax 0.10's own answer is a C++ abort (``Task 1 heartbeat timeout``, a stack trace, exit 134), after the
    survivors already failed a collective with a raw ``Gloo ... Connection reset by peer`` traceback, and its
    Python ``missed_heartbeat_callback`` hook aborts with ``std::bad_cast``. So every process beats through the
    coordinator's key-value store (``<HEARTBEAT_KEY_PREFIX><id>``, once per ``poll`` seconds, from a daemon
    thread) and reads the others' beats: a process whose count stays still for ``timeout`` seconds and whose
    liveness port no longer accepts a connection (a Python thread may wait minutes for the GIL while XLA
    compiles; the kernel answers the port regardless), or a
    coordinator that stays unreachable that long (then process 0 is the lost one), is lost. A process that exits
    (atexit) or stops for a signal (:func:`hf_tpu_ext.interrupts.received`; it exits right after its save, without
    atexit) writes ``exited`` and is never reported. JAX's heartbeat time-out is set ``JAX_HEARTBEAT_MARGIN``
    seconds longer, so this line comes first; the process then ends with :data:`LOST_PROCESS_EXIT`.

    Args:
        client: ``jax._src.distributed.global_state.client`` (``key_value_set(key, value, allow_overwrite)``,
            ``key_value_try_get(key)``; a fake in tests).
        process_id, num_processes: this process and the count.
        timeout: seconds without a beat after which a process counts as lost.
        poll: seconds between beats.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(self, client, process_id: int, num_processes: int, timeout: float, poll: float = 1.0,
                 clock=time.monotonic):
        self.client, self.process_id, self.num_processes = client, int(process_id), int(num_processes)
        self.timeout, self.poll, self.clock = float(timeout), float(poll), clock
        self.output_dir: Optional[str] = (_OUTPUT_DIR or [None])[0]
        self.find_checkpoints: Callable[[str], List[str]] = newest_complete_checkpoints
        self._beats = 0
        now = clock()
        self._seen = {i: (None, now) for i in range(self.num_processes) if i != self.process_id}
        self._store_failing_since: Optional[float] = None
        self._exited: set = set()
        self._stop = threading.Event()
        self.verdict = threading.Event()  # set once the line is printed (the process ends right after)

    def beat(self, own: bool = True) -> Optional[str]:
        """One beat (``own``: this process's; off once it wrote ``exited``) and one look at the others; the
        lost-process line when one is lost, else ``None``."""
        now = self.clock()
        self._beats += 1
        try:
            if own:
                self.client.key_value_set(f"{HEARTBEAT_KEY_PREFIX}{self.process_id}", str(self._beats), True)
            values = {i: self._read(i) for i in self._seen if i not in self._exited}
        except Exception:  # noqa: BLE001 (the coordinator's store did not answer: gone, or a blip)
            self._store_failing_since = self._store_failing_since or now
            if now - self._store_failing_since >= self.timeout and self.process_id != 0:
                return self.message(0, now - self._store_failing_since)
            return None
        self._store_failing_since = None
        for i, value in values.items():
            if value == "exited":
                self._exited.add(i)
            elif value is not None and value != self._seen[i][0]:
                self._seen[i] = (value, now)
        lost = [(now - t, i) for i, (_, t) in self._seen.items() if i not in self._exited and now - t >= self.timeout]
        lost = [(late, i) for late, i in lost if not self._still_there(i, now)]
        return self.message(min(lost)[1], max(lost)[0]) if lost else None

    def _still_there(self, i: int, now: float) -> bool:
        """Whether process ``i``, silent for the time-out, still accepts a TCP connection on its liveness port: the
        kernel answers for it while its Python thread waits for the GIL (an XLA compile holds it for minutes), a
        killed process's port refuses, a vanished host's times out."""
        try:
            address = self.client.key_value_try_get(f"{ALIVE_KEY_PREFIX}{i}")
            host, _, port = address.rpartition(":")
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(5.0, self.timeout)):
                pass
        except Exception:  # noqa: BLE001 (refused, timed out, never published: silent and unreachable)
            return False
        self._seen[i] = (self._seen[i][0], now)  # alive: its beats are late, not gone
        return True

    def listen(self, coordinator_host: str) -> None:
        """Open this process's liveness port and publish it (``<ALIVE_KEY_PREFIX><id>``: ``ip:port`` on the
        interface that reaches the coordinator); the socket is never accepted from: the kernel answers."""
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((coordinator_host.strip("[]") or "127.0.0.1", 9))  # no packet: picks the interface
                ip = probe.getsockname()[0]
        except OSError:
            ip = socket.gethostname()
        self._listener = socket.socket()
        self._listener.bind(("", 0))
        self._listener.listen(64)
        self.client.key_value_set(f"{ALIVE_KEY_PREFIX}{self.process_id}", f"{ip}:{self._listener.getsockname()[1]}",
                                  True)

    def _read(self, i: int) -> Optional[str]:
        try:
            return self.client.key_value_try_get(f"{HEARTBEAT_KEY_PREFIX}{i}")
        except Exception as err:  # noqa: BLE001 (NOT_FOUND: it has not beaten yet; anything else: the store)
            if "NOT_FOUND" in str(err) or "not found" in str(err).lower():
                return None
            raise

    def message(self, lost: int, seconds: float, why: Optional[str] = None) -> str:
        """``process 1 of 2 was lost (no heartbeat for 30 s); the last checkpoint is checkpoint-8 in out; ...``."""
        why = why or ("the coordinator did not answer for" if lost == 0 and self._store_failing_since is not None
                      else "no heartbeat for")
        folder = self.output_dir or (_OUTPUT_DIR or [None])[0]
        where = folder or "the output_dir"
        try:
            found = self.find_checkpoints(folder) if folder else []
        except Exception:  # noqa: BLE001 (a folder being written: say none rather than fail here)
            found = []
        last = (f"the last checkpoint is {os.path.basename(found[0])} in {where}" if found
                else f"no checkpoint in {where} yet (a rerun starts at step 0)")
        # the time-out, not the measured silence (a beat is read up to a poll late): the same line on every run
        return (f"process {lost} of {self.num_processes} was lost ({why} {self.timeout:g} s); {last}; rerun the "
                "same commands on every host (with --resume_from_checkpoint true) to resume.")

    def lost_at_exit(self) -> Optional[str]:
        """At this process's exit: the line for a peer that never said ``exited`` and whose liveness port refuses
        (killed), without waiting out the heartbeat time-out -- JAX's shutdown barrier, which comes next, aborts
        from C++ on a dead peer. A peer that ends on purpose writes ``exited`` before its port closes, so the
        key is read again after a refusal. ``None`` when every peer is there or exited, or the store is gone."""
        try:
            pending = [i for i in self._seen if i not in self._exited and self._read(i) != "exited"]
            for i in pending:
                if not self._still_there(i, self.clock()) and self._read(i) != "exited":
                    return self.message(i, 0.0, why="gone: its liveness port refused at this process's exit, "
                                                    "within the heartbeat time-out of")
        except Exception:  # noqa: BLE001 (the coordinator's store went: JAX's shutdown answers for it)
            return None
        return None

    def at_exit(self) -> None:
        """``atexit`` (registered after JAX's own, so it runs before JAX's shutdown): the lost-process line for a
        peer killed while this process finished (:meth:`lost_at_exit`), else :meth:`mark_exited`."""
        if not self._stop.is_set():
            line = self.lost_at_exit()
            if line:
                self._stop_process(line)
        self.mark_exited()

    def mark_exited(self) -> None:
        """Tell the others (and this process's abort reporter) that it ends on purpose: it is not lost."""
        self._stop.set()
        _tell_reporter(getattr(self, "_reporter_fd", None))
        try:
            self.client.key_value_set(f"{HEARTBEAT_KEY_PREFIX}{self.process_id}", "exited", True)
        except Exception:  # noqa: BLE001 (the coordinator already went)
            pass

    def start(self, coordinator: Optional[str] = None) -> "LostProcessWatch":
        """Start beating (a daemon thread); on a process other than 0 also the abort reporter
        (:func:`start_abort_reporter`) for a lost ``coordinator`` (``host:port``)."""
        if coordinator:
            try:
                self.listen(coordinator.rpartition(":")[0])
            except Exception:  # noqa: BLE001 (no port: beats alone decide)
                pass
        if coordinator and self.process_id != 0:
            self._reporter_fd = start_abort_reporter(coordinator, self.num_processes, self.output_dir)
        threading.Thread(target=self._run, name="hf-tpu-lost-process-watch", daemon=True).start()
        atexit.register(self.at_exit)  # after jax's own atexit registration: runs before its shutdown
        return self

    def _run(self) -> None:
        from hf_tpu_ext import interrupts

        while not self._stop.wait(self.poll):
            if interrupts.received() is not None:  # a signal's stop: it saves, then exits (exit_now: no atexit)
                self.mark_exited()
                break
            line = self.beat()
            if line and not self._stop.is_set():
                self._stop_process(line)
        # exiting on purpose: keep watching while JAX's shutdown waits for the others (a lost one ends it)
        while not self.verdict.is_set():
            time.sleep(self.poll)
            line = self.beat(own=False)
            if line:
                self._stop_process(line)

    def _stop_process(self, line: str) -> None:
        _tell_reporter(getattr(self, "_reporter_fd", None))  # this line is the one: the reporter stays quiet
        print(f"hf-tpu train: error: {line}", file=sys.stderr, flush=True)
        self.verdict.set()
        os._exit(LOST_PROCESS_EXIT)  # the main thread may sit in a collective that never returns


#: the watch of this process (:func:`initialize_jax_distributed` starts it), ``None`` in a one-process run
lost_process_watch: Optional[LostProcessWatch] = None


#: the run's output folder (:func:`note_output_dir`), named in the lost-process line
_OUTPUT_DIR: List[str] = []
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def note_output_dir(output_dir: Optional[str]) -> None:
    """Remember the run's ``--output_dir`` (the run lock tells it, in every process) for the lost-process line."""
    _OUTPUT_DIR[:] = [str(output_dir)] if output_dir else []


def newest_complete_checkpoints(folder: str) -> List[str]:
    """``checkpoint-<N>/`` folders of ``folder`` with their ``trainer_state.json`` (a save's last file: the
    Keras and torch_xla layouts), newest first; ``[]`` when none or unreadable."""
    try:
        names = [(int(m.group(1)), n) for n in os.listdir(folder) for m in [_CHECKPOINT_RE.match(n)] if m]
    except OSError:
        return []
    return [os.path.join(folder, n) for _, n in sorted(names, reverse=True)
            if os.path.isfile(os.path.join(folder, n, "trainer_state.json"))]


def _collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because a peer went (gloo/gRPC texts of jax 0.10)."""
    text = f"{type(exc).__name__}: {exc}"
    return any(s in text for s in ("Gloo", "Connection reset by peer", "Connection closed by peer",
                                   "heartbeat", "UNAVAILABLE", "DEADLINE_EXCEEDED"))


def _quiet_excepthook(previous):
    """``sys.excepthook`` that, for a collective failed by a lost peer, waits for the watch's line instead of
    printing jax's traceback (the watch ends the process; without a verdict the traceback comes after all)."""

    def hook(exc_type, exc, tb):
        watch = lost_process_watch
        if watch is not None and _collective_failure(exc):
            watch.verdict.wait(watch.timeout + 3 * watch.poll + 5)
        previous(exc_type, exc, tb)

    return hook


def start_lost_process_watch(timeout: float) -> Optional[LostProcessWatch]:
    """Start :class:`LostProcessWatch` for this initialized multi-process JAX run (``None`` for one process)."""
    global lost_process_watch
    from jax._src import distributed as jax_distributed

    state = jax_distributed.global_state
    if state.client is None or int(state.num_processes or 1) < 2 or lost_process_watch is not None:
        return lost_process_watch
    lost_process_watch = LostProcessWatch(state.client, state.process_id, state.num_processes, timeout).start(
        getattr(state, "coordinator_address", None))
    sys.excepthook = _quiet_excepthook(sys.excepthook)
    return lost_process_watch


#: the abort reporter (``python -c``): after its parent ended without saying ``exited``, names a lost coordinator
_REPORTER = r"""
import os, re, signal, socket, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
address, count, folder, parent = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if any(line.strip() == "exited" for line in sys.stdin):
    sys.exit(0)
import time
for _ in range(20):  # the parent's exit status while it is a zombie (/proc stat field 52): only an abort is ours
    try:
        with open(f"/proc/{parent}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        break  # reaped already: the coordinator's answer decides
    if fields[0] == "Z":
        if len(fields) > 49 and int(fields[49]) & 0x7F != signal.SIGABRT:
            sys.exit(0)
        break
    time.sleep(0.05)
host, _, port = address.rpartition(":")
try:
    socket.create_connection((host.strip("[]"), int(port)), timeout=3).close()
    sys.exit(0)  # the coordinator answers: the parent ended for another reason, its own lines say which
except (OSError, ValueError):
    pass
try:
    steps = sorted((int(m.group(1)), n) for n in os.listdir(folder) for m in [re.match(r"^checkpoint-(\d+)$", n)]
                   if m and os.path.isfile(os.path.join(folder, n, "trainer_state.json")))
except OSError:
    steps = []
where = folder or "the output_dir"
last = (f"the last checkpoint is {steps[-1][1]} in {where}" if steps
        else f"no checkpoint in {where} yet (a rerun starts at step 0)")
sys.stderr.write(f"hf-tpu train: error: process 0 of {count} was lost (the coordinator {address} no longer "
                 f"answers); {last}; rerun the same commands on every host (with --resume_from_checkpoint true) "
                 "to resume.\n")
"""


def start_abort_reporter(coordinator: str, num_processes: int, output_dir: Optional[str]) -> Optional[int]:
    """Start the process that names a lost coordinator after jax's abort; returns the pipe to tell it ``exited``.

    Why: when process 0 (the coordinator) goes, jax 0.10 ends every other process at once from a C++ thread
    (``Terminating process because the JAX distributed service detected fatal errors``, SIGABRT): no Python runs
    after it. A small child (own session, signals ignored, sharing stderr) waits for its pipe to close: when this
    process ended without writing ``exited``, by an abort (its exit status, read while it is a zombie, where it
    still is one) and the coordinator no longer answers, it prints the lost-process line after jax's. ``None`` when it cannot be started (the run goes on without it).
    """
    import subprocess

    try:
        read_end, write_end = os.pipe()
        subprocess.Popen([sys.executable, "-c", _REPORTER, coordinator, str(num_processes), output_dir or "",
                          str(os.getpid())],
                         stdin=read_end, stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        os.close(read_end)
        return write_end
    except OSError:
        return None


def _tell_reporter(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.write(fd, b"exited\n")
        except OSError:
            pass
