"""EuroBERT masked LM from Keras 3 layers: transformers 5's ``EuroBertForMaskedLM``, no keras-hub.

The computation (Boizard et al. 2025, "EuroBERT"; transformers' ``modeling_eurobert.py``), a Llama-style encoder:

* embeddings: ``embed_tokens(ids)`` (no norm, no dropout, no position table: positions enter as RoPE, from 0);
* each layer (pre-RMSNorm): ``x += o_proj(attention(input_layernorm(x)))``, then
  ``x += down_proj(silu(gate_proj(y)) * up_proj(y))`` with ``y = post_attention_layernorm(x)`` (SwiGLU);
* attention: ``q_proj`` ``[h, heads * head_dim]``, ``k_proj``/``v_proj`` ``[h, kv_heads * head_dim]``
  (grouped-query attention when ``num_key_value_heads < num_attention_heads``: query head ``n`` reads key/value head
  ``n // (heads / kv_heads)``, transformers' ``repeat_kv``), RoPE on queries and keys (:mod:`.rotary`, theta
  ``rope_parameters["rope_theta"]``), scale ``head_dim^-0.5``, the padding mask (bidirectional), probabilities
  dropped at ``attention_dropout`` while training (:func:`.attention.attend` with the padding: global only, so
  dense below 512 tokens and from 512 the chunked kernel with no ``L x L``, cuDNN flash on a GPU in bf16, splash on
  TPU; with attention dropout while training, dense);
* ``norm`` (RMSNorm), then the head ``lm_head`` ``[h, V]`` (bias with ``mlp_bias``, as transformers builds it):
  its own weight (``tie_word_embeddings: false``, EuroBERT's default) or ``embed_tokens`` transposed when tied.

RMSNorm: ``weight * (x * rsqrt(mean(x^2) + rms_norm_eps))``, the normalization in float32 and cast back to the
compute dtype before the weight (transformers' ``EuroBertRMSNorm``).

The rest of the model type (preset, tokenizer kind, FLOP count) is its record (:mod:`hf_tpu_ext.model_types.eurobert`).
Model contract: :mod:`hf_tpu_ext.backends.keras.architectures.base` (inputs ``token_ids`` / ``padding_mask`` /
``mask_positions``, logits ``[B, P, V]`` in the compute dtype, the head only at ``mask_positions``).
"""

from __future__ import annotations

from typing import List, Tuple

import keras
from keras import layers, ops

from hf_tpu_ext.backends.keras.architectures.attention import attend, describe_paths
from hf_tpu_ext.backends.keras.architectures.base import Architecture
from hf_tpu_ext.backends.keras.architectures.layouts import LINEAR, SAME
from hf_tpu_ext.backends.keras.architectures.name_table import table_assign, table_state_dict
from hf_tpu_ext.backends.keras.architectures.remat import call_layer
from hf_tpu_ext.backends.keras.architectures.rotary import apply_rope, inverse_frequencies, rope_tables
from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.model_types.eurobert import head_dim, kv_heads

#: transformers ``ACT2FN`` names of the SwiGLU gate this module computes (both are ``x * sigmoid(x)``)
ACTIVATIONS = ("silu", "swish")


# ---- the config as the layers read it, the name table (no Keras; the preset and FLOP count: its record) --------

def rope_theta(config) -> float:
    """``rope_parameters["rope_theta"]`` (transformers 5), else ``rope_theta``, else 10000 (the class default)."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else getattr(config, "rope_theta", None) or 10000.0)


def tied(config) -> bool:
    """Whether ``lm_head.weight`` is ``embed_tokens.weight`` (``tie_word_embeddings``; EuroBERT's default False)."""
    return bool(getattr(config, "tie_word_embeddings", False))


def check_config(config) -> None:
    """Raise ``CheckpointError`` naming the field when ``config`` is a EuroBERT this module cannot compute."""
    if getattr(config, "model_type", "eurobert") != "eurobert":
        raise CheckpointError(f"model_type {config.model_type!r} is not 'eurobert'.")
    if getattr(config, "hidden_act", "silu") not in ACTIVATIONS:
        raise CheckpointError(f"hidden_act={config.hidden_act!r} is not supported by --backend keras's EuroBERT "
                              f"(supported: {', '.join(ACTIVATIONS)}). Use --backend torch_xla for this model.")
    if int(config.num_attention_heads) % kv_heads(config):
        raise CheckpointError(f"num_attention_heads={config.num_attention_heads} is not a multiple of "
                              f"num_key_value_heads={kv_heads(config)}.")
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and params.get("rope_type", "default") != "default":
        raise CheckpointError(f"rope_parameters.rope_type={params['rope_type']!r} is not supported by --backend "
                              "keras's EuroBERT (only 'default' RoPE). Use --backend torch_xla for this model.")


def name_table(config) -> List[Tuple[str, str, str]]:
    """Every weight of ``EuroBertForMaskedLM.state_dict()`` as saved (a tied ``lm_head.weight`` left out):
    ``(transformers name, attribute path in :class:`EuroBertMaskedLM`, layout kind of :mod:`.layouts`)``."""
    def linear(hf: str, own: str, bias: bool) -> List[Tuple[str, str, str]]:
        return [(f"{hf}.weight", f"{own}.kernel", LINEAR)] + ([(f"{hf}.bias", f"{own}.bias", SAME)] if bias else [])

    attention_bias, mlp_bias = bool(config.attention_bias), bool(config.mlp_bias)
    rows = [("model.embed_tokens.weight", "backbone.embed_tokens.embeddings", SAME)]
    for i in range(int(config.num_hidden_layers)):
        hf, own = f"model.layers.{i}", f"backbone.encoder_layers.{i}"
        rows.append((f"{hf}.input_layernorm.weight", f"{own}.input_layernorm.weight", SAME))
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            rows += linear(f"{hf}.self_attn.{proj}", f"{own}.self_attn.{proj}", attention_bias)
        rows.append((f"{hf}.post_attention_layernorm.weight", f"{own}.post_attention_layernorm.weight", SAME))
        for proj in ("gate_proj", "up_proj", "down_proj"):
            rows += linear(f"{hf}.mlp.{proj}", f"{own}.mlp.{proj}", mlp_bias)
    rows.append(("model.norm.weight", "backbone.norm.weight", SAME))
    if not tied(config):
        rows.append(("lm_head.weight", "lm_head.kernel", LINEAR))
    if mlp_bias:
        rows.append(("lm_head.bias", "lm_head_bias" if tied(config) else "lm_head.bias", SAME))
    return rows


# ---- Keras layers ---------------------------------------------------------------------------------------------------

def _init(config):
    """transformers' ``_init_weights`` for ``Linear``/``Embedding``: normal, std ``initializer_range``."""
    return keras.initializers.RandomNormal(stddev=float(config.initializer_range))


class RMSNorm(layers.Layer):
    """``weight * cast(x32 * rsqrt(mean(x32^2, -1) + eps))`` (module doc). Call: ``[..., H]`` -> same shape/dtype."""

    def __init__(self, hidden: int, epsilon: float, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.epsilon = int(hidden), float(epsilon)

    def build(self, input_shape=None):
        self.weight = self.add_weight(shape=(self.hidden,), initializer="ones", name="weight")
        self.built = True

    def call(self, x):
        x32 = ops.cast(x, "float32")
        normed = x32 * ops.rsqrt(ops.mean(ops.square(x32), axis=-1, keepdims=True) + self.epsilon)
        return ops.cast(normed, x.dtype) * ops.cast(self.weight, x.dtype)


def _dense(config, units: int, bias: bool, name: str, policy):
    return layers.Dense(units, use_bias=bias, kernel_initializer=_init(config), dtype=policy, name=name)


class EuroBertAttention(layers.Layer):
    """Grouped-query self-attention with RoPE (module doc). Call: ``(x [B, L, H], padding bool [B, L] (True: real
    key), rope (cos, sin) float32 [L, head_dim])`` -> ``[B, L, H]``."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        policy, bias = self.dtype_policy, bool(config.attention_bias)
        self.hidden, self.heads, self.kv_heads = int(config.hidden_size), int(config.num_attention_heads), \
            kv_heads(config)
        self.head_dim = head_dim(config)
        self.q_proj = _dense(config, self.heads * self.head_dim, bias, "q_proj", policy)
        self.k_proj = _dense(config, self.kv_heads * self.head_dim, bias, "k_proj", policy)
        self.v_proj = _dense(config, self.kv_heads * self.head_dim, bias, "v_proj", policy)
        self.o_proj = _dense(config, self.hidden, bias, "o_proj", policy)
        self.attention_probs_dropout = layers.Dropout(float(config.attention_dropout), dtype=policy,
                                                      name="attention_probs_dropout")

    def build(self, input_shape):
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            proj.build(input_shape)
        self.o_proj.build(tuple(input_shape[:-1]) + (self.heads * self.head_dim,))
        self.built = True

    def call(self, x, padding, rope, training=False, segment_ids=None):
        length = x.shape[1]
        query = apply_rope(ops.reshape(self.q_proj(x), (-1, length, self.heads, self.head_dim)), rope)
        key = apply_rope(ops.reshape(self.k_proj(x), (-1, length, self.kv_heads, self.head_dim)), rope)
        value = ops.reshape(self.v_proj(x), (-1, length, self.kv_heads, self.head_dim))
        if self.kv_heads != self.heads:  # repeat_kv: query head n reads key/value head n // groups
            groups = self.heads // self.kv_heads
            key, value = ops.repeat(key, groups, axis=2), ops.repeat(value, groups, axis=2)
        # the padding, not a [B, 1, 1, L] mask: attend picks the kernel that holds no L x L at long lengths
        attended = attend(query, key, value, None, self.attention_probs_dropout, training, self.head_dim ** -0.5,
                          key_padding=padding, segment_ids=segment_ids)
        return self.o_proj(ops.reshape(attended, (-1, length, self.heads * self.head_dim)))


class EuroBertMLP(layers.Layer):
    """SwiGLU: ``down_proj(silu(gate_proj(x)) * up_proj(x))``. Call: ``[B, L, H]`` -> ``[B, L, H]``."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        policy, bias = self.dtype_policy, bool(config.mlp_bias)
        self.intermediate = int(config.intermediate_size)
        self.gate_proj = _dense(config, self.intermediate, bias, "gate_proj", policy)
        self.up_proj = _dense(config, self.intermediate, bias, "up_proj", policy)
        self.down_proj = _dense(config, int(config.hidden_size), bias, "down_proj", policy)

    def build(self, input_shape):
        self.gate_proj.build(input_shape)
        self.up_proj.build(input_shape)
        self.down_proj.build(tuple(input_shape[:-1]) + (self.intermediate,))
        self.built = True

    def call(self, x):
        return self.down_proj(keras.activations.silu(self.gate_proj(x)) * self.up_proj(x))


class EuroBertLayer(layers.Layer):
    """Pre-RMSNorm layer (module doc). Call: ``(x [B, L, H], padding [B, L], rope)`` -> ``[B, L, H]``."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        policy, hidden, eps = self.dtype_policy, int(config.hidden_size), float(config.rms_norm_eps)
        self.input_layernorm = RMSNorm(hidden, eps, dtype=policy, name="input_layernorm")
        self.self_attn = EuroBertAttention(config, dtype=policy, name="self_attn")
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype=policy, name="post_attention_layernorm")
        self.mlp = EuroBertMLP(config, dtype=policy, name="mlp")

    def build(self, input_shape):
        for layer in (self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp):
            layer.build(input_shape)
        self.built = True

    def call(self, x, padding, rope, training=False, segment_ids=None):
        x = x + self.self_attn(self.input_layernorm(x), padding, rope, training=training, segment_ids=segment_ids)
        return x + self.mlp(self.post_attention_layernorm(x))


class EuroBertBackbone(layers.Layer):
    """transformers' ``EuroBertModel``: ``embed_tokens``, ``num_hidden_layers`` layers, ``norm``.

    Call: ``(token_ids int [B, L], padding_mask int/bool [B, L])`` -> ``[B, L, H]`` (positions ``0..L-1``).
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.hidden = int(config.hidden_size)
        self.inv_freq = inverse_frequencies(rope_theta(config), head_dim(config))
        self.embed_tokens = layers.Embedding(int(config.vocab_size), self.hidden, embeddings_initializer=_init(config),
                                             dtype=policy, name="embed_tokens")
        self.encoder_layers = [EuroBertLayer(config, dtype=policy, name=f"layers_{i}")
                               for i in range(int(config.num_hidden_layers))]
        self.norm = RMSNorm(self.hidden, float(config.rms_norm_eps), dtype=policy, name="norm")

    def build(self, input_shape=None):
        self.embed_tokens.build((None, None))
        for layer in self.encoder_layers:
            layer.build((None, None, self.hidden))
        self.norm.build((None, None, self.hidden))
        self.built = True

    def call(self, token_ids, padding_mask, training=False, segment_ids=None, position_ids=None):
        x = self.embed_tokens(token_ids)
        padding = ops.cast(padding_mask, "bool")  # [B, L]: a query attends to real keys
        length = token_ids.shape[1]
        dropout = bool(training and self.encoder_layers[0].self_attn.attention_probs_dropout.rate > 0)
        describe_paths(length, {"global": None}, keras.backend.standardize_dtype(x.dtype), dropout)
        rope = rope_tables(self.inv_freq, length, position_ids)  # packed documents: positions from 0 in each
        for layer in self.encoder_layers:
            # under jax.checkpoint with --gradient_checkpointing
            x = call_layer(layer, x, padding, rope, training=training, segment_ids=segment_ids)
        return self.norm(x)


class EuroBertMaskedLM(keras.Model):
    """The masked LM: ``backbone`` (:class:`EuroBertBackbone`), then ``lm_head`` at ``mask_positions`` (a ``Dense``
    of its own, or ``embed_tokens`` transposed plus ``lm_head_bias`` when the config ties them). Built on
    construction; ``model.config`` is ``config``.

    Call: ``{"token_ids" int [B, L], "padding_mask" int [B, L], "mask_positions" int [B, P]}`` -> ``[B, P, V]``.
    """

    def __init__(self, config, dtype=None, name: str = "eurobert_masked_lm", **kwargs):
        super().__init__(dtype=dtype, name=name, **kwargs)
        policy, vocab = self.dtype_policy, int(config.vocab_size)
        self.config = config
        self.backbone = EuroBertBackbone(config, dtype=policy, name="model")
        self.backbone.build()
        self.lm_head = self.lm_head_bias = None
        if tied(config):
            self.lm_head_bias = (self.add_weight(shape=(vocab,), initializer="zeros", name="lm_head_bias")
                                 if config.mlp_bias else None)
        else:
            self.lm_head = _dense(config, vocab, bool(config.mlp_bias), "lm_head", policy)
            self.lm_head.build((None, None, int(config.hidden_size)))
        self.built = True

    def call(self, inputs, training=False):
        x = self.backbone(inputs["token_ids"], inputs["padding_mask"], training=training,
                          segment_ids=inputs.get("segment_ids"), position_ids=inputs.get("position_ids"))
        index = ops.expand_dims(ops.cast(inputs["mask_positions"], "int32"), axis=-1)
        x = ops.take_along_axis(x, index, axis=1)
        if self.lm_head is not None:
            return self.lm_head(x)
        logits = ops.matmul(x, ops.transpose(ops.cast(self.backbone.embed_tokens.embeddings, x.dtype)))
        return logits if self.lm_head_bias is None else logits + ops.cast(self.lm_head_bias, x.dtype)


def build(config, dtype: str = "float32") -> EuroBertMaskedLM:
    """A new :class:`EuroBertMaskedLM` of ``config`` (transformers' initialization; seeded by Keras' global seed).

    Raises:
        CheckpointError: :func:`check_config` refuses the config (the field named).
    """
    check_config(config)
    return EuroBertMaskedLM(config, dtype=dtype)


def state_dict(model, config=None):
    """The weights under ``EuroBertForMaskedLM.state_dict()`` names (float32, C-contiguous; a tied
    ``lm_head.weight`` left out as ``save_pretrained`` does). ``{name: np.ndarray}``."""
    return table_state_dict(model, name_table(model.config if config is None else config))


def assign(model, state, config=None) -> None:
    """Set ``model``'s weights from a ``EuroBertForMaskedLM`` state dict (arrays, any float dtype). A state without
    ``lm_head.*`` (a ``EuroBertModel`` checkpoint) keeps the head's initialization, with a warning.

    Raises:
        CheckpointError: a backbone weight is missing, or a shape differs (both named).
    """
    config = model.config if config is None else config
    table = name_table(config)
    table_assign(model, state, table, head_names=[name for name, _, _ in table if name.startswith("lm_head.")],
                 aliases={}, what="EuroBERT")


ARCHITECTURE = Architecture(name="eurobert", build=build, check_config=check_config, state_dict=state_dict,
                            assign=assign)
