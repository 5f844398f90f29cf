"""What the post-LN encoder architectures (``bert.py``, ``distilbert.py``) share beside their layers
(:mod:`.encoder`): config checks, the state dict both ways through their name table, the FLOP count.

Each module describes itself with one :class:`EncoderNames` and reads its own config fields; the functions here do
the rest. No Keras/JAX import at module level: :func:`check_encoder` and :func:`encoder_flops_per_token` run before
the framework starts (refusals before compute); the state-dict functions import :mod:`.encoder` when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, Optional, Tuple

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


def check_encoder(what: str, hidden_size: int, num_heads: int, activations: Dict[str, Any],
                  is_decoder: bool = False) -> None:
    """Refuse a config the post-LN encoder cannot hold.

    Args:
        what: the architecture, for messages.
        hidden_size, num_heads: the widths (``hidden_size % num_heads == 0`` needed).
        activations: config field -> its value; each must be ``"gelu"`` (exact GELU, the layers' Keras ``gelu``).
        is_decoder: a decoder config (causal attention) cannot be a masked LM.

    Raises:
        CheckpointError: naming the field and its value.
    """
    for field, value in activations.items():
        if value != "gelu":
            raise CheckpointError(f"{field} {value!r} is not supported: the Keras backend's {what} uses exact "
                                  "'gelu' only. Use --backend torch_xla for this model.")
    if is_decoder:
        raise CheckpointError(f"A decoder {what} (is_decoder=True) cannot be trained as a masked LM.")
    if int(hidden_size) % int(num_heads):
        raise CheckpointError(f"hidden size {hidden_size} is not a multiple of the attention heads {num_heads}.")


def encoder_flops_per_token(hidden_size: int, num_layers: int, intermediate_size: int, vocab_size: int,
                            seq_length: int, masked_fraction: Optional[float]) -> float:
    """Training FLOPs per input token of a post-LN encoder masked LM: :func:`hf_tpu_ext.flops.flops_per_token`'s
    PaLM accounting (attention over the whole sequence), for sizes named by any config."""
    from hf_tpu_ext.flops import flops_per_token

    sizes = SimpleNamespace(hidden_size=int(hidden_size), num_hidden_layers=int(num_layers),
                            intermediate_size=int(intermediate_size), vocab_size=int(vocab_size))
    return flops_per_token(sizes, seq_length, masked_fraction)


def encoder_state_dict(names: EncoderNames, model, num_layers: int):
    """``model``'s weights under transformers' names (float32 numpy, tied decoder left out), sorted.

    Raises:
        CheckpointError: the model has a variable the table does not name.
    """
    from hf_tpu_ext.backends.keras.architectures.encoder import name_table

    return table_state_dict(model, name_table(names.names, num_layers))


def encoder_assign(names: EncoderNames, model, state: Dict[str, Any], num_layers: int) -> None:
    """Copy a transformers state dict (masked LM or bare base model) into ``model`` in place.

    Raises:
        CheckpointError: a weight outside the head missing, or of another shape.
    """
    from hf_tpu_ext.backends.keras.architectures.encoder import name_table

    state = normalized_names(state, names.prefix, names.bare_prefixes)
    table_assign(model, state, name_table(names.names, num_layers), names.head_names(), names.aliases, names.what)
