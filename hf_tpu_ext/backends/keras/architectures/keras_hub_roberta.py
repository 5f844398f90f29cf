"""keras-hub's ``RobertaMaskedLM`` holding a transformers ``RobertaForMaskedLM`` state dict, and its byte-level BPE
preprocessor: RoBERTa's :class:`.base.KerasHubPreset` (the export's optional ``keras_hub/`` preset). The weights are
placed by RoBERTa's own ``assign`` (:mod:`.roberta` knows keras-hub's attribute paths too), passed in by
:func:`preset`.
"""

from __future__ import annotations

import json
import logging
import os

from hf_tpu_ext.backends.keras.architectures.base import KerasHubPreset
from hf_tpu_ext.model_types import max_sequence_length

logger = logging.getLogger(__name__)

#: keras-hub's RobertaTokenizer special tokens, in RoBERTa's order (start, end, pad, mask)
ROBERTA_SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<mask>")


def keras_hub_roberta_masked_lm(state, config, preprocessor, assign):
    """A float32 keras-hub ``RobertaMaskedLM`` of ``config``'s sizes holding ``state`` (a ``RobertaForMaskedLM``
    state dict, numpy), placed by ``assign`` (RoBERTa's: ``(model, state, config)``).

    Raises:
        CheckpointError: as RoBERTa's ``assign`` (a missing or misshaped weight, named).
    """
    import keras_hub  # optional ([keras]); it imports TensorFlow

    # fixed names, not Keras' per-process numbering: an export's config.json is the same each time
    backbone = keras_hub.models.RobertaBackbone(
        vocabulary_size=int(config.vocab_size), num_layers=int(config.num_hidden_layers),
        num_heads=int(config.num_attention_heads), hidden_dim=int(config.hidden_size),
        intermediate_dim=int(config.intermediate_size), dropout=float(config.hidden_dropout_prob),
        max_sequence_length=max_sequence_length(config), dtype="float32", name="roberta_backbone")
    masked_lm = keras_hub.models.RobertaMaskedLM(backbone=backbone, preprocessor=preprocessor,
                                                 name="roberta_masked_lm")
    assign(masked_lm, state, config)
    return masked_lm


def keras_hub_preprocessor(tokenizer_folder: str, config, sequence_length: int):
    """A keras-hub ``RobertaMaskedLMPreprocessor`` with the same byte-level BPE as a saved transformers tokenizer.

    The vocabulary and merges are read from the folder's ``tokenizer.json`` (``model.type == "BPE"``), so no
    ``vocab.json``/``merges.txt`` are needed. keras-hub's ``RobertaTokenizer`` requires RoBERTa's special tokens
    ``<s>``, ``</s>``, ``<pad>``, ``<mask>`` in the vocabulary.

    Args:
        tokenizer_folder: a folder written by ``tokenizer.save_pretrained``.
        config: the model's transformers config (not read: the BPE is the folder's).
        sequence_length: the preprocessor's padded length (the model's ``max_sequence_length``).

    Returns:
        The preprocessor, or ``None`` (logged) when the tokenizer is not a RoBERTa-style byte-level BPE.
    """
    path = os.path.join(tokenizer_folder, "tokenizer.json")
    if not os.path.isfile(path):
        logger.info("No tokenizer.json: the keras-hub preset gets no preprocessor.")
        return None
    with open(path, encoding="utf-8") as f:
        model = json.load(f).get("model") or {}
    if model.get("type") != "BPE":
        logger.info("The tokenizer is %s, not a byte-level BPE: the keras-hub preset gets no preprocessor.", model.get("type"))
        return None
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]  # tokenizers >= 0.20: pairs
    import keras_hub

    try:
        # fixed names and token order: keras-hub numbers unnamed layers per process and lists its special tokens
        # from a set (string hash order), so a re-export would change the preset's JSON bytes
        tokenizer = keras_hub.models.RobertaTokenizer(vocabulary=dict(model["vocab"]), merges=merges,
                                                      unsplittable_tokens=list(ROBERTA_SPECIAL_TOKENS),
                                                      name="roberta_tokenizer")
    except ValueError as e:  # a special token RoBERTa needs is missing
        logger.info("keras-hub's RobertaTokenizer cannot use this vocabulary (%s): no preprocessor in the preset.", e)
        return None
    return keras_hub.models.RobertaMaskedLMPreprocessor(tokenizer=tokenizer, sequence_length=int(sequence_length),
                                                        name="roberta_masked_lm_preprocessor")


def preset(assign) -> KerasHubPreset:
    """RoBERTa's :class:`.base.KerasHubPreset`, its weights placed by ``assign`` (RoBERTa's; passed in: this module
    sits below :mod:`.roberta`)."""
    def masked_lm(state, config, preprocessor=None):
        return keras_hub_roberta_masked_lm(state, config, preprocessor, assign)

    return KerasHubPreset("RobertaMaskedLM", masked_lm, keras_hub_preprocessor)
