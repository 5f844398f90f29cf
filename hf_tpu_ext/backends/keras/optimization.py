"""Optimizer and learning-rate schedule of the Keras backend: Keras 3 optimizers, transformers' formulas.

The same semantics as the TensorFlow backend (:mod:`hf_tpu_ext.backends.tensorflow.optimization`):
``--lr_scheduler_type`` is transformers' ``lr_lambda`` of that name evaluated on the optimizer's iteration count
before the update (``LambdaLR``'s ``current_step``); every ``adamw*`` ``--optim`` is ``keras.optimizers.AdamW``
(decoupled decay ``w -= lr * weight_decay * w`` before the Adam step, as transformers' TF ``AdamWeightDecay``
and ``torch.optim.AdamW``), not on LayerNorm weights (Keras names them ``gamma``/``beta``) and biases;
``sgd`` is ``keras.optimizers.SGD`` without momentum (its decoupled decay ``lr * wd * w`` equals
``torch.optim.SGD(weight_decay=wd)``'s ``lr * (g + wd * w)`` there). ``--max_grad_norm`` is the optimizer's
``global_clipnorm`` (clip by the global norm of all gradients, transformers' ``clip_grad_norm_``).
The optimizer is used statelessly (``optimizer.stateless_apply``) inside the compiled training step.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from hf_tpu_ext.errors import ArgumentError

#: Keras variable names excluded from weight decay (LayerNormalization's gamma/beta, every bias)
NO_DECAY = ("gamma", "beta", "bias")
# get_polynomial_decay_schedule_with_warmup's defaults
POLYNOMIAL_LR_END = 1e-7
POLYNOMIAL_POWER = 1.0


class TransformersSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``learning_rate * factor(step)`` with transformers' ``lr_lambda`` of ``kind`` (formulas: see the TF
    backend's ``TransformersSchedule``; the same curve for every backend).

    Args:
        kind: one of :data:`hf_tpu_ext.args.LR_SCHEDULER_TYPES`.
        learning_rate: peak learning rate.
        warmup_steps: linear warmup from 0.
        total_steps: optimizer steps of the run (>= 1).

    Calling it with a step (int, or a scalar tensor) returns a float32 scalar tensor of the Keras backend.

    Raises:
        ArgumentError: an unknown ``kind``.
    """

    def __init__(self, kind: str, learning_rate: float, warmup_steps: int, total_steps: int):
        super().__init__()
        from hf_tpu_ext.args import LR_SCHEDULER_TYPES

        if kind not in LR_SCHEDULER_TYPES:
            raise ArgumentError(f"Unknown --lr_scheduler_type {kind!r}.")
        self.kind = kind
        self.learning_rate = float(learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = max(int(total_steps), 1)

    def factor(self, step, xp=ops):
        """The multiplier of ``learning_rate`` at ``step``: with ``xp=keras.ops`` a tensor (inside the compiled
        step), with ``xp=numpy`` a NumPy float (for logs: no device op, no compilation)."""
        step = ops.cast(step, "float32") if xp is ops else np.float32(step)
        w, total = float(self.warmup_steps), float(self.total_steps)
        warm = step / max(1.0, w)
        progress = (step - w) / max(1.0, total - w)
        kind = self.kind
        if kind in ("constant", "constant_with_warmup"):
            after = xp.ones_like(step)
            if kind == "constant":
                return after
        elif kind == "linear":
            after = xp.maximum(0.0, (total - step) / max(1.0, total - w))
        elif kind == "cosine":
            after = xp.maximum(0.0, 0.5 * (1.0 + xp.cos(math.pi * progress)))
        elif kind == "cosine_with_restarts":
            after = xp.where(progress >= 1.0, 0.0,
                             xp.maximum(0.0, 0.5 * (1.0 + xp.cos(math.pi * xp.mod(progress, 1.0)))))
        elif kind == "polynomial":
            lr, end = self.learning_rate, POLYNOMIAL_LR_END
            remaining = 1.0 - xp.minimum(progress, 1.0)
            after = ((lr - end) * remaining ** POLYNOMIAL_POWER + end) / lr
        else:  # inverse_sqrt
            timescale = float(self.warmup_steps or 10_000)
            after = 1.0 / xp.sqrt((step + timescale - w) / timescale)
        return xp.where(step < w, warm, after)

    def __call__(self, step):
        return self.learning_rate * self.factor(step)

    def value(self, step: int) -> float:
        """The learning rate at ``step`` as a Python float, computed on the host (NumPy)."""
        return float(self.learning_rate * self.factor(step, xp=np))

    def get_config(self):
        return {"kind": self.kind, "learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps}


def make_optimizer(training_args, total_steps: int):
    """The Keras optimizer of ``--optim`` with the schedule of ``--lr_scheduler_type``.

    Args:
        training_args: :class:`hf_tpu_ext.args.TrainingArguments`.
        total_steps: optimizer steps of the run (``warmup_ratio`` is taken of these).

    Returns:
        ``(optimizer, schedule)``; build the optimizer on the model's trainable variables before use.

    Raises:
        ArgumentError: ``--optim adafactor`` (not transformers' Adafactor in Keras).
    """
    from hf_tpu_ext.args import OPTIMIZERS

    args = training_args
    schedule = TransformersSchedule(args.lr_scheduler_type, args.learning_rate, args.num_warmup_steps(total_steps),
                                    total_steps)
    clip = float(args.max_grad_norm) if args.max_grad_norm and args.max_grad_norm > 0 else None
    kind = OPTIMIZERS[args.optim]
    if kind == "adamw":
        optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=float(args.weight_decay),
                                           beta_1=args.adam_beta1, beta_2=args.adam_beta2, epsilon=args.adam_epsilon,
                                           global_clipnorm=clip)
    elif kind == "sgd":
        optimizer = keras.optimizers.SGD(learning_rate=schedule, weight_decay=float(args.weight_decay) or None,
                                         global_clipnorm=clip)
    else:
        raise ArgumentError(f"--optim {args.optim} is not available with --backend keras; use adamw_torch or sgd.")
    if args.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    return optimizer, schedule


def optimizer_description(training_args) -> str:
    """One line for the model card, e.g. ``AdamW (beta1=0.9, beta2=0.999, epsilon=1e-08), linear schedule``."""
    from hf_tpu_ext.args import OPTIMIZERS

    args = training_args
    if OPTIMIZERS[args.optim] == "adamw":
        text = f"AdamW (beta1={args.adam_beta1}, beta2={args.adam_beta2}, epsilon={args.adam_epsilon})"
    else:
        text = "SGD"
    return f"{text}, {args.lr_scheduler_type} learning-rate schedule"
