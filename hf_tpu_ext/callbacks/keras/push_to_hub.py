"""Push a Keras 3 model (a keras-hub preset, or a ``.keras`` file) to the Hub in the background while training.

The Hub side -- preflight, ``hub_strategy``, the background queue with retries, the card check, the final
report -- is :class:`hf_tpu_ext.hub.pusher.HubPusher`; this callback writes the folders and calls it.

What a save writes into ``output_dir`` (the model folder, pushed by ``hub_strategy``):

- a keras-hub task model (``keras_hub.models.Task``: ``RobertaMaskedLM``...): its preset
  (``model.save_to_preset``: ``config.json``, ``task.json``, ``model.weights.h5``, ``metadata.json``,
  ``tokenizer.json``/``preprocessor.json``, ``assets/``), which
  ``keras_hub.models.<Task>.from_preset("hf://<repo_id>")`` loads;
- any other Keras 3 model: ``model.keras`` (``model.save``; ``keras.saving.load_model`` loads it);
- ``README.md``: a card whose metadata makes the Hub show a keras-hub model (``library_name: keras-hub``,
  ``pipeline_tag: fill-mask``, tags) or a Keras one (``library_name: keras``).

A resumable checkpoint (``hub_strategy="checkpoint"``: the Hub's ``last-checkpoint/``;
``"all_checkpoints"``: ``checkpoint-<step>/``) is ``checkpoint.weights.h5`` (``model.save_weights``: the
model's and the optimizer's variables) and ``trainer_state.json`` (``global_step``, ``epoch``);
:meth:`PushToHubCallback.restore_from_hub` restores both into a compiled model.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any, Dict, List, Optional

import keras

from hf_tpu_ext.args import check_repo_id
from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.keras import process_index
from hf_tpu_ext.errors import ArgumentError, CheckpointError

logger = logging.getLogger("hf_tpu_ext")

SAVE_STRATEGIES = ("epoch", "steps", "no")
CHECKPOINT_WEIGHTS = "checkpoint.weights.h5"
TRAINER_STATE = "trainer_state.json"
KERAS_FILE = "model.keras"


def is_keras_hub_task(model) -> bool:
    """True for a keras-hub task model (it has ``save_to_preset`` and a ``backbone``)."""
    return callable(getattr(model, "save_to_preset", None)) and getattr(model, "backbone", None) is not None


def _task_tags(model) -> List[str]:
    tags = ["keras-hub", "keras"]
    backbone = getattr(model, "backbone", None)
    if backbone is not None:
        tags.append(type(backbone).__name__.replace("Backbone", "").lower())
    return tags


def render_card(model, repo_id: str, *, step: int, epoch: float, logs: Optional[Dict[str, Any]] = None,
                final: bool = False, **card_fields) -> str:
    """The model card text (``huggingface_hub.ModelCard``) for a save of ``model`` at ``step``.

    Args:
        model: the Keras 3 model.
        repo_id: the Hub repo (named in the loading example).
        step, epoch: where training is (global optimizer steps; epochs completed, float).
        logs: the latest Keras logs (loss, eval metrics, throughput), shown as a table.
        final: the end-of-training card.
        **card_fields: ``license``, ``language``, ``datasets``, ``base_model``, ``tags`` (added to the
            defaults), ``pipeline_tag`` (default ``fill-mask`` for a keras-hub masked LM).

    Returns:
        Markdown with YAML metadata: ``library_name`` (``keras-hub`` for a keras-hub task, else ``keras``),
        ``pipeline_tag``, ``tags``.
    """
    from huggingface_hub import ModelCard, ModelCardData

    keras_hub = is_keras_hub_task(model)
    name = type(model).__name__
    tags = (_task_tags(model) if keras_hub else ["keras"]) + list(card_fields.pop("tags", None) or [])
    pipeline_tag = card_fields.pop("pipeline_tag", "fill-mask" if "MaskedLM" in name or not keras_hub else None)
    data = ModelCardData(library_name="keras-hub" if keras_hub else "keras", pipeline_tag=pipeline_tag,
                         tags=list(dict.fromkeys(tags)), **{k: v for k, v in card_fields.items() if v is not None})
    if keras_hub:
        load = (f"```python\nimport keras_hub\n\nmodel = keras_hub.models.{name}.from_preset(\"hf://{repo_id}\")\n```")
    else:
        load = (f"```python\nimport keras\nfrom huggingface_hub import hf_hub_download\n\n"
                f"model = keras.saving.load_model(hf_hub_download(\"{repo_id}\", \"{KERAS_FILE}\"))\n```")
    rows = "\n".join(f"| {k} | {v:.6g} |" for k, v in sorted((logs or {}).items())
                     if isinstance(v, (int, float)) and not isinstance(v, bool))
    status = "End of training" if final else "Training in progress"
    content = (
        f"---\n{data.to_yaml()}\n---\n\n# {repo_id.split('/')[-1]}\n\n"
        f"A `{name}` trained with Keras {keras.__version__} on the {keras.backend.backend()} backend "
        f"({status.lower()}: step {step}, epoch {epoch:g}).\n\n## How to load\n\n{load}\n"
        + (f"\n## Latest training logs\n\n| metric | value |\n|---|---|\n{rows}\n" if rows else "")
    )
    return str(ModelCard(content))


@register_callback("push_to_hub", framework="keras")
class PushToHubCallback(keras.callbacks.Callback):
    """Push checkpoints, the model and its card to the Hub in the background while a Keras 3 ``fit`` runs.

    Chief-only: on every process but index 0 (:func:`hf_tpu_ext.callbacks.keras.process_index`:
    ``jax.process_index()`` under ``keras.distribution``, the ``TF_CONFIG`` task on TensorFlow) it does
    nothing. On the chief: :meth:`preflight` at train begin (token, repo, write access: a bad token fails
    before the first step), a save at each epoch end or every ``save_steps`` steps (the folder is written on
    the training thread; the upload runs in the background and never blocks the next save), and the final
    state at train end, always pushed whatever ``hub_strategy`` (``on_train_end`` waits up to
    ``push_timeout`` seconds for the uploads and logs what landed; ``self.report``).

    Args:
        output_dir: local folder the model folder is written to (and ``checkpoints/`` under it).
        hub_model_id: ``"user/name"`` or ``"name"`` (default: the name of ``output_dir`` under the token's user).
        hub_token: the Hub token (default: ``HF_TOKEN`` or the cached login). Never logged or written.
        hub_strategy: ``"end"``, ``"every_save"``, ``"checkpoint"`` or ``"all_checkpoints"``
            (:class:`~hf_tpu_ext.hub.pusher.HubPusher`).
        save_strategy: ``"epoch"``, ``"steps"`` (every ``save_steps`` global steps) or ``"no"`` (final only).
        save_steps: interval in global optimizer steps for ``save_strategy="steps"``.
        hub_private_repo: create the repo private.
        hub_revision: branch to push to.
        push_timeout: seconds ``on_train_end`` waits for the uploads.
        max_retries, backoff_seconds: the pusher's retry policy.
        **card_fields: see :func:`render_card` (``license``, ``language``, ``datasets``, ``tags``...).

    Attributes:
        repo_id: the full repo id after :meth:`preflight`.
        pushed_steps: global steps of the saves handed to the pusher (the final one included).
        report: the pusher's :class:`~hf_tpu_ext.hub.push_queue.PushReport` after training.

    Raises:
        ArgumentError: an unknown strategy, or ``save_strategy="steps"`` without ``save_steps >= 1``.
    """

    def __init__(self, output_dir: str, hub_model_id: Optional[str] = None, hub_token: Optional[str] = None,
                 hub_strategy: str = "every_save", save_strategy: str = "epoch", save_steps: Optional[int] = None,
                 hub_private_repo: Optional[bool] = None, hub_revision: Optional[str] = None,
                 push_timeout: float = 600, max_retries: int = 5, backoff_seconds: float = 1.0, **card_fields):
        super().__init__()
        from hf_tpu_ext.hub.pusher import HUB_STRATEGIES, HubPusher

        if hub_strategy not in HUB_STRATEGIES:
            raise ArgumentError(f"hub_strategy must be one of {', '.join(HUB_STRATEGIES)}, got {hub_strategy!r}.")
        if save_strategy not in SAVE_STRATEGIES:
            raise ArgumentError(f"save_strategy must be one of {', '.join(SAVE_STRATEGIES)}, got {save_strategy!r}.")
        if save_strategy == "steps" and (save_steps is None or int(save_steps) < 1):
            raise ArgumentError("save_strategy='steps' needs save_steps >= 1 (global optimizer steps between pushes).")
        if hub_model_id is not None:
            check_repo_id(hub_model_id, "hub_model_id")  # on every process, at construction
        self.output_dir = os.fspath(output_dir)
        self.hub_strategy, self.save_strategy = hub_strategy, save_strategy
        self.save_steps = int(save_steps) if save_steps else None
        self.push_timeout = push_timeout
        self.card_fields = card_fields
        self.is_chief = process_index() == 0
        self.pusher = HubPusher(hub_model_id, token=hub_token, hub_strategy=hub_strategy, private=hub_private_repo,
                                revision=hub_revision, output_dir=self.output_dir, max_retries=max_retries,
                                backoff_seconds=backoff_seconds, push_timeout=push_timeout) if self.is_chief else None
        self.repo_id: Optional[str] = None
        self.pushed_steps: List[int] = []
        self.report = None
        self._logs: Dict[str, Any] = {}
        self._step0 = 0
        self._steps = 0
        self._epoch = 0
        self._last_save: Optional[int] = None
        self._last_checkpoint: Optional[str] = None

    def __repr__(self):  # the token stays out of logs and tracebacks
        return (f"PushToHubCallback(output_dir={self.output_dir!r}, repo_id={self.repo_id!r}, "
                f"hub_strategy={self.hub_strategy!r}, save_strategy={self.save_strategy!r})")

    def preflight(self) -> Optional[str]:
        """Token, repo and write access, before training (chief only; idempotent). Returns the repo id.

        Raises:
            HubAuthError, HubRepoError, HubError: see :meth:`HubPusher.preflight`.
        """
        if self.pusher is not None:
            self.repo_id = self.pusher.preflight()
        return self.repo_id

    # ------------------------------------------------------------------ saving
    def _global_step(self) -> int:
        return self._step0 + self._steps

    def save(self, final: bool = False) -> Optional[int]:
        """Write the model folder (and a checkpoint where ``hub_strategy`` pushes one) and queue the push.

        Returns:
            The global step saved, or None on a non-chief process.
        """
        if self.pusher is None:
            return None
        step = self._global_step()
        if final and step == self._last_save:  # the folder holds this state already: new card, final push
            with open(os.path.join(self.output_dir, "README.md"), "w", encoding="utf-8") as f:
                f.write(render_card(self._model, self.repo_id or self.pusher.repo_id, step=step, epoch=self._epoch,
                                    logs=self._logs, final=True, **self.card_fields))
            self.pusher.push_save(self.output_dir, step=step, checkpoint_folder=self._last_checkpoint, final=True)
            self.pushed_steps.append(step)
            return step
        model = self.model  # on JAX the property syncs the training state into the variables
        os.makedirs(self.output_dir, exist_ok=True)
        if is_keras_hub_task(model):
            model.save_to_preset(self.output_dir)
        else:
            model.save(os.path.join(self.output_dir, KERAS_FILE))
        with open(os.path.join(self.output_dir, "README.md"), "w", encoding="utf-8") as f:
            f.write(render_card(model, self.repo_id or self.pusher.repo_id, step=step, epoch=self._epoch,
                                logs=self._logs, final=final, **self.card_fields))
        checkpoint = None
        if self.hub_strategy in ("checkpoint", "all_checkpoints"):
            checkpoint = self._write_checkpoint(model, step)
        self.pusher.push_save(self.output_dir, step=step, checkpoint_folder=checkpoint, final=final)
        if self._last_checkpoint and self._last_checkpoint != checkpoint:  # keep only the newest locally
            shutil.rmtree(self._last_checkpoint, ignore_errors=True)
        self._last_checkpoint = checkpoint
        self.pushed_steps.append(step)
        self._last_save = step
        return step

    def _write_checkpoint(self, model, step: int) -> str:
        folder = os.path.join(self.output_dir, "checkpoints", f"checkpoint-{step}")
        os.makedirs(folder, exist_ok=True)
        model.save_weights(os.path.join(folder, CHECKPOINT_WEIGHTS))  # model + optimizer variables
        with open(os.path.join(folder, TRAINER_STATE), "w", encoding="utf-8") as f:
            json.dump({"global_step": step, "epoch": self._epoch}, f)
        return folder

    # ------------------------------------------------------------------ resume
    @classmethod
    def restore_from_hub(cls, model, hub_model_id: str, token: Optional[str] = None,
                         local_dir: Optional[str] = None) -> Dict[str, Any]:
        """Restore the model's and optimizer's variables from the repo's ``last-checkpoint/``.

        Call after ``model.compile(...)`` and before ``fit``; pass ``initial_epoch=state["epoch"]`` to ``fit``
        so the epoch count continues.

        Args:
            model: a compiled Keras 3 model of the same architecture.
            hub_model_id: ``"user/name"`` or ``"user/name@revision"``.
            token: Hub token (private repos; default ``HF_TOKEN`` or the cached login).
            local_dir: download folder (default: a temp folder, removed afterwards).

        Returns:
            ``trainer_state.json``: ``{"global_step": int, "epoch": int}``.

        Raises:
            CheckpointError: the repo has no ``last-checkpoint/`` with a Keras 3 checkpoint.
            HubRepoError, HubError: the repo cannot be read.
        """
        import tempfile

        from hf_tpu_ext.hub.resume import download_last_checkpoint

        def is_checkpoint(folder: str) -> bool:
            return os.path.isfile(os.path.join(folder, CHECKPOINT_WEIGHTS))

        with tempfile.TemporaryDirectory(prefix="hf-tpu-resume-") as tmp:
            folder = download_last_checkpoint(hub_model_id, token, local_dir or tmp, is_checkpoint=is_checkpoint,
                                              kind=f"Keras 3 checkpoint ({CHECKPOINT_WEIGHTS})")
            if getattr(model, "optimizer", None) is None:
                raise CheckpointError("restore_from_hub needs a compiled model (its optimizer receives the state).")
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            model.load_weights(os.path.join(folder, CHECKPOINT_WEIGHTS))
            with open(os.path.join(folder, TRAINER_STATE), encoding="utf-8") as f:
                state = json.load(f)
        logger.info("Resumed from %s at global step %s (epoch %s).", hub_model_id, state.get("global_step"),
                    state.get("epoch"))
        return state

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, logs=None):
        if self.pusher is None:
            return
        self.preflight()
        iterations = getattr(getattr(self._model, "optimizer", None), "iterations", None)
        self._step0 = int(keras.ops.convert_to_numpy(getattr(iterations, "value", iterations))) if iterations is not None else 0
        self._steps = 0

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_begin = batch

    def on_train_batch_end(self, batch, logs=None):
        self._steps += int(batch) - int(getattr(self, "_batch_begin", batch)) + 1
        if self.pusher is None or self.save_strategy != "steps":
            return
        step = self._global_step()
        previous = self._last_save if self._last_save is not None else self._step0
        if step // self.save_steps > previous // self.save_steps:  # steps_per_execution may jump over it
            self._logs = dict(logs or {})
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        self._epoch = epoch + 1
        self._logs = dict(logs or {})
        if self.pusher is not None and self.save_strategy == "epoch":
            self.save()

    def on_train_end(self, logs=None):
        if self.pusher is None:
            return
        if logs:
            self._logs.update(logs)
        try:
            self.save(final=True)
        finally:
            self.report = self.pusher.finish(timeout=self.push_timeout)
