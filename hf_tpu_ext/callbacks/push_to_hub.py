"""``PushToHubCallback``: push the model, its card and (optionally) training checkpoints while training runs.

A replacement for ``transformers.keras_callbacks.PushToHubCallback`` that does no network work in
``__init__``, checks Hub access before the first step, never blocks training (uploads run in a
:class:`~hf_tpu_ext.hub.push_queue.PushQueue` from snapshots of the files) and counts steps globally
(``model.optimizer.iterations``, correct with ``steps_per_execution > 1`` and across epochs/resumes).

``hub_strategy`` follows :class:`transformers.TrainingArguments`:

- ``"end"``: push the final model and card when training ends only;
- ``"every_save"``: push the model folder (weights, config, tokenizer, card, loss curve, logs) at every save;
- ``"checkpoint"``: also push the newest training checkpoint (model + optimizer) to ``last-checkpoint/``,
  from where ``--resume_from_checkpoint user/name`` resumes;
- ``"all_checkpoints"``: also push every checkpoint to ``checkpoint-<step>/``.

The model-folder pushes never hold optimizer state.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import shutil
import tempfile
from typing import Callable, List, Optional

import tf_keras

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.errors import ArgumentError, ModelCardError

logger = logging.getLogger("hf_tpu_ext.hub")

HUB_STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")
SAVE_STRATEGIES = ("no", "steps", "epoch")
# never in a model-folder push: optimizer state and local checkpoint folders
MODEL_IGNORE_PATTERNS = ["checkpoints/*", "last-checkpoint/*", "checkpoint-*", "hub-last-checkpoint/*", "*.index",
                         "*.data-*", "*.tmp", ".*"]
_MONITOR_ALIASES = {"eval_loss": "val_loss", "val_loss": "eval_loss", "eval_accuracy": "val_accuracy",
                    "val_accuracy": "eval_accuracy"}


def _make_checkpointer(output_dir: str, model, optimizer, directory: str):
    """A ``TrainingCheckpointer`` on (model, optimizer) writing to ``directory`` (either constructor form)."""
    from hf_tpu_ext.backends.tensorflow.checkpoint import TrainingCheckpointer

    params = inspect.signature(TrainingCheckpointer).parameters
    if "output_dir" in params:
        return TrainingCheckpointer(output_dir=output_dir, model=model, optimizer=optimizer, directory=directory,
                                    **({"save_total_limit": 2} if "save_total_limit" in params else {}))
    return TrainingCheckpointer(model, optimizer, directory, max_to_keep=2)


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
        hub_strategy: ``"end"``, ``"every_save"``, ``"checkpoint"`` or ``"all_checkpoints"`` (see module doc).
        hub_private_repo: create the repo private.
        hub_revision: branch to push to (created from main when missing).
        save_best_only: save/push only when ``logs[monitor]`` improves on the best value so far.
        monitor: the metric for ``save_best_only``; Keras' ``val_loss`` and ``eval_loss`` are interchangeable.
        mode: ``"min"`` or ``"max"``: which direction is an improvement.
        checkpointer: the run's ``TrainingCheckpointer`` for checkpoint pushes (default: one is created on
            (model, optimizer) in ``output_dir/checkpoints`` when needed).
        push_timeout: seconds ``on_train_end`` waits for the uploads to finish.
        summary_fn: a callable returning the training-summary dict for the card (default: what
            ``output_dir`` holds).
        max_retries, backoff_seconds: retry policy of the upload queue (see ``PushQueue``).
        **card_fields: passed to :func:`hf_tpu_ext.hub.model_card.render_model_card` (``license``,
            ``language``, ``dataset_name``, ``dataset_description``, ``base_model``, ``tags``, ...).

    Attributes:
        repo_id: the full repo id after :meth:`preflight`.
        pushed_steps: global steps at which a push was submitted, in order (the final push included).
        report: the :class:`~hf_tpu_ext.hub.push_queue.PushReport` after training ended.

    Raises:
        ArgumentError: an invalid strategy/mode, or ``save_strategy="steps"`` without ``save_steps >= 1``.
    """

    def __init__(self, output_dir: str, save_strategy: str = "epoch", save_steps: Optional[int] = None, tokenizer=None,
                 hub_model_id: Optional[str] = None, hub_token: Optional[str] = None, hub_strategy: str = "every_save",
                 hub_private_repo: Optional[bool] = None, hub_revision: Optional[str] = None, save_best_only: bool = False,
                 monitor: str = "eval_loss", mode: str = "min", checkpointer=None, push_timeout: float = 600,
                 summary_fn: Optional[Callable[[], dict]] = None, max_retries: int = 5, backoff_seconds: float = 1.0,
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
        self.output_dir = os.fspath(output_dir)
        self.save_strategy, self.save_steps = save_strategy, int(save_steps) if save_steps else None
        self.tokenizer, self.hub_model_id, self.hub_strategy = tokenizer, hub_model_id, hub_strategy
        self.hub_private_repo, self.hub_revision = hub_private_repo, hub_revision
        self.save_best_only, self.monitor, self.mode = save_best_only, monitor, mode
        self.checkpointer, self.push_timeout, self.summary_fn = checkpointer, push_timeout, summary_fn
        self.max_retries, self.backoff_seconds = max_retries, backoff_seconds
        self.card_fields = card_fields
        self._hub_token = hub_token  # resolved in preflight (reads HF_TOKEN / cached login, no network)
        self.repo_id: Optional[str] = None
        self.queue = None
        self.report = None
        self.pushed_steps: List[int] = []
        self.best: Optional[float] = None
        self.best_step: Optional[int] = None
        self._preflight_done = False
        self._last_save_step: Optional[int] = None
        self._epoch = 0.0
        self._warned_monitor = False

    def __repr__(self):  # the token stays out of logs and tracebacks
        return (f"PushToHubCallback(output_dir={self.output_dir!r}, hub_model_id={self.hub_model_id!r}, "
                f"hub_strategy={self.hub_strategy!r}, save_strategy={self.save_strategy!r})")

    @classmethod
    def from_run(cls, run):
        """Build from the trainer's ``RunContext`` (``--callbacks push_to_hub``)."""
        args = run.training_args
        return cls(output_dir=args.output_dir, save_strategy=args.save_strategy, save_steps=args.save_steps,
                   tokenizer=run.tokenizer, hub_model_id=args.hub_model_id, hub_token=args.hub_token,
                   hub_strategy=args.hub_strategy, hub_private_repo=args.hub_private_repo,
                   hub_revision=args.hub_revision, checkpointer=run.checkpointer, license=args.license,
                   language=args.language, dataset_name=run.data_args.dataset_name)

    # ---- Hub access ------------------------------------------------------------------------------
    def preflight(self) -> Optional[str]:
        """Check the token and namespace, create the repo/branch, validate the card fields; idempotent.

        Only the chief talks to the Hub; other processes return ``None``.

        Returns:
            The full repo id (chief), else ``None``.

        Raises:
            HubAuthError, HubRepoError, HubError: see :func:`hf_tpu_ext.hub.preflight.preflight`.
            ModelCardError: the card fields (license, language, dataset) do not validate.
        """
        from hf_tpu_ext.distributed import is_main_process

        if self._preflight_done:
            return self.repo_id
        if not is_main_process():
            self._preflight_done = True
            return None
        from hf_tpu_ext.hub.push_queue import open_push_queue

        self.repo_id, self._hub_token, self.queue = open_push_queue(
            self.output_dir, self.hub_model_id, self._hub_token, private=self.hub_private_repo,
            revision=self.hub_revision, max_retries=self.max_retries, backoff_seconds=self.backoff_seconds,
            card_fields=self.card_fields)
        self._preflight_done = True
        return self.repo_id

    # ---- Keras hooks -----------------------------------------------------------------------------
    def _global_step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_train_begin(self, logs=None):
        self.preflight()
        self._last_save_step = self._global_step()
        steps = (getattr(self, "params", None) or {}).get("steps")
        if steps:
            self._epoch = self._last_save_step / steps

    def on_train_batch_end(self, batch, logs=None):
        step = self._global_step()
        steps = (getattr(self, "params", None) or {}).get("steps")
        if steps:
            self._epoch = step / steps
        if self.save_strategy != "steps":
            return
        last = self._last_save_step or 0
        if step // self.save_steps > last // self.save_steps:  # crossed a multiple (steps_per_execution > 1)
            self._save_point(step, logs or {})

    def on_epoch_end(self, epoch, logs=None):
        self._epoch = float(epoch + 1)
        if self.save_strategy == "epoch":
            self._save_point(self._global_step(), logs or {})

    def on_train_end(self, logs=None):
        from hf_tpu_ext.distributed import is_main_process

        step = self._global_step()
        self._save_point(step, logs or {}, final=True)
        if not is_main_process() or self.queue is None:
            return
        from hf_tpu_ext.hub.push_queue import finish_pushes

        self.report = finish_pushes(self.queue, self.repo_id, self.output_dir, step, self.push_timeout)

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

    def _checkpoint(self, step: int) -> str:
        """The checkpoint of ``step``: the run's if it already wrote it, else a new one (all workers run this)."""
        from hf_tpu_ext.distributed import is_main_process

        if self.checkpointer is None:
            directory = os.path.join(self.output_dir, "checkpoints") if is_main_process() else tempfile.mkdtemp(
                prefix="hf-tpu-worker-")
            self.checkpointer = _make_checkpointer(self.output_dir, self.model, self.model.optimizer, directory)
        latest = self.checkpointer.latest
        if latest and os.path.basename(latest) == f"ckpt-{step}":
            return latest
        try:
            return self.checkpointer.save(step, epoch=self._epoch)
        except TypeError:  # a checkpointer whose save takes the step only
            return self.checkpointer.save(step)

    def _trainer_state(self, step: int, folder: str) -> None:
        from hf_tpu_ext.outputs import TrainerState

        TrainerState(global_step=step, epoch=self._epoch, best_metric=self.best, best_global_step=self.best_step,
                     save_steps=self.save_steps or 0).save(os.path.join(folder, "trainer_state.json"))

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
        ckpt_path = self._checkpoint(step) if want_ckpt else None
        if not is_main_process():
            return
        self._write_model_folder()
        if self.queue is None or (self.hub_strategy == "end" and not final):
            return
        message = "End of training" if final else f"Training in progress, step {step}"
        from hf_tpu_ext.hub.push_queue import submit_model_folder

        submit_model_folder(self.queue, self.output_dir, message, self._hub_token, MODEL_IGNORE_PATTERNS)
        if ckpt_path is not None:
            self._submit_checkpoint(ckpt_path, step)
        self.pushed_steps.append(step)

    def _write_model_folder(self) -> None:
        """Weights, config, tokenizer and the card (checked locally here; the Hub checks it in the push job)."""
        from hf_tpu_ext.backends.tensorflow.export import save_model_folder
        from hf_tpu_ext.hub.model_card import render_model_card, validate_model_card

        save_model_folder(self.model, self.output_dir, self.tokenizer)
        summary = None
        if self.summary_fn is not None:
            try:
                summary = self.summary_fn()
            except Exception as err:  # a summary problem must not stop training
                logger.warning("summary_fn failed (%s: %s); the card uses what the output folder shows.",
                               type(err).__name__, err)
        try:
            card = render_model_card(self.output_dir, repo_id=self.repo_id, summary=summary, **self.card_fields)
            validate_model_card(card, remote=False)
            card.save(os.path.join(self.output_dir, "README.md"))
        except ModelCardError as err:
            logger.error("Model card not updated: %s", err)

    def _submit_checkpoint(self, ckpt_path: str, step: int) -> None:
        from hf_tpu_ext.backends.tensorflow.checkpoint import export_checkpoint_folder

        if self.hub_strategy == "checkpoint":
            folder = os.path.join(self.output_dir, "last-checkpoint")
            export_checkpoint_folder(ckpt_path, folder)
            self._trainer_state(step, folder)
            self.queue.submit(folder, path_in_repo="last-checkpoint", commit_message=f"Checkpoint at step {step}",
                              delete_patterns=["ckpt-*"], key="last-checkpoint")
        else:  # all_checkpoints: one folder per step, never coalesced
            folder = tempfile.mkdtemp(prefix=f"checkpoint-{step}-")
            try:
                export_checkpoint_folder(ckpt_path, folder)
                self._trainer_state(step, folder)
                self.queue.submit(folder, path_in_repo=f"checkpoint-{step}", commit_message=f"Checkpoint at step {step}",
                                  key=f"checkpoint-{step}")
            finally:
                shutil.rmtree(folder, ignore_errors=True)
