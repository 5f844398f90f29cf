"""Masked-LM validation metrics (loss, perplexity, accuracy) computed on device during training."""

from __future__ import annotations

from typing import Any, Dict, Optional

import tf_keras

from hf_tpu_ext.callbacks import read_global_step, register_callback
from hf_tpu_ext.callbacks.masked_lm_evaluations import MaskedLMEvaluations, check_evaluation_arguments
from hf_tpu_ext.metrics.masked_lm import metric_keys  # noqa: F401  (re-export; framework-free)
from hf_tpu_ext.metrics.masked_lm_tf import evaluate_masked_lm


@register_callback("masked_lm_metrics")
class MaskedLMMetrics(MaskedLMEvaluations, tf_keras.callbacks.Callback):
    """Evaluate masked-LM loss, perplexity and accuracy on device (per epoch or every N steps).

    Uses :func:`hf_tpu_ext.metrics.masked_lm_tf.evaluate_masked_lm`: per-replica sums reduced
    with ``strategy.reduce(SUM)``, so only three scalars per batch reach the host. Works with hf-tpu-ext's
    batches (``masked_lm_positions``...) and transformers' (``labels`` with -100), in ``model.fit`` and in
    hf-tpu-ext's trainer.

    Results go into ``logs`` (so ``History``, ``TensorBoard`` and the progress bar see them), under the
    keys of :func:`metric_keys` (default ``eval_loss``, ``perplexity``, ``eval_accuracy``, ``eval_tokens``):
    at every epoch end when ``every_n_steps`` is None; else into the batch logs of the call that crossed a
    multiple of ``every_n_steps`` global steps, and the latest results into each epoch's logs.
    ``self.results`` holds the latest numbers, ``self.history`` every evaluation with its ``step``.

    Args:
        eval_dataset: a ``tf.data.Dataset`` of global batches, or a distributed dataset; it must be
            finite or ``eval_steps`` must be given. Its masking should be fixed (seeded) for comparable
            numbers across evaluations.
        eval_steps: batches per evaluation (None: the whole dataset).
        every_n_steps: evaluate every N global steps (``model.optimizer.iterations``) instead of per epoch.
        prefix: prefix of the log keys (see :func:`metric_keys`).
        strategy: distribution strategy (default: the model's).
        jit_compile: XLA-compile the per-replica evaluation step (None: the strategy decides).

    Raises:
        ArgumentError: ``eval_dataset`` is None, or ``every_n_steps``/``eval_steps`` < 1.
    """

    def __init__(self, eval_dataset, eval_steps: Optional[int] = None, every_n_steps: Optional[int] = None,
                 prefix: str = "eval_", strategy=None, jit_compile: Optional[bool] = None):
        super().__init__()
        check_evaluation_arguments("MaskedLMMetrics", eval_dataset, "give validation data (or a validation split).",
                                   every_n_steps=every_n_steps, eval_steps=eval_steps)
        self.init_evaluations(eval_dataset, eval_steps, every_n_steps)
        self.prefix = prefix
        self.keys = metric_keys(prefix)
        self.strategy = strategy
        self.jit_compile = jit_compile
        self._last_step: Optional[int] = None
        self._supports_tf_logs = True

    @classmethod
    def from_run(cls, run) -> "MaskedLMMetrics":
        """Configure from the trainer's ``RunContext``: its eval dataset/steps, strategy, and
        ``--eval_strategy steps`` -> every ``--eval_steps`` global steps (else per epoch)."""
        args = run.training_args
        every = getattr(args, "eval_steps", None) if getattr(args, "eval_strategy", "epoch") == "steps" else None
        return cls(
            eval_dataset=run.eval_dataset,
            eval_steps=run.eval_steps,
            every_n_steps=every,
            strategy=run.strategy,
            jit_compile=getattr(args, "jit_compile", None),
        )

    def _global_step(self) -> Optional[int]:
        return read_global_step(self.model)

    def evaluate(self) -> Dict[str, Any]:
        """Run one evaluation now; returns (and stores in ``self.results``) the prefixed results."""
        raw = evaluate_masked_lm(self.model, self.eval_dataset, steps=self.eval_steps, strategy=self.strategy,
                                 jit_compile=self.jit_compile)
        return self.record(raw, self.keys, self._global_step())

    def on_train_begin(self, logs=None):
        self._last_step = self._global_step() if self.every_n_steps else None

    def on_train_batch_end(self, batch, logs=None):
        if not self.every_n_steps:
            return
        step = self._global_step()
        if step is None:
            return
        prev = self._last_step if self._last_step is not None else 0
        self._last_step = step
        if self.crossed(prev, step):
            results = self.evaluate()
            if logs is not None:
                logs.update(results)

    def on_epoch_end(self, epoch, logs=None):
        if self.due_at_epoch_end():
            self.evaluate()
        if logs is not None:
            logs.update(self.results)
