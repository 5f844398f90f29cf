"""The Keras backend's architectures: transformers ``model_type`` -> ``"module:ARCHITECTURE"``, imported lazily.

A new architecture is one module beside this file (its layers, its transformers name table, its FLOP count; the
contract is :mod:`.base`) and one row here per ``model_type`` it reads.
"""

from __future__ import annotations

import importlib
from typing import Dict, Tuple

from hf_tpu_ext.backends.keras.architectures.base import Architecture

#: model_type -> "module:attribute" (no framework is imported until :func:`get_architecture`)
ARCHITECTURES: Dict[str, str] = {
    "bert": "hf_tpu_ext.backends.keras.architectures.bert:ARCHITECTURE",
    "distilbert": "hf_tpu_ext.backends.keras.architectures.distilbert:ARCHITECTURE",
}


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
