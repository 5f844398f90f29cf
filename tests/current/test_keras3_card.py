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
