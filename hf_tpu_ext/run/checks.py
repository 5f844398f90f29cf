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

from hf_tpu_ext.errors import ArgumentError, OutputDirError


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
    """The names in the folder ``out`` other than a run's lock file (``[]`` when it does not exist)."""
    from hf_tpu_ext.run_lock import LOCK_NAME

    return [n for n in os.listdir(out) if n != LOCK_NAME] if os.path.isdir(out) else []


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
    from hf_tpu_ext.fileio import check_writable_dir

    check_writable_dir(out, "--output_dir")  # before any data or model work


def check_backend(training_args) -> None:
    """Raise ``BackendError`` for a backend whose packages are missing (with the install command).

    Raises:
        MissingExtraError: the TensorFlow backend without ``pip install 'hf-tpu-ext[tensorflow]'``.
        MissingExtraError: ``--backend torch_xla`` without ``pip install 'hf-tpu-ext[torch-xla]'``.
        MissingExtraError: ``--backend keras`` without ``pip install 'hf-tpu-ext[jax]'``.
        BackendError: an unknown ``--backend``.
    """
    from hf_tpu_ext.backends import backend_entry
    from hf_tpu_ext.extras import require_extra

    entry = backend_entry(training_args.backend)
    require_extra(entry.extra, entry.label)
    from hf_tpu_ext.backends import prepare_environment

    prepare_environment(training_args.backend)  # e.g. KERAS_BACKEND=jax before the callbacks' check imports Keras


def check_data_files(data_args) -> None:
    """Check local data files exist and have a supported format (before TensorFlow is even imported).

    Raises:
        DataFileNotFoundError: a file does not exist. DataError: unsupported format.
    """
    from hf_tpu_ext.data.loading import check_data_file, is_tfrecord_source

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
    from hf_tpu_ext.hub.model_ref import check_model_ref

    from hf_tpu_ext.backends.model_files import check_weights_folder

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


def check_model_config(model_args, data_args) -> None:
    """Check ``max_seq_length`` against the positions of a given model/config before any data work.

    Raises:
        ArgumentError: the sequence is longer than the model's position embeddings allow.
    """
    name = model_args.model_name_or_path or model_args.config_name
    if not name:
        return
    from transformers import AutoConfig

    from hf_tpu_ext.model_config import check_positions

    try:
        config = AutoConfig.from_pretrained(name, revision=model_args.model_revision, cache_dir=model_args.cache_dir)
    except (OSError, ValueError):
        return  # the model loader reports a missing/unreadable model with its own error
    if model_args.config_name and not model_args.model_name_or_path:
        return  # from scratch: build_model widens the positions to fit
    check_positions(config, data_args.max_seq_length)


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
    from hf_tpu_ext.callbacks import resolve_callbacks

    # unknown name -> error now; the torch backend's classes never import TensorFlow (loading TF before
    # torch_xla aborts the process on duplicate LLVM options)
    from hf_tpu_ext.backends import backend_entry

    resolve_callbacks(callback_names(args), backend_entry(args.backend).callback_kind)
    from hf_tpu_ext.extras import require_run_packages

    require_run_packages(backend_entry(args.backend))  # the card's packages: now, not after training
    check_data_files(data_args)
    check_model_config(model_args, data_args)
