"""RoBERTa masked LM from Keras 3 layers only: the Keras backend's training model, no keras-hub, no TensorFlow.

Why not keras-hub's ``RobertaMaskedLM``: keras-hub requires ``tensorflow-text`` (so TensorFlow) and importing it
imports TensorFlow beside JAX. This is the same computation as keras-hub's ``RobertaBackbone`` +
``MaskedLMHead`` and transformers' ``RobertaForMaskedLM`` (post-LN, exact GELU, LayerNorm epsilon 1e-5, the
output projection tied to the token embedding), built from ``keras.layers`` (``Embedding``,
``MultiHeadAttention``, ``Dense``, ``LayerNormalization``, ``Dropout``), so the Keras backend's step
(``stateless_call``, the counter-based dropout of ``dropout.py`` and the erf GELU of ``gelu.py``, which patch
the Keras backend functions these layers call) runs it unchanged. ``hf_convert.py``'s one name table maps its
variables to transformers names (and keras-hub's, for the optional preset).

Positions: real token ``i`` (0-based, right-padded batches) reads row ``i`` of ``backbone.position_embeddings``
(``[max_sequence_length, hidden]``); transformers' RoBERTa reads row ``i + pad_token_id + 1`` of its table (the
position offset), so the converters shift the table by ``pad_token_id + 1`` rows (``hf_convert.position_offset``),
as they do for keras-hub, whose layout this is.

Inputs: ``{"token_ids": int [B, L], "padding_mask": int/bool [B, L], "mask_positions": int [B, P]}``;
output: logits ``[B, P, vocabulary_size]`` in the compute dtype (bfloat16 under ``mixed_bfloat16``; variables
float32). Every layer is named, so variable paths (``roberta_backbone/transformer_layer_0/self_attention/query/
kernel``, ...) are the same in every process (checkpoints key trainable variables by path).
"""

from __future__ import annotations

from typing import Optional

import keras
from keras import layers, ops

#: keras-hub's and transformers' default RoBERTa LayerNorm epsilon
LAYER_NORM_EPSILON = 1e-5


def _initializer():
    # keras-hub's and transformers' initializer_range; seeded by Keras' global seed (model.build_masked_lm)
    return keras.initializers.TruncatedNormal(stddev=0.02)


class RobertaLayer(layers.Layer):
    """One post-LN transformer encoder layer: ``LN(x + Dropout(MHA(x)))``, then ``LN(x + Dropout(W2 gelu(W1 x)))``.

    Args:
        num_heads: attention heads (``hidden_dim % num_heads == 0``).
        hidden_dim: model width ``H``.
        intermediate_dim: feed-forward width.
        dropout: rate after the attention output and the feed-forward output (transformers' hidden_dropout_prob).
        attention_dropout: rate on the attention probabilities (attention_probs_dropout_prob).

    Call: ``(x float [B, L, H], attention_mask bool [B, 1, L])`` -> ``[B, L, H]``.
    """

    def __init__(self, num_heads: int, hidden_dim: int, intermediate_dim: int, dropout: float,
                 attention_dropout: float, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.hidden_dim = int(hidden_dim)
        self.self_attention = layers.MultiHeadAttention(
            num_heads=int(num_heads), key_dim=int(hidden_dim) // int(num_heads), dropout=float(attention_dropout),
            kernel_initializer=_initializer(), dtype=policy, name="self_attention")
        self.self_attention_dropout = layers.Dropout(float(dropout), dtype=policy, name="self_attention_dropout")
        self.self_attention_layer_norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype=policy,
                                                                   name="self_attention_layer_norm")
        self.intermediate_dense = layers.Dense(int(intermediate_dim), activation="gelu",
                                               kernel_initializer=_initializer(), dtype=policy,
                                               name="feedforward_intermediate_dense")
        self.output_dense = layers.Dense(int(hidden_dim), kernel_initializer=_initializer(), dtype=policy,
                                         name="feedforward_output_dense")
        self.output_dropout = layers.Dropout(float(dropout), dtype=policy, name="feedforward_dropout")
        self.output_layer_norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype=policy,
                                                           name="feedforward_layer_norm")

    def build(self, input_shape):
        self.self_attention.build(input_shape, input_shape)
        self.self_attention_layer_norm.build(input_shape)
        self.intermediate_dense.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dense.units,))
        self.output_layer_norm.build(input_shape)
        self.built = True

    def call(self, x, attention_mask=None, training=False):
        attended = self.self_attention(x, x, attention_mask=attention_mask, training=training)
        x = self.self_attention_layer_norm(x + self.self_attention_dropout(attended, training=training))
        hidden = self.output_dense(self.intermediate_dense(x))
        return self.output_layer_norm(x + self.output_dropout(hidden, training=training))


class RobertaBackbone(layers.Layer):
    """Token + position embeddings, LayerNorm, dropout and ``num_layers`` :class:`RobertaLayer`.

    Attributes (keras-hub's ``RobertaBackbone`` names, read by ``export.py``): ``vocabulary_size``,
    ``num_layers``, ``num_heads``, ``hidden_dim``, ``intermediate_dim``, ``dropout``, ``max_sequence_length``,
    ``token_embedding`` (``keras.layers.Embedding``), ``position_embeddings`` (variable ``[max_sequence_length,
    H]``), ``embeddings_layer_norm``, ``transformer_layers``.

    Call: ``(token_ids int [B, L], padding_mask [B, L])`` -> ``[B, L, H]`` (``L <= max_sequence_length``).
    """

    def __init__(self, vocabulary_size: int, num_layers: int, num_heads: int, hidden_dim: int, intermediate_dim: int,
                 max_sequence_length: int, dropout: float = 0.1, attention_dropout: Optional[float] = None, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.vocabulary_size, self.num_layers, self.num_heads = int(vocabulary_size), int(num_layers), int(num_heads)
        self.hidden_dim, self.intermediate_dim = int(hidden_dim), int(intermediate_dim)
        self.max_sequence_length, self.dropout = int(max_sequence_length), float(dropout)
        self.attention_dropout = float(dropout if attention_dropout is None else attention_dropout)
        self.token_embedding = layers.Embedding(self.vocabulary_size, self.hidden_dim,
                                                embeddings_initializer=_initializer(), dtype=policy,
                                                name="token_embedding")
        self.embeddings_layer_norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype=policy,
                                                               name="embeddings_layer_norm")
        self.embeddings_dropout = layers.Dropout(self.dropout, dtype=policy, name="embeddings_dropout")
        self.transformer_layers = [
            RobertaLayer(self.num_heads, self.hidden_dim, self.intermediate_dim, self.dropout, self.attention_dropout,
                         dtype=policy, name=f"transformer_layer_{i}")
            for i in range(self.num_layers)]

    def build(self, input_shape=None):
        self.token_embedding.build((None, None))
        self.position_embeddings = self.add_weight(shape=(self.max_sequence_length, self.hidden_dim),
                                                   initializer=_initializer(), name="position_embeddings")
        hidden_shape = (None, None, self.hidden_dim)
        self.embeddings_layer_norm.build(hidden_shape)
        for layer in self.transformer_layers:
            layer.build(hidden_shape)
        self.built = True

    def call(self, token_ids, padding_mask, training=False):
        length = token_ids.shape[1]
        positions = ops.cast(self.position_embeddings[:length], self.compute_dtype)
        x = self.token_embedding(token_ids) + positions[None]
        x = self.embeddings_dropout(self.embeddings_layer_norm(x), training=training)
        # keras-hub's padding mask: a query attends to the real keys only ([B, 1, L], broadcast over queries)
        attention_mask = ops.expand_dims(ops.cast(padding_mask, "bool"), axis=1)
        for layer in self.transformer_layers:
            x = layer(x, attention_mask=attention_mask, training=training)
        return x


class RobertaMaskedLMHead(layers.Layer):
    """transformers' ``RobertaLMHead`` at given positions: ``LN(gelu(dense(x))) @ E^T + bias``.

    ``E`` (the token embedding, ``[V, H]``) is passed to :meth:`call`, not held, so the tie is one variable.

    Call: ``(x [B, L, H], mask_positions int [B, P], embeddings [V, H])`` -> logits ``[B, P, V]``.
    """

    def __init__(self, vocabulary_size: int, hidden_dim: int, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.vocabulary_size, self.hidden_dim = int(vocabulary_size), int(hidden_dim)
        self.dense = layers.Dense(self.hidden_dim, activation="gelu", kernel_initializer=_initializer(),
                                  dtype=policy, name="dense")
        self.layer_norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype=policy, name="layer_norm")

    def build(self, input_shape=None):
        self.dense.build((None, None, self.hidden_dim))
        self.layer_norm.build((None, None, self.hidden_dim))
        self.bias = self.add_weight(shape=(self.vocabulary_size,), initializer="zeros", name="bias")
        self.built = True

    def call(self, x, mask_positions, embeddings):
        index = ops.expand_dims(ops.cast(mask_positions, "int32"), axis=-1)
        x = ops.take_along_axis(x, index, axis=1)
        x = self.layer_norm(self.dense(x))
        logits = ops.matmul(x, ops.transpose(ops.cast(embeddings, x.dtype)))
        return logits + ops.cast(self.bias, x.dtype)


class RobertaMaskedLM(keras.Model):
    """The masked LM: ``backbone`` (:class:`RobertaBackbone`) and ``masked_lm_head`` (:class:`RobertaMaskedLMHead`),
    built on construction (``stateless_call`` needs no first call).

    Args: as :class:`RobertaBackbone`, plus ``dtype`` (a Keras dtype policy name) and ``name``.

    Call: ``{"token_ids", "padding_mask", "mask_positions"}`` (module doc) -> logits ``[B, P, V]``.
    """

    def __init__(self, vocabulary_size: int, num_layers: int, num_heads: int, hidden_dim: int, intermediate_dim: int,
                 max_sequence_length: int, dropout: float = 0.1, attention_dropout: Optional[float] = None,
                 dtype=None, name: str = "roberta_masked_lm", **kwargs):
        super().__init__(dtype=dtype, name=name, **kwargs)
        policy = self.dtype_policy
        self.backbone = RobertaBackbone(vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim,
                                        max_sequence_length, dropout, attention_dropout, dtype=policy,
                                        name="roberta_backbone")
        self.masked_lm_head = RobertaMaskedLMHead(vocabulary_size, hidden_dim, dtype=policy, name="mlm_head")
        self.backbone.build()
        self.masked_lm_head.build()
        self.built = True

    def call(self, inputs, training=False):
        x = self.backbone(inputs["token_ids"], inputs["padding_mask"], training=training)
        return self.masked_lm_head(x, inputs["mask_positions"], self.backbone.token_embedding.embeddings)
