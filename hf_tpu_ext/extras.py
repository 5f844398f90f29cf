"""Which optional packages each ``pip install 'hf-tpu-ext[EXTRA]'`` brings, and the error when one is missing.

``pip install hf-tpu-ext`` is the framework-free core (Hub pusher, model cards, callbacks registry, the
demo's predictor); each framework comes with an extra (see ``pyproject.toml``). Code that needs a framework
calls :func:`require_extra` before importing it, so a missing framework fails fast with the install
command instead of a ``ModuleNotFoundError`` deep in an import chain. Checks use
``importlib.util.find_spec`` and package metadata only: nothing here imports a framework.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata
from typing import Dict, List, Optional, Tuple

from hf_tpu_ext.errors import MissingExtraError

# extra -> import names it must provide (one per distribution the code imports)
EXTRA_MODULES: Dict[str, Tuple[str, ...]] = {
    "tensorflow": ("tensorflow", "tf_keras", "transformers"),
    "keras": ("keras",),
    # `hf-tpu train --backend keras` (Keras 3 on JAX; KERAS_BACKEND=tensorflow needs tensorflow installed too)
    "jax": ("keras", "keras_hub", "jax", "transformers", "safetensors", "tokenizers", "datasets"),
    "torch": ("torch", "transformers"),
    "torch-xla": ("torch", "torch_xla", "transformers", "accelerate"),
    "demo": ("gradio",),
}

# extra -> (distribution, lowest major version, highest major version or None): versions the code needs
# (the TensorFlow backend uses the TF model classes transformers removed in 5.0; Keras 2 is tf_keras' job)
EXTRA_MAJOR_VERSIONS: Dict[str, Tuple[Tuple[str, int, Optional[int]], ...]] = {
    "tensorflow": (("transformers", 4, 4),),
    "keras": (("keras", 3, None),),
    "jax": (("keras", 3, None),),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def _major(distribution: str) -> Optional[int]:
    try:
        return int(metadata.version(distribution).split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def missing_for(extra: str, modules: Optional[Tuple[str, ...]] = None) -> List[str]:
    """What is missing for ``extra``: import names not installed, and ``"dist N.x (found X.Y.Z)"``.

    Args:
        extra: a key of :data:`EXTRA_MODULES`.
        modules: check only these of the extra's import names (default: all of them).

    Raises:
        KeyError: an unknown extra name.
    """
    wanted = EXTRA_MODULES[extra] if modules is None else tuple(modules)
    missing = [m for m in wanted if not _installed(m)]
    for dist, lowest, highest in EXTRA_MAJOR_VERSIONS.get(extra, ()):
        major = _major(dist)
        if dist not in wanted or dist in missing or major is None:
            continue
        if major < lowest or (highest is not None and major > highest):
            needs = f"{lowest}.x" if highest == lowest else f">={lowest}"
            missing.append(f"{dist} {needs} (found {metadata.version(dist)})")
    return missing


def install_hint(extra: str) -> str:
    """``pip install 'hf-tpu-ext[EXTRA]'`` for an extra."""
    return f"pip install 'hf-tpu-ext[{extra}]'"


def require_extra(extra: str, what: str, modules: Optional[Tuple[str, ...]] = None) -> None:
    """Raise unless everything ``extra`` brings is installed (checked without importing it).

    Args:
        extra: a key of :data:`EXTRA_MODULES` (``"tensorflow"``, ``"keras"``, ``"torch"``, ``"torch-xla"``, ``"demo"``).
        what: the feature that needs it, as the start of the message (``"the TensorFlow backend"``).
        modules: check only these of the extra's import names (default: all of them).

    Raises:
        MissingExtraError: e.g. ``the TensorFlow backend needs: pip install 'hf-tpu-ext[tensorflow]'
            (missing: tensorflow, tf_keras)``.
    """
    missing = missing_for(extra, modules)
    if missing:
        raise MissingExtraError(f"{what} needs: {install_hint(extra)} (missing: {', '.join(missing)}).")


__all__ = ["EXTRA_MODULES", "install_hint", "missing_for", "require_extra"]
