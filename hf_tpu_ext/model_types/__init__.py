"""One record per model family (:class:`ModelTypeRecord`): what a model type is, apart from any framework.

The arguments (``--model_type`` choices), the config builder (:mod:`hf_tpu_ext.model_config`: presets, flag ->
field names, position limits), the tokenizer trainer (:mod:`hf_tpu_ext.data.tokenizer`, by kind), the FLOP count
(:mod:`hf_tpu_ext.flops`), the card and every backend (which model types it trains) read these records; nothing
outside this package and ``backends/keras/architectures/`` names an architecture in code (a test checks it).
Imports only :mod:`hf_tpu_ext.errors`.

Adding a family (a new architecture = its record, its Keras module and a registry row; three product files):

1. ``model_types/<name>.py`` with ``RECORD = ModelTypeRecord(...)``: ``name`` (the ``--model_type``),
   ``masked_lm_classes`` (``{model_type: "<Arch>ForMaskedLM"}``, ``name`` first), ``small_preset`` (config
   keyword arguments), ``tokenizer_kind`` (one of :data:`TOKENIZER_KINDS`; a new kind also needs its trainer in
   ``data/tokenizer.py``'s ``TRAINERS``), ``backends`` (of :data:`BACKENDS`), and where they differ from the
   defaults: ``flag_fields``, ``reserved_positions``, ``positions_fit_run``, ``scratch_fields``,
   ``flops_per_token``, ``same_positions``.
2. ``backends/keras/architectures/<name>.py`` (the record's ``name``) when ``"keras"`` is in ``backends``: its
   layers, ``build`` / ``check_config`` / ``state_dict`` / ``assign`` (and optionally ``export_config``, a
   keras-hub preset) as one ``Architecture`` named ``ARCHITECTURE``; the Keras registry maps every
   ``model_type`` of the record to it (``backends/keras/architectures/__init__.py`` reads :data:`RECORDS`).
3. the registry row: its ``RECORD`` in :data:`RECORDS` below (its place is its place in ``--model_type``'s
   choices).

A new tokenizer kind adds its name to :data:`TOKENIZER_KINDS` (``record.py``) and its trainer to
``data/tokenizer.py``'s ``TRAINERS``.
"""

from __future__ import annotations

import difflib
from typing import Dict, Optional, Tuple

from hf_tpu_ext.errors import ArgumentError
from hf_tpu_ext.model_types import bert, distilbert, eurobert, modernbert, roberta
from hf_tpu_ext.model_types.record import (BACKENDS, CONFIG_FLAGS, DROPOUT_FLAGS, SIZE_OVERRIDES, TOKENIZER_KINDS,
                                           ModelTypeRecord, encoder_flops_per_token)

#: one record per family, in ``--model_type`` choice order (the first is the default)
RECORDS: Tuple[ModelTypeRecord, ...] = (roberta.RECORD, bert.RECORD, distilbert.RECORD, modernbert.RECORD,
                                         eurobert.RECORD)
#: ``--model_type`` choices: one per record
MODEL_TYPE_CHOICES: Tuple[str, ...] = tuple(record.name for record in RECORDS)
#: ``--model_type``'s default
DEFAULT_MODEL_TYPE: str = MODEL_TYPE_CHOICES[0]
#: every transformers ``model_type`` a record holds -> its record
_BY_MODEL_TYPE: Dict[str, ModelTypeRecord] = {t: record for record in RECORDS for t in record.model_types}
#: model types of other families numbering positions as a record does (its ``same_positions``) -> that record
_SAME_POSITIONS: Dict[str, ModelTypeRecord] = {t: record for record in RECORDS for t in record.same_positions}


def find_record(model_type: Optional[str]) -> Optional[ModelTypeRecord]:
    """The record holding transformers ``model_type`` (``"xlm-roberta"``: RoBERTa's), or None."""
    return _BY_MODEL_TYPE.get(model_type) if model_type else None


def record_for(model_type: Optional[str]) -> ModelTypeRecord:
    """The record holding ``model_type`` (None: :data:`DEFAULT_MODEL_TYPE`'s).

    Raises:
        ArgumentError: no record holds it; the line names the choices and the closest one.
    """
    record = find_record(model_type or DEFAULT_MODEL_TYPE)
    if record is None:
        close = difflib.get_close_matches(str(model_type).lower(), list(_BY_MODEL_TYPE), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ArgumentError(f"model_type {model_type!r} has no record: known are {', '.join(_BY_MODEL_TYPE)}.{hint}")
    return record


def trained_by(backend: str) -> Tuple[str, ...]:
    """The transformers ``model_type`` values of the records whose ``backends`` name ``backend``, record order."""
    return tuple(t for record in RECORDS if backend in record.backends for t in record.model_types)


def flag_fields(model_type: Optional[str], flag: str) -> Tuple[str, ...]:
    """The config fields ``--<flag>`` sets on a ``model_type`` config (the flag's own name for a type without a
    record)."""
    record = find_record(model_type)
    return record.fields(flag) if record else (flag,)


def masked_lm_class(model_type: Optional[str]) -> Optional[str]:
    """transformers' masked-LM class of ``model_type`` (``"BertForMaskedLM"``), or None without a record."""
    record = find_record(model_type)
    return record.masked_lm_classes[model_type] if record else None


def max_sequence_length(config) -> int:
    """Longest input ``config``'s positions allow (RoBERTa reserves ``pad_token_id + 1`` rows, as does a type in a
    record's ``same_positions``; any other type: ``max_position_embeddings``)."""
    model_type = getattr(config, "model_type", None)
    record = find_record(model_type) or _SAME_POSITIONS.get(model_type)
    if record is None:
        return int(getattr(config, "max_position_embeddings", 0) or 0)
    return record.max_sequence_length(config)


def flops_per_token(config, seq_length: int, masked_fraction: Optional[float] = None) -> float:
    """Training FLOPs per input token of ``config``'s masked LM: its record's count (PaLM's accounting), or the
    encoder count for a type without a record.

    Raises:
        ArgumentError: ``seq_length < 1`` or ``masked_fraction`` outside [0, 1].
    """
    record = find_record(getattr(config, "model_type", None))
    if record is None:
        return encoder_flops_per_token(config, seq_length, masked_fraction)
    return record.count_flops(config, seq_length, masked_fraction)


__all__ = ["BACKENDS", "CONFIG_FLAGS", "DEFAULT_MODEL_TYPE", "DROPOUT_FLAGS", "MODEL_TYPE_CHOICES", "RECORDS",
           "SIZE_OVERRIDES", "TOKENIZER_KINDS", "ModelTypeRecord", "find_record", "flag_fields", "flops_per_token",
           "masked_lm_class", "max_sequence_length", "record_for", "trained_by"]
