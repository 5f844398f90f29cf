"""A post-LN transformer encoder masked LM from Keras 3 layers: the layers BERT, DistilBERT and RoBERTa share.

BERT (transformers' ``BertForMaskedLM``), DistilBERT (``DistilBertForMaskedLM``) and RoBERTa
(``RobertaForMaskedLM``, XLM-RoBERTa, CamemBERT) compute the same thing up to names, token-type embeddings, one
dropout and where transformers numbers positions from (RoBERTa's offset lives in its name table): absolute
learned positions numbered from 0, post-LN layers ``LN(x + Dropout(Attention(x)))`` then
``LN(x + Dropout(W2 gelu(W1 x)))``, exact GELU, and a head ``LN(gelu(dense(x))) @ E^T + bias`` tied to the word
embeddings ``E``. :class:`EncoderMaskedLM` is that model; an architecture module (``bert.py``, ``distilbert.py``,
``roberta.py``) builds it from its transformers config and owns the name table mapping its variables to the
transformers names.

Model contract: :mod:`.base` (inputs ``token_ids``/``padding_mask``/``mask_positions``, logits ``[B, P, V]`` in
the compute dtype, every layer named, ``Dropout``/``gelu``/``EinsumDense``/``Dense`` so the step's counter-based
dropout, erf GELU and bf16 dots patch them).

Attention runs through ``keras.ops.dot_product_attention`` (:func:`.attention.attend`), the padding mask as its
``mask`` (``True`` = a real key), except when the attention-probability dropout must run (that module's doc).

Imported only on the Keras backend, after the framework starts.
"""

from __future__ import annotations

from typing import Dict, List

import keras
from keras import layers, ops

from hf_tpu_ext.backends.keras.architectures.attention import attend, segment_mask
from hf_tpu_ext.backends.keras.architectures.layouts import LINEAR, OUT_KERNEL, QKV_BIAS, QKV_KERNEL, SAME
from hf_tpu_ext.backends.keras.architectures.name_table import Row
from hf_tpu_ext.backends.keras.architectures.remat import call_layer


def _initializer():
    # transformers' initializer_range default (BERT, DistilBERT); seeded by Keras' global seed
    return keras.initializers.TruncatedNormal(stddev=0.02)


class SelfAttention(layers.Layer):
    """Multi-head self-attention: ``EinsumDense`` query/key/value ``[H] -> [heads, head_dim]``, softmax attention
    scaled by ``1 / sqrt(head_dim)``, ``EinsumDense`` output ``[heads, head_dim] -> [H]``.

    The attention itself is :func:`.attention.attend` (``keras.ops.dot_product_attention``, or the written-out
    math with dropout on the probabilities while training with ``attention_dropout > 0``; its module doc says which
    implementation runs on CPU, GPU and TPU).

    Args:
        num_heads: heads (``hidden_dim % num_heads == 0``).
        hidden_dim: model width ``H``.
        attention_dropout: rate on the attention probabilities.

    Call: ``(x [B, L, H], attention_mask bool [B, 1, 1, L] (True = a real key), training)`` -> ``[B, L, H]``.
    """

    def __init__(self, num_heads: int, hidden_dim: int, attention_dropout: float, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.num_heads, self.hidden_dim = int(num_heads), int(hidden_dim)
        self.head_dim = self.hidden_dim // self.num_heads
        # one initializer each: a Keras initializer instance draws the same values at every call, so a shared
        # one would start query, key and value equal
        self.query, self.key, self.value = (
            layers.EinsumDense("btd,dnh->btnh", output_shape=(None, self.num_heads, self.head_dim), bias_axes="nh",
                               kernel_initializer=_initializer(), dtype=policy, name=name)
            for name in ("query", "key", "value"))
        self.output_dense = layers.EinsumDense("btnh,nhd->btd", output_shape=(None, self.hidden_dim), bias_axes="d",
                                               kernel_initializer=_initializer(), dtype=policy, name="output_dense")
        self.probs_dropout = layers.Dropout(float(attention_dropout), dtype=policy, name="attention_probs_dropout")

    def build(self, input_shape):
        for projection in (self.query, self.key, self.value):
            projection.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.num_heads, self.head_dim))
        self.built = True

    def call(self, x, attention_mask, training=False):
        attended = attend(self.query(x), self.key(x), self.value(x), attention_mask, self.probs_dropout, training)
        return self.output_dense(attended)


class PostLNEncoderLayer(layers.Layer):
    """``y = LN(x + Dropout_a(Attention(x)))``, then ``LN(y + Dropout(W2 gelu(W1 y)))``.

    Args:
        num_heads, hidden_dim: as :class:`SelfAttention`.
        intermediate_dim: feed-forward width.
        dropout: rate after the feed-forward output (BERT's ``hidden_dropout_prob``, DistilBERT's ``dropout``).
        attention_dropout: rate on the attention probabilities.
        attention_output_dropout: rate after the attention output (BERT: ``hidden_dropout_prob``; DistilBERT
            has none there: 0).
        layer_norm_epsilon: both LayerNorms' epsilon.

    Call: ``(x [B, L, H], attention_mask bool [B, 1, 1, L], training)`` -> ``[B, L, H]``.
    """

    def __init__(self, num_heads: int, hidden_dim: int, intermediate_dim: int, dropout: float,
                 attention_dropout: float, attention_output_dropout: float, layer_norm_epsilon: float, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.attention = SelfAttention(num_heads, hidden_dim, attention_dropout, dtype=policy, name="attention")
        self.attention_dropout = layers.Dropout(float(attention_output_dropout), dtype=policy,
                                                name="attention_output_dropout")
        self.attention_layer_norm = layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy,
                                                              name="attention_layer_norm")
        self.intermediate_dense = layers.Dense(int(intermediate_dim), activation="gelu",
                                               kernel_initializer=_initializer(), dtype=policy,
                                               name="intermediate_dense")
        self.output_dense = layers.Dense(int(hidden_dim), kernel_initializer=_initializer(), dtype=policy,
                                         name="output_dense")
        self.output_dropout = layers.Dropout(float(dropout), dtype=policy, name="output_dropout")
        self.output_layer_norm = layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy,
                                                           name="output_layer_norm")

    def build(self, input_shape):
        self.attention.build(input_shape)
        self.attention_layer_norm.build(input_shape)
        self.intermediate_dense.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dense.units,))
        self.output_layer_norm.build(input_shape)
        self.built = True

    def call(self, x, attention_mask, training=False):
        attended = self.attention(x, attention_mask, training=training)
        x = self.attention_layer_norm(x + self.attention_dropout(attended, training=training))
        hidden = self.output_dense(self.intermediate_dense(x))
        return self.output_layer_norm(x + self.output_dropout(hidden, training=training))


class Embeddings(layers.Layer):
    """``Dropout(LN(word[ids] + position[i] + token_type[0]))``: positions numbered from 0 (absolute), every token
    of type 0 (the trainer's batches have no segments).

    ``token_type_embeddings`` (``[type_vocab_size, H]``) exists when ``type_vocab_size > 0`` (BERT) so an
    import/export round-trips every row; DistilBERT has none (0).

    Call: ``(token_ids int [B, L], training, position_ids=None)`` -> ``[B, L, H]`` (``L <= max_position_embeddings``);
    ``position_ids`` int ``[B, L]``: the table rows to read (packed documents), else ``0..L-1``.
    """

    def __init__(self, vocabulary_size: int, hidden_dim: int, max_position_embeddings: int, type_vocab_size: int,
                 layer_norm_epsilon: float, dropout: float, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.hidden_dim, self.max_position_embeddings = int(hidden_dim), int(max_position_embeddings)
        self.type_vocab_size = int(type_vocab_size)
        self.word_embeddings = layers.Embedding(int(vocabulary_size), self.hidden_dim,
                                                embeddings_initializer=_initializer(), dtype=policy,
                                                name="word_embeddings")
        self.layer_norm = layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy, name="layer_norm")
        self.dropout = layers.Dropout(float(dropout), dtype=policy, name="embeddings_dropout")

    def build(self, input_shape=None):
        self.word_embeddings.build((None, None))
        self.position_embeddings = self.add_weight(shape=(self.max_position_embeddings, self.hidden_dim),
                                                   initializer=_initializer(), name="position_embeddings")
        self.token_type_embeddings = None
        if self.type_vocab_size:
            self.token_type_embeddings = self.add_weight(shape=(self.type_vocab_size, self.hidden_dim),
                                                         initializer=_initializer(), name="token_type_embeddings")
        self.layer_norm.build((None, None, self.hidden_dim))
        self.built = True

    def call(self, token_ids, training=False, position_ids=None):
        length = token_ids.shape[1]
        if position_ids is None:
            x = self.word_embeddings(token_ids) + ops.cast(self.position_embeddings[:length], self.compute_dtype)[None]
        else:
            rows = ops.take(self.position_embeddings, ops.cast(position_ids, "int32"), axis=0)
            x = self.word_embeddings(token_ids) + ops.cast(rows, self.compute_dtype)
        if self.token_type_embeddings is not None:
            x = x + ops.cast(self.token_type_embeddings[0], self.compute_dtype)
        return self.dropout(self.layer_norm(x), training=training)


class MaskedLMHead(layers.Layer):
    """The prediction head at given positions: ``LN(gelu(dense(x))) @ E^T + bias``.

    ``E`` (the word embeddings ``[V, H]``) is passed to :meth:`call`, not held, so the tie is one variable.

    Call: ``(x [B, L, H], mask_positions int [B, P], embeddings [V, H])`` -> logits ``[B, P, V]``.
    """

    def __init__(self, vocabulary_size: int, hidden_dim: int, layer_norm_epsilon: float, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.vocabulary_size, self.hidden_dim = int(vocabulary_size), int(hidden_dim)
        self.dense = layers.Dense(self.hidden_dim, activation="gelu", kernel_initializer=_initializer(),
                                  dtype=policy, name="dense")
        self.layer_norm = layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy, name="layer_norm")

    def build(self, input_shape=None):
        self.dense.build((None, None, self.hidden_dim))
        self.layer_norm.build((None, None, self.hidden_dim))
        self.bias = self.add_weight(shape=(self.vocabulary_size,), initializer="zeros", name="bias")
        self.built = True

    def call(self, x, mask_positions, embeddings):
        index = ops.expand_dims(ops.cast(mask_positions, "int32"), axis=-1)
        x = self.layer_norm(self.dense(ops.take_along_axis(x, index, axis=1)))
        logits = ops.matmul(x, ops.transpose(ops.cast(embeddings, x.dtype)))
        return logits + ops.cast(self.bias, x.dtype)


class EncoderMaskedLM(keras.Model):
    """:class:`Embeddings`, ``num_layers`` :class:`PostLNEncoderLayer` (``encoder_layers``) and
    :class:`MaskedLMHead` (``masked_lm_head``) tied to ``embeddings.word_embeddings``; built on construction.

    Args:
        vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim, max_position_embeddings,
        type_vocab_size (0: none), layer_norm_epsilon, dropout, attention_dropout, attention_output_dropout:
            see the layers above.
        dtype: a Keras dtype policy name (``"float32"``, ``"mixed_bfloat16"``); ``name``: the model's name.

    Call: ``{"token_ids": int [B, L], "padding_mask": int [B, L] (1 = real), "mask_positions": int [B, P]}`` ->
    logits ``[B, P, V]`` in the compute dtype; optional ``"segment_ids"`` int ``[B, L]`` (packed documents: a
    token attends only within its segment) and ``"position_ids"`` int ``[B, L]`` (positions from 0 in each).

    ``legacy_paths``: ``((regular expression, replacement), ...)`` renaming an older checkpoint's variable paths to
    this model's (:func:`.name_table.renamed_paths`; the checkpoint restore applies it); none here, an
    architecture whose variables once had other paths sets it on the model it builds (``roberta.py``).
    """

    legacy_paths = ()

    def __init__(self, vocabulary_size: int, num_layers: int, num_heads: int, hidden_dim: int, intermediate_dim: int,
                 max_position_embeddings: int, type_vocab_size: int, layer_norm_epsilon: float, dropout: float,
                 attention_dropout: float, attention_output_dropout: float, dtype=None, name: str = "masked_lm",
                 **kwargs):
        super().__init__(dtype=dtype, name=name, **kwargs)
        policy = self.dtype_policy
        self.embeddings = Embeddings(vocabulary_size, hidden_dim, max_position_embeddings, type_vocab_size,
                                     layer_norm_epsilon, dropout, dtype=policy, name="embeddings")
        self.encoder_layers = [
            PostLNEncoderLayer(num_heads, hidden_dim, intermediate_dim, dropout, attention_dropout,
                               attention_output_dropout, layer_norm_epsilon, dtype=policy, name=f"encoder_layer_{i}")
            for i in range(int(num_layers))]
        self.masked_lm_head = MaskedLMHead(vocabulary_size, hidden_dim, layer_norm_epsilon, dtype=policy,
                                           name="mlm_head")
        self.embeddings.build()
        for layer in self.encoder_layers:
            layer.build((None, None, int(hidden_dim)))
        self.masked_lm_head.build()
        self.built = True

    def call(self, inputs, training=False):
        x = self.embeddings(inputs["token_ids"], training=training, position_ids=inputs.get("position_ids"))
        # a query attends to the real keys only: [B, 1 (heads), 1 (queries), L]; packed: and its segment's [B, 1, L, L]
        attention_mask = ops.cast(inputs["padding_mask"], "bool")[:, None, None, :]
        if inputs.get("segment_ids") is not None:
            attention_mask = segment_mask(inputs["padding_mask"], inputs["segment_ids"])
        for layer in self.encoder_layers:
            x = call_layer(layer, x, attention_mask, training=training)  # remat with --gradient_checkpointing
        return self.masked_lm_head(x, inputs["mask_positions"], self.embeddings.word_embeddings.embeddings)


#: the parts of :class:`EncoderMaskedLM` an architecture names: role -> (attribute path from the masked LM,
#: ``(weight attribute, layout)``, ``(bias attribute, layout)``); a part with no bias has ``None`` there.
#: ``"{i}"`` in a path is the encoder layer.
_KERNEL, _BIAS, _GAMMA, _BETA = ("kernel", LINEAR), ("bias", SAME), ("gamma", SAME), ("beta", SAME)
PARTS = {
    "word_embeddings": ("embeddings.word_embeddings", ("embeddings", SAME), None),
    "position_embeddings": ("embeddings", ("position_embeddings", SAME), None),
    "token_type_embeddings": ("embeddings", ("token_type_embeddings", SAME), None),
    "embeddings_norm": ("embeddings.layer_norm", _GAMMA, _BETA),
    "query": ("encoder_layers.{i}.attention.query", ("kernel", QKV_KERNEL), ("bias", QKV_BIAS)),
    "key": ("encoder_layers.{i}.attention.key", ("kernel", QKV_KERNEL), ("bias", QKV_BIAS)),
    "value": ("encoder_layers.{i}.attention.value", ("kernel", QKV_KERNEL), ("bias", QKV_BIAS)),
    "attention_output": ("encoder_layers.{i}.attention.output_dense", ("kernel", OUT_KERNEL), _BIAS),
    "attention_norm": ("encoder_layers.{i}.attention_layer_norm", _GAMMA, _BETA),
    "intermediate": ("encoder_layers.{i}.intermediate_dense", _KERNEL, _BIAS),
    "output": ("encoder_layers.{i}.output_dense", _KERNEL, _BIAS),
    "output_norm": ("encoder_layers.{i}.output_layer_norm", _GAMMA, _BETA),
    "head_dense": ("masked_lm_head.dense", _KERNEL, _BIAS),
    "head_norm": ("masked_lm_head.layer_norm", _GAMMA, _BETA),
    "head_bias": ("masked_lm_head", ("bias", SAME), None),
}


def name_table(names: Dict[str, str], num_layers: int, parts=None) -> List[Row]:
    """The rows (:mod:`.name_table`) of an :class:`EncoderMaskedLM` for an architecture's transformers names.

    Args:
        names: role of :data:`PARTS` -> the transformers module name (``"bert.encoder.layer.{i}.attention.self.
            query"``; ``.weight``/``.bias`` are appended) or, for a part with no bias, the full tensor name
            (``"cls.predictions.bias"``). A role left out has no variable in that architecture (DistilBERT's
            token types).
        num_layers: encoder layers (``{i}`` runs over ``range(num_layers)``).
        parts: the roles' attribute paths and layouts, :data:`PARTS` when ``None``; another model of the same
            computation gives its own (keras-hub's ``RobertaMaskedLM``: ``roberta.KERAS_HUB_PARTS``).

    Returns:
        ``[(transformers name, attribute path, layout)]`` (by role, then layer; the state dicts sort by name).
    """
    rows: List[Row] = []
    for role, (path, weight, bias) in (PARTS if parts is None else parts).items():
        if role not in names:
            continue
        for i in range(int(num_layers)) if "{i}" in path else (None,):
            module, hf = path.format(i=i), names[role].format(i=i)
            if bias is None:
                rows.append((hf, f"{module}.{weight[0]}", weight[1]))
                continue
            rows += [(f"{hf}.weight", f"{module}.{weight[0]}", weight[1]), (f"{hf}.bias", f"{module}.{bias[0]}", bias[1])]
    return rows
