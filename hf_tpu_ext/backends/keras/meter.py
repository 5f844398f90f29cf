"""What the Keras backend's loop measures: the logging window, the training loss, step times, MFU.

The logging window (loss sum and step count since the last log entry) and the figures only the training process
measures (``fit_metrics``: steady tokens/s, MFU, first step, compilations) are written with every checkpoint
(``checkpoint.json`` ``loss_window``, ``fit_metrics``; :meth:`LoopMeter.checkpoint_fields`), so a run resumed off a
logging boundary logs the mean over the same steps as an uninterrupted run, and a resume that only finishes the
export still reports what the training process measured (the TensorFlow backend keeps the same window in its
``ckpt-N.json`` sidecar).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from typing import Any, Callable, Dict, List, Optional, Sequence

logger = logging.getLogger("hf_tpu_ext")

#: per-step times kept for the steady rate (the last ones only: memory stays flat however long the run is)
STEADY_WINDOW = 10_000


def restored_loss_window(meta: Dict[str, Any], step: int):
    """``(loss sum, steps)`` of the logging window a checkpoint's ``checkpoint.json`` ``meta`` kept at ``step``;
    ``(0.0, 0)`` for another step or a checkpoint written before the window was kept."""
    window = (meta or {}).get("loss_window") or {}
    if step > 0 and int((meta or {}).get("global_step", -1)) == int(step) and int(window.get("steps", 0)) > 0:
        return float(window["loss_sum"]), int(window["steps"])
    return 0.0, 0


class LoopMeter:
    """Loss sums and step times of one ``fit`` (one process's segment of the run).

    Args:
        tokens_per_step: global batch x sequence length (tokens per optimizer step).
        window: ``(loss sum, steps)`` of the logging window restored with the checkpoint (see the module doc).
    """

    def __init__(self, tokens_per_step: int, window=(0.0, 0)):
        self.tokens_per_step = int(tokens_per_step)
        self.window_loss, self.window_n = float(window[0]), int(window[1])
        self.train_loss_sum, self.train_loss_n = 0.0, 0
        self.window_times: List[float] = []  # seconds per step since the last log entry
        self.steady: "deque[float]" = deque(maxlen=STEADY_WINDOW)
        self.first_step: Optional[float] = None  # seconds of the first call (tracing + compilation), whatever N
        self.steps_run = 0
        self.tokens_per_second: Optional[float] = None
        self.t_start = time.perf_counter()

    def add(self, losses: Sequence[float], seconds: float) -> None:
        """One device call of ``len(losses)`` optimizer steps that took ``seconds`` (the per-step mean losses)."""
        n = len(losses)
        per_step = seconds / max(n, 1)
        if self.first_step is None:  # the run's first call is left out of the rates when later calls exist
            self.first_step = float(seconds)  # its wall time is the first step's: N=4 is not a quarter of it
        else:
            self.window_times += [per_step] * n
            self.steady.extend([per_step] * n)
        total = float(sum(losses))
        self.steps_run += n
        self.train_loss_sum += total
        self.train_loss_n += n
        self.window_loss += total
        self.window_n += n

    def log_entry(self, step: int, learning_rate: float, epoch: float, mfu_of: Callable) -> Dict[str, Any]:
        """The log entry at ``step`` (the window's mean loss, tokens/s of its median step, MFU); resets the window.
        Only the first (compiling) call in the window: no ``tokens_per_second``/``mfu`` (no steady step yet)."""
        entry = {"loss": round(self.window_loss / max(self.window_n, 1), 6), "learning_rate": learning_rate,
                 "epoch": round(epoch, 4), "step": step}
        if self.window_times:
            self.tokens_per_second = round(self.tokens_per_step / max(statistics.median(self.window_times), 1e-9), 1)
            entry["tokens_per_second"] = self.tokens_per_second
            mfu = mfu_of(self.tokens_per_second)
            if mfu is not None:
                entry["mfu"] = round(mfu, 4)
        self.window_loss, self.window_n, self.window_times = 0.0, 0, []
        return entry

    def steady_rate(self) -> float:
        """Tokens per median training step (0.0 before any step)."""
        if self.first_step is None:
            return 0.0
        if not self.steady:  # only the first call: its steps' mean (compilation included)
            return self.tokens_per_step * self.steps_run / max(self.first_step, 1e-9)
        return self.tokens_per_step / max(statistics.median(self.steady), 1e-9)

    def fit_metrics(self, step: int, steps_per_epoch: int, global_batch_size: int, mfu_of: Callable,
                    compilations: int, compile_seconds: float) -> Dict[str, Any]:
        """The segment's figures ``fit`` returns (``train_loss``, rates, ``steady_tokens_per_second``, MFU, ...)."""
        runtime = time.perf_counter() - self.t_start
        steady = self.steady_rate()
        return {
            **mfu_of.summary(steady),
            "train_loss": self.train_loss_sum / max(self.train_loss_n, 1),
            "train_runtime": runtime,
            "train_steps_per_second": self.steps_run / max(runtime, 1e-9),
            "train_samples_per_second": self.steps_run * global_batch_size / max(runtime, 1e-9),
            "train_tokens_per_second": self.steps_run * self.tokens_per_step / max(runtime, 1e-9),
            # tokens per median training step (the figure the log lines show); train_*_per_second above are the
            # segment's wall-time rates (transformers' meaning)
            "steady_tokens_per_second": steady,
            "first_step_seconds": self.first_step,
            "global_step": step,
            "epoch": step / steps_per_epoch,
            "tokens_seen": step * self.tokens_per_step,
            # XLA compilations of the train step in this segment (1 = compiled once)
            "xla_step_compilations": int(compilations),
            "xla_step_compile_seconds": round(float(compile_seconds), 3),
        }

    def checkpoint_fields(self, fit_metrics: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """``checkpoint.json`` fields: ``loss_window`` and (once a step was timed) ``fit_metrics`` (JSON numbers and
        strings only)."""
        fields: Dict[str, Any] = {"loss_window": {"loss_sum": float(self.window_loss), "steps": int(self.window_n)}}
        if fit_metrics and self.first_step is not None:
            fields["fit_metrics"] = {k: v for k, v in fit_metrics.items()
                                     if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        return fields


def make_mfu_function(flops_per_token: Optional[float], accelerator: str, device_kind: str, bf16: bool,
                      num_replicas: int, is_chief: bool) -> Callable:
    """``mfu_of(tokens_per_second) -> fraction or None`` with ``mfu_of.summary(rate)``, as the TensorFlow
    backend: FLOPs per token of :func:`hf_tpu_ext.flops.flops_per_token` (LM head at the masked positions),
    the peak of one device from :func:`hf_tpu_ext.flops.device_peak` (datasheet, or the CPU formula)."""
    from hf_tpu_ext.flops import above_peak_message, compute_mfu, device_peak

    fpt = flops_per_token
    kind = "CPU" if accelerator == "CPU" else device_kind
    peak = device_peak(kind, "bfloat16" if bf16 is True else "float32")
    note = {"why": None if fpt else "MFU left out: no FLOP count for this model config"}
    if note["why"] is None and not peak.flops:
        note["why"] = f"MFU left out: {peak.source}"
    if is_chief:
        if note["why"]:
            logger.info("%s.", note["why"])
        else:
            logger.info("MFU against the peak %.3g FLOP/s per device (%s).", peak.flops, peak.source)

    def mfu_of(tokens_per_second):
        if note["why"] is not None:
            return None
        value = compute_mfu(tokens_per_second / num_replicas, fpt, peak.flops)
        if value is None:  # above the peak: said once, left out from then on
            note["why"] = above_peak_message(tokens_per_second / num_replicas, fpt, peak)
            if is_chief:
                logger.warning("%s.", note["why"])
        return value

    def summary(steady_tokens_per_second):
        """``mfu``, ``mfu_peak_flops``, ``mfu_peak_source`` of the steady rate; or ``mfu_note`` (why none)."""
        value = mfu_of(steady_tokens_per_second) if steady_tokens_per_second else None
        if value is None:
            return {"mfu_note": note["why"] or "MFU left out: no training steps were timed"}
        return {"mfu": value, "mfu_peak_flops": peak.flops, "mfu_peak_source": peak.source}

    mfu_of.summary = summary
    return mfu_of
