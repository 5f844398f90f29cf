"""RoBERTa (also XLM-RoBERTa, CamemBERT) for the Keras backend: its Keras 3 layers, its transformers name table,
its FLOP count and its small default config, as one :class:`~.base.Architecture` (``ARCHITECTURE``).

Layers: the same computation as keras-hub's ``RobertaBackbone`` + ``MaskedLMHead`` and transformers'
``RobertaForMaskedLM`` (post-LN, exact GELU, LayerNorm epsilon 1e-5, the output projection tied to the token
embedding), built from ``keras.layers`` only (no keras-hub: it requires ``tensorflow-text``, so TensorFlow). The
Keras backend's step (``stateless_call``, the counter-based dropout of ``dropout.py``, the erf GELU of ``gelu.py``)
runs it unchanged. Every layer is named, so variable paths (``roberta_backbone/transformer_layer_0/
self_attention/query/kernel``, ...) are the same in every process.

Attention is :class:`.encoder.SelfAttention` (BERT's), so :func:`.attention.attend`
(``keras.ops.dot_product_attention``; its module doc says which implementation runs on CPU, GPU and TPU), under
the variable paths ``keras.layers.MultiHeadAttention`` gave them before (``self_attention/{query,key,value,
attention_output}/{kernel,bias}``): earlier checkpoints load unchanged. The head is :class:`.encoder.MaskedLMHead`.

Shape mapping from a transformers ``RobertaConfig`` (:func:`backbone_kwargs`): ``vocabulary_size = vocab_size``,
``num_layers = num_hidden_layers``, ``num_heads = num_attention_heads``, ``hidden_dim = hidden_size``,
``intermediate_dim = intermediate_size``, ``dropout = hidden_dropout_prob``, ``attention_dropout =
attention_probs_dropout_prob``, ``max_sequence_length = max_position_embeddings - (pad_token_id + 1)``.

Name table (:data:`EMBEDDING_TABLE`, :data:`BLOCK_TABLE`, :data:`HEAD_TABLE`): every variable of this module's
masked LM and of keras-hub's ``RobertaMaskedLM`` (the optional preset's model) with its ``RobertaForMaskedLM``
state-dict name and layout (:mod:`.layouts`), so export (:func:`state_dict`) and import (:func:`assign`) cannot
drift apart.

- Positions: transformers' RoBERTa numbers real tokens from ``padding_idx + 1`` (``pad_token_id + 1``: 2 for
  RoBERTa's ``<pad>``=1, ``create_position_ids_from_input_ids``); here (and in keras-hub) real token ``i`` of a
  right-padded batch reads row ``i``. Keras row ``i`` is transformers row ``i + pad_token_id + 1``
  (:func:`position_offset`); the first rows are written as zeros (only pad tokens read them).
- Token types: none here. transformers adds ``token_type_embeddings[0]`` to every token (ids default to 0), so on
  import that row is folded into every position row, and on export one zero row is written (``type_vocab_size=1``).

Both directions give equal logits at every non-pad position up to float32 rounding
(``tests/current/test_keras_export.py`` checks 1e-4).

Inputs/outputs: the contract of :mod:`.base` (logits ``[B, P, vocab_size]`` at ``mask_positions``).
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Dict, List, Optional, Tuple

import keras
import numpy as np
from keras import layers, ops

from hf_tpu_ext.backends.keras.architectures.attention import segment_mask
from hf_tpu_ext.backends.keras.architectures.base import Architecture
from hf_tpu_ext.backends.keras.architectures.encoder import MaskedLMHead, SelfAttention
from hf_tpu_ext.backends.keras.architectures.layouts import (LINEAR, OUT_KERNEL, QKV_BIAS, QKV_KERNEL, SAME,
                                                            attribute, from_hf, hf_shape, take, to_hf,
                                                            variable_numpy)
from hf_tpu_ext.backends.keras.architectures.name_table import normalized_names
from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.flops import flops_per_token as encoder_flops_per_token
from hf_tpu_ext.model_config import DEFAULT_SMALL_CONFIG

logger = logging.getLogger("hf_tpu_ext")

#: transformers model types whose ``*ForMaskedLM`` is RoBERTa's architecture under the ``roberta.`` prefix
TRANSFORMERS_CLASSES = {"roberta": "RobertaForMaskedLM", "xlm-roberta": "XLMRobertaForMaskedLM",
                        "camembert": "CamembertForMaskedLM"}
BASE_PREFIX = "roberta."
#: a bare ``RobertaModel``'s name prefixes (they get :data:`BASE_PREFIX` on import)
BARE_PREFIXES = ("embeddings.", "encoder.", "pooler.")

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

    Call: ``(x float [B, L, H], attention_mask bool [B, 1, 1, L] (True = a real key))`` -> ``[B, L, H]``.
    """

    def __init__(self, num_heads: int, hidden_dim: int, intermediate_dim: int, dropout: float,
                 attention_dropout: float, **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.hidden_dim = int(hidden_dim)
        # the attention every architecture here shares (.attention.attend); its variables keep the paths
        # keras.layers.MultiHeadAttention gave them (self_attention/{query,key,value,attention_output}/...)
        self.self_attention = SelfAttention(int(num_heads), int(hidden_dim), float(attention_dropout),
                                            output_name="attention_output", dtype=policy, name="self_attention")
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
        self.self_attention.build(input_shape)
        self.self_attention_layer_norm.build(input_shape)
        self.intermediate_dense.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dense.units,))
        self.output_layer_norm.build(input_shape)
        self.built = True

    def call(self, x, attention_mask=None, training=False):
        attended = self.self_attention(x, attention_mask, training=training)
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

    def call(self, token_ids, padding_mask, training=False, segment_ids=None, position_ids=None):
        length = token_ids.shape[1]
        if position_ids is None:
            positions = ops.cast(self.position_embeddings[:length], self.compute_dtype)
            x = self.token_embedding(token_ids) + positions[None]
        else:  # packed documents: from 0 in each (the table starts after RoBERTa's reserved rows)
            rows = ops.take(self.position_embeddings, ops.cast(position_ids, "int32"), axis=0)
            x = self.token_embedding(token_ids) + ops.cast(rows, self.compute_dtype)
        x = self.embeddings_dropout(self.embeddings_layer_norm(x), training=training)
        # a query attends to the real keys only: [B, 1 (heads), 1 (queries), L]; packed: and its segment's [B, 1, L, L]
        attention_mask = ops.cast(padding_mask, "bool")[:, None, None, :]
        if segment_ids is not None:
            attention_mask = segment_mask(padding_mask, segment_ids)
        for layer in self.transformer_layers:
            x = layer(x, attention_mask=attention_mask, training=training)
        return x


class RobertaMaskedLM(keras.Model):
    """The masked LM: ``backbone`` (:class:`RobertaBackbone`) and ``masked_lm_head`` (:class:`.encoder.MaskedLMHead`, the head BERT shares),
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
        self.masked_lm_head = MaskedLMHead(vocabulary_size, hidden_dim, LAYER_NORM_EPSILON, dtype=policy,
                                           name="mlm_head")
        self.backbone.build()
        self.masked_lm_head.build()
        self.built = True

    def call(self, inputs, training=False):
        x = self.backbone(inputs["token_ids"], inputs["padding_mask"], training=training,
                          segment_ids=inputs.get("segment_ids"), position_ids=inputs.get("position_ids"))
        return self.masked_lm_head(x, inputs["mask_positions"], self.backbone.token_embedding.embeddings)


# ------------------------------------------------------------------ the transformers name table
# (transformers name, keras-hub ``RobertaMaskedLM`` attribute path, this module's ``RobertaMaskedLM`` attribute path,
# layout kind). ``{i}`` is the encoder layer; block rows are relative to ``backbone.transformer_layers[i]``, the
# others to the masked LM.
EMBEDDING_TABLE = (
    ("roberta.embeddings.word_embeddings.weight", "backbone.token_embedding.embeddings",
     "backbone.token_embedding.embeddings", SAME),
    ("roberta.embeddings.LayerNorm.weight", "backbone.embeddings_layer_norm.gamma",
     "backbone.embeddings_layer_norm.gamma", SAME),
    ("roberta.embeddings.LayerNorm.bias", "backbone.embeddings_layer_norm.beta",
     "backbone.embeddings_layer_norm.beta", SAME),
)
BLOCK_TABLE = tuple(
    [(f"roberta.encoder.layer.{{i}}.attention.self.{n}.{w}", f"_self_attention_layer.{n}_dense.{k}",
      f"self_attention.{n}.{k}", kind)
     for n in ("query", "key", "value") for w, k, kind in (("weight", "kernel", QKV_KERNEL), ("bias", "bias", QKV_BIAS))]
    + [(f"roberta.encoder.layer.{{i}}.{hf}", hub, own, kind) for hf, hub, own, kind in (
        ("attention.output.dense.weight", "_self_attention_layer.output_dense.kernel",
         "self_attention.output_dense.kernel", OUT_KERNEL),
        ("attention.output.dense.bias", "_self_attention_layer.output_dense.bias",
         "self_attention.output_dense.bias", SAME),
        ("attention.output.LayerNorm.weight", "_self_attention_layer_norm.gamma", "self_attention_layer_norm.gamma", SAME),
        ("attention.output.LayerNorm.bias", "_self_attention_layer_norm.beta", "self_attention_layer_norm.beta", SAME),
        ("intermediate.dense.weight", "_feedforward_intermediate_dense.kernel", "intermediate_dense.kernel", LINEAR),
        ("intermediate.dense.bias", "_feedforward_intermediate_dense.bias", "intermediate_dense.bias", SAME),
        ("output.dense.weight", "_feedforward_output_dense.kernel", "output_dense.kernel", LINEAR),
        ("output.dense.bias", "_feedforward_output_dense.bias", "output_dense.bias", SAME),
        ("output.LayerNorm.weight", "_feedforward_layer_norm.gamma", "output_layer_norm.gamma", SAME),
        ("output.LayerNorm.bias", "_feedforward_layer_norm.beta", "output_layer_norm.beta", SAME))])
HEAD_TABLE = (
    ("lm_head.dense.weight", "masked_lm_head._intermediate_dense.kernel", "masked_lm_head.dense.kernel", LINEAR),
    ("lm_head.dense.bias", "masked_lm_head._intermediate_dense.bias", "masked_lm_head.dense.bias", SAME),
    ("lm_head.layer_norm.weight", "masked_lm_head._intermediate_layer_norm.gamma", "masked_lm_head.layer_norm.gamma", SAME),
    ("lm_head.layer_norm.bias", "masked_lm_head._intermediate_layer_norm.beta", "masked_lm_head.layer_norm.beta", SAME),
    ("lm_head.bias", "masked_lm_head._bias", "masked_lm_head.bias", SAME),
)
#: the position table (shifted by :func:`position_offset` rows; no row of the table above): keras-hub's, this module's
POSITION_PATHS = ("backbone.embeddings.position_embedding.position_embeddings", "backbone.position_embeddings")
POSITION_NAME = "roberta.embeddings.position_embeddings.weight"
TOKEN_TYPE_NAME = "roberta.embeddings.token_type_embeddings.weight"


def position_offset(pad_token_id: Optional[int]) -> int:
    """Rows transformers' RoBERTa position table reserves before the first real position: ``pad_token_id + 1``
    (2 for RoBERTa; ``None`` is taken as RoBERTa's 1)."""
    return int(1 if pad_token_id is None else pad_token_id) + 1


def _position_variable(masked_lm):
    return attribute(masked_lm, POSITION_PATHS[1 if isinstance(masked_lm, RobertaMaskedLM) else 0])


def parameter_table(masked_lm) -> List[Tuple[str, Any, str]]:
    """``(transformers name, Keras variable, layout kind)`` for every variable except the position table.

    Args:
        masked_lm: this module's :class:`RobertaMaskedLM` or a keras-hub ``RobertaMaskedLM`` (built).

    Returns:
        Names as in ``RobertaForMaskedLM.state_dict()``; ``lm_head.decoder.*`` left out (``save_pretrained`` leaves
        them out: tied to the word embeddings and to ``lm_head.bias`` on load).

    Raises:
        CheckpointError: the model is neither, or has variables this table does not know (a changed architecture
            would otherwise be exported incompletely).
    """
    backbone, head = getattr(masked_lm, "backbone", None), getattr(masked_lm, "masked_lm_head", None)
    if backbone is None or head is None or not hasattr(backbone, "transformer_layers"):
        raise CheckpointError(f"Expected a RoBERTa masked LM (backbone + masked_lm_head), got {type(masked_lm).__name__}.")
    own = isinstance(masked_lm, RobertaMaskedLM)
    if not own and getattr(head, "token_embedding", None) is not backbone.token_embedding:
        raise CheckpointError("The masked-LM head's decoder is not tied to the backbone's token embedding; "
                              "transformers' RobertaForMaskedLM ties them, so this head cannot be exported.")
    column = 2 if own else 1
    table = [(row[0], attribute(masked_lm, row[column]), row[3]) for row in EMBEDDING_TABLE]
    for i, block in enumerate(backbone.transformer_layers):
        table += [(row[0].format(i=i), attribute(block, row[column]), row[3]) for row in BLOCK_TABLE]
    table += [(row[0], attribute(masked_lm, row[column]), row[3]) for row in HEAD_TABLE]
    known = {id(v) for _, v, _ in table} | {id(_position_variable(masked_lm))}
    unknown = [w.path for w in masked_lm.weights if id(w) not in known]
    if unknown:
        raise CheckpointError(
            f"{type(masked_lm).__name__} has variables with no transformers RoBERTa counterpart: {', '.join(unknown[:8])}"
            f"{' ...' if len(unknown) > 8 else ''}. Only RoBERTa masked LMs (this module's or keras-hub's) can be exported.")
    return table


def state_dict(masked_lm, config=None) -> Dict[str, np.ndarray]:
    """The weights as a ``RobertaForMaskedLM`` state dict: ``{name: float32 C-contiguous array}``: word embeddings
    ``[V, H]``, position embeddings ``[L + pad_token_id + 1, H]`` (first rows zero), token types ``[1, H]`` (zeros),
    Linear weights ``[out, in]``, ``lm_head.bias`` ``[V]``; no ``lm_head.decoder.*``.

    Args:
        masked_lm: as :func:`parameter_table` (float32 weights under any dtype policy).
        config: gives ``pad_token_id`` (the position offset); ``None``: RoBERTa's 1.

    Raises:
        CheckpointError: see :func:`parameter_table`.
    """
    state = {name: np.ascontiguousarray(to_hf(kind, variable_numpy(var))) for name, var, kind in
             parameter_table(masked_lm)}
    positions = variable_numpy(_position_variable(masked_lm))
    offset = position_offset(getattr(config, "pad_token_id", 1))
    hidden = positions.shape[1]
    state[POSITION_NAME] = np.concatenate([np.zeros((offset, hidden), np.float32), positions], axis=0)
    state[TOKEN_TYPE_NAME] = np.zeros((1, hidden), np.float32)
    return dict(sorted(state.items()))


def check_config(config) -> None:
    """Raise ``CheckpointError`` when a transformers config is not one these layers can hold.

    Accepted: ``hidden_act`` "gelu" (exact), absolute positions, an encoder (not ``is_decoder``), ``hidden_size`` a
    multiple of ``num_attention_heads``, a position left after the reserved rows. A ``layer_norm_eps`` other than
    1e-5 is only logged (logits then differ by ~1e-6).
    """
    act = getattr(config, "hidden_act", "gelu")
    if act != "gelu":
        raise CheckpointError(f"hidden_act {act!r} is not supported by the Keras backend's RoBERTa (exact 'gelu' only).")
    if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
        raise CheckpointError(f"position_embedding_type {config.position_embedding_type!r} is not supported "
                              "(the Keras backend's RoBERTa has absolute positions only).")
    if getattr(config, "is_decoder", False):
        raise CheckpointError("A decoder RoBERTa (is_decoder=True) cannot be loaded as a masked LM.")
    if config.hidden_size % config.num_attention_heads:
        raise CheckpointError(f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads "
                              f"{config.num_attention_heads}.")
    if max_sequence_length(config) < 1:
        raise CheckpointError(f"max_position_embeddings {config.max_position_embeddings} leaves no position after the "
                              f"{position_offset(config.pad_token_id)} rows RoBERTa reserves.")
    eps = float(getattr(config, "layer_norm_eps", LAYER_NORM_EPSILON))
    if eps != LAYER_NORM_EPSILON:
        _say_once(logging.WARNING, "layer_norm_eps is %g in the config; the Keras backend's RoBERTa uses %g (outputs "
                  "differ slightly).", eps, LAYER_NORM_EPSILON)


def assign(masked_lm, state: Dict[str, np.ndarray], config) -> None:
    """Copy a transformers RoBERTa state dict into a masked LM of ``config``'s sizes (in place).

    Args:
        masked_lm: as :func:`parameter_table`; its position table may be shorter than the checkpoint's (the first
            ``max_sequence_length`` real positions are taken).
        state: ``RobertaForMaskedLM`` (or bare ``RobertaModel``) weights, transformers' names and shapes; legacy
            LayerNorm ``gamma``/``beta`` names accepted. Without ``lm_head.*`` the head keeps its initialization
            (a warning names the weights); ``lm_head.decoder.weight`` is not read (tied to the embeddings).
        config: the matching transformers config (``pad_token_id`` gives the position offset).

    Raises:
        CheckpointError: unsupported config (:func:`check_config`), a backbone weight missing, or another shape.
    """
    check_config(config)
    state = normalized_names(state, BASE_PREFIX, BARE_PREFIXES)
    missing_head = []
    for name, var, kind in parameter_table(masked_lm):
        shape = tuple(var.shape)
        if name.startswith("lm_head.") and name not in state:
            alias = {"lm_head.bias": "lm_head.decoder.bias"}.get(name)
            if alias not in state:
                missing_head.append(name)
                continue
            name = alias
        var.assign(from_hf(kind, take(state, name, hf_shape(kind, shape), "RoBERTa"), shape))
    _assign_positions(masked_lm, state, position_offset(config.pad_token_id))
    decoder = state.get("lm_head.decoder.weight")
    if decoder is not None and not np.array_equal(decoder, state["roberta.embeddings.word_embeddings.weight"]):
        logger.warning("lm_head.decoder.weight differs from the word embeddings; the Keras model's head is tied to "
                       "them, so the decoder weights are not used.")
    if missing_head:
        logger.warning("The checkpoint has no masked-LM head (%s): the head is newly initialized.", ", ".join(missing_head))


def _assign_positions(masked_lm, state, offset: int) -> None:
    position_var = _position_variable(masked_lm)
    length, hidden = (int(d) for d in position_var.shape)
    positions = np.asarray(state.get(POSITION_NAME, np.zeros((0, hidden))), np.float32)
    if POSITION_NAME not in state or positions.shape[1:] != (hidden,) or positions.shape[0] < offset + length:
        shape = tuple(positions.shape) if POSITION_NAME in state else "none"
        raise CheckpointError(f"{POSITION_NAME} has shape {shape}; the model needs at least ({offset + length}, "
                              f"{hidden}) ({length} positions after {offset} reserved rows).")
    rows = positions[offset: offset + length]
    if TOKEN_TYPE_NAME in state:  # every token gets row 0 (token_type_ids default to zeros): fold it in
        types = int(state[TOKEN_TYPE_NAME].shape[0])
        rows = rows + take(state, TOKEN_TYPE_NAME, (types, hidden), "RoBERTa")[0]
        if types > 1:
            _say_once(logging.INFO, "the checkpoint's %d token-type embeddings: row 0, which every input uses, is "
                      "added into the position embeddings (the same outputs); the export has type_vocab_size 1.",
                      types)
    position_var.assign(rows)


#: the config notes already logged by this process (each once, not once per model build)
_SAID: set = set()


def _say_once(level: int, message: str, *values) -> None:
    if (message, values) not in _SAID:
        _SAID.add((message, values))
        logger.log(level, message, *values)


def export_config(masked_lm, config=None, tokenizer=None):
    """The ``config.json`` of the model: a copy of ``config`` checked against the model's sizes, with
    ``max_position_embeddings = max_sequence_length + pad_token_id + 1``, ``type_vocab_size=1``,
    ``layer_norm_eps=1e-5``, ``hidden_act="gelu"``, tied embeddings.

    Args:
        masked_lm: this module's or keras-hub's ``RobertaMaskedLM``.
        config: the run's transformers config, not changed; ``None`` (a keras-hub model of no run): a fresh
            ``RobertaConfig`` of the model's sizes with the tokenizer's ``pad/bos/eos_token_id``.
        tokenizer: read only when ``config`` is ``None``.

    Raises:
        CheckpointError: the config's sizes differ from the model's (named), or :func:`check_config` refuses it.
    """
    from transformers import RobertaConfig  # read after the framework check; transformers is slow to import

    backbone = masked_lm.backbone
    sizes = dict(vocab_size=int(backbone.vocabulary_size), hidden_size=int(backbone.hidden_dim),
                 num_hidden_layers=int(backbone.num_layers), num_attention_heads=int(backbone.num_heads),
                 intermediate_size=int(backbone.intermediate_dim))
    if config is None:
        ids = {f: int(getattr(tokenizer, f)) for f in ("pad_token_id", "bos_token_id", "eos_token_id")
               if tokenizer is not None and getattr(tokenizer, f, None) is not None}
        dropout = float(backbone.dropout)
        config = RobertaConfig(**sizes, **ids, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    else:
        config = copy.deepcopy(config)
        wrong = [f"{k}={getattr(config, k, None)} (model: {v})" for k, v in sizes.items() if getattr(config, k, None) != v]
        if wrong:
            raise CheckpointError("The config does not describe the Keras model: " + ", ".join(wrong) + ".")
    if config.pad_token_id is None:
        config.pad_token_id = 1
    positions = int(backbone.max_sequence_length) + position_offset(config.pad_token_id)
    if getattr(config, "max_position_embeddings", None) != positions:
        logger.info("max_position_embeddings %s -> %d (the Keras model's %d positions + %d reserved rows)",
                    getattr(config, "max_position_embeddings", None), positions, backbone.max_sequence_length,
                    position_offset(config.pad_token_id))
    config.max_position_embeddings = positions
    config.type_vocab_size, config.layer_norm_eps, config.hidden_act = 1, LAYER_NORM_EPSILON, "gelu"
    config.tie_word_embeddings = True
    check_config(config)
    return config


# ------------------------------------------------------------------ building, sizes, FLOPs
def max_sequence_length(config) -> int:
    """Positions a real token may use: ``max_position_embeddings - (pad_token_id + 1)``."""
    return int(config.max_position_embeddings) - position_offset(config.pad_token_id)


def backbone_kwargs(config) -> Dict[str, Any]:
    """:class:`RobertaMaskedLM` size arguments of a transformers ``RobertaConfig`` (see the module doc)."""
    return dict(vocabulary_size=int(config.vocab_size), num_layers=int(config.num_hidden_layers),
                num_heads=int(config.num_attention_heads), hidden_dim=int(config.hidden_size),
                intermediate_dim=int(config.intermediate_size), dropout=float(config.hidden_dropout_prob),
                attention_dropout=float(getattr(config, "attention_probs_dropout_prob", config.hidden_dropout_prob)),
                max_sequence_length=max_sequence_length(config))


def build(config, dtype: Optional[str] = "float32") -> RobertaMaskedLM:
    """A new :class:`RobertaMaskedLM` of ``config``'s sizes (truncated-normal 0.02 weights, LayerNorm 1/0, seeded by
    Keras' global seed); ``model.config`` is ``config``. Raises ``CheckpointError`` as :func:`check_config`."""
    check_config(config)
    model = RobertaMaskedLM(**backbone_kwargs(config), dtype=dtype)
    model.config = config
    return model


def flops_per_token(config, seq_length: int, masked_fraction: Optional[float] = None) -> float:
    """Training FLOPs per token: :func:`hf_tpu_ext.flops.flops_per_token` (PaLM's accounting), whose encoder count
    (Q/K/V/output projections, two feed-forward matmuls, both attention matmuls, the LM head's dense transform
    and vocabulary projection) is exactly this architecture's."""
    return encoder_flops_per_token(config, seq_length, masked_fraction)


def default_config() -> Dict[str, Any]:
    """``RobertaConfig`` keyword arguments of the small preset (4 layers x 256, 4 heads, 1024 feed-forward)."""
    return dict(DEFAULT_SMALL_CONFIG)


ARCHITECTURE = Architecture(
    name="roberta", model_types=tuple(TRANSFORMERS_CLASSES), transformers_classes=dict(TRANSFORMERS_CLASSES),
    tokenizer_kind="byte_level_bpe", build=build, check_config=check_config, state_dict=state_dict, assign=assign,
    flops_per_token=flops_per_token, max_sequence_length=max_sequence_length, default_config=default_config,
    export_config=export_config)
