"""Push a Keras 3 model (a keras-hub preset, or a ``.keras`` file) to the Hub in the background while ``fit`` runs.

The Keras 3 adapter of :class:`hf_tpu_ext.callbacks.push_cadence.CallbackSession` (cadence, ``hub_strategy``, the
commit budget, titles, preflight, final push and report are the session's). This class only knows Keras 3:
the global step is the optimizer's iterations at train begin plus the batches since (no device read per
step), and a save writes the files of :mod:`hf_tpu_ext.callbacks.keras.model_files` -- the preset or
``model.keras``, its card and ``loss_curve.png``, a checkpoint ``checkpoints/checkpoint-<step>/`` (only the newest
kept) that :meth:`PushToHubCallback.restore_from_hub` restores; the fit's log history is a ``FitHistory``.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, Optional

import keras

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.keras import process_index
from hf_tpu_ext.callbacks.fit_history import FitHistory, session_trainer_state
from hf_tpu_ext.callbacks.keras.model_files import fit_epoch, restore_from_hub, save_checkpoint, save_model, write_model_card
from hf_tpu_ext.callbacks.throughput_meter import card_facts_of
from hf_tpu_ext.callbacks.push_cadence import CallbackSession, PushConfig, SessionBacked

_D = PushConfig  # the defaults (class attributes of the dataclass): the session's, not this adapter's


@register_callback("push_to_hub", framework="keras")
class PushToHubCallback(SessionBacked, keras.callbacks.Callback):
    """Push checkpoints, the model and its card to the Hub in the background while a Keras 3 ``fit`` runs.

    Chief-only (:func:`hf_tpu_ext.callbacks.keras.process_index` 0; elsewhere it does nothing): Hub access is
    checked at train begin (a bad token fails before the first step); saves at each epoch end or every
    ``save_steps`` steps (the upload runs in the background); the final state at train end is always pushed
    (``on_train_end`` waits up to ``push_timeout`` seconds; ``self.report``).

    Args:
        output_dir, hub_model_id, hub_token, hub_strategy, save_strategy, save_steps, hub_private_repo,
            hub_revision, push_timeout, max_retries, backoff_seconds, hub_commit_budget: see
            :class:`~hf_tpu_ext.hub.push_policy.PushConfig`.
        **card_fields: see :func:`~hf_tpu_ext.callbacks.keras.model_files.render_card` (``license``, ``tags``...).

    Attributes:
        session: the :class:`~hf_tpu_ext.callbacks.push_cadence.CallbackSession` (``repo_id``, ``pushed_steps``;
            nothing pushed on other processes); report: the push report after training; history: the fit's ``FitHistory``.

    Raises:
        ArgumentError: see :class:`~hf_tpu_ext.hub.push_policy.PushConfig`.
    """

    def __init__(self, output_dir: str, hub_model_id: Optional[str] = None, hub_token: Optional[str] = None,
                 hub_strategy: str = _D.hub_strategy, save_strategy: str = _D.save_strategy,
                 save_steps: Optional[int] = None, hub_private_repo: Optional[bool] = None,
                 hub_revision: Optional[str] = None, push_timeout: float = _D.push_timeout,
                 max_retries: int = _D.max_retries, backoff_seconds: float = _D.backoff_seconds,
                 hub_commit_budget: int = _D.hub_commit_budget, **card_fields):
        super().__init__()
        config = PushConfig(output_dir, hub_model_id, hub_token, hub_strategy, hub_private_repo, hub_revision,
                            save_strategy, save_steps, push_timeout=push_timeout, max_retries=max_retries,
                            backoff_seconds=backoff_seconds, hub_commit_budget=hub_commit_budget, card_fields=card_fields)
        self.session = CallbackSession(config, is_chief=process_index() == 0)
        self.report = None  # output_dir: the session's
        # the latest logs (card); loss samples and epoch logs (loss curve, the checkpoints' trainer_state.json)
        self._logs, self.history = {}, FitHistory()  # type: Dict[str, Any], FitHistory
        self._step0 = self._steps = self._epoch = 0
        self._last_save, self._last_checkpoint = None, None  # type: Optional[int], Optional[str]

    def __repr__(self):  # the token stays out of logs and tracebacks
        return f"PushToHubCallback({self.session!r})"

    def save(self, final: bool = False) -> Optional[int]:
        """Write the model folder, card (and the checkpoint ``hub_strategy`` pushes) and queue the push.

        Returns:
            The global step pushed, or None (another process, or a save the commit budget coalesced).
        """
        s, step = self.session, self._step0 + self._steps
        # a save at the last step coalesces into the final push (one commit, not two: PushSession.admit)
        plan = s.admit(step, final, max_steps=self._max_steps() or None) if final or s.due(step) else None
        if plan is None:
            return None
        model, params = self.model, getattr(self, "params", None) or {}  # on JAX the property syncs the variables
        epoch, facts = fit_epoch(params, step, self._epoch), card_facts_of(model, step)
        if not (final and step == self._last_save):  # else the folder holds this state already: new card only
            save_model(model, self.output_dir)
        write_model_card(model, self.output_dir, self.history, s.repo_id, step=step, epoch=epoch, logs=self._logs,
                         final=final, max_steps=self._max_steps() or None, facts=facts, **s.config.card_fields)
        checkpoint = self._last_checkpoint if step == self._last_save else None
        if checkpoint is None and plan.checkpoint is not None:
            checkpoint = save_checkpoint(model, os.path.join(self.output_dir, "checkpoints", f"checkpoint-{step}"))
            s.write_trainer_state(checkpoint, step, epoch=epoch, max_steps=self._max_steps(), known_only=True,
                                  state=session_trainer_state(self.history, s, params, self._step0, facts, epoch_numbers=True))
        s.save(plan, self.output_dir, checkpoint_folder=checkpoint)
        if self._last_checkpoint and self._last_checkpoint != checkpoint:  # keep only the newest locally
            shutil.rmtree(self._last_checkpoint, ignore_errors=True)
        self._last_checkpoint = checkpoint
        self._last_save = step
        return step

    def _max_steps(self) -> int:
        params = getattr(self, "params", None) or {}
        return int((params.get("steps") or 0) * (params.get("epochs") or 0))

    @classmethod
    def restore_from_hub(cls, model, hub_model_id: str, token: Optional[str] = None, local_dir: Optional[str] = None):
        """See :func:`hf_tpu_ext.callbacks.keras.model_files.restore_from_hub` (returns the trainer state)."""
        return restore_from_hub(model, hub_model_id, token, local_dir)

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, logs=None):
        if not self.session.is_chief:
            return
        self.session.preflight()
        iterations = getattr(getattr(self._model, "optimizer", None), "iterations", None)
        self._step0 = int(keras.ops.convert_to_numpy(getattr(iterations, "value", iterations))) if iterations is not None else 0
        self._steps, self.history = 0, FitHistory()
        self.session.begin(self._step0)

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_begin = batch

    def on_train_batch_end(self, batch, logs=None):
        self._steps += int(batch) - int(getattr(self, "_batch_begin", batch)) + 1
        if self.session.active:
            self.history.on_batch(logs, self._step0 + self._steps, (getattr(self, "params", None) or {}).get("steps"))
            if self.session.is_save_step(self._step0 + self._steps):
                self._logs = dict(logs or {})
                self.save()

    def on_epoch_end(self, epoch, logs=None):
        self._epoch, self._logs = epoch + 1, (logs if logs is not None else {})  # the dict all callbacks get
        self.history.on_epoch(self._logs, self._step0 + self._steps, self._epoch)
        self.session.note_logs(logs, self._step0 + self._steps, self._epoch)
        if self.session.active and self.session.saves_each_epoch:
            self.save()

    def on_train_end(self, logs=None):
        if not self.session.active:
            return
        self._logs.update(logs or {})
        try:
            self.save(final=True)
        finally:
            self.report = self.session.finish()
