"""BERT and DistilBERT on the Keras backend (``architectures/bert.py``, ``distilbert.py``) against transformers 5.

For each architecture a tiny transformers masked LM (2 layers, hidden 32, 4 heads, vocabulary 100; seeded, every
parameter randomized so a swapped gamma/beta, a left-out bias or a wrong transpose changes the logits):

- transformers -> ``arch.assign`` -> Keras logits at the mask positions of a right-padded batch equal transformers'
  (float32, max abs diff <= 1e-4);
- Keras (randomized) -> ``arch.state_dict`` -> a fresh transformers model (``load_state_dict(strict=False)``: only
  the tied decoder may be missing) -> equal logits; the names are the model's state-dict keys minus the tied ones;
- the model trains: a jitted ``value_and_grad`` of ``stateless_call(training=True)`` with dropout gives finite
  gradients for every trainable variable; the Keras step (counter-based dropout, erf GELU, bf16 dots) lowers the
  loss; a ``mixed_bfloat16`` build gives logits close to float32;
- FLOPs per token against a hand count; each refusal's exact line.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_keras_bert.py``.
"""

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
keras = pytest.importorskip("keras")

from hf_tpu_ext.backends.keras.architectures import get_architecture, supported_model_types  # noqa: E402
from hf_tpu_ext import model_types  # noqa: E402
from hf_tpu_ext.errors import CheckpointError  # noqa: E402

#: float32 agreement of two implementations of the same math (summation order differs)
TOLERANCE = 1e-4
KINDS = ("bert", "distilbert")
#: the tied weights save_pretrained leaves out (transformers 5's _tied_weights_keys)
TIED = {"bert": {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"},
        "distilbert": {"vocab_projector.weight"}}


def tiny_config(kind, **overrides):
    if kind == "bert":
        fields = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=40, type_vocab_size=2)
        return transformers.BertConfig(**{**fields, **overrides})
    fields = dict(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=40)
    return transformers.DistilBertConfig(**{**fields, **overrides})


def torch_model(kind, config, seed):
    torch.manual_seed(seed)
    cls = transformers.BertForMaskedLM if kind == "bert" else transformers.DistilBertForMaskedLM
    model = cls(config).eval()
    with torch.no_grad():  # every parameter random (LayerNorm scales around 1); tied ones stay tied
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("LayerNorm.weight") or
                                                  name.endswith("layer_norm.weight") else 0.0))
    return model


def randomize(model, seed):
    rng = np.random.default_rng(seed)
    for v in model.weights:
        value = rng.normal(0.0, 0.2, size=tuple(v.shape)).astype("float32")
        v.assign(value + 1.0 if v.path.endswith("gamma") else value)


@pytest.fixture(scope="module")
def batch():
    """Right-padded ids [3, 12] (pad id 0, lengths 12, 9, 5) and 3 mask positions per row, all at real tokens."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, size=(3, 12)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = 0
    positions = np.array([[0, 5, 11], [1, 4, 8], [0, 2, 4]], dtype="int32")
    return ids, mask, positions


def keras_logits(model, batch, training=False):
    ids, mask, positions = batch
    return model({"token_ids": ids, "padding_mask": mask, "mask_positions": positions}, training=training)


def transformers_logits(model, batch):
    ids, mask, positions = batch
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ids, dtype=torch.long),
                       attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    return np.take_along_axis(logits, positions[..., None].astype(np.int64), axis=1)


@pytest.fixture(scope="module", params=KINDS)
def pair(request):
    """(kind, arch, config, transformers model, Keras model holding its weights)."""
    kind = request.param
    config = tiny_config(kind)
    reference = torch_model(kind, config, seed=1)
    arch = get_architecture(kind)
    model = arch.build(config, "float32")
    arch.assign(model, {k: v.numpy() for k, v in reference.state_dict().items()}, config)
    return kind, arch, config, reference, model


def test_registry_rows():
    assert {"bert", "distilbert"} <= set(supported_model_types())
    for kind, cls in (("bert", "BertForMaskedLM"), ("distilbert", "DistilBertForMaskedLM")):
        arch, record = get_architecture(kind), model_types.record_for(kind)
        assert (arch.name, record.model_types, dict(record.masked_lm_classes), record.tokenizer_kind) == (
            kind, (kind,), {kind: cls}, "wordpiece")
        config = transformers.AutoConfig.for_model(kind, **record.small_preset)
        assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (256, 4, 4)
        assert model_types.max_sequence_length(config) == 512
        arch.check_config(config)


def test_imported_weights_give_transformers_logits(pair, batch):
    kind, _, _, reference, model = pair
    ours = np.asarray(keras_logits(model, batch))
    assert ours.shape == (3, 3, 100) and ours.dtype == np.float32
    assert np.abs(ours - transformers_logits(reference, batch)).max() <= TOLERANCE


def test_exported_weights_load_into_transformers(pair, batch):
    kind, arch, config, reference, _ = pair
    model = arch.build(config, "float32")
    randomize(model, seed=2)
    state = arch.state_dict(model, config)
    expected = reference.state_dict()
    assert set(state) == set(expected) - TIED[kind]
    assert all(state[n].shape == tuple(expected[n].shape) and state[n].dtype == np.float32 for n in state)
    fresh = torch_model(kind, config, seed=3)
    result = fresh.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    assert set(result.missing_keys) <= TIED[kind] and result.unexpected_keys == []
    fresh.tie_weights()
    ours = np.asarray(keras_logits(model, batch))
    assert np.abs(ours - transformers_logits(fresh, batch)).max() <= TOLERANCE


def test_round_trip_keeps_every_weight(pair):
    kind, arch, config, reference, model = pair
    state = arch.state_dict(model, config)
    for name, array in state.items():
        np.testing.assert_array_equal(array, reference.state_dict()[name].numpy(), err_msg=name)
    assert len({v.path for v in model.weights}) == len(model.weights) == len(state)  # checkpoints key by path
    if kind == "bert":  # both token-type rows kept, though the trainer's tokens are all of type 0
        assert state["bert.embeddings.token_type_embeddings.weight"].shape == (2, 32)


def test_head_less_checkpoint_keeps_head_and_warns(pair, caplog):
    kind, arch, config, reference, _ = pair
    prefix = kind + "."
    bare = {k[len(prefix):]: v.numpy() for k, v in reference.state_dict().items() if k.startswith(prefix)}
    model = arch.build(config, "float32")
    head_before = np.asarray(model.masked_lm_head.dense.kernel)
    with caplog.at_level(logging.WARNING, logger="hf_tpu_ext"):
        arch.assign(model, bare, config)
    assert "The checkpoint has no prediction head" in caplog.text
    np.testing.assert_array_equal(np.asarray(model.masked_lm_head.dense.kernel), head_before)
    np.testing.assert_array_equal(np.asarray(model.embeddings.word_embeddings.embeddings),
                                  reference.state_dict()[prefix + "embeddings.word_embeddings.weight"].numpy())


def test_missing_or_misshaped_weight_is_refused(pair):
    kind, arch, config, reference, _ = pair
    state = {k: v.numpy() for k, v in reference.state_dict().items()}
    name = f"{kind}.embeddings.position_embeddings.weight"
    model = arch.build(config, "float32")
    what = {"bert": "BERT", "distilbert": "DistilBERT"}[kind]
    with pytest.raises(CheckpointError, match=f"^The checkpoint has no '{name}'; it is not a {what} model of this"):
        arch.assign(model, {k: v for k, v in state.items() if k != name}, config)
    with pytest.raises(CheckpointError, match=rf"^{name} has shape \(20, 32\), the model needs \(40, 32\) "):
        arch.assign(model, {**state, name: state[name][:20]}, config)


def test_written_out_attention_equals_dot_product_attention():
    """``attend``'s training path (written out, for the probability dropout) is the same math as
    ``keras.ops.dot_product_attention``: with the dropout layer's rate at 0 while "training" it is the
    written-out path that runs, compared with inference (``dot_product_attention``) on the same inputs."""
    from hf_tpu_ext.backends.keras.architectures.attention import attend

    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(2, 7, 4, 8)).astype("float32") for _ in range(3))
    mask = np.ones((2, 1, 1, 7), dtype=bool)
    mask[1, ..., 4:] = False
    dropout = keras.layers.Dropout(0.5)
    fused = np.asarray(attend(q, k, v, mask, dropout, training=False))
    dropout.rate = 1e-9  # nonzero: the written-out path; keeps every probability up to 1e-9 scaling
    written = np.asarray(attend(q, k, v, mask, dropout, training=True))
    assert np.abs(written - fused).max() <= 1e-5
    expected = np.einsum("bnts,bsnh->btnh", _softmax(np.where(mask, np.einsum("btnh,bsnh->bnts", q, k) / 8 ** 0.5,
                                                             -np.inf)), v)
    assert np.abs(fused - expected).max() <= 1e-5
    assert not np.allclose(fused[1], np.asarray(attend(q, k, v, np.ones_like(mask), dropout, False))[1], atol=1e-3)


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _loss_fn(model, batch, labels, training):
    import jax
    import jax.numpy as jnp

    def loss(trainable, non_trainable):
        ids, mask, positions = batch
        inputs = {"token_ids": ids, "padding_mask": mask, "mask_positions": positions}
        logits, _ = model.stateless_call(trainable, non_trainable, inputs, training=training)
        logits = logits.astype(jnp.float32)
        gold = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - gold)

    return loss


def test_jitted_gradients_with_dropout_are_finite(pair, batch):
    import jax

    kind, arch, config, _, model = pair
    rates = (config.hidden_dropout_prob, config.attention_probs_dropout_prob) if kind == "bert" else (
        config.dropout, config.attention_dropout)
    assert rates == (0.1, 0.1)  # dropout on: the written-out attention path runs
    labels = batch[0][np.arange(3)[:, None], batch[2]]
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    loss, grads = jax.jit(jax.value_and_grad(_loss_fn(model, batch, labels, True)))(trainable, non_trainable)
    assert len(grads) == len(model.trainable_variables) == len(arch.state_dict(model, config))
    for variable, grad in zip(model.trainable_variables, grads):
        assert grad.shape == tuple(variable.shape) and bool(np.isfinite(np.asarray(grad)).all()), variable.path
        assert np.abs(np.asarray(grad)).max() > 0, variable.path  # every variable is used (token types: row 0)
    no_dropout = jax.jit(_loss_fn(model, batch, labels, False))(trainable, non_trainable)
    assert np.isfinite(float(loss)) and abs(float(loss) - float(no_dropout)) > 1e-4  # training=True drops


def test_keras_step_trains(pair, batch):
    """The backend's own train step (counter-based dropout, erf GELU, bf16/flat dots) lowers the loss: BERT in
    mixed_bfloat16 (bf16 x bf16 -> float32 projections), DistilBERT in float32 (2-D flat dots); both share every
    layer, so each dot path runs once per CI."""
    import jax

    from hf_tpu_ext.backends.keras.step import make_train_step

    kind, arch, config, _, _ = pair
    model = arch.build(config, "mixed_bfloat16" if kind == "bert" else "float32")
    ids, mask, positions = batch
    labels = ids[np.arange(3)[:, None], positions]
    micro = {"input_ids": ids, "attention_mask": mask, "masked_lm_positions": positions, "masked_lm_ids": labels,
             "masked_lm_weights": np.ones(positions.shape, np.float32)}
    optimizer = keras.optimizers.Adam(learning_rate=1e-2)
    optimizer.build(model.trainable_variables)
    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    step = jax.jit(make_train_step(model, optimizer, seed=0, accumulation=1, bf16_dots=True))
    losses = []
    for i in range(8):
        state, loss_sum, count = step(state, {k: v[None] for k, v in micro.items()}, np.int32(i))
        losses.append(float(loss_sum) / float(count))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.5, losses


def test_mixed_bfloat16_close_to_float32(pair, batch):
    kind, arch, config, reference, model = pair
    half = arch.build(config, "mixed_bfloat16")
    arch.assign(half, {k: v.numpy() for k, v in reference.state_dict().items()}, config)
    assert all(v.dtype == "float32" for v in half.weights)
    logits = keras_logits(half, batch)
    assert str(logits.dtype) == "bfloat16"
    full = np.asarray(keras_logits(model, batch))
    # bf16 keeps 8 bits of mantissa: logits of magnitude ~5 move by a few hundredths through 2 layers
    assert np.abs(np.asarray(logits, dtype=np.float32) - full).max() <= 0.1 * max(1.0, np.abs(full).max())


def test_flops_per_token_hand_count():
    # h=32, 2 layers, FFN 64, V=100, seq 16, head at 1/4 of the positions:
    # 6 * 2 * (4*32*32 + 2*32*64) = 98,304; attention 12 * 2 * 32 * 16 = 12,288; head 6 * (32*32 + 32*100) / 4 = 6,336
    for kind in KINDS:
        config = tiny_config(kind)
        assert model_types.flops_per_token(config, 16, 0.25) == 98304 + 12288 + 6336
        assert model_types.flops_per_token(config, 16, None) == 98304 + 12288 + 6 * (32 * 32 + 32 * 100)


@pytest.mark.parametrize("kind, overrides, message", [
    ("bert", dict(hidden_act="relu"), "hidden_act 'relu' is not supported: the Keras backend's BERT uses exact "
                                      "'gelu' only. Use --backend torch_xla for this model."),
    ("bert", dict(position_embedding_type="relative_key"),
     "position_embedding_type 'relative_key' is not supported: the Keras backend's BERT has absolute positions "
     "only. Use --backend torch_xla for this model."),
    ("bert", dict(num_attention_heads=5), "hidden size 32 is not a multiple of the attention heads 5."),
    ("bert", dict(tie_word_embeddings=False), "tie_word_embeddings=False is not supported: the Keras backend's "
                                              "BERT ties the output projection to the word embeddings. Use "
                                              "--backend torch_xla for this model."),
    ("distilbert", dict(is_decoder=True), "A decoder DistilBERT (is_decoder=True) cannot be trained as a masked LM."),
    ("distilbert", dict(sinusoidal_pos_embds=True),
     "sinusoidal_pos_embds=True is not supported: the Keras backend's DistilBERT trains a learned position table. "
     "Use --backend torch_xla for this model."),
    ("distilbert", dict(activation="relu"), "activation 'relu' is not supported: the Keras backend's DistilBERT "
                                            "uses exact 'gelu' only. Use --backend torch_xla for this model."),
])
def test_refused_configs(kind, overrides, message):
    config = tiny_config(kind)
    for name, value in overrides.items():  # set after construction: transformers validates some on __init__
        setattr(config, name, value)
    arch = get_architecture(kind)
    with pytest.raises(CheckpointError) as info:
        arch.build(config, "float32")
    assert str(info.value) == message
