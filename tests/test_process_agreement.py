"""What the processes of one multi-process run agree on, without JAX: process 0's value read by the others (the
tokenizer trained once), the run's exit status in every process (hf_tpu_ext.backends.keras.process_agreement on a
fake key-value store), a slice's terminal (hf_tpu_ext.distributed.ProcessLines) and the resume line that names each
process's environment (hf_tpu_ext.console.process_prefix). The 2-process runs: tests/current/test_keras_multiprocess.py.
"""

import logging

import pytest
from test_jax_processes import Clock, FakeStore

from hf_tpu_ext import distributed
from hf_tpu_ext.backends.keras.process_agreement import CHUNK, EXIT_STATUS_KEY, KeyValueAgreement
from hf_tpu_ext.console import process_prefix, resume_hint


def _pair(store, clock, wait=60.0):
    def sleep(seconds):
        clock.now += seconds

    return [KeyValueAgreement(store, i, 2, wait, clock=clock, sleep=sleep, ended_key="hb/0") for i in (0, 1)]


def test_process_0_makes_the_value_once_and_the_other_reads_it_in_chunks():
    store, clock = FakeStore(), Clock()
    a0, a1 = _pair(store, clock)
    made = []
    value = "x" * CHUNK + "tail"  # two entries: each below gRPC's message limit
    assert a0.share("tokenizer", lambda: made.append(1) or value) == value
    assert a1.share("tokenizer", lambda: made.append(2) or "never") == value
    assert made == [1]  # trained once, on process 0
    assert store.values["hf_tpu_ext/share/tokenizer/n"] == "2"


def test_a_failure_on_process_0_is_named_on_the_others():
    store, clock = FakeStore(), Clock()
    a0, a1 = _pair(store, clock)

    def fail():
        raise ValueError("vocab_size 10 cannot hold the 256 byte symbols")

    with pytest.raises(ValueError):
        a0.share("tokenizer", fail)
    with pytest.raises(RuntimeError) as err:
        a1.share("tokenizer", lambda: "never")
    assert str(err.value) == ("process 0 failed to make the tokenizer: ValueError: vocab_size 10 cannot hold the 256 "
                              "byte symbols")


def test_the_others_wait_for_the_value_and_give_up_when_process_0_ended_without_it():
    store, clock = FakeStore(), Clock()
    _, a1 = _pair(store, clock, wait=60)
    t0 = clock.now
    with pytest.raises(RuntimeError, match=r"^process 0 did not publish the tokenizer within 60 s "):
        a1.share("tokenizer", lambda: "never")
    assert clock.now - t0 == pytest.approx(60, abs=0.3)
    store.values["hb/0"] = "exited"  # process 0 ended (its watch's mark) without the value
    with pytest.raises(RuntimeError, match=r"^process 0 ended without publishing the tokenizer"):
        a1.share("tokenizer", lambda: "never")


def test_every_process_ends_with_the_runs_exit_status(capsys):
    """A refused final push: process 0 exits 1, so does process 1 (it used to exit 0 42 s earlier), saying why in
    one tagged line; a process with its own error keeps its status; a good run is 0 everywhere."""
    store, clock = FakeStore(), Clock()
    a0, a1 = _pair(store, clock)
    assert a0.exit_status(1) == 1 and store.values[EXIT_STATUS_KEY] == "1"
    assert a1.exit_status(0) == 1
    assert capsys.readouterr().err == ("hf-tpu train: error: [process 1] process 0 ended the run with exit status 1 "
                                       "(its lines say why); this process ends with it.\n")
    assert a1.exit_status(2) == 2  # its own error: its own status, without waiting
    assert a0.exit_status(0) == 0 and a1.exit_status(0) == 0
    assert capsys.readouterr().err == ""


def test_one_process_agrees_with_itself():
    assert distributed.agreed_exit_status(3) == 3
    assert distributed.from_main_process("tokenizer", lambda: "made here") == "made here"


@pytest.mark.parametrize("index", [0, 1])
def test_a_slice_terminal_shows_process_0s_lines_and_the_others_warnings_tagged(monkeypatch, index):
    monkeypatch.setattr(distributed, "process_index", lambda: index)
    lines = distributed.ProcessLines()

    def record(level, msg):
        return logging.LogRecord("hf_tpu_ext", level, __file__, 1, msg, None, None)

    info, warning = record(logging.INFO, "step 4 (epoch 0.25): loss 5.69"), record(logging.WARNING, "slow disk")
    assert lines.filter(info) == (index == 0)
    assert lines.filter(warning) and lines.filter(warning)  # tagged once, however many handlers filter it
    assert warning.getMessage() == ("slow disk" if index == 0 else "[process 1] slow disk")
    own = record(logging.INFO, "another process received a signal: stopping at step 3 with it")
    own.hf_tpu_own_line = True  # logger.info(..., extra=distributed.OWN_LINE)
    assert lines.filter(own)
    assert own.getMessage().startswith("[process 1] another" if index else "another")


def test_the_resume_line_of_a_process_names_the_environment_of_every_process():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.2:8476", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1",
           "JAX_NUM_CPU_DEVICES": "2"}
    assert resume_hint(["train", "--output_dir", "out dir"], environ=env) == (
        "on each process i = 0 .. 1: JAX_COORDINATOR_ADDRESS=10.0.0.2:8476 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=$i "
        "JAX_NUM_CPU_DEVICES=2 hf-tpu train --output_dir 'out dir' --resume_from_checkpoint true")
    # a TPU slice (JAX finds the rest): the same command on every host
    assert process_prefix({"HF_TPU_JAX_DISTRIBUTED": "1"}) == (
        "the same commands on every host: HF_TPU_JAX_DISTRIBUTED=1 ")
    # one process: nothing, or the devices it simulates (they make its global batch)
    assert process_prefix({}) == "" and process_prefix({"JAX_NUM_CPU_DEVICES": "4"}) == "JAX_NUM_CPU_DEVICES=4 "


def test_gloo_lines_are_left_out_of_stdout_only():
    """What gloo prints to fd 1 per collective group and process; the run's own output (a "[Gloo]" word inside a
    line included) passes."""
    import os

    from hf_tpu_ext.console import NATIVE_STDOUT_LINE, _pump, multi_process_environment

    read_fd, write_fd = os.pipe()
    out_r, out_w = os.pipe()
    os.write(write_fd, b"[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n"
                       b'{\n  "global_step": 4,\n  "note": "no [Gloo] lines"\n}\n[Gloo] Rank 1 is connected')
    os.close(write_fd)
    _pump(read_fd, out_w, NATIVE_STDOUT_LINE)
    os.close(out_w)
    assert os.read(out_r, 65536) == b'{\n  "global_step": 4,\n  "note": "no [Gloo] lines"\n}\n'
    assert multi_process_environment({"JAX_COORDINATOR_ADDRESS": "h:1"}) and not multi_process_environment({})
