"""--model_type / --config_overrides / --do_lower_case: presets, tokenizers per architecture, and the refusals."""

import json

import pytest

from hf_tpu_ext.model_types import MODEL_TYPE_CHOICES as MODEL_TYPES
from hf_tpu_ext.errors import ArgumentError

TEXTS = ["The Quick brown fox jumps over the lazy dog near the Café.", "Another line of Text, with more words."] * 40


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_wordpiece_tokenizer_for_bert(tmp_path, do_lower_case):
    from transformers import AutoTokenizer, BertTokenizerFast

    from hf_tpu_ext.data.tokenizer import train_tokenizer

    train_tokenizer("bert", TEXTS, 300, 64, do_lower_case).save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert isinstance(loaded, BertTokenizerFast)
    assert loaded.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (loaded.pad_token_id, loaded.mask_token_id, loaded.cls_token_id, loaded.sep_token_id) == (0, 4, 2, 3)
    tokens = loaded.convert_ids_to_tokens(loaded("Quick Café [MASK] fox")["input_ids"])
    words = ["quick", "cafe"] if do_lower_case else ["Quick", "Café"]
    assert tokens == ["[CLS]", *words, "[MASK]", "fox", "[SEP]"]
    assert BertTokenizerFast.from_pretrained(str(tmp_path)).vocab_size == len(loaded)


def test_wordpiece_ids_follow_the_tokens_not_the_trainers_hash_order():
    """The trainer numbers equal-count tokens in hash-map order; the ids are renumbered (specials first, then
    sorted), so trainings that find one token set (two processes of a run, a rerun) agree on every id."""
    from hf_tpu_ext.data.tokenizer import train_tokenizer

    trained = train_tokenizer("bert", TEXTS, 300, 64)
    vocab = trained.get_vocab()
    ordered = sorted(vocab, key=vocab.get)
    assert ordered[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and ordered[5:] == sorted(ordered[5:])
    assert sorted(vocab.values()) == list(range(len(vocab)))
    tokens = trained.convert_ids_to_tokens(trained("Quick Café [MASK] fox")["input_ids"])
    assert tokens == ["[CLS]", "quick", "cafe", "[MASK]", "fox", "[SEP]"]


def test_modernbert_tokenizer(tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from hf_tpu_ext.data.tokenizer import train_tokenizer

    trained = train_tokenizer("modernbert", TEXTS, 300, 64)
    assert isinstance(trained, PreTrainedTokenizerFast)  # transformers 5: an alias of TokenizersBackend
    trained.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert loaded.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    encoded = loaded("The Quick fox")
    assert list(encoded) == ["input_ids", "attention_mask"]  # ModernBERT takes no token types
    assert encoded["input_ids"][0] == 1 and encoded["input_ids"][-1] == 2
    assert loaded.convert_tokens_to_string(loaded.convert_ids_to_tokens(encoded["input_ids"][1:-1])) == "The Quick fox"


def _model_args(**kw):
    from hf_tpu_ext.args import ModelArguments

    return ModelArguments(**kw)


@pytest.mark.parametrize("model_type,cls,sizes", [
    ("roberta", "RobertaConfig", dict(hidden_size=256, num_hidden_layers=3, intermediate_size=1024,
                                      max_position_embeddings=66, pad_token_id=1)),
    ("bert", "BertConfig", dict(hidden_size=256, num_hidden_layers=3, intermediate_size=1024,
                                max_position_embeddings=512, pad_token_id=0)),
    ("distilbert", "DistilBertConfig", dict(dim=256, n_layers=3, hidden_dim=1024, max_position_embeddings=512,
                                            pad_token_id=0)),
    ("modernbert", "ModernBertConfig", dict(hidden_size=256, num_hidden_layers=3, intermediate_size=512,
                                            max_position_embeddings=8192, pad_token_id=3, cls_token_id=1,
                                            sep_token_id=2, bos_token_id=1, eos_token_id=2)),
])
def test_build_config_presets_and_overrides(model_type, cls, sizes):
    from hf_tpu_ext.data.tokenizer import train_tokenizer
    from hf_tpu_ext.model_config import build_config

    tokenizer = train_tokenizer(model_type, TEXTS, 300, 64)
    layers = "n_layers" if model_type == "distilbert" else "num_hidden_layers"
    config = build_config(_model_args(model_type=model_type, config_overrides=f"{layers}=3"), tokenizer, 64)
    assert type(config).__name__ == cls and config.model_type == model_type
    assert config.vocab_size == len(tokenizer)
    assert {k: getattr(config, k) for k in sizes} == sizes


def test_config_overrides_are_typed_and_dropout_flags_map_per_architecture():
    from hf_tpu_ext.data.tokenizer import train_tokenizer
    from hf_tpu_ext.model_config import build_config

    tokenizer = train_tokenizer("distilbert", TEXTS, 300, 64)
    config = build_config(_model_args(model_type="distilbert", hidden_dropout_prob=0.0,
                                      config_overrides="sinusoidal_pos_embds=true,attention_dropout=0.25"),
                          tokenizer, 64)
    assert (config.sinusoidal_pos_embds, config.attention_dropout, config.dropout) == (True, 0.25, 0.0)
    with pytest.raises(ArgumentError) as err:
        build_config(_model_args(model_type="distilbert", config_overrides="n_layers=two"), tokenizer, 64)
    assert str(err.value).startswith("--config_overrides n_layers=two: ")


def _refusal(tmp_path, *argv):
    """The one line `hf-tpu train` refuses ``argv`` with, and that nothing was written."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    with pytest.raises(ArgumentError) as err:
        train(*parse_args(["--output_dir", str(tmp_path / "out"), *argv]))
    assert not (tmp_path / "out").exists() or not [p for p in (tmp_path / "out").iterdir()
                                                   if p.name != ".hf-tpu-train.lock"]
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from test_tf_architectures import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "bert", "bert")


def test_model_type_no_backend_here_trains(tmp_path):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.backends import trained_model_types
    from hf_tpu_ext.run.checks import check_model_type

    (tmp_path / "deberta").mkdir()
    (tmp_path / "deberta" / "config.json").write_text(json.dumps({"model_type": "deberta-v2", "vocab_size": 128}))
    line = _refusal(tmp_path, "--backend", "tensorflow", "--model_name_or_path", str(tmp_path / "deberta"))
    assert line == (f"--model_name_or_path {tmp_path / 'deberta'} is a 'deberta-v2' model: the TensorFlow backend does "
                    "not train 'deberta-v2' models (it trains roberta, xlm-roberta, camembert, bert, distilbert); pass "
                    "--backend torch_xla (any AutoModelForMaskedLM).")
    # the check itself imports no framework: the same refusal for --backend keras where Keras is not installed
    model_args, _, training_args = parse_args(["--output_dir", str(tmp_path / "o"), "--backend", "keras",
                                               "--model_name_or_path", str(tmp_path / "deberta")])
    with pytest.raises(ArgumentError) as err:
        check_model_type(model_args, training_args)
    keras_types = ", ".join(trained_model_types("keras"))  # the records name the backends training them
    assert keras_types.startswith("roberta, xlm-roberta, camembert")
    assert str(err.value).endswith(f": --backend keras does not train 'deberta-v2' models (it trains {keras_types}); "
                                   "pass --backend torch_xla (any AutoModelForMaskedLM).")


def test_tensorflow_refuses_modernbert_naming_keras(tmp_path):
    line = _refusal(tmp_path, "--backend", "tensorflow", "--model_type", "modernbert")
    assert line == ("--model_type modernbert: the TensorFlow backend does not train 'modernbert' models (it trains "
                    "roberta, xlm-roberta, camembert, bert, distilbert); pass --backend keras or --backend torch_xla "
                    "(any AutoModelForMaskedLM).")


def test_max_seq_length_over_the_position_table(tmp_path):
    line = _refusal(tmp_path, "--backend", "tensorflow", "--model_type", "bert", "--max_seq_length", "600")
    assert line == ("--max_seq_length 600 is longer than a bert model with max_position_embeddings=512 takes (512 "
                    "tokens): pass --max_seq_length 512 or less, or --config_overrides max_position_embeddings=600.")


def test_unknown_config_override(tmp_path):
    line = _refusal(tmp_path, "--backend", "tensorflow", "--model_type", "bert", "--config_overrides",
                    "num_hidden_layers=2,hidden_sise=64")
    assert line == "--config_overrides: a bert config has no field 'hidden_sise'; did you mean 'hidden_size'?"


def test_config_override_contradicting_the_pretrained_model(tmp_path, tiny_bert):
    line = _refusal(tmp_path, "--backend", "tensorflow", "--model_name_or_path", str(tiny_bert),
                    "--max_seq_length", "32", "--config_overrides", "hidden_dropout_prob=0.2,num_hidden_layers=4")
    assert line == (f"--config_overrides num_hidden_layers=4 contradicts --model_name_or_path {tiny_bert} "
                    "(num_hidden_layers=2): a pretrained model's size and wiring are its weights'. Drop it, or drop "
                    "--model_name_or_path to train from scratch (--model_type with --config_overrides).")


def test_tokenizer_larger_than_the_embeddings(tmp_path, tiny_bert):
    from test_tf_architectures import WORDPIECE_VOCAB

    from hf_tpu_ext.data.tokenizer import train_tokenizer

    big = train_tokenizer("bert", TEXTS, 300, 64)
    big.save_pretrained(str(tmp_path / "big"))
    line = _refusal(tmp_path, "--backend", "tensorflow", "--model_name_or_path", str(tiny_bert),
                    "--tokenizer_name", str(tmp_path / "big"), "--max_seq_length", "32")
    rows = len(WORDPIECE_VOCAB)
    assert line == (f"--tokenizer_name {tmp_path / 'big'} has {len(big)} tokens but --model_name_or_path {tiny_bert} "
                    f"has {rows} embedding rows (vocab_size): ids past {rows - 1} have no embedding. Use the model's "
                    "own tokenizer (drop --tokenizer_name).")


def test_model_type_choices_in_the_parser():
    from hf_tpu_ext.args import parse_args

    line = ("--model_type 'electra' is not one this package trains from scratch (choose from: roberta, bert, "
            "distilbert, modernbert, eurobert); a pretrained 'electra' model trains with --model_name_or_path <its "
            "folder or repo> --backend torch_xla (any AutoModelForMaskedLM).")
    with pytest.raises(ArgumentError) as err:  # not argparse's bare "invalid choice"
        parse_args(["--output_dir", "x", "--model_type", "electra"])
    assert str(err.value) == line
    with pytest.raises(ArgumentError) as err:
        _model_args(model_type="electra")
    assert str(err.value) == line
    with pytest.raises(ArgumentError) as err:
        _model_args(model_type="robert")
    assert str(err.value) == ("--model_type 'robert' is not one this package trains from scratch; did you mean "
                              "'roberta'? (choose from: roberta, bert, distilbert, modernbert, eurobert).")


@pytest.mark.parametrize("model_type,start", [("bert", "google-bert/bert-base-uncased"),
                                              ("distilbert", "distilbert/distilbert-base-uncased"),
                                              ("modernbert", None)])
def test_card_names_the_architecture_and_base_model(tmp_path, model_type, start):
    from transformers import AutoConfig

    from hf_tpu_ext.hub.model_card import initialization_fields, render_model_card
    from hf_tpu_ext.model_config import model_summary_fields
    from hf_tpu_ext.model_types import record_for

    config = AutoConfig.for_model(model_type, **{**record_for(model_type).small_preset, "vocab_size": 300})
    summary = {**model_summary_fields(config, 1234), **initialization_fields(start), "mask_token": "[MASK]",
               "eval_results": {"eval_loss": 2.5}}
    assert summary["model_config"]["intermediate_size"] == {"modernbert": 512}.get(model_type, 1024)
    card = render_model_card(str(tmp_path), repo_id="alice/x", summary=summary)
    cls = {"bert": "BertForMaskedLM", "distilbert": "DistilBertForMaskedLM", "modernbert": "ModernBertForMaskedLM"}
    assert (f"A {cls[model_type]} (4 layers, 256 hidden size, 4 heads, a 300-token vocabulary, 1,234 parameters) for "
            "the fill-mask task.") in str(card)
    assert model_type in card.data.tags
    assert card.data.base_model == start  # the Hub's model tree; None from scratch


def test_numpy_masking_uses_the_wordpiece_ids():
    import numpy as np

    from hf_tpu_ext.data.numpy_batches import NumpyMasker
    from hf_tpu_ext.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer("bert", TEXTS, 300, 64)
    masker = NumpyMasker.for_tokenizer(tokenizer, max_predictions=6)
    rows = [tokenizer(t)["input_ids"][:14] for t in TEXTS[:4]]
    ids = np.array([r + [tokenizer.pad_token_id] * (16 - len(r)) for r in rows])
    batch = masker(ids, seed=(0, 1))
    chosen = np.take_along_axis(ids, batch["masked_lm_positions"], axis=1)[batch["masked_lm_weights"] > 0]
    assert not np.isin(chosen, [0, 1, 2, 3, 4]).any()  # never [PAD] [UNK] [CLS] [SEP] [MASK]
    assert (batch["input_ids"] == 4).sum() > 0 and set(np.unique(batch["input_ids"][ids == 2])) == {2}
    assert (batch["attention_mask"] == (ids != 0)).all()


def test_pytorch_model_bin_only_without_torch(tmp_path, monkeypatch):
    import importlib.util

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run.checks import check_weight_files

    folder = tmp_path / "bin-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (folder / "pytorch_model.bin").write_bytes(b"\0")
    model_args, _, training_args = parse_args(["--output_dir", str(tmp_path / "o"), "--backend", "tensorflow",
                                               "--model_name_or_path", str(folder)])
    check_weight_files(model_args, training_args)  # torch installed: it reads them
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name, *a))
    with pytest.raises(ArgumentError) as err:
        check_weight_files(model_args, training_args)
    assert str(err.value) == (
        f"--model_name_or_path {folder} has its weights in pytorch_model.bin only, which needs torch to read (not "
        "installed): pip install torch (the CPU build is enough), or convert it once to model.safetensors with "
        "transformers (AutoModelForMaskedLM.from_pretrained(path).save_pretrained(folder)) and pass that folder.")
    (folder / "model.safetensors").write_bytes(b"\0")
    check_weight_files(model_args, training_args)  # safetensors beside it: read without torch


def test_a_vocab_size_override_is_kept_when_it_holds_the_tokenizer_and_refused_below_it():
    from hf_tpu_ext.data.tokenizer import train_tokenizer
    from hf_tpu_ext.model_config import build_config

    tokenizer = train_tokenizer("bert", TEXTS, 300, 64)
    config = build_config(_model_args(model_type="bert", config_overrides=f"vocab_size={len(tokenizer) + 50}"),
                          tokenizer, 64)
    assert config.vocab_size == len(tokenizer) + 50  # spare rows, as BERT's [unused] ones
    with pytest.raises(ArgumentError) as err:
        build_config(_model_args(model_type="bert", config_overrides="vocab_size=50"), tokenizer, 64)
    assert str(err.value) == (f"--config_overrides vocab_size=50 gives fewer embedding rows than the tokenizer's "
                              f"{len(tokenizer)} tokens: drop it (the model gets one row per token) or give "
                              f"{len(tokenizer)} or more.")


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_same_training_gives_a_byte_identical_tokenizer(tmp_path, model_type):
    """Issue 48: 4 runs of one ``--model_type bert`` command on the embedded corpus trained 4 different tokenizers
    (~7 of 2,000 WordPiece tokens): the trainer numbered the ``##`` symbols in hash-map order, which broke ties of
    equal-count merges. Each training seeds its hash maps anew (3 of 5 differed in one process before the fix), so
    5 trainings here stand for 5 runs; the copy a second process of a run loads (process 0 trains, the others read
    its files: :func:`hf_tpu_ext.distributed.from_main_process`) saves the same bytes."""
    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import tokenizer_from_text, tokenizer_to_text, train_tokenizer

    texts = default_corpus_texts()
    saved = set()
    for i in range(5):
        trained = train_tokenizer(model_type, texts, 2000, 64)
        trained.save_pretrained(str(tmp_path / str(i)))
        saved.add((tmp_path / str(i) / "tokenizer.json").read_bytes())
    assert len(trained) == 2000 and len(saved) == 1
    tokenizer_from_text(tokenizer_to_text(trained)).save_pretrained(str(tmp_path / "process1"))
    assert (tmp_path / "process1" / "tokenizer.json").read_bytes() in saved


def test_a_wordpiece_alphabet_past_its_limit_keeps_the_same_characters():
    """1,236 characters, each as frequent as the others: the trainer's cut to 1,000 kept 5 different alphabets in 5
    trainings; the cut made here (most frequent first, ties by code point) keeps one."""
    from hf_tpu_ext.data.tokenizer import ALPHABET_LIMIT, train_tokenizer

    chars = [c for c in map(chr, [*range(0x400, 0x500), *range(0x3041, 0x3091), *range(0x4E00, 0x5184)])
             if c.isprintable()]
    assert len(chars) == 1236
    words = ["".join(chars[i:i + 4]) for i in range(0, len(chars), 4)]
    texts = [" ".join(words)] * 3 + ["the quick brown fox"] * 50  # its 15 letters: 50 times more frequent
    vocabs = {frozenset(train_tokenizer("bert", texts, 1500, 64, False).get_vocab()) for _ in range(3)}
    assert len(vocabs) == 1
    alphabet = {t for t in next(iter(vocabs)) if len(t) == 1}
    assert len(alphabet) == ALPHABET_LIMIT and set("thequickbrownfx") <= alphabet
    assert alphabet - set("thequickbrownfx") == set(sorted(chars)[:ALPHABET_LIMIT - 15])
