"""The compiled training and evaluation steps of the Keras backend on JAX (stateless Keras 3).

One ``jax.jit`` program per optimizer step: forward (``model.stateless_call``, exact GELU through ``erf``:
:mod:`hf_tpu_ext.backends.keras.gelu`), backward (``jax.value_and_grad``),
gradient accumulation (a ``lax.scan`` over the micro-batches), clipping by the global norm and the AdamW update
(``optimizer.stateless_apply``). The state (trainable variables, optimizer variables) is donated, so XLA updates
it in place. Data parallel: the state is replicated and the batch sharded over the ``"data"`` axis of a
``jax.sharding.Mesh`` of every device (all hosts); XLA (GSPMD) inserts the gradient all-reduce. The program is
the same whatever the device count: with 4 devices it computes what 1 device computes, split by rows.

Batch layout (host -> step): the training batch contract of ARCHITECTURE.md with a leading micro-batch axis,
``[A, B / A, ...]`` for ``A = gradient_accumulation_steps`` (``B``: global batch), sharded on axis 1.

Loss normalization: every micro-batch's loss is ``sum(token losses) / N`` with ``N`` the masked-token count of the
whole global batch, so the summed micro-batch gradients are the gradient of one ``B``-sequence batch, and
``A x B/A`` equals ``1 x B``. The loss's softmax runs on float32 logits (bf16 compute otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

import numpy as np

from hf_tpu_ext.backends.keras.architectures.remat import POLICY, layer_checkpointing
from hf_tpu_ext.backends.keras.bf16_dot import flat_dots, native_bf16_dots
from hf_tpu_ext.backends.keras.dropout import counter_based_dropout, dropout_key
from hf_tpu_ext.backends.keras.gelu import erf_gelu
from hf_tpu_ext.backends.keras.memory import report

if TYPE_CHECKING:  # the annotation only; the class lives in placement.py
    from hf_tpu_ext.backends.keras.placement import Placement

#: the batch keys the step reads (ARCHITECTURE.md "Training batch")
BATCH_KEYS = ("input_ids", "attention_mask", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
#: with --pack_documents, the batch also holds these (int32 [B, L]), handed to the model under the same names
PACKED_KEYS = ("segment_ids", "position_ids")


def _model_inputs(batch):
    inputs = {"token_ids": batch["input_ids"], "padding_mask": batch["attention_mask"],
              "mask_positions": batch["masked_lm_positions"]}
    for key in PACKED_KEYS:  # --pack_documents only: the unpacked step has no such inputs
        if key in batch:
            inputs[key] = batch[key]
    return inputs


def masked_lm_sums(logits, labels, weights):
    """``(summed cross-entropy, correct top-1 predictions, count)`` over weighted masked positions (float32).

    Args:
        logits: ``[..., P, V]`` any float dtype (cast to float32 first).
        labels: int ``[..., P]``; weights: float ``[..., P]`` (0 for padding slots).
    """
    import jax
    import jax.numpy as jnp

    logits = logits.astype(jnp.float32)
    weights = weights.astype(jnp.float32)
    gold = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    nll = jax.nn.logsumexp(logits, axis=-1) - gold
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(nll * weights), jnp.sum(correct * weights), jnp.sum(weights)


def make_train_step(model, optimizer, seed: int, accumulation: int, *, bf16_dots: bool,
                    dropout: bool = True, gradient_checkpointing: bool = False,
                    grad_sharding: Optional[Callable] = None, weight_use: Optional[Callable] = None,
                    weight_update: Optional[Callable] = None) -> Callable:
    """``step(state, batch, global_step) -> (state, loss_sum, count)``, not yet jitted.

    Args:
        model: the Keras model (``stateless_call`` is used; its variables are not touched).
        optimizer: a built Keras optimizer (``stateless_apply``).
        seed: the run's seed (dropout keys).
        accumulation: ``A``, micro-batches per step (the batch has a leading axis of that size).
        dropout: counter-based dropout (:mod:`hf_tpu_ext.backends.keras.dropout`); False keeps Keras' own.
        bf16_dots: XLA:CPU's dot routing (:mod:`hf_tpu_ext.backends.keras.bf16_dot`): a bf16 model's matmuls
            with float32 results (natively bf16), a float32 model's projections as 2-D dots (``flat_dots``); the
            run's :class:`hf_tpu_ext.precision.PrecisionPlan` decides it (``plan.bf16_dots``).
        grad_sharding: ``grads -> grads`` applied to each micro-batch's gradients and their sum while traced
            (``--fsdp``: :meth:`~hf_tpu_ext.backends.keras.placement.Placement.grad_sharding`, sharded like the
            optimizer state); None: as GSPMD propagates them.
        weight_use: ``weights -> weights`` applied to the trainable weights where the forward reads them (``--fsdp
            full_shard``: :meth:`~hf_tpu_ext.backends.keras.placement.Placement.gather_for_use`, each sharded
            weight gathered whole, so no activation is resharded); None: as they are.
        weight_update: ``weights -> weights`` applied to the updated weights (``shard_grad_op``:
            :meth:`~hf_tpu_ext.backends.keras.placement.Placement.gather_updated`); None: as they are.
        gradient_checkpointing: ``--gradient_checkpointing``: each encoder layer under ``jax.checkpoint``
            (:mod:`hf_tpu_ext.backends.keras.architectures.remat`, its policy): the same losses, fewer temporaries.

    Raises:
        ValueError: ``gradient_checkpointing`` with ``dropout=False`` (Keras' own dropout updates a seed variable
            inside the layer, which a checkpointed layer cannot hand out).

    ``state`` is ``(trainable, non_trainable, optimizer_variables)`` (lists of arrays).
    """
    import jax
    import jax.numpy as jnp

    dots = bool(bf16_dots)
    if gradient_checkpointing and not dropout:
        raise ValueError("gradient_checkpointing needs the counter-based dropout (dropout=True).")
    remat = POLICY if gradient_checkpointing else None
    constrain = grad_sharding or (lambda grads: grads)
    gather = weight_use or (lambda weights: weights)
    updated = weight_update or (lambda weights: weights)

    def micro_loss(trainable, non_trainable, micro, total, step, index):
        # one key per step; micro-batch i offsets the element counters by its place in the global batch, so
        # A micro-batches draw the masks one B-sequence batch draws
        key = dropout_key(seed, step) if dropout else None
        with counter_based_dropout(key, micro_batch=index if accumulation > 1 else None), erf_gelu(), \
                native_bf16_dots(dots), flat_dots(dots), layer_checkpointing(remat):
            logits, _ = model.stateless_call(gather(trainable), non_trainable, _model_inputs(micro), training=True)
        loss_sum, _, count = masked_lm_sums(logits, micro["masked_lm_ids"], micro["masked_lm_weights"])
        return loss_sum / total, (loss_sum, count)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def train_step(state, batch, global_step):
        trainable, non_trainable, opt_vars = state
        total = jnp.maximum(jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)), 1.0)
        if accumulation == 1:
            micro = {k: v[0] for k, v in batch.items()}
            (_, (loss_sum, count)), grads = grad_fn(trainable, non_trainable, micro, total, global_step, 0)
            grads = constrain(grads)
        else:
            def body(carry, xs):
                acc, loss_acc, count_acc = carry
                micro, index = xs
                (_, (l, c)), g = grad_fn(trainable, non_trainable, micro, total, global_step, index)
                g = constrain(g)
                return ([a + b for a, b in zip(acc, g)], loss_acc + l, count_acc + c), None

            zeros = constrain([jnp.zeros_like(v) for v in trainable])
            (grads, loss_sum, count), _ = jax.lax.scan(
                body, (zeros, jnp.float32(0.0), jnp.float32(0.0)),
                (batch, jnp.arange(accumulation, dtype=jnp.int32)))
        trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
        return (updated(trainable), non_trainable, opt_vars), loss_sum, count

    return train_step


def make_multi_step(train_step: Callable, steps: int) -> Callable:
    """``steps`` optimizer steps in one program (``--steps_per_execution``), not yet jitted:
    ``train_step(state, batches, first_step, n) -> (state, loss_sums, counts)``.

    Args:
        train_step: :func:`make_train_step`'s step.
        steps: ``N``, the stacked batches per call.

    ``batches`` holds ``N`` global batches stacked on a new leading axis (``[N, A, B / A, ...]``, sharded on axis
    2); ``first_step`` (int32) is the global step of the first, ``n`` (int32, ``1 <= n <= N``) how many of them
    are trained on (a ``lax.fori_loop`` of ``n`` trips, so a shorter call at an epoch's end or the run's last step
    reuses the one compiled program). ``loss_sums``, ``counts``: float32 ``[N]``, step ``i``'s summed token loss
    and masked-token count (zeros past ``n``).
    """
    import jax
    import jax.numpy as jnp

    def train_step_n(state, batches, first_step, n):
        def body(i, carry):
            state, sums, counts = carry
            batch = {k: jax.lax.dynamic_index_in_dim(v, i, 0, keepdims=False) for k, v in batches.items()}
            state, loss_sum, count = train_step(state, batch, first_step + i)
            return state, sums.at[i].set(loss_sum), counts.at[i].set(count)

        zeros = jnp.zeros((steps,), jnp.float32)
        return jax.lax.fori_loop(0, n, body, (state, zeros, zeros))

    train_step_n.__name__ = train_step.__name__  # "train_step": CompileCounter and the recompile guard find it
    return train_step_n


def make_eval_step(model, *, bf16_dots: bool) -> Callable:
    """``eval_step(trainable, non_trainable, batch) -> (loss_sum, correct, count)`` (no dropout), not jitted;
    ``bf16_dots`` as in :func:`make_train_step`."""
    dots = bool(bf16_dots)

    def eval_step(trainable, non_trainable, batch):
        with native_bf16_dots(dots), flat_dots(dots):
            logits, _ = model.stateless_call(trainable, non_trainable, _model_inputs(batch), training=False)
        return masked_lm_sums(logits, batch["masked_lm_ids"], batch["masked_lm_weights"])

    return eval_step


class TrainStep:
    """``jax.jit`` of a train step, compiled at its first call: state donated, each output state array with its
    input's sharding (replicated, or the ``--fsdp`` plan's), losses replicated. The first call lowers and compiles
    it once, says its memory per device and refuses what exceeds the device's limit
    (:func:`hf_tpu_ext.backends.keras.memory.report`), then runs it through the jitted function, whose cache
    holds that executable (no second compilation: ``xla_step_compilations`` stays 1). :meth:`lower` jits it
    without running it (benchmarks' HLO); other attributes (``_cache_size``) are the jitted function's, once built."""

    def __init__(self, step: Callable, placement: Optional[Placement]):
        self.step, self.placement, self.jitted, self.measured = step, placement, None, False
        self.__name__ = getattr(step, "__name__", "train_step")

    def __call__(self, state, *rest):
        if not self.measured:  # lowered and compiled once: the call below finds the executable in jit's cache
            report(self.lower(state, *rest).compile(), state, self.placement)
            self.measured = True
        return self.jitted(state, *rest)

    def lower(self, state, *rest):
        """``jax.jit(...).lower`` of the step for these arguments (the output shardings from ``state``'s)."""
        if self.jitted is None:
            self.jitted = self._jit(state)
        return self.jitted.lower(state, *rest)

    def _jit(self, state):
        import jax

        if self.placement is None:
            return jax.jit(self.step, donate_argnums=(0,))
        shardings = jax.tree.map(lambda a: a.sharding, state)
        replicated = self.placement.replicated
        return jax.jit(self.step, donate_argnums=(0,), out_shardings=(shardings, replicated, replicated))

    def __getattr__(self, name):
        jitted = self.__dict__.get("jitted")
        if jitted is None:
            raise AttributeError(f"{name} (the train step is jitted at its first call)")
        return getattr(jitted, name)


def jit_train_step(step: Callable, placement: Optional[Placement]) -> TrainStep:
    """:class:`TrainStep` of :func:`make_train_step`'s (or :func:`make_multi_step`'s) step: state donated, kept
    where ``placement`` put it; the step number a traced int32."""
    return TrainStep(step, placement)


def jit_eval_step(eval_step: Callable) -> Callable:
    import jax

    return jax.jit(eval_step)


def split_micro_batches(batch: Dict[str, np.ndarray], accumulation: int) -> Dict[str, np.ndarray]:
    """``[B, ...] -> [A, B / A, ...]``: micro-batch ``i`` holds rows ``i*B/A .. (i+1)*B/A - 1``."""
    out = {}
    for k, v in batch.items():
        rows = v.shape[0]
        out[k] = v.reshape((accumulation, rows // accumulation) + v.shape[1:])
    return out


def state_to_host(state) -> Tuple[list, list, list]:
    """The state's arrays as NumPy, whole: a device-to-host copy; an array sharded over several processes
    (``--fsdp``) gathered first (``process_allgather``, a collective every process takes part in)."""
    import jax

    def whole(x):
        if getattr(x, "is_fully_addressable", True) or x.is_fully_replicated:
            return np.asarray(jax.device_get(x))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return tuple([whole(x) for x in part] for part in state)


#: the event JAX records after every XLA compilation it did not serve from its cache (``fun_name=`` the function)
JAX_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts JAX's own XLA compilations of functions named ``fun_name`` while registered (``jax.monitoring``)."""

    def __init__(self, fun_name: str = "train_step"):
        self.fun_name = fun_name
        self.count = 0
        self.seconds = 0.0

    def _listener(self, event: str, duration: float, **kwargs) -> None:
        # fun_name is "jit(train_step)" (jax 0.10) or "train_step" (older releases)
        if event == JAX_BACKEND_COMPILE_EVENT and str(kwargs.get("fun_name", "")) in (
                self.fun_name, f"jit({self.fun_name})"):
            self.count += 1
            self.seconds += float(duration)

    def __enter__(self) -> "CompileCounter":
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc) -> None:
        import jax.monitoring

        unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
        if unregister is not None:
            unregister(self._listener)
