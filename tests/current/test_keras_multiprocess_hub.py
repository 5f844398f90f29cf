"""Pushes of a 2-process `hf-tpu train --backend keras` against the loopback Hub (issue 27 item 1: only process 0
pushes): a SIGTERM to process 1 stops both at one step whose save is pushed once, and the same commands with
``--resume_from_checkpoint true`` push the final model; the Hub has one commit per save, none twice (process 1
pushes nothing). The processes are started as tests/current/test_keras_multiprocess.py starts them (the README's
variables), 1 CPU device each.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import json
import os

import pytest

pytest.importorskip("keras_hub")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

from test_keras_multiprocess import finish, start_cluster  # noqa: E402

REPO = "alice/keras-two-processes"


def test_two_processes_push_from_process_0_once_per_save_and_the_signal_save(loopback_hub, tmp_path):
    out = tmp_path / "run"
    push = ("--save_steps", "4", "--push_to_hub", "true", "--hub_model_id", REPO, "--hub_token", loopback_hub.token,
            "--save_on_signal_timeout", "20")
    procs = start_cluster([out, out], devices=1, extra=push,
                          extra_env=(None, {"HF_TPU_EXT_TEST_SIGNAL_AT": "train_step@6"}))
    (rc0, err0), (rc1, err1) = finish(procs)
    assert (rc0, rc1) == (143, 143), err0[-3000:] + err1[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    titles = [c["message"] for c in loopback_hub.server.commits(REPO)][1:]  # after the repo's first commit
    assert titles == ["Training in progress, step 4", "Training in progress, step 6"]  # the signal's save once
    assert json.loads(loopback_hub.server.files(REPO)["trainer_state.json"])["global_step"] == 6
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["interrupted"]["not_pushed"] == [] and summary["hub_pushes"]["signal_saves"] == 1

    results = finish(start_cluster([out, out], devices=1, extra=(*push, "--resume_from_checkpoint", "true")))
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    titles = [c["message"] for c in loopback_hub.server.commits(REPO)][1:]
    assert titles == ["Training in progress, step 4", "Training in progress, step 6",
                      "Training in progress, step 8", "End of training"]
    files = loopback_hub.server.files(REPO)
    assert json.loads(files["trainer_state.json"])["global_step"] == 10
    assert files["model.safetensors"] == (out / "model.safetensors").read_bytes()  # the final model, process 0's
