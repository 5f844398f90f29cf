"""What the post-LN encoder architectures (``bert.py``, ``distilbert.py``, ``roberta.py``) share beside their layers
(:mod:`.encoder`): config checks, and :func:`encoder_architecture`, which makes an :class:`.base.Architecture`
(build, the state dict both ways through the name table) from an architecture's names and config
reading.

Each module gives one :class:`EncoderNames`, its ``check_config`` and ``encoder_kwargs`` (its config fields ->
the model's arguments). No Keras/JAX import at module level: the config checks run before the
framework starts (refusals before compute); build and the state-dict functions import :mod:`.encoder` when
called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from hf_tpu_ext.backends.keras.architectures.base import Architecture, KerasHubPreset
from hf_tpu_ext.backends.keras.architectures.name_table import normalized_names, table_assign, table_state_dict
from hf_tpu_ext.errors import CheckpointError


@dataclass(frozen=True)
class EncoderNames:
    """How an architecture names :class:`.encoder.EncoderMaskedLM`'s parts in transformers.

    Attributes:
        what: the architecture in messages (``"BERT"``).
        names: role of :data:`.encoder.PARTS` -> transformers module or tensor name (:func:`.encoder.name_table`).
        prefix: the base model's prefix in the masked LM (``"bert."``).
        bare_prefixes: first names of a bare base model's state dict (``("embeddings.", "encoder.")``), which
            get ``prefix`` on import.
        aliases: ``{name: another name saved with the same weight}`` tried on import when ``name`` is absent.
    """

    what: str
    names: Dict[str, str]
    prefix: str
    bare_prefixes: Tuple[str, ...]
    aliases: Dict[str, str]

    def head_names(self) -> Tuple[str, ...]:
        """transformers names of the prediction head (absent from a base-model checkpoint)."""
        return tuple(n for n in self.table_names(0) if not n.startswith(self.prefix))

    def table_names(self, num_layers: int) -> Tuple[str, ...]:
        """Every transformers name the table has for ``num_layers`` layers (no Keras needed)."""
        from hf_tpu_ext.backends.keras.architectures.encoder import name_table

        return tuple(row[0] for row in name_table(self.names, num_layers))


def check_encoder(what: str, config, hidden_size: int, num_heads: int, activations: Dict[str, Any]) -> None:
    """Refuse a config the post-LN encoder cannot hold.

    Args:
        what: the architecture, for messages.
        config: the transformers config: a decoder (``is_decoder``, causal attention) cannot be a masked LM, and
            ``tie_word_embeddings=False`` (a decoder of its own) has no place in the tied head.
        hidden_size, num_heads: the widths (``hidden_size % num_heads == 0`` needed).
        activations: config field -> its value; each must be ``"gelu"`` (exact GELU, the layers' Keras ``gelu``).

    Raises:
        CheckpointError: naming the field and its value.
    """
    for field, value in activations.items():
        if value != "gelu":
            raise CheckpointError(f"{field} {value!r} is not supported: the Keras backend's {what} uses exact "
                                  "'gelu' only. Use --backend torch_xla for this model.")
    if getattr(config, "is_decoder", False):
        raise CheckpointError(f"A decoder {what} (is_decoder=True) cannot be trained as a masked LM.")
    if getattr(config, "tie_word_embeddings", True) is False:
        raise CheckpointError(f"tie_word_embeddings=False is not supported: the Keras backend's {what} ties the "
                              "output projection to the word embeddings. Use --backend torch_xla for this model.")
    if int(hidden_size) % int(num_heads):
        raise CheckpointError(f"hidden size {hidden_size} is not a multiple of the attention heads {num_heads}.")


def encoder_architecture(name: str, names: EncoderNames, check_config: Callable[[Any], None],
                         encoder_kwargs: Callable[[Any], Dict[str, Any]],
                         keras_hub: Optional[KerasHubPreset] = None) -> Architecture:
    """The :class:`.base.Architecture` of a post-LN encoder whose model is :class:`.encoder.EncoderMaskedLM`.

    Args:
        name: the family's record name and the transformers ``model_type`` (``"bert"``).
        names: its transformers names.
        check_config: ``(config) -> None``, raises ``CheckpointError`` naming a field it cannot hold.
        encoder_kwargs: ``(config) -> dict``: :class:`.encoder.EncoderMaskedLM`'s size and rate arguments read
            from the architecture's own config fields (``vocabulary_size``, ``num_layers``, ``num_heads``,
            ``hidden_dim``, ``intermediate_dim``, ``max_position_embeddings``, ``type_vocab_size``,
            ``layer_norm_epsilon``, ``dropout``, ``attention_dropout``, ``attention_output_dropout``).
        keras_hub: the export's keras-hub preset (:func:`.keras_hub_bert.preset`), or None.

    The functions made (see :class:`.base.Architecture` for their signatures):

    * ``build(config, dtype)``: checks ``config``, then a new model named ``<name>_masked_lm`` (truncated-normal
      0.02 weights from Keras' global seed) in the dtype policy ``dtype``; ``model.config = config``;
    * ``state_dict(model, config)``: transformers names and shapes (float32 numpy), the tied decoder left out as
      ``save_pretrained`` leaves it out; ``assign(model, state, config)``: the inverse, a bare base-model
      checkpoint keeps the head's initialization with one warning (``CheckpointError`` for a missing or
      misshaped weight, named).
    """

    def build(config, dtype: str = "float32"):
        check_config(config)
        from hf_tpu_ext.backends.keras.architectures.encoder import EncoderMaskedLM

        model = EncoderMaskedLM(**encoder_kwargs(config), dtype=dtype, name=f"{name}_masked_lm")
        model.config = config
        return model

    def state_dict(model, config=None) -> Dict[str, Any]:
        from hf_tpu_ext.backends.keras.architectures.encoder import name_table

        layers = encoder_kwargs(model.config if config is None else config)["num_layers"]
        return table_state_dict(model, name_table(names.names, layers))

    def assign(model, state: Dict[str, Any], config=None) -> None:
        from hf_tpu_ext.backends.keras.architectures.encoder import name_table

        config = model.config if config is None else config
        check_config(config)
        state = normalized_names(state, names.prefix, names.bare_prefixes)
        table = name_table(names.names, encoder_kwargs(config)["num_layers"])
        table_assign(model, state, table, names.head_names(), names.aliases, names.what)

    return Architecture(name=name, build=build, check_config=check_config, state_dict=state_dict, assign=assign,
                        keras_hub=keras_hub)
