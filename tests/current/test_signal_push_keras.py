"""The push side of signals on the Keras backend (issue 31): a SIGTERM with the commit budget spent still puts the
step reached on the Hub as ``last-checkpoint/``.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import json
import os
import signal

import pytest

pytest.importorskip("keras_hub")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

REPO = "alice/keras-signal-push"


def test_sigterm_with_the_budget_spent_puts_the_step_reached_on_the_hub(loopback_hub, tmp_path, monkeypatch):
    """``--hub_commit_budget 1``: the save of step 4 takes the hour's commit; SIGTERM while step 8 is saved (the
    test hook, as a preemption would): that save is pushed past the budget, last-checkpoint/ is at step 8."""
    from hf_tpu_ext import interrupts
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.errors import TrainingInterrupted
    from hf_tpu_ext.run import train

    monkeypatch.setenv(interrupts.SIGNAL_ENV, "checkpoint_weights@8")
    out = tmp_path / "run"
    args = ["--backend", "keras", "--output_dir", str(out), "--hidden_size", "32", "--num_hidden_layers", "1",
            "--num_attention_heads", "2", "--intermediate_size", "64", "--vocab_size", "300", "--max_seq_length", "32",
            "--per_device_train_batch_size", "8", "--max_train_samples", "128", "--logging_steps", "2",
            "--max_steps", "16", "--save_strategy", "steps", "--save_steps", "4", "--eval_strategy", "no",
            "--disable_tqdm", "true", "--push_to_hub", "true", "--hub_model_id", REPO, "--hub_strategy",
            "checkpoint", "--hub_token", loopback_hub.token, "--hub_commit_budget", "1",
            "--save_on_signal_timeout", "15"]
    with pytest.raises(TrainingInterrupted) as stop:
        train(*parse_args(args), argv=["train", *args])
    assert stop.value.step == 8 and stop.value.signum == signal.SIGTERM
    files = loopback_hub.server.files(REPO)
    assert json.loads(files["last-checkpoint/trainer_state.json"])["global_step"] == 8
    assert [c["message"] for c in loopback_hub.server.commits(REPO)][1:] == ["Training in progress, step 4",
                                                                           "Training in progress, step 8"]
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["interrupted"]["not_pushed"] == [] and summary["hub_pushes"]["signal_saves"] == 1
