"""The contract an architecture of the Keras backend fulfils: one module per architecture, one registry entry.

An architecture module (``architectures/<name>.py``) holds its Keras 3 layers, its transformers name table and its
FLOP count, and exposes one :class:`Architecture` named ``ARCHITECTURE``; ``architectures/__init__.py`` maps each
transformers ``model_type`` it reads to ``"module:ARCHITECTURE"`` (imported only when asked for).

Model contract (every architecture's masked LM, so the step, dropout, bf16 dots, probes and export are shared):

* a ``keras.Model`` built on construction (``stateless_call`` needs no first call), every layer named so variable
  paths are the same in every process; ``model.config`` is the transformers config it was built from;
* inputs ``{"token_ids": int32 [B, L], "padding_mask": int32 [B, L] (1 = real token), "mask_positions": int32
  [B, P]}``; output: logits ``[B, P, vocab_size]`` in the compute dtype (the head runs only at ``mask_positions``);
  optional inputs (``--pack_documents`` only, absent otherwise so the unpacked program is unchanged):
  ``"segment_ids"`` int32 ``[B, L]`` (a token attends only within its segment: ``attend(segment_ids=)``) and
  ``"position_ids"`` int32 ``[B, L]`` (positions from 0 in each segment: a position table's rows, RoPE's angles);
* dropout through ``keras.layers.Dropout`` / ``keras.random.dropout`` and GELU through Keras' ``gelu`` (the step's
  counter-based dropout and erf GELU patch those), projections through ``Dense``/``EinsumDense`` (``bf16_dot``),
  attention through ``keras.ops.dot_product_attention``;
* the output projection tied to the token embedding (one variable), as transformers ties ``decoder.weight``.

No Keras/JAX import here: the registry and this contract are read before the framework starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

#: tokenizer kinds :mod:`hf_tpu_ext.data.tokenizer` trains from text (``--model_type`` picks one)
TOKENIZER_KINDS = ("byte_level_bpe", "wordpiece", "modernbert_bpe")


@dataclass(frozen=True)
class Architecture:
    """One masked-LM architecture of the Keras backend.

    Attributes:
        name: the registry's name (``"roberta"``, ``"bert"``, ``"distilbert"``, ``"modernbert"``).
        model_types: transformers ``model_type`` values this module reads and writes, e.g. ``("roberta",
            "xlm-roberta", "camembert")``.
        transformers_classes: ``{model_type: "<Arch>ForMaskedLM"}``: the class ``config.json``'s ``architectures``
            names on export (transformers 4.57 and 5 both have each).
        tokenizer_kind: one of :data:`TOKENIZER_KINDS`: what ``--model_type`` trains from text.
        build: ``(config, dtype: str) -> keras.Model``: a new masked LM of ``config``'s sizes (``dtype`` a Keras
            dtype policy name, ``"float32"`` or ``"mixed_bfloat16"``); sets ``model.config``.
        check_config: ``(config) -> None``; raises ``CheckpointError`` naming the field when a transformers config
            is one this module cannot hold (e.g. ``hidden_act``, ``position_embedding_type``).
        state_dict: ``(model, config) -> Dict[str, np.ndarray]``: the weights as the transformers class's
            ``state_dict()`` names and shapes (float32, C-contiguous; tied ``decoder.weight`` left out as
            ``save_pretrained`` does).
        assign: ``(model, state, config) -> None``: the inverse, in place; raises ``CheckpointError`` naming a
            missing weight or a shape that differs (a head-less checkpoint: warn, keep the head's initialization).
        flops_per_token: ``(config, seq_length: int, masked_fraction: float | None) -> float``: training FLOPs
            (forward + backward) per input token, PaLM's accounting (see :func:`hf_tpu_ext.flops.flops_per_token`).
        max_sequence_length: ``(config) -> int``: the longest input the config's positions allow.
        default_config: ``() -> Dict[str, Any]``: keyword arguments of the transformers config class for the small
            preset of this architecture (similar size to RoBERTa's 4 x 256 default).
        export_config: optional ``(model, config, tokenizer) -> config``: the transformers config ``config.json``
            gets, a copy of ``config`` fitted to the model (e.g. RoBERTa's position rows), raising
            ``CheckpointError`` naming a size that differs from the model's. ``None``: a copy of ``config``. Either
            way the export then sets ``architectures = [transformers_classes[model_type]]``.
    """

    name: str
    model_types: Tuple[str, ...]
    transformers_classes: Dict[str, str]
    tokenizer_kind: str
    build: Callable[..., Any]
    check_config: Callable[[Any], None]
    state_dict: Callable[..., Dict[str, Any]]
    assign: Callable[..., None]
    flops_per_token: Callable[..., float]
    max_sequence_length: Callable[[Any], int]
    default_config: Callable[[], Dict[str, Any]]
    export_config: Optional[Callable[..., Any]] = None
