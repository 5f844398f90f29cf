"""`--backend tensorflow` on BERT and DistilBERT (transformers 4.57's TF classes): 5 steps, export, PyTorch logits."""

import json
import string

import numpy as np
import pytest
from safetensors.numpy import load_file

WORDPIECE_VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(string.ascii_lowercase)
                   + ["##" + c for c in string.ascii_lowercase] + ["the", "and", "of", "to", "in", "is"])


def save_tiny_model(folder, model_type):
    """A tiny BERT or DistilBERT (hidden 32, 2 layers, 64 positions) with a WordPiece tokenizer, saved by transformers."""
    from transformers import (BertConfig, BertForMaskedLM, BertTokenizerFast, DistilBertConfig,
                              DistilBertForMaskedLM)

    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(WORDPIECE_VOCAB) + "\n")
    BertTokenizerFast(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(str(folder))
    vocab = len(WORDPIECE_VOCAB)
    if model_type == "bert":
        model = BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=64, max_position_embeddings=64))
    else:
        model = DistilBertForMaskedLM(DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                                       max_position_embeddings=64))
    model.save_pretrained(str(folder))
    return folder


# per architecture: a weight name of the last layer and the head's bias in the exported PyTorch state dict
EXPORTED_NAMES = {
    "bert": ("bert.encoder.layer.1.attention.self.query.weight", "cls.predictions.bias"),
    "distilbert": ("distilbert.transformer.layer.1.attention.q_lin.weight", "vocab_projector.bias"),
}


@pytest.mark.parametrize("model_type", ["bert", "distilbert"])
def test_tensorflow_backend_trains_and_exports(tmp_path, model_type):
    torch = pytest.importorskip("torch")
    import tensorflow as tf
    from transformers import AutoModelForMaskedLM

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.backends.tensorflow.export import load_tf_model
    from hf_tpu_ext.run import train

    start = save_tiny_model(tmp_path / "start", model_type)
    out = tmp_path / "out"
    train(*parse_args([
        "--backend", "tensorflow", "--model_name_or_path", str(start), "--output_dir", str(out),
        "--max_seq_length", "32", "--max_steps", "5", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--max_train_samples", "64", "--max_eval_samples", "16",
        "--learning_rate", "1e-3", "--hidden_dropout_prob", "0", "--attention_probs_dropout_prob", "0",
        "--disable_tqdm", "true"]))

    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 5
    assert np.isfinite([e["loss"] for e in state["log_history"] if "loss" in e]).all()
    layer_name, head_bias = EXPORTED_NAMES[model_type]
    exported, initial = load_file(str(out / "model.safetensors")), load_file(str(start / "model.safetensors"))
    assert exported[layer_name].shape == (32, 32) and exported[head_bias].shape == (len(WORDPIECE_VOCAB),)
    assert np.abs(exported[layer_name] - initial[layer_name]).max() > 1e-4  # trained, not the start's weights
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == model_type
    assert config["architectures"] == [{"bert": "BertForMaskedLM", "distilbert": "DistilBertForMaskedLM"}[model_type]]
    dropout_fields = {"bert": ("hidden_dropout_prob", "attention_probs_dropout_prob"),
                      "distilbert": ("dropout", "attention_dropout")}[model_type]  # the flags reach each one's fields
    assert [config[name] for name in dropout_fields] == [0.0, 0.0]

    pt, info = AutoModelForMaskedLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    ids = np.array([[2, 10, 11, 4, 12, 3, 0, 0], [2, 20, 4, 21, 22, 23, 24, 3]])
    mask = (ids != 0).astype(np.int64)
    with torch.no_grad():
        pt_logits = pt.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    tf_logits = load_tf_model(str(out))(input_ids=tf.constant(ids, tf.int32),
                                        attention_mask=tf.constant(mask, tf.int32)).logits.numpy()
    assert pt_logits.shape == (2, 8, len(WORDPIECE_VOCAB))
    assert np.abs(pt_logits - tf_logits)[mask.astype(bool)].max() <= 1e-4


def test_tensorflow_backend_trains_bert_from_scratch_with_a_wordpiece_tokenizer(tmp_path):
    from transformers import AutoTokenizer, BertTokenizerFast

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    out = tmp_path / "out"
    train(*parse_args([
        "--backend", "tensorflow", "--model_type", "bert", "--output_dir", str(out), "--vocab_size", "400",
        "--config_overrides", "num_hidden_layers=2,hidden_size=32,num_attention_heads=2,intermediate_size=64",
        "--max_seq_length", "32", "--max_steps", "5", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--max_train_samples", "64", "--max_eval_samples", "16",
        "--disable_tqdm", "true"]))
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"], config["num_hidden_layers"], config["hidden_size"]) == (
        "bert", ["BertForMaskedLM"], 2, 32)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert isinstance(tokenizer, BertTokenizerFast) and tokenizer.mask_token == "[MASK]"
    assert config["vocab_size"] == len(tokenizer) and config["pad_token_id"] == tokenizer.pad_token_id == 0
    assert tokenizer("Hello World")["input_ids"][0] == tokenizer.cls_token_id  # lower-cased WordPiece, [CLS] first
    assert tokenizer.tokenize("Hello") == tokenizer.tokenize("hello")
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["model_config"]["architectures"] == ["BertForMaskedLM"]
    card = (out / "README.md").read_text()
    assert "A BertForMaskedLM (2 layers, 32 hidden size, 2 heads" in card and "- bert\n" in card
