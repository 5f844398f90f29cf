"""Throughput and MFU of training, measured from the host clock around each train-function call."""

from __future__ import annotations

import tf_keras

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.throughput_meter import ThroughputMeter
from hf_tpu_ext.errors import ArgumentError
from hf_tpu_ext.flops import Peak, default_device_kind, device_peak, flops_per_token



def config_flops_per_token(model, seq_length: int):
    """:func:`hf_tpu_ext.flops.flops_per_token` of ``model.config`` (a transformers model's), or None."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    try:
        return flops_per_token(config, seq_length)
    except (ArgumentError, AttributeError, TypeError, ValueError):  # not a transformer encoder's config
        return None


@register_callback("throughput")
class ThroughputCallback(ThroughputMeter, tf_keras.callbacks.Callback):
    """Log samples/s, tokens/s (per replica), median step time and MFU.

    The clock runs from ``on_train_batch_begin`` to ``on_train_batch_end``; the number of optimizer steps
    one call covered comes from ``model.optimizer.iterations`` (so ``steps_per_execution > 1`` and our
    trainer's multi-step calls count right). Reading that scalar is the only device read this callback
    does; it also waits for the step to finish, which keeps the clock honest on asynchronous devices.
    The first ``warmup_steps`` steps of each ``fit`` (tracing, XLA compilation) are left out.

    Keys written into ``logs`` (batch logs: the last call; epoch logs: the epoch's steps after warm-up,
    or all of its steps when it had none after warm-up):

    - ``samples_per_second``: sequences/s over all replicas (float);
    - ``tokens_per_second``: ``samples_per_second * seq_length`` (float);
    - ``tokens_per_second_per_replica``: ``tokens_per_second / num_replicas`` (float);
    - ``step_time_ms_median``: median wall time of one optimizer step, ms (epoch logs, and every
      ``log_every`` steps);
    - ``mfu``: model FLOPs utilization in [0, 1]: ``tokens_per_second_per_replica * flops_per_token /
      peak_flops``, only when both are known (never above 1: see :class:`ThroughputMeter`).

    After training ``self.summary`` holds the steady rates of the fit (steps after warm-up; ``rate`` says so),
    ``peak_flops`` with ``peak_flops_source``, and ``mfu`` or ``mfu_note`` (why it is left out).

    Args:
        global_batch_size: sequences per optimizer step over all replicas.
        seq_length: tokens per sequence.
        num_replicas: replicas the global batch is split over.
        flops_per_token: training FLOPs per token (default: :func:`hf_tpu_ext.flops.flops_per_token` of the model's
            ``config`` at train begin, when it is a transformer encoder's, e.g. a ``TFRobertaForMaskedLM``: the LM
            head at every position; no MFU for a model without one).
        peak_flops: peak FLOP/s of ONE device/replica (default: looked up at train begin with
            :func:`hf_tpu_ext.flops.device_peak` for TensorFlow's device: a TPU/GPU datasheet value or the CPU
            formula; nothing is measured).
        peak_dtype: the compute dtype the default peak is for (``"float32"`` or ``"bfloat16"``).
        warmup_steps: optimizer steps at the start of each ``fit`` not timed (a call that starts inside
            the warm-up is left out whole).
        log_every: also log a line through the ``hf_tpu_ext`` logger every N optimizer steps (0: never).

    Raises:
        ArgumentError: a size argument is < 1, or ``warmup_steps`` < 0.
    """

    @classmethod
    def from_run(cls, run) -> "ThroughputCallback":
        """Configure from the trainer's ``RunContext``: sizes, FLOPs per token, the device's known peak.

        The LM head runs at ``max_predictions_per_seq`` of ``seq_length`` positions in hf-tpu-ext's trainer,
        which the FLOP count takes into account. ``peak_flops``: :func:`hf_tpu_ext.flops.device_peak` of the
        device (bf16 with ``--bf16``, else float32/TF32; the CPU formula on a CPU), the same peak as the
        trainer's log line. No log line of its own (``log_every=0``).
        """
        predictions = getattr(run.data_args, "max_predictions_per_seq", None)
        fraction = min(1.0, predictions / run.seq_length) if predictions else None
        fpt = flops_per_token(run.model_config, run.seq_length, masked_fraction=fraction) if run.model_config else None
        kind = getattr(getattr(run, "strategy_info", None), "device_kind", None) or default_device_kind()
        dtype = run.compute_dtype
        peak = device_peak(kind, dtype)
        callback = cls(
            global_batch_size=run.global_batch_size,
            seq_length=run.seq_length,
            num_replicas=run.num_replicas,
            flops_per_token=fpt,
            peak_flops=peak.flops,
            peak_dtype=dtype,
            # hf-tpu train's own log line is the one throughput figure on the terminal (training steps only);
            # this callback still fills the logs and ``summary`` for other callbacks and benchmarks
            log_every=0,
        )
        callback.peak_source = peak.source if peak.flops else None
        return callback

    def on_train_begin(self, logs=None):
        if not self.flops_per_token:
            self.flops_per_token = config_flops_per_token(getattr(self, "model", None), self.seq_length)
        super().on_train_begin(logs)

    def _device_peak(self):
        try:
            return device_peak(default_device_kind(), self.peak_dtype)
        except Exception as err:  # noqa: BLE001 (no device information: no MFU rather than a failed fit)
            return Peak(None, f"no peak: the device could not be named ({err})")
