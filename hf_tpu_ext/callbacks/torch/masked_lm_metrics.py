"""Masked-LM validation metrics in a ``Trainer`` run (torch twin of the Keras ``masked_lm_metrics``)."""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from transformers import TrainerCallback

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.masked_lm_evaluations import MaskedLMEvaluations, check_evaluation_arguments
from hf_tpu_ext.metrics.masked_lm_torch import evaluate_masked_lm


@register_callback("masked_lm_metrics", framework="torch")
class MaskedLMMetricsCallback(MaskedLMEvaluations, TrainerCallback):
    """Evaluate masked-LM loss, perplexity and accuracy on the device (per epoch or every N steps).

    Uses :func:`hf_tpu_ext.metrics.masked_lm_torch.evaluate_masked_lm`: sums stay on the device and
    reach the host once per evaluation; the numbers come from the package's ``masked_lm`` metric module,
    like the TensorFlow callback's. Works with any collator whose batches have ``input_ids`` and ``labels``
    (-100 where nothing is predicted), e.g. ``DataCollatorForLanguageModeling``; padded batches are read with
    their ``attention_mask``.

    Results go through the Trainer's log: each evaluation is its own ``state.log_history`` entry
    (``{"eval_masked_loss", "eval_perplexity", "eval_masked_accuracy", "eval_masked_tokens", "epoch", "step"}``
    with the default prefix), made in ``on_step_end`` -- before the Trainer saves that step, so the checkpoint's
    ``trainer_state.json`` holds it -- and the Trainer's next printed log line carries the figures (the logging
    cadence is left as it is). The keys are not the Trainer's own: its ``Trainer.evaluate`` logs ``eval_loss``
    (the mean of per-batch mean losses over its own eval set and mask draw), and a script's ``compute_metrics``
    may log ``eval_accuracy``; ``eval_masked_loss`` is the mean cross-entropy per masked token over every masked
    token evaluated here (nats), ``eval_perplexity`` its ``exp``, ``eval_masked_accuracy`` the share of masked
    tokens predicted right. ``self.results`` holds the latest, ``self.history`` all of them.

    Args:
        eval_dataset: a map-style dataset of examples the collator accepts.
        data_collator: turns a list of examples into a batch (default: the Trainer's own collator, read from its
            train dataloader, e.g. ``DataCollatorForLanguageModeling``; ``default_data_collator`` outside a
            Trainer).
        batch_size: sequences per evaluation batch (the last partial batch is dropped: static shapes).
        eval_steps: batches per evaluation (None: the whole dataset).
        every_n_steps: evaluate every N global steps instead of at each epoch end.
        prefix: prefix of the keys (``p + "masked_loss"``, ``p + "perplexity"``, ``p + "masked_accuracy"``,
            ``p + "masked_tokens"``).
        max_predictions: positions per sequence fed to the LM head (None: all ``L``; hf-tpu-ext's batches
            hold ``max_predictions_per_seq``).

    Raises:
        ArgumentError: ``eval_dataset`` is None, or a count < 1.
    """

    def __init__(self, eval_dataset, data_collator=None, batch_size: int = 8, eval_steps: Optional[int] = None,
                 every_n_steps: Optional[int] = None, prefix: str = "eval_", max_predictions: Optional[int] = None):
        check_evaluation_arguments("MaskedLMMetricsCallback", eval_dataset, "give validation data.",
                                   batch_size=batch_size, eval_steps=eval_steps, every_n_steps=every_n_steps,
                                   max_predictions=max_predictions)
        self.init_evaluations(eval_dataset, eval_steps, every_n_steps)
        self.data_collator, self.batch_size = data_collator, int(batch_size)
        self.prefix, self.max_predictions = prefix, max_predictions

    @classmethod
    def from_run(cls, run) -> "MaskedLMMetricsCallback":
        """Configure from the torch backend's ``RunContext``: its eval set and collator, ``--eval_strategy steps``
        -> every ``--eval_steps`` global steps (else per epoch)."""
        args = run.training_args
        every = args.eval_steps if getattr(args, "eval_strategy", "epoch") == "steps" else None
        return cls(eval_dataset=run.eval_dataset, data_collator=run.eval_collator,
                   batch_size=args.per_device_eval_batch_size, every_n_steps=every, max_predictions=run.max_predictions)

    def _keys(self) -> Dict[str, str]:
        """The metric module's result names -> this callback's log keys (none of them the Trainer's own)."""
        p = self.prefix
        return {"eval_loss": p + "masked_loss", "perplexity": p + "perplexity",
                "eval_accuracy": p + "masked_accuracy", "eval_tokens": p + "masked_tokens"}

    def evaluate(self, model, state=None, collator=None) -> Dict[str, Any]:
        """Run one evaluation of ``model`` now; returns (and stores) the prefixed results.

        ``collator``: the one to use when the callback was given none (the Trainer's).
        """
        from torch.utils.data import DataLoader
        from transformers import default_data_collator

        loader = DataLoader(self.eval_dataset, batch_size=self.batch_size, shuffle=False, drop_last=True,
                            collate_fn=self.data_collator or collator or default_data_collator)
        # None: every position of each batch (a padding collator's length changes per batch)
        raw = evaluate_masked_lm(model, loader, self.max_predictions, max_batches=self.eval_steps)
        step = state.global_step if state is not None else None
        self.record(raw, self._keys(), step, logging.DEBUG)
        if state is not None:
            self._evaluated_at = step
            state.log_history.append(dict(self.results, epoch=round(state.epoch or 0.0, 4), step=step))
        return self.results

    @staticmethod
    def _trainer_collator(kwargs):
        """The Trainer's data collator: its train dataloader's ``collate_fn`` (None outside a Trainer)."""
        loader = kwargs.get("train_dataloader")
        return getattr(loader, "collate_fn", None)

    def _due(self, args, state) -> bool:
        if self.every_n_steps:
            return state.global_step % self.every_n_steps == 0
        # per epoch: the step that ends one (state.epoch is whole there) or the run's last step; evaluating here
        # rather than in on_epoch_end puts the entry before the Trainer saves this step
        epoch = float(state.epoch or 0.0)
        at_epoch_end = epoch > 0 and abs(epoch - round(epoch)) < 1e-6
        return at_epoch_end or (state.max_steps and state.global_step >= state.max_steps)

    def on_train_begin(self, args, state, control, **kwargs):
        self._evaluated_at = None
        self._pending = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is not None and self._due(args, state) and getattr(self, "_evaluated_at", None) != state.global_step:
            self._pending = self.evaluate(model, state, self._trainer_collator(kwargs))  # printed at the next log

    def on_log(self, args, state, control, logs=None, **kwargs):
        pending = getattr(self, "_pending", None)
        if pending and logs is not None:
            logs.update(pending)  # the printed dict only: log_history has the evaluation as its own entry
            self._pending = None

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        # an epoch that ended between optimizer steps (a partial accumulation) was not seen by on_step_end
        if not self.every_n_steps and model is not None and getattr(self, "_evaluated_at", None) != state.global_step:
            self.evaluate(model, state, self._trainer_collator(kwargs))
