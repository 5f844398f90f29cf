"""``PushToHubCallback`` for ``transformers.Trainer`` (any PyTorch device; transformers 4.57 and 5.x).

The Trainer adapter of :class:`hf_tpu_ext.callbacks.push_cadence.CallbackSession`, which owns what a push is. This
class knows the Trainer: its saves (``on_save``: the model folder is the ``checkpoint-N/`` it wrote, without
the training state, so no second save runs on the device), its progress and its final model. Beyond the
Trainer's own ``push_to_hub``: write access is checked before the first step, uploads never block training,
the final state is always pushed, and ``hub_strategy="checkpoint"`` lands model + ``last-checkpoint/`` in
one commit (:func:`checkpoint_from_hub` brings it back for ``trainer.train(resume_from_checkpoint=...)``).
It imports no backend and never torch_xla.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Optional

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.torch.model_files import (checkpoint_from_hub, copy_model_files,  # noqa: F401
                                                    is_trainer_checkpoint, save_model_folder, tied_weight_aliases,
                                                    write_loss_curve)
from hf_tpu_ext.callbacks.throughput_meter import card_facts_of
from hf_tpu_ext.hub.card_facts import facts_from_trainer_state
from hf_tpu_ext.callbacks.push_cadence import CallbackSession, PushConfig, SessionBacked

logger = logging.getLogger("hf_tpu_ext.hub")
_D = PushConfig  # the defaults (class attributes of the dataclass): the session's, not this adapter's


@register_callback("push_to_hub", backend="torch")
class PushToHubCallback(SessionBacked, TrainerCallback):
    """Push checkpoints, the model and its card to the Hub in the background while a ``Trainer`` runs.

    Args:
        output_dir: the folder the model folder is written to and pushed from (default: the Trainer's
            ``args.output_dir``, read at ``on_train_begin``).
        hub_model_id, hub_token, hub_strategy, hub_private_repo, hub_revision, push_timeout, max_retries,
            backoff_seconds, hub_commit_budget: see :class:`~hf_tpu_ext.hub.push_policy.PushConfig`.
        tokenizer: saved into the model folder (default: the Trainer's ``processing_class``).
        summary_fn: returns the training summary for the card (default: what the folder holds and the run measured).
        push_final_on_train_end: push the final weights in ``on_train_end`` (``False``: the caller calls :meth:`finish`).
        save_fn: ``save_fn(model, folder, tokenizer)`` writes the final model folder when no checkpoint of the
            final step exists (default: :func:`~hf_tpu_ext.callbacks.torch.model_files.save_model_folder`).
        session: a :class:`~hf_tpu_ext.callbacks.push_cadence.CallbackSession` owned by the caller, who finishes it.
        **card_fields: the card's fields (``license``, ``language``, ``dataset_name``, ...).

    Attributes:
        session: the :class:`~hf_tpu_ext.callbacks.push_cadence.CallbackSession` (``repo_id``, ``pushed_steps`` are its);
        report: the push report after the final push.

    Raises:
        ArgumentError: see :class:`~hf_tpu_ext.hub.push_policy.PushConfig`.
    """

    def __init__(self, output_dir: Optional[str] = None, hub_model_id: Optional[str] = None,
                 hub_token: Optional[str] = None, hub_strategy: str = _D.hub_strategy,
                 hub_private_repo: Optional[bool] = None, hub_revision: Optional[str] = None, tokenizer=None,
                 push_timeout: float = _D.push_timeout, summary_fn: Optional[Callable[[], dict]] = None,
                 max_retries: int = _D.max_retries, backoff_seconds: float = _D.backoff_seconds,
                 push_final_on_train_end: bool = True, save_fn: Optional[Callable] = None, session=None,
                 hub_commit_budget: int = _D.hub_commit_budget, **card_fields):
        config = PushConfig(output_dir, hub_model_id, hub_token, hub_strategy, hub_private_repo, hub_revision,
                            push_timeout=push_timeout, max_retries=max_retries, backoff_seconds=backoff_seconds,
                            hub_commit_budget=hub_commit_budget, card_fields=card_fields)
        self.session = session or CallbackSession(config)
        self.tokenizer, self.summary_fn, self.save_fn = tokenizer, summary_fn, save_fn
        self.push_final_on_train_end, self._owns_session = push_final_on_train_end, session is None
        self.report, self._finished, self._last_checkpoint = None, False, (None, None)
        self._facts, self._tied, self._name, self._log_history = {"backend": "pytorch"}, set(), None, []

    def __repr__(self):  # the token stays out of logs and tracebacks
        return f"PushToHubCallback({self.session!r}, backend='torch')"

    # ---- Trainer hooks ---------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self.session.config.output_dir = self.output_dir or args.output_dir
        self.tokenizer = self.tokenizer or kwargs.get("processing_class") or kwargs.get("tokenizer")
        model = kwargs.get("model")
        if getattr(getattr(model, "device", None), "type", None) == "xla":
            self._facts["backend"] = "torch_xla"
        self._tied, self._name = tied_weight_aliases(model) if model is not None else set(), getattr(model, "name_or_path", None)
        self._model, self._finished = model, False  # the model: its throughput meter's figures go into the card
        self.session.preflight()  # raises out of trainer.train() before the first step
        self.session.begin(state.global_step)

    def on_save(self, args, state, control, **kwargs):
        step = int(state.global_step)
        self._remember(args, state)
        checkpoint = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if not os.path.isdir(checkpoint):
            logger.warning("on_save at step %d: no %s; nothing pushed.", step, checkpoint)
            return
        self._last_checkpoint = (checkpoint, step)
        if (plan := self.session.admit(step)) is not None:
            self._write(checkpoint)
            self.session.save(plan, self.output_dir, checkpoint_folder=checkpoint)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._remember(args, state)
        if self.push_final_on_train_end and model is not None:
            self.finish(model, int(state.global_step))

    def _remember(self, args, state) -> None:
        """The Trainer's progress for the card: steps, epoch, global batch size, the device type, and what its log
        history holds (evaluation results, steady throughput, tokens seen; :func:`facts_from_trainer_state`)."""
        step = int(state.global_step)
        self._facts.update(dict(facts_from_trainer_state(state), **card_facts_of(getattr(self, "_model", None), step)),
                           global_step=step, epoch=state.epoch)
        self._log_history = list(getattr(state, "log_history", None) or [])
        try:  # transformers' own arithmetic: per-device batch x accumulation x processes
            self._facts["global_batch_size"] = int(
                args.train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size))
            self._facts["accelerator"] = {"cuda": "GPU"}.get(args.device.type, args.device.type.upper())
        except Exception:  # a partial args object: the card says n/a for what it lacks
            pass

    def _write(self, checkpoint: Optional[str], model=None) -> None:
        """The model folder (from ``checkpoint``, else from ``model`` in memory) and its card."""
        if checkpoint is None:
            (self.save_fn or save_model_folder)(model, self.output_dir, self.tokenizer)
        else:
            copy_model_files(checkpoint, self.output_dir, self.tokenizer, self._tied)
        write_loss_curve(self._log_history, self.output_dir)
        self.session.write_card(self.output_dir, self.summary_fn, name_or_path=self._name, **self._facts)

    # ---- final push ------------------------------------------------------------------------------
    def finish(self, model, step: int, write: bool = True):
        """Push the final weights and card (always, whatever ``hub_strategy``) and wait for every upload.

        Args: ``model`` the trained model (any device); ``step`` the final global step; ``write``: write the model
            folder and card first (``False`` when the caller already did).

        Returns:
            The :class:`~hf_tpu_ext.hub.push_queue.PushReport` (``None`` on non-chief processes); its
            ``final_pushed`` says whether the final state landed.
        """
        if self._finished or (plan := self.session.admit(int(step), final=True)) is None:
            return self.report
        self._finished, (checkpoint, saved) = True, self._last_checkpoint
        checkpoint = checkpoint if saved == int(step) else None  # the Trainer saved the final state already
        if write:
            self._write(checkpoint, model)
        self.session.save(plan, self.output_dir, checkpoint_folder=checkpoint)
        self.report = self.session.finish() if self._owns_session else self.session.report()
        return self.report

