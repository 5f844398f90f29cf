"""PushToHubCallback with a tiny TF model in `model.fit`, against the loopback Hub."""

import json
import logging
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import tf_keras  # noqa: E402

import functools  # noqa: E402

from hf_tpu_ext.backends.tensorflow.export import save_model_folder  # noqa: E402
from hf_tpu_ext.callbacks.tf_keras.push_to_hub import PushToHubCallback as _PushToHubCallback  # noqa: E402

# the adapter imports no backend: the training run (here the test) passes the backend's model-folder writer
PushToHubCallback = functools.partial(_PushToHubCallback, save_fn=save_model_folder)
from hf_tpu_ext.errors import HubAuthError  # noqa: E402

STEPS_PER_EPOCH = 4
OPTIMIZER_FILE = (".index", ".data-")


def tiny_model(steps_per_execution=1):
    from transformers import RobertaConfig, TFRobertaForMaskedLM

    tf_keras.utils.set_random_seed(0)
    config = RobertaConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, max_position_embeddings=34, type_vocab_size=1, pad_token_id=1)
    model = TFRobertaForMaskedLM(config)
    model(model.dummy_inputs, training=False)
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-3), steps_per_execution=steps_per_execution)
    return model


@pytest.fixture(scope="module")
def _compiled_model():
    model = tiny_model()
    initial = [w.numpy() for w in model.weights]
    model.fit(tiny_data(), epochs=1, verbose=0)  # trace the train function once per module (the slow part)
    return model, initial


@pytest.fixture
def model(_compiled_model):
    """The module's compiled tiny model, reset to its initial weights and a fresh optimizer state (step 0)."""
    model, initial = _compiled_model
    for w, value in zip(model.weights, initial):
        w.assign(value)
    variables = model.optimizer.variables
    for v in (variables() if callable(variables) else variables):
        v.assign(tf.zeros_like(v))
    assert int(model.optimizer.iterations.numpy()) == 0
    return model


def tiny_data():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 300, size=(4 * STEPS_PER_EPOCH, 32)).astype(np.int32)
    labels = np.where(rng.random(ids.shape) < 0.15, ids, -100).astype(np.int32)
    labels[:, 3] = ids[:, 3]  # at least one prediction per row
    return tf.data.Dataset.from_tensor_slices(
        {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": labels}).batch(4)


def hub_weights(loopback_hub, repo_id, tmp_path, revision="main"):
    from huggingface_hub import hf_hub_download
    from safetensors.numpy import load_file

    return load_file(hf_hub_download(repo_id, "model.safetensors", revision=revision, cache_dir=tmp_path / "dl"))


def assert_same_as_model(weights, model):
    from hf_tpu_ext.backends.tensorflow.export import pytorch_state_dict

    expected = pytorch_state_dict(model)
    assert set(weights) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)


def model_commits_hold_no_optimizer_state(server, repo_id):
    for commit in server.commits(repo_id):
        if commit["message"].startswith(("Training in progress", "End of training")):
            # optimizer state only inside last-checkpoint/ (hub_strategy="checkpoint" pushes it with the model)
            assert not [p for p in commit["added"] if (any(s in p for s in OPTIMIZER_FILE) or "checkpoint" in p)
                        and not p.startswith("last-checkpoint/")], commit["message"]


def test_latency_longer_than_an_epoch_final_weights_land(loopback_hub, tmp_path, model):
    # 4 s per commit: epochs 2 and 3 (8 tiny steps) end while step 4 uploads even on a loaded machine (1 s did not)
    loopback_hub.server.latency(4.0, route="commit")
    cb = PushToHubCallback(str(tmp_path / "out"), hub_model_id="lat", hub_token=loopback_hub.token,
                           save_strategy="epoch", license="apache-2.0", backoff_seconds=0.01)
    model.fit(tiny_data(), epochs=3, callbacks=[cb], verbose=0)
    assert cb.pushed_steps == [4, 8, 12]  # the save at step 12 of 12 is the final push's (one commit, not two)
    assert cb.session.coalesced_steps == [12]
    report = cb.report
    assert not report.failed and not report.pending and not report.timed_out
    assert [m for m, _ in report.pushed][-1] == "End of training"
    assert report.superseded == ["Training in progress, step 8"]  # replaced by the final state while step 4 uploaded
    assert_same_as_model(hub_weights(loopback_hub, "alice/lat", tmp_path), model)
    readme = loopback_hub.server.files("alice/lat")["README.md"].decode()
    assert 'model="alice/lat"' in readme and "fine-tuned" not in readme
    model_commits_hold_no_optimizer_state(loopback_hub.server, "alice/lat")


def test_save_steps_counts_global_steps(loopback_hub, tmp_path, model):
    cb = PushToHubCallback(str(tmp_path / "out"), hub_model_id="steps", hub_token=loopback_hub.token,
                           save_strategy="steps", save_steps=3, backoff_seconds=0.01)
    model.fit(tiny_data(), epochs=2, callbacks=[cb], verbose=0)
    assert cb.pushed_steps == [3, 6, 8]
    messages = [c["message"] for c in loopback_hub.server.commits("alice/steps")]
    assert messages[-1] == "End of training"
    assert set(messages[1:-1]) <= {"Training in progress, step 3", "Training in progress, step 6"}


def test_save_steps_with_steps_per_execution(loopback_hub, tmp_path, model):
    # with steps_per_execution=2 Keras calls on_train_batch_end once per 2 steps: global steps 2, 4, 6, 8
    cb = PushToHubCallback(str(tmp_path / "out"), hub_model_id="spe", hub_token=loopback_hub.token,
                           save_strategy="steps", save_steps=3)
    cb.set_model(model)
    cb.on_train_begin()
    for batch, step in enumerate([2, 4, 6, 8]):
        model.optimizer.iterations.assign(step)
        cb.on_train_batch_end(batch, {"loss": 1.0})
    assert cb.pushed_steps == [4, 6]  # 3 was crossed inside the execution that ended at 4
    cb.on_train_end()
    assert cb.pushed_steps == [4, 6, 8] and not cb.report.failed


def test_save_best_only(loopback_hub, tmp_path, model):
    cb = PushToHubCallback(str(tmp_path / "out"), hub_model_id="best", hub_token=loopback_hub.token,
                           save_best_only=True, monitor="eval_loss", mode="min")
    cb.set_model(model)
    cb.on_train_begin()
    for epoch, (step, value) in enumerate([(4, 1.0), (8, 1.2), (12, 0.8)]):
        model.optimizer.iterations.assign(step)
        cb.on_epoch_end(epoch, {"val_loss": value})  # Keras' name for the monitored eval_loss
    assert cb.pushed_steps == [4, 12] and cb.best == 0.8 and cb.best_step == 12
    cb.on_train_end()
    assert cb.pushed_steps == [4, 12, 12] and not cb.report.failed


def test_503s_during_training(loopback_hub, tmp_path, model):
    loopback_hub.server.fail_next(3, status=503, route="commit")
    cb = PushToHubCallback(str(tmp_path / "out"), hub_model_id="flaky", hub_token=loopback_hub.token,
                           save_strategy="epoch", backoff_seconds=0.05)
    model.fit(tiny_data(), epochs=2, callbacks=[cb], verbose=0)
    assert not cb.report.failed and cb.report.pushed[-1][0] == "End of training"
    statuses = [r["status"] for r in loopback_hub.server.requests if r["route"] == "commit"]
    assert statuses[:3] == [503, 503, 503] and statuses[-1] == 200
    assert_same_as_model(hub_weights(loopback_hub, "alice/flaky", tmp_path), model)


def test_card_rejected_at_push_time_is_left_out_and_training_goes_on(loopback_hub, tmp_path, caplog, model):
    caplog.set_level(logging.INFO)
    cb = PushToHubCallback(str(tmp_path / "out"), hub_model_id="cardcheck", hub_token=loopback_hub.token,
                           save_strategy="epoch", license="apache-2.0", backoff_seconds=0.01)
    cb.preflight()  # its own card check passes; the Hub then rejects the first pushed card once
    loopback_hub.server.fail_next(1, status=400, route="validate_yaml")
    loopback_hub.server.latency(0.3, route="validate_yaml")  # the check runs in the push job, not in a step
    model.fit(tiny_data(), epochs=2, callbacks=[cb], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 8
    assert not cb.report.failed and cb.report.pushed[-1][0] == "End of training"
    commits = {c["message"]: c for c in loopback_hub.server.commits("alice/cardcheck")}
    first = commits["Training in progress, step 4"]
    assert "model.safetensors" in first["added"] and "README.md" not in first["added"]
    assert "README.md" in commits["End of training"]["added"]
    assert (tmp_path / "out" / "README.md").is_file()
    assert any("Model card not pushed" in r.getMessage() and "HTTP 400" in r.getMessage() for r in caplog.records)
    checks = [r["status"] for r in loopback_hub.server.requests if r["route"] == "validate_yaml"]
    assert checks[0] == 200 and checks[1] == 400 and checks[-1] == 200  # preflight, step 4, end of training


class _Probe(tf_keras.callbacks.Callback):
    batches = 0

    def on_train_batch_begin(self, batch, logs=None):
        type(self).batches += 1


@pytest.mark.parametrize("repo,token_attr,message", [
    ("mine", None, "token invalid"),
    ("alice/theirs", "other_token", "User 'bob' cannot write to namespace 'alice'"),
])
def test_auth_errors_before_first_step(loopback_hub, tmp_path, caplog, model, repo, token_attr, message):
    token = getattr(loopback_hub, token_attr) if token_attr else "hf_badTokenThatIsSecret123"
    caplog.set_level(logging.DEBUG)
    _Probe.batches = 0
    cb = PushToHubCallback(str(tmp_path / "out"), hub_model_id=repo, hub_token=token)
    with pytest.raises(HubAuthError, match=message) as info:
        model.fit(tiny_data(), epochs=1, callbacks=[cb, _Probe()], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0 and _Probe.batches == 0
    assert token not in str(info.value) and token not in repr(cb)
    assert all(token not in r.getMessage() for r in caplog.records)
    assert not os.path.exists(tmp_path / "out" / "model.safetensors")


def test_checkpoint_strategy_resume_and_no_token_leak(loopback_hub, tmp_path, caplog, model):
    from hf_tpu_ext.backends.tensorflow.checkpoint import TrainingCheckpointer
    from hf_tpu_ext.hub.resume import download_last_checkpoint

    caplog.set_level(logging.DEBUG)
    out = tmp_path / "out"
    cb = PushToHubCallback(str(out), hub_model_id="alice-org/resumable", hub_token=loopback_hub.token,
                           hub_strategy="checkpoint", save_strategy="epoch", hub_revision="dev",
                           dataset_name="wikitext", license="apache-2.0", backoff_seconds=0.01)
    model.fit(tiny_data(), epochs=2, callbacks=[cb], verbose=0)
    assert not cb.report.failed
    files = loopback_hub.server.files("alice-org/resumable", revision="dev")
    ckpt = sorted(p for p in files if p.startswith("last-checkpoint/"))
    assert ckpt == ["last-checkpoint/checkpoint", "last-checkpoint/ckpt-8.data-00000-of-00001",
                    "last-checkpoint/ckpt-8.index", "last-checkpoint/trainer_state.json"]
    state = json.loads(files["last-checkpoint/trainer_state.json"])
    assert (state["global_step"], state["epoch"], state["max_steps"]) == (8, 2.0, 8)
    # the model and the checkpoint of a save land in the same commit
    for commit in loopback_hub.server.commits("alice-org/resumable", branch="dev")[1:]:
        assert "model.safetensors" in commit["added"] and "last-checkpoint/trainer_state.json" in commit["added"]
    assert "wikitext" in files["README.md"].decode() and "datasets:\n- wikitext" in files["README.md"].decode()
    model_commits_hold_no_optimizer_state(loopback_hub.server, "alice-org/resumable")

    folder = download_last_checkpoint("alice-org/resumable@dev", loopback_hub.token, str(tmp_path / "dl"))
    fresh = tiny_model()
    restored = TrainingCheckpointer(fresh, fresh.optimizer, str(tmp_path / "fresh" / "checkpoints"), max_to_keep=2)
    assert restored.restore(folder) == 8
    for a, b in zip(model.weights, fresh.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)

    token = loopback_hub.token
    assert all(token not in r.getMessage() for r in caplog.records)
    for root, _, names in os.walk(out):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                assert token.encode() not in f.read(), name
    assert all(token.encode() not in content for content in files.values())


def test_drop_in_card_is_complete(loopback_hub, tmp_path, model):
    # a plain fit with the throughput and push callbacks (push first: the card reads the meter, in any order)
    from huggingface_hub import ModelCard

    from hf_tpu_ext.callbacks.tf_keras.throughput import ThroughputCallback
    from hf_tpu_ext.flops import flops_per_token

    out = tmp_path / "out"
    push = PushToHubCallback(str(out), hub_model_id="alice/complete", hub_token=loopback_hub.token,
                             hub_strategy="checkpoint", save_strategy="epoch", backoff_seconds=0.01)
    meter = ThroughputCallback(global_batch_size=4, seq_length=32, warmup_steps=1, log_every=0, peak_flops=1e12)
    model.fit(tiny_data(), epochs=2, callbacks=[push, meter], verbose=0)
    # MFU without flops_per_token=: the FLOPs come from the model's config (LM head at every position)
    assert meter.flops_per_token == flops_per_token(model.config, 32)
    assert meter.summary["mfu"] == pytest.approx(meter.summary["tokens_per_second"] * meter.flops_per_token / 1e12)
    files = loopback_hub.server.files("alice/complete")
    text = ModelCard(files["README.md"].decode()).text
    assert "| Distribution strategy | one device (no distribution strategy) |" in text
    assert "| Tokens seen | 1,024 |" in text  # 8 steps x 4 sequences x 32 tokens
    steady = [line for line in text.splitlines() if line.startswith("| Throughput, steady")]
    assert len(steady) == 1 and "n/a" not in steady[0]
    assert "| MFU (steady rate x FLOPs per token / peak FLOP/s) | " in text and "peak 1e+12 FLOP/s" in text
    assert "![Training and evaluation loss](loss_curve.png)" in text and "loss_curve.png" in files
    # compiled without jit_compile=True: TensorFlow's kernels ran, the card claims no XLA
    assert "It was trained with hf-tpu-ext using TensorFlow." in text and "| XLA compilation | n/a |" in text
    state = json.loads(files["last-checkpoint/trainer_state.json"])
    losses = [e for e in state["log_history"] if "loss" in e]
    assert [e["step"] for e in losses] == list(range(1, 9)) and all(np.isfinite(e["loss"]) for e in losses)
    # what the fit knew (4 steps per epoch, saved per epoch, no evaluation: no eval_steps), no TrainerState default
    assert set(state) == {"global_step", "epoch", "max_steps", "num_train_epochs", "logging_steps", "save_steps",
                          "train_batch_size", "num_input_tokens_seen", "total_flos", "train_runtime", "log_history"}
    assert ([state[k] for k in ("global_step", "epoch", "max_steps", "num_train_epochs", "logging_steps", "save_steps",
                                "train_batch_size", "num_input_tokens_seen")] == [8, 2.0, 8, 2, 1, 4, 4, 1024])
    assert state["total_flos"] == pytest.approx(1024 * meter.flops_per_token) and state["train_runtime"] > 0
