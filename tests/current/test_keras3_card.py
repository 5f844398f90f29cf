"""The Keras 3 push callback's card: "Training in progress, step N of M" before the end, the generated marker, a
README.md the user wrote kept (text and metadata) when the callback writes its card; a fit's evaluation, loss curve
and framework versions on the card, and a checkpoint ``trainer_state.json`` holding what ran (no placeholder)."""

import pytest

keras = pytest.importorskip("keras")


def test_keras3_card_progress_marker_and_user_readme(tmp_path):
    from huggingface_hub import ModelCard

    from hf_tpu_ext.callbacks.keras.model_files import render_card
    from hf_tpu_ext.hub.model_card import card_origin, write_card

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    mid = render_card(model, "alice/k3", step=4, epoch=1.0, max_steps=8)
    assert "**Training in progress, step 4 of 8**: these weights are a snapshot of an unfinished run" in mid
    assert card_origin(mid) == "generated"
    final = render_card(model, "alice/k3", step=8, epoch=2.0, final=True, max_steps=8)
    assert "Training in progress" not in final and "(end of training: step 8, epoch 2)" in final

    (tmp_path / "README.md").write_text("---\nlanguage: en\n---\n\n# My Keras model\n")
    assert write_card(str(tmp_path), ModelCard(final)) == "merged"
    text = (tmp_path / "README.md").read_text()
    assert text.endswith("---\n\n# My Keras model\n") and "language: en" in text and "library_name: keras" in text


def test_keras3_card_has_the_throughput_and_mfu_rows_of_hf_tpu_train(tmp_path):
    from hf_tpu_ext.callbacks.keras.model_files import render_card

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    facts = {"tokens_seen": 4096, "train_tokens_per_second": 1234.56, "steady_tokens_per_second": 2345.67,
             "mfu": 0.0123, "mfu_peak_flops": 1.5e12, "mfu_peak_source": "CPU: 2 cores x 16 FLOP/cycle x 3 GHz"}
    card = render_card(model, "alice/k3", step=8, epoch=2.0, final=True, facts=facts)
    assert ("\n## Training procedure\n\n| | |\n|---|---|\n| Tokens seen | 4,096 |\n"
            "| Throughput, whole run (tokens/s: tokens seen / training wall time) | 1234.6 |\n"
            "| Throughput, steady (tokens/s of the median training step; compilation, evaluation and checkpoints "
            "excluded) | 2345.7 |\n"
            "| MFU (steady rate x FLOPs per token / peak FLOP/s) | 1.2% (peak 1.5e+12 FLOP/s per replica; "
            "CPU: 2 cores x 16 FLOP/cycle x 3 GHz) |\n") in card
    no_peak = render_card(model, "alice/k3", step=8, epoch=2.0, final=True,
                          facts={"steady_tokens_per_second": 100.0, "mfu_note": "MFU left out: no FLOPs per token"})
    assert "| Tokens seen | n/a |\n" in no_peak and "| MFU | n/a (no FLOPs per token) |\n" in no_peak
    bare = render_card(model, "alice/k3", step=8, epoch=2.0, final=True)
    assert ("## Training procedure\n\n| | |\n|---|---|\n"
            "| Throughput, MFU | n/a (no hf_tpu_ext ThroughputCallback in this fit's callbacks) |\n") in bare


def _fit_with_validation(loopback_hub, tmp_path):
    """A plain Keras 3 fit with fit's own validation, the push and throughput callbacks: (history, Hub files, state)."""
    import json

    import numpy as np

    from hf_tpu_ext.callbacks import get_callback

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    push = get_callback("push_to_hub", framework="keras", output_dir=str(tmp_path / "out"), hub_model_id="alice/k3v",
                        hub_token=loopback_hub.token, hub_strategy="checkpoint", backoff_seconds=0.01)
    meter = get_callback("throughput", framework="keras", global_batch_size=4, seq_length=3, flops_per_token=10.0,
                         peak_flops=1e12, warmup_steps=1, log_every=0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, validation_data=(x[:8], y[:8]),
                        callbacks=[push, meter])
    files = loopback_hub.server.files("alice/k3v")
    return history.history, files, json.loads(files["last-checkpoint/trainer_state.json"])


def test_keras3_fit_card_has_eval_loss_curve_and_versions_and_state_says_what_ran(loopback_hub, tmp_path):
    import math
    import sys
    from importlib.metadata import version

    from huggingface_hub import ModelCard

    h, files, state = _fit_with_validation(loopback_hub, tmp_path)
    # trainer_state.json: what the fit ran (16 samples / batch 4 = 4 steps per epoch, 2 epochs), no placeholder
    assert set(state) == {"global_step", "epoch", "max_steps", "num_train_epochs", "logging_steps", "eval_steps",
                          "save_steps", "train_batch_size", "num_input_tokens_seen", "total_flos", "train_runtime",
                          "log_history"}
    assert ([state[k] for k in ("global_step", "epoch", "max_steps", "num_train_epochs", "logging_steps", "eval_steps",
                                "save_steps", "train_batch_size", "num_input_tokens_seen", "total_flos")]
            == [8, 2.0, 8, 2, 1, 4, 4, 4, 8 * 4 * 3, 8 * 4 * 3 * 10.0])
    assert 0 < state["train_runtime"] < 600
    log = state["log_history"]
    assert [(e["step"], e["epoch"]) for e in log if set(e) == {"loss", "step", "epoch"}] == [
        (s, s / 4) for s in range(1, 9)]
    epochs = [e for e in log if "eval_loss" in e]
    assert [(e["step"], e["epoch"]) for e in epochs] == [(4, 1.0), (8, 2.0)]
    assert [e["eval_loss"] for e in epochs] == [round(v, 6) for v in h["val_loss"]]
    assert [e["loss"] for e in epochs] == [round(v, 6) for v in h["loss"]]
    assert [e["perplexity"] for e in epochs] == [round(math.exp(v), 6) for v in h["val_loss"]]
    # the card: fit's validation as eval loss/perplexity and model-index, the loss curve, the framework versions
    card = ModelCard(files["README.md"].decode())
    loss = h["val_loss"][-1]
    assert {r.metric_type: r.metric_value for r in card.data.eval_results} == {
        "loss": round(loss, 6), "perplexity": round(math.exp(loss), 6)}
    assert f"| Eval loss (nats) | {round(loss, 6):.6g} |\n| Perplexity | {round(math.exp(loss), 6):.6g} |\n" in card.text
    assert "\n### Loss curve\n\n![Training and evaluation loss](loss_curve.png)\n" in card.text
    assert files["loss_curve.png"].startswith(b"\x89PNG\r\n\x1a\n")
    names = ["keras", "keras-hub", "jax", "jaxlib"] + (["transformers"] if "transformers" in sys.modules else []) + [
        "huggingface_hub", "hf-tpu-ext"]
    expected = "".join(f"- {n} {version(n)}{' (the Keras backend)' if n == 'jax' else ''}\n" for n in names)
    assert card.text.endswith("\n## Framework versions\n\n" + expected), card.text[-600:]


def test_keras_framework_versions_name_the_backend_that_ran():
    from importlib.metadata import version

    from hf_tpu_ext.hub.card_facts import keras_framework_versions

    assert keras_framework_versions("torch") == [(n, version(n)) for n in (
        "keras", "keras-hub", "torch", "huggingface_hub", "hf-tpu-ext")]
    assert keras_framework_versions("TensorFlow", uses_transformers=True) == [(n, version(n)) for n in (
        "keras", "keras-hub", "tensorflow", "transformers", "huggingface_hub", "hf-tpu-ext")]
    with pytest.raises(ValueError, match=r"^unknown Keras backend 'numpy' \(jax, tensorflow or torch\)$"):
        keras_framework_versions("numpy")
