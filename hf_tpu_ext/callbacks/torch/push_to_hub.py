"""``PushToHubCallback`` for ``transformers.Trainer``: a thin adapter of :class:`~hf_tpu_ext.hub.pusher.HubPusher`.

Works with the ``Trainer`` on any PyTorch device (CPU, CUDA, XLA) and transformers 4.57 and 5.x; it imports
no backend and never torch_xla. The pusher owns the push policy, queue, retries, report and cleanup; this
callback decides when (the Trainer's saves: ``on_save``) and what folder, and adds what the Trainer's own
``push_to_hub`` lacks:

- Hub access, write access included, is checked in ``on_train_begin``: a bad or read-only token raises out
  of ``trainer.train()`` before the first step;
- uploads never block training (snapshots uploaded in the background, with retries and ``Retry-After``);
- the final state is always pushed (``on_train_end``, whatever ``hub_strategy``), and
  ``report.final_pushed`` says whether it landed;
- ``hub_strategy="checkpoint"`` pushes the model and the Trainer's ``checkpoint-N/`` (weights, optimizer,
  scheduler, RNG and trainer state, whose ``epoch``/``max_steps`` the Trainer wrote) to ``last-checkpoint/``
  in one commit; :func:`checkpoint_from_hub` brings it back for ``trainer.train(resume_from_checkpoint=...)``;
- a validated fill-mask model card (pipeline tag, metrics, usage) goes with every model push.

The model folder at a save is the Trainer's checkpoint folder without the training state (the Trainer
already wrote the weights, device-correctly), so no second save runs on the device. Uploads come from
the chief only (``state.is_world_process_zero``).
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Callable, List, Optional, Set

from transformers import TrainerCallback

from hf_tpu_ext.args import check_repo_id
from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.errors import ArgumentError, ModelCardError
from hf_tpu_ext.hub.pusher import HUB_STRATEGIES, HubPusher, checkpoint_folder_name, note_step

logger = logging.getLogger("hf_tpu_ext.hub")

# files of a Trainer checkpoint that are training state, not part of the model folder
TRAINER_STATE_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json", "training_args.bin",
                       "rng_state*.pth", "optimizer.bin", "pytorch_model_fsdp*", "global_step*")


def is_trainer_checkpoint(folder: str) -> bool:
    """True when ``folder`` is a ``Trainer`` checkpoint (it holds ``trainer_state.json``)."""
    return os.path.isfile(os.path.join(folder, "trainer_state.json"))


def checkpoint_from_hub(spec: str, local_dir: str, token: Optional[str] = None) -> str:
    """Download the ``last-checkpoint/`` a ``hub_strategy="checkpoint"`` run pushed; return the local folder.

    Example:
        >>> trainer.train(resume_from_checkpoint=checkpoint_from_hub("alice/m", "out/hub-last-checkpoint"))

    Args:
        spec: ``"user/name"`` or ``"user/name@revision"``.
        local_dir: where to download (``local_dir/last-checkpoint/``).
        token: Hub token (default: ``HF_TOKEN`` / cached login).

    Raises:
        HubRepoError: the repo or revision does not exist.
        CheckpointError: it has no ``last-checkpoint/`` holding a Trainer checkpoint.
        HubError: the Hub could not be reached.
    """
    from hf_tpu_ext.hub.preflight import resolve_token
    from hf_tpu_ext.hub.resume import download_last_checkpoint

    return download_last_checkpoint(spec, resolve_token(token), local_dir, is_checkpoint=is_trainer_checkpoint,
                                    kind="Trainer checkpoint (trainer_state.json)")


def tied_weight_aliases(model) -> Set[str]:
    """State-dict names that alias an earlier entry (tied weights: the same parameter object).

    ``RobertaForMaskedLM`` ties ``lm_head.decoder.weight`` to the word embeddings and ``lm_head.decoder.bias``
    to ``lm_head.bias``. A host copy of device tensors (XLA, CUDA) loses that sharing, so ``save_pretrained``
    would write each alias as a second tensor; these names are left out instead (transformers re-ties them on
    load), giving the layout of both backends' exports.
    """
    seen, aliases = set(), set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            aliases.add(name)
        seen.add(id(tensor))
    return aliases


def save_model_folder(model, folder: str, tokenizer=None) -> None:
    """Default model-folder writer: ``save_pretrained`` of a CPU copy of the weights (any device), tokenizer.

    ``.to("cpu")`` moves XLA/CUDA tensors to the host without importing torch_xla; tied weights are written
    once (see :func:`tied_weight_aliases`).
    """
    aliases = tied_weight_aliases(model)
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items() if k not in aliases}
    model.save_pretrained(folder, state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


@register_callback("push_to_hub", backend="torch")
class PushToHubCallback(TrainerCallback):
    """Push checkpoints, the model and its card to the Hub in the background while a ``Trainer`` runs.

    Args:
        output_dir: the folder the model folder is written to and pushed from (default: the Trainer's
            ``args.output_dir``, read at ``on_train_begin``).
        hub_model_id: ``"user/name"`` or ``"name"`` (default: the name of ``output_dir`` under the token's user).
        hub_token: the Hub token (default: ``HF_TOKEN`` or the cached login). Never logged or written.
        hub_strategy: ``"end"``, ``"every_save"``, ``"checkpoint"`` or ``"all_checkpoints"``.
        hub_private_repo: create the repo private.
        hub_revision: branch to push to (created from main when missing).
        tokenizer: saved into the model folder with the weights (default: the Trainer's ``processing_class``).
        push_timeout: seconds the final push waits for the uploads to finish.
        summary_fn: a callable returning the training-summary dict for the card (default: what
            ``output_dir`` holds).
        max_retries, backoff_seconds: retry policy (see :class:`~hf_tpu_ext.hub.pusher.HubPusher`).
        push_final_on_train_end: push the final weights in ``on_train_end`` (``hf-tpu train`` sets False and
            calls :meth:`finish` after it wrote the output folder).
        save_fn: ``save_fn(model, folder, tokenizer)`` writes the final model folder when no checkpoint of the
            final step exists (default: :func:`save_model_folder`).
        pusher: a :class:`~hf_tpu_ext.hub.pusher.HubPusher` owned by the caller (who then finishes it);
            default: the callback makes one and finishes it in :meth:`finish`.
        **card_fields: passed to :func:`hf_tpu_ext.hub.model_card.render_model_card` (``license``,
            ``language``, ``dataset_name``, ...).

    Attributes:
        repo_id: the full repo id after :meth:`preflight`.
        pushed_steps: global steps at which a push was submitted, in order (the final push included; the
            last 100).
        report: the :class:`~hf_tpu_ext.hub.push_queue.PushReport` after the final push.

    Raises:
        ArgumentError: an unknown ``hub_strategy``.
    """

    def __init__(self, output_dir: Optional[str] = None, hub_model_id: Optional[str] = None,
                 hub_token: Optional[str] = None, hub_strategy: str = "every_save",
                 hub_private_repo: Optional[bool] = None, hub_revision: Optional[str] = None, tokenizer=None,
                 push_timeout: float = 600, summary_fn: Optional[Callable[[], dict]] = None, max_retries: int = 5,
                 backoff_seconds: float = 1.0, push_final_on_train_end: bool = True,
                 save_fn: Optional[Callable] = None, pusher: Optional[HubPusher] = None, **card_fields):
        if hub_strategy not in HUB_STRATEGIES:
            raise ArgumentError(f"hub_strategy must be one of {', '.join(HUB_STRATEGIES)}, got {hub_strategy!r}.")
        if hub_model_id is not None:
            check_repo_id(hub_model_id, "hub_model_id")  # at construction, not at the first push
        self.output_dir = os.fspath(output_dir) if output_dir else None
        self.hub_model_id, self.hub_strategy = hub_model_id, hub_strategy
        self.hub_private_repo, self.hub_revision = hub_private_repo, hub_revision
        self.tokenizer, self.push_timeout, self.summary_fn = tokenizer, push_timeout, summary_fn
        self.max_retries, self.backoff_seconds = max_retries, backoff_seconds
        self.push_final_on_train_end = push_final_on_train_end
        self.save_fn = save_fn
        self.card_fields = card_fields
        self._hub_token = hub_token
        self.pusher: Optional[HubPusher] = pusher
        self._owns_pusher = pusher is None
        self.repo_id: Optional[str] = pusher.repo_id if pusher is not None else None
        self.report = None
        self.pushed_steps: List[int] = []
        self._preflight_done = False
        self._is_chief = True
        self._finished = False
        self._last_checkpoint: Optional[str] = None
        self._last_checkpoint_step: Optional[int] = None
        self._backend = "pytorch"  # the card's backend when no summary says: "torch_xla" on an XLA device
        self._tied_aliases: Set[str] = set()  # weight names the model folder leaves out (tied weights)

    def __repr__(self):  # the token stays out of logs and tracebacks
        return (f"PushToHubCallback(output_dir={self.output_dir!r}, hub_model_id={self.hub_model_id!r}, "
                f"hub_strategy={self.hub_strategy!r}, backend='torch')")

    @classmethod
    def from_run(cls, run):
        """Build from the training run's context (``--callbacks push_to_hub``); uses ``run.hub_pusher`` if set."""
        args = run.training_args
        return cls(output_dir=args.output_dir, hub_model_id=args.hub_model_id, hub_token=args.hub_token,
                   hub_strategy=args.hub_strategy, hub_private_repo=args.hub_private_repo,
                   hub_revision=args.hub_revision, tokenizer=run.tokenizer,
                   save_fn=getattr(run, "save_model_folder", None), pusher=getattr(run, "hub_pusher", None),
                   license=args.license, language=args.language, dataset_name=run.data_args.dataset_name)

    # ---- Hub access ------------------------------------------------------------------------------
    def preflight(self) -> Optional[str]:
        """Check the token, write access and namespace, create the repo/branch, validate the card fields.

        Idempotent; only the chief talks to the Hub.

        Returns:
            The full repo id (chief), else ``None``.

        Raises:
            HubAuthError, HubRepoError, HubError: see :meth:`hf_tpu_ext.hub.pusher.HubPusher.preflight`.
            ModelCardError: the card fields (license, language, dataset) do not validate.
        """
        if self._preflight_done:
            return self.repo_id
        if not self._is_chief:
            self._preflight_done = True
            return None
        if self.output_dir is None:
            raise ArgumentError("PushToHubCallback needs output_dir (or a Trainer, whose args.output_dir is used).")
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

    # ---- Trainer hooks ---------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if self.output_dir is None:
            self.output_dir = args.output_dir
        self._is_chief = bool(state.is_world_process_zero)
        if self.tokenizer is None:
            self.tokenizer = kwargs.get("processing_class") or kwargs.get("tokenizer")
        model = kwargs.get("model")
        device = getattr(getattr(model, "device", None), "type", None)
        self._backend = "torch_xla" if device == "xla" else "pytorch"
        if model is not None:
            self._tied_aliases = tied_weight_aliases(model)
        self._finished = False
        self.preflight()  # raises out of trainer.train() before the first step

    def on_save(self, args, state, control, model=None, **kwargs):
        if not self._is_chief:
            return
        step = int(state.global_step)
        self._remember(args, state)
        checkpoint = os.path.join(args.output_dir, checkpoint_folder_name(step))
        if not os.path.isdir(checkpoint):
            logger.warning("on_save at step %d: no %s; nothing pushed.", step, checkpoint)
            return
        self._last_checkpoint, self._last_checkpoint_step = checkpoint, step
        self._model_folder_from_checkpoint(checkpoint)
        self._write_card()
        if self.pusher is None or self.hub_strategy == "end":
            return
        self.pusher.push_save(self.output_dir, step=step, checkpoint_folder=checkpoint)
        note_step(self.pushed_steps, step)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._remember(args, state)
        if self.push_final_on_train_end and model is not None:
            self.finish(model, int(state.global_step))

    def _remember(self, args, state) -> None:
        """The Trainer's progress for the card: steps, epoch, global batch size and the device type."""
        self._progress = {"global_step": int(state.global_step), "epoch": state.epoch}
        try:  # transformers' own arithmetic: per-device batch x accumulation x processes
            self._progress["global_batch_size"] = int(
                args.train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size))
            self._progress["accelerator"] = {"cuda": "GPU"}.get(args.device.type, args.device.type.upper())
        except Exception:  # a partial args object: the card says n/a for what it lacks
            pass

    # ---- final push ------------------------------------------------------------------------------
    def finish(self, model, step: int, write: bool = True):
        """Push the final weights and card (always, whatever ``hub_strategy``) and wait for every upload.

        Args:
            model: the trained model (any device).
            step: the final global step.
            write: write the model folder and card first (``False`` when the caller already did).

        Returns:
            The :class:`~hf_tpu_ext.hub.push_queue.PushReport` (``None`` on non-chief processes); its
            ``final_pushed`` says whether the final state landed.
        """
        if self._finished or not self._is_chief:
            return self.report
        self._finished = True
        step = int(step)
        final_checkpoint = self._last_checkpoint if self._last_checkpoint_step == step else None
        if write:
            if final_checkpoint is not None:  # the Trainer saved the final state already
                self._model_folder_from_checkpoint(final_checkpoint)
            else:
                (self.save_fn or save_model_folder)(model, self.output_dir, self.tokenizer)
            self._write_card()
        if self.pusher is None:
            return None
        self.pusher.push_save(self.output_dir, step=step, checkpoint_folder=final_checkpoint, final=True)
        note_step(self.pushed_steps, step)
        if self._owns_pusher:
            self.report = self.pusher.finish(self.push_timeout)
        else:
            self.report = self.pusher.report()
        return self.report

    # ---- the model folder ------------------------------------------------------------------------
    def _model_folder_from_checkpoint(self, checkpoint: str) -> None:
        """Copy the model files of a Trainer checkpoint (not its training state) into ``output_dir``."""
        import fnmatch

        os.makedirs(self.output_dir, exist_ok=True)
        for name in sorted(os.listdir(checkpoint)):
            src = os.path.join(checkpoint, name)
            if os.path.isfile(src) and not any(fnmatch.fnmatch(name, p) for p in TRAINER_STATE_FILES):
                tmp = os.path.join(self.output_dir, f".{name}.tmp")
                if name != "model.safetensors" or not self._copy_weights_untied(src, tmp):
                    shutil.copy2(src, tmp)
                os.replace(tmp, os.path.join(self.output_dir, name))  # a reader never sees half a file
        if self.tokenizer is not None and not os.path.isfile(os.path.join(checkpoint, "tokenizer_config.json")):
            self.tokenizer.save_pretrained(self.output_dir)

    def _copy_weights_untied(self, src: str, dst: str) -> bool:
        """Write ``src`` (a checkpoint's ``model.safetensors``) to ``dst`` without the tied-weight aliases.

        The Trainer saves an XLA model through a host copy, which writes each tied weight twice. Returns
        False (nothing written) when the file holds no alias, so a plain copy does.
        """
        if not self._tied_aliases:
            return False
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(src, framework="pt") as f:
            names = list(f.keys())
            if not self._tied_aliases.intersection(names):
                return False
            metadata = f.metadata() or {"format": "pt"}
            state = {k: f.get_tensor(k) for k in names if k not in self._tied_aliases}
        save_file(state, dst, metadata=metadata)
        return True

    def _write_card(self) -> None:
        """A fill-mask card checked locally here (the Hub checks it in the push job)."""
        from hf_tpu_ext.hub.model_card import load_summary, render_model_card, validate_model_card

        summary = None
        if self.summary_fn is not None:
            try:
                summary = self.summary_fn()
            except Exception as err:  # a summary problem must not stop training
                logger.warning("summary_fn failed (%s: %s); the card uses what the output folder shows.",
                               type(err).__name__, err)
        if summary is None:
            summary = load_summary(self.output_dir)
            summary.setdefault("backend", self._backend)
            for key, value in (getattr(self, "_progress", None) or {}).items():
                if summary.get(key) is None and value is not None:
                    summary[key] = value
        try:
            card = render_model_card(self.output_dir, repo_id=self.repo_id, summary=summary, **self.card_fields)
            validate_model_card(card, remote=False)
            card.save(os.path.join(self.output_dir, "README.md"))
        except ModelCardError as err:
            logger.error("Model card not updated: %s", err)
