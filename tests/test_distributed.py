"""Multi-replica, multi-worker and kill -9/resume behaviour of `hf-tpu train` (each run in its own process)."""

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT, TESTS_DIR, run_train_script, tiny_train_args

pytestmark = pytest.mark.slow


def _losses(out):
    state = json.loads((out / "trainer_state.json").read_text())
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


def _weights(out):
    from safetensors.numpy import load_file

    return load_file(str(out / "model.safetensors"))


def test_four_replicas_match_one_device(tmp_path):
    """4 replicas x 8, 4 replicas x 4 x 2 accumulated and 1 device x 32 on the same data (dropout off): same loss
    after 10 steps."""
    common = ["--max_steps", "10", "--logging_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
              "--callbacks", "", "--jit_compile", "true"]  # XLA per replica under MirroredStrategy
    mirrored = tmp_path / "mirrored"
    single = tmp_path / "single"
    run_train_script(["--split_cpu", "4", *tiny_train_args(mirrored, *common)])
    args = tiny_train_args(single, *common)
    args[args.index("--per_device_train_batch_size") + 1] = "32"
    run_train_script(args)
    summary = json.loads((mirrored / "training_summary.json").read_text())
    assert summary["num_replicas"] == 4 and summary["strategy"] == "MirroredStrategy"
    assert summary["global_batch_size"] == 32 and summary["jit_compile"] is True
    assert json.loads((single / "training_summary.json").read_text())["num_replicas"] == 1
    a, b = _losses(mirrored), _losses(single)
    assert sorted(a) == list(range(1, 11)) and sorted(b) == list(range(1, 11))
    assert abs(a[10] - b[10]) <= 1e-4, (a[10], b[10])
    assert a[10] < a[1]  # it trained
    # 4 replicas x 4 x 2 accumulated micro-batches: the same 32 sequences per optimizer step, the same loss
    accumulated = tmp_path / "accumulated"
    args = tiny_train_args(accumulated, *common, "--gradient_accumulation_steps", "2")
    args[args.index("--per_device_train_batch_size") + 1] = "4"
    run_train_script(["--split_cpu", "4", *args])
    c = _losses(accumulated)
    assert sorted(c) == list(range(1, 11)) and abs(c[10] - b[10]) <= 1e-4, (c[10], b[10])


def test_kill_and_resume_gives_same_weights(tmp_path):
    """2N steps straight == N steps, kill -9, resume to 2N (1e-5), with dropout on: the XLA step's counter-based
    dropout masks depend on (seed, step), so a resumed run draws the masks the straight run drew."""
    common = ["--max_steps", "8", "--save_strategy", "steps", "--save_steps", "4", "--eval_strategy", "no",
              "--callbacks", "", "--hidden_dropout_prob", "0.1", "--attention_probs_dropout_prob", "0.1"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_train_script(tiny_train_args(straight, *common))
    killed = run_train_script(["--kill_at_step", "4", *tiny_train_args(resumed, *common)], check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (resumed / "checkpoints" / "ckpt-4.index").is_file()
    assert not (resumed / "model.safetensors").exists()
    proc = run_train_script(tiny_train_args(resumed, *common, "--resume_from_checkpoint", "true"))
    assert "at global step 4" in proc.stderr
    state = json.loads((resumed / "trainer_state.json").read_text())
    assert state["global_step"] == 8
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys()
    worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    assert worst <= 1e-5, worst
    # the losses logged after the resume are the straight run's
    assert _losses(resumed)[8] == pytest.approx(_losses(straight)[8], abs=1e-5)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_multi_worker_only_chief_writes(tmp_path):
    """Two MultiWorkerMirroredStrategy workers on loopback train together; only the chief writes output."""
    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    outs = [tmp_path / "worker0", tmp_path / "worker1"]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    for index in range(2):
        env_i = dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        args = tiny_train_args(outs[index], "--max_steps", "6", "--eval_strategy", "no", "--save_strategy", "no",
                               "--callbacks", "")
        procs.append(subprocess.Popen([sys.executable, str(TESTS_DIR / "scripts" / "run_train.py"), *args],
                                      env=env_i, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        results = [p.communicate(timeout=420) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]
    summary = json.loads((outs[0] / "training_summary.json").read_text())
    assert summary["strategy"] == "MultiWorkerMirroredStrategy"
    assert summary["num_workers"] == 2 and summary["num_replicas"] == 2
    assert summary["global_step"] == 6
    assert (outs[0] / "model.safetensors").is_file()
    assert not outs[1].exists() or not any(outs[1].iterdir())
