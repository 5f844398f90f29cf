"""``PushToHubCallback``: push the model, its card and (optionally) training checkpoints while training runs.

A tf_keras adapter of :class:`hf_tpu_ext.hub.pusher.HubPusher` (which owns the push policy, the queue,
retries, the report and the cleanup): it decides *when* a save happens (``save_strategy``, ``save_steps``,
``save_best_only``; steps counted globally with ``model.optimizer.iterations``, correct with
``steps_per_execution > 1`` and across epochs/resumes), writes the model folder with the ``save_fn`` it
was given, the checkpoint with the run's ``checkpointer`` (or a ``tf.train.Checkpoint`` of model and
optimizer) and a ``trainer_state.json`` with the true epoch and ``max_steps``, and hands the folders to
the pusher. No network work in ``__init__``; Hub access (write access included) is checked before the first
step; uploads never block training. It imports no backend: the training run passes its save function.

``hub_strategy`` follows :class:`transformers.TrainingArguments` (see :mod:`hf_tpu_ext.hub.pusher`):
``"end"``, ``"every_save"``, ``"checkpoint"`` (model + ``last-checkpoint/`` in one commit, from where
``--resume_from_checkpoint user/name`` resumes), ``"all_checkpoints"``. The model-folder pushes never hold
optimizer state.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import shutil
import tempfile
from typing import Callable, List, Optional

import tf_keras

from hf_tpu_ext.args import check_repo_id
from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.errors import ArgumentError, ModelCardError
from hf_tpu_ext.hub.pusher import HUB_STRATEGIES, LAST_CHECKPOINT, HubPusher, note_step

logger = logging.getLogger("hf_tpu_ext.hub")

SAVE_STRATEGIES = ("no", "steps", "epoch")
_MONITOR_ALIASES = {"eval_loss": "val_loss", "val_loss": "eval_loss", "eval_accuracy": "val_accuracy",
                    "val_accuracy": "eval_accuracy"}


@register_callback("push_to_hub")
class PushToHubCallback(tf_keras.callbacks.Callback):
    """Push checkpoints, the model and its card to the Hub in the background while training runs.

    Args:
        output_dir: local folder the model folder (and ``last-checkpoint/``) is written to and pushed from.
        save_strategy: ``"epoch"`` (save at each epoch end), ``"steps"`` (every ``save_steps`` global steps) or
            ``"no"`` (only the final push).
        save_steps: interval in global optimizer steps for ``save_strategy="steps"``.
        tokenizer: saved into the model folder with the weights.
        hub_model_id: ``"user/name"`` or ``"name"`` (default: the name of ``output_dir`` under the token's user).
        hub_token: the Hub token (default: ``HF_TOKEN`` or the cached login). Never logged or written.
        hub_strategy: ``"end"``, ``"every_save"``, ``"checkpoint"`` or ``"all_checkpoints"``.
        hub_private_repo: create the repo private.
        hub_revision: branch to push to (created from main when missing).
        save_best_only: save/push only when ``logs[monitor]`` improves on the best value so far.
        monitor: the metric for ``save_best_only``; Keras' ``val_loss`` and ``eval_loss`` are interchangeable.
        mode: ``"min"`` or ``"max"``: which direction is an improvement.
        checkpointer: the run's checkpointer for checkpoint pushes: an object with ``save(step, epoch=...)``
            returning a checkpoint prefix ``.../ckpt-N`` and ``latest`` (e.g. the TensorFlow backend's
            ``TrainingCheckpointer``). Default: a ``tf.train.CheckpointManager`` on (model, optimizer, global
            step, epoch) in ``output_dir/checkpoints``.
        push_timeout: seconds ``on_train_end`` waits for the uploads to finish.
        summary_fn: a callable returning the training-summary dict for the card (default: what
            ``output_dir`` holds).
        max_retries, backoff_seconds: retry policy (see :class:`~hf_tpu_ext.hub.pusher.HubPusher`).
        save_fn: ``save_fn(model, folder, tokenizer)`` writes the model folder (config, weights, tokenizer);
            the training run passes its backend's. Default: the model's and tokenizer's ``save_pretrained``.
        max_steps: the run's total optimizer steps, for ``trainer_state.json`` (default: Keras'
            ``epochs * steps``).
        trainer_state_fn: returns the run's ``trainer_state`` dict (log history, best metric ...) for the
            checkpoint's ``trainer_state.json``; ``global_step``, ``epoch`` and ``max_steps`` are set from the
            save point.
        pusher: a :class:`~hf_tpu_ext.hub.pusher.HubPusher` owned by the caller (the training run), which
            then also finishes it; default: the callback makes one and finishes it in ``on_train_end``.
        **card_fields: passed to :func:`hf_tpu_ext.hub.model_card.render_model_card` (``license``,
            ``language``, ``dataset_name``, ``dataset_description``, ``base_model``, ``tags``, ...).

    Attributes:
        repo_id: the full repo id after :meth:`preflight`.
        pushed_steps: global steps at which a push was submitted, in order (the final push included; the
            last 100).
        report: the :class:`~hf_tpu_ext.hub.push_queue.PushReport` after training ended.

    Raises:
        ArgumentError: an invalid strategy/mode, a malformed ``hub_model_id``, or ``save_strategy="steps"`` without
            ``save_steps >= 1``.
    """

    def __init__(self, output_dir: str, save_strategy: str = "epoch", save_steps: Optional[int] = None, tokenizer=None,
                 hub_model_id: Optional[str] = None, hub_token: Optional[str] = None, hub_strategy: str = "every_save",
                 hub_private_repo: Optional[bool] = None, hub_revision: Optional[str] = None, save_best_only: bool = False,
                 monitor: str = "eval_loss", mode: str = "min", checkpointer=None, push_timeout: float = 600,
                 summary_fn: Optional[Callable[[], dict]] = None, max_retries: int = 5, backoff_seconds: float = 1.0,
                 save_fn: Optional[Callable] = None, max_steps: Optional[int] = None,
                 trainer_state_fn: Optional[Callable[[], dict]] = None, pusher: Optional[HubPusher] = None,
                 **card_fields):
        super().__init__()
        if hub_strategy not in HUB_STRATEGIES:
            raise ArgumentError(f"hub_strategy must be one of {', '.join(HUB_STRATEGIES)}, got {hub_strategy!r}.")
        if save_strategy not in SAVE_STRATEGIES:
            raise ArgumentError(f"save_strategy must be one of {', '.join(SAVE_STRATEGIES)}, got {save_strategy!r}.")
        if save_strategy == "steps" and (save_steps is None or int(save_steps) < 1):
            raise ArgumentError("save_strategy='steps' needs save_steps >= 1 (global optimizer steps between pushes).")
        if mode not in ("min", "max"):
            raise ArgumentError(f"mode must be 'min' or 'max', got {mode!r}.")
        if hub_model_id is not None:
            check_repo_id(hub_model_id, "hub_model_id")  # at construction, not at the first push
        self.output_dir = os.fspath(output_dir)
        self.save_strategy, self.save_steps = save_strategy, int(save_steps) if save_steps else None
        self.tokenizer, self.hub_model_id, self.hub_strategy = tokenizer, hub_model_id, hub_strategy
        self.hub_private_repo, self.hub_revision = hub_private_repo, hub_revision
        self.save_best_only, self.monitor, self.mode = save_best_only, monitor, mode
        self.checkpointer, self.push_timeout, self.summary_fn = checkpointer, push_timeout, summary_fn
        self.max_retries, self.backoff_seconds = max_retries, backoff_seconds
        self.save_fn, self.max_steps, self.trainer_state_fn = save_fn, max_steps, trainer_state_fn
        self.card_fields = card_fields
        self._hub_token = hub_token  # resolved in preflight (reads HF_TOKEN / cached login, no network)
        self.pusher: Optional[HubPusher] = pusher
        self._owns_pusher = pusher is None
        self.repo_id: Optional[str] = pusher.repo_id if pusher is not None else None
        self.report = None
        self.pushed_steps: List[int] = []
        self.best: Optional[float] = None
        self.best_step: Optional[int] = None
        self._preflight_done = False
        self._last_save_step: Optional[int] = None
        self._epoch = 0.0
        self._warned_monitor = False
        self._own_manager = None

    def __repr__(self):  # the token stays out of logs and tracebacks
        return (f"PushToHubCallback(output_dir={self.output_dir!r}, hub_model_id={self.hub_model_id!r}, "
                f"hub_strategy={self.hub_strategy!r}, save_strategy={self.save_strategy!r})")

    @classmethod
    def from_run(cls, run):
        """Build from the training run's context (``--callbacks push_to_hub``).

        Uses ``run.save_model_folder`` (the backend's model-folder writer) and ``run.hub_pusher`` when the
        run provides them.
        """
        args = run.training_args
        return cls(output_dir=args.output_dir, save_strategy=args.save_strategy, save_steps=args.save_steps,
                   tokenizer=run.tokenizer, hub_model_id=args.hub_model_id, hub_token=args.hub_token,
                   hub_strategy=args.hub_strategy, hub_private_repo=args.hub_private_repo,
                   hub_revision=args.hub_revision, checkpointer=getattr(run, "checkpointer", None),
                   save_fn=getattr(run, "save_model_folder", None), max_steps=getattr(run, "total_steps", None),
                   pusher=getattr(run, "hub_pusher", None), license=args.license, language=args.language,
                   dataset_name=run.data_args.dataset_name)

    # ---- Hub access ------------------------------------------------------------------------------
    def preflight(self) -> Optional[str]:
        """Check the token, write access and namespace, create the repo/branch, validate the card fields.

        Idempotent. Only the chief talks to the Hub; other processes return ``None``.

        Returns:
            The full repo id (chief), else ``None``.

        Raises:
            HubAuthError, HubRepoError, HubError: see :meth:`hf_tpu_ext.hub.pusher.HubPusher.preflight`.
            ModelCardError: the card fields (license, language, dataset) do not validate.
        """
        from hf_tpu_ext.distributed import is_main_process

        if self._preflight_done:
            return self.repo_id
        if not is_main_process():
            self._preflight_done = True
            return None
        if self.pusher is None:
            self.pusher = HubPusher(
                self.hub_model_id, token=self._hub_token, hub_strategy=self.hub_strategy,
                private=self.hub_private_repo, revision=self.hub_revision, output_dir=self.output_dir,
                max_retries=self.max_retries, backoff_seconds=self.backoff_seconds, push_timeout=self.push_timeout,
                card_fields=self.card_fields)
        self.repo_id = self.pusher.preflight()
        self._hub_token = self.pusher.token
        self._preflight_done = True
        return self.repo_id

    # ---- Keras hooks -----------------------------------------------------------------------------
    def _global_step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _steps_per_epoch(self) -> Optional[int]:
        return (getattr(self, "params", None) or {}).get("steps")

    def on_train_begin(self, logs=None):
        self.preflight()
        self._last_save_step = self._global_step()
        steps = self._steps_per_epoch()
        if steps:
            self._epoch = self._last_save_step / steps

    def _note_eval(self, logs) -> None:
        from hf_tpu_ext.hub.model_card import eval_results_from_logs

        found = eval_results_from_logs(logs)
        if found:
            self._last_eval = found

    def on_train_batch_end(self, batch, logs=None):
        self._note_eval(logs)
        step = self._global_step()
        steps = self._steps_per_epoch()
        if steps:
            self._epoch = step / steps
        if self.save_strategy != "steps":
            return
        last = self._last_save_step or 0
        if step // self.save_steps > last // self.save_steps:  # crossed a multiple (steps_per_execution > 1)
            self._save_point(step, logs or {})

    def on_epoch_end(self, epoch, logs=None):
        self._note_eval(logs)  # val_loss of a Keras script, eval_loss of hf-tpu train
        steps = self._steps_per_epoch()
        self._epoch = self._global_step() / steps if steps else float(epoch + 1)
        if self.save_strategy == "epoch":
            self._save_point(self._global_step(), logs or {})

    def on_train_end(self, logs=None):
        from hf_tpu_ext.distributed import is_main_process

        step = self._global_step()
        self._save_point(step, logs or {}, final=True)
        if not is_main_process() or self.pusher is None or not self._owns_pusher:
            return
        self.report = self.pusher.finish(self.push_timeout)

    # ---- save points -----------------------------------------------------------------------------
    def _monitored(self, logs: dict) -> Optional[float]:
        for key in (self.monitor, _MONITOR_ALIASES.get(self.monitor)):
            if key and logs.get(key) is not None:
                try:
                    return float(logs[key])
                except (TypeError, ValueError):
                    return None
        return None

    def _improved(self, logs: dict, step: int) -> bool:
        value = self._monitored(logs)
        if value is None or math.isnan(value):
            if not self._warned_monitor:
                logger.warning("save_best_only: %r is not in the logs at step %d; nothing saved.", self.monitor, step)
                self._warned_monitor = True
            return False
        better = self.best is None or (value < self.best if self.mode == "min" else value > self.best)
        if better:
            self.best, self.best_step = value, step
        return better

    def _max_steps(self) -> int:
        if self.max_steps:
            return int(self.max_steps)
        params = getattr(self, "params", None) or {}
        if params.get("steps") and params.get("epochs"):
            return int(params["steps"]) * int(params["epochs"])
        return 0

    def _checkpoint_prefix(self, step: int) -> str:
        """Write (or find) the checkpoint of ``step``; every worker runs this (the write is collective)."""
        from hf_tpu_ext.distributed import is_main_process

        if self.checkpointer is not None:
            latest = self.checkpointer.latest
            if latest and os.path.basename(latest) == f"ckpt-{step}":
                return latest
            try:
                return self.checkpointer.save(step, epoch=self._epoch)
            except TypeError:  # a checkpointer whose save takes the step only
                return self.checkpointer.save(step)
        if self._own_manager is None:
            import tensorflow as tf

            directory = os.path.join(self.output_dir, "checkpoints") if is_main_process() else tempfile.mkdtemp(
                prefix="hf-tpu-worker-")
            self._global_step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self._epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
            # the object graph of the TensorFlow backend's checkpoints, so its restore accepts these
            checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer,
                                             global_step=self._global_step_var, epoch=self._epoch_var)
            self._own_manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2, checkpoint_name="ckpt")
        self._global_step_var.assign(step)
        self._epoch_var.assign(int(self._epoch))
        return self._own_manager.save(checkpoint_number=step)

    def _checkpoint_folder(self, prefix: str, step: int, folder: str) -> str:
        """Copy checkpoint ``prefix`` alone into ``folder`` with a ``checkpoint`` state file and trainer_state.json."""
        name = os.path.basename(prefix)
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        os.makedirs(folder)
        for path in glob.glob(prefix + ".*"):  # ckpt-N.index, ckpt-N.data-*, the backend's ckpt-N.json sidecar
            shutil.copy2(path, os.path.join(folder, os.path.basename(path)))
        with open(os.path.join(folder, "checkpoint"), "w", encoding="utf-8") as f:  # tf.train's state file
            f.write(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
        self._trainer_state(step, folder)
        return folder

    def _trainer_state(self, step: int, folder: str) -> None:
        import json

        state = {}
        if self.trainer_state_fn is not None:
            try:
                state = dict(self.trainer_state_fn() or {})
            except Exception as err:  # the checkpoint must not depend on it
                logger.warning("trainer_state_fn failed (%s: %s); trainer_state.json holds the step and epoch only.",
                               type(err).__name__, err)
        state.update(global_step=int(step), epoch=float(self._epoch), max_steps=self._max_steps())
        state.setdefault("best_metric", self.best)
        state.setdefault("best_global_step", self.best_step)
        state.setdefault("save_steps", self.save_steps or 0)
        with open(os.path.join(folder, "trainer_state.json"), "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2, sort_keys=True)

    def _save_point(self, step: int, logs: dict, final: bool = False) -> None:
        from hf_tpu_ext.distributed import is_main_process

        if not final:
            if self._last_save_step is not None and step == self._last_save_step and self.pushed_steps[-1:] == [step]:
                return
            if self.save_best_only and not self._improved(logs, step):
                self._last_save_step = step
                return
        self._last_save_step = step
        want_ckpt = self.hub_strategy in ("checkpoint", "all_checkpoints") and (not final or self.hub_strategy == "checkpoint")
        # collective under MultiWorkerMirroredStrategy: every worker saves, outside the chief-only branch
        prefix = self._checkpoint_prefix(step) if want_ckpt else None
        if not is_main_process():
            return
        self._write_model_folder()
        if self.pusher is None or (self.hub_strategy == "end" and not final):
            return
        folder = None
        if prefix is not None:
            folder = self._checkpoint_folder(prefix, step, os.path.join(self.output_dir, LAST_CHECKPOINT))
        self.pusher.push_save(self.output_dir, step=step, checkpoint_folder=folder, final=final)
        note_step(self.pushed_steps, step)

    def _write_model_folder(self) -> None:
        """Weights, config, tokenizer and the card (checked locally here; the Hub checks it in the push job)."""
        from hf_tpu_ext.hub.model_card import render_model_card, validate_model_card

        if self.save_fn is not None:
            self.save_fn(self.model, self.output_dir, self.tokenizer)
        else:
            self.model.save_pretrained(self.output_dir)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(self.output_dir)
        summary = None
        if self.summary_fn is not None:
            try:
                summary = self.summary_fn()
            except Exception as err:  # a summary problem must not stop training
                logger.warning("summary_fn failed (%s: %s); the card uses what the output folder shows.",
                               type(err).__name__, err)
        if summary is None:  # a plain Keras script: what the model and the logs show
            from hf_tpu_ext.hub.model_card import initialization_fields, load_summary

            summary = load_summary(self.output_dir)
            for key, value in initialization_fields(getattr(self.model, "name_or_path", None)).items():
                if summary.get(key) is None:
                    summary[key] = value
            if not summary.get("eval_results") and getattr(self, "_last_eval", None):
                summary["eval_results"] = dict(self._last_eval)
            from hf_tpu_ext.callbacks import read_global_step

            # what Keras knows; a batch size comes only from card_fields (global_batch_size=), fit does not say
            progress = {"global_step": read_global_step(self.model), "epoch": self._epoch or None}
            for key, value in progress.items():
                if summary.get(key) is None and value is not None:
                    summary[key] = value
        try:
            card = render_model_card(self.output_dir, repo_id=self.repo_id, summary=summary, **self.card_fields)
            validate_model_card(card, remote=False)
            card.save(os.path.join(self.output_dir, "README.md"))
        except ModelCardError as err:
            logger.error("Model card not updated: %s", err)
