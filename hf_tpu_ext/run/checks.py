"""The checks of ``hf-tpu train`` before anything is written: arguments (finite numbers), output folder (empty or
resumable, writable), backend packages, callback names, data files, model references and sequence length.

Each check raises a :class:`~hf_tpu_ext.errors.HfTpuExtError` subclass whose one line names the input and what to do;
:func:`check_run` runs them in the run's order (the output folder locked first).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import List

from hf_tpu_ext.backends import BACKEND_REGISTRY, backend_entry, prepare_environment, trained_model_types
from hf_tpu_ext.backends.model_files import (PT_WEIGHTS_INDEX_NAME, PT_WEIGHTS_NAME, check_weights_folder,
                                             weight_patterns)
from hf_tpu_ext.callbacks import resolve_callbacks
from hf_tpu_ext.data.loading import check_data_file, is_tfrecord_source
from hf_tpu_ext.data.tokenizer import load_tokenizer
from hf_tpu_ext.errors import ArgumentError, HfTpuExtError, OutputDirError
from hf_tpu_ext.extras import require_extra, require_run_packages
from hf_tpu_ext.fileio import WRITE_CHECK_PREFIX, check_writable_dir
from hf_tpu_ext.hub.model_ref import check_model_ref
from hf_tpu_ext.model_config import (check_overrides_of_pretrained, check_positions, check_scratch_positions,
                                     scratch_config)
from hf_tpu_ext.model_types import DEFAULT_MODEL_TYPE
from hf_tpu_ext.run_lock import LOCK_NAME


def check_finite_arguments(*arg_objects) -> None:
    """Refuse NaN/inf in any float argument (``--learning_rate nan`` would train garbage for hours).

    Raises:
        ArgumentError: names the flag and its value.
    """
    for obj in arg_objects:
        if not dataclasses.is_dataclass(obj):
            continue
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name, None)
            if isinstance(value, float) and not math.isfinite(value):
                raise ArgumentError(f"--{f.name} must be a finite number, got {value}.")


def output_dir_entries(out: str) -> List[str]:
    """The names in the folder ``out`` other than a run's lock file and the write probe of a process sharing the
    folder (:data:`~hf_tpu_ext.fileio.WRITE_CHECK_PREFIX`: process 0's probe seen by process 1 refused a fresh
    2-process run); ``[]`` when it does not exist."""
    if not os.path.isdir(out):
        return []
    return [n for n in os.listdir(out) if n != LOCK_NAME and not n.startswith(WRITE_CHECK_PREFIX)]


def check_output_dir(training_args) -> None:
    """Refuse a non-empty ``output_dir`` unless overwriting or resuming was asked for, and an unwritable one.

    Raises:
        OutputDirError: the folder holds files (nothing in it is touched), is a file, or cannot be written.
    """
    out = training_args.output_dir
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputDirError(f"--output_dir {out!r} exists and is a file; choose a folder path.")
    entries = output_dir_entries(out)  # this run's lock does not count
    if entries and not (training_args.overwrite_output_dir or training_args.resume_from_checkpoint):
        raise OutputDirError(
            f"Output directory {out!r} already exists and is not empty ({len(entries)} entries). "
            "Pass --overwrite_output_dir to train into it anyway, --resume_from_checkpoint true to continue the "
            "run saved there, or choose another --output_dir. Nothing in it was changed."
        )
    check_writable_dir(out, "--output_dir")  # before any data or model work


def check_backend(training_args) -> None:
    """Raise ``BackendError`` for a backend whose packages are missing (with the install command).

    Raises:
        MissingExtraError: the TensorFlow backend without ``pip install 'hf-tpu-ext[tensorflow]'``.
        MissingExtraError: ``--backend torch_xla`` without ``pip install 'hf-tpu-ext[torch-xla]'``.
        MissingExtraError: ``--backend keras`` without ``pip install 'hf-tpu-ext[jax]'``.
        BackendError: an unknown ``--backend``.
    """
    entry = backend_entry(training_args.backend)
    require_extra(entry.extra, entry.label)
    prepare_environment(training_args.backend)  # e.g. KERAS_BACKEND=jax before the callbacks' check imports Keras


def check_data_files(data_args) -> None:
    """Check local data files exist and have a supported format (before TensorFlow is even imported).

    Raises:
        DataFileNotFoundError: a file does not exist. DataError: unsupported format.
    """
    for option, path in (("--train_file", data_args.train_file), ("--validation_file", data_args.validation_file)):
        if path and not is_tfrecord_source(path) and "://" not in path:
            check_data_file(path, option)


# the model references the command line's early checks found (check_model_refs remember=True), each taken by the
# run's check_run once: one bounded Hub request per repo id and run
_REMEMBERED_REFS: List[tuple] = []


def _model_refs(model_args) -> tuple:
    """``((flag, value, revision), ...)`` of the model references to check (a config.json file is not one)."""
    refs = []
    for option in ("model_name_or_path", "config_name", "tokenizer_name"):
        value = getattr(model_args, option, None)
        if value and not (option == "config_name" and os.path.isfile(value)):
            refs.append((f"--{option}", value, model_args.model_revision if option != "tokenizer_name" else None))
    return tuple(refs)


def check_model_refs(model_args, *, remember: bool = False) -> None:
    """``--model_name_or_path``, ``--config_name`` and ``--tokenizer_name`` each name an existing folder or Hub repo
    (one bounded request per repo id; before TensorFlow is imported).

    Args:
        model_args: :class:`hf_tpu_ext.args.ModelArguments`.
        remember: the next :func:`check_run` of the same references does not check them again (``hf-tpu train``
            checks them right after parsing: :mod:`hf_tpu_ext.commands.early_checks`).

    Raises:
        ArgumentError: a missing local path, an invalid repo id, or a local model folder whose weights cannot be
            read (:func:`hf_tpu_ext.backends.model_files.check_weights_folder`).
        HubRepoError / HubAuthError: a repo id that does not exist or cannot be reached (the endpoint is named).
    """
    refs = _model_refs(model_args)
    for option, value, revision in refs:
        if check_model_ref(value, option, revision=revision) == "local" and option == "--model_name_or_path":
            check_weights_folder(value, option)  # a truncated copy: one line, not the loader's traceback
    if remember:
        _REMEMBERED_REFS.append(refs)


def _check_model_refs_once(model_args) -> None:
    """:func:`check_model_refs`, unless the command line's early checks found these references already."""
    refs = _model_refs(model_args)
    if refs in _REMEMBERED_REFS:
        _REMEMBERED_REFS.remove(refs)  # taken once: a library caller's next run is checked again
        return
    check_model_refs(model_args)


def read_model_type(model_args):
    """``(model_type, where)`` of the model the run trains, read without transformers: ``config.json`` of
    ``--model_name_or_path`` (a folder, or one download from the Hub at ``--model_revision``) or ``--config_name``,
    else ``--model_type``. ``(None, name)`` when the config cannot be read (the model loader reports that)."""
    import json

    name = model_args.model_name_or_path or model_args.config_name
    if not name:
        model_type = getattr(model_args, "model_type", None) or DEFAULT_MODEL_TYPE
        return model_type, f"--model_type {model_type}"
    flag = "--model_name_or_path" if model_args.model_name_or_path else "--config_name"
    path = name if os.path.isfile(name) else os.path.join(name, "config.json")
    try:
        if not os.path.isfile(path) and not os.path.isdir(name) and "://" not in name:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(name, "config.json", revision=model_args.model_revision,
                                   cache_dir=model_args.cache_dir)
        with open(path, encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
        return model_type, f"{flag} {name} is a {model_type!r} model"
    except Exception:  # noqa: BLE001 -- unreadable here: the loader's own error names it
        return None, f"{flag} {name}"


def check_model_type(model_args, training_args) -> None:
    """Refuse a ``model_type`` the chosen backend does not train (``deberta-v2``, ``electra``, ``modernbert`` on
    the TensorFlow backend, ...), naming what it trains and the backend to try (no framework imported).

    Raises:
        ArgumentError: one line, e.g. ``--model_name_or_path x is a 'deberta-v2' model: --backend keras does not
            train 'deberta-v2' models (it trains roberta, xlm-roberta, camembert); pass --backend torch_xla (any
            AutoModelForMaskedLM).``; a passed ``--model_type`` that the model's config contradicts
            (:func:`check_passed_model_type`).
    """
    model_type, where = read_model_type(model_args)
    check_passed_model_type(model_args, training_args, model_type)
    try:
        entry = backend_entry(training_args.backend)
    except HfTpuExtError:
        return  # an unknown or uninstalled backend: check_backend says so
    supported = trained_model_types(training_args.backend)
    if model_type is None or supported is None or model_type in supported:
        return
    # the default backend first, then the registry's order; torch_xla's AutoModelForMaskedLM said as such
    order = sorted(BACKEND_REGISTRY, key=lambda name: name != "keras")
    others = [name for name in order if BACKEND_REGISTRY[name] is not entry
              and (trained_model_types(name) is None or model_type in trained_model_types(name))]
    hint = " or ".join(f"--backend {name}" + (" (any AutoModelForMaskedLM)" if trained_model_types(name) is None
                                               else "") for name in others)
    raise ArgumentError(f"{where}: {entry.label} does not train {model_type!r} models (it trains "
                        f"{', '.join(supported)}); " + (f"pass {hint}." if hint else "no backend here trains them."))


def check_passed_model_type(model_args, training_args, model_type) -> None:
    """Refuse a ``--model_type`` passed beside ``--model_name_or_path`` or ``--config_name`` whose config says
    another ``model_type`` (``model_type``: the config's, ``None`` when unread): the config decides the architecture,
    so the flag would change nothing. A library caller's arguments carry no ``passed_flags``: not checked.

    Raises:
        ArgumentError: one line naming both, e.g. ``--model_type bert contradicts --model_name_or_path x, a
            'roberta' model (its config.json decides the architecture): drop --model_type.``
    """
    name = model_args.model_name_or_path or model_args.config_name
    passed = "model_type" in (getattr(training_args, "passed_flags", None) or ())
    if not passed or not name or model_type is None or model_type == model_args.model_type:
        return
    flag = "--model_name_or_path" if model_args.model_name_or_path else "--config_name"
    raise ArgumentError(f"--model_type {model_args.model_type} contradicts {flag} {name}, a {model_type!r} model (its "
                        "config.json decides the architecture): drop --model_type.")

def check_weight_files(model_args, training_args) -> None:
    """Refuse a ``--model_name_or_path`` whose only weights are ``pytorch_model.bin`` where torch, which reads
    them, is not installed (the Keras and TensorFlow backends; torch_xla has torch), before any data work.

    Raises:
        ArgumentError: one line with the two ways out (install torch, or convert once to ``model.safetensors``).
    """
    import importlib.util

    name = model_args.model_name_or_path
    if not name or training_args.backend == "torch_xla" or importlib.util.find_spec("torch") is not None:
        return
    try:
        if os.path.isdir(name):
            files = os.listdir(name)
        else:
            from huggingface_hub import list_repo_files

            files = list_repo_files(name, revision=model_args.model_revision)
    except Exception:  # noqa: BLE001 -- unreachable here: the model loader names it
        return
    if weight_patterns(files) == ["pytorch_model*.bin"] and {PT_WEIGHTS_NAME, PT_WEIGHTS_INDEX_NAME} & set(files):
        raise ArgumentError(
            f"--model_name_or_path {name} has its weights in pytorch_model.bin only, which needs torch to read (not "
            "installed): pip install torch (the CPU build is enough), or convert it once to model.safetensors with "
            "transformers (AutoModelForMaskedLM.from_pretrained(path).save_pretrained(folder)) and pass that folder.")


def check_model_config(model_args, data_args) -> None:
    """Check the model's config before any data work: a pretrained model's position table against
    ``max_seq_length``, its embedding rows against ``--tokenizer_name``'s vocabulary, ``--config_overrides``
    against it; from scratch the config ``--model_type``/``--config_name`` and the overrides make.

    Raises:
        ArgumentError: the sequence is longer than the position table allows (the limit named); a tokenizer
            with more tokens than the model has embedding rows; an unknown or contradicting ``--config_overrides``.
    """
    if not model_args.model_name_or_path:
        check_scratch_positions(scratch_config(model_args), model_args, data_args.max_seq_length)
        return
    from transformers import AutoConfig

    name = model_args.model_name_or_path
    try:
        config = AutoConfig.from_pretrained(name, revision=model_args.model_revision, cache_dir=model_args.cache_dir)
    except (OSError, ValueError):
        return  # the model loader reports a missing/unreadable model with its own error
    check_positions(config, data_args.max_seq_length)
    check_overrides_of_pretrained(config, model_args.config_overrides, name)
    if model_args.tokenizer_name:
        rows, tokens = int(config.vocab_size), len(load_tokenizer(model_args.tokenizer_name,
                                                                  cache_dir=model_args.cache_dir))
        if tokens > rows:
            raise ArgumentError(f"--tokenizer_name {model_args.tokenizer_name} has {tokens} tokens but "
                                f"--model_name_or_path {name} has {rows} embedding rows (vocab_size): ids past "
                                f"{rows - 1} have no embedding. Use the model's own tokenizer (drop --tokenizer_name).")


def callback_names(training_args) -> List[str]:
    """The ``--callbacks`` the backend runs (``push_to_hub`` is the run's own push session, not a callback)."""
    return [c for c in training_args.callback_names if c != "push_to_hub"]


def check_arguments(model_args, data_args, training_args) -> None:
    """The checks of the arguments alone (before the output folder is locked): finite numbers, and
    ``--callbacks push_to_hub`` only with ``--push_to_hub true``.

    Raises:
        ArgumentError: names the flag and what to pass instead.
    """
    check_finite_arguments(model_args, data_args, training_args)
    if "push_to_hub" in training_args.callback_names and not training_args.push_to_hub:
        raise ArgumentError("--callbacks push_to_hub pushes nothing without --push_to_hub true: add "
                            "--push_to_hub true (and --hub_model_id), or drop push_to_hub from --callbacks.")


def check_run(model_args, data_args, training_args) -> None:
    """Every check after the output folder's lock (the run takes it first, so a second run on a busy folder is
    refused before it reads or writes anything there) and before the backend is set up, in order.

    Raises:
        OutputDirError, MissingExtraError, BackendError, UnknownCallbackError, DataError, ArgumentError,
        HubRepoError, HubAuthError: the first check that fails (nothing written yet).
    """
    args = training_args
    check_output_dir(args)
    _check_model_refs_once(model_args)  # a library caller's references are checked here
    check_backend(args)
    # unknown name -> error now; the torch backend's classes never import TensorFlow (loading TF before
    # torch_xla aborts the process on duplicate LLVM options)
    resolve_callbacks(callback_names(args), backend_entry(args.backend).callback_kind)
    require_run_packages(backend_entry(args.backend))  # the card's packages: now, not after training
    check_data_files(data_args)
    check_model_type(model_args, args)
    check_weight_files(model_args, args)
    check_model_config(model_args, data_args)
