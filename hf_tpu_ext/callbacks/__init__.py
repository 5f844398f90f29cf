"""Registry of the callbacks that ``--callbacks`` and ``hf-tpu callbacks`` know by name, per backend.

Every name exists for two backends: ``"tensorflow"`` (the default; ``tf_keras.callbacks.Callback``
subclasses in this package) and ``"torch"`` (``transformers.TrainerCallback`` subclasses in
:mod:`hf_tpu_ext.callbacks.torch`, for ``--backend torch_xla`` and plain ``Trainer`` scripts). Functions
take ``backend="tensorflow"`` by default, so TensorFlow callers are unchanged; ``"torch_xla"`` and
``"pytorch"`` are accepted as spellings of ``"torch"``.

Built-in callbacks are registered as ``"module:Class"`` strings with a one-line description, so importing
this package (``hf-tpu callbacks``, argument checks) does not import TensorFlow; a callback's module is
imported only when the callback is asked for, so a broken module breaks only its own name.

Third-party packages add callbacks through the entry-point group ``hf_tpu_ext.callbacks``; the entry
point's object must be a ``tf_keras.callbacks.Callback`` subclass (group ``hf_tpu_ext.torch_callbacks``:
a ``transformers.TrainerCallback`` subclass)::

    # pyproject.toml of a plug-in package
    [project.entry-points."hf_tpu_ext.callbacks"]
    my_callback = "my_package.callbacks:MyCallback"

Building a callback for a training run: a class may define ``classmethod from_run(run)`` taking the
trainer's ``RunContext`` (``model_args, data_args, training_args, strategy, num_replicas,
global_batch_size, seq_length, steps_per_epoch, total_steps, eval_dataset, eval_steps, tokenizer,
checkpointer, model_config``); :func:`build_callbacks` uses it when present, else calls ``cls()``.

Example:
    >>> from hf_tpu_ext.callbacks import available_callbacks
    >>> sorted(available_callbacks())[:2]
    ['masked_lm_metrics', 'push_to_hub']
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from hf_tpu_ext.errors import ArgumentError, HfTpuExtError, UnknownCallbackError

logger = logging.getLogger("hf_tpu_ext")

ENTRY_POINT_GROUP = "hf_tpu_ext.callbacks"
TORCH_ENTRY_POINT_GROUP = "hf_tpu_ext.torch_callbacks"
BACKENDS = ("tensorflow", "torch")
_BACKEND_ALIASES = {"tensorflow": "tensorflow", "tf": "tensorflow", "keras": "tensorflow",
                    "torch": "torch", "torch_xla": "torch", "pytorch": "torch"}

# name -> class, or "module:Class" not imported yet (TensorFlow backend)
_REGISTRY: Dict[str, Union[type, str]] = {}
_DESCRIPTIONS: Dict[str, str] = {}
# the same for the torch backend (transformers.TrainerCallback subclasses)
_TORCH_REGISTRY: Dict[str, Union[type, str]] = {}
_TORCH_DESCRIPTIONS: Dict[str, str] = {}

_BUILTINS = {
    "masked_lm_metrics": (
        "hf_tpu_ext.callbacks.masked_lm_metrics:MaskedLMMetrics",
        "Evaluate masked-LM loss, perplexity and accuracy on device (per epoch or every N steps).",
    ),
    "push_to_hub": (
        "hf_tpu_ext.callbacks.push_to_hub:PushToHubCallback",
        "Push checkpoints, the model and its card to the Hub in the background while training runs.",
    ),
    "throughput": (
        "hf_tpu_ext.callbacks.throughput:ThroughputCallback",
        "Log samples/s, tokens/s (per replica), median step time and MFU.",
    ),
    "xla_recompile_guard": (
        "hf_tpu_ext.callbacks.xla_recompile_guard:XLARecompileGuard",
        "Warn or fail when the train function is traced/compiled again after warm-up.",
    ),
}


_TORCH_BUILTINS = {
    "masked_lm_metrics": "hf_tpu_ext.callbacks.torch.masked_lm_metrics:MaskedLMMetricsCallback",
    "push_to_hub": "hf_tpu_ext.callbacks.torch.push_to_hub:PushToHubCallback",
    "throughput": "hf_tpu_ext.callbacks.torch.throughput:ThroughputCallback",
    "xla_recompile_guard": "hf_tpu_ext.callbacks.torch.xla_recompile_guard:XLARecompileGuard",
}


def normalize_backend(backend: str) -> str:
    """``"tensorflow"`` or ``"torch"`` for a backend name (``"torch_xla"``/``"pytorch"`` mean ``"torch"``).

    Raises:
        ArgumentError: an unknown backend name.
    """
    key = _BACKEND_ALIASES.get(str(backend).lower()) if backend is not None else None
    if key is None:
        raise ArgumentError(f"Unknown callback backend {backend!r}; use 'tensorflow' or 'torch' (alias 'torch_xla').")
    return key


def _tables(backend: str):
    """``(registry, descriptions, entry-point group)`` of a backend."""
    if normalize_backend(backend) == "torch":
        return _TORCH_REGISTRY, _TORCH_DESCRIPTIONS, TORCH_ENTRY_POINT_GROUP
    return _REGISTRY, _DESCRIPTIONS, ENTRY_POINT_GROUP


def _base_class(backend: str) -> type:
    if normalize_backend(backend) == "torch":
        from transformers import TrainerCallback

        return TrainerCallback
    import tf_keras

    return tf_keras.callbacks.Callback


def _base_name(backend: str) -> str:
    return "transformers.TrainerCallback" if normalize_backend(backend) == "torch" else "tf_keras.callbacks.Callback"


class CallbackImportError(HfTpuExtError, ImportError):
    """A registered callback's module or class cannot be imported (a missing optional package, a bug)."""


def _first_line(text: Optional[str]) -> str:
    for line in (text or "").strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def _target(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register_callback(name: str, description: Optional[str] = None, backend: str = "tensorflow") -> Callable[[type], type]:
    """Class decorator registering a callback class under ``name`` for one backend.

    Args:
        name: the name used in ``--callbacks`` (lowercase, no commas or spaces).
        description: one line for ``hf-tpu callbacks`` (default: the first line of the class docstring).
        backend: ``"tensorflow"`` (a ``tf_keras.callbacks.Callback`` subclass) or ``"torch"`` (a
            ``transformers.TrainerCallback`` subclass).

    Returns:
        The decorator; it returns the class unchanged.

    Raises:
        ArgumentError: ``name`` is malformed, the class is not a Keras callback, or ``name`` is already
            registered to another class.
    """
    if not name or any(c in name for c in ", \t\n") or name != name.strip():
        raise ArgumentError(f"Callback name {name!r} is invalid: use a non-empty name without spaces or commas.")
    registry, descriptions, _ = _tables(backend)

    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, _base_class(backend))):
            raise ArgumentError(
                f"@register_callback({name!r}) must decorate a {_base_name(backend)} subclass, got {cls!r}."
            )
        existing = registry.get(name)
        if existing is not None:
            existing_target = existing if isinstance(existing, str) else _target(existing)
            if existing_target != _target(cls):  # re-import of the same class (lazy load, reload) is fine
                raise ArgumentError(
                    f"Callback name {name!r} is already registered to {existing_target}; choose another name."
                )
        registry[name] = cls
        descriptions[name] = description or descriptions.get(name) or _first_line(cls.__doc__)
        return cls

    return decorator


for _name, (_where, _text) in _BUILTINS.items():
    _REGISTRY[_name] = _where
    _DESCRIPTIONS[_name] = _text
    _TORCH_REGISTRY[_name] = _TORCH_BUILTINS[_name]
    _TORCH_DESCRIPTIONS[_name] = _text  # same name, same job, other framework


def _entry_points(backend: str = "tensorflow") -> Dict[str, Any]:
    """Entry points of the backend's group (scanned on every call: cheap, sees new installs)."""
    from importlib.metadata import entry_points

    registry, _, group = _tables(backend)
    found = {}
    for ep in entry_points(group=group):
        if ep.name in registry:
            if not isinstance(registry[ep.name], str) or registry[ep.name] != ep.value:
                logger.warning("Entry point %s = %s ignored: the name is taken by %s.", ep.name, ep.value, registry[ep.name])
            continue
        found[ep.name] = ep
    return found


def available_callbacks(backend: str = "tensorflow") -> Dict[str, str]:
    """All callback names of a backend with their one-line descriptions, sorted by name.

    Args:
        backend: ``"tensorflow"`` (default) or ``"torch"``; the built-in names are the same for both.

    Returns:
        ``{name: description}``: built-in, registered with :func:`register_callback`, and entry points of
        the backend's group (described by their target; they are not imported here).
    """
    _, descriptions, _ = _tables(backend)
    names = dict(descriptions)
    for name, ep in _entry_points(backend).items():
        names[name] = f"Third-party callback ({ep.value})."
    return dict(sorted(names.items()))


def _load(name: str, where: str) -> type:
    module_name, _, qualname = where.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise CallbackImportError(
            f"Callback {name!r} ({where}) could not be imported: {e}. Install what it needs or drop it from --callbacks."
        ) from e
    return obj


def _check_class(name: str, cls: Any, backend: str = "tensorflow") -> type:
    if not (isinstance(cls, type) and issubclass(cls, _base_class(backend))):
        raise ArgumentError(f"Callback {name!r} resolves to {cls!r}, which is not a {_base_name(backend)} subclass.")
    return cls


def _unknown(name: str, backend: str) -> UnknownCallbackError:
    known = ", ".join(available_callbacks(backend))
    where = "" if normalize_backend(backend) == "tensorflow" else " for the torch backend"
    return UnknownCallbackError(
        f"Unknown callback {name!r}{where}. Known callbacks: {known}. Run `hf-tpu callbacks` for their descriptions."
    )


def get_callback_class(name: str, backend: str = "tensorflow") -> type:
    """The class registered under ``name`` for ``backend`` (imports its module on first use).

    Args:
        name: a registered name.
        backend: ``"tensorflow"`` (default) or ``"torch"`` (alias ``"torch_xla"``).

    Returns:
        A ``tf_keras.callbacks.Callback`` subclass, or a ``transformers.TrainerCallback`` subclass for torch.

    Raises:
        UnknownCallbackError: ``name`` is not registered; the message lists the known names.
        CallbackImportError: the callback's module cannot be imported.
        ArgumentError: an entry point does not point at a Keras callback class.
    """
    registry, _, _ = _tables(backend)
    entry = registry.get(name)
    if entry is None:
        eps = _entry_points(backend)
        if name not in eps:
            raise _unknown(name, backend)
        try:
            cls = eps[name].load()
        except Exception as e:  # a broken plug-in must say which one it is
            raise CallbackImportError(
                f"Callback {name!r} (entry point {eps[name].value}) could not be loaded: {e}."
            ) from e
        return _check_class(name, cls, backend)
    if isinstance(entry, str):
        cls = _load(name, entry)
        # importing the module ran @register_callback; keep the class even if it did not
        if isinstance(registry.get(name), str):
            registry[name] = cls
        return _check_class(name, cls, backend)
    return entry


def resolve_callbacks(names: Iterable[str], backend: str = "tensorflow") -> List[type]:
    """Classes for a list of callback names, in order (checks every name before any import).

    Args:
        names: registered names, e.g. ``TrainingArguments.callback_names``.
        backend: ``"tensorflow"`` (default) or ``"torch"`` (alias ``"torch_xla"``).

    Returns:
        The callback classes.

    Raises:
        UnknownCallbackError: a name is not registered; the message lists the known names.
        CallbackImportError: a callback's module cannot be imported.
    """
    names = list(names)
    registry, _, _ = _tables(backend)
    eps = None
    for name in names:
        if name not in registry:
            eps = _entry_points(backend) if eps is None else eps
            if name not in eps:
                raise _unknown(name, backend)
    return [get_callback_class(name, backend) for name in names]


def get_callback(name: str, backend: str = "tensorflow", **kwargs):
    """Instantiate the callback registered under ``name``.

    Args:
        name: a registered name (see :func:`available_callbacks`).
        backend: ``"tensorflow"`` (default) or ``"torch"`` (alias ``"torch_xla"``).
        **kwargs: the class's constructor arguments.

    Returns:
        A ``tf_keras.callbacks.Callback`` instance (``transformers.TrainerCallback`` for torch).

    Raises:
        UnknownCallbackError, CallbackImportError: see :func:`get_callback_class`.
    """
    return get_callback_class(name, backend)(**kwargs)


def read_global_step(model) -> Optional[int]:
    """``model.optimizer.iterations`` as an int (None without an optimizer); works for distributed variables.

    One scalar read from the device: it waits until the steps already dispatched have finished.
    """
    iterations = getattr(getattr(model, "optimizer", None), "iterations", None) if model is not None else None
    if iterations is None:
        return None
    value = iterations.numpy() if hasattr(iterations, "numpy") else iterations
    return int(value)


def build_callbacks(names: Iterable[str], run, backend: str = "tensorflow") -> list:
    """Instantiate callbacks for a training run.

    Args:
        names: registered names, in the order the callbacks should run.
        run: the trainer's ``RunContext``; passed to ``cls.from_run(run)`` where a class defines it.
        backend: ``"tensorflow"`` (default) or ``"torch"`` (alias ``"torch_xla"``).

    Returns:
        ``tf_keras.callbacks.Callback`` instances.

    Raises:
        UnknownCallbackError, CallbackImportError: see :func:`resolve_callbacks`.
    """
    built = []
    for cls in resolve_callbacks(names, backend):
        from_run = getattr(cls, "from_run", None)
        built.append(from_run(run) if callable(from_run) else cls())
    return built


__all__ = [
    "BACKENDS",
    "CallbackImportError",
    "ENTRY_POINT_GROUP",
    "TORCH_ENTRY_POINT_GROUP",
    "available_callbacks",
    "build_callbacks",
    "get_callback",
    "get_callback_class",
    "normalize_backend",
    "read_global_step",
    "register_callback",
    "resolve_callbacks",
]
