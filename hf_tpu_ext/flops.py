"""FLOP counts and peak FLOP/s, for model FLOPs utilization (MFU).

MFU = achieved model FLOP/s / peak FLOP/s of the hardware, where "model FLOPs" are the FLOPs the model's
math needs (no recomputation counted), as defined in PaLM (Chowdhery et al. 2022, Appendix B). The peak is a
property of the hardware (:func:`device_peak`): a datasheet value for TPUs and GPUs, a stated formula for
CPUs (cores x clock x FLOP per cycle); nothing is measured, so MFU does not move with the machine's load.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Dict, NamedTuple, Optional

from hf_tpu_ext import model_types

logger = logging.getLogger("hf_tpu_ext")


def flops_per_token(config, seq_length: int, masked_fraction: Optional[float] = None) -> float:
    """Training FLOPs (forward + backward) per input token of a transformer encoder masked LM: the count of
    ``config.model_type``'s record (:func:`hf_tpu_ext.model_types.flops_per_token`; every backend reads the same).

    Counting follows Kaplan et al. 2020, "Scaling Laws for Neural Language Models" (Table 1, Sec. 2.1):
    a forward pass costs ``2 N`` FLOPs per token for ``N`` non-embedding parameters plus
    ``2 n_layer n_ctx d`` for attention scores; training (forward + backward) is 3x the forward. With
    PaLM's accounting (Chowdhery et al. 2022, Appendix B) both attention matmuls (``Q K^T`` and ``A V``)
    are counted, giving ``12 n_layer d n_ctx`` per token for training:

    - encoder: ``6 N`` with ``N = n_layer * (4 h^2 + 2 h i)`` (Q/K/V/output projections and the two
      feed-forward matmuls; biases, LayerNorm and softmax are ignored as in both papers) -- a record may count
      its own layers (ModernBERT's GeGLU and local windows);
    - attention: ``12 * n_layer * h * seq_length``;
    - LM head: ``6 * (h^2 + h V)`` (dense transform + vocabulary projection), times ``masked_fraction``
      when the head runs only at masked positions (hf-tpu-ext's trainer), or at every position when
      ``masked_fraction`` is None (the stock ``TFRobertaForMaskedLM`` call).

    Embedding lookups cost no matmul FLOPs and are not counted.

    Args:
        config: a transformers config with ``hidden_size``, ``num_hidden_layers``, ``intermediate_size``
            (default ``4 * hidden_size``; under the record's field name) and ``vocab_size``.
        seq_length: tokens per sequence (the attention context).
        masked_fraction: share of positions the LM head runs at (e.g. ``max_predictions_per_seq /
            seq_length``), in [0, 1]; None for every position.

    Returns:
        FLOPs per token (float). Multiply by tokens/s to get model FLOP/s.

    Raises:
        ArgumentError: ``seq_length < 1`` or ``masked_fraction`` outside [0, 1].
    """
    return model_types.flops_per_token(config, seq_length, masked_fraction)


# ---------------------------------------------------------------------------------------------------------------
# Peak FLOP/s: a property of the hardware, never of the load (MFU must not move with the neighbours' work).
#
# Accelerators: vendor datasheet values, dense math (no 2:4 sparsity), per device as the framework sees it
# (one replica). Sources:
#   - Google Cloud TPU documentation, "TPU versions" / system architecture pages: v2 45 TFLOP/s bf16 per chip
#     (2 cores), v3 123 per chip (2 cores), v4 275 per chip (one megacore device), v5e 197 per chip, v5p 459 per
#     chip (megacore), v6e (Trillium) 918 per chip. On TPUs XLA multiplies float32 in bf16 passes by default,
#     so the bf16 peak applies to both dtypes.
#   - NVIDIA datasheets (their Tensor Core figures are "with sparsity"; dense is half): A100 BF16 312,
#     TF32 156; H100 SXM and H200 SXM BF16 1,979* -> 989.5, TF32 989* -> 494.5; H100 NVL and H200 NVL
#     BF16 1,671* -> 835.5, TF32 835* -> 417.5; H100 PCIe BF16 1,513* -> 756.5, TF32 756* -> 378; HGX B200
#     BF16 4.5 PFLOP/s* -> 2,250, TF32 2.2 PFLOP/s* -> 1,100; L40S BF16 362.05 (733*), TF32 183 (366*); L4 BF16
#     242* -> 121, TF32 120* -> 60; A10 BF16 250* -> 125, TF32 125* -> 62.5; V100 SXM2 125 FP16 Tensor Core,
#     15.7 FP32 (no bf16 units: its fp16 figure is listed). (* = the datasheet's sparse figure.)
#   float32 on NVIDIA Ampere and newer: TensorFlow runs float32 matmuls as TF32 by default, so the TF32
#   figure is the float32 peak.
# CPUs: no datasheet lists a per-dtype peak for every SKU and VM slice, so a stated formula is used instead
# (:func:`cpu_peak`): physical cores usable x clock x FLOP per cycle per core of the widest FMA / bf16
# dot-product units the CPU's feature flags show (:data:`CPU_FLOP_PER_CYCLE`).
# Patterns are matched against the lowercased device kind in order; the first match wins.
_DATASHEET = (
    # (regex, bf16/fp16 FLOP/s, float32 FLOP/s, name)
    (r"v6e|v6 ?lite|tpu v6", 918e12, 918e12, "Cloud TPU v6e (Trillium), per chip"),
    (r"v5p|tpu v5$", 459e12, 459e12, "Cloud TPU v5p, per chip"),
    (r"v5e|v5 ?lite", 197e12, 197e12, "Cloud TPU v5e, per chip"),
    (r"tpu v4", 275e12, 275e12, "Cloud TPU v4, per chip"),
    (r"tpu v3", 61.5e12, 61.5e12, "Cloud TPU v3, per core (2 per chip)"),
    (r"tpu v2", 22.5e12, 22.5e12, "Cloud TPU v2, per core (2 per chip)"),
    (r"b200", 2250e12, 1100e12, "NVIDIA HGX B200"),
    (r"h100 ?pcie", 756.5e12, 378e12, "NVIDIA H100 PCIe"),
    (r"h[12]00 ?nvl", 835.5e12, 417.5e12, "NVIDIA H100/H200 NVL"),
    (r"h100|h200", 989.5e12, 494.5e12, "NVIDIA H100/H200 SXM"),
    (r"a100", 312e12, 156e12, "NVIDIA A100"),
    (r"l40s", 362.05e12, 183e12, "NVIDIA L40S"),
    (r"\bl4\b", 121e12, 60e12, "NVIDIA L4"),
    (r"\ba10\b", 125e12, 62.5e12, "NVIDIA A10"),
    (r"v100", 125e12, 15.7e12, "NVIDIA V100 SXM2 (fp16 Tensor Core)"),
)

_HALF_DTYPES = ("bfloat16", "bf16", "float16", "fp16", "half", "mixed_bfloat16", "mixed_float16")


def _is_half(dtype: str) -> bool:
    return str(dtype).lower() in _HALF_DTYPES


def _datasheet(device_kind: Optional[str]):
    import re

    kind = (device_kind or "").lower().strip()
    if not kind:
        return None
    for pattern, half, single, name in _DATASHEET:
        if re.search(pattern, kind):
            return half, single, name
    return None


def known_peak_flops(device_kind: Optional[str], dtype: str = "bfloat16") -> Optional[float]:
    """Datasheet peak FLOP/s of one TPU/GPU device (one replica), dense math (sources in this module).

    Args:
        device_kind: a device name such as ``"TPU v4"``, ``"TPU v5 lite"``, ``"TPU v5litepod-8"``,
            ``"NVIDIA H100 80GB HBM3"``, ``"NVIDIA A100-SXM4-40GB"``, ``"NVIDIA L4"`` (case-insensitive).
        dtype: the matmul dtype of training: ``"bfloat16"``/``"float16"`` or ``"float32"`` (TF32 peak on
            NVIDIA Ampere+, bf16 peak on TPUs).

    Returns:
        FLOP/s, or None for a device without a datasheet entry (CPUs: see :func:`cpu_peak`).
    """
    found = _datasheet(device_kind)
    if found is None:
        return None
    return found[0] if _is_half(dtype) else found[1]


#: FLOP per cycle per core, from /proc/cpuinfo flags, first match wins: ``(flags all present, float32, bf16
#: or None for "as float32", what)``. An FMA is 2 FLOP. x86 cores are taken to have two FMA pipes of the
#: widest width the flags show (Intel Xeon Scalable Gold/Platinum, Zen 2-5; one-pipe parts read MFU low):
#: AVX-512: 2 x 16 lanes x 2 = 64; AVX2+FMA: 2 x 8 x 2 = 32; AVX (no FMA, separate mul and add ports): 16;
#: SSE2: 8. bf16: AVX512-BF16 ``vdpbf16ps`` does 16 lanes x 2 pairs x 2 FLOP = 64 per instruction, 2 per
#: cycle = 128; Intel AMX-BF16 1,024 (Intel's "1,024 BF16 operations per cycle per core" for Sapphire Rapids).
#: AMD Zen 4 (family 0x19 with AVX-512) runs 512-bit ops on 256-bit pipes: halved, see :func:`cpu_peak`.
#: Arm: NEON 2 x 128-bit FMA pipes (Neoverse N1) = 16; SVE cores (Neoverse V1/V2) 32; ``bf16`` (BFMMLA) twice
#: the float32 rate. Without native bf16 a bf16 run multiplies in float32: the float32 rate applies.
#: The last two fields name the units of each rate: a peak's label names only the units its rate counts.
CPU_FLOP_PER_CYCLE = (
    (("amx_bf16", "avx512f"), 64, 1024, "AVX-512 FMA", "AMX-BF16 tiles"),
    (("avx512_bf16", "avx512f"), 64, 128, "AVX-512 FMA", "AVX512-BF16 dot products"),
    (("avx512f",), 64, None, "AVX-512 FMA", None),
    (("avx2", "fma"), 32, None, "AVX2 FMA", None),
    (("avx",), 16, None, "AVX", None),
    (("sse2",), 8, None, "SSE2", None),
    (("sve", "bf16"), 32, 64, "SVE FMA", "BF16 matrix multiply"),
    (("sve",), 32, None, "SVE FMA", None),
    (("asimd", "bf16"), 16, 32, "NEON FMA", "BF16 matrix multiply"),
    (("asimd",), 16, None, "NEON FMA", None),
)


class Peak(NamedTuple):
    """A device's peak FLOP/s for MFU and where it comes from.

    Attributes:
        flops: FLOP/s of one device (one replica), or None when there is no figure.
        source: one line: how the figure is made (``"NVIDIA A100 datasheet, bf16 dense"``, ``"CPU formula: 2
            cores x 2.45 GHz x 32 FLOP/cycle (AVX2 FMA, float32)"``), or why there is none.
    """

    flops: Optional[float]
    source: str


def _cpuinfo_fields(text: str) -> Dict[str, str]:
    """The first processor block of /proc/cpuinfo as ``{key: value}`` (keys lowercased)."""
    fields: Dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    return fields


def _sysfs_max_clock_hz() -> Optional[float]:
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", encoding="ascii") as f:
            return float(f.read().strip()) * 1e3  # kHz
    except (OSError, ValueError):
        return None


def cpu_peak(dtype: str = "float32", cpuinfo_text: Optional[str] = None, cores: Optional[int] = None,
             clock_hz: Optional[float] = None) -> Peak:
    """Peak FLOP/s of this CPU by formula: physical cores x clock x FLOP per cycle per core.

    - cores: the logical CPUs this process may use (:func:`usable_cpu_cores`) divided by the threads per core
      (``siblings / cpu cores`` in /proc/cpuinfo; SMT threads share one core's FMA pipes);
    - clock: cpufreq's ``cpuinfo_max_freq`` where the kernel has it, else /proc/cpuinfo's ``cpu MHz`` (in a VM
      the nominal clock: a boost above it can make a run beat this peak, then MFU is left out, see
      :func:`compute_mfu`);
    - FLOP per cycle: :data:`CPU_FLOP_PER_CYCLE` for the flags (bf16 rate with a bf16 ``dtype`` where the CPU
      has native bf16, else the float32 rate); AMD family 0x19 (Zen 3/4) with AVX-512 counts 256-bit pipes.

    Nothing is measured, so the figure is the same at any load.

    Args:
        dtype: ``"float32"`` or ``"bfloat16"`` (mixed precision multiplies in bf16).
        cpuinfo_text: /proc/cpuinfo's content (default: read it; tests pass a fixture, and then the clock comes
            from the text, not from cpufreq).
        cores: logical CPUs usable (default :func:`usable_cpu_cores`).
        clock_hz: the clock in Hz (default as above).

    Returns:
        :class:`Peak`; ``flops`` None (and ``source`` saying why) when /proc/cpuinfo is unreadable, has no
        clock, or shows no instruction set in the table.
    """
    read_sysfs = cpuinfo_text is None
    if cpuinfo_text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo_text = f.read()
        except OSError as err:
            return Peak(None, f"no CPU peak: /proc/cpuinfo is unreadable ({err.strerror or err})")
    info = _cpuinfo_fields(cpuinfo_text)
    flags = set((info.get("flags") or info.get("features") or "").split())
    row = next((r for r in CPU_FLOP_PER_CYCLE if all(f in flags for f in r[0])), None)
    if row is None:
        return Peak(None, "no CPU peak: /proc/cpuinfo shows none of the instruction sets the peak formula knows "
                          "(AVX-512, AVX2/FMA, AVX, SSE2, SVE, NEON)")
    _, fp32, bf16, fp32_units, bf16_units = row
    if clock_hz is None:
        clock_hz = _sysfs_max_clock_hz() if read_sysfs else None
        if clock_hz is None:
            try:
                clock_hz = float(info["cpu mhz"]) * 1e6
            except (KeyError, ValueError):
                return Peak(None, "no CPU peak: the kernel reports no CPU clock (no cpufreq, no 'cpu MHz')")
    half = _is_half(dtype) and bf16 is not None
    per_cycle = bf16 if half else fp32
    units = bf16_units if half else fp32_units
    if "avx512f" in flags and info.get("vendor_id") == "AuthenticAMD" and info.get("cpu family") == "25":
        per_cycle //= 2  # Zen 4 executes 512-bit FMAs and bf16 dot products on 256-bit pipes
        units += " on 256-bit pipes"
    logical = int(cores or usable_cpu_cores())
    try:
        threads = max(1, int(info["siblings"]) // max(1, int(info["cpu cores"])))
    except (KeyError, ValueError):
        threads = 1
    physical = max(1, logical // threads)
    flops = physical * clock_hz * per_cycle
    precision = "bf16" if half else ("float32: no native bf16" if _is_half(dtype) else "float32")
    return Peak(flops, f"CPU formula: {physical} core{'s' if physical != 1 else ''} x {clock_hz / 1e9:.3g} GHz x "
                       f"{per_cycle} FLOP/cycle ({units}, {precision})")


def device_peak(device_kind: Optional[str], dtype: str = "float32", *, cpuinfo_text: Optional[str] = None,
                cores: Optional[int] = None, cpu_devices: int = 1) -> Peak:
    """The peak MFU divides by, for one device (one replica): a TPU/GPU datasheet value or the CPU formula.

    Args:
        device_kind: ``"CPU"`` (any name containing "cpu"), a TPU/GPU name (:func:`known_peak_flops`), or None.
        dtype: the compute dtype (``"float32"``, ``"bfloat16"``...).
        cpuinfo_text, cores: passed to :func:`cpu_peak` (tests).
        cpu_devices: the devices the CPU is split into, those of every process on this host
            (``JAX_NUM_CPU_DEVICES`` x the processes here, TensorFlow's logical CPUs): they share its cores, so each
            has the CPU's peak divided by their count (4 simulated devices each given the whole CPU's peak made MFU
            read a quarter of the truth). Ignored for accelerators.

    Returns:
        :class:`Peak` (``flops`` None with the reason in ``source`` for an unknown device).
    """
    kind = (device_kind or "").strip()
    if "cpu" in kind.lower():
        peak = cpu_peak(dtype, cpuinfo_text=cpuinfo_text, cores=cores)
        shared = max(1, int(cpu_devices))
        if peak.flops is None or shared == 1:
            return peak
        return Peak(peak.flops / shared, f"{peak.source}, shared by the {shared} devices on this CPU")
    found = _datasheet(kind)
    if found is not None:
        half = _is_half(dtype)
        what = "bf16" if half else ("TF32" if "nvidia" in found[2].lower() else "float32 (bf16 passes)")
        return Peak(found[0] if half else found[1], f"datasheet: {found[2]}, {what} dense")
    if kind.upper() == "TPU":
        return Peak(None, "no peak: TensorFlow does not name the TPU generation (set TPU_ACCELERATOR_TYPE, "
                          "e.g. v5litepod-8, as Cloud TPU VMs and GKE do)")
    return Peak(None, f"no peak: no datasheet figure for device {kind or 'unknown'!r} in hf_tpu_ext.flops")


def peak_flops(device_kind: Optional[str], dtype: str = "float32") -> Optional[float]:
    """Peak FLOP/s of one device for MFU (:func:`device_peak`): datasheet for TPUs/GPUs, formula for CPUs.

    Returns:
        FLOP/s, or None when the device has no figure (then MFU is left out).
    """
    return device_peak(device_kind, dtype).flops


def compute_mfu(tokens_per_second_per_device: float, flops_per_token: Optional[float],
                peak: Optional[float]) -> Optional[float]:
    """Model FLOPs utilization: ``tokens/s per device x FLOPs per token / peak FLOP/s``, in [0, 1].

    Returns:
        The fraction, or None when either figure is missing or the result is above 1 (more FLOP/s than the
        peak means the peak is wrong for this machine, e.g. a boost clock above the one the kernel reports;
        callers leave MFU out then and say so once).
    """
    if not flops_per_token or not peak or tokens_per_second_per_device is None:
        return None
    value = float(tokens_per_second_per_device) * float(flops_per_token) / float(peak)
    if not math.isfinite(value) or value < 0 or value > 1.0:
        return None
    return value


def above_peak_message(tokens_per_second_per_device: float, flops_per_token: float, peak: Peak) -> str:
    """The one line said when a run computes faster than its peak (MFU left out from then on)."""
    rate = float(tokens_per_second_per_device) * float(flops_per_token)
    return (f"MFU left out: the model FLOP rate {rate:.3g} FLOP/s is above the peak {peak.flops:.3g} FLOP/s "
            f"({peak.source}); the peak is too low for this machine")


def default_device_kind() -> str:
    """A name for the device TensorFlow computes on: the GPU's name, the TPU's, or ``"CPU"``.

    Returns:
        e.g. ``"NVIDIA H100 80GB HBM3"`` (from ``tf.config.experimental.get_device_details``), ``"TPU
        v5litepod-8"`` (TensorFlow does not report the TPU generation: taken from ``TPU_ACCELERATOR_TYPE``,
        which Cloud TPU VMs and GKE set; plain ``"TPU"`` without it), or ``"CPU"``.
    """
    import os

    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        try:
            return str(tf.config.experimental.get_device_details(gpus[0]).get("device_name") or "GPU")
        except Exception:  # details are optional
            return "GPU"
    if tf.config.list_logical_devices("TPU"):
        accelerator_type = os.environ.get("TPU_ACCELERATOR_TYPE", "").strip()
        return f"TPU {accelerator_type}" if accelerator_type else "TPU"
    return "CPU"


def measure_peak_flops(dtype: str = "float32", size: Optional[int] = None, iterations: Optional[int] = None,
                       target_seconds: float = 1.0) -> float:
    """Achievable matmul FLOP/s of the default device, from an XLA-compiled chain of square matmuls.

    What XLA reaches on large matmuls at this moment (benchmarks record it beside MFU). Not MFU's
    denominator: on a shared machine it moves with the neighbours' load (4x between runs was seen).

    Args:
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        size: matrix side ``n`` (default 1024 on CPU, 4096 on accelerators); each matmul is ``2 n^3`` FLOPs.
        iterations: matmuls per timed call (default: chosen so the timed call lasts about
            ``target_seconds``, after one call to compile and warm up).
        target_seconds: wall time aimed at for the timed call, seconds.

    Returns:
        FLOP/s (float) of the timed call.
    """
    import tensorflow as tf

    dt = tf.as_dtype(dtype)
    if size is None:
        size = 1024 if default_device_kind() == "CPU" else 4096
    # scaled so repeated products keep unit magnitude: no overflow, no slow denormals
    a = tf.random.stateless_normal((size, size), seed=(1, 2), dtype=tf.float32) / float(size) ** 0.5
    a, x0 = tf.cast(a, dt), tf.cast(tf.eye(size) + 0.0, dt)

    @tf.function(jit_compile=True)
    def chain(x, n):
        def body(i, y):
            return i + 1, tf.matmul(y, a)

        _, y = tf.while_loop(lambda i, _: i < n, body, (tf.constant(0), x))
        return tf.reduce_sum(tf.cast(y[:1, :8], tf.float32))  # tiny result: the host wait is the sync

    def timed(n: int) -> float:
        start = time.perf_counter()
        chain(x0, tf.constant(n)).numpy()
        return time.perf_counter() - start

    timed(1)  # compile
    if iterations is None:
        probe = max(timed(2) / 2.0, 1e-6)
        iterations = max(2, int(target_seconds / probe))
    seconds = timed(iterations)
    flops = 2.0 * size ** 3 * iterations / seconds
    logger.debug("measured %.3g FLOP/s (%s, n=%d, %d matmuls in %.3f s)", flops, dtype, size, iterations, seconds)
    return flops




def usable_cpu_cores() -> int:
    """CPU cores this process may run on: ``os.sched_getaffinity`` (respects ``taskset`` and container CPU sets),
    ``os.cpu_count()`` where that does not exist; at least 1."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)

