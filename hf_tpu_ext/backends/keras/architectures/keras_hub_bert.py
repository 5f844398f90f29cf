"""keras-hub's ``BertMaskedLM`` and ``DistilBertMaskedLM`` holding a transformers ``BertForMaskedLM`` /
``DistilBertForMaskedLM`` state dict, and their WordPiece preprocessors: the BERT and DistilBERT halves of the
export's optional ``keras_hub/`` preset (``backends/keras/export.py`` writes it through each architecture's
:class:`.base.KerasHubPreset`, :func:`preset` here; RoBERTa's is :mod:`.keras_hub_roberta`).

The weights are placed by the architecture's own transformers name table (``architectures/bert.py`` /
``distilbert.py`` ``NAMES``), transposed to Keras' layouts: a ``Linear`` weight ``[out, in]`` becomes a ``Dense``
kernel ``[in, out]``; query/key/value kernels ``[hidden, heads, head_dim]``, the attention output kernel
``[heads, head_dim, hidden]``. keras-hub's ``BertBackbone`` has a pooler that ``BertForMaskedLM`` lacks: it is
written as zeros (it does not reach the masked-LM logits; zeros keep a re-export's bytes equal).

Not bit-identical to transformers for BERT: keras-hub's ``BertBackbone`` fixes the layers' activation to the tanh
approximation of GELU (transformers' ``"gelu"`` is the exact erf form); the head's GELU is exact in both.
DistilBERT's activations are exact in both.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from hf_tpu_ext.backends.keras.architectures.base import KerasHubPreset
from hf_tpu_ext.errors import CheckpointError

logger = logging.getLogger(__name__)

#: model_type -> (keras-hub backbone class, masked-LM task, tokenizer, masked-LM preprocessor), by attribute name
KERAS_HUB_CLASSES = {
    "bert": ("BertBackbone", "BertMaskedLM", "BertTokenizer", "BertMaskedLMPreprocessor"),
    "distilbert": ("DistilBertBackbone", "DistilBertMaskedLM", "DistilBertTokenizer",
                   "DistilBertMaskedLMPreprocessor"),
}


def _sizes(config):
    """(vocab, layers, heads, hidden, ffn, dropout) under either config's field names."""
    if config.model_type == "distilbert":
        return (config.vocab_size, config.n_layers, config.n_heads, config.dim, config.hidden_dim, config.dropout)
    return (config.vocab_size, config.num_hidden_layers, config.num_attention_heads, config.hidden_size,
            config.intermediate_size, config.hidden_dropout_prob)


def _get(state, name):
    if name not in state:
        raise CheckpointError(f"The state dict has no {name!r}: cannot build the keras-hub preset.")
    return np.asarray(state[name], dtype=np.float32)


def _set_dense(layer, state, name, kernel_shape=None):
    kernel = _get(state, name + ".weight").T
    layer.kernel.assign(kernel.reshape(kernel_shape) if kernel_shape else kernel)
    bias = _get(state, name + ".bias")
    layer.bias.assign(bias.reshape(layer.bias.shape))


def _set_norm(layer, state, name):
    layer.gamma.assign(_get(state, name + ".weight"))
    layer.beta.assign(_get(state, name + ".bias"))


def _assign(masked_lm, state, config, table) -> None:
    """Place ``state`` (transformers names from ``table``: the architecture's ``NAMES.names``) into a built
    keras-hub BERT/DistilBERT masked LM, in place."""
    _, layers, heads, hidden, _, _ = _sizes(config)
    head_dim = hidden // heads
    backbone = masked_lm.backbone
    positions = backbone.position_embedding if config.model_type == "bert" else backbone.embeddings.position_embedding
    backbone.token_embedding.embeddings.assign(_get(state, table["word_embeddings"]))
    positions.position_embeddings.assign(_get(state, table["position_embeddings"]))
    if config.model_type == "bert":
        backbone.segment_embedding.embeddings.assign(_get(state, table["token_type_embeddings"]))
        for variable in backbone.pooled_dense.weights:  # no pooler in BertForMaskedLM (module doc)
            variable.assign(np.zeros(variable.shape, np.float32))
    _set_norm(backbone.embeddings_layer_norm, state, table["embeddings_norm"])
    for i in range(int(layers)):
        block, names = backbone.transformer_layers[i], {k: v.format(i=i) for k, v in table.items()}
        attention = block._self_attention_layer
        for part, dense in (("query", attention._query_dense), ("key", attention._key_dense),
                            ("value", attention._value_dense)):
            _set_dense(dense, state, names[part], (hidden, heads, head_dim))
        _set_dense(attention._output_dense, state, names["attention_output"], (heads, head_dim, hidden))
        _set_norm(block._self_attention_layer_norm, state, names["attention_norm"])
        _set_dense(block._feedforward_intermediate_dense, state, names["intermediate"])
        _set_dense(block._feedforward_output_dense, state, names["output"])
        _set_norm(block._feedforward_layer_norm, state, names["output_norm"])
    head = masked_lm.masked_lm_head
    _set_dense(head._intermediate_dense, state, table["head_dense"])
    _set_norm(head._intermediate_layer_norm, state, table["head_norm"])
    head._bias.assign(_get(state, table["head_bias"]))


def keras_hub_bert_masked_lm(state, config, names, max_sequence_length: int, preprocessor=None):
    """A float32 keras-hub ``BertMaskedLM`` / ``DistilBertMaskedLM`` (``config.model_type``) of ``config``'s sizes
    holding the transformers state dict ``state``.

    Args:
        state: the ``*ForMaskedLM`` state dict (numpy), as the architecture's ``state_dict`` returns it.
        config: the matching ``BertConfig`` / ``DistilBertConfig``.
        names: the architecture's transformers name table (``NAMES.names``: role -> name, ``{i}`` = layer).
        max_sequence_length: the position table's rows (all of them: keras-hub numbers positions from 0 too).
        preprocessor: optional keras-hub masked-LM preprocessor (:func:`keras_hub_wordpiece_preprocessor`).

    Raises:
        CheckpointError: a weight ``names`` lists is missing from ``state``.
    """
    import keras_hub  # optional ([keras]); it imports TensorFlow

    backbone_class, task_class, _, _ = KERAS_HUB_CLASSES[config.model_type]
    vocab, layers, heads, hidden, ffn, dropout = _sizes(config)
    kwargs = dict(vocabulary_size=int(vocab), num_layers=int(layers), num_heads=int(heads), hidden_dim=int(hidden),
                  intermediate_dim=int(ffn), dropout=float(dropout), max_sequence_length=int(max_sequence_length),
                  dtype="float32", name=f"{config.model_type}_backbone")  # fixed names: the same bytes each export
    if config.model_type == "bert":
        kwargs["num_segments"] = int(config.type_vocab_size)
    backbone = getattr(keras_hub.models, backbone_class)(**kwargs)
    masked_lm = getattr(keras_hub.models, task_class)(backbone=backbone, preprocessor=preprocessor,
                                                      name=f"{config.model_type}_masked_lm")
    _assign(masked_lm, state, config, names)
    return masked_lm


def keras_hub_wordpiece_preprocessor(model_type: str, tokenizer_folder: str, sequence_length: int):
    """A keras-hub ``BertMaskedLMPreprocessor`` / ``DistilBertMaskedLMPreprocessor`` whose tokenizer is the saved
    transformers WordPiece: the vocabulary in id order from ``tokenizer.json`` (an id no token has: a placeholder
    ``[unusedN]``), lower-casing (and, as BERT's
    normalizer does when lower-casing, accent stripping) from its ``BertNormalizer``; special tokens written in the
    text (``[MASK]``) are read as those tokens, as transformers' tokenizer reads them.

    Returns:
        The preprocessor, or ``None`` (logged) when the folder's tokenizer is not a BERT WordPiece (no
        ``tokenizer.json``, another model or normalizer, two tokens of one id, a BERT special token missing).
    """
    path = os.path.join(tokenizer_folder, "tokenizer.json")
    if not os.path.isfile(path):
        logger.info("No tokenizer.json: the keras-hub preset gets no preprocessor.")
        return None
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    model, normalizer = spec.get("model") or {}, spec.get("normalizer") or {}
    vocab = model.get("vocab") or {}
    if model.get("type") != "WordPiece" or normalizer.get("type") != "BertNormalizer":
        logger.info("The tokenizer is %s with %s, not BERT's WordPiece: the keras-hub preset gets no preprocessor.",
                    model.get("type"), normalizer.get("type"))
        return None
    if len(set(vocab.values())) != len(vocab):
        logger.info("Two WordPiece tokens share an id: the keras-hub preset gets no preprocessor.")
        return None
    # keras-hub numbers a vocabulary list by position: an id no token has gets a placeholder that matches no word
    # (brackets are split off as punctuation), as BERT's own [unusedN] rows
    by_id = {i: t for t, i in vocab.items()}
    tokens = [by_id.get(i, f"[unused{i}]") for i in range(max(by_id) + 1 if by_id else 0)]
    lowercase = bool(normalizer.get("lowercase", True))
    strip_accents = normalizer.get("strip_accents")
    import keras_hub

    _, _, tokenizer_class, preprocessor_class = KERAS_HUB_CLASSES[model_type]
    try:
        tokenizer = getattr(keras_hub.models, tokenizer_class)(
            vocabulary=tokens, lowercase=lowercase,
            strip_accents=lowercase if strip_accents is None else bool(strip_accents),
            oov_token=model.get("unk_token", "[UNK]"), special_tokens_in_strings=True, name=f"{model_type}_tokenizer")
    except ValueError as e:  # a special token BERT needs is missing
        logger.info("keras-hub's %s cannot use this vocabulary (%s): no preprocessor in the preset.",
                    tokenizer_class, e)
        return None
    return getattr(keras_hub.models, preprocessor_class)(tokenizer=tokenizer, sequence_length=int(sequence_length),
                                                         name=f"{model_type}_masked_lm_preprocessor")


def preset(model_type: str, names) -> KerasHubPreset:
    """The :class:`.base.KerasHubPreset` of ``model_type`` (a key of :data:`KERAS_HUB_CLASSES`) whose transformers
    name table is ``names`` (the architecture's ``NAMES.names``); the position table keeps all its rows (numbered
    from 0 on both sides)."""
    def masked_lm(state, config, preprocessor=None):
        positions = int(config.max_position_embeddings)
        return keras_hub_bert_masked_lm(state, config, names, positions, preprocessor)

    def preprocessor(tokenizer_folder: str, config, sequence_length: int):
        return keras_hub_wordpiece_preprocessor(model_type, tokenizer_folder, sequence_length)

    return KerasHubPreset(KERAS_HUB_CLASSES[model_type][1], masked_lm, preprocessor)
