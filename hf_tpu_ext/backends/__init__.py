"""The training backends of ``hf-tpu train``, one folder each behind :class:`hf_tpu_ext.backends.base.Backend`.

:data:`BACKEND_REGISTRY` maps each ``--backend`` name to a lazy ``"module:Class"`` target and what the training
run checks before building it (the pip extra, the callback framework). Adding a backend is a folder with a class
implementing the protocol plus one entry here (and its name in :data:`hf_tpu_ext.model_types.BACKENDS`, the one
list of backend names). Which model types a backend trains is read from the model-type records (their
``backends``). Nothing here imports a framework.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Dict, Optional, Tuple

from hf_tpu_ext.console import default_backend
from hf_tpu_ext.errors import BackendError
from hf_tpu_ext.model_types import trained_by


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """One ``--backend`` of :data:`BACKEND_REGISTRY`.

    Attributes:
        target: ``"module:Class"`` of the :class:`~hf_tpu_ext.backends.base.Backend` (imported on use).
        extra: the pip extra that brings its packages (a key of :data:`hf_tpu_ext.extras.EXTRA_MODULES`).
        callback_kind: the callback framework it drives (``"tf_keras"``, ``"keras"`` or ``"torch"``).
        label: how an error names it (``"--backend keras"``).
        environment: ``(variable, default)`` pairs set (when unset) before any framework is imported, e.g.
            ``KERAS_BACKEND=jax``: Keras reads it once, at its first import (the callbacks' check imports Keras).
        any_masked_lm: it trains any ``AutoModelForMaskedLM``, not only the model types whose record names it
            (read by :func:`trained_model_types`).
    """

    target: str
    extra: str
    callback_kind: str
    label: str
    environment: Tuple[Tuple[str, str], ...] = ()
    any_masked_lm: bool = False


#: ``--backend`` name -> entry (the default when unset: :func:`hf_tpu_ext.console.default_backend`)
BACKEND_REGISTRY: Dict[str, BackendEntry] = {
    "tensorflow": BackendEntry("hf_tpu_ext.backends.tensorflow.backend:TensorFlowBackend", "tensorflow", "tf_keras",
                               "the TensorFlow backend"),
    "torch_xla": BackendEntry("hf_tpu_ext.backends.torch_xla.backend:TorchXLABackend", "torch-xla", "torch",
                              "--backend torch_xla", any_masked_lm=True),
    "keras": BackendEntry("hf_tpu_ext.backends.keras.backend:KerasBackend", "jax", "keras", "--backend keras",
                          environment=(("KERAS_BACKEND", "jax"),)),
}


def backend_entry(name) -> BackendEntry:
    """The registry entry of ``--backend name`` (``None``/``""``: :func:`hf_tpu_ext.console.default_backend`,
    ``keras`` when Keras 3 and JAX are installed, else ``tensorflow``).

    Raises:
        BackendError: an unknown name (the message lists the known ones).
        MissingExtraError: no name and no backend installed (the line names both extras).
    """
    entry = BACKEND_REGISTRY.get(name or default_backend())
    if entry is None:
        raise BackendError(f"Unknown --backend {name!r}: use one of {', '.join(BACKEND_REGISTRY)}.")
    return entry


def prepare_environment(name) -> None:
    """Set the environment defaults of ``--backend name`` (:attr:`BackendEntry.environment`) that are unset;
    call before anything imports the backend's framework."""
    for variable, default in backend_entry(name).environment:
        os.environ.setdefault(variable, default)


def trained_model_types(name) -> Optional[Tuple[str, ...]]:
    """The ``model_type`` values ``--backend name`` trains: those of the records whose ``backends`` name it
    (:func:`hf_tpu_ext.model_types.trained_by`); ``None``: any ``AutoModelForMaskedLM`` (torch_xla)."""
    entry = backend_entry(name)
    if entry.any_masked_lm:
        return None
    return trained_by(next(key for key, value in BACKEND_REGISTRY.items() if value is entry))


def make_backend(name):
    """A new, not yet set-up backend instance of ``--backend name`` (its module imported now).

    Raises:
        BackendError: an unknown name.
    """
    module, cls = backend_entry(name).target.split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["BACKEND_REGISTRY", "BackendEntry", "backend_entry", "make_backend", "prepare_environment",
           "trained_model_types"]
