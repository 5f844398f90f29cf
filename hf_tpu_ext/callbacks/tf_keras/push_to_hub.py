"""``PushToHubCallback`` (tf_keras): push the model, its card and checkpoints while ``model.fit`` runs.

The tf_keras adapter of :class:`hf_tpu_ext.callbacks.push_cadence.CallbackSession`, which decides when a save
happens, whether it is pushed now (``hub_strategy``, the commit budget), what the commit carries, its
title, the card and the report. This class only knows tf_keras: the global step is
``model.optimizer.iterations`` (right with ``steps_per_execution > 1`` and across epochs and resumes), the
model folder is ``save_fn`` (default: :func:`hf_tpu_ext.tf_model_folder.save_model_folder`,
``model.safetensors`` with PyTorch names + ``tf_model.h5``, as ``hf-tpu train`` writes it) and the checkpoint
is the run's ``checkpointer`` or a ``tf.train.CheckpointManager`` of model and optimizer, written on every
worker (collective under ``MultiWorkerMirroredStrategy``) before the chief-only push.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Optional

import tf_keras

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.fit_history import FitHistory, session_trainer_state
from hf_tpu_ext.callbacks.throughput_meter import card_facts_of
from hf_tpu_ext.callbacks.push_cadence import CallbackSession, PushConfig, SessionBacked
from hf_tpu_ext.tf_model_folder import ModelCheckpointer, copy_checkpoint, model_facts, save_model_folder

_D = PushConfig  # the defaults (class attributes of the dataclass): the session's, not this adapter's


@register_callback("push_to_hub")
class PushToHubCallback(SessionBacked, tf_keras.callbacks.Callback):
    """Push checkpoints, the model and its card to the Hub in the background while tf_keras trains.

    Args:
        output_dir, save_strategy, save_steps, hub_*, save_best_only, monitor, mode, push_timeout, max_retries,
            backoff_seconds: see :class:`~hf_tpu_ext.hub.push_policy.PushConfig`.
        tokenizer: saved into the model folder with the weights.
        checkpointer: the run's checkpointer (``save(step, epoch=...)`` returning a ``.../ckpt-N`` prefix;
            ``latest``); default: :class:`~hf_tpu_ext.tf_model_folder.ModelCheckpointer` in ``output_dir/checkpoints``.
        summary_fn: returns the run's training summary for the card (default: what the folder holds and the
            callbacks measured).
        save_fn: ``save_fn(model, folder, tokenizer)`` writes the model folder (default above).
        max_steps: the run's total optimizer steps (default: Keras' ``epochs * steps``).
        trainer_state_fn: returns the run's trainer state (log history, ...) for the checkpoint.
        session: a :class:`~hf_tpu_ext.callbacks.push_cadence.CallbackSession` owned by the caller, who finishes it.
        **card_fields: the card's fields (``license``, ``language``, ``dataset_name``, ``tags``, ...).

    Attributes:
        session: the :class:`~hf_tpu_ext.callbacks.push_cadence.CallbackSession` (``repo_id``, ``pushed_steps``, ``best``,
            ``best_step`` are its); report: the push report after training.

    Raises:
        ArgumentError: see :class:`~hf_tpu_ext.hub.push_policy.PushConfig`.
    """

    def __init__(self, output_dir: str, save_strategy: str = _D.save_strategy, save_steps: Optional[int] = None,
                 tokenizer=None, hub_model_id: Optional[str] = None, hub_token: Optional[str] = None,
                 hub_strategy: str = _D.hub_strategy, hub_private_repo: Optional[bool] = None,
                 hub_revision: Optional[str] = None, save_best_only: bool = False, monitor: str = _D.monitor,
                 mode: str = _D.mode, checkpointer=None, push_timeout: float = _D.push_timeout,
                 summary_fn: Optional[Callable[[], dict]] = None, max_retries: int = _D.max_retries,
                 backoff_seconds: float = _D.backoff_seconds, save_fn: Optional[Callable] = None,
                 max_steps: Optional[int] = None, trainer_state_fn: Optional[Callable[[], dict]] = None, session=None,
                 hub_commit_budget: int = _D.hub_commit_budget, **card_fields):
        super().__init__()
        config = PushConfig(output_dir, hub_model_id, hub_token, hub_strategy, hub_private_repo, hub_revision,
                            save_strategy, save_steps, save_best_only, monitor, mode, push_timeout, max_retries,
                            backoff_seconds, hub_commit_budget, card_fields=card_fields)
        self.session = session or CallbackSession(config)
        self.tokenizer, self.checkpointer = tokenizer, checkpointer  # output_dir: the session's
        self.summary_fn, self.save_fn, self.max_steps, self.trainer_state_fn = summary_fn, save_fn, max_steps, trainer_state_fn
        self._owns_session, self.report, self.history, self._step0 = session is None, None, FitHistory(), 0

    def __repr__(self):  # the token stays out of logs and tracebacks
        return f"PushToHubCallback({self.session!r})"

    # ---- Keras hooks -----------------------------------------------------------------------------
    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _epoch(self, step: int) -> float:
        steps = (getattr(self, "params", None) or {}).get("steps")
        return step / steps if steps else float(getattr(self, "_epochs_done", 0))

    def on_train_begin(self, logs=None):
        self.session.preflight()
        self._step0 = self._step()
        self.session.begin(self._step0)

    def on_train_batch_end(self, batch, logs=None):
        step = self._step()
        self.session.note_logs(logs, step, self._epoch(step))
        self.history.on_batch(logs, step, (getattr(self, "params", None) or {}).get("steps"))
        if self.session.is_save_step(step):
            self._save(step, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._epochs_done, step = epoch + 1, self._step()
        self.session.note_logs(logs, step, self._epoch(step))  # val_loss of a Keras script, eval_loss of hf-tpu train
        self.history.on_epoch(logs, step, self._epoch(step))
        if self.session.saves_each_epoch:
            self._save(step, logs)

    def on_train_end(self, logs=None):
        self._save(self._step(), logs, final=True)
        if self._owns_session:
            self.report = self.session.finish()

    # ---- a save: checkpoint (every worker: the write is collective), then model folder and push (chief) --
    def _save(self, step: int, logs, final: bool = False) -> None:
        s = self.session
        if not final and not s.due(step, logs):
            return
        prefix = self._checkpoint(step) if s.wants_checkpoint(final) else None
        plan = s.admit(step, final, max_steps=self._max_steps())
        if plan is None:  # not pushed now (e.g. the last step's save: in the final push)
            return
        (self.save_fn or save_model_folder)(self.model, self.output_dir, self.tokenizer)
        if self.summary_fn is None and self.trainer_state_fn is None:  # a drop-in fit (hf-tpu train writes its own)
            self.history.write_curve(self.output_dir)
        # a card pushed before the end says "Training in progress, step N of M" (hub.model_card.progress_note)
        facts = card_facts_of(self.model, step)
        s.write_card(self.output_dir, self.summary_fn, max_steps=self._max_steps() or None, training_in_progress=not final,
                     **dict(model_facts(self.model), **facts))
        folder = None
        if prefix is not None:  # the checkpoint alone, with tf.train's state file and the trainer state
            folder = copy_checkpoint(prefix, s.checkpoint_folder())
            s.write_trainer_state(folder, step, epoch=self._epoch(step), max_steps=self._max_steps(),  # a drop-in
                                  known_only=self.trainer_state_fn is None,  # fit's: what it knew, no placeholder
                                  state=self.trainer_state_fn() if self.trainer_state_fn else session_trainer_state(
                                      self.history, s, getattr(self, "params", None), self._step0, facts))
        s.save(plan, self.output_dir, checkpoint_folder=folder)

    def _max_steps(self) -> int:
        params = getattr(self, "params", None) or {}
        return int(self.max_steps or (params.get("steps") or 0) * (params.get("epochs") or 0))

    def _checkpoint(self, step: int) -> str:
        """Write (or find) the checkpoint of ``step`` on every worker; returns its prefix ``.../ckpt-N``."""
        if self.checkpointer is None:
            directory = (os.path.join(self.output_dir, "checkpoints") if self.session.is_chief
                         else tempfile.mkdtemp(prefix="hf-tpu-worker-"))
            self.checkpointer = ModelCheckpointer(self.model, directory)
        latest = self.checkpointer.latest
        if latest and os.path.basename(latest) == f"ckpt-{step}":
            return latest
        return self.checkpointer.save(step, epoch=self._epoch(step))
