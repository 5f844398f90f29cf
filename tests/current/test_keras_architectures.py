"""The Keras backend's architecture registry: model building, import, export and FLOPs go through
``config.model_type``, so a new architecture is its record, one module and registry rows.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import dataclasses
import json
import logging
import os

import numpy as np
import pytest

pytest.importorskip("jax")
transformers = pytest.importorskip("transformers")

from hf_tpu_ext import model_types  # noqa: E402
from hf_tpu_ext.backends.keras import architectures, hf_convert  # noqa: E402
from hf_tpu_ext.backends.keras.architectures import roberta  # noqa: E402
from hf_tpu_ext.backends.keras.export import KERAS_PRESET_DIR, export_masked_lm  # noqa: E402
from hf_tpu_ext.backends.keras.model import build_masked_lm  # noqa: E402
from hf_tpu_ext.errors import ArgumentError, CheckpointError  # noqa: E402

SIZES = dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=34, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1)


class ToyConfig(transformers.RobertaConfig):
    """A model_type transformers does not know: the registry, not a name check, decides what the backend trains."""

    model_type = "toy-roberta"


#: the "new architecture": RoBERTa's layers and table under another model_type and transformers class -- its
#: record (model_types/), its Keras module (here RoBERTa's, renamed) and a registry row
TOY_RECORD = dataclasses.replace(model_types.record_for("roberta"), name="toy-roberta",
                                 masked_lm_classes={"toy-roberta": "ToyForMaskedLM"}, same_positions=())
TOY = dataclasses.replace(roberta.ARCHITECTURE, name="toy-roberta", keras_hub=None)  # keras-hub has no such model


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(model_types._BY_MODEL_TYPE, "toy-roberta", TOY_RECORD)
    monkeypatch.setitem(architectures.ARCHITECTURES, "toy-roberta", f"{__name__}:TOY")
    transformers.AutoConfig.register("toy-roberta", ToyConfig, exist_ok=True)
    yield


def test_registry_rows_name_transformers_classes():
    assert architectures.supported_model_types()[:3] == ("roberta", "xlm-roberta", "camembert")
    for model_type, cls in (("roberta", "RobertaForMaskedLM"), ("xlm-roberta", "XLMRobertaForMaskedLM"),
                            ("camembert", "CamembertForMaskedLM")):
        arch = architectures.get_architecture(model_type)
        assert arch is roberta.ARCHITECTURE and model_types.masked_lm_class(model_type) == cls
        assert hasattr(transformers, cls)  # a class transformers really has (config.json names it)
    assert model_types.record_for("roberta").tokenizer_kind == "byte_level_bpe"
    assert model_types.record_for("roberta").small_preset["hidden_size"] == 256


def test_unknown_model_type_is_refused_naming_the_supported_ones():
    electra = transformers.ElectraConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                         intermediate_size=64)
    supported = ", ".join(architectures.supported_model_types())
    with pytest.raises(ArgumentError) as err:
        build_masked_lm(electra)
    assert str(err.value) == (f"--backend keras trains model_type {supported}; this model's model_type is "
                              "'electra'. Use --backend torch_xla for other masked LMs (any AutoModelForMaskedLM).")
    with pytest.raises(CheckpointError, match="model_type is 'electra'"):
        hf_convert.check_config(electra)


def test_roberta_flops_and_positions():
    config = transformers.RobertaConfig(**SIZES)
    # 6 * 2 * (4 * 32^2 + 2 * 32 * 64) + 12 * 2 * 32 * 32 + 6 * (32^2 + 32 * 300) * 0.25
    assert model_types.flops_per_token(config, 32, 0.25) == 98304 + 24576 + 15936
    assert model_types.max_sequence_length(config) == 32  # 34 rows - (pad 1 + 1) reserved


def test_a_new_architecture_needs_only_its_record_module_and_registry_rows(toy_registered, tmp_path, caplog):
    config = ToyConfig(**SIZES)
    model = build_masked_lm(config, seed=0)
    assert model.config is config and model.embeddings.max_position_embeddings == 32

    with caplog.at_level(logging.INFO, logger="hf_tpu_ext.backends.keras.export"):
        files = export_masked_lm(model, str(tmp_path / "a"))
        export_masked_lm(model, str(tmp_path / "b"))
    assert sorted(files) == ["config.json", "model.safetensors"]
    assert not os.path.exists(tmp_path / "a" / KERAS_PRESET_DIR)  # keras-hub has no such architecture
    skipped = [r.getMessage() for r in caplog.records if "keras_hub/ preset" in r.getMessage()]
    assert skipped == ["No keras_hub/ preset for model_type 'toy-roberta': keras-hub has no such masked LM (it has "
                       "RobertaMaskedLM, BertMaskedLM, DistilBertMaskedLM); the transformers files are "
                       "complete."]  # once for two exports
    written = json.loads((tmp_path / "a" / "config.json").read_text())
    assert written["model_type"] == "toy-roberta" and written["architectures"] == ["ToyForMaskedLM"]

    loaded, loaded_config = hf_convert.load_masked_lm(str(tmp_path / "a"))  # import: the registry's assign
    assert isinstance(loaded_config, ToyConfig)
    for a, b in zip(model.weights, loaded.weights):
        assert a.path == b.path and np.array_equal(np.asarray(a.value), np.asarray(b.value)), a.path


def test_roberta_is_the_shared_encoder_and_reads_its_old_paths(monkeypatch):
    from hf_tpu_ext.backends.keras.architectures import attention, encoder
    from hf_tpu_ext.backends.keras.architectures.name_table import renamed_paths

    config = transformers.RobertaConfig(**SIZES)
    model = build_masked_lm(config, seed=0)
    assert type(model) is encoder.EncoderMaskedLM and model.name == "roberta_masked_lm"
    block = model.encoder_layers[0]
    assert type(block.attention) is encoder.SelfAttention
    assert model.embeddings.token_type_embeddings is None  # folded into the positions (module doc)
    paths = [w.path for w in model.weights]
    assert paths[:4] == ["embeddings/position_embeddings", "embeddings/word_embeddings/embeddings",
                         "embeddings/layer_norm/gamma", "embeddings/layer_norm/beta"]
    assert paths[-5:] == ["mlm_head/bias", "mlm_head/dense/kernel", "mlm_head/dense/bias",
                          "mlm_head/layer_norm/gamma", "mlm_head/layer_norm/beta"]
    assert len(paths) == 4 + 2 * 16 + 5
    # the paths (checkpoint keys) RoBERTa's own layers wrote before, in the same order (optimizer slots)
    old = ["roberta_backbone/position_embeddings", "roberta_backbone/token_embedding/embeddings",
           "roberta_backbone/embeddings_layer_norm/gamma", "roberta_backbone/embeddings_layer_norm/beta"]
    old += [f"roberta_backbone/transformer_layer_{i}/{part}" for i in range(2) for part in (
        *(f"self_attention/{p}/{k}" for p in ("query", "key", "value", "attention_output") for k in ("kernel", "bias")),
        "self_attention_layer_norm/gamma", "self_attention_layer_norm/beta",
        "feedforward_intermediate_dense/kernel", "feedforward_intermediate_dense/bias",
        "feedforward_output_dense/kernel", "feedforward_output_dense/bias",
        "feedforward_layer_norm/gamma", "feedforward_layer_norm/beta")]
    old += paths[-5:]
    assert list(renamed_paths(dict.fromkeys(old), model.legacy_paths)) == paths
    assert list(renamed_paths(dict.fromkeys(paths), model.legacy_paths)) == paths  # today's paths stay
    # independently initialized projections (a shared Keras initializer instance would make them equal)
    kernels = [np.asarray(getattr(block.attention, n).kernel) for n in ("query", "key", "value")]
    assert not np.array_equal(kernels[0], kernels[1]) and not np.array_equal(kernels[1], kernels[2])
    assert 0.01 < float(np.std(kernels[0])) < 0.02  # truncated normal, stddev 0.02
    # every attention call goes through attend (one implementation for every architecture)
    calls = []
    original = encoder.attend

    def counting(*args, **kwargs):
        calls.append(tuple(args[0].shape))
        return original(*args, **kwargs)

    monkeypatch.setattr(encoder, "attend", counting)
    batch = {"token_ids": np.full((2, 8), 5, "int32"), "padding_mask": np.ones((2, 8), "int32"),
             "mask_positions": np.zeros((2, 1), "int32")}
    assert tuple(model(batch).shape) == (2, 1, 300)
    assert calls == [(2, 8, 4, 8)] * 2
    assert attention.attend is original


def test_a_continued_robertas_token_types_and_epsilon_are_said_once(caplog, monkeypatch):
    """transformers' RobertaConfig defaults to 2 token types and a user's checkpoint may have another epsilon: the
    import folds row 0 of the token types into the positions (outputs for token type 0 unchanged) and says so, and
    the epsilon warning comes once per process, not once per model build."""
    monkeypatch.setattr(roberta, "_SAID", set())
    config = transformers.RobertaConfig(**{**SIZES, "type_vocab_size": 2, "layer_norm_eps": 1e-12})
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    state = {k: v.numpy() for k, v in transformers.RobertaForMaskedLM(config).state_dict().items()}
    with caplog.at_level(logging.INFO, logger="hf_tpu_ext"):
        for _ in range(2):
            hf_convert.masked_lm_from_state_dict(state, config)
    said = [r.getMessage() for r in caplog.records]
    assert said.count("layer_norm_eps is 1e-12 in the config; the Keras backend's RoBERTa uses 1e-05 (outputs differ "
                      "slightly).") == 1
    assert said.count("the checkpoint's 2 token-type embeddings: row 0, which every input uses, is added into the "
                      "position embeddings (the same outputs); the export has type_vocab_size 1.") == 1
