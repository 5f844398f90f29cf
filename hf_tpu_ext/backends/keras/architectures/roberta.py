"""RoBERTa (also XLM-RoBERTa, CamemBERT) on the Keras backend: transformers' ``RobertaForMaskedLM``.

The computation is :class:`.encoder.EncoderMaskedLM`, the post-LN encoder BERT and DistilBERT share (word +
position embeddings, LayerNorm epsilon 1e-5, post-LN layers with exact GELU, the head ``lm_head.dense`` -> gelu ->
``lm_head.layer_norm`` -> decoder tied to the word embeddings + ``lm_head.bias``); dropout ``hidden_dropout_prob``
after the embeddings, the attention output and the feed-forward output, ``attention_probs_dropout_prob`` on the
attention probabilities. What is RoBERTa's own:

- Position offset: transformers numbers real tokens from ``padding_idx + 1`` (``pad_token_id + 1``: 2 for
  RoBERTa's ``<pad>``=1, ``create_position_ids_from_input_ids``); here (and in keras-hub) real token ``i`` of a
  right-padded batch reads row ``i``. So the Keras table has ``max_position_embeddings - (pad_token_id + 1)``
  rows (:func:`max_sequence_length`), and Keras row ``i`` is transformers row ``i + pad_token_id + 1``
  (:func:`position_offset`); the export writes the reserved rows as zeros (only pad tokens read them).
- Token types: none in the Keras model. transformers adds ``token_type_embeddings[0]`` to every token (ids
  default to 0), so on import that row is folded into every position row, and on export one zero row is written
  (``type_vocab_size=1``).
- Old checkpoints: until 2026-12 RoBERTa had its own copy of these layers, under other variable paths
  (``roberta_backbone/transformer_layer_0/self_attention/query/kernel``, ...). :data:`LEGACY_PATHS` maps them to
  today's (``encoder_layer_0/attention/query/kernel``); the model carries it as ``model.legacy_paths``, which the
  checkpoint restore applies (:func:`.name_table.renamed_paths`). The variables' order is unchanged, so the
  optimizer state (restored by position) lines up too (``tests/current/test_roberta_old_checkpoint.py``).

The name table (:data:`NAMES`) also reads and writes keras-hub's ``RobertaMaskedLM`` (:data:`KERAS_HUB_PARTS`,
its attribute paths): the export accepts one, and writes its optional ``keras_hub/`` preset through it.
Both directions give equal logits at every non-pad position up to float32 rounding
(``tests/current/test_keras_export.py`` checks 1e-4).

No Keras/JAX import at module level (config checks run before the framework starts).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any, Dict, Optional

import numpy as np

from hf_tpu_ext.backends.keras.architectures.keras_hub_roberta import preset as keras_hub_preset
from hf_tpu_ext.backends.keras.architectures.layouts import (LINEAR, OUT_KERNEL, QKV_BIAS, QKV_KERNEL, SAME,
                                                            attribute, same_values, take)
from hf_tpu_ext.backends.keras.architectures.name_table import normalized_names, table_assign, table_state_dict
from hf_tpu_ext.backends.keras.architectures.post_ln import EncoderNames, check_encoder, encoder_architecture
from hf_tpu_ext.errors import CheckpointError

logger = logging.getLogger("hf_tpu_ext")

#: keras-hub's and transformers' default RoBERTa LayerNorm epsilon
LAYER_NORM_EPSILON = 1e-5

_LAYER = "roberta.encoder.layer.{i}."
NAMES = EncoderNames(
    what="RoBERTa",
    names={
        "word_embeddings": "roberta.embeddings.word_embeddings.weight",
        "position_embeddings": "roberta.embeddings.position_embeddings.weight",
        "embeddings_norm": "roberta.embeddings.LayerNorm",
        "query": _LAYER + "attention.self.query", "key": _LAYER + "attention.self.key",
        "value": _LAYER + "attention.self.value", "attention_output": _LAYER + "attention.output.dense",
        "attention_norm": _LAYER + "attention.output.LayerNorm", "intermediate": _LAYER + "intermediate.dense",
        "output": _LAYER + "output.dense", "output_norm": _LAYER + "output.LayerNorm",
        "head_dense": "lm_head.dense", "head_norm": "lm_head.layer_norm", "head_bias": "lm_head.bias",
    },
    prefix="roberta.",
    bare_prefixes=("embeddings.", "encoder.", "pooler."),
    aliases={"lm_head.bias": "lm_head.decoder.bias"},  # transformers 4.x saves the head bias under both names
)
POSITION_NAME = NAMES.names["position_embeddings"]
TOKEN_TYPE_NAME = "roberta.embeddings.token_type_embeddings.weight"

#: :data:`.encoder.PARTS` for keras-hub's ``RobertaMaskedLM`` (its attribute paths, the same layouts)
_HUB_LAYER = "backbone.transformer_layers.{i}."
_KERNEL, _BIAS, _GAMMA, _BETA = ("kernel", LINEAR), ("bias", SAME), ("gamma", SAME), ("beta", SAME)
KERAS_HUB_PARTS = {
    "word_embeddings": ("backbone.token_embedding", ("embeddings", SAME), None),
    "position_embeddings": ("backbone.embeddings.position_embedding", ("position_embeddings", SAME), None),
    "embeddings_norm": ("backbone.embeddings_layer_norm", _GAMMA, _BETA),
    **{part: (f"{_HUB_LAYER}_self_attention_layer.{part}_dense", ("kernel", QKV_KERNEL), ("bias", QKV_BIAS))
       for part in ("query", "key", "value")},
    "attention_output": (_HUB_LAYER + "_self_attention_layer.output_dense", ("kernel", OUT_KERNEL), _BIAS),
    "attention_norm": (_HUB_LAYER + "_self_attention_layer_norm", _GAMMA, _BETA),
    "intermediate": (_HUB_LAYER + "_feedforward_intermediate_dense", _KERNEL, _BIAS),
    "output": (_HUB_LAYER + "_feedforward_output_dense", _KERNEL, _BIAS),
    "output_norm": (_HUB_LAYER + "_feedforward_layer_norm", _GAMMA, _BETA),
    "head_dense": ("masked_lm_head._intermediate_dense", _KERNEL, _BIAS),
    "head_norm": ("masked_lm_head._intermediate_layer_norm", _GAMMA, _BETA),
    "head_bias": ("masked_lm_head", ("_bias", SAME), None),
}

#: old checkpoints' variable paths -> today's (module doc): ``(regular expression of the whole path, replacement)``,
#: the first match wins
_OLD = r"roberta_backbone/transformer_layer_(\d+)/"
LEGACY_PATHS = (
    (r"roberta_backbone/token_embedding/(.+)", r"embeddings/word_embeddings/\1"),
    (r"roberta_backbone/position_embeddings", "embeddings/position_embeddings"),
    (r"roberta_backbone/embeddings_layer_norm/(.+)", r"embeddings/layer_norm/\1"),
    (_OLD + r"self_attention/attention_output/(.+)", r"encoder_layer_\1/attention/output_dense/\2"),
    (_OLD + r"self_attention/(.+)", r"encoder_layer_\1/attention/\2"),
    (_OLD + r"self_attention_layer_norm/(.+)", r"encoder_layer_\1/attention_layer_norm/\2"),
    (_OLD + r"feedforward_intermediate_dense/(.+)", r"encoder_layer_\1/intermediate_dense/\2"),
    (_OLD + r"feedforward_output_dense/(.+)", r"encoder_layer_\1/output_dense/\2"),
    (_OLD + r"feedforward_layer_norm/(.+)", r"encoder_layer_\1/output_layer_norm/\2"),
)


def position_offset(pad_token_id: Optional[int]) -> int:
    """Rows transformers' RoBERTa position table reserves before the first real position: ``pad_token_id + 1``
    (2 for RoBERTa; ``None`` is taken as RoBERTa's 1)."""
    return int(1 if pad_token_id is None else pad_token_id) + 1


def max_sequence_length(config) -> int:
    """Positions a real token may use (the Keras table's rows): ``max_position_embeddings - (pad_token_id + 1)``."""
    return int(config.max_position_embeddings) - position_offset(config.pad_token_id)


def check_config(config) -> None:
    """Raise ``CheckpointError`` when a transformers config is not one these layers can hold.

    Accepted: ``hidden_act`` "gelu" (exact), absolute positions, an encoder (not ``is_decoder``), tied embeddings,
    ``hidden_size`` a multiple of ``num_attention_heads``, a position left after the reserved rows. A
    ``layer_norm_eps`` other than 1e-5 is only logged (logits then differ by ~1e-6).
    """
    if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
        raise CheckpointError(f"position_embedding_type {config.position_embedding_type!r} is not supported "
                              "(the Keras backend's RoBERTa has absolute positions only).")
    check_encoder("RoBERTa", config, config.hidden_size, config.num_attention_heads,
                  {"hidden_act": getattr(config, "hidden_act", "gelu")})
    if max_sequence_length(config) < 1:
        raise CheckpointError(f"max_position_embeddings {config.max_position_embeddings} leaves no position after the "
                              f"{position_offset(config.pad_token_id)} rows RoBERTa reserves.")
    eps = float(getattr(config, "layer_norm_eps", LAYER_NORM_EPSILON))
    if eps != LAYER_NORM_EPSILON:
        _say_once(logging.WARNING, "layer_norm_eps is %g in the config; the Keras backend's RoBERTa uses %g (outputs "
                  "differ slightly).", eps, LAYER_NORM_EPSILON)


def encoder_kwargs(config) -> Dict[str, Any]:
    """:class:`.encoder.EncoderMaskedLM`'s arguments from a ``RobertaConfig`` (module doc: the position table has
    :func:`max_sequence_length` rows, no token types, epsilon 1e-5)."""
    hidden_dropout = float(config.hidden_dropout_prob)
    return dict(vocabulary_size=int(config.vocab_size), num_layers=int(config.num_hidden_layers),
                num_heads=int(config.num_attention_heads), hidden_dim=int(config.hidden_size),
                intermediate_dim=int(config.intermediate_size), max_position_embeddings=max_sequence_length(config),
                type_vocab_size=0, layer_norm_epsilon=LAYER_NORM_EPSILON, dropout=hidden_dropout,
                attention_dropout=float(getattr(config, "attention_probs_dropout_prob", hidden_dropout)),
                attention_output_dropout=hidden_dropout)


def _rows(masked_lm):
    """The name table of this package's RoBERTa or keras-hub's ``RobertaMaskedLM`` (:data:`KERAS_HUB_PARTS`).

    Raises:
        CheckpointError: another model, or a keras-hub head not tied to the token embedding.
    """
    from hf_tpu_ext.backends.keras.architectures.encoder import name_table

    if hasattr(masked_lm, "encoder_layers"):
        return name_table(NAMES.names, len(masked_lm.encoder_layers))
    backbone, head = getattr(masked_lm, "backbone", None), getattr(masked_lm, "masked_lm_head", None)
    if backbone is None or head is None or not hasattr(backbone, "transformer_layers"):
        raise CheckpointError(f"Expected a RoBERTa masked LM, got {type(masked_lm).__name__}.")
    if getattr(head, "token_embedding", None) is not backbone.token_embedding:
        raise CheckpointError("The masked-LM head's decoder is not tied to the backbone's token embedding; "
                              "transformers' RobertaForMaskedLM ties them, so this head cannot be exported.")
    return name_table(NAMES.names, len(backbone.transformer_layers), KERAS_HUB_PARTS)


def state_dict(masked_lm, config=None) -> Dict[str, np.ndarray]:
    """The weights as a ``RobertaForMaskedLM`` state dict: ``{name: float32 C-contiguous array}``: word embeddings
    ``[V, H]``, position embeddings ``[L + pad_token_id + 1, H]`` (first rows zero), token types ``[1, H]`` (zeros),
    Linear weights ``[out, in]``, ``lm_head.bias`` ``[V]``; no ``lm_head.decoder.*`` (``save_pretrained`` leaves
    them out).

    Args:
        masked_lm: this package's RoBERTa (:class:`.encoder.EncoderMaskedLM`) or keras-hub's ``RobertaMaskedLM``.
        config: gives ``pad_token_id`` (the position offset); ``None``: RoBERTa's 1.

    Raises:
        CheckpointError: another model, an untied keras-hub head, or a variable the table does not name.
    """
    state = table_state_dict(masked_lm, _rows(masked_lm))  # each array made when read (an export: one at a time)
    rows, hidden = state.shape(POSITION_NAME)
    offset = position_offset(getattr(config, "pad_token_id", 1))
    positions = state.maker(POSITION_NAME)
    state.defer(POSITION_NAME, (offset + rows, hidden),
                lambda: np.concatenate([np.zeros((offset, hidden), np.float32), positions()], axis=0))
    state.defer(TOKEN_TYPE_NAME, (1, hidden), lambda: np.zeros((1, hidden), np.float32))
    return state


def assign(masked_lm, state: Dict[str, np.ndarray], config) -> None:
    """Copy a transformers RoBERTa state dict into a masked LM of ``config``'s sizes (in place).

    Args:
        masked_lm: as :func:`state_dict`; its position table may be shorter than the checkpoint's (the first
            ``max_sequence_length`` real positions are taken).
        state: ``RobertaForMaskedLM`` (or bare ``RobertaModel``) weights, transformers' names and shapes; legacy
            LayerNorm ``gamma``/``beta`` names accepted. Without ``lm_head.*`` the head keeps its initialization
            (a warning names the weights); ``lm_head.decoder.weight`` is not read (tied to the embeddings).
        config: the matching transformers config (``pad_token_id`` gives the position offset).

    Raises:
        CheckpointError: unsupported config (:func:`check_config`), a backbone weight missing, or another shape.
    """
    check_config(config)
    state = normalized_names(state, NAMES.prefix, NAMES.bare_prefixes)
    rows = _rows(masked_lm)
    length, hidden = _position_shape(masked_lm, rows)
    state[POSITION_NAME] = _keras_positions(state, position_offset(config.pad_token_id), length, hidden)
    table_assign(masked_lm, state, rows, NAMES.head_names(), NAMES.aliases, NAMES.what)
    decoder = state.get("lm_head.decoder.weight")
    if decoder is not None and not same_values(decoder, state[NAMES.names["word_embeddings"]]):
        logger.warning("lm_head.decoder.weight differs from the word embeddings; the Keras model's head is tied to "
                       "them, so the decoder weights are not used.")


def _position_shape(masked_lm, rows):
    path = next(path for name, path, _ in rows if name == POSITION_NAME)
    return tuple(int(d) for d in attribute(masked_lm, path).shape)


def _keras_positions(state, offset: int, length: int, hidden: int) -> np.ndarray:
    """The Keras position rows ``[length, hidden]``: transformers' rows after the ``offset`` reserved ones, with the
    token-type row 0 (which every input uses) added in."""
    positions = np.asarray(state.get(POSITION_NAME, np.zeros((0, hidden))), np.float32)
    if POSITION_NAME not in state or positions.shape[1:] != (hidden,) or positions.shape[0] < offset + length:
        shape = tuple(positions.shape) if POSITION_NAME in state else "none"
        raise CheckpointError(f"{POSITION_NAME} has shape {shape}; the model needs at least ({offset + length}, "
                              f"{hidden}) ({length} positions after {offset} reserved rows).")
    rows = positions[offset: offset + length]
    if TOKEN_TYPE_NAME in state:
        types = int(np.shape(state[TOKEN_TYPE_NAME])[0])
        rows = rows + take(state, TOKEN_TYPE_NAME, (types, hidden), "RoBERTa")[0]
        if types > 1:
            _say_once(logging.INFO, "the checkpoint's %d token-type embeddings: row 0, which every input uses, is "
                      "added into the position embeddings (the same outputs); the export has type_vocab_size 1.",
                      types)
    return rows


#: the config notes already logged by this process (each once, not once per model build)
_SAID: set = set()


def _say_once(level: int, message: str, *values) -> None:
    if (message, values) not in _SAID:
        _SAID.add((message, values))
        logger.log(level, message, *values)


def export_config(masked_lm, config=None, tokenizer=None):
    """The ``config.json`` of the model: a copy of ``config`` checked against the model's sizes, with
    ``max_position_embeddings = positions + pad_token_id + 1``, ``type_vocab_size=1``, ``layer_norm_eps=1e-5``,
    ``hidden_act="gelu"``, tied embeddings.

    Args:
        masked_lm: as :func:`state_dict`.
        config: the run's transformers config, not changed; ``None`` (a keras-hub model of no run): a fresh
            ``RobertaConfig`` of the model's sizes with the tokenizer's ``pad/bos/eos_token_id``.
        tokenizer: read only when ``config`` is ``None``.

    Raises:
        CheckpointError: the config's sizes differ from the model's (named), or :func:`check_config` refuses it.
    """
    from transformers import RobertaConfig  # read after the framework check; transformers is slow to import

    sizes, dropout, positions = _sizes(masked_lm)
    if config is None:
        ids = {f: int(getattr(tokenizer, f)) for f in ("pad_token_id", "bos_token_id", "eos_token_id")
               if tokenizer is not None and getattr(tokenizer, f, None) is not None}
        config = RobertaConfig(**sizes, **ids, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    else:
        config = copy.deepcopy(config)
        wrong = [f"{k}={getattr(config, k, None)} (model: {v})" for k, v in sizes.items() if getattr(config, k, None) != v]
        if wrong:
            raise CheckpointError("The config does not describe the Keras model: " + ", ".join(wrong) + ".")
    if config.pad_token_id is None:
        config.pad_token_id = 1
    rows = positions + position_offset(config.pad_token_id)
    if getattr(config, "max_position_embeddings", None) != rows:
        logger.info("max_position_embeddings %s -> %d (the Keras model's %d positions + %d reserved rows)",
                    getattr(config, "max_position_embeddings", None), rows, positions,
                    position_offset(config.pad_token_id))
    config.max_position_embeddings = rows
    config.type_vocab_size, config.layer_norm_eps, config.hidden_act = 1, LAYER_NORM_EPSILON, "gelu"
    config.tie_word_embeddings = True
    check_config(config)
    return config


def _sizes(masked_lm):
    """(config sizes, dropout, positions) of this package's or keras-hub's RoBERTa masked LM."""
    if hasattr(masked_lm, "encoder_layers"):
        embeddings, layer = masked_lm.embeddings, masked_lm.encoder_layers[0]
        sizes = dict(vocab_size=int(masked_lm.masked_lm_head.vocabulary_size),
                     hidden_size=int(embeddings.hidden_dim), num_hidden_layers=len(masked_lm.encoder_layers),
                     num_attention_heads=int(layer.attention.num_heads),
                     intermediate_size=int(layer.intermediate_dense.units))
        return sizes, float(embeddings.dropout.rate), int(embeddings.max_position_embeddings)
    backbone = masked_lm.backbone
    sizes = dict(vocab_size=int(backbone.vocabulary_size), hidden_size=int(backbone.hidden_dim),
                 num_hidden_layers=int(backbone.num_layers), num_attention_heads=int(backbone.num_heads),
                 intermediate_size=int(backbone.intermediate_dim))
    return sizes, float(backbone.dropout), int(backbone.max_sequence_length)


_SHARED = encoder_architecture("roberta", NAMES, check_config, encoder_kwargs)


def build(config, dtype: Optional[str] = "float32"):
    """A new :class:`.encoder.EncoderMaskedLM` named ``roberta_masked_lm`` of ``config``'s sizes (truncated-normal
    0.02 weights, LayerNorm 1/0, seeded by Keras' global seed); ``model.config`` is ``config``,
    ``model.legacy_paths`` :data:`LEGACY_PATHS`. Raises ``CheckpointError`` as :func:`check_config`."""
    model = _SHARED.build(config, dtype)
    model.legacy_paths = LEGACY_PATHS
    return model


# the transformers model types (xlm-roberta, camembert), the preset and the tokenizer kind: model_types/roberta.py
ARCHITECTURE = dataclasses.replace(_SHARED, build=build, state_dict=state_dict, assign=assign,
                                   export_config=export_config, keras_hub=keras_hub_preset(assign))
