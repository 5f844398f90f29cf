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
``"gelu"``, decoder configs, ``tie_word_embeddings=False``.
"""

from __future__ import annotations

from typing import Any, Dict

from hf_tpu_ext.backends.keras.architectures.keras_hub_bert import preset
from hf_tpu_ext.backends.keras.architectures.post_ln import EncoderNames, check_encoder, encoder_architecture
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
    check_encoder("DistilBERT", config, config.dim, config.n_heads, {"activation": config.activation})


def encoder_kwargs(config) -> Dict[str, Any]:
    """:class:`.encoder.EncoderMaskedLM`'s arguments from a ``DistilBertConfig`` (no token types; no dropout after
    ``out_lin``, as in transformers)."""
    return dict(vocabulary_size=int(config.vocab_size), num_layers=int(config.n_layers), num_heads=int(config.n_heads),
                hidden_dim=int(config.dim), intermediate_dim=int(config.hidden_dim),
                max_position_embeddings=int(config.max_position_embeddings), type_vocab_size=0,
                layer_norm_epsilon=LAYER_NORM_EPS, dropout=float(config.dropout),
                attention_dropout=float(config.attention_dropout), attention_output_dropout=0.0)


ARCHITECTURE = encoder_architecture("distilbert", NAMES, check_config, encoder_kwargs, preset("distilbert", NAMES.names))
