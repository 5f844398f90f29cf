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

import glob
import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from hf_tpu_ext.fileio import read_json_object
from hf_tpu_ext.hub.resume import LAST_CHECKPOINT

logger = logging.getLogger("hf_tpu_ext.hub")

__all__ = ["FoundCheckpoint", "CheckpointLayout", "LAYOUTS", "find_checkpoints", "newest_checkpoint",
           "pack_checkpoint", "layouts_help", "push_later_command"]

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
