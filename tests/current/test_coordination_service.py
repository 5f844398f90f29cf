"""Process 0's JAX coordination service in a sidecar process (hf_tpu_ext.backends.keras.coordination_service), on
its own: it serves until told to stop, or -- once process 0 is gone (its pipe closed) -- until the other processes'
liveness ports refuse, at most JAX's heartbeat time-out + a margin; then its port is free. The 2-process runs (a
killed process 0 named by process 1, nothing left after a good run) are tests/current/test_keras_multiprocess.py.
"""

import socket
import time

import pytest

pytest.importorskip("jaxlib")

from hf_tpu_ext.backends.keras import coordination_service  # noqa: E402
from hf_tpu_ext.backends.keras.coordination_service import ServiceSidecar, wait_until_port_free  # noqa: E402


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _start(port, heartbeat=90):
    return ServiceSidecar.start(f"[::]:{port}", 2, heartbeat_timeout=heartbeat, shutdown_timeout=60)


def test_shutdown_stops_the_sidecar_at_once_and_frees_the_port():
    port = _free_port()
    sidecar = _start(port)
    assert _answers(port) and sidecar.proc.poll() is None
    t0 = time.monotonic()
    sidecar.shutdown()
    assert time.monotonic() - t0 < 5
    assert sidecar.proc.returncode == 0 and not _answers(port)
    _start(port).shutdown()  # a rerun binds the same port at once


def test_after_process_0_is_gone_it_serves_until_the_others_ports_refuse():
    port = _free_port()
    sidecar = _start(port)
    peer = socket.socket()
    peer.bind(("127.0.0.1", 0))
    peer.listen(64)
    sidecar.tell_peers([f"127.0.0.1:{peer.getsockname()[1]}"])
    sidecar.proc.stdin.close()  # what process 0's death does: EOF without "stop"
    time.sleep(2)
    assert sidecar.proc.poll() is None and _answers(port)  # process 1 is still there: it may still report
    peer.close()  # process 1 reported and exited
    assert sidecar.proc.wait(timeout=5) == 0
    assert not _answers(port)


def test_without_the_others_ports_it_serves_the_heartbeat_time_out_and_the_margin(monkeypatch):
    monkeypatch.setattr(coordination_service, "LINGER_MARGIN", 1)
    port = _free_port()
    sidecar = _start(port, heartbeat=1)  # serves 1 + 1 s after its pipe closes
    sidecar.proc.stdin.close()
    t0 = time.monotonic()
    assert sidecar.proc.wait(timeout=10) == 0
    assert 1.5 < time.monotonic() - t0 < 5 and not _answers(port)


def test_a_port_still_served_is_waited_for_then_named():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(64)
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(RuntimeError) as err:
            wait_until_port_free(f"[::]:{port}", 1, poll=0.2)
        assert 1 <= time.monotonic() - t0 < 4
    assert str(err.value) == (f"port {port} still accepts connections after 1 s: another coordinator serves on it; "
                              "give this run another JAX_COORDINATOR_ADDRESS port.")
    wait_until_port_free(f"[::]:{port}", 1)  # closed: returns at once


def test_jax_gets_the_sidecar_for_the_call_only():
    from jax._src import distributed as jax_distributed

    real, port, got = jax_distributed._jax, _free_port(), []

    def initialize(**kwargs):  # what jax.distributed.initialize does with the module's _jax on process 0
        got.append(kwargs)
        got.append(jax_distributed._jax.get_distributed_runtime_service(
            f"[::]:{port}", 2, heartbeat_timeout=90, shutdown_timeout=60, recoverable=False))
        got.append(jax_distributed._jax.get_distributed_runtime_client)

    coordination_service.initialize_with_sidecar(initialize, num_processes=2)
    try:
        assert got[0] == {"num_processes": 2}
        assert isinstance(got[1], ServiceSidecar) and got[1] is coordination_service.sidecar and _answers(port)
        assert got[2] is real.get_distributed_runtime_client
        assert jax_distributed._jax is real
    finally:
        got[1].shutdown()
        coordination_service.sidecar = None
    assert not _answers(port)
