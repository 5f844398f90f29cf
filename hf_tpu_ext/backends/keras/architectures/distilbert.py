"""DistilBERT on the Keras backend: transformers' ``DistilBertForMaskedLM`` (``modeling_distilbert.py``).

The computation is :class:`.encoder.EncoderMaskedLM`: word + learned absolute position embeddings (numbered from
0; no token types), LayerNorm (epsilon 1e-12, fixed in transformers), post-LN layers (``q_lin``/``k_lin``/
``v_lin``/``out_lin`` attention, ``sa_layer_norm``, ``ffn.lin1`` -> ``activation`` -> ``ffn.lin2``,
``output_layer_norm``), the head ``vocab_transform`` -> gelu -> ``vocab_layer_norm`` -> ``vocab_projector`` tied
to the word embeddings (its bias ``vocab_projector.bias``). Dropout as transformers places it: ``dropout`` after
the embeddings and after ``ffn.lin2``, ``attention_dropout`` on the attention probabilities, none after
``out_lin``.

Config names differ from BERT's: ``dim``, ``n_layers``, ``n_heads``, ``hidden_dim`` (FFN width), ``dropout``,
``attention_dropout``, ``activation``, ``max_position_embeddings``. Refused (:func:`check_config`):
``sinusoidal_pos_embds=True`` (fixed sinusoidal positions, not a trained table), ``activation`` other than
``"gelu"``.
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

#: transformers' DistilBERT LayerNorms (embeddings, layers, head) are built with eps=1e-12; the config has no field
LAYER_NORM_EPS = 1e-12

_LAYER = "distilbert.transformer.layer.{i}."
NAMES = EncoderNames(
    what="DistilBERT",
    names={
        "word_embeddings": "distilbert.embeddings.word_embeddings.weight",
        "position_embeddings": "distilbert.embeddings.position_embeddings.weight",
        "embeddings_norm": "distilbert.embeddings.LayerNorm",
        "query": _LAYER + "attention.q_lin", "key": _LAYER + "attention.k_lin", "value": _LAYER + "attention.v_lin",
        "attention_output": _LAYER + "attention.out_lin", "attention_norm": _LAYER + "sa_layer_norm",
        "intermediate": _LAYER + "ffn.lin1", "output": _LAYER + "ffn.lin2", "output_norm": _LAYER + "output_layer_norm",
        "head_dense": "vocab_transform", "head_norm": "vocab_layer_norm", "head_bias": "vocab_projector.bias",
    },
    prefix="distilbert.",
    bare_prefixes=("embeddings.", "transformer."),
    aliases={},
)


def check_config(config) -> None:
    """Raise ``CheckpointError`` naming the field when ``config`` is not a DistilBERT this module holds."""
    if getattr(config, "model_type", None) != "distilbert":
        raise CheckpointError(f"Expected a 'distilbert' config, got model_type {getattr(config, 'model_type', None)!r}.")
    if getattr(config, "sinusoidal_pos_embds", False):
        raise CheckpointError("sinusoidal_pos_embds=True is not supported: the Keras backend's DistilBERT trains a "
                              "learned position table. Use --backend torch_xla for this model.")
    check_encoder("DistilBERT", config.dim, config.n_heads, {"activation": config.activation},
                  bool(getattr(config, "is_decoder", False)))


def build(config, dtype: str = "float32"):
    """A new DistilBERT masked LM of ``config``'s sizes (truncated-normal 0.02 weights; Keras' global seed).

    Args:
        config: a transformers ``DistilBertConfig``.
        dtype: a Keras dtype policy name (``"float32"``, ``"mixed_bfloat16"``).

    Returns:
        :class:`.encoder.EncoderMaskedLM` named ``distilbert_masked_lm``; ``model.config`` is ``config``.

    Raises:
        CheckpointError: see :func:`check_config`.
    """
    check_config(config)
    from hf_tpu_ext.backends.keras.architectures.encoder import EncoderMaskedLM

    model = EncoderMaskedLM(
        vocabulary_size=int(config.vocab_size), num_layers=int(config.n_layers), num_heads=int(config.n_heads),
        hidden_dim=int(config.dim), intermediate_dim=int(config.hidden_dim),
        max_position_embeddings=int(config.max_position_embeddings), type_vocab_size=0,
        layer_norm_epsilon=LAYER_NORM_EPS, dropout=float(config.dropout),
        attention_dropout=float(config.attention_dropout), attention_output_dropout=0.0, dtype=dtype,
        name="distilbert_masked_lm")
    model.config = config
    return model


def state_dict(model, config=None) -> Dict[str, Any]:
    """``DistilBertForMaskedLM.state_dict()`` names and shapes (float32 numpy), without the tied
    ``vocab_projector.weight``."""
    config = model.config if config is None else config
    return encoder_state_dict(NAMES, model, config.n_layers)


def assign(model, state: Dict[str, Any], config=None) -> None:
    """Copy a ``DistilBertForMaskedLM`` (or ``DistilBertModel``: head kept, one warning) state dict into ``model``.

    Raises:
        CheckpointError: unsupported config, a missing weight or a shape that differs (named).
    """
    config = model.config if config is None else config
    check_config(config)
    encoder_assign(NAMES, model, state, config.n_layers)


def flops_per_token(config, seq_length: int, masked_fraction: Optional[float] = None) -> float:
    """Training FLOPs per input token (:func:`hf_tpu_ext.flops.flops_per_token`'s PaLM accounting with
    ``dim``, ``n_layers``, ``hidden_dim``, ``vocab_size``)."""
    return encoder_flops_per_token(config.dim, config.n_layers, config.hidden_dim, config.vocab_size, seq_length,
                                   masked_fraction)


def max_sequence_length(config) -> int:
    """``max_position_embeddings`` (positions from 0: 512 for distilbert-base)."""
    return int(config.max_position_embeddings)


def default_config() -> Dict[str, Any]:
    """The small preset, ``DistilBertConfig`` names: 4 layers x 256 wide, 4 heads, FFN 1024 (RoBERTa's preset
    sizes), 512 positions, gelu."""
    return dict(dim=256, n_layers=4, n_heads=4, hidden_dim=1024, max_position_embeddings=512, activation="gelu",
                sinusoidal_pos_embds=False)


ARCHITECTURE = Architecture(
    name="distilbert", model_types=("distilbert",), transformers_classes={"distilbert": "DistilBertForMaskedLM"},
    tokenizer_kind="wordpiece", build=build, check_config=check_config, state_dict=state_dict, assign=assign,
    flops_per_token=flops_per_token, max_sequence_length=max_sequence_length, default_config=default_config)
