"""Masked-LM validation metrics (loss, perplexity, accuracy) for a Keras 3 ``model.fit``, computed on device."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import keras
import numpy as np

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.keras import backend_name
from hf_tpu_ext.callbacks.masked_lm_evaluations import MaskedLMEvaluations, check_evaluation_arguments
from hf_tpu_ext.errors import ArgumentError
from hf_tpu_ext.extras import require_extra
from hf_tpu_ext.metrics.masked_lm import load_masked_lm_metric, metric_keys


def batch_sums(logits, labels, weights):
    """``(loss_sum, num_correct, num_tokens)`` of one batch with ``keras.ops`` (any backend, on device).

    Args:
        logits: float ``[B, P, V]``, the model's scores at the ``P`` predicted positions (keras-hub masked
            LMs: at ``mask_positions``).
        labels: int ``[B, P]`` original token ids at those positions.
        weights: ``[B, P]``, 1 for a real prediction, 0 for padding (keras-hub: ``mask_weights``).

    Returns:
        Three scalars: summed cross-entropy in nats (float32), right argmax predictions and predictions
        (float32 counts) over the positions with weight > 0.
    """
    ops = keras.ops
    logits = ops.cast(logits, "float32")
    labels = ops.cast(labels, "int32")
    real = ops.cast(ops.greater(ops.cast(weights, "float32"), 0.0), "float32")
    loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    correct = ops.cast(ops.equal(ops.cast(ops.argmax(logits, axis=-1), "int32"), labels), "float32")
    return ops.sum(loss * real), ops.sum(correct * real), ops.sum(real)


def _unpack(batch):
    """``(x, y, sample_weight)`` of a Keras batch (keras-hub preprocessors yield all three)."""
    if isinstance(batch, (tuple, list)):
        if len(batch) == 3:
            return batch[0], batch[1], batch[2]
        if len(batch) == 2:
            return batch[0], batch[1], None
    raise ArgumentError(
        "MaskedLMMetrics: each eval batch must be (x, y, sample_weight) or (x, y) with y the token ids at the "
        "predicted positions, e.g. a dataset mapped through a keras-hub MaskedLMPreprocessor."
    )


def make_stats_function(model) -> Callable:
    """A compiled ``(x, y, sample_weight) -> (loss_sum, num_correct, num_tokens)`` for ``model``.

    JAX: ``jax.jit`` over ``model.stateless_call`` with the model's current variables passed in (arrays
    sharded by ``keras.distribution`` stay sharded; the sums are over the global batch). TensorFlow:
    ``tf.function``. Other backends: eager ``keras.ops``.
    """
    name = backend_name()
    if name == "jax":
        import jax

        @jax.jit
        def stats(trainable, non_trainable, x, y, w):
            logits, _ = model.stateless_call(trainable, non_trainable, x, training=False)
            return batch_sums(logits, y, w if w is not None else keras.ops.ones_like(y))

        def call(x, y, w):
            x, y, w = keras.tree.map_structure(np.asarray, (x, y, w))  # tf.data tensors -> host arrays
            return stats([v.value for v in model.trainable_variables],
                         [v.value for v in model.non_trainable_variables], x, y, w)

        return call
    if name == "tensorflow":
        import tensorflow as tf

        @tf.function(reduce_retracing=True)
        def tf_stats(x, y, w):
            logits = model(x, training=False)
            return batch_sums(logits, y, w if w is not None else keras.ops.ones_like(y))

        return tf_stats

    def eager(x, y, w):
        x, y, w = keras.tree.map_structure(np.asarray, (x, y, w))
        logits = model(x, training=False)
        return batch_sums(logits, y, w if w is not None else keras.ops.ones_like(y))

    return eager


@register_callback("masked_lm_metrics", framework="keras")
class MaskedLMMetrics(MaskedLMEvaluations, keras.callbacks.Callback):
    """Evaluate masked-LM loss, perplexity and accuracy on device (per epoch or every N steps), Keras 3.

    For a keras-hub masked LM (``RobertaMaskedLM``, ``BertMaskedLM``...) or any Keras 3 model whose output
    is logits ``[B, P, V]`` at the positions its labels ``[B, P]`` describe. Per batch only three scalars
    reach the host (:func:`batch_sums`); the totals go through the package's ``masked_lm`` evaluate metric
    (:mod:`hf_tpu_ext.metrics.masked_lm`), so the formulas are the tf_keras callback's: token-weighted mean
    cross-entropy ``eval_loss``, ``perplexity = exp(eval_loss)``, ``eval_accuracy``, ``eval_tokens``.

    Results go into the epoch logs (and, with ``every_n_steps``, the batch logs of the step that crossed a
    multiple) under the keys of :func:`hf_tpu_ext.callbacks.tf_keras.masked_lm_metrics.metric_keys`;
    ``self.results`` holds the latest, ``self.history`` every evaluation with its ``step``.

    Args:
        eval_dataset: an iterable of ``(x, y, sample_weight)`` batches (e.g. a ``tf.data.Dataset`` mapped
            through the model's preprocessor, cached so the masking is fixed across evaluations); it must be
            finite or ``eval_steps`` given. Under ``keras.distribution`` give global batches.
        eval_steps: batches per evaluation (None: the whole dataset).
        every_n_steps: evaluate every N training steps of the ``fit`` (counted from the batch indices)
            instead of per epoch.
        prefix: prefix of the log keys.

    Raises:
        ArgumentError: ``eval_dataset`` is None, or ``every_n_steps``/``eval_steps`` < 1; a batch that is not
            ``(x, y[, sample_weight])``.
        MissingExtraError: ``evaluate`` is not installed (``pip install 'hf-tpu-ext[keras]'``).
    """

    def __init__(self, eval_dataset, eval_steps: Optional[int] = None, every_n_steps: Optional[int] = None,
                 prefix: str = "eval_"):
        super().__init__()
        require_extra("keras", "Callback 'masked_lm_metrics' for Keras 3", ("evaluate",))  # its metric, at build time
        check_evaluation_arguments("MaskedLMMetrics", eval_dataset, "give validation data (or a validation split).",
                                   every_n_steps=every_n_steps, eval_steps=eval_steps)
        self.init_evaluations(eval_dataset, eval_steps, every_n_steps)
        self.keys = metric_keys(prefix)
        self._stats = None
        self._stats_model = None
        self._steps = 0

    def evaluate(self) -> Dict[str, Any]:
        """Run one evaluation now (syncs the model's state on JAX); returns the prefixed results."""
        model = self.model  # the property syncs JAX's training state into the variables
        if self._stats is None or self._stats_model is not model:
            self._stats, self._stats_model = make_stats_function(model), model
        rows = {"loss_sum": [], "num_correct": [], "num_tokens": []}
        for i, batch in enumerate(self.eval_dataset):
            if self.eval_steps is not None and i >= self.eval_steps:
                break
            x, y, w = _unpack(batch)
            sums = self._stats(x, y, w)
            for key, value in zip(rows, sums):
                rows[key].append(float(np.asarray(value)))
        raw = load_masked_lm_metric().compute(
            loss_sum=rows["loss_sum"], num_correct=[int(round(v)) for v in rows["num_correct"]],
            num_tokens=[int(round(v)) for v in rows["num_tokens"]])
        return self.record(raw, self.keys, self._steps)

    def on_train_begin(self, logs=None):
        self._steps = 0

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_begin = batch

    def on_train_batch_end(self, batch, logs=None):
        before = self._steps
        self._steps += int(batch) - int(getattr(self, "_batch_begin", batch)) + 1
        if self.crossed(before, self._steps):
            results = self.evaluate()
            if logs is not None:
                logs.update(results)

    def on_epoch_end(self, epoch, logs=None):
        if self.due_at_epoch_end():
            self.evaluate()
        if logs is not None:
            logs.update(self.results)
