"""Validation helpers of the argument dataclasses: number ranges, Hub repo ids, ``--report_to``, cross-class checks.

Each raises :class:`~hf_tpu_ext.errors.ArgumentError` with one line naming the flag and what to pass instead.
"""

from __future__ import annotations

import math
from typing import List

from hf_tpu_ext.args.defaults import REPORT_TO
from hf_tpu_ext.errors import ArgumentError


def check_number(name: str, value, low=None, high=None, low_open=False, high_open=False) -> None:
    """Raise ``ArgumentError`` naming ``--name`` unless ``value`` is a finite number in the given range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ArgumentError(f"--{name} must be a finite number, got {value!r}.")
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        interval = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
        raise ArgumentError(f"--{name} must be in {interval}, got {value!r}.")


def check_repo_id(repo_id: str, flag: str) -> str:
    """Refuse a Hub repo id of the wrong form at once (before any start-up or network request).

    Uses ``huggingface_hub.utils.validate_repo_id`` (no request); its reason is kept, its ``repo_type`` hint
    (meant for Python callers) dropped.

    Args:
        repo_id: ``"user/name"`` or ``"name"``.
        flag: the option to name, e.g. ``"--hub_model_id"``.

    Returns:
        ``repo_id`` unchanged.

    Raises:
        ArgumentError: e.g. ``--hub_model_id 'bad repo//x' is not a valid Hub repo id: repo id must be in the
            form 'repo_name' or 'namespace/repo_name'. Use the form 'user/name'.``
    """
    import re

    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        reason = str(err).replace(" Use `repo_type` argument if needed.", "")
        reason = re.sub(r":\s*'[^\n]*'\.?$", ".", reason)  # the id is named in our message already
        raise ArgumentError(f"{flag} {repo_id!r} is not a valid Hub repo id: {reason[:1].lower()}{reason[1:]} "
                            "Use the form 'user/name'.") from None
    return repo_id


def resolve_report_to(value, backend: str) -> List[str]:
    """``report_to`` as a list of integrations (transformers' spellings: a name, a list, "all", "none").

    Raises:
        ArgumentError: an integration this package does not drive, or one whose package is not installed.
    """
    import importlib.util

    if value is None:
        value = ["tensorboard"]
    if isinstance(value, str):
        value = [value]
    names = [n.strip() for v in value for n in str(v).split(",") if n.strip()]

    def installed(name):
        # TensorFlow writes TensorBoard event files itself; the torch backend needs the tensorboard package
        if name == "tensorboard" and backend == "tensorflow":
            return True
        return importlib.util.find_spec(name) is not None

    if names in ([], ["none"]):
        return []
    if names == ["all"]:
        return [n for n in REPORT_TO if installed(n)]
    for name in names:
        if name not in REPORT_TO:
            raise ArgumentError(f"--report_to {name!r} is not supported; choose from: {', '.join(REPORT_TO)}, all, none.")
        if not installed(name):
            raise ArgumentError(f"--report_to {name} needs the {name!r} package, which is not installed: "
                                f"`pip install {name}`, or pass --report_to none.")
    return list(dict.fromkeys(names))


def check_arguments(model_args, data_args, training_args) -> None:
    """Checks that need more than one argument dataclass (run by :func:`parse_args`, cheap, no I/O).

    No cap on ``max_seq_length`` here: the model's position table decides (``model_config.check_positions`` /
    ``check_scratch_positions``), and attention holds no ``L x L`` tensor on the Keras backend's JAX kernels
    (``backends/keras/architectures/attention.py``), so ModernBERT trains at its 8,192.

    Raises:
        ArgumentError: ``--streaming`` without what it needs (:func:`check_streaming`); ``--pack_documents true`` on
            a backend other than keras.
    """
    backend = getattr(training_args, "backend", None)
    if getattr(data_args, "pack_documents", False) and backend != "keras":
        raise ArgumentError(f"--pack_documents true is implemented by --backend keras only (segment ids through its "
                            f"attention kernels); pass --backend keras, or drop --pack_documents with --backend "
                            f"{backend}.")
    if data_args.streaming:
        check_streaming(model_args, training_args)


def check_streaming(model_args, training_args) -> None:
    """``--streaming``'s needs (part of :func:`check_arguments`): ``--backend keras``, ``--max_steps`` and a tokenizer.

    Raises:
        ArgumentError: another backend, no ``--max_steps`` (a stream has no length), no ``--tokenizer_name`` nor
            ``--model_name_or_path`` (a BPE is trained on a whole split, which a stream never holds) in a run that
            is not a resume (a resume reads the tokenizer beside its checkpoint).
    """
    backend = training_args.backend
    if backend != "keras":
        raise ArgumentError(f"--streaming is read by --backend keras only (a datasets IterableDataset, one slice per "
                            f"process); --backend {backend} reads the whole data: pass --backend keras, or drop "
                            "--streaming.")
    if training_args.max_steps <= 0:
        raise ArgumentError("--streaming needs --max_steps > 0: a streamed dataset has no length, so epochs cannot "
                            "be counted (as in transformers' run_mlm).")
    resuming = bool(getattr(training_args, "resume_from_checkpoint", None))  # the checkpoint's tokenizer is read
    if not (model_args.tokenizer_name or model_args.model_name_or_path or resuming):
        raise ArgumentError("--streaming needs --tokenizer_name or --model_name_or_path: a new tokenizer is trained "
                            "on the whole training split, which a stream never holds.")
