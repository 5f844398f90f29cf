"""The training and evaluation steps of the Keras backend on Keras 3's TensorFlow backend (``KERAS_BACKEND=tensorflow``).

The JAX path (:mod:`hf_tpu_ext.backends.keras.step`) is stateless; on TensorFlow the step updates the Keras
variables in place, as Keras' own TensorFlow ``fit`` does: one ``tf.function(jit_compile=True)`` holds the
forward, the backward (``tf.GradientTape``), the gradient accumulation (a Python loop over the ``A``
micro-batches, unrolled at trace time: ``A`` is small and static), clipping and the optimizer update
(``optimizer.apply``). One device (no ``tf.distribute`` strategy here: use ``--backend tensorflow`` for
TensorFlow's multi-device strategies, or JAX). Dropout is Keras' own (TensorFlow's stateless RNG under XLA); the
loss normalization and the batch layout ``[A, B/A, ...]`` are the JAX step's.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np


def masked_lm_sums(logits, labels, weights):
    """``(summed cross-entropy, correct top-1, count)`` over weighted masked positions, float32 (``keras.ops``)."""
    from keras import ops

    logits = ops.cast(logits, "float32")
    weights = ops.cast(weights, "float32")
    gold = ops.take_along_axis(logits, ops.expand_dims(ops.cast(labels, "int32"), -1), axis=-1)[..., 0]
    nll = ops.logsumexp(logits, axis=-1) - gold
    correct = ops.cast(ops.equal(ops.cast(ops.argmax(logits, axis=-1), "int32"), ops.cast(labels, "int32")),
                       "float32")
    return ops.sum(nll * weights), ops.sum(correct * weights), ops.sum(weights)


def _inputs(batch):
    inputs = {"token_ids": batch["input_ids"], "padding_mask": batch["attention_mask"],
              "mask_positions": batch["masked_lm_positions"]}
    for key in ("segment_ids", "position_ids"):  # --pack_documents only (step.PACKED_KEYS)
        if key in batch:
            inputs[key] = batch[key]
    return inputs


def make_train_step(model, optimizer, accumulation: int) -> Callable:
    """``train_step(batch) -> (loss_sum, count)``: a ``tf.function(jit_compile=True)`` updating the variables."""
    import tensorflow as tf

    variables = model.trainable_variables

    @tf.function(jit_compile=True, reduce_retracing=False)
    def train_step(batch):
        total = tf.maximum(tf.reduce_sum(tf.cast(batch["masked_lm_weights"], tf.float32)), 1.0)
        grads, loss_sum, count = None, 0.0, 0.0
        for i in range(accumulation):
            micro = {k: v[i] for k, v in batch.items()}
            with tf.GradientTape() as tape:
                logits = model(_inputs(micro), training=True)
                l, _, c = masked_lm_sums(logits, micro["masked_lm_ids"], micro["masked_lm_weights"])
                loss = l / total
            g = tape.gradient(loss, variables)
            g = [tf.convert_to_tensor(x) if x is not None else tf.zeros_like(v) for x, v in zip(g, variables)]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
            loss_sum, count = loss_sum + l, count + c
        optimizer.apply(grads, variables)
        return loss_sum, count

    return train_step


def make_eval_step(model) -> Callable:
    """``eval_step(batch) -> (loss_sum, correct, count)`` (no dropout), XLA-compiled."""
    import tensorflow as tf

    @tf.function(jit_compile=True, reduce_retracing=False)
    def eval_step(batch):
        logits = model(_inputs(batch), training=False)
        return masked_lm_sums(logits, batch["masked_lm_ids"], batch["masked_lm_weights"])

    return eval_step


def to_tensors(batch: Dict[str, np.ndarray]):
    import tensorflow as tf

    return {k: tf.constant(v) for k, v in batch.items()}
