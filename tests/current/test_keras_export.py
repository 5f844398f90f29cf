"""The Keras backend's model folder: keras-hub RobertaMaskedLM -> transformers 5 (PyTorch) and keras-hub, and back.

A tiny keras-hub ``RobertaMaskedLM`` (vocabulary of a BPE trained here, hidden 32, 2 layers, 32 positions) with
every weight randomized (so a swapped gamma/beta, a bias left out or a wrong transpose changes the logits) is
exported with ``hf_tpu_ext.backends.keras.export.export_masked_lm``; then:

- ``AutoModelForMaskedLM.from_pretrained(folder)`` (transformers 5, PyTorch) gives the Keras logits (1e-4) on a
  right-padded batch at every real token, with no missing/unexpected weights; the fill-mask pipeline runs;
- keras-hub loads the whole masked LM (head included) from the folder's ``keras_hub/`` preset, locally and
  downloaded from the loopback Hub, with the same logits (1e-4) and the same token ids as the transformers
  tokenizer; keras-hub's own ``hf://`` loader reads the backbone of the same repo;
- transformers -> keras-hub -> transformers keeps the logits (1e-4), token-type and position rows included.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_keras_export.py``.
"""

import json
import os
import re

import numpy as np
import pytest

pytest.importorskip("keras_hub")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tpu_ext.backends.keras import hf_convert  # noqa: E402
from hf_tpu_ext.backends.keras.export import KERAS_PRESET_DIR, export_masked_lm  # noqa: E402
from hf_tpu_ext.errors import CheckpointError  # noqa: E402

SEQ = 32
WORDS = ("the quick brown fox jumps over a lazy dog while seven tiny robots sing about rivers mountains "
         "and the old lighthouse keeper counts ships under a bright silver moon").split()
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Seven tiny robots sing.",
         "The old lighthouse keeper counts ships under a bright silver moon, and the rivers sing about mountains."]


@pytest.fixture(scope="module")
def tokenizer():
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    rng = np.random.default_rng(0)
    corpus = [" ".join(rng.choice(WORDS, size=12)) for _ in range(300)] + TEXTS
    return train_bpe_tokenizer(corpus, vocab_size=400, model_max_length=SEQ)


def _randomize(model, seed):
    """Every variable random (LayerNorm scales around 1), so each weight's mapping shows in the logits."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        value = rng.normal(0.0, 0.2, size=tuple(v.shape)).astype("float32")
        if v.path.endswith("gamma"):
            value += 1.0
        v.assign(value)


@pytest.fixture(scope="module")
def masked_lm(tokenizer):
    import keras_hub

    backbone = keras_hub.models.RobertaBackbone(vocabulary_size=len(tokenizer), num_layers=2, num_heads=4,
                                                hidden_dim=32, intermediate_dim=64, dropout=0.0,
                                                max_sequence_length=SEQ)
    model = keras_hub.models.RobertaMaskedLM(backbone=backbone)
    _randomize(model, 1)
    return model


@pytest.fixture(scope="module")
def batch(tokenizer):
    enc = tokenizer(TEXTS, padding="max_length", max_length=SEQ, truncation=True, return_tensors="np")
    ids, mask = enc["input_ids"].astype("int32"), enc["attention_mask"].astype("int32")
    assert mask.min() == 0 and mask.sum(axis=1).max() > mask.sum(axis=1).min()  # really padded, unequal lengths
    return ids, mask


def keras_logits(model, ids, mask):
    """[B, L, V] logits of a keras-hub RobertaMaskedLM at every position."""
    positions = np.tile(np.arange(ids.shape[1], dtype="int32"), (ids.shape[0], 1))
    out = model({"token_ids": ids, "padding_mask": mask, "mask_positions": positions}, training=False)
    return np.asarray(out, dtype="float32")


def torch_logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()


def max_diff_at_tokens(a, b, mask):
    """Largest |a - b| over the real (unpadded) tokens: pad positions' outputs are masked out by every user."""
    return float(np.abs(a - b)[mask.astype(bool)].max())


@pytest.fixture(scope="module")
def reference(masked_lm, batch):
    return keras_logits(masked_lm, *batch)


@pytest.fixture(scope="module")
def exported(masked_lm, tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("keras_export") / "model"
    files = export_masked_lm(masked_lm, str(folder), tokenizer, None)
    return str(folder), files


def test_folder_has_transformers_names_config_and_preset(exported, tokenizer):
    from safetensors import safe_open

    folder, files = exported
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(files)
    for name in ("config.json", "task.json", "model.weights.h5", "task.weights.h5", "metadata.json",
                 "preprocessor.json", "tokenizer.json"):
        assert f"{KERAS_PRESET_DIR}/{name}" in files
    assert all(os.path.isfile(os.path.join(folder, f)) for f in files)
    assert not [n for n in os.listdir(folder) if n.startswith(".")]  # no temp file or folder left

    config = json.loads(open(os.path.join(folder, "config.json")).read())
    assert config["architectures"] == ["RobertaForMaskedLM"] and config["model_type"] == "roberta"
    assert (config["max_position_embeddings"], config["type_vocab_size"], config["vocab_size"]) == (SEQ + 2, 1, len(tokenizer))
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (32, 2, 4)
    assert config["layer_norm_eps"] == 1e-5 and config["pad_token_id"] == tokenizer.pad_token_id == 1

    # exactly the names RobertaForMaskedLM.save_pretrained writes (decoder tied, so left out)
    expected = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**{
        k: config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size", "max_position_embeddings", "type_vocab_size")})).state_dict()
    with safe_open(os.path.join(folder, "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        names = set(f.keys())
        shapes = {n: tuple(f.get_slice(n).get_shape()) for n in names}
    assert names == {n for n in expected if not n.startswith("lm_head.decoder.")}
    assert all(shapes[n] == tuple(expected[n].shape) for n in names)
    assert shapes["roberta.embeddings.position_embeddings.weight"] == (SEQ + 2, 32)


def test_transformers_pytorch_logits_equal_keras(exported, batch, reference):
    folder, _ = exported
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(folder, output_loading_info=True)
    model.eval()
    assert type(model).__name__ == "RobertaForMaskedLM"
    assert info["missing_keys"] == set() or info["missing_keys"] == []
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    assert model.lm_head.decoder.weight.data_ptr() == model.roberta.embeddings.word_embeddings.weight.data_ptr()
    logits = torch_logits(model, *batch)
    assert logits.shape == reference.shape == (len(TEXTS), SEQ, model.config.vocab_size)
    assert max_diff_at_tokens(logits, reference, batch[1]) <= 1e-4


def test_fill_mask_pipeline_runs_on_folder(exported, tokenizer, masked_lm):
    folder, _ = exported
    fill = transformers.pipeline("fill-mask", model=folder)
    text = f"The quick brown {tokenizer.mask_token} jumps."
    preds = fill(text, top_k=3)
    assert len(preds) == 3 and all(tokenizer.mask_token not in p["sequence"] for p in preds)
    enc = tokenizer(text, return_tensors="np")
    ids = enc["input_ids"].astype("int32")
    pos = int(np.where(ids[0] == tokenizer.mask_token_id)[0][0])
    logits = keras_logits(masked_lm, ids, enc["attention_mask"].astype("int32"))[0, pos]
    assert preds[0]["token"] == int(np.argmax(logits))
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert abs(preds[0]["score"] - float(probs.max())) <= 1e-4


def test_keras_hub_loads_whole_masked_lm_from_preset(exported, batch, reference, tokenizer):
    import keras_hub

    folder, _ = exported
    loaded = keras_hub.models.RobertaMaskedLM.from_preset(os.path.join(folder, KERAS_PRESET_DIR))
    assert max_diff_at_tokens(keras_logits(loaded, *batch), reference, batch[1]) <= 1e-4
    # the preset's tokenizer is the transformers one: same ids for the same text
    keras_tok = loaded.preprocessor.tokenizer
    for text in TEXTS:
        assert [int(t) for t in np.asarray(keras_tok(text))] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert loaded.preprocessor.sequence_length == SEQ


def test_keras_hub_loads_masked_lm_from_hub_repo(exported, batch, reference, loopback_hub):
    import keras_hub
    from huggingface_hub import HfApi

    from hf_tpu_ext.hub.model_card import render_model_card

    folder, _ = exported
    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/keras-roberta")
    api.upload_folder(repo_id="alice/keras-roberta", folder_path=folder)
    # the model card's keras-hub snippet, run as written: it downloads the preset subfolder only
    card = str(render_model_card(folder, repo_id="alice/keras-roberta", summary={"backend": "keras"}))
    assert "- keras-hub\n" in card and "Keras 3 on JAX + XLA" in card
    snippets = re.findall(r"```python\n(.*?)```", card, flags=re.S)
    keras_snippet = [code for code in snippets if "keras_hub" in code]
    assert len(keras_snippet) == 1 and "hf://" not in keras_snippet[0]
    scope = {}
    exec(keras_snippet[0], scope)
    assert not os.path.exists(os.path.join(scope["folder"], "model.safetensors"))  # only the preset was downloaded
    loaded = scope["masked_lm"]
    assert type(loaded).__name__ == "RobertaMaskedLM"
    assert max_diff_at_tokens(keras_logits(loaded, *batch), reference, batch[1]) <= 1e-4
    # keras-hub's own transformers converter (hf:// at the repo root) reads the exported backbone as well
    backbone = keras_hub.models.RobertaBackbone.from_preset("hf://alice/keras-roberta")
    inputs = {"token_ids": batch[0], "padding_mask": batch[1]}
    expected = np.asarray(loaded.backbone(inputs))
    assert max_diff_at_tokens(np.asarray(backbone(inputs)), expected, batch[1]) <= 1e-4


def test_round_trip_transformers_keras_transformers(tmp_path, batch, tokenizer):
    config = transformers.RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=SEQ + 2,
                                        type_vocab_size=1, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    original = transformers.RobertaForMaskedLM(config).eval()
    with torch.no_grad():  # token types and the bias are zeros at init: make them count
        for p in original.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    original.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    expected = torch_logits(original, *batch)

    masked_lm, loaded_config = hf_convert.load_masked_lm(str(tmp_path / "hf"))
    assert masked_lm.embeddings.max_position_embeddings == SEQ and loaded_config.model_type == "roberta"
    assert max_diff_at_tokens(keras_logits(masked_lm, *batch), expected, batch[1]) <= 1e-4

    export_masked_lm(masked_lm, str(tmp_path / "back"), str(tmp_path / "hf"), loaded_config, keras_preset=False)
    assert not os.path.exists(tmp_path / "back" / KERAS_PRESET_DIR)
    again = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "back").eval()
    assert max_diff_at_tokens(torch_logits(again, *batch), expected, batch[1]) <= 1e-4
    # weights that need no folding come back bit-identical
    for name in ("roberta.encoder.layer.1.attention.self.key.weight", "lm_head.dense.weight", "lm_head.bias"):
        assert torch.equal(again.state_dict()[name], original.state_dict()[name]), name

    # an older folder with pytorch_model.bin only (the whole state dict, tied decoder included)
    (tmp_path / "bin").mkdir()
    config.save_pretrained(tmp_path / "bin")
    torch.save(original.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    from_bin, _ = hf_convert.load_masked_lm(str(tmp_path / "bin"))
    assert max_diff_at_tokens(keras_logits(from_bin, *batch), expected, batch[1]) <= 1e-4

    # into an existing model of the same sizes (the backend's --model_name_or_path path)
    _randomize(masked_lm, 7)
    returned = hf_convert.load_transformers_weights(masked_lm, str(tmp_path / "hf"))
    assert returned.vocab_size == len(tokenizer)
    assert max_diff_at_tokens(keras_logits(masked_lm, *batch), expected, batch[1]) <= 1e-4


def test_unsupported_models_fail_before_weights_are_read(tmp_path, masked_lm):
    electra = transformers.ElectraConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                         intermediate_size=64)
    electra.save_pretrained(tmp_path / "electra")  # a config with no weights at all: the model type is refused first
    with pytest.raises(CheckpointError, match="model_type is 'electra'"):
        hf_convert.load_masked_lm(str(tmp_path / "electra"))
    wrong = transformers.RobertaConfig(vocab_size=masked_lm.backbone.vocabulary_size, hidden_size=64,
                                       num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    with pytest.raises(CheckpointError, match=r"hidden_size=64 \(model: 32\)"):
        export_masked_lm(masked_lm, str(tmp_path / "out"), None, wrong)
    assert not os.path.exists(tmp_path / "out")  # nothing written
