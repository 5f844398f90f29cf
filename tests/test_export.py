"""PyTorch-format model folders written from TF (save_model_folder) and read back (load_tf_model)."""

import json
import os
import shutil

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hf_tpu_ext.backends.tensorflow import export  # noqa: E402
from hf_tpu_ext.backends.tensorflow.export import load_tf_model, save_model_folder  # noqa: E402
from hf_tpu_ext.errors import ArgumentError, CheckpointError, HubRepoError  # noqa: E402

SEQ = 32
VOCAB = 300
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny model learns to fill in the masked word.",
    "Tensor processing units run XLA compiled programs.",
    "Hugging Face hosts models, datasets and spaces.",
] * 20


def _tiny_config(**kw):
    from transformers import RobertaConfig

    base = dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=SEQ + 2, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    )
    base.update(kw)
    return RobertaConfig(**base)


def _tiny_tokenizer():
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import RobertaTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0..4, pad=1 as RoBERTa
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=VOCAB, min_frequency=1, special_tokens=specials)
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok = RobertaTokenizerFast(tokenizer_object=bpe, model_max_length=SEQ)
    assert len(tok) <= VOCAB and tok.pad_token_id == 1 and tok.mask_token_id == 4
    return tok


@pytest.fixture(scope="session")
def tiny_tf_model():
    from transformers import TFRobertaForMaskedLM

    tf.keras.utils.set_random_seed(0)
    model = TFRobertaForMaskedLM(_tiny_config())
    model(model.dummy_inputs, training=False)
    return model


@pytest.fixture(scope="session")
def input_ids():
    rng = np.random.RandomState(0)
    ids = rng.randint(5, VOCAB, size=(2, SEQ)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 0, 2
    return ids


@pytest.fixture(scope="session")
def tf_logits(tiny_tf_model, input_ids):
    return tiny_tf_model(input_ids=input_ids, training=False).logits.numpy()


@pytest.fixture(scope="session")
def exported(tmp_path_factory, tiny_tf_model):
    folder = str(tmp_path_factory.mktemp("exported"))
    tok = _tiny_tokenizer()
    files = save_model_folder(tiny_tf_model, folder, tokenizer=tok)
    return folder, files, tok


def test_folder_has_pt_names_metadata_and_config(exported, tiny_tf_model):
    from safetensors import safe_open

    folder, files, _ = exported
    assert files[:3] == ["model.safetensors", "tf_model.h5", "config.json"]
    assert "tokenizer.json" in files and "tokenizer_config.json" in files
    for name in files:
        assert os.path.isfile(os.path.join(folder, name)), name
    assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]

    with safe_open(os.path.join(folder, "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        keys = set(f.keys())
        query = f.get_tensor("roberta.encoder.layer.0.attention.self.query.weight")
        inter = f.get_tensor("roberta.encoder.layer.1.intermediate.dense.weight")
        emb = f.get_tensor("roberta.embeddings.word_embeddings.weight")
    # Same 42 tensors RobertaForMaskedLM.save_pretrained writes: tied decoder weights are not stored.
    assert len(keys) == 42
    assert {"lm_head.bias", "lm_head.dense.weight", "lm_head.layer_norm.weight", "roberta.embeddings.LayerNorm.bias"} <= keys
    assert "lm_head.decoder.weight" not in keys and not any(k.startswith("tf_roberta") for k in keys)
    # PyTorch Linear is [out, in]: the TF kernel [in=64, out=128] must come out transposed.
    tf_kernel = [w for w in tiny_tf_model.weights if "layer_._1/intermediate/dense/kernel" in w.name][0].numpy()
    assert tf_kernel.shape == (64, 128) and inter.shape == (128, 64)
    np.testing.assert_array_equal(inter, tf_kernel.T)
    assert query.dtype == np.float32 and emb.shape == (VOCAB, 64)

    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["RobertaForMaskedLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"], config["max_position_embeddings"]) == (64, 2, VOCAB, SEQ + 2)


def test_roundtrip_into_tf(exported, input_ids, tf_logits):
    folder, _, _ = exported
    model = load_tf_model(folder)
    assert type(model).__name__ == "TFRobertaForMaskedLM"
    logits = model(input_ids=input_ids, training=False).logits.numpy()
    assert logits.shape == (2, SEQ, VOCAB)
    assert np.max(np.abs(logits - tf_logits)) <= 1e-5


def test_config_overrides_and_errors(exported, tmp_path):
    folder, _, _ = exported
    model = load_tf_model(folder, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    assert model.config.hidden_dropout_prob == 0.0 and model.config.attention_probs_dropout_prob == 0.0
    with pytest.raises(ArgumentError, match="not_a_field"):
        load_tf_model(folder, not_a_field=3)
    with pytest.raises(ArgumentError, match="does not exist"):
        load_tf_model(os.path.join(str(tmp_path), "missing", "model"))

    empty = tmp_path / "no_weights"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_tf_model(str(empty))
    (empty / "config.json").write_text((open(os.path.join(folder, "config.json")).read()))
    with pytest.raises(CheckpointError, match="has no weights"):
        load_tf_model(str(empty))

    # Weights that do not fit the config are reported as such, not as a reshape traceback.
    bad = tmp_path / "bad_shape"
    bad.mkdir()
    cfg = json.loads(open(os.path.join(folder, "config.json")).read())
    cfg["vocab_size"] = 400
    (bad / "config.json").write_text(json.dumps(cfg))
    shutil.copy(os.path.join(folder, "model.safetensors"), bad / "model.safetensors")
    with pytest.raises(CheckpointError, match="do not fit its config.json"):
        load_tf_model(str(bad))


def test_stock_tf_save_pretrained_folders_load(tiny_tf_model, input_ids, tf_logits, tmp_path):
    for safe in (False, True):
        folder = str(tmp_path / f"stock_{safe}")
        tiny_tf_model.save_pretrained(folder, safe_serialization=safe)
        expected = "model.safetensors" if safe else "tf_model.h5"
        assert os.path.isfile(os.path.join(folder, expected))
        model = load_tf_model(folder)
        logits = model(input_ids=input_ids, training=False).logits.numpy()
        assert np.max(np.abs(logits - tf_logits)) <= 1e-5, safe


def test_interrupted_save_keeps_previous_weights(tiny_tf_model, tmp_path, monkeypatch):
    import safetensors.numpy

    folder = str(tmp_path / "model")
    save_model_folder(tiny_tf_model, folder)
    before = open(os.path.join(folder, "model.safetensors"), "rb").read()

    def half_write(state, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(safetensors.numpy, "save_file", half_write)
    with pytest.raises(KeyboardInterrupt):
        save_model_folder(tiny_tf_model, folder)
    assert open(os.path.join(folder, "model.safetensors"), "rb").read() == before
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors", "tf_model.h5"]


def test_save_replaces_stale_tf_weights(tiny_tf_model, tmp_path):
    folder = str(tmp_path / "mixed")
    tiny_tf_model.save_pretrained(folder)  # tf_model.h5
    open(os.path.join(folder, "tf_model.h5.index.json"), "w").write("{}")
    files = save_model_folder(tiny_tf_model, folder)
    assert files == ["model.safetensors", "tf_model.h5", "config.json"]
    assert not os.path.exists(os.path.join(folder, "tf_model.h5.index.json"))
    assert save_model_folder(tiny_tf_model, folder, tf_weights=False) == ["model.safetensors", "config.json"]
    assert not os.path.exists(os.path.join(folder, "tf_model.h5"))


def _pt_logits(path_or_repo_id, input_ids, **kwargs):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(path_or_repo_id, **kwargs).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(input_ids, dtype=torch.long)).logits.numpy()


def _trained_input_ids(folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    enc = tok(["The return statement leaves a function.", f"A {tok.mask_token} is a sequence of statements."],
              padding=True, return_tensors="np")
    return enc["input_ids"]


def test_stock_tf_from_pretrained_loads_output_folder(trained_model_dir):
    from transformers import TFAutoModelForMaskedLM

    assert {"model.safetensors", "tf_model.h5"} <= set(os.listdir(trained_model_dir))
    ids = _trained_input_ids(trained_model_dir)
    expected = _pt_logits(str(trained_model_dir), ids)  # PyTorch reads model.safetensors
    model = TFAutoModelForMaskedLM.from_pretrained(str(trained_model_dir), use_safetensors=False)
    assert type(model).__name__ == "TFRobertaForMaskedLM"
    logits = model(input_ids=ids, training=False).logits.numpy()
    assert logits.shape == expected.shape == (2, ids.shape[1], 500)
    assert np.max(np.abs(logits - expected)) <= 1e-4


def test_stock_tf_from_pretrained_loads_hub_repo(trained_model_dir, loopback_hub):
    from huggingface_hub import HfApi
    from transformers import TFAutoModelForMaskedLM

    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/trained-tiny")
    api.upload_folder(repo_id="alice/trained-tiny", folder_path=str(trained_model_dir),
                      ignore_patterns=["checkpoints/*", "runs/*"])
    assert {"model.safetensors", "tf_model.h5"} <= set(api.list_repo_files("alice/trained-tiny"))
    ids = _trained_input_ids(trained_model_dir)
    expected = _pt_logits("alice/trained-tiny", ids, token=loopback_hub.token)
    model = TFAutoModelForMaskedLM.from_pretrained("alice/trained-tiny", use_safetensors=False, token=loopback_hub.token)
    logits = model(input_ids=ids, training=False).logits.numpy()
    assert np.max(np.abs(logits - expected)) <= 1e-4


def test_only_one_weight_format_is_downloaded():
    assert export._weight_patterns(["config.json", "model.safetensors", "tf_model.h5", "pytorch_model.bin"]) == ["model*.safetensors"]
    assert export._weight_patterns(["config.json", "tf_model.h5", "pytorch_model.bin"]) == ["tf_model*.h5"]
    assert export._weight_patterns(["config.json", "pytorch_model.bin"]) == ["pytorch_model*.bin"]


def test_invalid_repo_id_is_a_hub_repo_error():
    with pytest.raises(HubRepoError, match="neither an existing folder nor a valid Hub repo id"):
        export._resolve_folder("bad repo!!", None, None, None)


def test_pytorch_loads_folder_with_same_logits(exported, input_ids, tf_logits):
    torch = pytest.importorskip("torch")
    from transformers import RobertaForMaskedLM

    folder, _, _ = exported
    model, info = RobertaForMaskedLM.from_pretrained(folder, output_loading_info=True)
    model.eval()
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    # The decoder is tied to the word embeddings, its bias to lm_head.bias, as PyTorch transformers expects.
    assert model.lm_head.decoder.weight.data_ptr() == model.roberta.embeddings.word_embeddings.weight.data_ptr()
    assert torch.equal(model.lm_head.decoder.bias, model.lm_head.bias)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(input_ids, dtype=torch.long)).logits.numpy()
    assert logits.shape == tf_logits.shape
    assert np.max(np.abs(logits - tf_logits)) <= 1e-4


def test_pytorch_fill_mask_pipeline_runs_on_folder(exported):
    torch = pytest.importorskip("torch")
    from transformers import pipeline

    folder, _, tok = exported
    fill = pipeline("fill-mask", model=folder, framework="pt")
    text = f"The quick brown {tok.mask_token} jumps."
    preds = fill(text, top_k=5)
    assert len(preds) == 5
    scores = [p["score"] for p in preds]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0 + 1e-6
    # The pipeline's best token is the argmax of the TF model loaded from the same folder.
    enc = tok(text, return_tensors="np")
    pos = int(np.where(enc["input_ids"][0] == tok.mask_token_id)[0][0])
    tf_model = load_tf_model(folder)
    tf_logits = tf_model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], training=False).logits.numpy()
    assert preds[0]["token"] == int(np.argmax(tf_logits[0, pos]))
    probs = torch.softmax(torch.tensor(tf_logits[0, pos]), dim=-1)
    assert abs(preds[0]["score"] - float(probs.max())) <= 1e-4


def test_load_from_hub_repo_id(exported, input_ids, tf_logits, loopback_hub):
    from huggingface_hub import HfApi

    folder, _, _ = exported
    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/tiny-roberta", private=True)
    api.upload_folder(repo_id="alice/tiny-roberta", folder_path=folder, commit_message="tiny model")
    api.upload_file(repo_id="alice/tiny-roberta", path_or_fileobj=b"not needed", path_in_repo="tf_model.h5")
    model = load_tf_model("alice/tiny-roberta", token=loopback_hub.token)
    # Downloaded from the loopback Hub (HF_ENDPOINT) into the Hub cache, with one weight format only.
    snapshot = export._resolve_folder("alice/tiny-roberta", None, None, loopback_hub.token)
    assert snapshot.startswith(os.environ["HF_HOME"])
    assert "model.safetensors" in os.listdir(snapshot) and "tf_model.h5" not in os.listdir(snapshot)
    assert "tokenizer.json" in os.listdir(snapshot)
    logits = model(input_ids=input_ids, training=False).logits.numpy()
    assert np.max(np.abs(logits - tf_logits)) <= 1e-5
    with pytest.raises(HubRepoError, match="alice/no-such-model was not found") as err:
        load_tf_model("alice/no-such-model", token=loopback_hub.token)
    assert loopback_hub.token not in str(err.value)
    with pytest.raises(HubRepoError, match="Revision 'nope'"):
        load_tf_model("alice/tiny-roberta", revision="nope", token=loopback_hub.token)
