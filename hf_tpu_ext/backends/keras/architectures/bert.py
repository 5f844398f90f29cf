"""BERT on the Keras backend: transformers' ``BertForMaskedLM`` (``transformers/models/bert/modeling_bert.py``).

The computation is :class:`.encoder.EncoderMaskedLM`: word + absolute position (numbered from 0) + token-type
embeddings (every token of type 0; ``token_type_embeddings`` keeps the config's ``type_vocab_size`` rows so an
import/export round-trips exactly), LayerNorm (``layer_norm_eps``, BERT's 1e-12), post-LN layers with exact GELU,
the head ``cls.predictions.transform.dense`` -> gelu -> ``transform.LayerNorm`` -> decoder tied to the word
embeddings + ``cls.predictions.bias``. ``BertForMaskedLM`` has no pooler (a ``BertModel`` checkpoint's pooler is
not read). Dropout: ``hidden_dropout_prob`` after the embeddings, the attention output and the feed-forward
output; ``attention_probs_dropout_prob`` on the attention probabilities.

Refused (:func:`check_config`): ``hidden_act`` other than ``"gelu"``, ``position_embedding_type`` other than
``"absolute"``, decoder configs, ``tie_word_embeddings=False``.
"""

from __future__ import annotations

from typing import Any, Dict

from hf_tpu_ext.backends.keras.architectures.keras_hub_bert import preset
from hf_tpu_ext.backends.keras.architectures.post_ln import EncoderNames, check_encoder, encoder_architecture
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
    check_encoder("BERT", config, config.hidden_size, config.num_attention_heads, {"hidden_act": config.hidden_act})


def encoder_kwargs(config) -> Dict[str, Any]:
    """:class:`.encoder.EncoderMaskedLM`'s arguments from a ``BertConfig``: dropout ``hidden_dropout_prob`` after
    the embeddings, the attention output and the feed-forward output, ``attention_probs_dropout_prob`` on the
    attention probabilities; ``layer_norm_eps`` everywhere; every ``type_vocab_size`` row kept."""
    hidden_dropout = float(config.hidden_dropout_prob)
    return dict(vocabulary_size=int(config.vocab_size), num_layers=int(config.num_hidden_layers),
                num_heads=int(config.num_attention_heads), hidden_dim=int(config.hidden_size),
                intermediate_dim=int(config.intermediate_size),
                max_position_embeddings=int(config.max_position_embeddings),
                type_vocab_size=int(config.type_vocab_size), layer_norm_epsilon=float(config.layer_norm_eps),
                dropout=hidden_dropout, attention_dropout=float(config.attention_probs_dropout_prob),
                attention_output_dropout=hidden_dropout)


ARCHITECTURE = encoder_architecture("bert", NAMES, check_config, encoder_kwargs, preset("bert", NAMES.names))
