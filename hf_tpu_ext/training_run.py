"""``hf-tpu train`` as one backend-neutral, resumable run: checks -> data -> fit -> export -> card -> push -> Space.

:class:`TrainingRun` owns the whole lifecycle once, for every backend (a :class:`hf_tpu_ext.backends.base.Backend`
only builds the model, fits, saves/restores checkpoints and exports):

1. **checks** (nothing written yet): arguments (finite numbers), output folder (empty or resumable, writable),
   backend packages, callback names, data files, Hub access (the pusher's preflight), the checkpoint to resume
   from (newest readable one; its tokenizer and model shape win over flags left at their defaults, a flag
   that contradicts it is an error), data and split sizes;
2. **train**: the backend's ``fit``; after every checkpoint the run saves ``trainer_state.json`` with it
   (log history, best metric and step, epoch, tokens seen, wall time so far) and hands it to the pusher;
3. **export**: model folder + ``training_args.json``, ``trainer_state.json``, ``all_results.json``,
   ``training_summary.json``, ``loss_curve.png``;
4. **card**: ``README.md``;
5. **push**: the final push, waited for; its report goes into ``training_summary.json``;
6. **space**: the fill-mask demo Space.

Which phases are done is kept in ``output_dir/run_state.json`` (:data:`RUN_STATE_NAME`), so
``--resume_from_checkpoint true`` after a kill finishes what the killed process did not (a missing export, a
final push the Hub lacks) instead of stopping at "nothing to train".

Signals (:mod:`hf_tpu_ext.interrupts` owns them): a first SIGINT (Ctrl-C) or SIGTERM is a save. The backend's
loop stops at the next step boundary and checkpoints that step (with its trainer state; pushed as
``last-checkpoint/`` with ``--hub_strategy checkpoint``), the pushes are waited for within the grace budget
``--save_on_signal_timeout`` (counted from the signal; what did not land is logged and written into
``training_summary.json`` ``interrupted``), and :class:`~hf_tpu_ext.errors.TrainingInterrupted` carries the one
line telling how to resume and the signal (exit status 128 + signum: 130, 143). A signal during the final push
lets it finish within the same budget. A second signal stops every wait at once. Any error raised after a
signal is reported as the interruption.

Test hook: the environment variable ``HF_TPU_EXT_TEST_KILL_AT`` (:data:`KILL_ENV`) set to a phase name
(``train``: after the first checkpoint; ``checkpoint_weights``: a checkpoint's weight files are written, its
trainer state is not; ``checkpoint``: after the last checkpoint, before the export;
``export``: half-way through the export; ``card``: after the card is written; ``push``: while the final
push is in flight) makes the process SIGKILL itself there. Only the tests set it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from hf_tpu_ext import interrupts
from hf_tpu_ext.errors import (ArgumentError, CheckpointError, HubPushError, IncompleteCheckpointError,
                               OutputDirError, TrainingInterrupted)

logger = logging.getLogger("hf_tpu_ext")

PHASES = ("train", "export", "card", "push", "space")
RUN_STATE_NAME = "run_state.json"
KILL_ENV = interrupts.KILL_ENV
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: model-shape flags that a resumed checkpoint decides (a flag left unset takes the checkpoint's value)
SHAPE_FLAGS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
#: flags whose value is a secret, in every spelling argparse accepts (``--hub-token`` is HfArgumentParser's alias)
SECRET_FLAGS = ("hub_token",)


def _test_kill(phase: str) -> None:
    """The test hook of the module doc: SIGKILL this process at ``phase`` when ``HF_TPU_EXT_TEST_KILL_AT`` says so."""
    interrupts.kill_for_test(phase)


def _is_secret_flag(arg: str) -> bool:
    """``--hub_token``, ``--hub-token``, ``--hub_token=...``, ``--hub-token=...`` (any flag named ``*token``)."""
    if not arg.startswith("--"):
        return False
    name = arg[2:].split("=", 1)[0].replace("-", "_")
    return name in SECRET_FLAGS or name.endswith("_token")


def redact_argv(argv: List[str], secrets: tuple = ()) -> List[str]:
    """``argv`` without the secret flags and their values (:data:`SECRET_FLAGS`, every spelling), and with any
    other occurrence of a ``secrets`` value replaced by ``<redacted>``."""
    out: List[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if _is_secret_flag(a):
            skip = "=" not in a and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        for secret in secrets:
            if secret and secret in a:
                a = a.replace(secret, "<redacted>")
        out.append(a)
    return out


def setup_logging(level=logging.INFO):
    """A stream handler on the ``hf_tpu_ext`` logger (once)."""
    if not logging.getLogger("hf_tpu_ext").handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        root = logging.getLogger("hf_tpu_ext")
        root.addHandler(handler)
        root.setLevel(level)
        root.propagate = False


# ---------------------------------------------------------------------------------------------- checks
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


def check_output_dir(training_args) -> None:
    """Refuse a non-empty ``output_dir`` unless overwriting or resuming was asked for, and an unwritable one.

    Raises:
        OutputDirError: the folder holds files (nothing in it is touched), is a file, or cannot be written.
    """
    from hf_tpu_ext.run_lock import LOCK_NAME

    out = training_args.output_dir
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputDirError(f"--output_dir {out!r} exists and is a file; choose a folder path.")
    entries = [n for n in os.listdir(out) if n != LOCK_NAME] if os.path.isdir(out) else []  # this run's lock
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


def check_model_refs(model_args) -> None:
    """``--model_name_or_path``, ``--config_name`` and ``--tokenizer_name`` each name an existing folder or Hub repo
    (one bounded request per repo id; before TensorFlow is imported).

    Raises:
        ArgumentError: a missing local path or an invalid repo id.
        HubRepoError / HubAuthError: a repo id that does not exist or cannot be reached (the endpoint is named).
    """
    from hf_tpu_ext.hub.model_ref import check_model_ref

    for option in ("model_name_or_path", "config_name", "tokenizer_name"):
        value = getattr(model_args, option, None)
        if value and not (option == "config_name" and os.path.isfile(value)):  # a config.json file is fine
            check_model_ref(value, f"--{option}", revision=model_args.model_revision if option != "tokenizer_name"
                            else None)


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


def make_backend(name: str):
    """The :class:`~hf_tpu_ext.backends.base.Backend` of ``--backend`` (:data:`hf_tpu_ext.backends.BACKEND_REGISTRY`)."""
    from hf_tpu_ext.backends import make_backend as make

    return make(name)


def resume_hint(argv: Optional[List[str]] = None, secrets: tuple = ()) -> str:
    """``hf-tpu train <same flags> --resume_from_checkpoint true``: without the token flags in any spelling
    (``--hub_token``, ``--hub-token``, with ``=`` or not; the token comes from ``HF_TOKEN`` or the login again),
    and with any ``secrets`` value found elsewhere replaced by ``<redacted>``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":
        argv = argv[1:]
    kept: List[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0].replace("-", "_")
        if name in ("__resume_from_checkpoint", "__overwrite_output_dir"):
            skip = "=" not in a and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        kept.append(a)
    kept = redact_argv(kept, secrets)
    return "hf-tpu train " + " ".join(shlex.quote(a) for a in kept + ["--resume_from_checkpoint", "true"])


def checkpoint_seq_length(trainer_state: Optional[Dict[str, Any]]) -> Optional[int]:
    """The block length a checkpoint was trained at, from the trainer state saved with it: tokens seen per
    sequence (``num_input_tokens_seen / (global_step * train_batch_size)``); ``None`` when it does not say."""
    state = trainer_state or {}
    try:
        tokens, step, batch = (int(state.get(k) or 0) for k in ("num_input_tokens_seen", "global_step",
                                                                 "train_batch_size"))
    except (TypeError, ValueError):
        return None
    if tokens <= 0 or step <= 0 or batch <= 0 or tokens % (step * batch):
        return None
    return tokens // (step * batch)


# ---------------------------------------------------------------------------------------------- run state
def read_run_state(output_dir: str) -> Dict[str, Any]:
    """``output_dir/run_state.json`` (``{}`` when missing or unreadable): ``{"global_step", "max_steps",
    "phases": {phase: "done" | "pushed" | "skipped"}}``."""
    try:
        with open(os.path.join(output_dir, RUN_STATE_NAME), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write_json(path: str, data) -> None:
    from hf_tpu_ext.fileio import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def whole_run_train_loss(log_history: List[Dict[str, Any]], start: int = 0) -> Optional[float]:
    """Mean training loss over all steps of the run, from the log history's window means.

    Each ``{"step": s, "loss": l}`` entry is the mean over the steps since the previous loss entry, so
    ``sum(l_i * (s_i - s_{i-1})) / s_last`` is the mean over every step. Exact across resumes at any step: a
    checkpoint keeps the partial logging window (TensorFlow: ``loss_window`` in its sidecar), so the entry after
    a resume between two logging steps is the mean over the same steps as in an uninterrupted run.
    """
    prev, total, n = start, 0.0, 0
    for e in log_history:
        if "loss" in e and isinstance(e.get("step"), int) and e["step"] > prev:
            total += float(e["loss"]) * (e["step"] - prev)
            n += e["step"] - prev
            prev = e["step"]
    return total / n if n else None


def best_of(log_history: List[Dict[str, Any]], metric: str = "eval_loss", greater_is_better: bool = False):
    """``(best value, its global step)`` of ``metric`` in a log history (``(None, None)`` without one).

    Step 0 (``eval_on_start``) is the untrained baseline and never the best, as in the TF trainer.
    """
    best, step = None, None
    for e in log_history:
        if not e.get("step"):
            continue
        v = e.get(metric)
        if isinstance(v, (int, float)) and math.isfinite(v):
            if best is None or (v > best if greater_is_better else v < best):
                best, step = float(v), e.get("step")
    return best, step


#: the run's SIGINT/SIGTERM handler (kept under its old name; :class:`hf_tpu_ext.interrupts.handling`)
_Signals = interrupts.handling


def merge_push_reports(reports: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """One ``hub_pushes`` report for a run of several processes (a resume after a signal or a kill).

    Totals (int fields: ``pushed``, ``failed``, ``superseded``, ...) are summed, ``pushes`` (the outcomes) are
    concatenated (the last 100 kept), ``final_pushed`` is true when any process landed the final push; the
    other fields (``pending``, ``timed_out``, ``repo_id``, ...) are the last process's. ``processes`` counts
    the reports merged. ``None`` for no report.
    """
    reports = [r for r in reports if isinstance(r, dict)]
    if not reports:
        return None
    merged: Dict[str, Any] = dict(reports[-1])
    for key in set().union(*reports):
        values = [r.get(key) for r in reports if key in r]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            merged[key] = sum(values)
        elif key == "pushes" and all(isinstance(v, list) for v in values):
            merged[key] = [o for v in values for o in v][-100:]
    merged["final_pushed"] = any(bool(r.get("final_pushed")) for r in reports)
    merged["processes"] = len(reports)
    return merged


# ---------------------------------------------------------------------------------------------- the run
class TrainingRun:
    """One ``hf-tpu train`` run (see the module doc for the phases and the order of checks).

    Args:
        model_args, data_args, training_args: the parsed :mod:`hf_tpu_ext.args` dataclasses.
        backend: a :class:`~hf_tpu_ext.backends.base.Backend` (default: from ``--backend``).
        argv: the command line, for the resume hint of an interrupted run (default: ``sys.argv``).
    """

    def __init__(self, model_args, data_args, training_args, backend=None, argv: Optional[List[str]] = None):
        self.model_args, self.data_args, self.args = model_args, data_args, training_args
        self.backend = backend
        self.argv = argv
        self.pusher = None
        self.token = None
        self.log_history: List[Dict[str, Any]] = []
        self.step = 0
        self.prior_runtime = 0.0
        self._tmp_dirs: List[str] = []
        self._resume_download = None  # (temp folder, repo spec) of a Hub resume: messages show the spec
        self.push_report: Optional[Dict[str, Any]] = None
        self.run_state: Dict[str, Any] = {}
        self.plan = None
        self._process_id = f"{os.getpid()}-{time.time():.0f}"  # this process's entry in run_state hub_pushes

    # ------------------------------------------------------------------ checks before any file is written
    def _check(self) -> None:
        args = self.args
        check_finite_arguments(self.model_args, self.data_args, args)
        if "push_to_hub" in args.callback_names and not args.push_to_hub:
            raise ArgumentError("--callbacks push_to_hub pushes nothing without --push_to_hub true: add "
                                "--push_to_hub true (and --hub_model_id), or drop push_to_hub from --callbacks.")
        from hf_tpu_ext.run_lock import lock_output_dir

        # first: a second run on a busy folder is refused before it reads or writes anything there
        self._lock = lock_output_dir(args.output_dir)
        check_output_dir(args)
        check_model_refs(self.model_args)
        check_backend(args)
        from hf_tpu_ext.callbacks import resolve_callbacks

        # unknown name -> error now; the torch backend's classes never import TensorFlow (loading TF before
        # torch_xla aborts the process on duplicate LLVM options)
        from hf_tpu_ext.backends import backend_entry

        resolve_callbacks(self.callback_names, backend_entry(args.backend).callback_kind)
        from hf_tpu_ext.extras import require_run_packages

        require_run_packages(backend_entry(args.backend))  # the card's packages: now, not after training
        check_data_files(self.data_args)
        check_model_config(self.model_args, self.data_args)

    @property
    def callback_names(self) -> List[str]:
        return [c for c in self.args.callback_names if c != "push_to_hub"]

    def _open_pusher(self) -> None:
        """Token and Hub pusher before any data or compute work: the token, the repo id and write access are
        checked here (:func:`~hf_tpu_ext.hub.preflight.check_push_access`, nothing created); the repo is created
        by the session's preflight after the data checks (:meth:`_run_phases`), so a run refused for its data
        leaves no empty repo."""
        from hf_tpu_ext.hub.resume import looks_like_repo_spec

        args = self.args
        hub_resume = bool(args.resume_from_checkpoint) and not args.resume_latest and looks_like_repo_spec(
            args.resume_from_checkpoint)
        if args.push_to_hub or hub_resume:
            from hf_tpu_ext.hub.preflight import resolve_token

            self.token = resolve_token(args.hub_token)
        if args.push_to_hub and self.backend.is_chief:
            from hf_tpu_ext.hub.push_session import PushConfig, PushSession

            repo = args.hub_model_id or os.path.basename(os.path.abspath(args.output_dir))
            # the backend decides when to save; the session what a save pushes, when, and the budget
            config = PushConfig.from_training_args(args, self.data_args, hub_model_id=repo, hub_token=self.token,
                                                   save_strategy="no", save_steps=None)
            self.pusher = PushSession(config, is_chief=True)
            from hf_tpu_ext.hub.preflight import check_push_access

            check_push_access(repo, self.token)

    def _resume_checkpoint(self):
        """The :class:`CheckpointInfo` to resume from (``None``: a fresh run) and the folder of its tokenizer.

        A newest local checkpoint that cannot be read is skipped with a warning (the next older one is used);
        an explicitly named one raises ``CheckpointError`` naming the file.
        """
        from hf_tpu_ext.hub.checkpoint_layouts import check_checkpoint_backend
        from hf_tpu_ext.hub.resume import looks_like_repo_spec

        args, backend = self.args, self.backend
        spec = args.resume_from_checkpoint
        if not spec:
            return None, None
        if args.resume_latest:
            candidates = backend.find_checkpoints(args.output_dir) if os.path.isdir(args.output_dir) else []
            if not candidates:
                check_checkpoint_backend(args.output_dir, backend.name)
                raise CheckpointError(
                    f"--resume_from_checkpoint true found no checkpoint in {args.output_dir!r}. Train without "
                    "--resume_from_checkpoint, or give a checkpoint folder or Hub repo id.")
            tokenizer_dir = args.output_dir
        elif os.path.exists(spec) or os.path.exists(spec + ".index"):
            candidates = backend.find_checkpoints(spec)[:1]
            if not candidates:
                check_checkpoint_backend(spec, backend.name)
                raise CheckpointError(f"No checkpoint of --backend {backend.name} found at {spec!r}.")
            tokenizer_dir = None
        elif looks_like_repo_spec(spec):
            from hf_tpu_ext.hub.resume import download_last_checkpoint

            local = tempfile.mkdtemp(prefix="hf-tpu-resume-")
            self._tmp_dirs.append(local)
            self._resume_download = (local, spec)  # messages name the repo, not this temp folder
            try:
                folder = download_last_checkpoint(spec, self.token, local, is_checkpoint=backend.is_checkpoint_folder,
                                                  also=TOKENIZER_FILES + ("special_tokens_map.json",))
            except CheckpointError:
                check_checkpoint_backend(local, backend.name, shown=f"the Hub repo {spec}")  # it has one, of another
                raise
            candidates = backend.find_checkpoints(folder)[:1]
            tokenizer_dir = local
        else:
            raise CheckpointError(
                f"--resume_from_checkpoint {spec!r} is neither a local checkpoint/folder, 'true', nor a Hub repo id "
                "'user/name[@revision]'.")
        info, errors = None, []
        for i, path in enumerate(candidates):
            try:
                info = backend.checkpoint_info(path)
                break
            except CheckpointError as err:
                if not args.resume_latest:  # named explicitly: nothing to fall back to
                    raise CheckpointError(f"{self._shown(str(err))} Name an older checkpoint, or start a new "
                                          "run.") from None
                errors.append(err)
                if i + 1 < len(candidates):  # the last one's failure is said once, by the error below
                    logger.warning("%s Resuming from the next older checkpoint instead.", err)
        if info is None:
            if errors and all(isinstance(e, IncompleteCheckpointError) for e in errors):
                # the first save of the run was stopped: nothing was saved, so the run starts at step 0
                logger.warning("No complete checkpoint in %s: training starts at step 0.", args.output_dir)
                return None, None
            raise CheckpointError("No readable checkpoint to resume from: " + " | ".join(map(str, errors)))
        if tokenizer_dir is None:
            here = os.path.abspath(info.path if os.path.isdir(info.path) else os.path.dirname(info.path))
            for folder in (here, os.path.dirname(here), os.path.dirname(os.path.dirname(here))):
                if all(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES):
                    tokenizer_dir = folder
                    break
        elif not all(os.path.isfile(os.path.join(tokenizer_dir, f)) for f in TOKENIZER_FILES):
            tokenizer_dir = None
        return info, tokenizer_dir

    def _shown(self, text: str) -> str:
        """``text`` with the temp folder of a Hub resume replaced by ``hf://<repo id>`` (what the user typed)."""
        download = getattr(self, "_resume_download", None)
        if download:
            local, spec = download
            text = str(text).replace(local + os.sep, f"hf://{spec}/").replace(local, f"hf://{spec}")
        return str(text)

    def _passed(self, name: str, owner) -> bool:
        """Whether the user set ``name`` (command line or JSON config: ``training_args.passed_flags`` from
        :func:`hf_tpu_ext.args.parse_args`); without that record, whether it differs from the field's default."""
        passed = getattr(self.args, "passed_flags", None)
        if passed is not None:
            return name in passed
        default = next((f.default for f in dataclasses.fields(owner) if f.name == name), None)
        return getattr(owner, name, None) != default

    def _apply_checkpoint_shape(self, info) -> None:
        """The checkpoint's model shape and block length win over flags left at their defaults.

        The shape flags (:data:`SHAPE_FLAGS`) left unset take the checkpoint's values; so does
        ``--max_seq_length`` when it was not passed (the checkpoint's length: ``num_input_tokens_seen / (global_step
        * train_batch_size)`` of its trainer state, else its position embeddings less RoBERTa's 2 reserved ones),
        with ``max_predictions_per_seq`` re-derived unless passed. Only a flag the user passed can contradict it.

        Raises:
            CheckpointError: a passed flag contradicts the checkpoint (named with both values, the checkpoint by
                the path or Hub repo id given to --resume_from_checkpoint), before any data work.
        """
        saved = info.model_config or {}
        m, data_args = self.model_args, self.data_args
        conflicts = []
        for name in SHAPE_FLAGS:
            if saved.get(name) is None:
                continue
            given = getattr(m, name, None)
            if given is not None and int(given) != int(saved[name]):
                conflicts.append(f"--{name} {given} (the checkpoint has {saved[name]})")
            elif given is None and not m.model_name_or_path and not m.config_name:
                setattr(m, name, int(saved[name]))
        positions = saved.get("max_position_embeddings")
        limit = int(positions) - 2 if positions else None
        length = data_args.max_seq_length
        if self._passed("max_seq_length", data_args):
            if limit and length > limit:
                conflicts.append(f"--max_seq_length {length} (the checkpoint's model holds {limit} tokens)")
            elif limit and length < limit and not m.model_name_or_path and not m.config_name:
                # the default config gets length + 2 positions: keep the checkpoint's, which hold the shorter length
                m.checkpoint_max_position_embeddings = int(positions)
        else:
            trained = checkpoint_seq_length(info.trainer_state)
            target = trained if trained and (not limit or trained <= limit) else (min(length, limit) if limit else None)
            if target and target != length:
                data_args.max_seq_length = target
                if not self._passed("max_predictions_per_seq", data_args):
                    data_args.max_predictions_per_seq = max(1, int(round(target * data_args.mlm_probability)))
                logger.info("--max_seq_length not given: resuming with the checkpoint's %d (the default is %d).",
                            target, length)
        if conflicts:
            where = self._shown(info.path)
            raise CheckpointError(
                f"These flags contradict the checkpoint {where} being resumed: {'; '.join(conflicts)}. Drop them "
                "(the checkpoint's values are used) or start a new run in another --output_dir.")

    # ------------------------------------------------------------------ data
    def _load_data(self, tokenizer_source):
        from hf_tpu_ext.data.loading import is_tfrecord_source
        from hf_tpu_ext.data.run_data import load_text_blocks, load_tfrecord_blocks
        from hf_tpu_ext.errors import DataError

        data_args, backend = self.data_args, self.backend
        if data_args.train_file and is_tfrecord_source(data_args.train_file):
            if not backend.supports_tfrecord:
                raise DataError(
                    f"{data_args.train_file} holds TFRecord shards, which --backend {backend.name} does not read; pass "
                    "the text files (--train_file/--validation_file) or a --dataset_name, or use --backend tensorflow.")
            from hf_tpu_ext.data.tfrecord import check_tfrecord_location

            check_tfrecord_location(data_args.train_file, backend.needs_remote_data)
            return load_tfrecord_blocks(self.model_args, data_args, tokenizer_source)
        if backend.needs_remote_data:
            raise DataError("A TPU Node reads data from Cloud Storage: run `hf-tpu prepare-data --output_path gs://...` "
                            "and pass that gs:// path as --train_file.")
        return load_text_blocks(self.model_args, data_args, self.args.seed, tokenizer_source)

    def _plan(self, blocks):
        from hf_tpu_ext.backends.base import RunPlan
        from hf_tpu_ext.data.run_data import check_split_size, num_blocks

        args, backend = self.args, self.backend
        # sequences per optimizer step: gradient accumulation splits them into micro-batches inside the step
        global_batch = (args.per_device_train_batch_size * backend.num_replicas
                        * int(getattr(args, "gradient_accumulation_steps", 1) or 1))
        eval_batch = args.per_device_eval_batch_size * backend.num_replicas
        check_split_size(blocks, "train", global_batch, self.data_args)
        do_eval = getattr(args, "do_eval", args.eval_strategy != "no")
        has_eval = bool(do_eval) and num_blocks(blocks.get("validation")) > 0
        if has_eval:
            check_split_size(blocks, "validation", eval_batch, self.data_args)
        n = num_blocks(blocks["train"])
        spe = n // global_batch
        return RunPlan(global_batch_size=global_batch, eval_batch_size=eval_batch,
                       seq_length=self.data_args.max_seq_length, steps_per_epoch=spe,
                       total_steps=args.total_steps(spe), num_train_blocks=n, has_eval=has_eval)

    # ------------------------------------------------------------------ state saved with checkpoints
    def _trainer_state(self, step: int, runtime: float):
        from hf_tpu_ext.flops import flops_per_token
        from hf_tpu_ext.outputs import TrainerState

        plan, args, data_args = self.plan, self.args, self.data_args
        from hf_tpu_ext.args import BEST_METRICS

        # transformers' metric_for_best_model / greater_is_better; eval_loss (lower is better) when unset
        metric = BEST_METRICS[getattr(args, "metric_for_best_model", None) or "loss"]
        greater = bool(getattr(args, "greater_is_better", None)) and metric != "eval_loss"
        best, best_step = best_of(self.log_history, metric, greater)
        tokens = step * plan.global_batch_size * plan.seq_length
        try:
            flops = tokens * flops_per_token(self.backend.model_config(), data_args.max_seq_length,
                                             data_args.max_predictions_per_seq / data_args.max_seq_length)
        except Exception:  # a config without the fields flops needs: leave it out
            flops = 0.0
        return TrainerState(
            global_step=step, epoch=step / plan.steps_per_epoch, max_steps=plan.total_steps,
            num_train_epochs=int(-(-plan.total_steps // plan.steps_per_epoch)), logging_steps=args.logging_steps,
            eval_steps=args.eval_steps, save_steps=args.save_steps, train_batch_size=plan.global_batch_size,
            log_history=[dict(e) for e in self.log_history], best_metric=best, best_global_step=best_step,
            best_model_checkpoint=getattr(self.backend, "best_model_checkpoint", None),
            num_input_tokens_seen=tokens, total_flos=flops, train_runtime=runtime)

    def _on_save(self, step: int, path: str) -> None:
        """After every checkpoint: its trainer state, ``output_dir/trainer_state.json``, then the Hub push."""
        if not self.backend.is_chief:
            return
        self.step = step
        runtime = self.prior_runtime + (time.perf_counter() - self._fit_started)
        state = self._trainer_state(step, runtime)
        state.save(self.backend.checkpoint_state_file(path))
        state.save(os.path.join(self.args.output_dir, "trainer_state.json"))
        self._saves += 1
        if self._saves == 1:
            _test_kill("train")
        if self.pusher is not None and step < self.plan.total_steps and self.pusher.admit(step):
            self._push(step, path, final=False)  # a save the commit budget has no room for is not even exported
            self._record_pushes(self.pusher.report_dict())

    def _push(self, step: int, checkpoint_path: Optional[str], final: bool) -> None:
        """Write the model folder and card, then hand them (and the checkpoint) to the push session (it never waits)."""
        out = self.args.output_dir
        if not final:
            self.backend.export(out, self.tokenizer)
            self._write_summary(self._results(step, None))
            self._write_card()
        folder = None
        if checkpoint_path is not None and self.pusher.wants_checkpoint(final):
            folder = tempfile.mkdtemp(prefix="hf-tpu-ckpt-")
            self.backend.export_checkpoint(checkpoint_path, folder)
        try:
            self.pusher.save(out, step=step, checkpoint_folder=folder, final=final)
        finally:
            if folder:  # the pusher staged its own copy
                shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------------ results and files
    def _results(self, step: int, fit_metrics: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        plan = self.plan
        runtime = self.prior_runtime + (fit_metrics or {}).get("train_runtime", 0.0)
        if fit_metrics is None and self.run_state.get("phases", {}).get("train") == "done":
            # finishing after a kill: the training process's own figures (its runtime is in prior_runtime); killed
            # before it recorded them, those its last checkpoint kept (Keras: checkpoint.json fit_metrics)
            fit_metrics = (self.run_state.get("fit_metrics")
                           or getattr(self.backend, "restored_fit_metrics", None) or None)
        tokens_per_step = plan.global_batch_size * plan.seq_length
        results: Dict[str, Any] = {
            "train_loss": whole_run_train_loss(self.log_history),
            "train_runtime": runtime,
            "train_steps_per_second": step / runtime if runtime > 0 else None,
            "train_samples_per_second": step * plan.global_batch_size / runtime if runtime > 0 else None,
            "train_tokens_per_second": step * tokens_per_step / runtime if runtime > 0 else None,
            "global_step": step,
            "epoch": step / plan.steps_per_epoch,
            "tokens_seen": step * tokens_per_step,
        }
        if fit_metrics:  # this process's segment: throughput of the steps it ran, trace counts
            for k, v in fit_metrics.items():
                if k not in results or results[k] is None:
                    results[k] = v
            results["segment_train_runtime"] = fit_metrics.get("train_runtime")
            results["segment_train_tokens_per_second"] = fit_metrics.get("train_tokens_per_second")
        from hf_tpu_ext.outputs import last_eval_results

        results.update(last_eval_results(self.log_history, self.args))  # the best one with load_best_model_at_end
        return {k: v for k, v in results.items() if v is not None}

    def _summary(self, results: Dict[str, Any]) -> Dict[str, Any]:
        from hf_tpu_ext.hub.model_card import initialization_fields
        from hf_tpu_ext.outputs import build_training_summary

        fields = self.backend.model_summary()
        summary = build_training_summary(
            self.model_args, self.data_args, self.args, backend=self.backend.name,
            device=self.backend.device_summary(), global_batch_size=self.plan.global_batch_size,
            global_step=results["global_step"], steps_per_epoch=self.plan.steps_per_epoch,
            total_steps=self.plan.total_steps, train_metrics=results, log_history=self.log_history,
            model_fields={k: v for k, v in fields.items()
                          if k not in ("optimizer", "jit_compile", "steps_per_execution", "compiler")},
            optimizer=fields.get("optimizer", ""), dataset_description=self.description,
            mask_token=self.tokenizer.mask_token, jit_compile=fields.get("jit_compile"),
            steps_per_execution=fields.get("steps_per_execution", 1),
            compiler=fields.get("compiler") or self.run_state.get("compiler"),
            initialization=initialization_fields(self.model_args.model_name_or_path))
        if self.push_report is not None:
            summary["hub_pushes"] = self.push_report
        return summary

    def _write_summary(self, results) -> None:
        from hf_tpu_ext.outputs import write_training_summary

        write_training_summary(self.args.output_dir, self._summary(results))

    def _write_card(self) -> None:
        from hf_tpu_ext.hub.model_card import save_model_card
        from hf_tpu_ext.outputs import read_training_summary

        args = self.args
        repo_id = self.pusher.repo_id if self.pusher is not None else args.hub_model_id
        save_model_card(args.output_dir, repo_id=repo_id, summary=read_training_summary(args.output_dir),
                        license=args.license, language=args.language)

    def _export(self, results) -> None:
        from hf_tpu_ext.outputs import plot_loss_curve, write_all_results, write_training_args

        out = self.args.output_dir
        self.backend.export(out, self.tokenizer)
        _test_kill("export")
        write_training_args(out, self.model_args, self.data_args, self.args)
        self._trainer_state(self.step, results["train_runtime"]).save(os.path.join(out, "trainer_state.json"))
        write_all_results(out, {k: v for k, v in results.items() if isinstance(v, (int, float))})
        self._write_summary(results)
        plot_loss_curve(self.log_history, os.path.join(out, "loss_curve.png"))

    def _mark(self, phase: str, value: str = "done") -> None:
        if not self.backend.is_chief:
            return
        self.run_state.setdefault("phases", {})[phase] = value
        self.run_state.update(global_step=self.step, max_steps=self.plan.total_steps)
        _write_json(os.path.join(self.args.output_dir, RUN_STATE_NAME), self.run_state)

    def _pending(self, phase: str) -> bool:
        value = self.run_state.get("phases", {}).get(phase)
        if phase == "push":
            return self.pusher is not None and value != "pushed"
        if phase == "space":
            return bool(self.args.hub_space_id) and self.pusher is not None and value != "done"
        return value != "done"

    # ------------------------------------------------------------------ the run
    def run(self) -> Dict[str, Any]:
        """Run every phase not done yet; returns the final metrics (also in ``all_results.json``).

        Raises:
            HfTpuExtError subclasses: bad input, before anything is written into ``output_dir``.
            RunLockedError: another ``hf-tpu train`` holds ``output_dir`` (:mod:`hf_tpu_ext.run_lock`).
            OutputDirError: a write failed (disk full, quota, read-only): one line with the newest intact
                checkpoint and the resume command.
            TrainingInterrupted: SIGINT/SIGTERM; its message is the one line with the resume command.
            HubPushError: the final state could not be pushed (unless ``--hub_allow_push_failure true``).
        """
        setup_logging()
        try:
            return self._run()
        finally:
            for d in self._tmp_dirs:
                shutil.rmtree(d, ignore_errors=True)
            lock = getattr(self, "_lock", None)
            if lock is not None:  # after an error or a signal too; a SIGKILL leaves a stale lock for the next run
                lock.release()

    def _run(self) -> Dict[str, Any]:
        args = self.args
        t_total = time.perf_counter()
        self._check()
        if self.backend is None:
            self.backend = make_backend(args.backend)
        backend = self.backend
        backend.setup(args)
        if getattr(backend, "processes_to_spawn", 0):  # one process per local device, each running this run
            backend.spawn(_spawned_run, (self.model_args, self.data_args, args))
            from hf_tpu_ext.outputs import read_all_results

            return read_all_results(args.output_dir) or {}
        self._open_pusher()
        try:
            with interrupts.handling(getattr(args, "save_on_signal_timeout", None)):
                return self._run_phases(t_total)
        except KeyboardInterrupt:
            raise self._interrupted() from None
        except BaseException as err:
            if interrupts.received() is not None:  # a library failed half-way through the signal: still one line
                raise self._interrupted() from None
            if self.pusher is not None:
                report = self.pusher.report()
                if report.pending:
                    logger.error("training failed; %d push(es) not uploaded: %s", len(report.pending),
                                 ", ".join(report.pending))
                self.pusher.close()
            from hf_tpu_ext.hub.checkpoint_layouts import save_failure_message

            secrets = tuple(t for t in (self.token, getattr(args, "hub_token", None)) if t)
            message = save_failure_message(err, args.output_dir, resume_hint(self.argv, secrets))
            if message:  # disk full, quota, read-only: one line naming the intact checkpoint, not a traceback
                raise OutputDirError(message) from None
            raise

    def _interrupted(self) -> TrainingInterrupted:
        """After a signal: push the checkpoint of the step reached when no save pushed it (the budget had
        coalesced it, or it is the last step's), wait for the pushes within the grace budget (none after a
        second signal), report what did not land (log and ``training_summary.json`` ``interrupted``), and the
        one-line error to raise."""
        signum = interrupts.received() or signal.SIGINT
        try:
            self.step = max(self.step, int(self.backend.current_step()))
        except Exception:  # not built yet
            pass
        not_pushed: List[str] = []
        try:
            if self.pusher is not None:
                try:
                    ckpts = self.backend.find_checkpoints(self.args.output_dir) if self.plan is not None else []
                    if (interrupts.count() < 2 and self.pusher.active and interrupts.seconds_left() and ckpts
                            and ckpts[0].endswith(f"-{self.step}") and self.step > getattr(self, "_start_step", self.step)
                            and self.step not in self.pusher.pushed_steps and self.pusher.admit(self.step)):
                        try:  # a signal is a save: what a resume from the Hub starts from
                            self._push(self.step, ckpts[0], final=False)
                        except Exception as err:  # noqa: BLE001 (the local checkpoint is whole: say so, go on)
                            logger.warning("The checkpoint of step %d was not pushed (%s: %s).", self.step,
                                           type(err).__name__, err)
                    if interrupts.count() < 2:
                        interrupts.wait_until(lambda: not self.pusher.report().pending, interrupts.seconds_left() or 0.0)
                    report = self.pusher.finish(timeout=0)
                except KeyboardInterrupt:  # a second signal: stop waiting
                    report = self.pusher.report()
                finally:
                    self.pusher.close()
                not_pushed = list(report.pending) + [m for m, _ in report.failed]
                self._record_pushes(self.pusher.report_dict())
                if not_pushed:
                    logger.warning("%s: not on the Hub within the %gs grace budget (--save_on_signal_timeout): %s; "
                                   "the local folder has it.", signal.Signals(signum).name, interrupts.grace(),
                                   "; ".join(not_pushed))
            self._write_interrupted_summary(signum, not_pushed)
        except KeyboardInterrupt:  # a second signal while reporting: exit now
            pass
        except Exception as err:  # noqa: BLE001 (stopped before the model existed: the resume line still comes)
            logger.debug("no training_summary.json for the interrupted run: %s", err)
        secrets = tuple(t for t in (self.token, getattr(self.args, "hub_token", None)) if t)
        return TrainingInterrupted(f"interrupted at step {self.step}; resume with: {resume_hint(self.argv, secrets)}",
                                   step=self.step, signum=signum)

    def _write_interrupted_summary(self, signum: int, not_pushed: List[str],
                                   results: Optional[Dict[str, Any]] = None) -> None:
        """``training_summary.json`` of the interrupted run: the figures so far (``results``: the final ones) and
        ``interrupted``: the signal, the step, the checkpoint written for it, the grace budget and what did not
        reach the Hub; with ``results`` (a signal after the last step, every phase finished within the grace
        budget) also ``"completed": true``."""
        if (self.plan is None or not self.backend.is_chief or getattr(self, "tokenizer", None) is None
                or not os.path.isdir(self.args.output_dir)):
            return  # stopped before the data and the model existed: nothing to summarize
        ckpts = self.backend.find_checkpoints(self.args.output_dir)
        summary = self._summary(results if results is not None else self._results(self.step, None))
        summary["interrupted"] = {
            "signal": signal.Signals(signum).name, "global_step": self.step,
            "checkpoint": (os.path.relpath(ckpts[0], self.args.output_dir)
                           if ckpts and ckpts[0].endswith(f"-{self.step}") else None),
            "save_on_signal_timeout": interrupts.grace(), "not_pushed": not_pushed}
        if results is not None:
            summary["interrupted"]["completed"] = True
        from hf_tpu_ext.outputs import write_training_summary

        write_training_summary(self.args.output_dir, summary)

    def _record_pushes(self, report: Optional[Dict[str, Any]]) -> None:
        """Keep this process's push report in ``run_state.json`` (``hub_pushes``: one entry per process of the
        run, merged into ``training_summary.json``), so a resume's report covers the processes before it."""
        if report is None or not self.backend.is_chief:
            return
        history = self.run_state.setdefault("hub_pushes", [])
        if not history or history[-1].get("process") != self._process_id:
            history.append({"process": self._process_id})
        history[-1].update(report=report)
        self.push_report = merge_push_reports([h.get("report") for h in history])
        if os.path.isdir(self.args.output_dir):
            _write_json(os.path.join(self.args.output_dir, RUN_STATE_NAME), self.run_state)

    def _run_phases(self, t_total: float) -> Dict[str, Any]:
        args, backend = self.args, self.backend
        info, tokenizer_source = self._resume_checkpoint()
        if info is not None:
            self._apply_checkpoint_shape(info)
        self.tokenizer, blocks, self.description = self._load_data(tokenizer_source)
        self.plan = plan = self._plan(blocks)
        if self.pusher is not None:  # the data checks passed: now the repo may be created (and the card checked)
            self.pusher.preflight()
        start = info.global_step if info is not None else 0
        self.step = self._start_step = start
        previous = read_run_state(args.output_dir) if args.resume_latest else {}
        self.run_state = previous
        if self.run_state.get("global_step") != start or self.run_state.get("max_steps") != plan.total_steps:
            self.run_state = {}  # another checkpoint or another length: nothing after training is done
        if previous.get("hub_pushes"):  # the push reports of the earlier processes of this run
            self.run_state["hub_pushes"] = previous["hub_pushes"]
        if info is not None:
            logger.info("resuming from %s at global step %d", self._shown(info.path), start)
            state = info.trainer_state
            if state is None and os.path.isfile(os.path.join(args.output_dir, "trainer_state.json")):
                from hf_tpu_ext.outputs import TrainerState

                state = dataclasses.asdict(TrainerState.load(os.path.join(args.output_dir, "trainer_state.json")))
            if state:
                self.log_history[:] = [e for e in state.get("log_history", []) if e.get("step", 0) <= start]
                if int(state.get("global_step", -1)) == start:
                    self.prior_runtime = float(state.get("train_runtime") or 0.0)
        if start >= plan.total_steps:
            self.run_state.setdefault("phases", {})["train"] = "done"
        todo = [p for p in PHASES if self._pending(p)]
        if not todo:
            logger.warning("The checkpoint is at global step %d, the run asks for %d steps, and the export, card and "
                           "pushes are done: nothing to do. Raise --max_steps or --num_train_epochs to train further.",
                           start, plan.total_steps)
            from hf_tpu_ext.outputs import read_all_results

            return dict(read_all_results(args.output_dir) or {}, global_step=start)
        if start >= plan.total_steps:
            logger.info("The checkpoint is at the run's last step %d; finishing: %s", start, ", ".join(todo))

        backend.build(self.model_args, self.data_args, args, self.tokenizer, blocks, plan)
        if info is not None:
            restored = backend.restore(info.path)
            if restored != start:
                raise CheckpointError(f"Checkpoint {self._shown(info.path)} restored global step {restored}, expected "
                                      f"{start}.")

        # every check passed: from here on output_dir is written
        if backend.is_chief:
            os.makedirs(args.output_dir, exist_ok=True)
            if args.overwrite_output_dir and not args.resume_from_checkpoint:  # an earlier run's saves must go
                from hf_tpu_ext.hub.checkpoint_layouts import clear_for_overwrite
                clear_for_overwrite(args.output_dir)
            if not all(os.path.isfile(os.path.join(args.output_dir, f)) for f in TOKENIZER_FILES) or info is None:
                self.tokenizer.save_pretrained(args.output_dir)
            removed = backend.remove_incomplete_checkpoints(args.output_dir)
            if removed:  # a save or export that was killed half-way (the checkpoint resumed from is whole)
                logger.info("removed what a stopped save left: %s", ", ".join(removed))

        fit_metrics = None
        if "train" in todo:
            from hf_tpu_ext.callbacks import build_callbacks

            callbacks = build_callbacks(self.callback_names, backend.run_context(), backend.callback_kind)
            self._saves = 0
            self._fit_started = time.perf_counter()
            # a backend whose loop honours signals stops at a step boundary and saves it (backends/base.py),
            # never inside a TensorFlow op or checkpoint write
            with interrupts.deferring(getattr(backend, "checks_interrupts", False)):
                fit_metrics = backend.fit(callbacks, self._on_save, start, self.log_history)
                interrupts.check()
                self.step = int(fit_metrics["global_step"])
                # with the best model loaded, a final evaluation would repeat the best one (same weights, masks)
                evaluates = plan.has_eval or getattr(backend, "scores_probes", False)
                if evaluates and not getattr(backend, "loaded_best", False) and not any(
                        e.get("step") == self.step and ("eval_loss" in e or "probe_mrr" in e)
                        for e in self.log_history[-2:]):
                    metrics = backend.evaluate()
                    if metrics:
                        self.log_history.append(dict(metrics, epoch=round(self.step / plan.steps_per_epoch, 4),
                                                     step=self.step))
                if backend.is_chief:  # the final checkpoint's state now holds the final evaluation too
                    ckpts = backend.find_checkpoints(args.output_dir)
                    if ckpts and ckpts[0].endswith(f"-{self.step}"):
                        self._trainer_state(self.step, self.prior_runtime + fit_metrics["train_runtime"]).save(
                            backend.checkpoint_state_file(ckpts[0]))
                # what only the training process measured, for a resume that finishes the export (all_results, card)
                self.run_state["fit_metrics"] = {k: v for k, v in fit_metrics.items()
                                                 if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
                self.run_state["compiler"] = backend.model_summary().get("compiler")
                self._mark("train")
            _test_kill("checkpoint")
        return self._after_training(todo, fit_metrics, t_total)

    def _after_training(self, todo: List[str], fit_metrics: Optional[Dict[str, Any]], t_total: float) -> Dict[str, Any]:
        """The phases after the last step: export, card, final push, Space. A first signal here (or during the
        final evaluation) is deferred: a phase starts while the grace budget lasts, the final push waits within
        it, and a run whose phases all finished ends complete (``interrupted.completed`` in the summary); the
        Space waits for a resume."""
        args, backend = self.args, self.backend
        results = self._results(self.step, fit_metrics)
        if not backend.is_chief:
            return results

        def budget_left() -> None:  # after a signal a phase starts only with some of the grace budget left
            if interrupts.received() is not None and not interrupts.seconds_left():
                interrupts.check()

        with interrupts.deferring(True):
            if "export" in todo or "train" in todo:
                budget_left()
                self._export(results)
                self._mark("export")
            if fit_metrics is not None:
                backend.end_training({k: v for k, v in results.items() if isinstance(v, float)})
            if "card" in todo or "export" in todo or "train" in todo:
                budget_left()
                self._write_card()
                _test_kill("card")
                self._mark("card")
            if self.pusher is not None and self._pending("push"):
                budget_left()
                self._final_push(results)
            elif self.pusher is None and not self.run_state.get("phases", {}).get("push"):
                self._mark("push", "skipped")
        if self._pending("space"):
            interrupts.check()  # a signal came during the final push: the Space waits for the resume
            from hf_tpu_ext.hub.space import deploy_space

            url = deploy_space(self.pusher.repo_id, args.hub_space_id, token=self.token,
                               private=args.hub_private_repo)
            logger.info("deployed the fill-mask demo to %s", url)
            self._mark("space")
        # whole-run rates (train_*_per_second) stay in all_results.json: the terminal shows one throughput figure
        step_rate, mfu = results.get("steady_tokens_per_second"), results.get("mfu")
        logger.info("done in %.1fs: %s%s", time.perf_counter() - t_total,
                    ", ".join(f"{k}={v:.4g}" for k, v in results.items()
                              if isinstance(v, float) and not k.endswith("_per_second") and not k.startswith("mfu")),
                    (f" | steady {step_rate:,.0f} tokens/s (median training step)" if step_rate else "")
                    + (f", MFU {mfu:.1%}" if step_rate and mfu is not None else ""))
        return results

    def _final_push(self, results) -> None:
        """The final push, waited for (``push_timeout``; after a signal within the grace budget). A final push of
        an earlier process of this run that was still in flight when it stopped (``run_state.json`` keeps its
        push id) is looked up on the Hub first: landed, it is not pushed again."""
        for entry in self.run_state.get("hub_pushes", []):
            report = entry.get("report") or {}
            for push in list(report.get("unfinished") or []) if entry.get("process") != self._process_id else []:
                oid = (push.get("final") and push.get("step") == self.step and push.get("push_id")
                       and self.pusher.find_push(push["push_id"]))
                if oid:
                    logger.info("The final push of step %d by the process before landed after it stopped (commit "
                                "%s): not pushed again.", self.step, oid[:8])
                    report.update(final_pushed=True, unfinished=[u for u in report["unfinished"] if u is not push])
                    self._record_pushes(self.pusher.report_dict())
                    self._write_summary(results)
                    self._mark("push", "pushed")
                    return
        ckpts = self.backend.find_checkpoints(self.args.output_dir)
        self._push(self.step, ckpts[0] if ckpts else None, final=True)
        self._record_pushes(self.pusher.report_dict())  # in the report even if this process is killed now
        _test_kill("push")
        # a first signal does not stop the final push: it gets what is left of the grace budget
        interrupts.wait_until(lambda: not self.pusher.report().pending, self.pusher.push_timeout)
        report = self.pusher.finish(timeout=0)
        self._record_pushes(self.pusher.report_dict())
        self._write_summary(results)  # the push outcome, locally (the pushed copy predates it)
        if report.final_pushed:
            self._mark("push", "pushed")
            if interrupts.received() is not None:  # a signal after the last step: finished within the grace budget
                logger.warning("%s received after the last step: export, card and final push finished within the "
                               "%g s grace budget.", signal.Signals(interrupts.received()).name, interrupts.grace())
                self._write_interrupted_summary(interrupts.received(), [], results)
            return
        interrupts.check()  # stopped by a signal: the resume line (a resume pushes again), not a push error
        from hf_tpu_ext.hub.checkpoint_layouts import push_later_command

        message = (f"The final model (step {self.step}) could not be pushed to {self.pusher.repo_id}; the local "
                   f"folder {self.args.output_dir} is complete. Push it and its newest checkpoint with `"
                   f"{push_later_command(self.args.output_dir, self.pusher.repo_id, self.args.hub_revision)}`, "
                   "or resume this run to push again.")
        if getattr(self.args, "hub_allow_push_failure", False):
            logger.error(message)
            self._mark("push", "failed")
            return
        raise HubPushError(message)


def _spawned_run(index, model_args, data_args, training_args):
    """The run in a process started by :meth:`Backend.spawn` (``index``: its ordinal)."""
    os.environ["HF_TPU_XLA_CHILD"] = "1"
    setup_logging()
    TrainingRun(model_args, data_args, training_args).run()


def train(model_args, data_args, training_args, argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run ``hf-tpu train`` end to end (see :class:`TrainingRun`) and return the final metrics.

    Raises:
        HfTpuExtError subclasses for every bad input, before training starts; ``TrainingInterrupted`` on
        SIGINT/SIGTERM; ``HubPushError`` when the final state could not be pushed.
    """
    return TrainingRun(model_args, data_args, training_args, argv=argv).run()
