"""A multi-process JAX run's host-side parts, without JAX or processes: the lost-process watch
(hf_tpu_ext.backends.keras.processes.LostProcessWatch) on a fake key-value store and clock, and the run lock of a host that
learns its id from jax.distributed.initialize (hf_tpu_ext.run_lock.PendingRunLock). The real kill -9 and the
2-process runs are tests/current/test_keras_multiprocess.py."""

import pytest

from hf_tpu_ext.backends.keras.processes import HEARTBEAT_KEY_PREFIX, LostProcessWatch


class FakeStore:
    """jax's DistributedRuntimeClient key-value calls; ``down`` makes every call fail as a gone coordinator."""

    def __init__(self):
        self.values, self.down = {}, False

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.down:
            raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")
        self.values[key] = value

    def key_value_try_get(self, key):
        if self.down:
            raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")
        if key not in self.values:
            raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
        return self.values[key]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _pair(store, clock, timeout=30):
    return [LostProcessWatch(store, i, 2, timeout, clock=clock) for i in (0, 1)]


def test_a_peer_whose_beats_stop_is_lost_after_the_time_out(tmp_path):
    store, clock = FakeStore(), Clock()
    w0, w1 = _pair(store, clock)
    for step in (4, 8, 12):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if step < 12:  # checkpoint-12 is a torn save (no trainer state): never named
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    w0.output_dir = str(tmp_path)  # what the run lock notes (distributed.note_output_dir)
    for _ in range(5):  # both beat (process 1 first: process 0 sees its last beat at once): nobody lost
        clock.now += 1
        assert (w1.beat(), w0.beat()) == (None, None)
    assert store.values[f"{HEARTBEAT_KEY_PREFIX}1"] == "5"
    clock.now += 29  # process 1 stopped beating 29 s ago
    assert w0.beat() is None
    clock.now += 1
    assert w0.beat() == (f"process 1 of 2 was lost (no heartbeat for 30 s); the last checkpoint is checkpoint-8 in "
                         f"{tmp_path}; rerun the same commands on every host (with --resume_from_checkpoint true) "
                         "to resume.")


def test_a_peer_that_exits_on_purpose_is_never_lost():
    store, clock = FakeStore(), Clock()
    w0, w1 = _pair(store, clock)
    clock.now += 1
    assert (w0.beat(), w1.beat()) == (None, None)
    w1.mark_exited()
    clock.now += 1
    assert w0.beat() is None
    clock.now += 300
    assert w0.beat() is None


def test_a_peer_that_never_beat_is_lost_and_no_checkpoint_is_said():
    store, clock = FakeStore(), Clock()
    w0 = LostProcessWatch(store, 0, 3, 10, clock=clock)
    w0.output_dir = "out"
    clock.now += 5
    w2 = LostProcessWatch(store, 2, 3, 10, clock=clock)
    assert (w0.beat(), w2.beat()) == (None, None)
    clock.now += 5  # process 1 never beat in 10 s, process 2 beat 5 s ago
    assert w0.beat() == ("process 1 of 3 was lost (no heartbeat for 10 s); no checkpoint in out yet (a rerun "
                         "starts at step 0); rerun the same commands on every host (with --resume_from_checkpoint "
                         "true) to resume.")


@pytest.mark.parametrize("process_id, lost", [(1, True), (0, False)])
def test_a_coordinator_that_stays_unreachable_is_process_0_lost(process_id, lost):
    store, clock = FakeStore(), Clock()
    watch = LostProcessWatch(store, process_id, 2, 30, clock=clock)
    peer = LostProcessWatch(store, 1 - process_id, 2, 30, clock=clock)
    store.down = True  # process 0 (the store's host) is gone
    clock.now += 1
    assert watch.beat() is None
    clock.now += 20
    assert watch.beat() is None
    store.down = False  # a blip that ends: the count starts again
    clock.now += 1
    assert (peer.beat(), watch.beat()) == (None, None)
    store.down = True
    for _ in range(30):  # the first failed call starts the count: 29 s
        clock.now += 1
        assert watch.beat() is None
    clock.now += 1
    line = watch.beat()
    if lost:
        assert line.startswith("process 0 of 2 was lost (the coordinator did not answer for 30 s); ")
    else:  # process 0 hosts the store: a failing store is not another process lost
        assert line is None


@pytest.mark.parametrize("process_id", [0, 1])
def test_a_slice_host_takes_the_run_lock_once_jax_tells_its_id(tmp_path, monkeypatch, process_id):
    """HF_TPU_JAX_DISTRIBUTED=1 alone (a TPU slice): the id comes from jax.distributed.initialize, so the lock
    waits for it and only process 0 takes it (hosts sharing one folder do not refuse each other)."""
    import json

    from hf_tpu_ext import distributed
    from hf_tpu_ext.run_lock import LOCK_NAME, lock_output_dir

    for name in ("JAX_PROCESS_ID", "JAX_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS", "RANK", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TPU_JAX_DISTRIBUTED", "1")
    assert distributed.jax_process_id_pending()
    out = tmp_path / "run"
    first, second = lock_output_dir(str(out)), lock_output_dir(str(out))  # hf-tpu train, then the training run
    assert first is second and first.pending and not out.exists()  # nothing written before the id is known
    monkeypatch.setattr(distributed, "process_index", lambda: process_id)
    hooks = list(distributed._AFTER_INITIALIZE)
    assert hooks == [first._take_if_chief]
    distributed._AFTER_INITIALIZE.clear()
    hooks[0]()  # what initialize_jax_distributed runs once JAX joined the processes
    assert not first.pending
    if process_id == 0:
        import os

        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    else:
        assert not out.exists()
    first.release()
    assert (out / LOCK_NAME).exists() == (process_id == 0)  # the second holder still holds it
    second.release()
    assert not (out / LOCK_NAME).exists()


def test_a_run_that_ends_before_jax_is_initialized_leaves_nothing_waiting(tmp_path, monkeypatch):
    from hf_tpu_ext import distributed
    from hf_tpu_ext.run_lock import lock_output_dir

    monkeypatch.delenv("JAX_PROCESS_ID", raising=False)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1")  # Slurm / Open MPI: JAX finds the id
    lock = lock_output_dir(str(tmp_path / "run"))
    assert lock.pending and distributed._AFTER_INITIALIZE == [lock._take_if_chief]
    lock.release()
    assert distributed._AFTER_INITIALIZE == [] and not (tmp_path / "run").exists()
    monkeypatch.setenv("JAX_PROCESS_ID", "0")  # the id given: the lock is taken at once, as before
    assert not distributed.jax_process_id_pending()
    held = lock_output_dir(str(tmp_path / "run"))
    assert not held.pending and (tmp_path / "run" / ".hf-tpu-train.lock").exists()
    held.release()


def test_a_signalled_process_tells_the_others_it_exits():
    """After SIGTERM a process saves and exits through os._exit (no atexit): its beats end with ``exited``, so the
    process 0 still pushing the signal's save does not report it lost."""
    import signal
    import threading
    import time

    from hf_tpu_ext import interrupts

    interrupts.reset()  # a signal an earlier test of this process recorded would end the beats at once
    store = FakeStore()
    watch = LostProcessWatch(store, 1, 2, 30, poll=0.01)
    thread = threading.Thread(target=watch._run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while store.values.get(f"{HEARTBEAT_KEY_PREFIX}1") in (None, "exited") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.values[f"{HEARTBEAT_KEY_PREFIX}1"].isdigit()  # beating
        interrupts.record(signal.SIGTERM)
        while store.values[f"{HEARTBEAT_KEY_PREFIX}1"] != "exited" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.values[f"{HEARTBEAT_KEY_PREFIX}1"] == "exited"
        time.sleep(0.05)
        assert store.values[f"{HEARTBEAT_KEY_PREFIX}1"] == "exited"  # no beat after it
    finally:
        interrupts.reset()
        watch.verdict.set()  # ends the thread's watch of the others
        thread.join(5)


@pytest.mark.parametrize("ending", ["abort", "exited"])
def test_the_abort_reporter_names_a_lost_coordinator_after_jax_aborts(tmp_path, ending):
    """jax 0.10 aborts the other processes at once from C++ when process 0 goes: the reporter child prints the line
    after it; a process that says it exits (atexit, a signal, the watch's own line) leaves it quiet."""
    import subprocess
    import sys

    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text("{}")
    address = _closed_port_address()
    code = ("import os, sys\nfrom hf_tpu_ext.backends.keras.processes import start_abort_reporter, _tell_reporter\n"
            f"fd = start_abort_reporter({address!r}, 2, {str(tmp_path)!r})\n"
            f"if {ending!r} == 'exited':\n    _tell_reporter(fd)\n    sys.exit(0)\nos.abort()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if ending == "abort":
        assert proc.returncode == -6
        assert proc.stderr.strip().splitlines()[-1] == (
            f"hf-tpu train: error: process 0 of 2 was lost (the coordinator {address} no longer answers); the last "
            f"checkpoint is checkpoint-5 in {tmp_path}; rerun the same commands on every host (with "
            "--resume_from_checkpoint true) to resume.")
    else:
        assert (proc.returncode, proc.stderr) == (0, "")


def _closed_port_address() -> str:
    """``127.0.0.1:<port>`` of a port bound and closed again (nothing listens there)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_the_abort_reporter_stays_quiet_after_another_ending():
    """Ended without 'exited' but not by an abort (os._exit(143), as after a signal's save): quiet."""
    import subprocess
    import sys

    code = ("import os\nfrom hf_tpu_ext.backends.keras.processes import start_abort_reporter\n"
            f"start_abort_reporter({_closed_port_address()!r}, 2, '')\nos._exit(143)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (143, "")


def test_a_silent_peer_whose_liveness_port_answers_is_not_lost():
    """Beats late (its Python thread waits for the GIL during an XLA compile) but its port answers: alive; once
    the port is gone (the process killed), lost."""
    store, clock = FakeStore(), Clock()
    w0, w1 = _pair(store, clock, timeout=10)
    w1.listen("127.0.0.1")
    clock.now += 1
    assert (w1.beat(), w0.beat()) == (None, None)
    clock.now += 20  # process 1 silent for 20 s
    assert w0.beat() is None
    w1._listener.close()
    clock.now += 5
    assert w0.beat() is None  # the port answered 5 s ago: not yet 10 s silent since
    clock.now += 5
    assert w0.beat().startswith("process 1 of 2 was lost (no heartbeat for 10 s); ")


def test_a_peer_killed_while_this_process_exits_is_lost_at_once():
    """At exit (before JAX's shutdown barrier, which aborts on a dead peer) a peer that never said 'exited' and
    whose liveness port refuses is lost without waiting out the time-out; one that exited or answers is not."""
    import socket

    from hf_tpu_ext.backends.keras.processes import ALIVE_KEY_PREFIX

    store, clock = FakeStore(), Clock()
    w0, w1 = _pair(store, clock)
    w0.output_dir = "out"
    assert (w1.beat(), w0.beat()) == (None, None)
    with socket.socket() as alive:
        alive.bind(("127.0.0.1", 0))
        alive.listen(1)
        store.values[f"{ALIVE_KEY_PREFIX}1"] = f"127.0.0.1:{alive.getsockname()[1]}"
        assert w0.lost_at_exit() is None  # still running (finishing its own steps)
    # the port is closed now: process 1 was killed
    assert w0.lost_at_exit() == (
        "process 1 of 2 was lost (gone: its liveness port refused at this process's exit, within the heartbeat "
        "time-out of 30 s); no checkpoint in out yet (a rerun starts at step 0); rerun the same commands on every "
        "host (with --resume_from_checkpoint true) to resume.")
    w1.mark_exited()  # ended on purpose: its port closes after it said so
    assert w0.lost_at_exit() is None


@pytest.mark.parametrize("watch", [1, 10, 30, 61.5])
def test_jax_heartbeat_time_out_leaves_the_verdict_to_the_watch(watch):
    """XLA's agent beats every half time-out, so JAX can declare a killed process dead half its time-out after the
    kill: that half must come a margin after the watch's time-out (30 s watch: JAX at 90 s, earliest verdict 45 s;
    at 45 s, as before, JAX aborted first in about a third of the kills)."""
    from hf_tpu_ext.backends.keras.processes import JAX_HEARTBEAT_MARGIN, jax_heartbeat_timeout

    assert jax_heartbeat_timeout(30) == 90
    assert jax_heartbeat_timeout(watch) / 2 >= watch + JAX_HEARTBEAT_MARGIN
    assert isinstance(jax_heartbeat_timeout(watch), int)


def test_the_run_shape_the_environment_fixes_before_jax_starts():
    """``(devices of the run, processes)`` for the argument checks (issue 43 item 1): simulated CPU devices times
    the processes; ``None`` for what only JAX can count (an accelerator's devices, a slice's processes)."""
    from hf_tpu_ext.backends.keras.processes import shape_before_start

    cpu = {"JAX_PLATFORMS": "cpu"}
    assert shape_before_start({**cpu, "JAX_NUM_CPU_DEVICES": "2", "JAX_NUM_PROCESSES": "2"}) == (4, 2)
    flags = "--xla_dump_to=x --xla_force_host_platform_device_count=3"
    assert shape_before_start({**cpu, "XLA_FLAGS": flags}) == (3, 1)
    assert shape_before_start({**cpu, "JAX_NUM_CPU_DEVICES": "2", "XLA_FLAGS": flags}) == (2, 1)  # JAX's order
    assert shape_before_start(cpu) == (1, 1)
    assert shape_before_start({}) == (None, 1)  # an accelerator: JAX enumerates its devices
    assert shape_before_start({"JAX_PLATFORMS": "tpu", "JAX_NUM_PROCESSES": "4"}) == (None, 4)
    assert shape_before_start({**cpu, "SLURM_JOB_ID": "7"}) == (None, None)  # JAX finds the processes itself
    assert shape_before_start({**cpu, "JAX_NUM_PROCESSES": "two"}) == (None, None)  # JAX's start names it


def test_the_others_liveness_ports_go_to_on_peers_once_all_are_published():
    """Process 0 hands its coordination service sidecar the others' liveness ports (it serves them after process 0
    is gone until they refuse): once, when every one is published."""
    from hf_tpu_ext.backends.keras.processes import ALIVE_KEY_PREFIX

    store, got = FakeStore(), []
    watch = LostProcessWatch(store, 0, 3, 30, clock=Clock())
    watch.on_peers = got.append
    store.values[f"{ALIVE_KEY_PREFIX}2"] = "10.0.0.3:4002"
    watch.report_peers()
    assert got == [] and watch.on_peers is not None  # process 1 has not published its port yet
    store.values[f"{ALIVE_KEY_PREFIX}1"] = "10.0.0.2:4001"
    watch.report_peers()
    watch.report_peers()
    assert got == [["10.0.0.2:4001", "10.0.0.3:4002"]] and watch.on_peers is None
