"""``PushToHubCallback`` for ``transformers.Trainer``: the Hub behaviour of the Keras callback, on torch.

Like :class:`hf_tpu_ext.callbacks.push_to_hub.PushToHubCallback` it does no network work in ``__init__``,
checks Hub access before the first step (:meth:`PushToHubCallback.preflight` in ``on_train_begin``: a bad
token or namespace raises out of ``trainer.train()`` before any step), never blocks training (uploads run
in a :class:`~hf_tpu_ext.hub.push_queue.PushQueue` with retries, from snapshots), uploads from the chief
only (``state.is_world_process_zero``), counts steps globally (``state.global_step``) and always pushes the
final weights.

Save points are the Trainer's saves (``on_save``, i.e. ``save_strategy``/``save_steps`` of its arguments).
``hub_strategy`` follows :class:`transformers.TrainingArguments`:

- ``"end"``: push the final model and card when training ends only;
- ``"every_save"``: push the model folder (weights, config, tokenizer, card, logs) at every save;
- ``"checkpoint"``: also push the newest Trainer checkpoint (``checkpoint-N/``: weights, optimizer,
  scheduler, RNG and trainer state) to ``last-checkpoint/``, from where
  ``hf-tpu train --backend torch_xla --resume_from_checkpoint user/name`` resumes;
- ``"all_checkpoints"``: also push every checkpoint to ``checkpoint-<step>/``.

The model-folder pushes never hold optimizer state.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, List, Optional

from transformers import TrainerCallback

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.errors import ArgumentError, ModelCardError
from hf_tpu_ext.hub.push_queue import submit_model_folder

logger = logging.getLogger("hf_tpu_ext.hub")

HUB_STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")
# never in a model-folder push: optimizer state and local checkpoint folders (same list as the Keras callback)
MODEL_IGNORE_PATTERNS = ["checkpoints/*", "last-checkpoint/*", "checkpoint-*", "hub-last-checkpoint/*", "*.index",
                         "*.data-*", "*.tmp", ".*", "training_args.bin"]


@register_callback("push_to_hub", backend="torch")
class PushToHubCallback(TrainerCallback):
    """Push checkpoints, the model and its card to the Hub in the background while a ``Trainer`` runs.

    Args:
        output_dir: the folder the model folder is written to and pushed from (default: the Trainer's
            ``args.output_dir``, read at ``on_train_begin``).
        hub_model_id: ``"user/name"`` or ``"name"`` (default: the name of ``output_dir`` under the token's user).
        hub_token: the Hub token (default: ``HF_TOKEN`` or the cached login). Never logged or written.
        hub_strategy: ``"end"``, ``"every_save"``, ``"checkpoint"`` or ``"all_checkpoints"`` (see module doc).
        hub_private_repo: create the repo private.
        hub_revision: branch to push to (created from main when missing).
        tokenizer: saved into the model folder with the weights (default: the Trainer's ``processing_class``).
        push_timeout: seconds the final push waits for the uploads to finish.
        summary_fn: a callable returning the training-summary dict for the card (default: what
            ``output_dir`` holds).
        max_retries, backoff_seconds: retry policy of the upload queue (see ``PushQueue``).
        push_final_on_train_end: push the final weights in ``on_train_end`` (``hf-tpu train`` sets False and
            calls :meth:`finish` after it wrote the output folder).
        **card_fields: passed to :func:`hf_tpu_ext.hub.model_card.render_model_card` (``license``,
            ``language``, ``dataset_name``, ...).

    Attributes:
        repo_id: the full repo id after :meth:`preflight`.
        pushed_steps: global steps at which a push was submitted, in order (the final push included).
        report: the :class:`~hf_tpu_ext.hub.push_queue.PushReport` after the final push.

    Raises:
        ArgumentError: an unknown ``hub_strategy``.
    """

    def __init__(self, output_dir: Optional[str] = None, hub_model_id: Optional[str] = None,
                 hub_token: Optional[str] = None, hub_strategy: str = "every_save",
                 hub_private_repo: Optional[bool] = None, hub_revision: Optional[str] = None, tokenizer=None,
                 push_timeout: float = 600, summary_fn: Optional[Callable[[], dict]] = None, max_retries: int = 5,
                 backoff_seconds: float = 1.0, push_final_on_train_end: bool = True, **card_fields):
        if hub_strategy not in HUB_STRATEGIES:
            raise ArgumentError(f"hub_strategy must be one of {', '.join(HUB_STRATEGIES)}, got {hub_strategy!r}.")
        self.output_dir = os.fspath(output_dir) if output_dir else None
        self.hub_model_id, self.hub_strategy = hub_model_id, hub_strategy
        self.hub_private_repo, self.hub_revision = hub_private_repo, hub_revision
        self.tokenizer, self.push_timeout, self.summary_fn = tokenizer, push_timeout, summary_fn
        self.max_retries, self.backoff_seconds = max_retries, backoff_seconds
        self.push_final_on_train_end = push_final_on_train_end
        self.card_fields = card_fields
        self._hub_token = hub_token
        self.repo_id: Optional[str] = None
        self.queue = None
        self.report = None
        self.pushed_steps: List[int] = []
        self._preflight_done = False
        self._is_chief = True
        self._finished = False

    def __repr__(self):  # the token stays out of logs and tracebacks
        return (f"PushToHubCallback(output_dir={self.output_dir!r}, hub_model_id={self.hub_model_id!r}, "
                f"hub_strategy={self.hub_strategy!r}, backend='torch')")

    @classmethod
    def from_run(cls, run):
        """Build from the torch backend's ``RunContext`` (``--callbacks push_to_hub``)."""
        args = run.training_args
        return cls(output_dir=args.output_dir, hub_model_id=args.hub_model_id, hub_token=args.hub_token,
                   hub_strategy=args.hub_strategy, hub_private_repo=args.hub_private_repo,
                   hub_revision=args.hub_revision, tokenizer=run.tokenizer, license=args.license,
                   language=args.language, dataset_name=run.data_args.dataset_name)

    # ---- Hub access ------------------------------------------------------------------------------
    def preflight(self) -> Optional[str]:
        """Check the token and namespace, create the repo/branch, validate the card fields; idempotent.

        Returns:
            The full repo id (chief), else ``None``.

        Raises:
            HubAuthError, HubRepoError, HubError: see :func:`hf_tpu_ext.hub.preflight.preflight`.
            ModelCardError: the card fields (license, language, dataset) do not validate.
        """
        if self._preflight_done:
            return self.repo_id
        if not self._is_chief:
            self._preflight_done = True
            return None
        from hf_tpu_ext.hub.push_queue import open_push_queue

        if self.output_dir is None:
            raise ArgumentError("PushToHubCallback needs output_dir (or a Trainer, whose args.output_dir is used).")
        self.repo_id, self._hub_token, self.queue = open_push_queue(
            self.output_dir, self.hub_model_id, self._hub_token, private=self.hub_private_repo,
            revision=self.hub_revision, max_retries=self.max_retries, backoff_seconds=self.backoff_seconds,
            card_summary={"mask_token": "<mask>", "backend": "torch_xla"}, card_fields=self.card_fields)
        self._preflight_done = True
        return self.repo_id

    # ---- Trainer hooks ---------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if self.output_dir is None:
            self.output_dir = args.output_dir
        self._is_chief = bool(state.is_world_process_zero)
        if self.tokenizer is None:
            self.tokenizer = kwargs.get("processing_class") or kwargs.get("tokenizer")
        self._finished = False
        self.preflight()  # raises out of trainer.train() before the first step

    def on_save(self, args, state, control, model=None, **kwargs):
        if not self._is_chief or model is None:
            return
        step = int(state.global_step)
        self._write_model_folder(model)
        if self.queue is None or self.hub_strategy == "end":
            return
        submit_model_folder(self.queue, self.output_dir, f"Training in progress, step {step}", self._hub_token,
                            MODEL_IGNORE_PATTERNS)
        checkpoint = os.path.join(args.output_dir, f"checkpoint-{step}")
        if self.hub_strategy == "checkpoint" and os.path.isdir(checkpoint):
            # delete_patterns "*": files of older checkpoints not re-uploaded (rng states of other ranks) go
            self.queue.submit(checkpoint, path_in_repo="last-checkpoint", commit_message=f"Checkpoint at step {step}",
                              delete_patterns=["*"], key="last-checkpoint")
        elif self.hub_strategy == "all_checkpoints" and os.path.isdir(checkpoint):
            self.queue.submit(checkpoint, path_in_repo=f"checkpoint-{step}", commit_message=f"Checkpoint at step {step}",
                              key=f"checkpoint-{step}")
        self.pushed_steps.append(step)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.push_final_on_train_end and model is not None:
            self.finish(model, int(state.global_step))

    # ---- final push ------------------------------------------------------------------------------
    def finish(self, model, step: int, write: bool = True):
        """Push the final weights and card (always, whatever ``hub_strategy``) and wait for every upload.

        Args:
            model: the trained model (any device).
            step: the final global step.
            write: write the model folder and card first (``False`` when the caller already did).

        Returns:
            The :class:`~hf_tpu_ext.hub.push_queue.PushReport` (``None`` on non-chief processes).
        """
        if self._finished or not self._is_chief:
            return self.report
        self._finished = True
        if write:
            self._write_model_folder(model)
        if self.queue is None:
            return None
        submit_model_folder(self.queue, self.output_dir, "End of training", self._hub_token, MODEL_IGNORE_PATTERNS)
        self.pushed_steps.append(int(step))
        from hf_tpu_ext.hub.push_queue import finish_pushes

        self.report = finish_pushes(self.queue, self.repo_id, self.output_dir, step, self.push_timeout)
        return self.report

    def _write_model_folder(self, model) -> None:
        from hf_tpu_ext.backends.torch_xla.model import save_model_folder
        from hf_tpu_ext.hub.model_card import render_model_card, validate_model_card

        save_model_folder(model, self.output_dir, self.tokenizer)
        summary = None
        if self.summary_fn is not None:
            try:
                summary = self.summary_fn()
            except Exception as err:  # a summary problem must not stop training
                logger.warning("summary_fn failed (%s: %s); the card uses what the output folder shows.",
                               type(err).__name__, err)
        if summary is None:
            from hf_tpu_ext.hub.model_card import load_summary

            summary = load_summary(self.output_dir)
            summary.setdefault("backend", "torch_xla")
        try:
            card = render_model_card(self.output_dir, repo_id=self.repo_id, summary=summary, **self.card_fields)
            validate_model_card(card, remote=False)  # the Hub checks it in the push job (submit_model_folder)
            card.save(os.path.join(self.output_dir, "README.md"))
        except ModelCardError as err:
            logger.error("Model card not updated: %s", err)
