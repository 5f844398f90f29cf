"""``hf-tpu train --model_type {modernbert,bert}`` from scratch on the Keras backend: the tokenizer trained for the
architecture, ``--config_overrides`` (ModernBERT: an odd layer count, a window shorter than the blocks), the export
loaded by transformers and answering ``pipeline("fill-mask")`` (bert: and its keras-hub preset's tokenizer giving
the trained WordPiece's ids).

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_keras_model_type.py``.
"""

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)


def test_modernbert_from_scratch(tmp_path):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    out = tmp_path / "out"
    train(*parse_args([
        "--backend", "keras", "--model_type", "modernbert", "--output_dir", str(out), "--vocab_size", "500",
        "--config_overrides", "hidden_size=64,num_hidden_layers=3,num_attention_heads=2,intermediate_size=96,"
                              "local_attention=16,global_attn_every_n_layers=2",
        "--max_seq_length", "32", "--max_steps", "3", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--max_train_samples", "64", "--max_eval_samples", "16",
        "--disable_tqdm", "true"]))
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("modernbert", ["ModernBertForMaskedLM"])
    assert (config["num_hidden_layers"], config["hidden_size"], config["local_attention"]) == (3, 64, 16)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    assert (config["pad_token_id"], config["cls_token_id"], config["sep_token_id"]) == (3, 1, 2)
    assert config["vocab_size"] == len(tokenizer)
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    answers = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")(
        "The module defines a [MASK].")
    assert len(answers) == 5 and all(0.0 <= a["score"] <= 1.0 for a in answers)
    card = (out / "README.md").read_text()
    assert "A ModernBertForMaskedLM (3 layers, 64 hidden size, 2 heads, a 500-token vocabulary" in card



def test_eurobert_from_scratch_with_a_llama_style_tokenizer(tmp_path):
    """``--model_type eurobert``: the Llama-3-style tokenizer (ids 0..3 ``<|begin_of_text|> <|end_of_text|>
    <|mask|> <|pad|>``, its ids in the config), grouped-query attention from ``--config_overrides``, the untied head
    exported as ``lm_head.weight``, loaded by transformers and answering ``<|mask|>``."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    out = tmp_path / "out"
    train(*parse_args([
        "--backend", "keras", "--model_type", "eurobert", "--output_dir", str(out), "--vocab_size", "500",
        "--config_overrides", "hidden_size=64,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,"
                              "intermediate_size=96",
        "--max_seq_length", "32", "--max_steps", "3", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--max_train_samples", "64", "--max_eval_samples", "16",
        "--disable_tqdm", "true"]))
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("eurobert", ["EuroBertForMaskedLM"])
    assert (config["num_key_value_heads"], config["tie_word_embeddings"]) == (2, False)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>",
                                                             "<|pad|>"]
    ids = [config[k] for k in ("bos_token_id", "eos_token_id", "mask_token_id", "pad_token_id")]
    assert ids == [0, 1, 2, 3] and config["vocab_size"] == len(tokenizer)
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    answers = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")(
        "The module defines a <|mask|>.")
    assert len(answers) == 5 and all(0.0 <= a["score"] <= 1.0 for a in answers)

def test_bert_from_scratch_with_a_wordpiece_tokenizer(tmp_path):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    out = tmp_path / "out"
    train(*parse_args([
        "--backend", "keras", "--model_type", "bert", "--output_dir", str(out), "--vocab_size", "500",
        "--config_overrides", "hidden_size=64,num_hidden_layers=2,num_attention_heads=2,intermediate_size=128",
        "--max_seq_length", "32", "--max_steps", "3", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--max_train_samples", "64", "--max_eval_samples", "16",
        "--disable_tqdm", "true"]))
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"], config["num_hidden_layers"]) == (
        "bert", ["BertForMaskedLM"], 2)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tokenizer.tokenize("Module") == tokenizer.tokenize("module")  # --do_lower_case's default
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    answers = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")(
        "the module defines a [MASK].")
    assert len(answers) == 5 and all(0.0 <= a["score"] <= 1.0 for a in answers)
    keras_hub = pytest.importorskip("keras_hub")
    # the keras_hub/ preset's tokenizer is the trained WordPiece: the same ids, accents stripped with lower-casing
    preset = keras_hub.models.BertTokenizer.from_preset(str(out / "keras_hub"))
    sentence = "The Module's défines, a RIVER-bank [MASK] 42."
    ours, theirs = [int(i) for i in preset(sentence)], tokenizer(sentence, add_special_tokens=False)["input_ids"]
    assert ours == theirs, (tokenizer.convert_ids_to_tokens(ours), tokenizer.convert_ids_to_tokens(theirs))
