"""JAX's multi-process start and the lost-process watch of ``--backend keras`` (one process per host of a slice).

:func:`jax_distributed_arguments` reads ``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID`` (jax 0.10 reads only
``JAX_COORDINATOR_ADDRESS``) and the time-outs, refusing half a multi-process environment in one line before JAX
starts; :func:`maybe_initialize_distributed` / :func:`initialize_jax_distributed` join the processes (process 0's
coordination service in a sidecar of its own: :mod:`hf_tpu_ext.backends.keras.coordination_service`);
:class:`LostProcessWatch` ends every survivor with one line when a process is lost, process 0 included. Which
process is the chief is :mod:`hf_tpu_ext.distributed`'s answer (every backend asks it); JAX is imported only inside
the functions that start it, so the argument checks run before any framework loads.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import socket
import sys
import threading
import time
from typing import Callable, List, Optional, Tuple

from hf_tpu_ext import interrupts
from hf_tpu_ext.backends.keras import coordination_service
from hf_tpu_ext.backends.keras.coordination_service import initialize_with_sidecar
from hf_tpu_ext.backends.keras.process_agreement import KeyValueAgreement
from hf_tpu_ext.distributed import noted_output_dir, run_after_jax_initialize, set_process_agreement
from hf_tpu_ext.environment import (JAX_COORDINATOR_ADDRESS, JAX_DISTRIBUTED_SWITCH, JAX_NUM_CPU_DEVICES,
                                    JAX_NUM_PROCESSES, JAX_PLATFORMS, JAX_PROCESS_ID, JAX_TIMEOUTS, XLA_FLAGS,
                                    process_variables)
from hf_tpu_ext.errors import BackendError

#: seconds to wait for every process to join (jax's ``initialization_timeout``; its default is 300)
JAX_INITIALIZATION_TIMEOUT = JAX_TIMEOUTS[0]
#: seconds without a heartbeat after which a process counts as lost and the others stop (default 30)
JAX_HEARTBEAT_TIMEOUT = JAX_TIMEOUTS[1]
DEFAULT_HEARTBEAT_TIMEOUT = 30
#: seconds the other processes wait at exit for process 0 (export, card, final push; jax's default is 300, which
#: a slow final push outlasts: they then abort with a C++ stack trace after a good run); a lost process 0 still
#: ends the wait within the heartbeat time-out (:class:`LostProcessWatch`)
JAX_SHUTDOWN_TIMEOUT = JAX_TIMEOUTS[2]
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
        ValueError: a variable is not an integer in range, the id is not below the count, one of the two is
            set without the other, or half a multi-process environment: the two without
            ``JAX_COORDINATOR_ADDRESS``, or it without them, where JAX cannot find the cluster itself (no
            ``HF_TPU_JAX_DISTRIBUTED=1``, TPU host list, Slurm or Open MPI); one line naming the variables.
    """
    env = process_variables() if environ is None else environ
    count = _int_variable(env, JAX_NUM_PROCESSES, 1)
    index = _int_variable(env, JAX_PROCESS_ID, 0)
    if (count is None) != (index is None):
        raise ValueError(f"{JAX_NUM_PROCESSES} and {JAX_PROCESS_ID} go together: set both (0 <= id < count) "
                         "or neither (a TPU slice finds them itself).")
    if count is not None and index >= count:
        raise ValueError(f"{JAX_PROCESS_ID}={index} is not below {JAX_NUM_PROCESSES}={count}: "
                         f"number the processes 0 .. {count - 1}.")
    address = str(env.get(JAX_COORDINATOR_ADDRESS, "")).strip()
    if count is not None and not address and not _cluster_found_by_jax(env):
        raise ValueError(f"{JAX_NUM_PROCESSES} and {JAX_PROCESS_ID} are set without {JAX_COORDINATOR_ADDRESS}: set "
                         "it to process 0's host:port on every process, or unset both to train in one process.")
    if address and count is None and not _cluster_found_by_jax(env):
        raise ValueError(f"{JAX_COORDINATOR_ADDRESS} is set without {JAX_NUM_PROCESSES} and {JAX_PROCESS_ID}: set "
                         "both on every process (0 <= id < count), or unset it to train in one process.")
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


def _tpu_hosts(environ) -> List[str]:
    return [h for v in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES")
            for h in str(environ.get(v, "")).split(",") if h.strip()]


def _cluster_found_by_jax(environ) -> bool:
    """Whether JAX can find the cluster itself: ``HF_TPU_JAX_DISTRIBUTED=1``, a TPU slice's host list, Slurm or
    Open MPI (jax's own cluster detection)."""
    asked = str(environ.get(JAX_DISTRIBUTED_SWITCH, "")).strip().lower() in ("1", "true", "yes")
    return (asked or len(_tpu_hosts(environ)) > 1
            or any(str(environ.get(v, "")).strip() for v in ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE")))


def shape_before_start(environ=None) -> Tuple[Optional[int], Optional[int]]:
    """``(devices of the whole run, processes)`` as the environment fixes them before JAX starts; ``None`` for one
    that only JAX can tell (it must start first).

    The processes: ``JAX_NUM_PROCESSES``, else 1 unless JAX finds a cluster itself (a TPU slice, Slurm, Open MPI:
    ``None``). The devices: with ``JAX_PLATFORMS=cpu`` only, each process's simulated CPU devices
    (``JAX_NUM_CPU_DEVICES``, else ``XLA_FLAGS``' ``--xla_force_host_platform_device_count``, else 1) times the
    processes; an accelerator's count is ``None`` (JAX enumerates it). Malformed values give ``None`` (JAX's start
    names them).
    """
    env = process_variables() if environ is None else environ
    try:
        processes = _int_variable(env, JAX_NUM_PROCESSES, 1)
    except ValueError:
        return None, None
    if processes is None:
        processes = None if _cluster_found_by_jax(env) else 1
    if str(env.get(JAX_PLATFORMS, "")).strip().lower() != "cpu" or processes is None:
        return None, processes
    flag = re.search(r"--xla_force_host_platform_device_count=(\d+)", str(env.get(XLA_FLAGS, "")))
    raw = str(env.get(JAX_NUM_CPU_DEVICES, "")).strip() or (flag.group(1) if flag else "1")
    per_process = int(raw) if raw.isdigit() and int(raw) > 0 else None
    return (per_process * processes if per_process else None), processes


def maybe_initialize_distributed() -> bool:
    """``jax.distributed.initialize()`` when the environment asks for several processes; True when it did.

    Asked for by ``HF_TPU_JAX_DISTRIBUTED=1`` (JAX then finds the cluster itself: Cloud TPU slices through their
    metadata, Slurm, Open MPI), by ``JAX_COORDINATOR_ADDRESS`` (with ``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID``,
    JAX's own variables), or by ``TPU_WORKER_HOSTNAMES``/``TPU_PROCESS_ADDRESSES`` naming more than one host.
    Must run before anything touches the devices (``jax.devices()``).

    Raises:
        BackendError: bad or half ``JAX_*`` variables (:func:`jax_distributed_arguments`: also checked before the
            frameworks load, by ``hf-tpu train``'s early checks), or the processes did not all join within the
            time-out (the coordinator named): one line, before any compute.
    """
    try:
        jax_distributed_arguments()  # half an environment is refused even when it would start nothing
        env = process_variables()
        if not (_cluster_found_by_jax(env) or env.get(JAX_COORDINATOR_ADDRESS, "").strip()):
            return False
        initialize_jax_distributed()
    except ValueError as err:
        raise BackendError(str(err)) from None
    return True


def initialize_jax_distributed() -> None:
    """``jax.distributed.initialize`` with :func:`jax_distributed_arguments`, process 0's coordination service in
    a sidecar that outlives process 0 (:func:`~hf_tpu_ext.backends.keras.coordination_service.initialize_with_sidecar`);
    a process other than 0 first waits for the coordinator (:func:`wait_for_coordinator`). Must run before anything
    touches JAX's devices.

    Raises:
        ValueError: a bad variable, an unreachable coordinator (the time-out named), the coordinator's port still
            served by another run, or JAX's own refusal (one line each).
    """
    import jax

    kwargs = jax_distributed_arguments()
    address = process_variables().get(JAX_COORDINATOR_ADDRESS, "").strip()
    timeout = kwargs.get("initialization_timeout", 300)
    logging.getLogger("hf_tpu_ext").info(
        "jax.distributed: process %s of %s, coordinator %s (time-out %d s, lost-process heartbeat %d s)",
        kwargs.get("process_id", "?"), kwargs.get("num_processes", "?"), address or "found by JAX", timeout,
        kwargs["heartbeat_timeout_seconds"])
    if address and kwargs.get("process_id", 0) > 0:
        wait_for_coordinator(address, timeout)
    watch_timeout = kwargs["heartbeat_timeout_seconds"]
    kwargs["heartbeat_timeout_seconds"] = jax_heartbeat_timeout(watch_timeout)  # the watch's line comes first
    try:
        initialize_with_sidecar(jax.distributed.initialize, **kwargs)  # process 0's service outlives it
        if start_lost_process_watch(watch_timeout) is not None:  # several processes: they agree through JAX's store
            set_process_agreement(KeyValueAgreement(
                lost_process_watch.client, lost_process_watch.process_id, lost_process_watch.num_processes,
                kwargs["shutdown_timeout_seconds"], ended_key=f"{HEARTBEAT_KEY_PREFIX}0"))
    except (ValueError, RuntimeError) as err:  # e.g. "Number of processes must be defined."
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise ValueError(f"jax.distributed.initialize refused (coordinator {address or 'found by JAX'}): {reason} "
                         f"Set {JAX_COORDINATOR_ADDRESS}, {JAX_NUM_PROCESSES} and {JAX_PROCESS_ID} on every process, "
                         "or run on a TPU slice, Slurm or Open MPI (found by JAX).") from None
    run_after_jax_initialize()  # e.g. the run lock, now that this host knows its id (errors are theirs: unchanged)



_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def newest_complete_checkpoints(folder: str) -> List[str]:
    """``checkpoint-<N>/`` folders of ``folder`` with their ``trainer_state.json`` (a save's last file: the
    Keras and torch_xla layouts), newest first; ``[]`` when none or unreadable."""
    try:
        names = [(int(m.group(1)), n) for n in os.listdir(folder) for m in [_CHECKPOINT_RE.match(n)] if m]
    except OSError:
        return []
    return [os.path.join(folder, n) for _, n in sorted(names, reverse=True)
            if os.path.isfile(os.path.join(folder, n, "trainer_state.json"))]


#: key-value store keys of the lost-process watch: ``<prefix><process id>`` holds a beat count, ``exited`` at exit
HEARTBEAT_KEY_PREFIX = "hf_tpu_ext/heartbeat/"
#: ``<prefix><process id>``: ``ip:port`` of the process's liveness port (see :meth:`LostProcessWatch.listen`)
ALIVE_KEY_PREFIX = "hf_tpu_ext/alive/"
#: seconds the watch's line must come before JAX's earliest verdict (a beat read up to a poll late, the liveness
#: port's connect time-out of up to 5 s, the watch thread waiting for the GIL)
JAX_HEARTBEAT_MARGIN = 15


def jax_heartbeat_timeout(watch_timeout: float) -> int:
    """JAX's ``heartbeat_timeout_seconds`` for a watch of ``watch_timeout`` seconds: ``2 * (watch_timeout +
    JAX_HEARTBEAT_MARGIN)`` (90 s for the default 30 s watch, JAX's own default being 100 s).

    Why twice: XLA's coordination agent sends a heartbeat every half time-out (``heartbeat_timeout / 2``,
    ``CoordinationServiceAgent``), and the service declares a task dead a time-out after the last beat it got, so a
    process killed just before its next beat is declared dead half a time-out after the kill. With JAX's time-out
    at the watch's + 15 s (45 s), that came 22.5-45 s after a kill -9 -- before the watch's 30 s in about a third
    of the tries, ending the survivor with JAX's C++ abort (exit 134) instead of the lost-process line. Twice the
    watch's time-out plus the margin keeps JAX's earliest verdict (half of it) a margin after the watch's.
    """
    return int(2 * (math.ceil(watch_timeout) + JAX_HEARTBEAT_MARGIN))
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
    atexit) writes ``exited`` and is never reported. JAX's heartbeat time-out is set so that this line comes
    first (:func:`jax_heartbeat_timeout`); the process then ends with :data:`LOST_PROCESS_EXIT`.

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
        self.output_dir: Optional[str] = noted_output_dir()
        self.find_checkpoints: Callable[[str], List[str]] = newest_complete_checkpoints
        self._beats = 0
        now = clock()
        self._seen = {i: (None, now) for i in range(self.num_processes) if i != self.process_id}
        self._store_failing_since: Optional[float] = None
        self._exited: set = set()
        self._stop = threading.Event()
        self.verdict = threading.Event()  # set once the line is printed (the process ends right after)
        #: called once with the others' liveness ports (``ip:port``, by process id) when all are published
        self.on_peers: Optional[Callable[[List[str]], None]] = None

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

    def report_peers(self) -> None:
        """Hand the others' liveness ports to :attr:`on_peers` once every one is published (process 0's
        coordination service sidecar serves, after process 0 is gone, until they refuse)."""
        if self.on_peers is None:
            return
        try:
            addresses = [self.client.key_value_try_get(f"{ALIVE_KEY_PREFIX}{i}") for i in sorted(self._seen)]
        except Exception:  # noqa: BLE001 (not all published yet: the next beat looks again)
            return
        callback, self.on_peers = self.on_peers, None
        callback(addresses)

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
        folder = self.output_dir or noted_output_dir()
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
        while not self._stop.wait(self.poll):
            if interrupts.received() is not None:  # a signal's stop: it saves, then exits (exit_now: no atexit)
                self.mark_exited()
                break
            line = self.beat()
            if line and not self._stop.is_set():
                self._stop_process(line)
            self.report_peers()
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
    state = getattr(coordination_service.jax_distributed_module(), "global_state", None)
    if state is None or state.client is None or int(state.num_processes or 1) < 2 or lost_process_watch is not None:
        return lost_process_watch
    watch = LostProcessWatch(state.client, state.process_id, state.num_processes, timeout)
    if coordination_service.sidecar is not None:  # process 0: its service serves the others until they report
        watch.on_peers = coordination_service.sidecar.tell_peers
    lost_process_watch = watch.start(getattr(state, "coordinator_address", None))
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

    Why: when the coordination service goes (process 0's host lost with its sidecar, or the service inside process
    0 where the sidecar could not start), jax 0.10 ends every other process at once from a C++ thread
    (``Terminating process because the JAX distributed service detected fatal errors``, SIGABRT): no Python runs
    after it. A small child (own session, signals ignored, sharing stderr) waits for its pipe to close: when this
    process ended without writing ``exited``, by an abort (its exit status, read while it is a zombie, where it
    still is one) and the coordinator no longer answers, it prints the lost-process line after jax's. ``None``
    when it cannot be started (the run goes on without it).
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

