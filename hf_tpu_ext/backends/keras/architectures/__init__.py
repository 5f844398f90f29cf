"""The Keras backend's architectures: transformers ``model_type`` -> ``"module:ARCHITECTURE"``, imported lazily.

The rows come from the model-type records (:mod:`hf_tpu_ext.model_types`): every record whose ``backends`` name
``keras`` is the module of the record's name beside this file (its layers and transformers name table; the
contract is :mod:`.base`), for each ``model_type`` the record holds. A new architecture is its record, its module
here and its row in ``model_types.RECORDS``; nothing to add in this file.
"""

from __future__ import annotations

import importlib
from typing import Dict, Tuple, Type

from hf_tpu_ext.backends.keras.architectures.base import Architecture
from hf_tpu_ext.errors import ArgumentError
from hf_tpu_ext.model_types import RECORDS

#: model_type -> "module:attribute" (no framework is imported until :func:`get_architecture`), records' order
ARCHITECTURES: Dict[str, str] = {model_type: f"{__name__}.{record.name}:ARCHITECTURE"
                                 for record in RECORDS if "keras" in record.backends
                                 for model_type in record.model_types}


def supported_model_types() -> Tuple[str, ...]:
    """The transformers ``model_type`` values the Keras backend trains, in registry order."""
    return tuple(ARCHITECTURES)


def get_architecture(model_type: str) -> Architecture:
    """The :class:`Architecture` reading ``model_type``.

    Raises:
        KeyError: ``model_type`` has no entry (callers turn this into the user-facing refusal).
    """
    module_name, attribute = ARCHITECTURES[model_type].split(":")
    return getattr(importlib.import_module(module_name), attribute)


def architecture_for(config, error: Type[Exception] = ArgumentError) -> Architecture:
    """The :class:`Architecture` of a transformers ``config`` (its ``model_type``).

    Raises:
        ``error`` (``ArgumentError`` by default; ``CheckpointError`` for a checkpoint being read): the model_type
        has no entry; the message names :func:`supported_model_types`.
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise error(f"--backend keras trains model_type {', '.join(supported_model_types())}; this model's "
                    f"model_type is {model_type!r}. Use --backend tensorflow for other encoders.")
    return get_architecture(model_type)
