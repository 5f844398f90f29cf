"""The contract an architecture of the Keras backend fulfils: one module per architecture, one registry entry.

An architecture module (``architectures/<name>.py``) holds its Keras 3 layers and its transformers name table, and
exposes one :class:`Architecture` named ``ARCHITECTURE``; ``architectures/__init__.py`` maps each transformers
``model_type`` it reads to ``"module:ARCHITECTURE"`` (imported only when asked for). The rest of a model type (presets,
tokenizer kind, position limit, FLOP count) is its record in :mod:`hf_tpu_ext.model_types`.

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
* the output projection as the transformers config says: tied to the token embedding (one variable) where the
  class ties it (``tie_word_embeddings``, the default of BERT, RoBERTa, DistilBERT, ModernBERT), else a variable of
  its own (EuroBERT's ``lm_head``, ``tie_word_embeddings: false``); ``state_dict`` leaves a tied weight out, as
  ``save_pretrained`` does, and writes an untied one.

No Keras/JAX import here: the registry and this contract are read before the framework starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

@dataclass(frozen=True)
class KerasHubPreset:
    """How an architecture's export writes its optional keras-hub preset (``keras_hub/`` of the model folder).

    Attributes:
        task: keras-hub's masked-LM task class (``"BertMaskedLM"``), as the preset's ``task.json`` names it.
        masked_lm: ``(state, config, preprocessor) -> keras_hub task``: a float32 keras-hub masked LM of
            ``config``'s sizes holding the transformers state dict ``state``; raises ``CheckpointError`` naming a
            missing weight.
        preprocessor: ``(tokenizer_folder, config, sequence_length) -> preprocessor | None``: keras-hub's masked-LM
            preprocessor with the saved transformers tokenizer (None, logged, when keras-hub cannot hold it).
    """

    task: str
    masked_lm: Callable[..., Any]
    preprocessor: Callable[..., Any]


@dataclass(frozen=True)
class Architecture:
    """One masked-LM architecture of the Keras backend: its layers and the conversions to and from transformers.
    What is not Keras (the transformers classes, the preset, the tokenizer kind, the position limit, the FLOP
    count) is the family's :class:`hf_tpu_ext.model_types.ModelTypeRecord` (``record_for(name)``).

    Attributes:
        name: the family's record name (``"roberta"``, ``"bert"``, ``"distilbert"``, ``"modernbert"``); the
            registry maps each of that record's ``model_types`` to this architecture.
        build: ``(config, dtype: str) -> keras.Model``: a new masked LM of ``config``'s sizes (``dtype`` a Keras
            dtype policy name, ``"float32"`` or ``"mixed_bfloat16"``); sets ``model.config``.
        check_config: ``(config) -> None``; raises ``CheckpointError`` naming the field when a transformers config
            is one this module cannot hold (e.g. ``hidden_act``, ``position_embedding_type``).
        state_dict: ``(model, config) -> Dict[str, np.ndarray]``: the weights as the transformers class's
            ``state_dict()`` names and shapes (float32, C-contiguous; a tied output weight left out as
            ``save_pretrained`` does, an untied one written).
        assign: ``(model, state, config) -> None``: the inverse, in place; raises ``CheckpointError`` naming a
            missing weight or a shape that differs (a head-less checkpoint: warn, keep the head's initialization).
        export_config: optional ``(model, config, tokenizer) -> config``: the transformers config ``config.json``
            gets, a copy of ``config`` fitted to the model (e.g. RoBERTa's position rows), raising
            ``CheckpointError`` naming a size that differs from the model's. ``None``: a copy of ``config``. Either
            way the export then sets ``architectures`` to the record's masked-LM class.
        keras_hub: optional :class:`KerasHubPreset`: how the export writes a keras-hub preset (``None``: keras-hub
            has no such masked LM; the export says so once and writes the transformers files only).
    """

    name: str
    build: Callable[..., Any]
    check_config: Callable[[Any], None]
    state_dict: Callable[..., Dict[str, Any]]
    assign: Callable[..., None]
    export_config: Optional[Callable[..., Any]] = None
    keras_hub: Optional[KerasHubPreset] = None
