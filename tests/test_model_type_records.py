"""The model-type records (``hf_tpu_ext/model_types/``): one record per ``--model_type``, each read by the CLI, the
config builder, the tokenizer trainer, the FLOP count and every backend; and the rule that keeps them the one
place: no product module outside ``model_types/`` and ``backends/keras/architectures/`` names an architecture in
code (a string literal equal to a record's ``model_type``; docstrings, comments and messages' prose are free).

Framework-free: the Keras registry's rows are strings (``"module:ARCHITECTURE"``), read without importing Keras.
"""

import ast
import dataclasses
import os

import pytest

from hf_tpu_ext import model_types
from hf_tpu_ext.errors import ArgumentError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "hf_tpu_ext")
#: folders whose modules may name architectures: the records and the Keras backend's architecture modules
NAMING_ALLOWED = (os.path.join("hf_tpu_ext", "model_types"), os.path.join("hf_tpu_ext", "backends", "keras",
                                                                          "architectures"))


def _every_model_type():
    return {t for record in model_types.RECORDS for t in (*record.model_types, *record.same_positions)}


def test_every_cli_model_type_has_one_record():
    from hf_tpu_ext.args import ModelArguments, parse_args

    field = next(f for f in dataclasses.fields(ModelArguments) if f.name == "model_type")
    # no argparse choices (a near miss gets "did you mean"): the help lists the records' names
    assert "choices" not in field.metadata
    assert list(model_types.MODEL_TYPE_CHOICES) == [r.name for r in model_types.RECORDS]
    assert ", ".join(model_types.MODEL_TYPE_CHOICES) in field.metadata["help"]
    assert field.default == model_types.DEFAULT_MODEL_TYPE == "roberta"
    held = [t for record in model_types.RECORDS for t in record.model_types]
    assert len(held) == len(set(held))  # a transformers model_type belongs to one record
    for name in model_types.MODEL_TYPE_CHOICES:
        model_args, _, _ = parse_args(["--output_dir", "out", "--model_type", name])
        assert model_args.model_type == name and model_types.record_for(name).name == name


def test_record_for_refuses_an_unknown_type_in_one_line():
    assert model_types.record_for("xlm-roberta") is model_types.record_for("roberta")
    assert model_types.record_for(None).name == "roberta"
    with pytest.raises(ArgumentError) as err:
        model_types.record_for("Bert")
    assert str(err.value) == ("model_type 'Bert' has no record: known are roberta, xlm-roberta, camembert, bert, "
                              "distilbert, modernbert, eurobert. Did you mean 'bert'?")
    assert model_types.find_record("electra") is None and model_types.masked_lm_class("electra") is None


def test_every_record_has_one_keras_module_or_says_keras_does_not_train_it():
    from hf_tpu_ext.backends.keras.architectures import ARCHITECTURES  # no Keras import: the rows are strings

    for record in model_types.RECORDS:
        targets = {ARCHITECTURES.get(t) for t in record.model_types}
        if "keras" not in record.backends:  # stated: "not on this backend"
            assert targets == {None}, record.name
            continue
        module = f"hf_tpu_ext.backends.keras.architectures.{record.name}"
        assert targets == {f"{module}:ARCHITECTURE"}, record.name  # one module for the whole family
        assert os.path.isfile(os.path.join(ROOT, *module.split(".")) + ".py")
    assert tuple(ARCHITECTURES) == model_types.trained_by("keras")  # no row without a record


def test_backends_read_the_records():
    from hf_tpu_ext.backends import BACKEND_REGISTRY, trained_model_types

    assert tuple(BACKEND_REGISTRY) == model_types.BACKENDS  # the one list of names, one entry each
    assert trained_model_types("tensorflow") == ("roberta", "xlm-roberta", "camembert", "bert", "distilbert")
    assert trained_model_types("keras") == ("roberta", "xlm-roberta", "camembert", "bert", "distilbert",
                                            "modernbert", "eurobert")
    assert trained_model_types("torch_xla") is None  # any AutoModelForMaskedLM


@pytest.mark.parametrize("name", model_types.MODEL_TYPE_CHOICES)
def test_each_preset_builds_and_the_records_rules_read_it(name):
    import transformers
    from transformers import AutoConfig

    if name == "eurobert" and not hasattr(transformers, "EuroBertConfig"):
        pytest.skip("transformers has no EuroBERT (5.x has it)")
    record = model_types.record_for(name)
    config = AutoConfig.for_model(name, **{**record.small_preset, "vocab_size": 300, "pad_token_id": 1,
                                           "max_position_embeddings": 130})
    assert config.model_type == name and type(config).__name__.endswith("Config")
    sizes = [getattr(config, record.fields(flag)[0]) for flag in model_types.SIZE_OVERRIDES]
    assert sizes == [256, 4, 4, {"modernbert": 512}.get(name, 1024)]
    assert model_types.max_sequence_length(config) == {"roberta": 128}.get(name, 130)
    # 6 N + attention + head at a quarter of the positions; GeGLU (modernbert) and SwiGLU (eurobert) count 3 h i
    # per layer; EuroBERT's head is lm_head alone (no dense transform)
    ffn = 3 if name in ("modernbert", "eurobert") else 2
    parameters = 4 * (4 * 256 * 256 + ffn * 256 * sizes[3])
    attention = 12 * 256 * 4 * 64  # every layer sees all 64 keys (ModernBERT's local window holds 129)
    head = 6 * ((256 * 256 if name != "eurobert" else 0) + 256 * 300) * 0.25
    assert model_types.flops_per_token(config, 64, 0.25) == pytest.approx(6 * parameters + attention + head)


def test_every_tokenizer_kind_has_one_trainer():
    from hf_tpu_ext.data.tokenizer import TRAINERS

    assert set(TRAINERS) == set(model_types.TOKENIZER_KINDS)
    assert {r.tokenizer_kind for r in model_types.RECORDS} <= set(TRAINERS)


def test_a_record_refuses_fields_outside_the_tables():
    roberta = model_types.record_for("roberta")
    with pytest.raises(ValueError, match="tokenizer_kind 'sentencepiece' is not one of"):
        dataclasses.replace(roberta, tokenizer_kind="sentencepiece")
    with pytest.raises(ValueError, match="must start with 'roberta'"):
        dataclasses.replace(roberta, masked_lm_classes={"xlm-roberta": "XLMRobertaForMaskedLM"})
    with pytest.raises(ValueError, match="outside"):
        dataclasses.replace(roberta, backends=("jax",))


def _docstrings(tree):
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def architecture_names_in_code(source: str, names) -> list:
    """``"line N: 'name'"`` for each string literal of ``source`` (not a docstring) equal, ignoring case, to one of
    ``names``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [f"line {n.lineno}: {n.value!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and n.value.lower() in names]


def test_the_name_check_finds_a_literal_and_spares_prose():
    source = ('"""A roberta module."""\n# bert\nx = "BERT"\nif t in ("distilbert", "other"):\n    pass\n'
              'message = "train a bert model"\n')
    assert architecture_names_in_code(source, {"bert", "distilbert"}) == ["line 3: 'BERT'", "line 4: 'distilbert'"]


def test_no_product_module_outside_the_records_names_an_architecture():
    names = _every_model_type()
    found = []
    for folder, _, files in os.walk(PACKAGE):
        rel = os.path.relpath(folder, ROOT)
        if rel.startswith(NAMING_ALLOWED):
            continue
        for name in sorted(f for f in files if f.endswith(".py")):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                found += [f"{os.path.join(rel, name)} {hit}" for hit in architecture_names_in_code(f.read(), names)]
    assert found == []


def test_a_flag_without_a_field_is_refused_not_ignored():
    """EuroBERT has no hidden dropout: ``--hidden_dropout_prob`` would change nothing, so it is refused in one line
    (from scratch and with a pretrained model); ``--attention_probs_dropout_prob`` sets ``attention_dropout``."""
    from types import SimpleNamespace

    from hf_tpu_ext.model_config import dropout_overrides, set_fields

    with pytest.raises(ArgumentError) as err:
        set_fields("eurobert", "hidden_dropout_prob")
    assert str(err.value) == ("--hidden_dropout_prob changes nothing in a eurobert model (its config has no such "
                              "field); drop the flag.")
    args = SimpleNamespace(hidden_dropout_prob=None, attention_probs_dropout_prob=0.2, config_overrides=None)
    assert dropout_overrides(args, "eurobert") == {"attention_dropout": 0.2}
    with pytest.raises(ArgumentError, match="--hidden_dropout_prob changes nothing"):
        dropout_overrides(SimpleNamespace(**{**vars(args), "hidden_dropout_prob": 0.1}), "eurobert")


def test_a_model_type_the_installed_transformers_lacks_is_one_line():
    """``--model_type eurobert`` under transformers 4.57 (no EuroBERT): one line naming the version, not
    ``AutoConfig``'s list of every model type."""
    import transformers

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.model_config import scratch_config

    model_args, _, _ = parse_args(["--output_dir", "out", "--model_type", "eurobert"])
    if hasattr(transformers, "EuroBertConfig"):
        assert scratch_config(model_args).num_key_value_heads == 4  # the record's preset
        return
    with pytest.raises(ArgumentError) as err:
        scratch_config(model_args)
    assert str(err.value) == (f"--model_type eurobert: transformers {transformers.__version__} has no eurobert config; "
                              "install a transformers release that has it (pip install -U transformers).")
