"""JAX's coordination service of a multi-process ``--backend keras`` run, in a small process of its own.

Why: ``jax.distributed.initialize`` starts the coordination service (key-value store, heartbeats, barriers) inside
process 0, so a kill -9 of process 0 takes it down with it, and jax 0.10's client in every other process then ends
that process from a C++ thread (SIGABRT, exit 134, a stack trace) before any Python line can name the lost
process. Process 0 starts the service in a sidecar instead (same host, own session, SIGINT/SIGTERM/SIGHUP
ignored) and joins it as a plain client (:func:`initialize_with_sidecar`): a lost process 0 then leaves the
service up, and the others' lost-process watch names it as it names any lost process
(:class:`hf_tpu_ext.backends.keras.processes.LostProcessWatch`).

The sidecar never outlives its use: process 0's shutdown (``jax.distributed.shutdown``, at its exit, after the
others passed JAX's shutdown barrier) stops it at once and waits for it, so the same command can be rerun at once
on the same port. When process 0 ends without that shutdown (killed, a signal's save ending in ``os._exit``, a lost
peer named), the sidecar serves until every other process's liveness port refuses a connection (they reported
and exited), at most JAX's heartbeat time-out + :data:`LINGER_MARGIN` seconds (by then JAX has declared process 0
dead and ended the others itself). A whole lost host takes the sidecar with it: the abort reporter
(:func:`hf_tpu_ext.backends.keras.processes.start_abort_reporter`) names that case.
"""

from __future__ import annotations

import logging
import select
import socket
import subprocess
import sys
import time
from typing import List, Optional

#: seconds past JAX's heartbeat time-out a sidecar whose process 0 is gone serves at most
LINGER_MARGIN = 15
#: seconds process 0 waits for the sidecar's service to listen (a Python start and jaxlib's import)
START_TIMEOUT = 120
#: seconds the shutdown waits for the sidecar to end before killing it
STOP_TIMEOUT = 30

#: the sidecar (``python -c``; argv: bind address, process count, heartbeat, shutdown time-out, recoverable, linger).
#: stdin from process 0: ``peers <ip:port> ...`` (the others' liveness ports), ``stop``; EOF: process 0 is gone.
_SIDECAR = r"""
import signal, socket, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
bind, count, beat, down, recoverable, linger = sys.argv[1:7]
try:
    try:
        from jaxlib import _jax
    except ImportError:
        from jax._src.lib import _jax
    extra = {"recoverable": True} if recoverable == "1" else {}
    service = _jax.get_distributed_runtime_service(bind, int(count), heartbeat_timeout=int(beat),
                                                   shutdown_timeout=int(down), **extra)
except Exception as err:
    print("failed: " + ((str(err).strip().splitlines() or [type(err).__name__])[0][:300]), flush=True)
    sys.exit(1)
print("ready", flush=True)

def there(address):  # refused (or unreachable): the process is gone; a time-out says nothing (a full backlog)
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
    except socket.timeout:
        return True
    except (OSError, ValueError):
        return False
    return True

peers = None
for line in sys.stdin:
    words = line.split()
    if words[:1] == ["stop"]:
        break
    if words[:1] == ["peers"]:
        peers = words[1:]
else:  # process 0 ended without its shutdown: serve while the others may still report
    deadline = time.monotonic() + float(linger)
    while time.monotonic() < deadline and (peers is None or any(there(p) for p in peers)):
        time.sleep(0.5)
service.shutdown()
"""


class ServiceSidecar:
    """The sidecar process serving JAX's coordination service; stands for the service object JAX keeps
    (``global_state.service``: only ``shutdown()`` is called on it).

    Args:
        proc: the started sidecar (stdin a pipe to it).
        address: ``host:port`` it listens on (for messages).
    """

    def __init__(self, proc: subprocess.Popen, address: str):
        self.proc, self.address = proc, address

    @classmethod
    def start(cls, bind_address: str, num_processes: int, heartbeat_timeout: int, shutdown_timeout: int,
              recoverable: bool = False) -> "ServiceSidecar":
        """Start the sidecar and wait until its service listens (at most :data:`START_TIMEOUT` s).

        Raises:
            RuntimeError: the sidecar did not start or its service did not listen in time (its reason, one line).
        """
        linger = int(heartbeat_timeout) + LINGER_MARGIN
        proc = subprocess.Popen(
            [sys.executable, "-c", _SIDECAR, bind_address, str(int(num_processes)), str(int(heartbeat_timeout)),
             str(int(shutdown_timeout)), "1" if recoverable else "0", str(linger)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
            close_fds=True)
        line = _first_line(proc, START_TIMEOUT)
        proc.stdout.close()
        if line != "ready":
            proc.kill()
            code = proc.wait()
            raise RuntimeError(line or (f"it ended with exit status {code}" if code != -9
                                        else f"its service did not listen within {START_TIMEOUT} s"))
        return cls(proc, bind_address)

    def tell_peers(self, addresses: List[str]) -> None:
        """The other processes' liveness ports (``ip:port``): after process 0 is gone, the sidecar serves until
        each refuses a connection."""
        self._send("peers " + " ".join(addresses))

    def shutdown(self) -> None:
        """Stop the service and wait for the sidecar to end (killed after :data:`STOP_TIMEOUT` s): its port is
        free when this returns."""
        self._send("stop")
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _send(self, line: str) -> None:
        try:
            self.proc.stdin.write(f"{line}\n".encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):  # it ended already (or was told to stop)
            pass


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    """The sidecar's first stdout line (``ready`` or ``failed: ...``), ``""`` when none came within ``timeout``."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().decode(errors="replace").strip() if ready else ""


def wait_until_port_free(bind_address: str, timeout: float, poll: float = 0.5) -> None:
    """Wait while something on this host accepts connections on ``bind_address``'s port (a previous run's sidecar
    serving its last survivors), at most ``timeout`` seconds.

    Why: gRPC may bind a port another server still listens on (``SO_REUSEPORT``), and the processes would then
    reach either service.

    Raises:
        RuntimeError: the port still accepts connections after ``timeout`` seconds (one line naming it).
    """
    host, _, port = bind_address.rpartition(":")
    host = host.strip("[]")
    host = "127.0.0.1" if host in ("", "::", "0.0.0.0") else host
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except (OSError, ValueError):
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"port {port} still accepts connections after {timeout:g} s: another coordinator "
                               "serves on it; give this run another JAX_COORDINATOR_ADDRESS port.")
        time.sleep(poll)


#: process 0's sidecar once :func:`initialize_with_sidecar` started it, else ``None``
sidecar: Optional[ServiceSidecar] = None


def _service_factory(real_factory):
    """``get_distributed_runtime_service`` as JAX calls it, starting the sidecar once a previous run's sidecar
    left the port (:func:`wait_until_port_free`: its ``RuntimeError`` propagates); the in-process service
    (``real_factory``) when the sidecar cannot start (a warning names why)."""

    def factory(bind_address, num_processes, heartbeat_timeout=100, shutdown_timeout=300, recoverable=False,
                **extra):
        global sidecar
        wait_until_port_free(bind_address, int(heartbeat_timeout) + LINGER_MARGIN)
        if not extra:
            try:
                sidecar = ServiceSidecar.start(bind_address, num_processes, heartbeat_timeout, shutdown_timeout,
                                               recoverable)
                return sidecar
            except (OSError, RuntimeError) as err:
                logging.getLogger("hf_tpu_ext").warning(
                    "the JAX coordination service runs inside process 0 (its own process did not start: %s); a "
                    "lost process 0 then ends the others with JAX's abort", err)
        return real_factory(bind_address, num_processes, heartbeat_timeout=heartbeat_timeout,
                            shutdown_timeout=shutdown_timeout, recoverable=recoverable, **extra)

    return factory


def jax_distributed_module():
    """JAX's multi-process state module, ``jax._src.distributed`` (``global_state``: ``client``, ``process_id``,
    ``num_processes``, ``coordinator_address``; its ``_jax`` extension), or ``None`` where this jax has none.

    The one adapter over this private module. The public alternative: ``jax.distributed.initialize``/``shutdown``,
    ``jax.process_index()``/``jax.process_count()`` and ``jax.experimental.multihost_utils`` (collectives such as
    ``sync_global_devices``); none reaches the coordination service's key-value store and heartbeats that the
    lost-process watch and the sidecar need.
    """
    try:
        from jax._src import distributed
    except ImportError:
        return None
    return distributed


def initialize_with_sidecar(initialize, **kwargs) -> None:
    """``initialize(**kwargs)`` (``jax.distributed.initialize``) with process 0's coordination service in a
    :class:`ServiceSidecar`; plain ``initialize`` where JAX's internals differ from jax 0.10's.

    jax internals, kept to this function: ``jax._src.distributed`` (:func:`jax_distributed_module`) calls
    ``_jax.get_distributed_runtime_service``
    on process 0 (``State.initialize``) and later only ``shutdown()`` on what it returned; the module's ``_jax`` is
    swapped for a view of it whose factory starts the sidecar, for the call only.
    """
    jax_distributed = jax_distributed_module()
    real = getattr(jax_distributed, "_jax", None)
    if not hasattr(real, "get_distributed_runtime_service"):
        return initialize(**kwargs)

    class _WithSidecar:
        get_distributed_runtime_service = staticmethod(_service_factory(real.get_distributed_runtime_service))

        def __getattr__(self, name):
            return getattr(real, name)

    jax_distributed._jax = _WithSidecar()
    try:
        return initialize(**kwargs)
    finally:
        jax_distributed._jax = real

