"""Training checkpoints: model + optimizer state with ``tf.train.Checkpoint`` / ``tf.train.CheckpointManager``.

A checkpoint lives in ``output_dir/checkpoints/`` as ``ckpt-<global_step>.index`` + ``ckpt-<global_step>.data-*``
(``tf.train.Checkpoint.write``), a JSON sidecar ``ckpt-<global_step>.json`` and, for ``hf-tpu train``, the run's
``ckpt-<global_step>.trainer_state.json``; the ``checkpoint`` state file names the newest, and all but the newest
``save_total_limit`` are deleted. The sidecar::

    {"global_step": 100, "epoch": 1.5,
     "model_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "intermediate_size": 128, "vocab_size": 300, "max_position_embeddings": 34},
     "loss_window": {"loss_sum": 36.2, "steps": 5},          # hf-tpu train: the logging window so far
     "trainer_state": "ckpt-100.trainer_state.json"}        # hf-tpu train: the file that completes it

The sidecar lets a resume check the model's shape before anything is restored, with a message naming the
fields that differ.

**One unit.** Weights, optimizer state, sidecar and trainer state are one checkpoint; the data position is the
global step (the input pipeline is stateless: :mod:`hf_tpu_ext.data.pipeline` starts at any step). They are
written in this order: the sidecar (it names the state file that will complete the checkpoint), the weights
(TensorFlow writes ``ckpt-N_temp/`` and moves it into place), the trainer state (atomically: temp name, then
rename), and only then the ``checkpoint`` state file and the rotation (:meth:`TrainingCheckpointer.commit`), so
a kill at any moment leaves the previous checkpoints whole. A checkpoint whose sidecar names a state file that
is missing (or of another step) is incomplete: :func:`is_complete` says so, the resume skips it, and
:func:`remove_incomplete` (run by the next ``hf-tpu train`` in that folder) deletes it with TensorFlow's
``ckpt-N_temp/`` folders. The optimizer's slots (Adam ``m``/``v``) and ``iterations`` are restored even though
tf_keras legacy optimizers create them lazily: ``tf.train.Checkpoint`` keeps the values and assigns them when
the variables are created (deferred restoration), i.e. in the first ``apply_gradients`` after the restore.

Paths go through ``tf.io.gfile``, so ``output_dir`` may be a ``gs://`` bucket (TPU VMs).
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Dict, List, Optional, Union

import numpy as np
import tensorflow as tf

from hf_tpu_ext.errors import ArgumentError, CheckpointError
from hf_tpu_ext.fileio import atomic_write_text

logger = logging.getLogger(__name__)

CHECKPOINTS_DIRNAME = "checkpoints"
LAST_CHECKPOINT_DIRNAME = "last-checkpoint"
CHECKPOINT_NAME = "ckpt"
STATE_FILE = "checkpoint"
#: the run's trainer state saved with each checkpoint: ``ckpt-N.trainer_state.json`` next to ``ckpt-N.index``
STATE_SUFFIX = ".trainer_state.json"
MODEL_CONFIG_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)
_CKPT_INDEX_RE = re.compile(r"^" + CHECKPOINT_NAME + r"-(\d+)\.index$")


def _join(*parts: str) -> str:
    return "/".join([parts[0].rstrip("/")] + [p.strip("/") for p in parts[1:]]) if "://" in parts[0] else os.path.join(*parts)


def checkpoint_dir(output_dir: str) -> str:
    """The folder checkpoints of ``output_dir`` are written to: ``output_dir/checkpoints``."""
    return _join(output_dir, CHECKPOINTS_DIRNAME)


def sidecar_path(checkpoint_path: str) -> str:
    """``ckpt-N.json`` next to the checkpoint prefix ``ckpt-N``."""
    return checkpoint_path + ".json"


def model_config_summary(model_config) -> Dict[str, Optional[int]]:
    """The shape fields of a config (``PretrainedConfig`` or dict) that must match for a restore.

    Returns:
        ``{field: int or None}`` for :data:`MODEL_CONFIG_FIELDS`.
    """
    get = model_config.get if isinstance(model_config, dict) else (lambda k: getattr(model_config, k, None))
    out = {}
    for name in MODEL_CONFIG_FIELDS:
        value = get(name)
        out[name] = int(value) if value is not None else None
    return out


def _latest_in_dir(folder: str) -> Optional[str]:
    """Newest checkpoint prefix in ``folder``: from its ``checkpoint`` state file, else the highest ``ckpt-N.index``."""
    if not tf.io.gfile.isdir(folder):
        return None
    latest = tf.train.latest_checkpoint(folder)
    if latest and tf.io.gfile.exists(latest + ".index"):
        return latest
    numbers = []
    for name in tf.io.gfile.listdir(folder):
        m = _CKPT_INDEX_RE.match(name.rstrip("/"))
        if m:
            numbers.append(int(m.group(1)))
    if not numbers:
        return None
    return _join(folder, f"{CHECKPOINT_NAME}-{max(numbers)}")


def resolve_checkpoint(path_or_dir: str) -> str:
    """The checkpoint prefix (``.../ckpt-N``) meant by a prefix, an ``.index`` file or a folder holding checkpoints.

    Raises:
        CheckpointError: nothing restorable is there.
    """
    path = str(path_or_dir)
    if path.endswith(".index"):
        path = path[: -len(".index")]
    if tf.io.gfile.exists(path + ".index"):
        return path
    for folder in (path, _join(path, CHECKPOINTS_DIRNAME), _join(path, LAST_CHECKPOINT_DIRNAME)):
        found = _latest_in_dir(folder)
        if found:
            return found
    raise CheckpointError(
        f"No checkpoint found at {path_or_dir} (looked for {CHECKPOINT_NAME}-<step>.index there, in its "
        f"{CHECKPOINTS_DIRNAME}/ and {LAST_CHECKPOINT_DIRNAME}/). Give a checkpoint folder written by hf-tpu train."
    )


def find_latest(output_dir: str, required: bool = True) -> Optional[str]:
    """The newest checkpoint of a run, for ``--resume_from_checkpoint true``.

    Looks in ``output_dir/checkpoints/``, then ``output_dir/last-checkpoint/`` (an exported folder), then
    ``output_dir`` itself.

    Args:
        output_dir: the run's output folder (local or ``gs://``).
        required: raise when nothing is found (default); with ``False`` return ``None`` instead.

    Returns:
        The checkpoint prefix, e.g. ``output_dir/checkpoints/ckpt-200`` (no file extension), or ``None``.

    Raises:
        CheckpointError: ``required`` and no checkpoint exists; the message lists the folders searched.
    """
    places = [checkpoint_dir(output_dir), _join(output_dir, LAST_CHECKPOINT_DIRNAME), output_dir]
    for folder in places:
        found = _latest_in_dir(folder)
        if found:
            return found
    if required:
        raise CheckpointError(
            f"--resume_from_checkpoint true found no checkpoint: looked for {CHECKPOINT_NAME}-<step>.index in "
            f"{', '.join(places)}. Train without --resume_from_checkpoint, or give a checkpoint folder."
        )
    return None


def read_sidecar(checkpoint_path: str) -> Optional[dict]:
    """The JSON sidecar of a checkpoint prefix, or ``None`` when it has none.

    Raises:
        CheckpointError: the sidecar exists but is not valid JSON.
    """
    path = sidecar_path(checkpoint_path)
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            return json.loads(f.read())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"Checkpoint sidecar {path} is not valid JSON ({e}); delete the checkpoint or fix the file.") from None


def validate_compatible(checkpoint_path: str, model_config) -> None:
    """Check, before restoring, that a checkpoint was written for a model of the same shape.

    Args:
        checkpoint_path: a checkpoint prefix, ``.index`` file or folder (see :func:`resolve_checkpoint`).
        model_config: the config (``PretrainedConfig`` or dict) of the model about to be restored into.

    Raises:
        CheckpointError: a shape field differs; the message names each one, e.g.
            ``checkpoint has hidden_size=128, model has hidden_size=64``. A checkpoint without sidecar is not
            checked here (a wrong shape then fails in :meth:`TrainingCheckpointer.restore`).
    """
    path = resolve_checkpoint(checkpoint_path)
    sidecar = read_sidecar(path)
    if sidecar is None:
        logger.warning("Checkpoint %s has no %s sidecar; its model shape is not checked before restoring.", path, os.path.basename(sidecar_path(path)))
        return
    saved = sidecar.get("model_config") or {}
    current = model_config_summary(model_config)
    diffs = [
        f"checkpoint has {name}={saved[name]}, model has {name}={current[name]}"
        for name in MODEL_CONFIG_FIELDS
        if saved.get(name) is not None and current.get(name) is not None and int(saved[name]) != current[name]
    ]
    if diffs:
        raise CheckpointError(
            f"Checkpoint {path} was written for another model shape: {'; '.join(diffs)}. Resume with the same model "
            "configuration, or start a new run in another output_dir."
        )


class TrainingCheckpointer:
    """Save and restore model, optimizer, global step and epoch of a training run.

    Wraps ``tf.train.Checkpoint(model=..., optimizer=..., global_step=..., epoch=...)``; :meth:`save` is
    :meth:`write` then :meth:`commit` (the ``checkpoint`` state file, then the rotation to ``max_to_keep``).
    ``TrainingCheckpointer(model, optimizer, "out/checkpoints", max_to_keep=2)``,
    ``TrainingCheckpointer(model, optimizer, output_dir="out", save_total_limit=2)`` and the output-dir-first
    form ``TrainingCheckpointer("out", model, optimizer, 2)`` (positional: output_dir, model, optimizer,
    save_total_limit) all work.

    Under ``MultiWorkerMirroredStrategy`` every worker must call :meth:`save` (the write is collective); give
    non-chief workers their own throw-away ``directory``.

    Args:
        model: the TF transformers model (its ``config`` goes into the sidecar).
        optimizer: the optimizer whose state (``iterations``, slots) is saved with the model; may be ``None``
            (e.g. to restore the weights only).
        directory: the checkpoint folder (default: ``output_dir/checkpoints``).
        max_to_keep: checkpoints kept (oldest deleted first); ``None`` keeps all. Alias: ``save_total_limit``.
        output_dir: the run's output folder, used when ``directory`` is not given.
        save_total_limit: same as ``max_to_keep`` (the name of the ``hf-tpu train`` argument).

    Attributes:
        global_step: int64 ``tf.Variable``, the optimizer step the checkpoint was written at.
        epoch: int64 ``tf.Variable``, completed epochs (``floor`` of the float epoch passed to :meth:`save`).
        directory: the checkpoint folder.
        max_to_keep: checkpoints kept by :meth:`commit` (``None``: all).
        restored_epoch: float epoch of the last :meth:`restore` (from the sidecar), else ``None``.
        restored_sidecar: the sidecar dict of the last :meth:`restore` (``{}`` without one).

    Raises:
        ArgumentError: neither ``directory`` nor ``output_dir`` is given.
    """

    def __init__(
        self,
        model,
        optimizer=None,
        directory: Optional[str] = None,
        max_to_keep: Optional[int] = None,
        *,
        output_dir: Optional[str] = None,
        save_total_limit: Optional[int] = None,
    ):
        if isinstance(model, (str, os.PathLike)):
            # Output-dir-first form: the positionals are (output_dir, model, optimizer, save_total_limit).
            output_dir, model, optimizer, limit = model, optimizer, directory, max_to_keep
            directory, max_to_keep = None, None
            save_total_limit = limit if save_total_limit is None else save_total_limit
        if directory is None and output_dir is None:
            raise ArgumentError("TrainingCheckpointer needs a checkpoint directory or an output_dir.")
        self.model = model
        self.optimizer = optimizer
        self.directory = str(directory) if directory is not None else checkpoint_dir(str(output_dir))
        keep = save_total_limit if save_total_limit is not None else max_to_keep
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        objects = dict(model=model, global_step=self.global_step, epoch=self.epoch)
        if optimizer is not None:
            objects["optimizer"] = optimizer
        self.checkpoint = tf.train.Checkpoint(**objects)
        # created now (under the caller's strategy scope), so write() saves it and restore() matches it as
        # CheckpointManager-written checkpoints did
        self.checkpoint.save_counter  # noqa: B018
        self.max_to_keep = keep
        self.restored_epoch: Optional[float] = None
        self.restored_sidecar: dict = {}

    def validate_compatible(self, path_or_dir: str, model_config=None) -> None:
        """:func:`validate_compatible` against ``model_config`` (default: this checkpointer's model's config)."""
        validate_compatible(path_or_dir, self.model.config if model_config is None else model_config)

    @property
    def latest(self) -> Optional[str]:
        """Prefix of the newest committed checkpoint in :attr:`directory` (``.../ckpt-N``), or ``None``."""
        return _latest_in_dir(self.directory)

    def save(self, global_step: int, epoch: Optional[float] = None) -> str:
        """Write ``ckpt-<global_step>`` and its sidecar, then :meth:`commit` it (checkpoints beyond
        ``save_total_limit`` deleted).

        Args:
            global_step: optimizer steps done (the checkpoint number).
            epoch: float epochs done (e.g. ``1.5``); default: the :attr:`epoch` variable.

        Returns:
            The checkpoint prefix, e.g. ``output_dir/checkpoints/ckpt-100``.
        """
        path = self.write(global_step, epoch)
        self.commit(path)
        return path

    def write(self, global_step: int, epoch: Optional[float] = None, extra: Optional[dict] = None,
              with_state: bool = False) -> str:
        """The files of ``ckpt-<global_step>``: the sidecar first, then weights and optimizer state.

        Nothing else changes: the ``checkpoint`` state file and older checkpoints wait for :meth:`commit`.

        Args:
            global_step: optimizer steps done (the checkpoint number).
            epoch: float epochs done; default: the :attr:`epoch` variable.
            extra: more sidecar fields (JSON values), e.g. ``{"loss_window": {"loss_sum": 36.2, "steps": 5}}``.
            with_state: the checkpoint is complete only once ``ckpt-<global_step>.trainer_state.json`` (global step
                ``global_step``) is written beside it (``hf-tpu train`` writes it); the sidecar says so.

        Returns:
            The checkpoint prefix.

        Raises:
            OSError: the sidecar could not be written (e.g. ``ENOSPC``); ``tf.errors.ResourceExhaustedError``
                ("No space left on device"): the weights could not. Either way the checkpoint is incomplete
                (no trainer state, not committed): a resume skips it.
        """
        step = int(global_step)
        # a NumPy int: TensorFlow caches the tensor of every distinct Python int it converts (trainer.uncached_scalar)
        self.global_step.assign(np.int64(step))
        if epoch is not None:
            self.epoch.assign(int(epoch))
        tf.io.gfile.makedirs(self.directory)
        path = _join(self.directory, f"{CHECKPOINT_NAME}-{step}")
        sidecar = {
            "global_step": step,
            "epoch": float(epoch) if epoch is not None else int(self.epoch.numpy()),
            "model_config": model_config_summary(self.model.config),
            **(extra or {}),
        }
        if with_state:
            sidecar["trainer_state"] = os.path.basename(path) + STATE_SUFFIX
        text = json.dumps(sidecar, indent=2, sort_keys=True) + "\n"
        if "://" in path:
            with tf.io.gfile.GFile(sidecar_path(path), "w") as f:
                f.write(text)
        else:
            atomic_write_text(sidecar_path(path), text)
        self.checkpoint.save_counter.assign_add(1)
        self._write_weights(path)
        return path

    def _write_weights(self, path: str) -> None:
        """``tf.train.Checkpoint.write(path)`` through one traced ``tf.function`` (retraced only when the set
        of variables changes, e.g. once the optimizer's slots exist).

        Why: an eager ``Checkpoint.write`` rebuilds and runs its save ops op by op on every call, and in a training
        process that keeps ~16-20 KB of native memory per save (3.9 MB/min in the 8-minute soak of
        ``benchmarks/soak_push.py``); the traced write keeps RSS flat. The files are the same
        (``ckpt-N.index``, one ``ckpt-N.data-00000-of-00001``, the same object graph), so resume reads both.
        """
        key = _variable_count(self.model) + _variable_count(self.optimizer)
        if getattr(self, "_traced_write_key", None) != key:
            # the save ops are placed on the variables' host CPU, as the eager write places them; without the
            # scope the object-graph constant lands on a partial "/cpu:0" device and the data is split in two shards
            device = tf.DeviceSpec.from_string(self.global_step.device or "/cpu:0").replace(
                device_type="CPU", device_index=0).to_string()
            checkpoint = self.checkpoint

            @tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
            def traced_write(prefix):
                with tf.device(device):
                    return checkpoint.write(prefix)

            self._traced_write, self._traced_write_key = traced_write, key
        self._traced_write(tf.constant(path))

    def commit(self, path: str) -> None:
        """Name ``path`` in the ``checkpoint`` state file, then delete the checkpoints beyond :attr:`max_to_keep`
        (oldest step first; every file of each: ``.index``, ``.data-*``, sidecar, trainer state)."""
        name = os.path.basename(path) if "://" not in path else path.rsplit("/", 1)[1]
        steps = sorted(_steps_in_dir(self.directory))
        current = int(name.rsplit("-", 1)[1])
        kept = [s for s in steps if s <= current]
        if self.max_to_keep is not None:
            drop, kept = kept[: max(0, len(kept) - int(self.max_to_keep))], kept[-int(self.max_to_keep):]
            for old in drop:
                _remove_checkpoint_files(self.directory, old)
        _write_state_file(self.directory, name, [f"{CHECKPOINT_NAME}-{s}" for s in kept if s != current])

    def restore(self, path_or_dir: Optional[str] = None) -> int:
        """Restore model, optimizer state, global step and epoch.

        Call it after the model is built and before training; the optimizer's slots and ``iterations`` are
        assigned when they are created (the first ``apply_gradients``), if they do not exist yet.

        Args:
            path_or_dir: a checkpoint prefix, ``.index`` file or folder; ``None``: the newest in :attr:`directory`.

        Returns:
            The restored global step (int). The float epoch of the sidecar is kept in :attr:`restored_epoch`.

        Raises:
            CheckpointError: nothing to restore, the checkpoint was written for another model shape, or its
                variables do not match the model/optimizer.
        """
        if path_or_dir is None:
            path = self.latest
            if path is None:
                raise CheckpointError(f"No checkpoint to restore in {self.directory}; train first or give a checkpoint path.")
        else:
            path = resolve_checkpoint(path_or_dir)
        validate_compatible(path, self.model.config)
        try:
            status = self.checkpoint.restore(path)
            status.assert_existing_objects_matched()
        except (ValueError, AssertionError, tf.errors.OpError) as e:
            raise CheckpointError(
                f"Checkpoint {path} does not match this model/optimizer ({type(e).__name__}: {str(e).splitlines()[0][:300]}). "
                "Resume with the configuration it was written with."
            ) from None
        status.expect_partial()  # e.g. optimizer state when restoring weights only
        sidecar = read_sidecar(path) or {}
        self.restored_sidecar = sidecar
        self.restored_epoch = float(sidecar.get("epoch", self.epoch.numpy()))
        return int(self.global_step.numpy())


def _variable_count(obj) -> int:
    """Variables of a model or optimizer (``variables`` is a property on Keras models and new optimizers, a
    method on legacy tf_keras optimizers); 0 for ``None``."""
    if obj is None:
        return 0
    found = getattr(obj, "variables", ())
    return len(found() if callable(found) else found)


def _state_text(name: str, older: Optional[List[str]] = None) -> str:
    """The CheckpointState text proto, relative paths, as tf.train.CheckpointManager writes it (oldest first,
    the newest last)."""
    lines = [f'model_checkpoint_path: "{name}"'] + [f'all_model_checkpoint_paths: "{n}"' for n in (older or [])]
    lines.append(f'all_model_checkpoint_paths: "{name}"')
    return "\n".join(lines) + "\n"


def _write_state_file(folder: str, name: str, older: Optional[List[str]] = None) -> None:
    # written to a temp name and renamed, so it never names a half-written list
    text = _state_text(name, older)
    path = _join(folder, STATE_FILE)
    if "://" in path:
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)
    else:
        atomic_write_text(path, text)


def _steps_in_dir(folder: str) -> List[int]:
    """Global steps of the ``ckpt-N.index`` files in ``folder``."""
    if not tf.io.gfile.isdir(folder):
        return []
    return [int(m.group(1)) for m in (_CKPT_INDEX_RE.match(n.rstrip("/")) for n in tf.io.gfile.listdir(folder)) if m]


def _remove_checkpoint_files(folder: str, step: int) -> List[str]:
    """Delete every file of ``ckpt-<step>`` in ``folder`` (and TensorFlow's ``ckpt-<step>_temp/``); returns the names."""
    prefix = f"{CHECKPOINT_NAME}-{step}"
    removed = []
    for n in tf.io.gfile.listdir(folder):
        n = n.rstrip("/")
        if n.startswith(prefix + ".") or n == prefix + "_temp":
            p = _join(folder, n)
            if tf.io.gfile.isdir(p):
                tf.io.gfile.rmtree(p)
            else:
                tf.io.gfile.remove(p)
            removed.append(n)
    return removed


def is_complete(checkpoint_path: str) -> bool:
    """Whether all files of the checkpoint unit are there (see the module doc): ``.index``, and when its sidecar
    names a trainer state file, that file with the same ``global_step``. A checkpoint without sidecar (written by
    another tool) counts as complete when its ``.index`` exists."""
    if not tf.io.gfile.exists(checkpoint_path + ".index"):
        return False
    try:
        sidecar = read_sidecar(checkpoint_path)
    except CheckpointError:
        return False
    state_name = (sidecar or {}).get("trainer_state")
    if not state_name:
        return True
    folder = os.path.dirname(checkpoint_path) if "://" not in checkpoint_path else checkpoint_path.rsplit("/", 1)[0]
    for name in (state_name, "trainer_state.json"):  # an exported folder (last-checkpoint/) holds the latter
        try:
            with tf.io.gfile.GFile(_join(folder, name), "r") as f:
                if int(json.loads(f.read()).get("global_step", -1)) == int(sidecar.get("global_step", -2)):
                    return True
        except (tf.errors.NotFoundError, ValueError, OSError, AttributeError):
            continue
    return False


def remove_incomplete(folder: str) -> List[str]:
    """Delete what a stopped save left in a checkpoint folder; returns the names removed.

    Removed: TensorFlow's ``ckpt-N_temp/`` folders, every file of a checkpoint that is not :func:`is_complete`,
    sidecars and trainer states without their checkpoint. Complete checkpoints, ``best/`` and other files stay.
    """
    if not tf.io.gfile.isdir(folder):
        return []
    names = [n.rstrip("/") for n in tf.io.gfile.listdir(folder)]
    removed: List[str] = []
    steps = set()
    for n in names:
        m = re.match(r"^" + CHECKPOINT_NAME + r"-(\d+)(?:_temp$|\.)", n)
        if m:
            steps.add(int(m.group(1)))
    for step in sorted(steps):
        path = _join(folder, f"{CHECKPOINT_NAME}-{step}")
        if is_complete(path):
            temp = _join(folder, f"{CHECKPOINT_NAME}-{step}_temp")
            if tf.io.gfile.exists(temp):
                tf.io.gfile.rmtree(temp)
                removed.append(os.path.basename(temp))
            continue
        removed += _remove_checkpoint_files(folder, step)
    for n in names:  # temp files of an atomic write that was killed (".ckpt-N.json.XXXX.tmp", state file)
        if n.startswith(".") and n.endswith(".tmp") and tf.io.gfile.exists(_join(folder, n)):
            tf.io.gfile.remove(_join(folder, n))
            removed.append(n)
    if removed:
        latest = max((s for s in _steps_in_dir(folder)), default=None)
        if latest is not None:
            older = sorted(s for s in _steps_in_dir(folder) if s != latest)
            _write_state_file(folder, f"{CHECKPOINT_NAME}-{latest}", [f"{CHECKPOINT_NAME}-{s}" for s in older])
        elif tf.io.gfile.exists(_join(folder, STATE_FILE)):
            tf.io.gfile.remove(_join(folder, STATE_FILE))
    return removed


def checkpoint_files(checkpoint_path: str, with_state: bool = False) -> Dict[str, Union[str, bytes]]:
    """The files a push uploads of one checkpoint so its folder restores on its own (Hub ``last-checkpoint/``):
    ``ckpt-N.index``, ``ckpt-N.data-*``, the sidecar ``ckpt-N.json``, its trainer state as ``trainer_state.json``
    and a ``checkpoint`` state file naming ``ckpt-N`` alone (its content: the run's own state file may still name
    the checkpoint before, and names the older ones). ``{name: local path}``; on a remote file system (``gs://``)
    the values are the files' bytes (a hard link needs a local file). ``with_state``: the trainer state listed
    even before the run writes it (a save's hand-over; a local checkpoint only: a remote one's bytes are read now).

    Raises:
        CheckpointError: the checkpoint does not exist.
    """
    src = resolve_checkpoint(checkpoint_path)
    remote = "://" in src
    src_dir, name = src.rsplit("/", 1) if remote else os.path.split(src)
    wanted = {n: n for n in tf.io.gfile.listdir(src_dir)
              if n in (name + ".index", name + ".json") or n.startswith(name + ".data-")}
    if (with_state and not remote) or tf.io.gfile.exists(src + STATE_SUFFIX):
        wanted["trainer_state.json"] = name + STATE_SUFFIX
    files: Dict[str, Union[str, bytes]] = {}
    for target, n in wanted.items():
        path = _join(src_dir, n)
        if remote:
            with tf.io.gfile.GFile(path, "rb") as f:
                files[target] = f.read()
        else:
            files[target] = path
    files[STATE_FILE] = _state_text(name).encode()
    return files
