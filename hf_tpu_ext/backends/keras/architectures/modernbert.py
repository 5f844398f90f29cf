"""ModernBERT masked LM from Keras 3 layers: transformers' ``ModernBertForMaskedLM`` (4.57 and 5), no keras-hub.

The computation (Warner et al. 2024, "Smarter, Better, Faster, Longer"; transformers' ``modeling_modernbert.py``):

* embeddings: ``drop(norm(tok_embeddings(ids)))`` (no position table: positions enter as RoPE, from 0);
* each layer ``i`` (pre-LayerNorm): ``x += Wo(attention(attn_norm(x)))`` with ``attn_norm`` absent on layer 0
  (transformers' ``nn.Identity``), then ``x += mlp.Wo(drop(act(a) * g))`` where ``a, g = split(mlp.Wi(mlp_norm(x)))``
  (GeGLU: ``Wi`` is ``[h, 2 intermediate]``, the first half the input, the second the gate);
* attention: fused ``Wqkv`` (``[h, 3h]``, output laid out ``(3, heads, head_dim)``), rotary embeddings on queries
  and keys (``rotate_half`` convention, ``inv_freq = theta^(-2j/head_dim)``) with the global theta on
  ``full_attention`` layers and the local theta on ``sliding_attention`` layers, scale ``head_dim^-0.5``; a
  local layer's query attends to keys with ``|q - k| <= local_attention // 2`` (transformers' mask, both
  versions), always combined with the padding mask; ``Wo`` then dropout ``attention_dropout``;
* ``final_norm``, the head ``norm(act(dense(x)))`` and the decoder ``x @ tok_embeddings^T + decoder.bias``.

LayerNorms have a bias only with ``norm_bias``; ``Wqkv``/``Wo`` with ``attention_bias``, ``Wi``/``Wo`` with
``mlp_bias``, ``head.dense`` with ``classifier_bias``, the decoder with ``decoder_bias``.

Which attention runs: :func:`.attention.attend` with the padding (``[B, L]``) and, on local layers, the half window
(``local_attention // 2``); it picks the kernel and the backbone says which in one INFO line per length
(:func:`.attention.describe_paths`). On the JAX backend's CPU/GPU a local layer computes only the key blocks that
cover its window (block-local: time and memory linear in ``L``), a global layer is dense below 512 tokens and
chunked (online softmax, recomputing backward, no ``L x L``) from 512 (cuDNN flash attention on a GPU in
bfloat16/float16); on a TPU both take splash attention (a ``LocalMask`` for local layers, the padding as segment
ids). With ``attention_dropout > 0`` while training, every layer takes the dense path written out (``einsum`` +
float32 softmax + ``keras.layers.Dropout`` on the probabilities, as transformers' eager path): ``L x L`` again, as
no fused kernel applies dropout. The record's ``flops_per_token`` (``model_types/modernbert.py``) counts the
window's keys on local layers and ``L`` on global ones: the useful work (block-local scores ``3 block`` keys per
query, 192 at ModernBERT's 129-key window; the chunked backward recomputes the scores), PaLM's MFU convention.

Model contract: :mod:`hf_tpu_ext.backends.keras.architectures.base` (inputs ``token_ids`` / ``padding_mask`` /
``mask_positions``, logits ``[B, P, V]`` in the compute dtype, the decoder tied to the token embedding).
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import layers, ops

from hf_tpu_ext.backends.keras.architectures import modernbert_config as mc
from hf_tpu_ext.backends.keras.architectures.attention import attend, describe_paths
from hf_tpu_ext.backends.keras.architectures.base import Architecture
from hf_tpu_ext.backends.keras.architectures.layouts import attribute, placed_value, variable_numpy
from hf_tpu_ext.backends.keras.architectures.lazy_state import LazyState
from hf_tpu_ext.backends.keras.architectures.remat import call_layer
from hf_tpu_ext.backends.keras.architectures.rotary import apply_rope, inverse_frequencies, rope_tables
from hf_tpu_ext.errors import CheckpointError


def _init(config, out: bool = False):
    """transformers' ``_init_weights``: truncated normal at ``initializer_cutoff_factor`` sigmas, std
    ``initializer_range`` ("in", embeddings) or ``initializer_range / sqrt(2 num_hidden_layers)`` ("out": ``Wo``s,
    ``head.dense``). Keras' TruncatedNormal cuts at 2 sigmas, transformers' default cutoff factor."""
    std = float(config.initializer_range)
    if out:
        std /= math.sqrt(2.0 * int(config.num_hidden_layers))
    return keras.initializers.TruncatedNormal(stddev=std)


def _norm(config, name: str, policy):
    return layers.LayerNormalization(epsilon=float(config.norm_eps), center=bool(config.norm_bias), dtype=policy,
                                     name=name)


def _activation(name: str):
    approximate = mc.ACTIVATIONS[name]
    return lambda x: keras.activations.gelu(x, approximate=approximate)


class ModernBertAttention(layers.Layer):
    """Fused-QKV self-attention with RoPE (module doc). Call: ``(x [B, L, H], padding bool [B, L] (True: real key),
    rope (cos, sin) float32 [L, head_dim], half_window=int or None (global))`` -> ``[B, L, H]``."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.hidden, self.heads = int(config.hidden_size), int(config.num_attention_heads)
        self.head_dim = self.hidden // self.heads
        self.probability_dropout = float(config.attention_dropout)
        bias = bool(config.attention_bias)
        self.Wqkv = layers.Dense(3 * self.hidden, use_bias=bias, kernel_initializer=_init(config), dtype=policy,
                                 name="Wqkv")
        self.Wo = layers.Dense(self.hidden, use_bias=bias, kernel_initializer=_init(config, out=True), dtype=policy,
                               name="Wo")
        self.attention_probs_dropout = layers.Dropout(self.probability_dropout, dtype=policy,
                                                      name="attention_probs_dropout")
        self.out_drop = layers.Dropout(self.probability_dropout, dtype=policy, name="out_drop")

    def build(self, input_shape):
        self.Wqkv.build(input_shape)
        self.Wo.build(input_shape)
        self.built = True

    def call(self, x, padding, rope, half_window=None, training=False, segment_ids=None):
        length = x.shape[1]
        qkv = ops.reshape(self.Wqkv(x), (-1, length, 3, self.heads, self.head_dim))
        query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        query, key = apply_rope(query, rope), apply_rope(key, rope)  # float32 inside, back to the compute dtype
        scale = self.head_dim ** -0.5
        attended = attend(query, key, value, None, self.attention_probs_dropout, training, scale,
                          key_padding=padding, half_window=half_window, segment_ids=segment_ids)
        attended = ops.reshape(attended, (-1, length, self.hidden))
        return self.out_drop(self.Wo(attended), training=training)


class ModernBertMLP(layers.Layer):
    """GeGLU: ``Wo(drop(act(a) * g))``, ``a, g = split(Wi(x), 2)``. Call: ``[B, L, H]`` -> ``[B, L, H]``."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.hidden, self.intermediate = int(config.hidden_size), int(config.intermediate_size)
        bias = bool(config.mlp_bias)
        self.act = _activation(config.hidden_activation)
        self.Wi = layers.Dense(2 * self.intermediate, use_bias=bias, kernel_initializer=_init(config), dtype=policy,
                               name="Wi")
        self.drop = layers.Dropout(float(config.mlp_dropout), dtype=policy, name="drop")
        self.Wo = layers.Dense(self.hidden, use_bias=bias, kernel_initializer=_init(config, out=True), dtype=policy,
                               name="Wo")

    def build(self, input_shape):
        self.Wi.build(input_shape)
        self.Wo.build(tuple(input_shape[:-1]) + (self.intermediate,))
        self.built = True

    def call(self, x, training=False):
        projected = self.Wi(x)
        gated = self.act(projected[..., :self.intermediate]) * projected[..., self.intermediate:]
        return self.Wo(self.drop(gated, training=training))


class ModernBertEncoderLayer(layers.Layer):
    """Pre-LN layer ``i`` (module doc); ``attn_norm`` is None on layer 0. Call: ``(x [B, L, H], padding [B, L], rope,
    half_window=int or None)``."""

    def __init__(self, config, layer_id: int, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.attention_type = mc.layer_types(config)[layer_id]
        self.attn_norm = _norm(config, "attn_norm", policy) if layer_id > 0 else None
        self.attn = ModernBertAttention(config, dtype=policy, name="attn")
        self.mlp_norm = _norm(config, "mlp_norm", policy)
        self.mlp = ModernBertMLP(config, dtype=policy, name="mlp")

    def build(self, input_shape):
        for layer in (self.attn_norm, self.attn, self.mlp_norm, self.mlp):
            if layer is not None:
                layer.build(input_shape)
        self.built = True

    def call(self, x, padding, rope, half_window=None, training=False, segment_ids=None):
        normed = x if self.attn_norm is None else self.attn_norm(x)
        x = x + self.attn(normed, padding, rope, half_window=half_window, training=training, segment_ids=segment_ids)
        return x + self.mlp(self.mlp_norm(x), training=training)


class ModernBertEmbeddings(layers.Layer):
    """``drop(norm(tok_embeddings(ids)))``. Call: ``token_ids int [B, L]`` -> ``[B, L, H]``."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.tok_embeddings = layers.Embedding(int(config.vocab_size), int(config.hidden_size),
                                               embeddings_initializer=_init(config), dtype=policy,
                                               name="tok_embeddings")
        self.norm = _norm(config, "norm", policy)
        self.drop = layers.Dropout(float(config.embedding_dropout), dtype=policy, name="drop")
        self.hidden = int(config.hidden_size)

    def build(self, input_shape=None):
        self.tok_embeddings.build((None, None))
        self.norm.build((None, None, self.hidden))
        self.built = True

    def call(self, token_ids, training=False):
        return self.drop(self.norm(self.tok_embeddings(token_ids)), training=training)


class ModernBertBackbone(layers.Layer):
    """transformers' ``ModernBertModel``: embeddings, ``num_hidden_layers`` encoder layers, ``final_norm``.

    Call: ``(token_ids int [B, L], padding_mask int/bool [B, L], segment_ids=None, position_ids=None)`` -> ``[B, L,
    H]``: positions ``0..L-1``, or ``position_ids`` int ``[B, L]`` (packed documents: from 0 in each); with
    ``segment_ids`` int ``[B, L]`` a token attends only within its segment.
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.hidden, self.half_window = int(config.hidden_size), mc.half_window(config)
        head_dim = self.hidden // int(config.num_attention_heads)
        # transformers' default RoPE, one inv_freq per attention type
        self.inv_freq = {kind: inverse_frequencies(theta, head_dim) for kind, theta in mc.rope_thetas(config).items()}
        self.embeddings = ModernBertEmbeddings(config, dtype=policy, name="embeddings")
        self.encoder_layers = [ModernBertEncoderLayer(config, i, dtype=policy, name=f"layers_{i}")
                               for i in range(int(config.num_hidden_layers))]
        self.final_norm = _norm(config, "final_norm", policy)

    def build(self, input_shape=None):
        self.embeddings.build()
        for layer in self.encoder_layers:
            layer.build((None, None, self.hidden))
        self.final_norm.build((None, None, self.hidden))
        self.built = True

    def call(self, token_ids, padding_mask, training=False, segment_ids=None, position_ids=None):
        length = token_ids.shape[1]
        x = self.embeddings(token_ids, training=training)
        padding = ops.cast(padding_mask, "bool")  # [B, L]: a query attends to real keys
        windows = {mc.FULL: None, mc.SLIDING: self.half_window}
        kinds = {layer.attention_type for layer in self.encoder_layers}
        dropout = bool(training and self.encoder_layers[0].attn.probability_dropout > 0)
        describe_paths(length, {("global" if k == mc.FULL else "local"): windows[k] for k in sorted(kinds)},
                       keras.backend.standardize_dtype(x.dtype), dropout)
        ropes = {kind: rope_tables(self.inv_freq[kind], length, position_ids) for kind in self.inv_freq}
        for layer in self.encoder_layers:
            kind = layer.attention_type
            x = call_layer(layer, x, padding, ropes[kind], half_window=windows[kind], training=training,
                           segment_ids=segment_ids)  # remat with --gradient_checkpointing
        return self.final_norm(x)


class ModernBertPredictionHead(layers.Layer):
    """``norm(act(dense(x)))``. Call: ``[B, P, H]`` -> ``[B, P, H]``."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.hidden = int(config.hidden_size)
        self.act = _activation(config.classifier_activation)
        self.dense = layers.Dense(self.hidden, use_bias=bool(config.classifier_bias),
                                  kernel_initializer=_init(config, out=True), dtype=policy, name="dense")
        self.norm = _norm(config, "norm", policy)

    def build(self, input_shape=None):
        self.dense.build((None, None, self.hidden))
        self.norm.build((None, None, self.hidden))
        self.built = True

    def call(self, x):
        return self.norm(self.act(self.dense(x)))


class ModernBertMaskedLM(keras.Model):
    """The masked LM: ``backbone`` (:class:`ModernBertBackbone`), ``head`` (:class:`ModernBertPredictionHead`) at
    ``mask_positions`` and the decoder tied to ``backbone.embeddings.tok_embeddings`` (plus ``decoder_bias``
    ``[V]`` when ``config.decoder_bias``). Built on construction; ``model.config`` is ``config``.

    Call: ``{"token_ids" int [B, L], "padding_mask" int [B, L], "mask_positions" int [B, P]}`` -> ``[B, P, V]``;
    optional ``"segment_ids"`` / ``"position_ids"`` int ``[B, L]`` (packed documents, :class:`ModernBertBackbone`).
    """

    def __init__(self, config, dtype=None, name: str = "modernbert_masked_lm", **kwargs):
        super().__init__(dtype=dtype, name=name, **kwargs)
        policy = self.dtype_policy
        self.config = config
        self.backbone = ModernBertBackbone(config, dtype=policy, name="model")
        self.head = ModernBertPredictionHead(config, dtype=policy, name="head")
        self.backbone.build()
        self.head.build()
        self.decoder_bias = (self.add_weight(shape=(int(config.vocab_size),), initializer="zeros",
                                             name="decoder_bias") if config.decoder_bias else None)
        self.built = True

    def call(self, inputs, training=False):
        x = self.backbone(inputs["token_ids"], inputs["padding_mask"], training=training,
                          segment_ids=inputs.get("segment_ids"), position_ids=inputs.get("position_ids"))
        index = ops.expand_dims(ops.cast(inputs["mask_positions"], "int32"), axis=-1)
        x = self.head(ops.take_along_axis(x, index, axis=1))
        embeddings = self.backbone.embeddings.tok_embeddings.embeddings
        logits = ops.matmul(x, ops.transpose(ops.cast(embeddings, x.dtype)))
        if self.decoder_bias is not None:
            logits = logits + ops.cast(self.decoder_bias, x.dtype)
        return logits


def build(config, dtype: str = "float32") -> ModernBertMaskedLM:
    """A new :class:`ModernBertMaskedLM` of ``config`` (transformers' initialization; seeded by Keras' global seed).

    Raises:
        CheckpointError: :func:`modernbert_config.check_config` refuses the config (the field named).
    """
    mc.check_config(config)
    return ModernBertMaskedLM(config, dtype=dtype)


def state_dict(model, config=None):
    """The weights under ``ModernBertForMaskedLM.state_dict()`` names (float32, C-contiguous, ``decoder.weight``
    left out as ``save_pretrained`` does for the tie). ``{name: np.ndarray}``."""
    config = model.config if config is None else config
    out = LazyState()  # each array made when read (an export: one at a time)
    for hf_name, path, kind in mc.name_table(config):
        var = attribute(model, path)
        shape = tuple(var.shape)[::-1] if kind == mc.LINEAR else tuple(var.shape)

        def make(var=var, kind=kind):
            array = variable_numpy(var)  # float32, gathered with no copy left inside a jax.Array
            return np.ascontiguousarray(array.T if kind == mc.LINEAR else array)
        out.defer(hf_name, shape, make)
    return out


def assign(model, state, config=None) -> None:
    """Set ``model``'s weights from a ``ModernBertForMaskedLM`` state dict (arrays or tensors, any float dtype).

    Every weight is checked before any is written, so a refusal leaves the model as it was. A state without the
    head (``head.*``, ``decoder.bias``: a ``ModernBertModel`` checkpoint) keeps the head's initialization, with a
    warning.

    Raises:
        CheckpointError: a backbone weight is missing, or a shape differs (both named).
    """
    config = model.config if config is None else config
    updates, head_missing = [], []
    for hf_name, path, kind in mc.name_table(config):
        if hf_name not in state:
            if hf_name.startswith(("head.", "decoder.")):
                head_missing.append(hf_name)
                continue
            raise CheckpointError(f"The checkpoint has no {hf_name!r}: it is not a ModernBertForMaskedLM of this "
                                  "config (check num_hidden_layers and the *_bias flags).")
        variable = attribute(model, path)
        placed = placed_value(state[hf_name], kind, variable)  # --fsdp: read by blocks onto its sharding
        if placed is not None:
            updates.append((variable, placed))
            continue
        array = np.asarray(state[hf_name], dtype=np.float32)
        array = array.T if kind == mc.LINEAR else array
        if tuple(array.shape) != tuple(variable.shape):
            raise CheckpointError(f"{hf_name!r} has shape {tuple(np.shape(state[hf_name]))}; this config needs "
                                  f"{tuple(reversed(variable.shape)) if kind == mc.LINEAR else tuple(variable.shape)}.")
        updates.append((variable, array))
    if head_missing:
        mc.logger.warning("The checkpoint has no masked-LM head (%s): the head keeps its initialization.",
                          ", ".join(head_missing))
    for variable, array in updates:
        variable.assign(array)


ARCHITECTURE = Architecture(name="modernbert", build=build, check_config=mc.check_config, state_dict=state_dict,
                            assign=assign)
