"""Framework-free core of the ``throughput`` callbacks (tf_keras and Keras 3): clock, step counts, rates.

The framework's callback class mixes :class:`ThroughputMeter` in before its ``Callback`` base and may
override :meth:`ThroughputMeter._iterations` (the optimizer step count, or None to count batch indices).
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from typing import Any, Dict, Optional

from hf_tpu_ext.callbacks import read_global_step
from hf_tpu_ext.errors import ArgumentError
from hf_tpu_ext.flops import Peak
from hf_tpu_ext.mfu import MFUMeter
from hf_tpu_ext.step_window import StepWindow, weighted_median

logger = logging.getLogger("hf_tpu_ext")


#: device calls the step-time medians look back over, in windows allocated once (:class:`StepWindow`, 160 KB
#: each): memory stays flat from the first step however long the run is
MEDIAN_WINDOW = 10_000

#: the meter measuring each model's fit (weak keys: a model's meter goes with it), for the push callbacks' cards
_METERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def register_meter(model, meter) -> None:
    """Make ``meter`` (anything with ``card_facts(step)``) the one :func:`card_facts_of` ``model`` reads."""
    if model is None:
        return
    try:
        _METERS[model] = meter
    except TypeError:  # not weak-referenceable / hashable: the card goes without the figures
        pass


def card_facts_of(model, step: Optional[int] = None) -> Dict[str, Any]:
    """What the throughput meter of ``model``'s fit measured so far, as model card fields (empty without one).

    Read by a push callback at its save, whatever the order of the callbacks (see :meth:`ThroughputMeter.card_facts`).
    """
    try:
        meter = _METERS.get(model)
    except TypeError:  # an unhashable model object: no meter can be registered for it
        return {}
    return meter.card_facts(step) if meter is not None else {}


class ThroughputMeter:
    """Samples/s, tokens/s, median step time and MFU from Keras batch hooks (see the framework classes).

    Rates: batch logs carry the last call's rate; epoch logs the median step of the epoch's steps after warm-up;
    the periodic log line, ``summary`` and the card the steady rate: tokens per step over the median step time of
    the calls after ``warmup_steps`` (time inside train-batch calls only: ``summary["rate"]`` says so).
    MFU divides by one peak for the whole fit (``peak_flops``, or the device's from :meth:`_device_peak` at
    train begin: a datasheet value or the CPU formula of :mod:`hf_tpu_ext.flops`, never a load-dependent
    probe); it is never above 1: a rate above the peak leaves MFU out from then on, said once
    (``summary["mfu_note"]``).
    """

    def __init__(self, global_batch_size: int, seq_length: int, num_replicas: int = 1,
                 flops_per_token: Optional[float] = None, peak_flops: Optional[float] = None,
                 peak_dtype: str = "float32", warmup_steps: int = 2, log_every: int = 100):
        super().__init__()

        for name, value in (("global_batch_size", global_batch_size), ("seq_length", seq_length),
                            ("num_replicas", num_replicas)):
            if int(value) < 1:
                raise ArgumentError(f"{type(self).__name__}: {name} must be >= 1, got {value}.")
        if warmup_steps < 0:
            raise ArgumentError(f"{type(self).__name__}: warmup_steps must be >= 0, got {warmup_steps}.")
        self.global_batch_size = int(global_batch_size)
        self.seq_length = int(seq_length)
        self.num_replicas = int(num_replicas)
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.peak_source = "given (peak_flops)" if peak_flops else None
        self.mfu_note: Optional[str] = None
        self.peak_dtype = peak_dtype
        self.warmup_steps = int(warmup_steps)
        self.log_every = int(log_every or 0)
        self.summary: Dict[str, Any] = {}
        self._supports_tf_logs = True  # we never read the logs: do not force a host copy of them
        self._reset_run()

    # ------------------------------------------------------------------ state
    def _reset_run(self):
        # (seconds per step, steps) of the last MEDIAN_WINDOW calls after warm-up; the totals cover the whole run
        if getattr(self, "_calls", None) is None:
            self._calls = StepWindow(MEDIAN_WINDOW)
        else:  # emptied, not allocated again
            self._calls.clear()
        self._measured_steps = 0
        self._measured_seconds = 0.0
        self._all_steps = 0
        self._all_seconds = 0.0
        self._reset_epoch()
        self._fit_steps = 0
        self._t0 = None
        self._wall_t0 = None
        self._last_iterations = None
        self._next_log = None

    def _reset_epoch(self):
        self._epoch_steps = self._epoch_seconds = 0
        self._epoch_all_steps = self._epoch_all_seconds = 0
        # the epoch's window is emptied, not allocated again, at each epoch
        if getattr(self, "_epoch_calls", None) is None:
            self._epoch_calls = StepWindow(MEDIAN_WINDOW)
        else:
            self._epoch_calls.clear()

    def _iterations(self) -> Optional[int]:
        return read_global_step(self.model)  # one scalar read; waits for the call's steps to finish

    def _rates(self, steps: int, seconds: float) -> Dict[str, float]:
        samples = steps * self.global_batch_size / max(seconds, 1e-12)
        tokens = samples * self.seq_length
        rates = {
            "samples_per_second": samples,
            "tokens_per_second": tokens,
            "tokens_per_second_per_replica": tokens / self.num_replicas,
        }
        if self.flops_per_token and self.peak_flops and self.mfu_note is None:
            # the training loops' meter: above the peak, MFU is left out from here on, said once
            meter = MFUMeter(self.flops_per_token, Peak(self.peak_flops, self.peak_source or "given"),
                             self.num_replicas)
            mfu = meter(tokens)
            if mfu is None:
                self.mfu_note = meter.note
            else:
                rates["mfu"] = mfu
        return rates

    def _steady_rates(self) -> Dict[str, float]:
        """Rates of the median step after warm-up (``hf-tpu train``'s steady definition: tokens per step over the
        median step time of the last calls; the mean since warm-up where no call is recorded)."""
        median = weighted_median(self._calls)
        if median is None:
            return self._rates(self._measured_steps, self._measured_seconds)
        return self._rates(1, median)

    def _device_peak(self):
        """The device's :class:`hf_tpu_ext.flops.Peak` for ``peak_dtype`` (None: unknown; frameworks override)."""
        return None

    def _meter_model(self):
        return getattr(self, "_model", None) or getattr(self, "model", None)  # Keras 3's property syncs on JAX

    def card_facts(self, step: Optional[int] = None) -> Dict[str, Any]:
        """The card fields of this fit so far: ``global_batch_size``, ``tokens_seen`` (``step`` x global batch x
        ``seq_length``; this fit's steps without ``step``), ``train_tokens_per_second`` (this fit's tokens over its
        wall time since train begin), ``steady_tokens_per_second`` (steps after warm-up), ``mfu`` with
        ``mfu_peak_flops`` and ``mfu_peak_source``, or ``mfu_note`` (why not); ``flops_per_token`` (training FLOPs)
        when known."""
        per_step = self.global_batch_size * self.seq_length
        facts: Dict[str, Any] = {"global_batch_size": self.global_batch_size, "num_replicas": self.num_replicas}
        if self.flops_per_token:
            facts["flops_per_token"] = float(self.flops_per_token)
        steps = int(step) if step is not None else self._all_steps
        if steps:
            facts["tokens_seen"] = steps * per_step
        if self._all_steps and self._wall_t0 is not None:
            facts["train_tokens_per_second"] = self._all_steps * per_step / max(time.perf_counter() - self._wall_t0, 1e-9)
        if self._measured_steps:
            rates = self._steady_rates()
            facts["steady_tokens_per_second"] = rates["tokens_per_second"]
            if "mfu" in rates:
                facts.update(mfu=rates["mfu"], mfu_peak_flops=self.peak_flops, mfu_peak_source=self.peak_source)
        if "mfu" not in facts:
            facts["mfu_note"] = self.mfu_note or ("MFU left out: no FLOPs per token" if not self.flops_per_token else
                                                  "MFU left out: no peak FLOP/s for this device" if not self.peak_flops
                                                  else "MFU left out: no step after warm-up measured yet")
        return facts

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, logs=None):
        if self.peak_flops is None:
            peak = self._device_peak()
            if peak is not None and peak.flops:
                self.peak_flops, self.peak_source = peak.flops, peak.source
            elif peak is not None:
                self.mfu_note = f"MFU left out: {peak.source}"
        self._reset_run()  # summary and medians cover one fit / one training run
        self._last_iterations = self._iterations()
        self._wall_t0 = time.perf_counter()
        register_meter(self._meter_model(), self)

    def on_epoch_begin(self, epoch, logs=None):
        self._reset_epoch()

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_begin = batch
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._t0 is None:
            return
        now = self._iterations()
        seconds = time.perf_counter() - self._t0
        if now is not None and self._last_iterations is not None:
            steps = now - self._last_iterations
        else:  # no optimizer: Keras passes the first and last batch index of the call
            steps = int(batch) - int(self._batch_begin) + 1
        self._last_iterations = now
        self._t0 = None
        if steps <= 0:
            return
        in_warmup = self._fit_steps < self.warmup_steps
        self._fit_steps += steps
        self._all_steps += steps
        self._all_seconds += seconds
        self._epoch_all_steps += steps
        self._epoch_all_seconds += seconds
        if not in_warmup:
            self._calls.append((seconds / steps, steps))
            self._epoch_calls.append((seconds / steps, steps))
            self._measured_steps += steps
            self._measured_seconds += seconds
            self._epoch_steps += steps
            self._epoch_seconds += seconds
        if logs is not None:
            logs.update(self._rates(steps, seconds))
        if now is None:  # no optimizer step to read: steps counted in this fit
            now = self._fit_steps
        if self.log_every:
            if self._next_log is None:
                self._next_log = (now // self.log_every + 1) * self.log_every
            if now >= self._next_log:
                self._next_log = (now // self.log_every + 1) * self.log_every
                median = weighted_median(self._calls)
                if logs is not None and median is not None:
                    logs["step_time_ms_median"] = median * 1e3
                rates = self._steady_rates() if self._measured_steps else self._rates(steps, seconds)
                logger.info(
                    "step %d: steady %.1f samples/s, %.0f tokens/s (%.0f per replica; steps after warm-up), "
                    "median step %.1f ms%s",
                    now, rates["samples_per_second"], rates["tokens_per_second"], rates["tokens_per_second_per_replica"],
                    (median or seconds / steps) * 1e3, f", MFU {rates['mfu']:.1%}" if "mfu" in rates else "",
                )

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        if self._epoch_steps:  # the epoch's median step: a save or push inside a batch hook does not drag it down
            median = weighted_median(self._epoch_calls)
            logs.update(self._rates(1, median) if median is not None else self._rates(self._epoch_steps, self._epoch_seconds))
            logs["step_time_ms_median"] = (median if median is not None else self._epoch_seconds / self._epoch_steps) * 1e3
        elif self._epoch_all_steps:  # only warm-up steps in this epoch: report them rather than nothing
            logs.update(self._rates(self._epoch_all_steps, self._epoch_all_seconds))
            logs["step_time_ms_median"] = self._epoch_all_seconds / self._epoch_all_steps * 1e3

    def on_train_end(self, logs=None):
        steps, seconds = (self._measured_steps, self._measured_seconds) if self._measured_steps else (
            self._all_steps, self._all_seconds)
        summary: Dict[str, Any] = {
            "global_batch_size": self.global_batch_size,
            "seq_length": self.seq_length,
            "num_replicas": self.num_replicas,
            "warmup_steps": self.warmup_steps,
            "steps_measured": steps,
            "seconds_measured": seconds,
            "flops_per_token": self.flops_per_token,
            "peak_flops": self.peak_flops,
            "peak_flops_source": self.peak_source,
            "rate": ("steady: median step after warm-up, time inside train-batch calls" if self._measured_steps
                     else "all steps (none after warm-up)"),
        }
        if steps:
            summary.update(self._steady_rates() if self._measured_steps else self._rates(steps, seconds))
            median = weighted_median(self._calls)
            summary["step_time_ms_median"] = (median if median is not None else seconds / steps) * 1e3
            summary["step_time_ms_mean"] = seconds / steps * 1e3
        if "mfu" in summary and not math.isfinite(summary["mfu"]):
            summary.pop("mfu")
        if "mfu" not in summary:
            summary["mfu_note"] = self.mfu_note or ("MFU left out: no FLOPs per token" if not self.flops_per_token
                                                    else "MFU left out: no peak FLOP/s for this device")
        self.summary = summary
