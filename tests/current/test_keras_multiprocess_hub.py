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


def test_a_refused_final_push_is_exit_1_in_every_process(loopback_hub, tmp_path):
    """Issue 43 item 3: process 0's final push refused (403 on every commit: a quota, a revoked write) ends the run
    with exit 1 in both processes; process 1, with nothing wrong of its own, waits for process 0's status and says
    so in one tagged line (it used to exit 0, 42 s before process 0 knew)."""
    out = tmp_path / "run"
    repo = "alice/keras-two-processes-refused"
    loopback_hub.server.fail_next(1000, status=403, route="commit")
    push = ("--push_to_hub", "true", "--hub_model_id", repo, "--hub_token", loopback_hub.token)
    (rc0, err0), (rc1, err1) = finish(start_cluster([out, out], devices=1, extra=push))
    assert (rc0, rc1) == (1, 1), err0[-3000:] + err1[-3000:]
    assert err1.strip().splitlines()[-1] == ("hf-tpu train: error: [process 1] process 0 ended the run with exit "
                                            "status 1 (its lines say why); this process ends with it."), err1[-3000:]
    assert "model saved to" not in err1 and (out / "model.safetensors").is_file()
