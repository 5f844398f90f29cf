"""Optimizer and learning-rate schedule of the TensorFlow backend, named and computed as in transformers.

``--lr_scheduler_type`` picks one of transformers' PyTorch schedule formulas (``transformers.optimization``:
``get_linear_schedule_with_warmup``, ``get_cosine_schedule_with_warmup``, ...), evaluated here with TF ops on
``optimizer.iterations`` (the step before the update, like ``LambdaLR``'s ``current_step``), so both backends
follow the same curve. ``--optim`` picks the update rule: every ``adamw*`` name is transformers' TF
``AdamWeightDecay`` (decoupled decay ``lr * weight_decay * w``, not on LayerNorm weights and biases, as
``torch.optim.AdamW`` in the Trainer); ``sgd`` is plain SGD with the decay added to the gradient, as
``torch.optim.SGD(weight_decay=...)``.
"""

from __future__ import annotations

import math

import tensorflow as tf
import tf_keras

from hf_tpu_ext.args import OPTIMIZERS
from hf_tpu_ext.errors import ArgumentError

# transformers' Trainer: no weight decay on LayerNorm weights and biases
NO_DECAY = ("LayerNorm", "layer_norm", "bias")
# get_polynomial_decay_schedule_with_warmup's defaults
POLYNOMIAL_LR_END = 1e-7
POLYNOMIAL_POWER = 1.0


class TransformersSchedule(tf_keras.optimizers.schedules.LearningRateSchedule):
    """``learning_rate * factor(step)`` with transformers' ``lr_lambda`` of ``kind``.

    Args:
        kind: one of :data:`hf_tpu_ext.args.LR_SCHEDULER_TYPES`.
        learning_rate: peak learning rate (float).
        warmup_steps: linear warmup from 0 (int >= 0).
        total_steps: optimizer steps of the run (int >= 1).

    Calling it with an integer step (scalar tensor or int) returns a float32 scalar. Formulas (``w`` warmup,
    ``T`` total, ``p = (step - w) / max(1, T - w)``; before ``w`` every kind except ``constant`` is
    ``step / max(1, w)``): linear ``max(0, (T - step) / max(1, T - w))``; cosine ``max(0, 0.5 (1 + cos(pi p)))``;
    cosine_with_restarts (one cycle) ``0 if p >= 1 else 0.5 (1 + cos(pi (p mod 1)))``; polynomial
    ``((lr - lr_end) (1 - p)^power + lr_end) / lr`` (lr_end 1e-7, power 1); constant ``1``;
    constant_with_warmup ``1``; inverse_sqrt ``1 / sqrt((step + s - w) / s)`` with ``s = w or 10000``.
    """

    def __init__(self, kind: str, learning_rate: float, warmup_steps: int, total_steps: int):
        super().__init__()
        self.kind = kind
        self.learning_rate = float(learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = max(int(total_steps), 1)

    def factor(self, step):
        step = tf.cast(step, tf.float32)
        w, total = float(self.warmup_steps), float(self.total_steps)
        warm = step / max(1.0, w)
        progress = (step - w) / max(1.0, total - w)
        kind = self.kind
        if kind == "constant":
            return tf.ones_like(step)
        if kind == "linear":
            after = tf.maximum(0.0, (total - step) / max(1.0, total - w))
        elif kind == "cosine":
            after = tf.maximum(0.0, 0.5 * (1.0 + tf.cos(math.pi * 0.5 * 2.0 * progress)))
        elif kind == "cosine_with_restarts":
            after = tf.where(progress >= 1.0, 0.0,
                             tf.maximum(0.0, 0.5 * (1.0 + tf.cos(math.pi * tf.math.floormod(progress, 1.0)))))
        elif kind == "polynomial":
            lr, end = self.learning_rate, POLYNOMIAL_LR_END
            pct_remaining = 1.0 - tf.minimum(progress, 1.0)
            after = ((lr - end) * pct_remaining ** POLYNOMIAL_POWER + end) / lr
        elif kind == "constant_with_warmup":
            after = tf.ones_like(step)
        elif kind == "inverse_sqrt":
            timescale = float(self.warmup_steps or 10_000)
            after = 1.0 / tf.sqrt((step + timescale - w) / timescale)
        else:
            raise ArgumentError(f"Unknown --lr_scheduler_type {kind!r}.")
        return tf.where(step < w, warm, after)

    def __call__(self, step):
        return self.learning_rate * self.factor(step)

    def get_config(self):
        return {"kind": self.kind, "learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps}


def _decays(name: str) -> bool:
    return not any(n in name for n in NO_DECAY)


class SGDWithWeightDecay(tf_keras.optimizers.legacy.SGD):
    """``torch.optim.SGD`` as the Trainer builds it: ``g + weight_decay * w`` for decayed weights, no momentum."""

    def __init__(self, learning_rate, weight_decay: float = 0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.weight_decay = float(weight_decay)

    def _resource_apply_dense(self, grad, var, apply_state=None):
        if self.weight_decay and _decays(var.name):
            grad = grad + tf.cast(self.weight_decay, grad.dtype) * var
        return super()._resource_apply_dense(grad, var, apply_state=apply_state)


def make_optimizer(training_args, total_steps: int):
    """The optimizer of ``--optim`` with the schedule of ``--lr_scheduler_type`` (create under the strategy's scope).

    Args:
        training_args: :class:`hf_tpu_ext.args.TrainingArguments`.
        total_steps: optimizer steps of the run (warmup_ratio is taken of these).

    Returns:
        ``(optimizer, schedule)``: a ``tf_keras`` legacy optimizer and the :class:`TransformersSchedule`.

    Raises:
        ArgumentError: an ``--optim`` this backend does not build (``adafactor``).
    """
    from transformers import AdamWeightDecay

    args = training_args
    schedule = TransformersSchedule(args.lr_scheduler_type, args.learning_rate, args.num_warmup_steps(total_steps),
                                    total_steps)
    kind = OPTIMIZERS[args.optim]
    if kind == "adamw":
        if args.weight_decay > 0:
            return AdamWeightDecay(learning_rate=schedule, weight_decay_rate=args.weight_decay, beta_1=args.adam_beta1,
                                   beta_2=args.adam_beta2, epsilon=args.adam_epsilon,
                                   exclude_from_weight_decay=list(NO_DECAY)), schedule
        return tf_keras.optimizers.legacy.Adam(learning_rate=schedule, beta_1=args.adam_beta1, beta_2=args.adam_beta2,
                                               epsilon=args.adam_epsilon), schedule
    if kind == "sgd":
        return SGDWithWeightDecay(learning_rate=schedule, weight_decay=args.weight_decay), schedule
    raise ArgumentError(f"--optim {args.optim} is not available with --backend tensorflow.")  # refused in args


def optimizer_description(training_args) -> str:
    """One line for the model card, e.g. ``AdamW (beta1=0.9, beta2=0.999, epsilon=1e-08), linear schedule``."""
    args = training_args
    kind = OPTIMIZERS[args.optim]
    if kind == "adamw":
        text = f"AdamW (beta1={args.adam_beta1}, beta2={args.adam_beta2}, epsilon={args.adam_epsilon})"
    elif kind == "sgd":
        text = "SGD"
    else:
        text = "Adafactor"
    return f"{text}, {args.lr_scheduler_type} learning-rate schedule"
