"""BERT on the Keras backend: transformers' ``BertForMaskedLM`` (``transformers/models/bert/modeling_bert.py``).

The computation is :class:`.encoder.EncoderMaskedLM`: word + absolute position (numbered from 0) + token-type
embeddings (every token of type 0; ``token_type_embeddings`` keeps the config's ``type_vocab_size`` rows so an
import/export round-trips exactly), LayerNorm (``layer_norm_eps``, BERT's 1e-12), post-LN layers with exact GELU,
the head ``cls.predictions.transform.dense`` -> gelu -> ``transform.LayerNorm`` -> decoder tied to the word
embeddings + ``cls.predictions.bias``. ``BertForMaskedLM`` has no pooler (a ``BertModel`` checkpoint's pooler is
not read). Dropout: ``hidden_dropout_prob`` after the embeddings, the attention output and the feed-forward
output; ``attention_probs_dropout_prob`` on the attention probabilities.

Refused (:func:`check_config`): ``hidden_act`` other than ``"gelu"``, ``position_embedding_type`` other than
``"absolute"``, decoder configs.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from hf_tpu_ext.backends.keras.architectures.base import Architecture
from hf_tpu_ext.backends.keras.architectures.post_ln import (
    EncoderNames,
    check_encoder,
    encoder_assign,
    encoder_flops_per_token,
    encoder_state_dict,
)
from hf_tpu_ext.errors import CheckpointError

_LAYER = "bert.encoder.layer.{i}."
NAMES = EncoderNames(
    what="BERT",
    names={
        "word_embeddings": "bert.embeddings.word_embeddings.weight",
        "position_embeddings": "bert.embeddings.position_embeddings.weight",
        "token_type_embeddings": "bert.embeddings.token_type_embeddings.weight",
        "embeddings_norm": "bert.embeddings.LayerNorm",
        "query": _LAYER + "attention.self.query", "key": _LAYER + "attention.self.key",
        "value": _LAYER + "attention.self.value", "attention_output": _LAYER + "attention.output.dense",
        "attention_norm": _LAYER + "attention.output.LayerNorm", "intermediate": _LAYER + "intermediate.dense",
        "output": _LAYER + "output.dense", "output_norm": _LAYER + "output.LayerNorm",
        "head_dense": "cls.predictions.transform.dense", "head_norm": "cls.predictions.transform.LayerNorm",
        "head_bias": "cls.predictions.bias",
    },
    prefix="bert.",
    bare_prefixes=("embeddings.", "encoder.", "pooler."),
    # transformers 4.x saves the head bias twice (decoder.bias is the same Parameter); 5 ties it on load
    aliases={"cls.predictions.bias": "cls.predictions.decoder.bias"},
)


def check_config(config) -> None:
    """Raise ``CheckpointError`` naming the field when ``config`` is not a BERT this module holds (module doc)."""
    if getattr(config, "model_type", None) != "bert":
        raise CheckpointError(f"Expected a 'bert' config, got model_type {getattr(config, 'model_type', None)!r}.")
    position_type = getattr(config, "position_embedding_type", None) or "absolute"
    if position_type != "absolute":
        raise CheckpointError(f"position_embedding_type {position_type!r} is not supported: the Keras backend's BERT "
                              "has absolute positions only. Use --backend torch_xla for this model.")
    check_encoder("BERT", config.hidden_size, config.num_attention_heads, {"hidden_act": config.hidden_act},
                  bool(getattr(config, "is_decoder", False)))


def build(config, dtype: str = "float32"):
    """A new BERT masked LM of ``config``'s sizes (truncated-normal 0.02 weights; Keras' global seed).

    Args:
        config: a transformers ``BertConfig``.
        dtype: a Keras dtype policy name (``"float32"``, ``"mixed_bfloat16"``).

    Returns:
        :class:`.encoder.EncoderMaskedLM` named ``bert_masked_lm``; ``model.config`` is ``config``.

    Raises:
        CheckpointError: see :func:`check_config`.
    """
    check_config(config)
    from hf_tpu_ext.backends.keras.architectures.encoder import EncoderMaskedLM

    hidden_dropout = float(config.hidden_dropout_prob)
    model = EncoderMaskedLM(
        vocabulary_size=int(config.vocab_size), num_layers=int(config.num_hidden_layers),
        num_heads=int(config.num_attention_heads), hidden_dim=int(config.hidden_size),
        intermediate_dim=int(config.intermediate_size), max_position_embeddings=int(config.max_position_embeddings),
        type_vocab_size=int(config.type_vocab_size), layer_norm_epsilon=float(config.layer_norm_eps),
        dropout=hidden_dropout, attention_dropout=float(config.attention_probs_dropout_prob),
        attention_output_dropout=hidden_dropout, dtype=dtype, name="bert_masked_lm")
    model.config = config
    return model


def state_dict(model, config=None) -> Dict[str, Any]:
    """``BertForMaskedLM.state_dict()`` names and shapes (float32 numpy), without the tied
    ``cls.predictions.decoder.weight``/``.bias`` (as ``save_pretrained`` writes them)."""
    config = model.config if config is None else config
    return encoder_state_dict(NAMES, model, config.num_hidden_layers)


def assign(model, state: Dict[str, Any], config=None) -> None:
    """Copy a ``BertForMaskedLM`` (or ``BertModel``: head kept, one warning) state dict into ``model``.

    Raises:
        CheckpointError: unsupported config, a missing weight or a shape that differs (named).
    """
    config = model.config if config is None else config
    check_config(config)
    encoder_assign(NAMES, model, state, config.num_hidden_layers)


def flops_per_token(config, seq_length: int, masked_fraction: Optional[float] = None) -> float:
    """Training FLOPs per input token (:func:`hf_tpu_ext.flops.flops_per_token`: PaLM's accounting, attention
    over the whole sequence, the head at ``masked_fraction`` of the positions or all when None)."""
    return encoder_flops_per_token(config.hidden_size, config.num_hidden_layers, config.intermediate_size,
                                   config.vocab_size, seq_length, masked_fraction)


def max_sequence_length(config) -> int:
    """``max_position_embeddings`` (BERT numbers positions from 0: 512 for bert-base)."""
    return int(config.max_position_embeddings)


def default_config() -> Dict[str, Any]:
    """The small preset: RoBERTa's 4 layers x 256 wide, 4 heads, FFN 1024; BERT's own defaults otherwise
    (``layer_norm_eps`` 1e-12, 512 positions, 2 token types)."""
    return dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu")


ARCHITECTURE = Architecture(
    name="bert", model_types=("bert",), transformers_classes={"bert": "BertForMaskedLM"},
    tokenizer_kind="wordpiece", build=build, check_config=check_config, state_dict=state_dict, assign=assign,
    flops_per_token=flops_per_token, max_sequence_length=max_sequence_length, default_config=default_config)
