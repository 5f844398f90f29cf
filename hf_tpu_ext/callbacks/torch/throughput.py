"""Throughput and MFU of a ``Trainer`` run (torch/torch_xla twin of the Keras ``throughput`` callback)."""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any, Dict, Optional

from transformers import TrainerCallback

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.throughput_meter import register_meter
from hf_tpu_ext.callbacks.torch import wait_device
from hf_tpu_ext.errors import ArgumentError
from hf_tpu_ext.flops import Peak, device_peak, flops_per_token, peak_flops
from hf_tpu_ext.mfu import MFUMeter

#: measured windows the step-time median looks back over: memory stays flat however long the run is
MEDIAN_WINDOW = 10_000

logger = logging.getLogger("hf_tpu_ext")


def _device_type(model) -> Optional[str]:
    try:
        return next(model.parameters()).device.type
    except (StopIteration, AttributeError, TypeError):
        return None


@register_callback("throughput", framework="torch")
class ThroughputCallback(TrainerCallback):
    """Log samples/s, tokens/s (per replica), median step time and MFU.

    Time is measured in step windows, from one ``on_step_begin`` to the next (the last one ends at
    ``on_train_end``, after the device finished): on an asynchronous XLA device the host waits on the device
    queue, so over many steps the windows add up to device time. Windows of the first ``warmup_steps`` steps
    (tracing and XLA compilation) and windows holding an evaluation or a checkpoint save are left out, as
    the Keras callback times only the train function.

    Tokens are real tokens (``count_tokens="attention_mask"``, the default): a forward pre-hook on the model sums
    each training batch's ``attention_mask`` (``input_ids.numel()`` for a batch without one) into a device
    tensor, read on the host only at a log, so a collator that pads to the batch's longest line does not
    inflate tokens/s and MFU. ``count_tokens="seq_length"`` counts ``seq_length`` per sequence instead (right for
    full blocks, as ``hf-tpu train`` feeds; no device op). Under several processes each one counts its own
    batches: ``tokens_per_second`` is this process's rate x ``num_replicas``. On an XLA device tokens are counted
    as ``seq_length`` per sequence (a count on the device would add to the step's compiled graph; XLA batches
    have static shapes).

    Rates are steady rates of the median step, ``hf-tpu train``'s definition: the median of the measured windows'
    seconds per step, and the mean (real) tokens and sequences per measured step; ``summary["step_time_ms_mean"]``
    is the mean beside it. MFU is :class:`hf_tpu_ext.mfu.MFUMeter`'s (one peak for the run, never above 1).
    At every Trainer log (``on_log``) the rates so far are added to the logged dict and to the log entry in
    ``state.log_history`` (``samples_per_second``, ``tokens_per_second``, ``tokens_per_second_per_replica``,
    ``step_time_ms_median``; ``model_flops_per_second`` and ``mfu`` when known): the Trainer's printed log line
    is the one line that shows them; ``log_line=True`` logs a line to the ``hf_tpu_ext`` logger instead, for a
    Trainer whose printer is removed (``hf-tpu train --backend torch_xla --disable_tqdm true``). After training
    ``self.summary`` holds the run's numbers (``tokens_counted`` says how tokens were counted).

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
        count_tokens: ``"attention_mask"`` (real tokens, as above) or ``"seq_length"`` (every position).
        log_line: also log the figures as a line of their own (see above).

    Raises:
        ArgumentError: a size < 1, ``warmup_steps < 0`` or another ``count_tokens``.
    """

    def __init__(self, seq_length: int, global_batch_size: Optional[int] = None, num_replicas: Optional[int] = None,
                 flops_per_token: Optional[float] = None, peak_flops: Optional[float] = None, warmup_steps: int = 3,
                 count_tokens: str = "attention_mask", log_line: bool = False):
        for name, value in (("seq_length", seq_length), ("global_batch_size", global_batch_size),
                            ("num_replicas", num_replicas)):
            if value is not None and int(value) < 1:
                raise ArgumentError(f"ThroughputCallback: {name} must be >= 1, got {value}.")
        if warmup_steps < 0:
            raise ArgumentError(f"ThroughputCallback: warmup_steps must be >= 0, got {warmup_steps}.")
        if count_tokens not in ("attention_mask", "seq_length"):
            raise ArgumentError(f"ThroughputCallback: count_tokens must be 'attention_mask' or 'seq_length', got "
                                f"{count_tokens!r}.")
        self.count_tokens, self.log_line = count_tokens, bool(log_line)
        self._hook = None
        self.seq_length = int(seq_length)
        self.global_batch_size = int(global_batch_size) if global_batch_size else None
        self.num_replicas = int(num_replicas) if num_replicas else None
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.peak_source = "given (peak_flops)" if peak_flops else None
        self.warmup_steps = int(warmup_steps)
        self.summary: Dict[str, Any] = {}
        self._mfu = None
        self._reset()

    @classmethod
    def from_run(cls, run) -> "ThroughputCallback":
        """Configure from the torch backend's ``RunContext`` (sizes, FLOPs per token, the device's peak)."""
        fraction = min(1.0, run.max_predictions / run.seq_length) if run.max_predictions else None
        fpt = flops_per_token(run.model_config, run.seq_length, masked_fraction=fraction) if run.model_config else None
        dtype = run.compute_dtype
        # hf-tpu train's batches are full blocks: every position is a real token, and no device op is added;
        # with --disable_tqdm the backend removes the Trainer's printer, so this callback's line is the one
        return cls(seq_length=run.seq_length, global_batch_size=run.global_batch_size, num_replicas=run.num_replicas,
                   flops_per_token=fpt, peak_flops=peak_flops(run.device_info.device_kind, dtype),
                   count_tokens="seq_length", log_line=bool(getattr(run.training_args, "disable_tqdm", False)))

    def _reset(self):
        self._first_step: Optional[int] = None
        self._win_start: Optional[float] = None
        self._win_step: Optional[int] = None
        self._win_dirty = False
        self._step_times: "deque[float]" = deque(maxlen=MEDIAN_WINDOW)  # seconds per step of the last windows
        self._measured_steps = 0
        self._measured_seconds = 0.0
        self._win_tokens: Any = 0  # int, or a device tensor once a batch with an attention_mask was counted
        self._measured_tokens: Any = 0
        self._tokens_seen = 0  # batches the hook counted (0: fall back to seq_length per sequence)
        self._all_steps, self._all_tokens = 0, 0  # every step of this train() call (warm-up, evaluations too)
        self._wall_t0: Optional[float] = None

    def _count_tokens(self, module, args, kwargs) -> None:
        """Forward pre-hook: add a training batch's real tokens to the window (eval forwards are not counted)."""
        if not module.training:
            return
        mask = kwargs.get("attention_mask")
        ids = kwargs.get("input_ids", args[0] if args else None)
        if mask is not None:
            self._win_tokens = self._win_tokens + mask.detach().sum()
        elif ids is not None and hasattr(ids, "numel"):
            self._win_tokens = self._win_tokens + int(ids.numel())
        else:
            return
        self._tokens_seen += 1

    def _close_window(self, step: int) -> None:
        if self._win_start is None:
            return
        seconds, steps = time.perf_counter() - self._win_start, step - self._win_step
        self._all_steps += max(steps, 0)
        self._all_tokens = self._all_tokens + self._win_tokens
        if steps > 0 and not self._win_dirty and self._win_step - self._first_step >= self.warmup_steps:
            self._measured_steps += steps
            self._measured_seconds += seconds
            self._step_times.append(seconds / steps)
            self._measured_tokens = self._measured_tokens + self._win_tokens  # on the device: no host read
        self._win_start = None
        self._win_tokens = 0

    def _real_tokens(self) -> bool:
        return self.count_tokens == "attention_mask" and self._tokens_seen > 0

    def _tokens_per_step(self, steps: int, tokens) -> float:
        """All replicas' tokens per optimizer step: real tokens counted (one host read), else ``seq_length`` each."""
        if self._real_tokens():
            return float(tokens) * self.num_replicas / max(steps, 1)
        return float(self.global_batch_size * self.seq_length)

    def _rates(self) -> Dict[str, float]:
        """The steady rates: per measured step (mean tokens and sequences) over the median step time."""
        seconds = max(self._median_ms() / 1e3, 1e-12)
        tokens = self._tokens_per_step(self._measured_steps, self._measured_tokens) / seconds
        rates = {"samples_per_second": self.global_batch_size / seconds, "tokens_per_second": tokens,
                 "tokens_per_second_per_replica": tokens / self.num_replicas}
        if self.flops_per_token:
            rates["model_flops_per_second"] = tokens * self.flops_per_token
        mfu = self._mfu(tokens) if self._mfu is not None else None
        if mfu is not None:  # never above 1: a rate above the peak leaves MFU out (the meter says it once)
            rates["mfu"] = mfu
        return rates

    def _make_mfu_meter(self):
        """The run's :class:`~hf_tpu_ext.mfu.MFUMeter` (with a note, and no MFU, when a figure is missing)."""
        note = ("MFU left out: no FLOPs per token" if not self.flops_per_token else
                "MFU left out: no peak FLOP/s for this device" if not self.peak_flops else None)
        return MFUMeter(self.flops_per_token, Peak(self.peak_flops, self.peak_source or "peak_flops as given"),
                        self.num_replicas, note=note)

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
            kind = {"cuda": lambda: torch.cuda.get_device_name(device), "cpu": lambda: "CPU"}.get(device.type)
            if kind is not None:
                peak = device_peak(kind(), dtype)
                self.peak_flops, self.peak_source = peak.flops, peak.source

    def card_facts(self, step=None) -> Dict[str, Any]:
        """The model card fields measured so far (read by the push callback at a save, in any callback order):
        ``global_batch_size``, ``num_replicas``, ``tokens_seen`` (real tokens of this ``train()`` call, all
        replicas; a resumed run's count is extrapolated to ``step`` at this call's tokens per step),
        ``train_tokens_per_second`` (those tokens over the wall time since train begin),
        ``steady_tokens_per_second`` (of the median step), ``mfu`` with ``mfu_peak_flops`` and
        ``mfu_peak_source`` (or ``mfu_note``: why not)."""
        facts: Dict[str, Any] = {"global_batch_size": self.global_batch_size, "num_replicas": self.num_replicas}
        steps, tokens = self._all_steps, self._all_tokens
        if self._win_start is not None:  # the step in flight (a save or the train end before its window closed)
            tokens = tokens + self._win_tokens
            if step is not None and self._first_step is not None:
                steps = max(steps, int(step) - self._first_step)
        if steps:
            seen = self._tokens_per_step(steps, tokens) * steps
            facts["train_tokens_per_second"] = seen / max(time.perf_counter() - self._wall_t0, 1e-9)
            if step is not None and self._first_step:  # resumed: the earlier steps at this call's tokens per step
                seen = seen / steps * int(step)
            facts["tokens_seen"] = int(round(seen))
        rates = self._rates() if self._measured_steps else {}
        if rates:
            facts["steady_tokens_per_second"] = rates["tokens_per_second"]
        if self._mfu is not None:
            facts.update(self._mfu.summary(rates.get("tokens_per_second") or 0.0))
        else:
            facts["mfu_note"] = "MFU left out: not measured"
        return {k: v for k, v in facts.items() if v is not None}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._reset()
        register_meter(model, self)  # the push callback's card reads card_facts()
        self._fill_flops(args, model)
        self._remove_hook()
        if self.count_tokens == "attention_mask" and model is not None and hasattr(model, "register_forward_pre_hook") \
                and _device_type(model) != "xla":
            self._hook = model.register_forward_pre_hook(self._count_tokens, with_kwargs=True)
        self._first_step = int(state.global_step)
        if self.global_batch_size is None:
            self.global_batch_size = args.per_device_train_batch_size * max(1, args.world_size) * args.gradient_accumulation_steps
        if self.num_replicas is None:
            self.num_replicas = max(1, args.world_size)
        self._mfu = self._make_mfu_meter()
        self._wall_t0 = time.perf_counter()

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
        rates = self._rates()
        rates["step_time_ms_median"] = self._median_ms()
        rounded = {k: round(v, 6) for k, v in rates.items()}
        # ``logs`` is the dict the Trainer's printer/progress callback shows: it runs after the user's
        # callbacks (the Trainer adds it last), so the figures appear in the printed log line too
        logs.update(rounded)
        entry = state.log_history[-1] if state.log_history else None
        if entry is not None and entry.get("step") == state.global_step and "loss" in entry:
            entry.update(rounded)
        if self.log_line:  # else the Trainer's printed log line is the one throughput line
            logger.info("step %d: steady %.1f samples/s, %.0f tokens/s (%.0f per replica; steps after warm-up), "
                        "median step %.1f ms%s", state.global_step, rates["samples_per_second"],
                        rates["tokens_per_second"], rates["tokens_per_second_per_replica"],
                        rates["step_time_ms_median"], f", MFU {rates['mfu']:.1%}" if "mfu" in rates else "")

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def on_train_end(self, args, state, control, **kwargs):
        wait_device()  # the last window ends when the device finished its queued steps
        self._close_window(int(state.global_step))
        self._remove_hook()
        summary: Dict[str, Any] = {"global_batch_size": self.global_batch_size, "seq_length": self.seq_length,
                                   "num_replicas": self.num_replicas, "warmup_steps": self.warmup_steps,
                                   "flops_per_token": self.flops_per_token, "peak_flops": self.peak_flops,
                                   "steps_measured": self._measured_steps, "seconds_measured": self._measured_seconds,
                                   "tokens_counted": ("real tokens (attention_mask sum)" if self._real_tokens()
                                                      else "seq_length per sequence")}
        if self._real_tokens():
            summary["tokens_measured"] = int(self._measured_tokens)
        if self._all_steps:
            facts = self.card_facts()
            summary.update(tokens_seen=facts["tokens_seen"], train_tokens_per_second=facts["train_tokens_per_second"])
        if self._measured_steps:
            summary.update(self._rates())
            summary["step_time_ms_mean"] = self._measured_seconds / self._measured_steps * 1e3
            summary["step_time_ms_median"] = self._median_ms()
        if "mfu" in summary and not math.isfinite(summary["mfu"]):
            summary.pop("mfu")
        self.summary = summary
