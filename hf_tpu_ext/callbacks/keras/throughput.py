"""Throughput and MFU of a Keras 3 ``model.fit`` (JAX, TensorFlow or torch backend)."""

from __future__ import annotations

import logging
from typing import Optional

import keras
import numpy as np

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.keras import backend_name
from hf_tpu_ext.callbacks.throughput_meter import ThroughputMeter
from hf_tpu_ext.flops import Peak, default_device_kind, device_peak as peak_of, flops_per_token

logger = logging.getLogger("hf_tpu_ext")


def jax_forward_flops(model, seq_length: int) -> Optional[float]:
    """XLA's FLOP count of one forward pass of ``model`` on a batch of one sequence (JAX backend).

    Lowers ``model.stateless_call`` with ``jax.jit(...).lower`` on abstract inputs -- every ``None``
    dimension of ``model.inputs`` is 1 for the batch and ``seq_length`` after it -- and reads
    ``cost_analysis()["flops"]`` (XLA's HLO cost analysis, before compilation; nothing runs).

    Returns:
        FLOPs (float), or None where the model has no symbolic inputs or XLA gives no count.
    """
    import jax

    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None

    def spec(t):
        shape = tuple((1 if i == 0 else seq_length) if d is None else d for i, d in enumerate(t.shape))
        return jax.ShapeDtypeStruct(shape, t.dtype)

    structure = getattr(model, "_inputs_struct", None)
    x = keras.tree.map_structure(spec, structure) if structure is not None else [spec(t) for t in inputs]
    trainable = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in model.trainable_variables]
    non_trainable = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in model.non_trainable_variables]

    def forward(tv, ntv, data):
        return model.stateless_call(tv, ntv, data, training=False)[0]

    try:
        costs = jax.jit(forward).lower(trainable, non_trainable, x).cost_analysis()
    except Exception as e:  # a model whose call cannot be lowered abstractly: fall back to the formula
        logger.info("ThroughputCallback: no XLA FLOP count (%s); using the analytic count.", e)
        return None
    if isinstance(costs, (list, tuple)):  # older jax: one dict per computation
        costs = costs[0] if costs else None
    flops = (costs or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


def analytic_flops_per_token(model, seq_length: int) -> Optional[float]:
    """:func:`hf_tpu_ext.flops.flops_per_token` from a keras-hub backbone's config (None for other models)."""
    from types import SimpleNamespace


    backbone = getattr(model, "backbone", model)
    try:
        config = backbone.get_config()
        shape = SimpleNamespace(hidden_size=config["hidden_dim"], num_hidden_layers=config["num_layers"],
                                intermediate_size=config.get("intermediate_dim"),
                                vocab_size=config["vocabulary_size"])
    except (KeyError, TypeError, NotImplementedError, AttributeError):
        return None
    return flops_per_token(shape, seq_length)


def device_peak():
    """The peak of one device (:func:`hf_tpu_ext.flops.device_peak`: a TPU/GPU datasheet value or the CPU
    formula) for the compute dtype of ``keras.config.dtype_policy()``: on JAX the device from
    ``jax.devices()[0].device_kind`` (names the TPU generation, e.g. ``"TPU v4"``; ``"cpu"`` on a CPU), on
    TensorFlow from :func:`hf_tpu_ext.flops.default_device_kind`, on torch ``torch.cuda.get_device_name(0)`` (or
    ``"cpu"`` without CUDA).

    Returns:
        :class:`hf_tpu_ext.flops.Peak` (``flops`` None with the reason for an unknown device or backend).
    """
    try:
        if backend_name() == "jax":
            import jax

            kind = jax.devices()[0].device_kind
        elif backend_name() == "tensorflow":
            kind = default_device_kind()
        elif backend_name() == "torch":  # Keras 3 on torch trains on the first CUDA device, else on the CPU
            import torch

            kind = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        else:
            return Peak(None, f"no peak: the {backend_name()} backend's device is not looked up")
    except Exception as err:  # no device information: no MFU rather than a failed fit
        return Peak(None, f"no peak: the device could not be named ({err})")
    return peak_of(kind, keras.config.dtype_policy().compute_dtype)


@register_callback("throughput", framework="keras")
class ThroughputCallback(ThroughputMeter, keras.callbacks.Callback):
    """Log samples/s, tokens/s (per replica), median step time and MFU in a Keras 3 ``fit``.

    Same keys and summary as the tf_keras ``throughput`` callback (``samples_per_second``,
    ``tokens_per_second``, ``tokens_per_second_per_replica``, ``step_time_ms_median``, ``mfu``;
    ``self.summary`` after training). The clock runs from ``on_train_batch_begin`` to
    ``on_train_batch_end``; steps per call come from the batch indices Keras passes (``end - begin + 1``,
    right with ``steps_per_execution > 1``), and the step's logs are read to host at batch end so that an
    asynchronous backend (JAX) has finished the step when the clock stops.

    FLOPs per token, when not given: on JAX, XLA's count (:func:`jax_forward_flops`, ``3x`` the forward pass
    for forward + backward, as in Kaplan et al. 2020), which covers what the model really computes (e.g. a
    keras-hub masked LM's head at every ``mask_positions`` entry it is given; ``seq_length`` of them here);
    otherwise (TensorFlow, torch) the analytic count of :func:`hf_tpu_ext.flops.flops_per_token` from a
    keras-hub backbone's config. ``flops_source`` in the summary says which (``"xla"``, ``"analytic"``,
    ``"given"`` or None).

    Args:
        global_batch_size: sequences per optimizer step over all replicas.
        seq_length: tokens per sequence.
        num_replicas: replicas (devices) the global batch is split over.
        flops_per_token: training FLOPs per token (default: counted as above).
        peak_flops: peak FLOP/s of one device (default: :func:`device_peak` at train begin, the datasheet value
            of a known GPU/TPU or the CPU formula); no MFU without it.
        peak_dtype, warmup_steps, log_every: as in the tf_keras callback.

    Raises:
        ArgumentError: a size argument is < 1, or ``warmup_steps`` < 0.
    """

    def __init__(self, global_batch_size: int, seq_length: int, num_replicas: int = 1,
                 flops_per_token: Optional[float] = None, peak_flops: Optional[float] = None,
                 peak_dtype: str = "float32", warmup_steps: int = 2, log_every: int = 100):
        super().__init__(global_batch_size, seq_length, num_replicas=num_replicas, flops_per_token=flops_per_token,
                         peak_flops=peak_flops, peak_dtype=peak_dtype, warmup_steps=warmup_steps,
                         log_every=log_every)
        self.flops_source = "given" if flops_per_token else None

    @classmethod
    def from_run(cls, run) -> "ThroughputCallback":
        """The callback of an ``hf-tpu train --backend keras`` run: its global batch, sequence length, replicas
        and FLOPs per token (:func:`hf_tpu_ext.flops.flops_per_token` with the head at the masked positions, the
        count every backend uses). No line of its own (``log_every=0``) while the run's loop logs throughput
        (``run.logs_throughput``, true unless the context says otherwise: the loop's line is the one figure per
        logging step); else a line every ``--logging_steps``. It still fills the logs and ``summary``."""
        args = run.training_args
        every = 0 if getattr(run, "logs_throughput", True) else max(1, int(getattr(args, "logging_steps", 100) or 100))
        return cls(run.global_batch_size, run.seq_length, num_replicas=run.num_replicas,
                   flops_per_token=getattr(run, "flops_per_token", None), log_every=every)

    def _iterations(self) -> Optional[int]:
        return None  # JAX keeps the optimizer step outside the variable mid-epoch: count batch indices

    def _device_peak(self):
        return device_peak()

    def on_train_begin(self, logs=None):
        if not self.flops_per_token:
            model = self._model
            forward = jax_forward_flops(model, self.seq_length) if backend_name() == "jax" else None
            if forward:
                self.flops_per_token, self.flops_source = 3.0 * forward / self.seq_length, "xla"
            else:
                analytic = analytic_flops_per_token(model, self.seq_length)
                if analytic:
                    self.flops_per_token, self.flops_source = analytic, "analytic"
        super().on_train_begin(logs)

    def on_train_batch_end(self, batch, logs=None):
        if logs:
            for value in logs.values():  # wait for the step (async dispatch) before the clock stops
                np.asarray(value)
                break
        super().on_train_batch_end(batch, logs)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        self.summary["flops_source"] = self.flops_source
