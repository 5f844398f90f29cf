"""Checkpoints of the Keras backend: ``checkpoint-<global_step>/`` folders in ``output_dir``, written atomically.

A checkpoint folder holds (all float32 as trained):

* ``model_state.safetensors``: the model's trainable variables keyed by their Keras path (keras-hub names every
  layer), its non-trainable ones (dropout seed states) as ``non_trainable/<index>``;
* ``optimizer_state.safetensors``: the optimizer's variables (iteration count, Adam moments) keyed
  ``<index>/<path>``, restored by position;
* sharded: each process writes the blocks it holds (``model_state-<process:05d>.safetensors`` beside process 0's
  files; a block keyed ``<name>@<start>:<stop>,...``), and a restore reads them onto any device count or mesh
  (:mod:`~hf_tpu_ext.backends.keras.sharded_state`: :func:`save_state`, :func:`restore_state`); a replicated state
  is process 0's two files of whole tensors, the format of every release before;
* ``checkpoint.json`` (:data:`META_NAME`): ``global_step``, ``epoch``, ``model_config`` (``model_type`` and the shape fields of the
  transformers config), the data position (``seed``, ``global_batch_size``, ``num_train_blocks``: the batches
  of every step follow from them, see :mod:`hf_tpu_ext.data.numpy_batches`), ``keras_backend``, ``dtype_policy``,
  ``loss_window`` (``{"loss_sum", "steps"}``: the logging window so far) and ``fit_metrics`` (what the training
  process measured up to the save; :meth:`~hf_tpu_ext.backends.loop.StepLoop.checkpoint_fields`);
* ``trainer_state.json``: the run's trainer state, written by the training run after the save;
* with ``--streaming``, ``data_state-<process index>.json``: each process's stream position
  (:mod:`hf_tpu_ext.data.streaming`), gathered to process 0 and written with the rest before the rename.

Atomic: everything is written into ``.checkpoint-<step>.tmp-<host>-<pid>`` (process 0's name, told to every
process) beside the final name, flushed to disk, then renamed by process 0 once every process wrote its files (a rename within a folder is atomic on POSIX), so a kill leaves either no ``checkpoint-<step>`` or a
complete one; temporary folders of ended processes of this host are deleted at the next save (a running process's,
or another host's, are kept). :func:`find_checkpoints` lists
only complete folders.

The best evaluation's weights (``--load_best_model_at_end``) are one file, ``checkpoints/best/`` :data:`BEST_NAME`
(:func:`save_best`, :func:`read_best`): written to a temporary name and renamed over the previous best, its step and
metric in the safetensors metadata. ``checkpoints/`` is left out of Hub pushes (``hub.pusher.MODEL_IGNORE_PATTERNS``),
as the TensorFlow backend's ``checkpoints/best/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from hf_tpu_ext.backends.base import CheckpointInfo
from hf_tpu_ext.backends.keras.sharded_state import (  # noqa: F401 (restore_state, state_shapes: the API here)
    restore_state, save_state, state_index, state_shapes, stem_files)
from hf_tpu_ext.backends.keras.tensor_files import write_safetensors
from hf_tpu_ext.errors import CheckpointError

MODEL_STEM, OPTIMIZER_STEM = "model_state", "optimizer_state"
MODEL_NAME = f"{MODEL_STEM}.safetensors"  # process 0's file (every checkpoint of older releases: the only one)
OPTIMIZER_NAME = f"{OPTIMIZER_STEM}.safetensors"
META_NAME = "checkpoint.json"
STATE_NAME = "trainer_state.json"
FORMAT = "hf-tpu-ext keras checkpoint 1"
LAST_CHECKPOINT_DIRNAME = "last-checkpoint"
BEST_DIRNAME = os.path.join("checkpoints", "best")
BEST_NAME = "model_state.safetensors"
_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
_DATA_STATE_RE = re.compile(r"^data_state-\d+\.json$")  # hf_tpu_ext.data.streaming.STATE_FILE
#: a save's temporary folders: ``.checkpoint-<step>.tmp-<host>-<pid>`` and ``checkpoint-<step>.old-<host>-<pid>``
#: (``<host>-`` absent in folders of older releases)
_TMP_RE = re.compile(r"^(?:\.checkpoint-\d+\.tmp|checkpoint-\d+\.old)-(?:(?P<host>.+)-)?(?P<pid>\d+)$")
MODEL_CONFIG_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                       "vocab_size", "max_position_embeddings",
                       # ModernBERT's RoPE thetas (4.57's fields, 5's rope_parameters): a context-extension phase's
                       "global_rope_theta", "local_rope_theta", "rope_parameters",
                       "_name_or_path")  # transformers' record of the model it was loaded from ("" from scratch)


def _owner_tag() -> str:
    """``<host>-<pid>`` of this process, for its temporary folders' names (``-`` in the host name kept)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
    return f"{host}-{os.getpid()}"


def _process_ended(name: str) -> bool:
    """Whether the process that named a temporary folder ``name`` (:data:`_TMP_RE`) is gone: only a process of
    this host can be checked (``os.kill(pid, 0)``); another host's (a shared file system) counts as running."""
    match = _TMP_RE.match(name)
    if match is None:
        return False
    host, pid = match.group("host"), int(match.group("pid"))
    if host is not None and host != _owner_tag().rsplit("-", 1)[0]:
        return False
    if pid == os.getpid():  # this process's own leftover (a save that failed before its rename)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: alive, another user's
        return False
    return False


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _save_tensors(path: str, tensors, metadata: Dict[str, str]) -> None:
    """One safetensors file written tensor by tensor and flushed (``tensors``: a mapping, or the lazy one of a
    process's blocks: each copied to the host, written and dropped in turn)."""
    write_safetensors(path, tensors, metadata)


def _processes() -> Tuple[int, int]:
    """``(process index, process count)``: JAX's where JAX is imported, else ``(0, 1)`` (Keras on TensorFlow)."""
    jax = sys.modules.get("jax")
    return (int(jax.process_index()), int(jax.process_count())) if jax is not None else (0, 1)


def _agreed_folder(tmp: str, count: int) -> str:
    """Process 0's temporary folder name, told to every process (a collective; one process: ``tmp``)."""
    if count == 1:
        return tmp
    from jax.experimental import multihost_utils

    data = np.zeros(4096, np.uint8)
    raw = tmp.encode("utf-8")
    data[: len(raw)] = np.frombuffer(raw, np.uint8)
    agreed = np.asarray(multihost_utils.broadcast_one_to_all(data))
    return bytes(agreed[agreed != 0]).decode("utf-8")


def _write_folder(tmp: str, step: int, meta: Dict[str, Any], extra_files: Optional[Dict[str, str]] = None) -> None:
    """Process 0's files of the checkpoint into the temporary folder ``tmp`` once every process wrote its state
    files: the state checked whole (every array covered), ``checkpoint.json`` listing them; flushed to disk."""
    for name, text in (extra_files or {}).items():  # --streaming positions: committed by the same rename
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
    for stem in (MODEL_STEM, OPTIMIZER_STEM):  # a process's file missing (folders not shared) fails here
        state_index(tmp, stem)
    files = [n for stem in (MODEL_STEM, OPTIMIZER_STEM) for n in stem_files(tmp, stem)]
    meta = dict(meta, global_step=int(step), format=FORMAT, state_files=files)
    with open(os.path.join(tmp, META_NAME), "w", encoding="utf-8") as f:
        f.write(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)


def save_checkpoint(output_dir: str, step: int, model_vars: Dict[str, Any], optimizer_vars: Dict[str, Any],
                    meta: Dict[str, Any], keep: Optional[int] = None,
                    extra_files: Optional[Dict[str, str]] = None) -> Optional[str]:
    """Write ``output_dir/checkpoint-<step>/`` atomically (see the module doc) and rotate old ones.

    Every process calls it at the same step (collectives: process 0's temporary folder told to all, a barrier
    once all wrote): each writes the blocks it holds (:func:`~.sharded_state.save_state`), concurrently; process
    0 then writes ``checkpoint.json`` and renames the folder.

    Args:
        output_dir: the run folder (one folder every process sees when the state is sharded across processes).
        step: the global step.
        model_vars, optimizer_vars: name -> ``jax.Array`` of any sharding, or NumPy array.
        meta: the JSON fields of ``checkpoint.json`` (``global_step``, ``state_files`` are set here; read on
            process 0 only).
        keep: ``--save_total_limit``: keep this many newest checkpoints (None: all).
        extra_files: file name -> text, written into the folder before the rename (``--streaming``'s
            ``data_state-<i>.json``, :mod:`hf_tpu_ext.data.streaming`; process 0's).

    Returns:
        the checkpoint folder on process 0, None on the others.

    Raises:
        OSError: a write failed (``ENOSPC``, ``EDQUOT``, ``EIO``, ...; safetensors' ``SafetensorError`` says "No
            space left on device" in its text): the temporary folder is removed first, so no ``checkpoint-<step>``
            exists and the newest intact checkpoint stays the newest (the training run names it in one line).
        CheckpointError: an array's blocks are not all in the folder (processes with different output folders).
    """
    process, count = _processes()
    chief = process == 0
    final = os.path.join(output_dir, f"checkpoint-{int(step)}")
    tmp = os.path.join(output_dir, f".checkpoint-{int(step)}.tmp-{_owner_tag()}")
    if chief:
        os.makedirs(output_dir, exist_ok=True)
        for name in os.listdir(output_dir):  # folders of a killed save; a running process's are its own
            if _process_ended(name):
                shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
        os.makedirs(tmp)
    tmp = _agreed_folder(tmp, count)
    try:
        for stem, named in ((MODEL_STEM, model_vars), (OPTIMIZER_STEM, optimizer_vars)):
            save_state(tmp, named, stem, process, {"format": FORMAT}, write=_save_tensors)
        if count > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"hf_tpu_ext checkpoint-{int(step)} written")
        if chief:
            _write_folder(tmp, step, meta, extra_files)
    except BaseException:  # disk full, I/O error, a signal's KeyboardInterrupt: the torn folder goes now
        if chief:
            shutil.rmtree(tmp, ignore_errors=True)  # (its space back, never mistaken for a checkpoint)
        raise
    if not chief:
        return None
    if os.path.isdir(final):  # the same step saved again (a resumed run's final checkpoint): replace it whole
        old = final + f".old-{_owner_tag()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(output_dir)
    if keep:
        for path in find_checkpoints(output_dir)[int(keep):]:
            shutil.rmtree(path, ignore_errors=True)
    return final


def save_best(output_dir: str, step: int, metric: str, value: float, model_vars: Dict[str, np.ndarray]) -> str:
    """Write the best evaluation's trainable weights to ``output_dir/checkpoints/best/`` atomically.

    Args:
        step: the global step of the evaluation; metric, value: its metric name (e.g. ``eval_loss``) and value.
        model_vars: variable path -> array (the model's trainable variables).

    Returns:
        the folder.
    """
    folder = os.path.join(output_dir, BEST_DIRNAME)
    os.makedirs(folder, exist_ok=True)
    final = os.path.join(folder, BEST_NAME)
    tmp = f"{final}.tmp-{os.getpid()}"
    try:
        _save_tensors(tmp, model_vars, {"format": FORMAT, "global_step": str(int(step)), "metric": metric,
                                        "value": repr(float(value))})
    except BaseException:  # disk full: the previous best stays whole, the torn file goes
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, final)
    _fsync_dir(folder)
    return folder


def read_best(output_dir: str, with_weights: bool = True) -> Optional[Dict[str, Any]]:
    """The kept best evaluation: ``{"global_step", "metric", "value", "folder", "weights"}`` or None when there is
    none (or the file cannot be read: a missing best is recomputed by the next evaluation, never fatal).

    ``weights`` (path -> float32 array) only with ``with_weights``.
    """
    from safetensors import safe_open

    folder = os.path.join(output_dir, BEST_DIRNAME)
    file = os.path.join(folder, BEST_NAME)
    if not os.path.isfile(file):
        return None
    try:
        with safe_open(file, framework="numpy") as f:
            meta = f.metadata() or {}
            weights = {k: f.get_tensor(k) for k in f.keys()} if with_weights else None
        return {"global_step": int(meta["global_step"]), "metric": meta["metric"], "value": float(meta["value"]),
                "folder": folder, "weights": weights}
    except Exception:  # noqa: BLE001 (a garbled file: no best rather than no run)
        return None


def is_checkpoint_folder(folder: str) -> bool:
    """Whether ``folder`` is one complete Keras-backend checkpoint (its ``checkpoint.json`` names the format)."""
    meta = os.path.join(folder, META_NAME)
    if not os.path.isfile(meta) or not os.path.isfile(os.path.join(folder, MODEL_NAME)):
        return False
    try:
        with open(meta, encoding="utf-8") as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def find_checkpoints(folder: str) -> List[str]:
    """Complete checkpoints of a run folder (``checkpoint-N/``, else ``last-checkpoint/``), newest first; a
    checkpoint folder itself gives ``[folder]``; ``[]`` when none."""
    if not os.path.isdir(folder):
        return []
    if is_checkpoint_folder(folder):
        return [folder]
    steps = sorted(((int(m.group(1)), n) for n in os.listdir(folder) for m in [_CKPT_RE.match(n)] if m),
                   reverse=True)
    found = [os.path.join(folder, n) for _, n in steps if is_checkpoint_folder(os.path.join(folder, n))]
    last = os.path.join(folder, LAST_CHECKPOINT_DIRNAME)
    if not found and is_checkpoint_folder(last):
        found = [last]
    return found


def read_meta(path: str) -> Dict[str, Any]:
    """``checkpoint.json`` of a checkpoint folder.

    Raises:
        CheckpointError: missing or not JSON (the message names the file).
    """
    meta = os.path.join(path, META_NAME)
    try:
        with open(meta, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint {path} has no {META_NAME}; it is not a --backend keras checkpoint.") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{meta} cannot be read ({err}); delete the checkpoint.") from None


def load_tensors(path: str, name: str) -> Dict[str, np.ndarray]:
    """Every tensor of ``path/name`` (read whole: a truncated file fails here).

    Raises:
        CheckpointError: the file is missing, truncated or not safetensors (named in the message).
    """
    from safetensors.numpy import load_file

    file = os.path.join(path, name)
    try:
        return load_file(file)
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint {path} lacks {name}.") from None
    except Exception as err:  # SafetensorError, OSError on a truncated/garbled file
        raise CheckpointError(f"Checkpoint file {file} cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200] if str(err) else ''}).") from None


def read_trainer_state(path: str, step: int) -> Optional[Dict[str, Any]]:
    """The checkpoint's ``trainer_state.json`` when it belongs to ``step``, else None.

    Raises:
        CheckpointError: the file exists but is not JSON.
    """
    file = os.path.join(path, STATE_NAME)
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            state = json.load(f)
    except ValueError as err:
        raise CheckpointError(f"{file} is not valid JSON ({err}); delete the checkpoint.") from None
    return state if int(state.get("global_step", -1)) == int(step) else None


def read_checkpoint_info(path: str, tensors: bool = True) -> CheckpointInfo:
    """The :class:`~hf_tpu_ext.backends.base.CheckpointInfo` of a checkpoint folder: its ``checkpoint.json`` and
    trainer state, and (``tensors``) every tensor read whole, so a truncated file fails here; without them it
    reads two small JSON files (the argument checks before JAX starts).

    Raises:
        CheckpointError: a file is missing, truncated or not JSON, or the trainer state is not of the checkpoint's
            step (the save was interrupted); named in the message.
    """
    meta = read_meta(path)
    if tensors:  # one file at a time: a process's share of the state at most in memory
        for name in state_file_names(path):
            load_tensors(path, name)
    step = int(meta["global_step"])
    state = read_trainer_state(path, step)
    if state is None:  # the save was killed before the run wrote its state: not a resume point
        raise CheckpointError(f"Checkpoint {path} is incomplete: it has no {STATE_NAME} of step {step} "
                              "(the save was interrupted).")
    return CheckpointInfo(path=path, global_step=step, model_config=dict(meta.get("model_config") or {}),
                          trainer_state=state)


def state_file_names(path: str) -> List[str]:
    """The state files of a checkpoint folder: every process's ``model_state*``/``optimizer_state*`` safetensors
    (a checkpoint of an older release, or of a replicated state: ``model_state.safetensors`` and
    ``optimizer_state.safetensors``)."""
    return [n for stem in (MODEL_STEM, OPTIMIZER_STEM) for n in stem_files(path, stem)] or [MODEL_NAME, OPTIMIZER_NAME]


def checkpoint_files(path: str, with_state: bool = False) -> Dict[str, str]:
    """The files of ``checkpoint-<step>/`` a push uploads (flat: the Hub's ``last-checkpoint/``): every process's
    weights and optimizer state files, ``checkpoint.json``, the trainer state and the ``--streaming`` positions,
    ``{name: path}``. ``with_state``: the trainer state listed even before the run writes it (a save's hand-over).

    Raises:
        CheckpointError: ``path`` is not a folder.
    """
    if not os.path.isdir(path):
        raise CheckpointError(f"Cannot push checkpoint {path}: it is not a folder.")
    states = sorted(n for n in os.listdir(path) if _DATA_STATE_RE.match(n))  # --streaming positions
    names = (*state_file_names(path), META_NAME, STATE_NAME, *states)
    return {name: os.path.join(path, name) for name in names
            if os.path.isfile(os.path.join(path, name)) or (with_state and name == STATE_NAME)}


def write_checkpoint(output_dir: str, step: int, model_vars: Dict[str, Any], optimizer_vars: Dict[str, Any],
                     meta: Dict[str, Any], keep: Optional[int] = None,
                     extra_files: Optional[Dict[str, str]] = None) -> Optional[Tuple[str, Dict[str, str]]]:
    """:func:`save_checkpoint`, then what a push of it takes: ``(folder, checkpoint_files(folder, with_state=True))``
    on process 0 (the run writes the trainer state into it before a push links the files), ``None`` on the
    others. The save hands its files up with it, so a pushed save never comes back here to list them.

    Raises:
        OSError, CheckpointError: see :func:`save_checkpoint`.
    """
    path = save_checkpoint(output_dir, step, model_vars, optimizer_vars, meta, keep=keep, extra_files=extra_files)
    return None if path is None else (path, checkpoint_files(path, with_state=True))


def remove_incomplete(output_dir: str) -> List[str]:
    """Delete what killed saves left in ``output_dir``: temporary folders of ended processes, and ``checkpoint-N/``
    folders whose trainer state of step N is missing (the run writes it right after the weights). Returns the names
    removed."""
    removed: List[str] = []
    if not os.path.isdir(output_dir):
        return removed
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        incomplete = _process_ended(name)
        if not incomplete and _CKPT_RE.match(name) and os.path.isdir(path):
            try:
                incomplete = read_trainer_state(path, int(_CKPT_RE.match(name).group(1))) is None
            except CheckpointError:
                incomplete = True
        if incomplete:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed
