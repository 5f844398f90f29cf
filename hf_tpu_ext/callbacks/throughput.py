"""Throughput and MFU of training, measured from the host clock around each train-function call."""

from __future__ import annotations

import tf_keras

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.throughput_meter import ThroughputMeter, _weighted_median  # noqa: F401  (re-export)



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
      peak_flops``, only when both are known.

    After training ``self.summary`` holds the whole run's numbers (for the model card and benchmarks).

    Args:
        global_batch_size: sequences per optimizer step over all replicas.
        seq_length: tokens per sequence.
        num_replicas: replicas the global batch is split over.
        flops_per_token: training FLOPs per token (see :func:`hf_tpu_ext.flops.flops_per_token`).
        peak_flops: peak FLOP/s of ONE device/replica (see :func:`hf_tpu_ext.flops.known_peak_flops`).
        measure_peak: when ``peak_flops`` is None, measure it once at train begin with
            :func:`hf_tpu_ext.flops.measure_peak_flops` (takes about a second or two).
        peak_dtype: dtype for ``measure_peak`` (``"float32"`` or ``"bfloat16"``).
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
        which the FLOP count takes into account. ``peak_flops`` is the datasheet value for the device
        (bf16 with ``--bf16``, else float32/TF32); unknown devices (CPUs) get no MFU here (the trainer's log
        line has it, from a measured and cached peak). No log line of its own (``log_every=0``).
        """
        from hf_tpu_ext.flops import default_device_kind, flops_per_token, known_peak_flops

        predictions = getattr(run.data_args, "max_predictions_per_seq", None)
        fraction = min(1.0, predictions / run.seq_length) if predictions else None
        fpt = flops_per_token(run.model_config, run.seq_length, masked_fraction=fraction) if run.model_config else None
        kind = getattr(getattr(run, "strategy_info", None), "device_kind", None) or default_device_kind()
        dtype = "bfloat16" if getattr(run.training_args, "bf16", False) else "float32"
        return cls(
            global_batch_size=run.global_batch_size,
            seq_length=run.seq_length,
            num_replicas=run.num_replicas,
            flops_per_token=fpt,
            peak_flops=known_peak_flops(kind, dtype),
            # hf-tpu train's own log line is the one throughput figure on the terminal (training steps only);
            # this callback still fills the logs and ``summary`` for other callbacks and benchmarks
            log_every=0,
        )
