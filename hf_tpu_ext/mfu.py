"""MFU of one run against one fixed peak (:class:`MFUMeter`): the one meter of both training loops.

FLOPs per token come from :func:`hf_tpu_ext.flops.flops_per_token`, the peak of one replica's device from
:func:`hf_tpu_ext.flops.device_peak` (a datasheet value, or the CPU formula: a hardware property, the same at any
load). MFU is present in every log line or in none, and never above 1: a rate above the peak means the peak is
wrong for this machine, so MFU is left out from then on, said once (:func:`hf_tpu_ext.flops.above_peak_message`).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from hf_tpu_ext import flops

logger = logging.getLogger("hf_tpu_ext")


class MFUMeter:
    """``meter(tokens_per_second) -> MFU fraction or None``; ``meter.summary(rate)`` for the results.

    Args:
        flops_per_token: training FLOPs per token (None: no MFU).
        peak: :class:`hf_tpu_ext.flops.Peak` of one replica.
        replicas: replicas the tokens/s are spread over.
        note: why MFU is left out (None when it is reported).
        log: whether this process logs (the chief).
    """

    def __init__(self, flops_per_token: Optional[float], peak, replicas: int, note: Optional[str] = None,
                 log: bool = True):
        self.flops_per_token, self.peak, self.replicas = flops_per_token, peak, max(1, int(replicas))
        self.note, self.log = note, log

    def __call__(self, tokens_per_second: float) -> Optional[float]:
        """MFU of ``tokens_per_second`` (all replicas' tokens per second), or None (see :attr:`note`)."""
        if self.note is not None:
            return None
        value = flops.compute_mfu(tokens_per_second / self.replicas, self.flops_per_token, self.peak.flops)
        if value is None:  # above the peak: the peak is wrong for this machine; left out from here on, said once
            self.note = flops.above_peak_message(tokens_per_second / self.replicas, self.flops_per_token, self.peak)
            if self.log:
                logger.warning("%s.", self.note)
        return value

    def summary(self, steady_tokens_per_second: float) -> Dict[str, Any]:
        """``mfu`` (of the steady rate), ``mfu_peak_flops``, ``mfu_peak_source``; or ``mfu_note`` (why none)."""
        value = self(steady_tokens_per_second) if steady_tokens_per_second else None
        if value is None:
            return {"mfu_note": self.note or "MFU left out: no training steps were timed"}
        return {"mfu": value, "mfu_peak_flops": self.peak.flops, "mfu_peak_source": self.peak.source}


def make_mfu_meter(flops_per_token: Optional[float], device_kind: str, bf16: bool, replicas: int,
                   is_chief: bool = True, why: Optional[str] = None, per: str = "replica",
                   cpu_devices: int = 1) -> MFUMeter:
    """The run's :class:`MFUMeter`; the chief logs one line saying which peak, or why MFU is left out.

    Args:
        flops_per_token: training FLOPs per token (None or 0: no MFU).
        device_kind: what :func:`hf_tpu_ext.flops.device_peak` looks up (``"CPU"``, a GPU's or TPU's name).
        bf16: the peak of bfloat16 (``--bf16``), else of float32.
        replicas: data-parallel replicas; is_chief: this process logs.
        why: a reason known already to leave MFU out (e.g. the FLOP count failed).
        per: the unit one peak belongs to, in the log line (``"replica"``, ``"device"``).
        cpu_devices: the devices of every process on this host, which split its CPU (they share its peak, see
            :func:`hf_tpu_ext.flops.device_peak`).
    """
    peak = flops.device_peak(device_kind, "bfloat16" if bf16 is True else "float32", cpu_devices=cpu_devices)
    if why is None and not flops_per_token:
        why = "MFU left out: no FLOP count for this model config"
    if why is None and not peak.flops:
        why = f"MFU left out: {peak.source}"
    if is_chief:
        if why:
            logger.info("%s.", why)
        else:
            logger.info("MFU against the peak %.3g FLOP/s per %s (%s).", peak.flops, per, peak.source)
    return MFUMeter(flops_per_token, peak, replicas, note=why, log=is_chief)
