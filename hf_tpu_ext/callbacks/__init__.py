"""Registry of the callbacks that ``--callbacks``, :func:`get_callback` and ``hf-tpu callbacks`` know by name.

Every built-in name exists for three frameworks:

- ``"tf_keras"`` (alias ``"tensorflow"``): ``tf_keras.callbacks.Callback`` subclasses in
  :mod:`hf_tpu_ext.callbacks.tf_keras`, for ``hf-tpu train`` and tf_keras / transformers-TF ``fit`` scripts
  (extra ``[tensorflow]``);
- ``"keras"``: Keras 3 ``keras.callbacks.Callback`` subclasses in :mod:`hf_tpu_ext.callbacks.keras`, for
  ``model.fit`` on the JAX, TensorFlow or torch backend and keras-hub models (extra ``[keras]``);
- ``"torch"`` (aliases ``"torch_xla"``, ``"pytorch"``): ``transformers.TrainerCallback`` subclasses in
  :mod:`hf_tpu_ext.callbacks.torch`, for ``--backend torch_xla`` and any ``Trainer`` script (extra ``[torch]``).

:func:`get_callback` picks the implementation for the model it is used with (``model=``: a tf_keras model, a
Keras 3 model, a torch module or a ``Trainer``), or the ``framework=`` argument; with neither, the one
framework the process has imported, or torch in a ``Trainer`` script (``transformers.trainer`` imported),
else the Keras framework loaded beside torch (outside a Trainer script torch is a side effect of
transformers' TF classes), else the first one installed when none is imported (see :func:`default_framework`).

Built-in callbacks are registered as ``"module:Class"`` strings with a one-line description, so importing
this package (``hf-tpu callbacks``, argument checks) imports no framework; a callback's module is imported
only when the callback is asked for, so a broken module breaks only its own name, and a missing framework
raises :class:`~hf_tpu_ext.errors.MissingExtraError` naming the pip extra before anything is imported.

Third-party packages add callbacks through one entry-point group per framework (:data:`ENTRY_POINT_GROUPS`):
``hf_tpu_ext.callbacks`` (tf_keras), ``hf_tpu_ext.keras_callbacks`` (Keras 3), ``hf_tpu_ext.torch_callbacks``
(``transformers.TrainerCallback``)::

    # pyproject.toml of a plug-in package
    [project.entry-points."hf_tpu_ext.keras_callbacks"]
    my_callback = "my_package.callbacks:MyCallback"

Building a callback for a training run: a class may define ``classmethod from_run(run)`` taking the
trainer's ``RunContext`` (``model_args, data_args, training_args, strategy, num_replicas,
global_batch_size, seq_length, steps_per_epoch, total_steps, eval_dataset, eval_steps, tokenizer,
checkpointer, model_config``); :func:`build_callbacks` uses it when present, else calls ``cls()``.

Example:
    >>> from hf_tpu_ext.callbacks import available_callbacks, callback_frameworks
    >>> sorted(available_callbacks())[:2]
    ['masked_lm_metrics', 'push_to_hub']
    >>> callback_frameworks()["throughput"]
    ['tf_keras', 'keras', 'torch']
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from hf_tpu_ext.errors import ArgumentError, HfTpuExtError, UnknownCallbackError
from hf_tpu_ext.extras import missing_for, require_extra

logger = logging.getLogger("hf_tpu_ext")

FRAMEWORKS = ("tf_keras", "keras", "torch")
_FRAMEWORK_ALIASES = {
    "tf_keras": "tf_keras", "tensorflow": "tf_keras", "tf": "tf_keras",
    "keras": "keras", "keras3": "keras", "keras_3": "keras",
    "torch": "torch", "torch_xla": "torch", "pytorch": "torch",
}
ENTRY_POINT_GROUPS = {
    "tf_keras": "hf_tpu_ext.callbacks",
    "keras": "hf_tpu_ext.keras_callbacks",
    "torch": "hf_tpu_ext.torch_callbacks",
}

# framework -> (pip extra, import names checked before importing a callback, base class for messages)
_REQUIREMENTS = {
    "tf_keras": ("tensorflow", ("tensorflow", "tf_keras"), "tf_keras.callbacks.Callback"),
    "keras": ("keras", ("keras",), "keras.callbacks.Callback (Keras 3)"),
    "torch": ("torch", ("torch", "transformers"), "transformers.TrainerCallback"),
}

# framework -> name -> class, or "module:Class" not imported yet
_TABLES: Dict[str, Dict[str, Union[type, str]]] = {fw: {} for fw in FRAMEWORKS}
_DESCRIPTION_TABLES: Dict[str, Dict[str, str]] = {fw: {} for fw in FRAMEWORKS}
# older names, kept for callers (the names before Keras 3 support): alias -> (the name it stands for, its key or None)
_ALIASES = {
    "BACKENDS": ("FRAMEWORKS", None), "normalize_backend": ("normalize_framework", None),
    "ENTRY_POINT_GROUP": ("ENTRY_POINT_GROUPS", "tf_keras"),
    "KERAS_ENTRY_POINT_GROUP": ("ENTRY_POINT_GROUPS", "keras"),
    "TORCH_ENTRY_POINT_GROUP": ("ENTRY_POINT_GROUPS", "torch"),
    "_REGISTRY": ("_TABLES", "tf_keras"), "_DESCRIPTIONS": ("_DESCRIPTION_TABLES", "tf_keras"),
    "_KERAS_REGISTRY": ("_TABLES", "keras"), "_KERAS_DESCRIPTIONS": ("_DESCRIPTION_TABLES", "keras"),
    "_TORCH_REGISTRY": ("_TABLES", "torch"), "_TORCH_DESCRIPTIONS": ("_DESCRIPTION_TABLES", "torch"),
}


def __getattr__(name: str) -> Any:
    """An older name of :data:`_ALIASES` (PEP 562: only names not defined here reach this)."""
    if name not in _ALIASES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    target, key = _ALIASES[name]
    value = globals()[target]
    return value if key is None else value[key]

# name -> (description, {framework: class}): same name, same job, every framework; each class lives in
# hf_tpu_ext.callbacks.<framework>.<name> and is imported when asked for
_BUILTIN_CLASSES = {
    "masked_lm_metrics": (
        "Evaluate masked-LM loss, perplexity and accuracy on device (per epoch or every N steps).",
        {"tf_keras": "MaskedLMMetrics", "keras": "MaskedLMMetrics", "torch": "MaskedLMMetricsCallback"},
    ),
    "push_to_hub": (
        "Push checkpoints, the model and its card to the Hub in the background while training runs.",
        dict.fromkeys(FRAMEWORKS, "PushToHubCallback"),
    ),
    "throughput": ("Log samples/s, tokens/s (per replica), median step time and MFU.",
                   dict.fromkeys(FRAMEWORKS, "ThroughputCallback")),
    "xla_recompile_guard": ("Warn or fail when the train function is traced/compiled again after warm-up.",
                            dict.fromkeys(FRAMEWORKS, "XLARecompileGuard")),
}
# name -> (description, {framework: "module:Class"})
_BUILTINS = {name: (text, {fw: f"{__name__}.{fw}.{name}:{cls}" for fw, cls in classes.items()})
             for name, (text, classes) in _BUILTIN_CLASSES.items()}
for _name, (_text, _targets) in _BUILTINS.items():
    for _fw, _where in _targets.items():
        _TABLES[_fw][_name] = _where
        _DESCRIPTION_TABLES[_fw][_name] = _text


def framework_requirements(framework: str):
    """``(pip extra, import names)`` a framework's callbacks need (``"keras"`` -> ``("keras", ("keras",))``).

    Raises:
        ArgumentError: an unknown framework name (see :func:`normalize_framework`).
    """
    extra, modules, _ = _REQUIREMENTS[normalize_framework(framework)]
    return extra, modules


class CallbackImportError(HfTpuExtError, ImportError):
    """A registered callback's module or class cannot be imported (a missing optional package, a bug)."""


def normalize_framework(framework: str) -> str:
    """``"tf_keras"``, ``"keras"`` or ``"torch"`` for a framework name or alias.

    ``"tensorflow"``/``"tf"`` mean tf_keras (``hf-tpu train``'s TensorFlow backend), ``"keras3"`` means
    Keras 3, ``"torch_xla"``/``"pytorch"`` mean torch (``transformers.TrainerCallback``).

    Raises:
        ArgumentError: an unknown name.
    """
    key = _FRAMEWORK_ALIASES.get(str(framework).lower()) if framework is not None else None
    if key is None:
        raise ArgumentError(
            f"Unknown callback framework {framework!r}; use 'tf_keras' (alias 'tensorflow'), 'keras' (Keras 3) "
            "or 'torch' (alias 'torch_xla')."
        )
    return key


def _framework_arg(framework: Optional[str], backend: Optional[str]) -> Optional[str]:
    """The framework named by ``framework=`` or its older spelling ``backend=`` (None: neither given)."""
    if backend is not None and framework is not None and normalize_framework(backend) != normalize_framework(framework):
        raise ArgumentError(f"framework={framework!r} and backend={backend!r} disagree; pass only framework=.")
    chosen = framework if framework is not None else backend
    return None if chosen is None else normalize_framework(chosen)


def framework_of(obj: Any) -> Optional[str]:
    """The framework of a model, trainer or callback class/instance, from its class hierarchy (no import).

    Args:
        obj: a tf_keras model (also a transformers TF model), a Keras 3 model (also keras-hub, ``tf.keras`` of
            TensorFlow >= 2.16), a ``torch.nn.Module``, a ``transformers.Trainer``, or a callback class/instance.

    Returns:
        ``"tf_keras"``, ``"keras"``, ``"torch"``, or None when the hierarchy shows none of them.
    """
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        module = getattr(klass, "__module__", "") or ""
        root = module.split(".", 1)[0]
        if root in ("tf_keras", "keras", "torch"):
            return root
        if (module, klass.__name__) in (("transformers.trainer", "Trainer"),
                                        ("transformers.trainer_callback", "TrainerCallback")):
            return "torch"
    return None


def _keras3_loaded() -> bool:
    version = getattr(sys.modules.get("keras"), "__version__", "0")
    return str(version).split(".")[0].isdigit() and int(str(version).split(".")[0]) >= 3


def loaded_frameworks() -> List[str]:
    """The callback frameworks this process has imported, in :data:`FRAMEWORKS` order (nothing is imported).

    Keras 3 counts only when tf_keras is not loaded: importing TensorFlow (which tf_keras does) loads Keras 3
    as a side effect, so a loaded Keras 3 next to tf_keras says nothing about the script.
    """
    loaded = []
    if "tf_keras" in sys.modules:
        loaded.append("tf_keras")
    elif _keras3_loaded():
        loaded.append("keras")
    if "torch" in sys.modules:
        loaded.append("torch")
    return loaded


def default_framework() -> str:
    """The framework :func:`get_callback` uses without ``model=`` or ``framework=``.

    Rules, in order: the one framework the process has loaded (see :func:`loaded_frameworks`); ``"torch"``
    when ``transformers.trainer`` is loaded (a ``Trainer`` script: transformers 4 with TensorFlow installed
    also loads tf_keras, so several frameworks are loaded there); else the one Keras framework loaded beside
    torch (the torch callbacks are ``TrainerCallback``s, and transformers 4's TF classes import torch when it
    is installed); with none loaded, the first one installed (order tf_keras, keras, torch), else
    ``"tf_keras"`` (whose error names the extra).
    """
    loaded = loaded_frameworks()
    if len(loaded) == 1:
        return loaded[0]
    if "transformers.trainer" in sys.modules:
        return "torch"
    # the torch callbacks are TrainerCallbacks: with no Trainer loaded, a loaded torch is a side effect (transformers
    # 4's TF classes import it when installed), so a Keras framework beside it is the script's
    keras_side = [fw for fw in loaded if fw != "torch"]
    if keras_side:
        return keras_side[0]  # loaded_frameworks() holds at most one Keras framework

    for fw in FRAMEWORKS:
        extra, modules, _ = _REQUIREMENTS[fw]
        if not missing_for(extra, modules):
            return fw
    return "tf_keras"


def pick_framework(framework: Optional[str] = None, model: Any = None, *, backend: Optional[str] = None) -> str:
    """The framework for a callback: ``framework=`` (or ``backend=``), else ``model``'s, else :func:`default_framework`.

    Raises:
        ArgumentError: an unknown framework name, a model of no known framework, a ``framework`` that is
            not the model's.
    """
    named = _framework_arg(framework, backend)
    if model is not None:
        found = framework_of(model)
        if found is None:
            if named is not None:
                return named
            raise ArgumentError(
                f"Cannot tell the framework of {type(model).__module__}.{type(model).__qualname__}; "
                "pass framework='tf_keras', 'keras' or 'torch'."
            )
        if named is not None and named != found:
            raise ArgumentError(f"framework={named!r} does not match the model, a {found} model.")
        return found
    return named if named is not None else default_framework()


_LABELS = {"tf_keras": "tf_keras (TensorFlow)", "keras": "Keras 3", "torch": "torch (transformers Trainer)"}


def _require(framework: str, name: Optional[str] = None) -> None:
    extra, modules, _ = _REQUIREMENTS[framework]
    what = f"Callback {name!r}" if name else "A callback"
    require_extra(extra, f"{what} for {_LABELS[framework]}", modules)


def _base_class(framework: str) -> type:
    _require(framework)
    if framework == "torch":
        from transformers import TrainerCallback

        return TrainerCallback
    if framework == "keras":
        import keras

        return keras.callbacks.Callback
    import tf_keras

    return tf_keras.callbacks.Callback


def _first_line(text: Optional[str]) -> str:
    for line in (text or "").strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def _target(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register_callback(name: str, description: Optional[str] = None, framework: Optional[str] = None, *,
                      backend: Optional[str] = None) -> Callable[[type], type]:
    """Class decorator registering a callback class under ``name`` for one framework.

    Args:
        name: the name used in ``--callbacks`` and :func:`get_callback` (lowercase, no commas or spaces).
        description: one line for ``hf-tpu callbacks`` (default: the built-in's, else the first line of the
            class docstring).
        framework: ``"tf_keras"``, ``"keras"`` or ``"torch"`` (aliases: see :func:`normalize_framework`);
            default: the class's, from its base class. ``backend=`` is the older spelling.

    Returns:
        The decorator; it returns the class unchanged.

    Raises:
        ArgumentError: ``name`` is malformed, the class is not a callback of the framework, or ``name`` is
            already registered to another class for that framework.
    """
    if not name or any(c in name for c in ", \t\n") or name != name.strip():
        raise ArgumentError(f"Callback name {name!r} is invalid: use a non-empty name without spaces or commas.")
    named = _framework_arg(framework, backend)

    def decorator(cls: type) -> type:
        fw = named or (framework_of(cls) if isinstance(cls, type) else None) or "tf_keras"
        base = _base_class(fw)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise ArgumentError(
                f"@register_callback({name!r}) must decorate a {_REQUIREMENTS[fw][2]} subclass, got {cls!r}."
            )
        registry, descriptions = _TABLES[fw], _DESCRIPTION_TABLES[fw]
        existing = registry.get(name)
        if existing is not None:
            existing_target = existing if isinstance(existing, str) else _target(existing)
            if existing_target != _target(cls):  # re-import of the same class (lazy load, reload) is fine
                raise ArgumentError(
                    f"Callback name {name!r} is already registered to {existing_target} for {fw}; choose another name."
                )
        registry[name] = cls
        descriptions[name] = description or descriptions.get(name) or _first_line(cls.__doc__)
        return cls

    return decorator


def _entry_points(framework: str = "tf_keras") -> Dict[str, Any]:
    """Entry points of the framework's group (scanned on every call: cheap, sees new installs)."""
    from importlib.metadata import entry_points

    fw = normalize_framework(framework)
    registry = _TABLES[fw]
    found = {}
    for ep in entry_points(group=ENTRY_POINT_GROUPS[fw]):
        if ep.name in registry:
            if not isinstance(registry[ep.name], str) or registry[ep.name] != ep.value:
                logger.warning("Entry point %s = %s ignored: the name is taken by %s.", ep.name, ep.value, registry[ep.name])
            continue
        found[ep.name] = ep
    return found


def available_callbacks(framework: str = "tf_keras", *, backend: Optional[str] = None) -> Dict[str, str]:
    """All callback names of a framework with their one-line descriptions, sorted by name.

    Args:
        framework: ``"tf_keras"`` (default, ``hf-tpu train``'s TensorFlow backend), ``"keras"`` or ``"torch"``;
            the built-in names are the same for all. ``backend=`` is the older spelling.

    Returns:
        ``{name: description}``: built-in, registered with :func:`register_callback`, and entry points of
        the framework's group (described by their target; they are not imported here).
    """
    fw = _framework_arg(framework if backend is None else None, backend) or "tf_keras"
    names = dict(_DESCRIPTION_TABLES[fw])
    for name, ep in _entry_points(fw).items():
        names[name] = f"Third-party callback ({ep.value})."
    return dict(sorted(names.items()))


def callback_frameworks() -> Dict[str, List[str]]:
    """Every callback name with the frameworks that implement it (in :data:`FRAMEWORKS` order), sorted by name.

    Nothing is imported: built-in and registered names and the entry points of each framework's group.
    """
    found: Dict[str, List[str]] = {}
    for fw in FRAMEWORKS:
        for name in available_callbacks(fw):
            found.setdefault(name, []).append(fw)
    return dict(sorted(found.items()))


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


def _check_class(name: str, cls: Any, framework: str) -> type:
    if not (isinstance(cls, type) and issubclass(cls, _base_class(framework))):
        raise ArgumentError(
            f"Callback {name!r} resolves to {cls!r}, which is not a {_REQUIREMENTS[framework][2]} subclass."
        )
    return cls


def _unknown(name: str, framework: str) -> UnknownCallbackError:
    known = ", ".join(available_callbacks(framework))
    elsewhere = [fw for fw in FRAMEWORKS if fw != framework and name in available_callbacks(fw)]
    if elsewhere:
        return UnknownCallbackError(
            f"Callback {name!r} has no {framework} implementation (it has: {', '.join(elsewhere)}). "
            f"Known {framework} callbacks: {known}. Run `hf-tpu callbacks` for the frameworks of each."
        )
    return UnknownCallbackError(
        f"Unknown callback {name!r} for the {framework} framework. Known callbacks: {known}. "
        "Run `hf-tpu callbacks` for their descriptions."
    )


def get_callback_class(name: str, framework: Optional[str] = None, model: Any = None, *,
                       backend: Optional[str] = None) -> type:
    """The class registered under ``name`` for a framework (imports its module on first use).

    Args:
        name: a registered name.
        framework: ``"tf_keras"``, ``"keras"`` or ``"torch"`` (aliases: see :func:`normalize_framework`).
        model: the model or ``Trainer`` the callback will be used with; picks the framework when
            ``framework`` is not given (see :func:`pick_framework`).

    Returns:
        A ``tf_keras.callbacks.Callback``, ``keras.callbacks.Callback`` or ``transformers.TrainerCallback`` subclass.

    Raises:
        UnknownCallbackError: ``name`` is not registered for the framework; the message lists the known names.
        MissingExtraError: the framework is not installed; the message names the pip extra.
        CallbackImportError: the callback's module cannot be imported.
        ArgumentError: an entry point does not point at a callback class of the framework.
    """
    fw = pick_framework(framework, model, backend=backend)
    registry = _TABLES[fw]
    entry = registry.get(name)
    if entry is None:
        eps = _entry_points(fw)
        if name not in eps:
            raise _unknown(name, fw)
        _require(fw, name)
        try:
            cls = eps[name].load()
        except Exception as e:  # a broken plug-in must say which one it is
            raise CallbackImportError(
                f"Callback {name!r} (entry point {eps[name].value}) could not be loaded: {e}."
            ) from e
        return _check_class(name, cls, fw)
    if isinstance(entry, str):
        _require(fw, name)  # a missing framework names the extra instead of failing deep in an import
        cls = _load(name, entry)
        # importing the module ran @register_callback; keep the class even if it did not
        if isinstance(registry.get(name), str):
            registry[name] = cls
        return _check_class(name, cls, fw)
    return entry


def resolve_callbacks(names: Iterable[str], framework: str = "tf_keras", *, backend: Optional[str] = None) -> List[type]:
    """Classes for a list of callback names, in order (checks every name before any import).

    Args:
        names: registered names, e.g. ``TrainingArguments.callback_names``.
        framework: ``"tf_keras"`` (default, ``hf-tpu train``'s TensorFlow backend), ``"keras"`` or ``"torch"``
            (alias ``"torch_xla"``). ``backend=`` is the older spelling.

    Returns:
        The callback classes.

    Raises:
        UnknownCallbackError: a name is not registered; the message lists the known names.
        MissingExtraError: the framework is not installed.
        CallbackImportError: a callback's module cannot be imported.
    """
    names = list(names)
    fw = _framework_arg(framework if backend is None else None, backend) or "tf_keras"
    registry = _TABLES[fw]
    eps = None
    for name in names:
        if name not in registry:
            eps = _entry_points(fw) if eps is None else eps
            if name not in eps:
                raise _unknown(name, fw)
    return [get_callback_class(name, fw) for name in names]


def get_callback(name: str, framework: Optional[str] = None, model: Any = None, *, backend: Optional[str] = None,
                 **kwargs):
    """Instantiate the callback registered under ``name``, for the framework of the script it is used in.

    Example::

        model.fit(ds, callbacks=[get_callback("throughput", model=model, seq_length=128)])      # Keras 3 / tf_keras
        Trainer(..., callbacks=[get_callback("push_to_hub", framework="torch", hub_model_id="me/m")])

    Args:
        name: a registered name (see :func:`available_callbacks`).
        framework: ``"tf_keras"``, ``"keras"`` or ``"torch"`` (aliases: see :func:`normalize_framework`).
        model: the model or ``Trainer`` the callback is used with; only picks the framework (``fit`` and the
            Trainer hand the model to the callback themselves).
        **kwargs: the class's constructor arguments.

    Returns:
        A callback instance of the framework.

    Raises:
        UnknownCallbackError, MissingExtraError, CallbackImportError: see :func:`get_callback_class`.
        ArgumentError: ``framework`` is not the model's, or the model's framework cannot be told.
    """
    return get_callback_class(name, framework, model, backend=backend)(**kwargs)


def read_global_step(model) -> Optional[int]:
    """``model.optimizer.iterations`` as an int (None without an optimizer); works for distributed variables.

    One scalar read from the device: it waits until the steps already dispatched have finished.
    """
    iterations = getattr(getattr(model, "optimizer", None), "iterations", None) if model is not None else None
    if iterations is None:
        return None
    value = iterations.numpy() if hasattr(iterations, "numpy") else iterations
    return int(value)


def build_callbacks(names: Iterable[str], run, framework: str = "tf_keras", *, backend: Optional[str] = None) -> list:
    """Instantiate callbacks for a training run.

    Args:
        names: registered names, in the order the callbacks should run.
        run: the trainer's ``RunContext``; passed to ``cls.from_run(run)`` where a class defines it.
        framework: ``"tf_keras"`` (default), ``"keras"`` or ``"torch"`` (alias ``"torch_xla"``); ``backend=``
            is the older spelling.

    Returns:
        Callback instances of the framework.

    Raises:
        UnknownCallbackError, CallbackImportError: see :func:`resolve_callbacks`.
    """
    built = []
    for cls in resolve_callbacks(names, framework, backend=backend):
        from_run = getattr(cls, "from_run", None)
        built.append(from_run(run) if callable(from_run) else cls())
    return built


__all__ = [
    "BACKENDS",
    "CallbackImportError",
    "ENTRY_POINT_GROUP",
    "ENTRY_POINT_GROUPS",
    "FRAMEWORKS",
    "KERAS_ENTRY_POINT_GROUP",
    "TORCH_ENTRY_POINT_GROUP",
    "available_callbacks",
    "build_callbacks",
    "callback_frameworks",
    "default_framework",
    "framework_requirements",
    "framework_of",
    "get_callback",
    "get_callback_class",
    "loaded_frameworks",
    "normalize_backend",
    "normalize_framework",
    "pick_framework",
    "read_global_step",
    "register_callback",
    "resolve_callbacks",
]
