"""The checkpoint layouts this project writes, found and packed for the Hub's ``last-checkpoint/`` without a framework.

``hf-tpu push DIR`` pushes the newest checkpoint of ``DIR`` as ``last-checkpoint/``, from where
``hf-tpu train ... --resume_from_checkpoint user/name`` (or a callback's ``restore_from_hub`` /
``checkpoint_from_hub``) resumes. Each writer of checkpoints has one row in :data:`LAYOUTS`:

====================  ==========================================  ==============================================
layout                written by                                  files (``N``: the global optimizer step)
====================  ==========================================  ==============================================
``tensorflow``        ``hf-tpu train --backend tensorflow``, the   ``checkpoints/ckpt-N.index``, ``ckpt-N.data-*``,
                      tf_keras ``PushToHubCallback``              ``ckpt-N.json`` (shape sidecar),
                                                                  ``ckpt-N.trainer_state.json``
``checkpoint-N``      ``--backend torch_xla`` / a transformers    ``checkpoint-N/`` (Trainer: ``trainer_state.json``,
                      ``Trainer`` (+ the torch callbacks),        ``optimizer.pt``, weights; Keras backend:
                      ``--backend keras``                         ``model_state.safetensors``,
                                                                  ``optimizer_state.safetensors``,
                                                                  ``checkpoint.json``, ``trainer_state.json``)
``keras-callback``    the Keras 3 ``PushToHubCallback``           ``checkpoints/checkpoint-N/`` (``*.weights.h5`` +
                                                                  ``trainer_state.json``)
``last-checkpoint``   any of them (a packed or downloaded copy)   ``last-checkpoint/`` (one checkpoint of the above)
====================  ==========================================  ==============================================

A checkpoint "has its state" when its trainer state (``global_step``, ``log_history``...) is there. When some
checkpoint of a folder has one, checkpoints without it are torn saves (a kill between the weights and the state)
and are never chosen; folders whose writer keeps no state (older tf_keras callback checkpoints) still resume.

To support a new writer, add a :class:`CheckpointLayout` to :data:`LAYOUTS` (a ``find`` and a ``pack``).
Standard library only: no TensorFlow, torch or Keras.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from hf_tpu_ext.errors import CheckpointError, HfTpuExtError
from hf_tpu_ext.fileio import read_json_object
from hf_tpu_ext.hub.resume import LAST_CHECKPOINT

logger = logging.getLogger("hf_tpu_ext.hub")

__all__ = ["FoundCheckpoint", "CheckpointLayout", "LAYOUTS", "find_checkpoints", "newest_checkpoint",
           "pack_checkpoint", "layouts_help", "push_later_command", "previous_run_paths", "remove_previous_run",
           "clear_for_overwrite", "checkpoint_backend", "wrong_backend_message", "check_checkpoint_backend",
           "write_failure_errno", "save_failure_message"]

TF_STATE_SUFFIX = ".trainer_state.json"  # the TensorFlow backend's ckpt-N.trainer_state.json
TRAINER_STATE = "trainer_state.json"
_TF_INDEX = re.compile(r"^ckpt-(\d+)\.index$")
_NUMBERED_DIR = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class FoundCheckpoint:
    """One checkpoint on disk.

    Attributes:
        layout: the :class:`CheckpointLayout` name (``"tensorflow"``, ``"checkpoint-N"``, ``"keras-callback"``,
            ``"last-checkpoint"``).
        step: the global optimizer step it was written at.
        path: a TensorFlow prefix (``.../checkpoints/ckpt-N``, no extension) or a checkpoint folder.
        has_state: its trainer state is there (``ckpt-N.trainer_state.json`` / ``trainer_state.json``).
    """

    layout: str
    step: int
    path: str
    has_state: bool


@dataclass(frozen=True)
class CheckpointLayout:
    """How one writer lays out its checkpoints.

    Attributes:
        name: the layout's name (in messages and :attr:`FoundCheckpoint.layout`).
        written_by: who writes it, in words (for the error message of a folder with none).
        find: ``find(output_dir) -> [FoundCheckpoint]`` (any order; ``[]`` when none).
        pack: ``pack(found, dest)`` writes the files ``last-checkpoint/`` must hold into the empty folder ``dest``.
    """

    name: str
    written_by: str
    find: Callable[[str], List[FoundCheckpoint]]
    pack: Callable[[FoundCheckpoint, str], None]


_read_json = read_json_object  # missing or damaged run files read as {}


# ---- tensorflow: checkpoints/ckpt-N.* ------------------------------------------------------------
def _find_tensorflow(output_dir: str) -> List[FoundCheckpoint]:
    folder = os.path.join(output_dir, "checkpoints")
    if not os.path.isdir(folder):
        return []
    found = []
    for name in os.listdir(folder):
        match = _TF_INDEX.match(name)
        if not match:
            continue
        prefix = os.path.join(folder, name[: -len(".index")])
        if not glob.glob(glob.escape(prefix) + ".data-*"):  # an index without its data: not restorable
            continue
        # hf-tpu train's sidecar names the state file that completes the checkpoint (written last): without it
        # (or with another step's) the save was cut short, as backends.tensorflow.checkpoint.is_complete says
        sidecar = _read_json(prefix + ".json")
        state_name = sidecar.get("trainer_state")
        if state_name:
            state = _read_json(os.path.join(folder, os.path.basename(str(state_name))))
            if state.get("global_step") is None or int(state["global_step"]) != int(sidecar.get("global_step", -1)):
                logger.warning("Skipping checkpoint %s: its trainer state %s is missing (an interrupted save).",
                               os.path.basename(prefix), state_name)
                continue
        found.append(FoundCheckpoint("tensorflow", int(match.group(1)), prefix,
                                     os.path.isfile(prefix + TF_STATE_SUFFIX)))
    return found


def _pack_tensorflow(found: FoundCheckpoint, dest: str) -> None:
    """``ckpt-N.index``, ``ckpt-N.data-*``, ``ckpt-N.json``, a ``checkpoint`` state file, ``trainer_state.json``."""
    name = os.path.basename(found.path)
    for path in glob.glob(glob.escape(found.path) + ".*"):
        base = os.path.basename(path)
        if base.endswith(".index") or ".data-" in base or base == name + ".json":
            shutil.copy2(path, os.path.join(dest, base))
    with open(os.path.join(dest, "checkpoint"), "w", encoding="utf-8") as f:  # tf.train's state file, relative
        f.write(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    if found.has_state:
        shutil.copy2(found.path + TF_STATE_SUFFIX, os.path.join(dest, TRAINER_STATE))


# ---- trainer / keras: numbered checkpoint folders --------------------------------------------------
def _numbered_dirs(parent: str, layout: str, is_checkpoint: Callable[[str], bool]) -> List[FoundCheckpoint]:
    if not os.path.isdir(parent):
        return []
    found = []
    for name in os.listdir(parent):
        match = _NUMBERED_DIR.match(name)
        path = os.path.join(parent, name)
        if match and os.path.isdir(path) and is_checkpoint(path):
            found.append(FoundCheckpoint(layout, int(match.group(1)), path,
                                         os.path.isfile(os.path.join(path, TRAINER_STATE))))
    return found


def _has_files(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, n)) for n in os.listdir(folder))


def _is_keras_checkpoint(folder: str) -> bool:
    return bool(glob.glob(os.path.join(glob.escape(folder), "*.weights.h5")))


def _find_numbered(output_dir: str) -> List[FoundCheckpoint]:
    # complete folders only: the Keras backend writes .checkpoint-N.tmp-PID and renames it (never matched here)
    return _numbered_dirs(output_dir, "checkpoint-N", _has_files)


def _find_keras_callback(output_dir: str) -> List[FoundCheckpoint]:
    return _numbered_dirs(os.path.join(output_dir, "checkpoints"), "keras-callback", _is_keras_checkpoint)


def _pack_folder(found: FoundCheckpoint, dest: str) -> None:
    """The folder as it is (a Trainer or Keras 3 checkpoint restores from its own folder)."""
    shutil.copytree(found.path, dest, dirs_exist_ok=True)


# ---- last-checkpoint/: a packed copy -----------------------------------------------------------
def _find_last(output_dir: str) -> List[FoundCheckpoint]:
    folder = os.path.join(output_dir, LAST_CHECKPOINT)
    if not os.path.isdir(folder) or not _has_files(folder):
        return []
    state = _read_json(os.path.join(folder, TRAINER_STATE))
    step = state.get("global_step")
    if step is None:  # a TensorFlow copy without trainer state: the ckpt-N name says the step
        steps = [int(m.group(1)) for m in map(_TF_INDEX.match, os.listdir(folder)) if m]
        step = max(steps) if steps else None
    if step is None:
        return []
    return [FoundCheckpoint(LAST_CHECKPOINT, int(step), folder, bool(state))]


LAYOUTS: Tuple[CheckpointLayout, ...] = (
    CheckpointLayout("tensorflow", "hf-tpu train --backend tensorflow / the tf_keras push_to_hub callback "
                     "(checkpoints/ckpt-N.index)", _find_tensorflow, _pack_tensorflow),
    CheckpointLayout("checkpoint-N", "--backend torch_xla or keras / a transformers Trainer (checkpoint-N/)",
                     _find_numbered, _pack_folder),
    CheckpointLayout("keras-callback", "the Keras 3 push_to_hub callback (checkpoints/checkpoint-N/)",
                     _find_keras_callback, _pack_folder),
    CheckpointLayout(LAST_CHECKPOINT, f"a packed copy ({LAST_CHECKPOINT}/)", _find_last, _pack_folder),
)


def _layout(name: str) -> CheckpointLayout:
    return next(layout for layout in LAYOUTS if layout.name == name)


def find_checkpoints(output_dir: str) -> List[FoundCheckpoint]:
    """Every checkpoint of ``output_dir`` in every layout of :data:`LAYOUTS`, newest first.

    At equal steps a checkpoint with its trainer state comes first, then the order of :data:`LAYOUTS`.
    """
    found = [c for layout in LAYOUTS for c in layout.find(output_dir)]
    order = {layout.name: i for i, layout in enumerate(LAYOUTS)}
    return sorted(found, key=lambda c: (-c.step, not c.has_state, order[c.layout]))


def newest_checkpoint(output_dir: str) -> Optional[FoundCheckpoint]:
    """The checkpoint a resume should start from: the newest one, skipping torn saves.

    When any checkpoint of the folder has its trainer state, newer ones without it are torn saves (killed between
    the weights and the state) and are skipped with a warning; otherwise the newest is taken.

    Returns:
        The checkpoint, or ``None`` when the folder has none in any layout.
    """
    found = find_checkpoints(output_dir)
    if any(c.has_state for c in found):
        torn = [c for c in found if not c.has_state and c.step > max(s.step for s in found if s.has_state)]
        if torn:
            logger.warning("Skipping checkpoint(s) without their trainer state (an interrupted save): %s.",
                           ", ".join(os.path.basename(c.path) for c in torn))
        found = [c for c in found if c.has_state]
    return found[0] if found else None


def pack_checkpoint(found: FoundCheckpoint, dest: str) -> str:
    """Write what ``last-checkpoint/`` must hold for ``found`` into ``dest`` (created; emptied first).

    Returns:
        ``dest``.
    """
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    _layout(found.layout).pack(found, dest)
    return dest


def layouts_help() -> str:
    """The layouts in words, for error messages (what each writer leaves)."""
    return "; ".join(f"{layout.written_by}" for layout in LAYOUTS)


def push_later_command(output_dir: Optional[str], repo_id: str, revision: Optional[str] = None) -> str:
    """The ``hf-tpu push`` command line that uploads what a run left locally *and what resumes*.

    ``hf-tpu push`` includes the folder's newest checkpoint as ``last-checkpoint/`` by default, so the Hub's
    ``last-checkpoint/`` moves to the newest local save; ``--revision`` is named when the run pushed to a branch.
    The token is never part of it.
    """
    import shlex

    parts = ["hf-tpu", "push", output_dir or "OUTPUT_DIR", "--hub_model_id", repo_id]
    if revision:
        parts += ["--revision", revision]
    return " ".join(shlex.quote(p) for p in parts)


#: what an earlier run leaves in its output folder that a resume or ``hf-tpu push`` would take for the new run's
#: (its checkpoints in every layout, its run state and results, its model weights); config and tokenizer files are
#: written again by the new run, TensorBoard's ``runs/`` and a README.md are left alone
PREVIOUS_RUN_DIRS = ("checkpoints", LAST_CHECKPOINT, f"hub-{LAST_CHECKPOINT}", "keras_hub")
PREVIOUS_RUN_FILES = ("run_state.json", TRAINER_STATE, "all_results.json", "training_summary.json",
                      "model.safetensors", "model.safetensors.index.json", "tf_model.h5", "loss_curve.png")
_CHECKPOINT_TEMP = re.compile(r"^\.?checkpoint-\d+(\.tmp.*)?$")  # checkpoint-N/ and the Keras .checkpoint-N.tmp-PID/


def previous_run_paths(output_dir: str) -> List[str]:
    """The names in ``output_dir`` that :func:`remove_previous_run` removes (sorted; ``[]`` for no folder)."""
    if not os.path.isdir(output_dir):
        return []
    return sorted(n for n in os.listdir(output_dir)
                  if (n in PREVIOUS_RUN_DIRS and os.path.isdir(os.path.join(output_dir, n)))
                  or (n in PREVIOUS_RUN_FILES and os.path.isfile(os.path.join(output_dir, n)))
                  or (_CHECKPOINT_TEMP.match(n) and os.path.isdir(os.path.join(output_dir, n))))


def remove_previous_run(output_dir: str) -> Tuple[List[str], List[int]]:
    """Remove what an earlier run left in ``output_dir`` that a resume or ``hf-tpu push`` would take
    (``--overwrite_output_dir``): :data:`PREVIOUS_RUN_DIRS`, :data:`PREVIOUS_RUN_FILES`, ``checkpoint-N/``.

    Returns:
        ``(names removed, global steps of the checkpoints among them, newest first)``.

    Raises:
        OSError: a file could not be removed (the ones before it are gone).
    """
    steps = sorted({c.step for c in find_checkpoints(output_dir)}, reverse=True)
    names = previous_run_paths(output_dir)
    for name in names:
        path = os.path.join(output_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    return names, steps


def clear_for_overwrite(output_dir: str) -> List[str]:
    """:func:`remove_previous_run` for ``--overwrite_output_dir``, said in one log line (nothing: no line).

    Returns:
        The names removed.
    """
    names, steps = remove_previous_run(output_dir)
    if names:
        what = f"checkpoints of step {', '.join(map(str, steps))}; " if steps else ""
        logger.info("--overwrite_output_dir: removed the earlier run's %s%s from %s (a resume or hf-tpu push would "
                    "have taken them).", what, ", ".join(names), output_dir)
    return names


def _backend_of_folder(folder: str) -> Optional[str]:
    """Which ``hf-tpu train --backend`` wrote the one checkpoint in ``folder`` (by its files), or ``None``."""
    names = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    if any(_TF_INDEX.match(n) for n in names):
        return "tensorflow"
    if "model_state.safetensors" in names and "checkpoint.json" in names:
        return "keras"
    if "optimizer.pt" in names or "scheduler.pt" in names:
        return "torch_xla"
    return None


def checkpoint_backend(path: str) -> Optional[Tuple[str, int]]:
    """``(backend name, step)`` of the newest ``hf-tpu train`` checkpoint at ``path`` -- a run folder, a
    ``checkpoint-N/`` or ``last-checkpoint/`` folder, a TensorFlow ``ckpt-N`` prefix -- or ``None``, whatever the
    backend asking (so a resume with the wrong ``--backend`` can name the right one)."""
    match = re.search(r"ckpt-(\d+)(\.index)?$", path)
    if match and os.path.isfile(re.sub(r"\.index$", "", path) + ".index"):
        return "tensorflow", int(match.group(1))
    for found in find_checkpoints(path):
        backend = "tensorflow" if found.layout == "tensorflow" else _backend_of_folder(found.path)
        if backend:
            return backend, found.step
    backend = _backend_of_folder(path)  # a checkpoint folder itself
    if backend:
        step = _read_json(os.path.join(path, TRAINER_STATE)).get("global_step")
        match = _NUMBERED_DIR.match(os.path.basename(os.path.normpath(path)))
        return backend, int(step if step is not None else match.group(1) if match else 0)
    return None


def wrong_backend_message(path: str, backend: str, shown: Optional[str] = None) -> Optional[str]:
    """The one line for ``--resume_from_checkpoint`` at ``path`` holding another backend's checkpoint (``None``
    when it holds none, or one of ``backend``); ``shown`` is how the message names the place (default ``path``)."""
    found = checkpoint_backend(path)
    if found is None or found[0] == backend:
        return None
    other, step = found
    return (f"--resume_from_checkpoint: {shown or path} holds a {other} backend checkpoint (step {step}), not a "
            f"{backend} one: rerun with --backend {other}.")


def check_checkpoint_backend(path: str, backend: str, shown: Optional[str] = None) -> None:
    """Refuse resuming ``path`` when it holds a checkpoint of another backend than ``backend`` (before the generic
    "no checkpoint found", which would be untrue: it has one).

    Raises:
        CheckpointError: :func:`wrong_backend_message` (the backend that wrote it, the ``--backend`` to rerun with).
    """
    message = wrong_backend_message(path, backend, shown)
    if message:
        raise CheckpointError(message)


#: the OS errors of a write that a rerun can finish once the cause is fixed (space, quota, permissions, I/O)
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM, errno.EFBIG}
_WRITE_TEXTS = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
                "Read-only file system": errno.EROFS}


def write_failure_errno(err: BaseException) -> Optional[int]:
    """The errno of a failed file write in ``err`` (an ``OSError`` with a write errno, or a framework's error
    whose text says "No space left on device" etc.: TensorFlow's ``ResourceExhaustedError``, safetensors'
    ``SafetensorError``), else ``None``. Errors raised on purpose by hf-tpu-ext are never one."""
    if isinstance(err, HfTpuExtError):
        return None
    if isinstance(err, OSError) and err.errno in _WRITE_ERRNOS:
        return err.errno
    text = str(err)
    return next((code for phrase, code in _WRITE_TEXTS.items() if phrase in text), None)


def save_failure_message(err: BaseException, output_dir: str, resume_command: str) -> Optional[str]:
    """The one line for a save that failed on a file write (:func:`write_failure_errno`; ``None`` otherwise): the
    folder, the newest intact checkpoint in it (torn saves are never named, and a resume skips them) and how to
    resume."""
    code = write_failure_errno(err)
    if code is None:
        return None
    level = logger.level
    logger.setLevel(logging.ERROR)  # the torn save is the one that failed: no "skipping" lines beside this one
    try:
        found = newest_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    finally:
        logger.setLevel(level)
    intact = (f"the newest intact checkpoint is {os.path.relpath(found.path, output_dir)} (step {found.step})"
              if found else "it holds no intact checkpoint yet (a rerun starts at step 0)")
    fix = "free some space" if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "make it writable"
    filename = getattr(err, "filename", None)
    inside = not filename or os.path.abspath(str(filename)).startswith(os.path.abspath(output_dir) + os.sep)
    if not inside:  # e.g. the datasets cache: that is the place to fix, the run folder is intact
        return (f"Writing {filename} failed: {os.strerror(code)} (--output_dir {output_dir}: "
                f"{intact.replace('it holds ', '')}). {fix.capitalize()} there, then resume with: {resume_command}")
    return (f"Writing to --output_dir {output_dir} failed: {os.strerror(code)}; {intact}. {fix.capitalize()}, "
            f"then resume with: {resume_command}")
