"""Throughput and MFU of a ``Trainer`` run (torch/torch_xla twin of the Keras ``throughput`` callback)."""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any, Dict, Optional

from transformers import TrainerCallback

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.torch import wait_device

#: measured windows the step-time median looks back over: memory stays flat however long the run is
MEDIAN_WINDOW = 10_000

logger = logging.getLogger("hf_tpu_ext")


@register_callback("throughput", framework="torch")
class ThroughputCallback(TrainerCallback):
    """Log samples/s, tokens/s (per replica), median step time and MFU.

    Time is measured in step windows, from one ``on_step_begin`` to the next (the last one ends at
    ``on_train_end``, after the device finished): on an asynchronous XLA device the host waits on the device
    queue, so over many steps the windows add up to device time. Windows of the first ``warmup_steps`` steps
    (tracing and XLA compilation) and windows holding an evaluation or a checkpoint save are left out, as
    the Keras callback times only the train function.

    At every Trainer log (``on_log``) the rates so far are added to the logged dict (so the Trainer's printed
    log line shows them) and to the log entry in ``state.log_history``, and logged to the ``hf_tpu_ext`` logger
    (``samples_per_second``, ``tokens_per_second``, ``tokens_per_second_per_replica``,
    ``step_time_ms_median``; ``model_flops_per_second`` and ``mfu`` when known). After training ``self.summary`` holds the run's numbers.

    Args:
        seq_length: tokens per sequence (``max_seq_length``).
        global_batch_size: sequences per optimizer step over all replicas (default: from the Trainer's
            arguments: per-device batch x processes x gradient accumulation).
        num_replicas: devices the batch is split over (default: ``args.world_size``).
        flops_per_token: training FLOPs per token (default: :func:`hf_tpu_ext.flops.flops_per_token` of the
            model's config, when it is a transformer encoder's).
        peak_flops: peak FLOP/s of one device (default: :func:`hf_tpu_ext.flops.device_peak`: the datasheet peak
            of a known CUDA GPU, the CPU formula on a CPU; MFU is never above 1).
        warmup_steps: optimizer steps not timed at the start of each ``train()``.

    Raises:
        ArgumentError: a size < 1 or ``warmup_steps < 0``.
    """

    def __init__(self, seq_length: int, global_batch_size: Optional[int] = None, num_replicas: Optional[int] = None,
                 flops_per_token: Optional[float] = None, peak_flops: Optional[float] = None, warmup_steps: int = 3):
        from hf_tpu_ext.errors import ArgumentError

        for name, value in (("seq_length", seq_length), ("global_batch_size", global_batch_size),
                            ("num_replicas", num_replicas)):
            if value is not None and int(value) < 1:
                raise ArgumentError(f"ThroughputCallback: {name} must be >= 1, got {value}.")
        if warmup_steps < 0:
            raise ArgumentError(f"ThroughputCallback: warmup_steps must be >= 0, got {warmup_steps}.")
        self.seq_length = int(seq_length)
        self.global_batch_size = int(global_batch_size) if global_batch_size else None
        self.num_replicas = int(num_replicas) if num_replicas else None
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.warmup_steps = int(warmup_steps)
        self.summary: Dict[str, Any] = {}
        self._reset()

    @classmethod
    def from_run(cls, run) -> "ThroughputCallback":
        """Configure from the torch backend's ``RunContext`` (sizes, FLOPs per token, the device's peak)."""
        from hf_tpu_ext.flops import flops_per_token, peak_flops

        fraction = min(1.0, run.max_predictions / run.seq_length) if run.max_predictions else None
        fpt = flops_per_token(run.model_config, run.seq_length, masked_fraction=fraction) if run.model_config else None
        dtype = "bfloat16" if getattr(run.training_args, "bf16", False) else "float32"
        return cls(seq_length=run.seq_length, global_batch_size=run.global_batch_size, num_replicas=run.num_replicas,
                   flops_per_token=fpt, peak_flops=peak_flops(run.device_info.device_kind, dtype))

    def _reset(self):
        self._first_step: Optional[int] = None
        self._win_start: Optional[float] = None
        self._win_step: Optional[int] = None
        self._win_dirty = False
        self._step_times: "deque[float]" = deque(maxlen=MEDIAN_WINDOW)  # seconds per step of the last windows
        self._measured_steps = 0
        self._measured_seconds = 0.0

    def _close_window(self, step: int) -> None:
        if self._win_start is None:
            return
        seconds, steps = time.perf_counter() - self._win_start, step - self._win_step
        if steps > 0 and not self._win_dirty and self._win_step - self._first_step >= self.warmup_steps:
            self._measured_steps += steps
            self._measured_seconds += seconds
            self._step_times.append(seconds / steps)
        self._win_start = None

    def _rates(self, steps: int, seconds: float) -> Dict[str, float]:
        samples = steps * self.global_batch_size / max(seconds, 1e-12)
        rates = {"samples_per_second": samples, "tokens_per_second": samples * self.seq_length,
                 "tokens_per_second_per_replica": samples * self.seq_length / self.num_replicas}
        if self.flops_per_token:
            rates["model_flops_per_second"] = rates["tokens_per_second"] * self.flops_per_token
        if self.flops_per_token and self.peak_flops:
            from hf_tpu_ext.flops import compute_mfu

            mfu = compute_mfu(rates["tokens_per_second_per_replica"], self.flops_per_token, self.peak_flops)
            if mfu is not None:  # never above 1: a rate above the peak leaves MFU out
                rates["mfu"] = mfu
        return rates

    def _median_ms(self) -> Optional[float]:
        if not self._step_times:
            return None
        ordered = sorted(self._step_times)
        mid = len(ordered) // 2
        value = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        return value * 1e3

    def _fill_flops(self, args, model) -> None:
        """FLOPs per token from the model's config; the peak (when not given) of a known CUDA device's datasheet
        or the CPU formula (:func:`hf_tpu_ext.flops.device_peak`)."""
        from hf_tpu_ext.errors import ArgumentError
        from hf_tpu_ext.flops import flops_per_token, peak_flops

        config = getattr(model, "config", None)
        if self.flops_per_token is None and config is not None:
            try:
                self.flops_per_token = flops_per_token(config, self.seq_length)
            except (ArgumentError, AttributeError, TypeError):  # not a transformer encoder config
                pass
        if self.peak_flops is None and model is not None:
            import torch

            try:
                device = next(model.parameters()).device
            except StopIteration:
                return
            dtype = "bfloat16" if getattr(args, "bf16", False) else "float32"
            if device.type == "cuda":
                self.peak_flops = peak_flops(torch.cuda.get_device_name(device), dtype)
            elif device.type == "cpu":
                self.peak_flops = peak_flops("CPU", dtype)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._reset()
        self._fill_flops(args, model)
        self._first_step = int(state.global_step)
        if self.global_batch_size is None:
            self.global_batch_size = args.per_device_train_batch_size * max(1, args.world_size) * args.gradient_accumulation_steps
        if self.num_replicas is None:
            self.num_replicas = max(1, args.world_size)

    def on_step_begin(self, args, state, control, **kwargs):
        self._close_window(int(state.global_step))
        self._win_start, self._win_step, self._win_dirty = time.perf_counter(), int(state.global_step), False

    def on_evaluate(self, args, state, control, **kwargs):
        self._win_dirty = True

    def on_save(self, args, state, control, **kwargs):
        self._win_dirty = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or not self._measured_steps:
            return
        rates = self._rates(self._measured_steps, self._measured_seconds)
        rates["step_time_ms_median"] = self._median_ms()
        rounded = {k: round(v, 6) for k, v in rates.items()}
        # ``logs`` is the dict the Trainer's printer/progress callback shows: it runs after the user's
        # callbacks (the Trainer adds it last), so the figures appear in the printed log line too
        logs.update(rounded)
        entry = state.log_history[-1] if state.log_history else None
        if entry is not None and entry.get("step") == state.global_step and "loss" in entry:
            entry.update(rounded)
        logger.info("step %d: steady %.1f samples/s, %.0f tokens/s (%.0f per replica; steps after warm-up), "
                    "median step %.1f ms%s",
                    state.global_step, rates["samples_per_second"], rates["tokens_per_second"],
                    rates["tokens_per_second_per_replica"], rates["step_time_ms_median"],
                    f", MFU {rates['mfu']:.1%}" if "mfu" in rates else "")

    def on_train_end(self, args, state, control, **kwargs):
        wait_device()  # the last window ends when the device finished its queued steps
        self._close_window(int(state.global_step))
        summary: Dict[str, Any] = {"global_batch_size": self.global_batch_size, "seq_length": self.seq_length,
                                   "num_replicas": self.num_replicas, "warmup_steps": self.warmup_steps,
                                   "flops_per_token": self.flops_per_token, "peak_flops": self.peak_flops,
                                   "steps_measured": self._measured_steps, "seconds_measured": self._measured_seconds}
        if self._measured_steps:
            summary.update(self._rates(self._measured_steps, self._measured_seconds))
            summary["step_time_ms_mean"] = self._measured_seconds / self._measured_steps * 1e3
            summary["step_time_ms_median"] = self._median_ms()
        if "mfu" in summary and not math.isfinite(summary["mfu"]):
            summary.pop("mfu")
        self.summary = summary
