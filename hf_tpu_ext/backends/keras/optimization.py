"""Optimizer and learning-rate schedule of the Keras backend: Keras 3 optimizers, transformers' formulas.

The same semantics as the TensorFlow backend (:mod:`hf_tpu_ext.backends.tensorflow.optimization`):
``--lr_scheduler_type`` is transformers' ``lr_lambda`` of that name evaluated on the optimizer's iteration count
before the update (``LambdaLR``'s ``current_step``); every ``adamw*`` ``--optim`` is ``keras.optimizers.AdamW``
(decoupled decay ``w -= lr * weight_decay * w`` before the Adam step, as transformers' TF ``AdamWeightDecay``
and ``torch.optim.AdamW``), not on LayerNorm weights (Keras names them ``gamma``/``beta``) and biases;
``sgd`` is ``keras.optimizers.SGD`` without momentum (its decoupled decay ``lr * wd * w`` equals
``torch.optim.SGD(weight_decay=wd)``'s ``lr * (g + wd * w)`` there); ``adafactor`` is transformers' ``Adafactor`` as
the Trainer builds it for ``--optim adafactor`` (:class:`TransformersAdafactor`). ``--max_grad_norm`` is the optimizer's
``global_clipnorm`` (clip by the global norm of all gradients, transformers' ``clip_grad_norm_``).
The optimizer is used statelessly (``optimizer.stateless_apply``) inside the compiled training step.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from hf_tpu_ext.args import LR_SCHEDULER_TYPES, OPTIMIZERS
from hf_tpu_ext.errors import ArgumentError

#: Keras variable names excluded from weight decay (LayerNormalization's gamma/beta, every bias)
NO_DECAY = ("gamma", "beta", "bias")
# get_polynomial_decay_schedule_with_warmup's defaults
POLYNOMIAL_LR_END = 1e-7
POLYNOMIAL_POWER = 1.0


class TransformersAdafactor(keras.optimizers.Adafactor):
    """``keras.optimizers.Adafactor`` with the update of transformers' ``Adafactor(scale_parameter=False,
    relative_step=False, warmup_init=False, beta1=None)``, what transformers' Trainer builds for ``--optim adafactor``.

    Keras' own update always scales the step by the weight's RMS and caps the learning rate at ``1/sqrt(t)``
    (transformers' ``scale_parameter``/``relative_step`` on); with an external schedule transformers turns both off,
    so here the step is ``learning_rate * u`` with ``u`` the factored second-moment update clipped to RMS
    ``clip_threshold`` (1.0): ``beta2_t = 1 - t^-0.8``; a weight of rank >= 2 keeps a row mean ``r`` (shape
    ``w.shape[:-1]``) and a column mean ``c`` (``w.shape[:-2] + w.shape[-1:]``) of ``g^2 + 1e-30``, ``v = r /
    mean(r) x c``; a weight of rank < 2 keeps ``v`` itself (its shape). No full-size ``v`` for factored weights (that
    is Adafactor's memory saving; Keras' class keeps one). Weight decay (the optimizer's ``weight_decay``) is
    ``w -= lr * weight_decay * w`` before the step, transformers' ``p -= wd * lr * p``.

    Optimizer variables (float32, by position): ``iterations``, the learning rate, then per trainable weight ``r`` and
    ``c`` (rank >= 2) or ``v`` (rank < 2), in weight order.
    """

    def build(self, var_list):
        if self.built:
            return
        keras.optimizers.Optimizer.build(self, var_list)  # iterations, learning rate; not Adafactor's own slots
        self._r, self._c, self._v = [], [], []
        for var in var_list:
            factored = len(var.shape) >= 2
            self._r.append(self.add_variable(shape=var.shape[:-1], dtype=var.dtype, name=f"{var.name}_row")
                           if factored else None)
            self._c.append(self.add_variable(shape=var.shape[:-2] + (var.shape[-1],), dtype=var.dtype,
                                             name=f"{var.name}_col") if factored else None)
            self._v.append(None if factored else self.add_variable_from_reference(var, name="velocity"))

    def update_step(self, gradient, variable, learning_rate):
        """One weight's update (transformers' ``Adafactor.step`` for one parameter, formulas in the class doc)."""
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        t = ops.cast(self.iterations + 1, variable.dtype)
        beta = 1.0 - ops.power(t, self.beta_2_decay)
        square = ops.square(gradient) + self.epsilon_1
        index = self._get_variable_index(variable)
        if len(variable.shape) >= 2:
            r, c = self._r[index], self._c[index]
            self.assign(r, beta * r + (1.0 - beta) * ops.mean(square, axis=-1))
            self.assign(c, beta * c + (1.0 - beta) * ops.mean(square, axis=-2))
            v = ops.expand_dims(r / ops.mean(r, axis=-1, keepdims=True), -1) * ops.expand_dims(c, -2)
        else:
            v = self._v[index]
            self.assign(v, beta * v + (1.0 - beta) * square)
        update = gradient / ops.sqrt(v)
        update = update / ops.maximum(1.0, ops.sqrt(ops.mean(ops.square(update))) / self.clip_threshold)
        self.assign_sub(variable, lr * update)


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
        ArgumentError: an ``--optim`` without a Keras optimizer here (every name of
            :data:`hf_tpu_ext.args.OPTIMIZERS` has one).
    """
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
    elif kind == "adafactor":  # transformers' defaults: eps (1e-30, 1e-3), clip_threshold 1.0, decay_rate -0.8
        optimizer = TransformersAdafactor(learning_rate=schedule, beta_2_decay=-0.8, epsilon_1=1e-30,
                                          clip_threshold=1.0, relative_step=False,
                                          weight_decay=float(args.weight_decay) or None, global_clipnorm=clip,
                                          name="adafactor")  # fixed: checkpoint keys do not depend on the process
    else:
        raise ArgumentError(f"--optim {args.optim} is not available with --backend keras; use adamw_torch, "
                            "adafactor or sgd.")
    if args.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    return optimizer, schedule


def optimizer_description(training_args) -> str:
    """One line for the model card, e.g. ``AdamW (beta1=0.9, beta2=0.999, epsilon=1e-08), linear schedule``."""
    args = training_args
    kind = OPTIMIZERS[args.optim]
    if kind == "adamw":
        text = f"AdamW (beta1={args.adam_beta1}, beta2={args.adam_beta2}, epsilon={args.adam_epsilon})"
    elif kind == "adafactor":
        text = "Adafactor (no parameter scaling, no relative step, decay_rate=-0.8, clip_threshold=1.0)"
    else:
        text = "SGD"
    return f"{text}, {args.lr_scheduler_type} learning-rate schedule"
