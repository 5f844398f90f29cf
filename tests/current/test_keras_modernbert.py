"""The Keras backend's ModernBERT (``architectures/modernbert.py``) against transformers 5's ``ModernBertForMaskedLM``.

Tiny models (tests/modernbert_support.py: hidden 32, 3 layers, 2 heads, vocab 100, ``local_attention`` 4 on 12
tokens, every weight random): transformers -> Keras -> transformers give the same logits at real tokens of a
right-padded batch (float32, max abs difference <= 1e-4), with the config's defaults and with every bias flag on;
the model trains (finite, non-zero gradients for every variable through a jitted ``stateless_call``, dropout on);
bfloat16 compute stays close; the window is the mask transformers applies; the FLOP count counts the window.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_keras_modernbert.py``.
"""

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
jax = pytest.importorskip("jax")

import keras  # noqa: E402

from hf_tpu_ext.backends.keras.architectures import get_architecture, supported_model_types  # noqa: E402
from hf_tpu_ext import model_types  # noqa: E402
from hf_tpu_ext.errors import CheckpointError  # noqa: E402
from modernbert_support import (  # noqa: E402
    ALL_BIASES,
    SEQ,
    keras_logits,
    padded_batch,
    random_torch_model,
    tiny_config,
    torch_logits,
    torch_state,
)

TOLERANCE = 1e-4  # float32, max abs difference of logits (their magnitude is ~1-10 here)
ARCH = get_architecture("modernbert") if "modernbert" in supported_model_types() else None


@pytest.fixture(scope="module", params=["defaults", "all_biases"])
def pair(request):
    """(config, transformers model, its state, the Keras model holding it, the batch)."""
    config = tiny_config(**(ALL_BIASES if request.param == "all_biases" else {}))
    reference = random_torch_model(config)
    state = torch_state(reference)
    model = ARCH.build(config, "float32")
    ARCH.assign(model, state, config)
    return config, reference, state, model, padded_batch()


def test_registry_row():
    record = model_types.record_for("modernbert")
    assert ARCH.name == "modernbert" and record.model_types == ("modernbert",)
    assert dict(record.masked_lm_classes) == {"modernbert": "ModernBertForMaskedLM"}
    assert record.tokenizer_kind == "bracket_bpe"
    assert model_types.max_sequence_length(tiny_config()) == 64


def test_layer_pattern_read_from_transformers_5(pair):
    config, _, _, model, _ = pair
    expected = {2: ["full_attention", "sliding_attention", "full_attention"],
                3: ["full_attention", "sliding_attention", "sliding_attention"]}
    pattern = [layer.attention_type for layer in model.backbone.encoder_layers]
    assert pattern == list(config.layer_types) == expected[2 if config.attention_bias else 3]
    assert model.backbone.encoder_layers[0].attn_norm is None
    assert all(layer.attn_norm is not None for layer in model.backbone.encoder_layers[1:])


def test_names_are_transformers_state_dict_minus_tied_decoder(pair):
    config, _, state, model, _ = pair
    exported = ARCH.state_dict(model, config)
    assert set(exported) == set(state) - {"decoder.weight"}
    for name, array in exported.items():
        assert array.dtype == np.float32 and array.flags["C_CONTIGUOUS"], name
        np.testing.assert_array_equal(array, state[name], err_msg=name)
    assert ("model.layers.0.attn.Wqkv.bias" in exported) is bool(config.attention_bias)
    assert "model.layers.0.attn_norm.weight" not in exported and "model.layers.1.attn_norm.weight" in exported
    paths = [variable.path for variable in model.variables]  # checkpoints key variables by path
    assert len(set(paths)) == len(paths) == len(exported) and "model/layers_1/attn/Wqkv/kernel" in paths


def test_keras_logits_equal_transformers(pair):
    _, reference, _, model, batch = pair
    expected = torch_logits(reference, batch)
    got = keras_logits(model, batch)
    assert got.shape == (3, 4, 100)
    assert np.abs(expected).max() > 1.0  # the random weights give logits large enough for 1e-4 to mean something
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)


def test_exported_state_loads_into_transformers_with_equal_logits(pair):
    from transformers import ModernBertForMaskedLM

    config, _, _, model, batch = pair
    fresh = ModernBertForMaskedLM(config).eval()
    result = fresh.load_state_dict({k: torch.from_numpy(v) for k, v in ARCH.state_dict(model, config).items()},
                                   strict=False)
    assert result.unexpected_keys == [] and result.missing_keys == ["decoder.weight"]
    assert fresh.decoder.weight.data_ptr() == fresh.model.embeddings.tok_embeddings.weight.data_ptr()
    np.testing.assert_allclose(torch_logits(fresh, batch), keras_logits(model, batch), rtol=0, atol=TOLERANCE)


def _masked_lm_loss(model, batch):
    ids, mask, positions = batch
    inputs = {"token_ids": jax.numpy.asarray(ids, "int32"), "padding_mask": jax.numpy.asarray(mask, "int32"),
              "mask_positions": jax.numpy.asarray(positions, "int32")}
    labels = jax.numpy.asarray(np.take_along_axis(ids, positions, axis=1), "int32")

    def loss(trainable, non_trainable):
        logits, _ = model.stateless_call(trainable, non_trainable, inputs, training=True)
        log_probs = jax.nn.log_softmax(logits.astype("float32"), axis=-1)
        return -jax.numpy.take_along_axis(log_probs, labels[..., None], axis=-1).mean()

    return loss


def test_jitted_value_and_grad_finite_for_every_variable():
    """Dropout on everywhere (attention_dropout > 0 takes the einsum path with dropout on the probabilities)."""
    config = tiny_config(attention_dropout=0.1, mlp_dropout=0.1, embedding_dropout=0.1, **ALL_BIASES)
    model = ARCH.build(config, "float32")
    ARCH.assign(model, torch_state(random_torch_model(config)), config)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    value, grads = jax.jit(jax.value_and_grad(_masked_lm_loss(model, padded_batch())))(trainable, non_trainable)
    assert np.isfinite(float(value)) and float(value) > 0.0
    assert len(grads) == len(model.trainable_variables) == len(ARCH.state_dict(model, config))
    for variable, grad in zip(model.trainable_variables, grads):
        grad = np.asarray(grad)
        assert grad.shape == tuple(variable.shape) and np.isfinite(grad).all(), variable.path
        assert np.abs(grad).max() > 0.0, variable.path  # every weight is on the loss's path


def test_probability_dropout_path_equals_dot_product_attention():
    """The einsum path (taken only with attention_dropout > 0 while training) at rate 0 equals
    ``keras.ops.dot_product_attention``, a query whose keys are all masked included."""
    model = ARCH.build(tiny_config(), "float32")
    attention = model.backbone.encoder_layers[1].attn
    rng = np.random.default_rng(3)
    query, key, value = (rng.normal(size=(2, SEQ, 2, 16)).astype("float32") for _ in range(3))
    mask = np.abs(np.arange(SEQ)[:, None] - np.arange(SEQ)[None, :]) <= 2
    mask = np.logical_and(mask[None, None], (np.arange(SEQ) < np.array([[SEQ], [3]]))[:, None, None, :])
    assert not mask[1, 0, 8].any()  # query 8 of row 1 sees no real key
    from hf_tpu_ext.backends.keras.architectures.attention import attend

    assert attention.attention_probs_dropout.name == "attention_probs_dropout"  # what attend drops with
    tiny_rate = keras.layers.Dropout(1e-9)  # nonzero while training: the einsum path, keeping every probability
    explicit = attend(query, key, value, mask, tiny_rate, True, 0.25)
    fused = keras.ops.dot_product_attention(query, key, value, mask=mask, scale=0.25)
    np.testing.assert_allclose(np.asarray(explicit), np.asarray(fused), rtol=0, atol=1e-6)


def test_mixed_bfloat16_logits_close_to_float32(pair):
    config, _, state, model, batch = pair
    bf16 = ARCH.build(config, "mixed_bfloat16")
    ARCH.assign(bf16, state, config)
    got = keras_logits(bf16, batch)
    expected = keras_logits(model, batch)
    assert bf16.backbone.embeddings.tok_embeddings.embeddings.dtype == "float32"
    # bfloat16 keeps 8 bits of mantissa: 3 layers of random weights drift by a few percent of the logits' range
    assert np.abs(got - expected).max() <= 0.05 * np.abs(expected).max()
    assert (got.argmax(-1) == expected.argmax(-1)).mean() >= 0.75


def test_window_is_the_mask_a_whole_sequence_window_is_global():
    """Equal weights, equal thetas: a window covering the sequence equals all-global layers; the 4-token one not."""
    common = dict(global_rope_theta=10000.0, local_rope_theta=10000.0, global_attn_every_n_layers=2)
    config = tiny_config(**common)
    state = torch_state(random_torch_model(config))
    batch = padded_batch()
    logits = {}
    for name, overrides in (("window", {}), ("wide", {"local_attention": 2 * SEQ}),
                            ("global", {"global_attn_every_n_layers": 1})):
        variant = tiny_config(**dict(common, **overrides))
        model = ARCH.build(variant, "float32")
        ARCH.assign(model, state, variant)
        logits[name] = keras_logits(model, batch)
    np.testing.assert_allclose(logits["wide"], logits["global"], rtol=0, atol=1e-5)
    assert np.abs(logits["window"] - logits["global"]).max() > 1e-2


def test_flops_count_the_window_on_local_layers():
    config = tiny_config(**ALL_BIASES)  # layers G L G, h 32, i 48, V 100, local_attention 4 (5 keys)
    per_layer = 4 * 32 * 32 + 3 * 32 * 48
    head = 6 * (32 * 32 + 32 * 100)
    assert model_types.flops_per_token(config, 12, 0.25) == 6 * 3 * per_layer + 12 * 32 * (12 + 5 + 12) + head * 0.25
    assert model_types.flops_per_token(config, 3, None) == 6 * 3 * per_layer + 12 * 32 * (3 + 3 + 3) + head
    with pytest.raises(Exception, match="seq_length must be >= 1"):
        model_types.flops_per_token(config, 0, None)


def test_unsupported_activation_refused_naming_the_field():
    with pytest.raises(CheckpointError) as error:
        ARCH.build(tiny_config(hidden_activation="silu"), "float32")
    assert str(error.value) == ("hidden_activation='silu' is not supported by --backend keras's ModernBERT "
                                "(supported: gelu, gelu_pytorch_tanh, gelu_new). Use --backend torch_xla for this "
                                "model.")


def test_assign_refuses_missing_or_misshapen_weight_and_writes_nothing(pair):
    config, _, state, _, _ = pair
    model = ARCH.build(config, "float32")
    before = ARCH.state_dict(model, config)
    missing = {k: v for k, v in state.items() if k != "model.layers.1.attn_norm.weight"}
    with pytest.raises(CheckpointError, match=r"^The checkpoint has no 'model.layers.1.attn_norm.weight': it is not a "
                                              r"ModernBertForMaskedLM of this config"):
        ARCH.assign(model, missing, config)
    misshapen = dict(state, **{"model.layers.2.mlp.Wo.weight": np.zeros((32, 40), "float32")})
    with pytest.raises(CheckpointError) as error:
        ARCH.assign(model, misshapen, config)
    assert str(error.value) == "'model.layers.2.mlp.Wo.weight' has shape (32, 40); this config needs (32, 48)."
    after = ARCH.state_dict(model, config)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_headless_checkpoint_keeps_head_initialization(pair, caplog):
    config, _, state, _, batch = pair
    model = ARCH.build(config, "float32")
    head_before = ARCH.state_dict(model, config)["head.dense.weight"]
    backbone_only = {k: v for k, v in state.items() if k.startswith("model.")}
    with caplog.at_level(logging.WARNING):
        ARCH.assign(model, backbone_only, config)
    assert "The checkpoint has no masked-LM head (head.dense.weight" in caplog.text
    after = ARCH.state_dict(model, config)
    np.testing.assert_array_equal(after["head.dense.weight"], head_before)
    np.testing.assert_array_equal(after["model.final_norm.weight"], state["model.final_norm.weight"])


def test_the_backends_train_step_trains_it():
    """hf_tpu_ext's own step on a ``--bf16`` model (counter-based dropout incl. the attention-probability path, erf
    GELU, XLA:CPU's bf16 dot routing, 2 accumulated micro-batches): 8 AdamW steps on one batch lower its masked-LM
    loss (float32 training is the jitted-gradient test's)."""
    dtype = "mixed_bfloat16"
    from hf_tpu_ext.backends.keras.step import make_train_step, split_micro_batches

    config = tiny_config(attention_dropout=0.1, mlp_dropout=0.1, embedding_dropout=0.1)
    model = ARCH.build(config, dtype)
    ARCH.assign(model, torch_state(random_torch_model(config)), config)
    ids, mask, positions = padded_batch()
    batch = split_micro_batches({
        "input_ids": np.concatenate([ids, ids[:1]]).astype(np.int32),
        "attention_mask": np.concatenate([mask, mask[:1]]).astype(np.int32),
        "masked_lm_positions": np.concatenate([positions, positions[:1]]).astype(np.int32),
        "masked_lm_ids": np.take_along_axis(np.concatenate([ids, ids[:1]]), np.concatenate([positions, positions[:1]]),
                                            axis=1).astype(np.int32),
        "masked_lm_weights": np.ones((4, 4), np.float32)}, 2)
    optimizer = keras.optimizers.AdamW(3e-3)
    optimizer.build(model.trainable_variables)
    state = tuple([v.value for v in vs] for vs in
                  (model.trainable_variables, model.non_trainable_variables, optimizer.variables))
    step = jax.jit(make_train_step(model, optimizer, seed=5, accumulation=2, bf16_dots=True))  # CPU: as the plan
    losses = []
    for s in range(8):
        state, loss_sum, count = step(state, batch, np.int32(s))
        assert float(count) == 16.0
        losses.append(float(loss_sum) / float(count))
    assert all(np.isfinite(losses)) and all(np.isfinite(np.asarray(v)).all() for v in state[0])
    assert losses[-1] < 0.8 * losses[0], losses


def test_config_fields_of_both_transformers_versions_are_read():
    """4.57's fields (a ``None`` local theta is the global one there) and 5's ``layer_types``/``rope_parameters``."""
    from types import SimpleNamespace

    from hf_tpu_ext.backends.keras.architectures import modernbert_config as mc

    old = SimpleNamespace(num_hidden_layers=5, global_attn_every_n_layers=2, global_rope_theta=80000.0,
                          local_rope_theta=None)
    assert mc.layer_types(old) == ["full_attention", "sliding_attention", "full_attention", "sliding_attention",
                                   "full_attention"]
    assert mc.rope_thetas(old) == {"full_attention": 80000.0, "sliding_attention": 80000.0}
    new = tiny_config(global_rope_theta=1234.0, local_rope_theta=56.0)
    assert mc.rope_thetas(new) == {"full_attention": 1234.0, "sliding_attention": 56.0}
    assert mc.layer_types(new) == list(new.layer_types)
    scaled = tiny_config()
    scaled.rope_parameters["full_attention"]["rope_type"] = "linear"
    with pytest.raises(CheckpointError) as error:
        ARCH.check_config(scaled)
    assert str(error.value) == ("rope_parameters['full_attention'].rope_type='linear' is not supported by "
                                "--backend keras's ModernBERT (only 'default' RoPE).")
