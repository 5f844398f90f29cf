"""The Keras 3 push callback's card: "Training in progress, step N of M" before the end, the generated marker, and
a README.md the user wrote kept (text and metadata) when the callback writes its card."""

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
