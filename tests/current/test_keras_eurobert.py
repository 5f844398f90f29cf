"""The Keras backend's EuroBERT (``architectures/eurobert.py``) against transformers 5's ``EuroBertForMaskedLM``.

Tiny models (tests/eurobert_support.py: grouped-query attention with an untied head, and one KV head per query head
with every bias and the head tied): transformers -> Keras -> transformers give the same logits at real tokens of a
right-padded batch (float32, max abs difference <= 1e-4); a folder the export writes loads with
``AutoModelForMaskedLM``; every variable gets a finite non-zero gradient; bfloat16 stays close; FLOPs as documented.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_keras_eurobert.py``.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
jax = pytest.importorskip("jax")
if not hasattr(transformers, "EuroBertForMaskedLM"):
    pytest.skip("transformers has no EuroBERT (5.x has it)", allow_module_level=True)

from eurobert_support import TIED_WITH_BIASES, random_torch_model, saved_state, tiny_config  # noqa: E402
from hf_tpu_ext import model_types  # noqa: E402
from hf_tpu_ext.backends.keras.architectures import get_architecture  # noqa: E402
from hf_tpu_ext.errors import CheckpointError  # noqa: E402
from modernbert_support import keras_logits, padded_batch, torch_logits  # noqa: E402

TOLERANCE = 1e-4  # float32, max abs difference of logits (their magnitude is ~1-10 here)
ARCH = get_architecture("eurobert")
RECORD = model_types.record_for("eurobert")


@pytest.fixture(scope="module", params=["gqa_untied", "tied_with_biases"])
def pair(request):
    """(config, transformers model, its saved state, the Keras model holding it, the batch)."""
    config = tiny_config(**(TIED_WITH_BIASES if request.param == "tied_with_biases" else {}))
    reference = random_torch_model(config)
    state = saved_state(reference)
    model = ARCH.build(config, "float32")
    ARCH.assign(model, state, config)
    return config, reference, state, model, padded_batch()


def test_record_and_registry_row():
    assert ARCH.name == RECORD.name == "eurobert" and RECORD.model_types == ("eurobert",)
    assert RECORD.masked_lm_classes == {"eurobert": "EuroBertForMaskedLM"} and RECORD.tokenizer_kind == "llama_bpe"
    assert RECORD.max_sequence_length(tiny_config()) == 64
    assert RECORD.fields("hidden_dropout_prob") == () and RECORD.fields("attention_probs_dropout_prob") == (
        "attention_dropout",)


def test_names_are_what_save_pretrained_writes(pair):
    config, _, state, model, _ = pair
    exported = ARCH.state_dict(model, config)
    assert set(exported) == set(state)
    assert ("lm_head.weight" in exported) is (not config.tie_word_embeddings)
    assert exported["model.layers.0.self_attn.k_proj.weight"].shape == (8 * config.num_key_value_heads, 32)
    for name, array in exported.items():
        assert array.dtype == np.float32 and array.flags["C_CONTIGUOUS"], name
        np.testing.assert_array_equal(array, state[name], err_msg=name)
    paths = [variable.path for variable in model.variables]  # checkpoints key variables by path
    assert len(set(paths)) == len(paths) == len(exported) and "model/layers_1/self_attn/q_proj/kernel" in paths


def test_keras_logits_equal_transformers(pair):
    _, reference, _, model, batch = pair
    expected = torch_logits(reference, batch)
    got = keras_logits(model, batch)
    assert got.shape == (3, 4, 100)
    assert np.abs(expected).max() > 1.0
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)


def test_export_folder_loads_with_auto_model_and_equal_logits(pair, tmp_path):
    from hf_tpu_ext.backends.keras import hf_convert
    from hf_tpu_ext.backends.keras.export import export_masked_lm

    config, _, _, model, batch = pair
    written = export_masked_lm(model, str(tmp_path), config=config)
    assert "model.safetensors" in written and not any(name.startswith("keras_hub") for name in written)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["EuroBertForMaskedLM"] and saved["model_type"] == "eurobert"
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(loaded).__name__ == "EuroBertForMaskedLM"
    tied = loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert tied is bool(config.tie_word_embeddings)
    np.testing.assert_allclose(torch_logits(loaded, batch), keras_logits(model, batch), rtol=0, atol=TOLERANCE)
    read_config, state = hf_convert.read_transformers_checkpoint(str(tmp_path))  # and back into Keras
    again = ARCH.build(read_config, "float32")
    ARCH.assign(again, state, read_config)
    np.testing.assert_allclose(keras_logits(again, batch), keras_logits(model, batch), rtol=0, atol=1e-6)


def test_jitted_value_and_grad_finite_for_every_variable():
    config = tiny_config(attention_dropout=0.1)
    model = ARCH.build(config, "float32")
    ids, mask, positions = padded_batch()
    inputs = {"token_ids": jax.numpy.asarray(ids, "int32"), "padding_mask": jax.numpy.asarray(mask, "int32"),
              "mask_positions": jax.numpy.asarray(positions, "int32")}
    labels = jax.numpy.asarray(np.take_along_axis(ids, positions, axis=1), "int32")

    def loss(trainable, non_trainable):
        logits, _ = model.stateless_call(trainable, non_trainable, inputs, training=True)
        log_probs = jax.nn.log_softmax(logits.astype("float32"), axis=-1)
        return -jax.numpy.take_along_axis(log_probs, labels[..., None], axis=-1).mean()

    trainable = [v.value for v in model.trainable_variables]
    value, grads = jax.jit(jax.value_and_grad(loss))(trainable, [v.value for v in model.non_trainable_variables])
    assert np.isfinite(float(value)) and float(value) > 0.0
    assert len(grads) == len(ARCH.state_dict(model, config))
    for variable, grad in zip(model.trainable_variables, grads):
        grad = np.asarray(grad)
        assert grad.shape == tuple(variable.shape) and np.isfinite(grad).all(), variable.path
        if "embed_tokens" not in variable.path:  # rows of tokens outside the batch get none; the rest must
            assert np.abs(grad).max() > 0.0, variable.path


def test_mixed_bfloat16_logits_close_to_float32(pair):
    config, _, state, model, batch = pair
    bf16 = ARCH.build(config, "mixed_bfloat16")
    ARCH.assign(bf16, state, config)
    got, expected = keras_logits(bf16, batch), keras_logits(model, batch)
    assert bf16.backbone.embed_tokens.embeddings.dtype == "float32"
    assert np.abs(got - expected).max() <= 0.05 * np.abs(expected).max()
    assert (got.argmax(-1) == expected.argmax(-1)).mean() >= 0.75


def test_flops_per_token_counts_grouped_projections():
    config = tiny_config()  # h 32, heads 4 x 8, kv 2 x 8, i 48, V 100, 3 layers
    per_layer = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 48
    assert model_types.flops_per_token(config, 12, 0.25) == (6 * 3 * per_layer + 12 * 3 * 32 * 12
                                                             + 6 * 32 * 100 * 0.25)
    with pytest.raises(Exception, match="seq_length must be >= 1"):
        model_types.flops_per_token(config, 0, None)


def test_unsupported_config_refused_naming_the_field():
    with pytest.raises(CheckpointError) as error:
        ARCH.build(tiny_config(hidden_act="gelu"), "float32")
    assert str(error.value) == ("hidden_act='gelu' is not supported by --backend keras's EuroBERT (supported: silu, "
                                "swish). Use --backend torch_xla for this model.")


def test_assign_refuses_a_misshapen_weight_naming_it(pair):
    config, _, state, model, _ = pair
    bad = dict(state, **{"model.layers.1.mlp.up_proj.weight": np.zeros((5, 32), np.float32)})
    with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj.weight"):
        ARCH.assign(model, bad, config)


def test_long_padded_batch_takes_the_chunked_kernel_and_equals_transformers(caplog):
    """Past ``attention.CHUNKED_MIN_LENGTH`` EuroBERT's (global) attention is the chunked kernel, no ``L x L``,
    grouped-query heads and right padding included."""
    from hf_tpu_ext.backends.keras.architectures import attention

    length = attention.CHUNKED_MIN_LENGTH + 88  # not a multiple of the chunk
    config = tiny_config(max_position_embeddings=1024)
    reference = random_torch_model(config)
    model = ARCH.build(config, "float32")
    ARCH.assign(model, saved_state(reference), config)
    rng = np.random.default_rng(3)
    ids, mask = rng.integers(4, 100, size=(2, length)), np.ones((2, length), dtype=np.int64)
    ids[1, 300:], mask[1, 300:] = 0, 0
    batch = ids, mask, np.array([[0, 1, length - 2, length - 1], [0, 150, 298, 299]])
    caplog.set_level("INFO", logger=attention.__name__)
    attention._LOGGED.clear()
    np.testing.assert_allclose(keras_logits(model, batch), torch_logits(reference, batch), rtol=0, atol=TOLERANCE)
    assert f"Attention at seq {length}: global layers: chunked (" in caplog.text
