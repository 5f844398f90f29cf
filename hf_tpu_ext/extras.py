"""Which optional packages each ``pip install 'hf-tpu-ext[EXTRA]'`` brings, and the error when one is missing.

``pip install hf-tpu-ext`` is the framework-free core (Hub pusher, model cards, callbacks registry, the
demo's predictor); each framework comes with an extra (see ``pyproject.toml``). Code that needs a framework
calls :func:`require_extra` before importing it, so a missing framework fails fast with the install
command instead of a ``ModuleNotFoundError`` deep in an import chain. Checks use
``importlib.util.find_spec`` and package metadata only: nothing here imports a framework.

A hint is right for the environment it is printed in: an extra whose pins (:data:`EXTRA_PINS`) exclude a version
installed here (``[jax]`` needs transformers 5, the TensorFlow venv has 4.57) is suggested in a venv of its own,
never as a ``pip install`` that would replace what this environment's other extra needs. :func:`require_run_packages`
finds, before training, what a later phase of ``hf-tpu train`` imports (the card's jinja2, the loss curve's
matplotlib, the evaluation's ``evaluate``).
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
    # `hf-tpu train --backend keras` (Keras 3 on JAX)
    "jax": ("keras", "jax", "transformers", "safetensors", "tokenizers", "datasets"),  # keras_hub: [keras], optional
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


# extra -> (distribution, version specifier as in pyproject.toml): the pins that make an extra conflict with another
# one in the same environment (tests/test_packaging.py checks they match pyproject.toml)
EXTRA_PINS: Dict[str, Tuple[Tuple[str, str], ...]] = {
    "tensorflow": (("transformers", ">=4.57,<5"), ("huggingface_hub", ">=0.36,<1.0")),
    "jax": (("transformers", ">=5"), ("huggingface_hub", ">=1.0")),
    "torch-xla": (("torch", "==2.9.1"), ("transformers", ">=4.57,<5"), ("huggingface_hub", ">=0.36,<1.0")),
}

# extra -> the venv an extra that conflicts with this environment is suggested in
EXTRA_VENVS: Dict[str, str] = {"tensorflow": ".venv-tf", "jax": ".venv-jax", "torch-xla": ".venv-xla"}

# (import name, the later phase of `hf-tpu train` that imports it, the backends' extras that run that phase):
# checked before training (require_run_packages), so a missing one never ends a trained run at the card
RUN_PHASE_MODULES: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("jinja2", "the model card", ("tensorflow", "jax", "torch-xla")),
    ("matplotlib", "loss_curve.png", ("tensorflow", "jax", "torch-xla")),
    ("evaluate", "the evaluation's masked_lm metric", ("tensorflow", "torch-xla")),
)


def _version(distribution: str) -> Optional[str]:
    """The installed version of ``distribution`` (``None``: not installed); tests replace it with a fake."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def _major(distribution: str) -> Optional[int]:
    try:
        return int((_version(distribution) or "").split(".")[0])
    except ValueError:
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
            missing.append(f"{dist} {needs} (found {_version(dist)})")
    return missing


def conflicts(extra: str) -> List[str]:
    """What installing ``extra`` here would replace: ``"transformers 4.57.6"`` for each distribution installed
    at a version outside the extra's pins (:data:`EXTRA_PINS`); ``[]`` when it fits this environment."""
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:  # pragma: no cover - huggingface_hub depends on packaging
        return []
    found = []
    for dist, spec in EXTRA_PINS.get(extra, ()):
        version = _version(dist)
        if version is not None and not SpecifierSet(spec).contains(version.split("+")[0], prereleases=True):
            found.append(f"{dist} {version}")
    return found


def venv_command(extra: str) -> str:
    """``python -m venv .venv-jax && .venv-jax/bin/pip install 'hf-tpu-ext[jax]'``: the extra in a venv of its own."""
    venv = EXTRA_VENVS.get(extra, f".venv-{extra}")
    return f"python -m venv {venv} && {venv}/bin/pip install 'hf-tpu-ext[{extra}]'"


def install_hint(extra: str) -> str:
    """How to install ``extra`` from this environment: ``pip install 'hf-tpu-ext[EXTRA]'``, or, where its pins
    exclude a version installed here (:func:`conflicts`), :func:`venv_command` and what it would replace."""
    replaced = conflicts(extra)
    if replaced:
        return (f"{venv_command(extra)} (a venv of its own: installing [{extra}] here would replace "
                f"{', '.join(replaced)})")
    return f"pip install 'hf-tpu-ext[{extra}]'"


def missing_extra_message(extra: str, what: str, missing: List[str]) -> str:
    """The one line for ``what`` lacking ``missing`` (import names or version notes) of ``extra``, right for this
    environment, e.g. ``--backend keras needs: pip install 'hf-tpu-ext[jax]' (missing: jax).`` or, in an environment
    whose transformers [jax] would replace, ``--backend keras needs [jax] in a venv of its own (missing here: jax;
    installing it here would replace transformers 4.57.6, huggingface_hub 0.36.2, which [jax] pins to
    transformers>=5, huggingface_hub>=1.0): python -m venv .venv-jax && .venv-jax/bin/pip install 'hf-tpu-ext[jax]'.``
    """
    replaced = conflicts(extra)
    if not replaced:
        return f"{what} needs: {install_hint(extra)} (missing: {', '.join(missing)})."
    pins = ", ".join(f"{dist}{spec}" for dist, spec in EXTRA_PINS[extra])
    return (f"{what} needs [{extra}] in a venv of its own (missing here: {', '.join(missing)}; installing it here "
            f"would replace {', '.join(replaced)}, which [{extra}] pins to {pins}): {venv_command(extra)}.")


TORCH_CPU_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def no_framework_message(what: str, extra: str = "") -> str:
    """The line for ``what`` (``"hf-tpu demo"``) finding neither PyTorch nor TensorFlow, right for this environment:
    both extras (``pip install 'hf-tpu-ext[demo,torch]' (or '[demo,tensorflow]')``, ``extra`` first) where
    [tensorflow] fits; where it would replace this venv's transformers 5 (:func:`conflicts`), PyTorch's CPU build
    only (:data:`TORCH_CPU_INSTALL`; the default ``pip install torch`` is the multi-GB CUDA build)."""
    start = f"{what} runs the model with PyTorch or TensorFlow, and neither is installed: "
    if conflicts("tensorflow"):
        return (f"{start}{TORCH_CPU_INSTALL} (PyTorch's CPU build; [tensorflow] needs transformers 4, "
                f"a venv of its own).")
    prefix = f"{extra}," if extra else ""
    return f"{start}pip install 'hf-tpu-ext[{prefix}torch]' (or '[{prefix}tensorflow]')."


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
        raise MissingExtraError(missing_extra_message(extra, what, missing))


def require_run_packages(backend_entry) -> None:
    """Raise before training unless what a later phase of ``hf-tpu train`` imports is installed
    (:data:`RUN_PHASE_MODULES`: the card's jinja2, the loss curve's matplotlib, the evaluation's ``evaluate``).

    Args:
        backend_entry: the run's :class:`hf_tpu_ext.backends.BackendEntry` (its ``extra`` and ``label``).

    Raises:
        MissingExtraError: one line naming the extra, e.g. ``--backend keras needs: pip install 'hf-tpu-ext[jax]'
            (missing: jinja2 for the model card).``
    """
    extra = backend_entry.extra
    missing = [f"{module} for {phase}" for module, phase, extras in RUN_PHASE_MODULES
               if extra in extras and not _installed(module)]
    if missing:
        raise MissingExtraError(missing_extra_message(extra, backend_entry.label, missing))


__all__ = ["EXTRA_MODULES", "EXTRA_PINS", "RUN_PHASE_MODULES", "TORCH_CPU_INSTALL", "conflicts", "install_hint",
           "missing_extra_message", "missing_for", "no_framework_message", "require_extra", "require_run_packages", "venv_command"]
