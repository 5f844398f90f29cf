"""FLOP counts and peak FLOP/s, for model FLOPs utilization (MFU).

MFU = achieved model FLOP/s / peak FLOP/s of the hardware, where "model FLOPs" are the FLOPs the model's
math needs (no recomputation counted), as defined in PaLM (Chowdhery et al. 2022, Appendix B).
"""

from __future__ import annotations

import logging
import time
from typing import Optional

logger = logging.getLogger("hf_tpu_ext")


def flops_per_token(config, seq_length: int, masked_fraction: Optional[float] = None) -> float:
    """Training FLOPs (forward + backward) per input token of a transformer encoder masked LM.

    Counting follows Kaplan et al. 2020, "Scaling Laws for Neural Language Models" (Table 1, Sec. 2.1):
    a forward pass costs ``2 N`` FLOPs per token for ``N`` non-embedding parameters plus
    ``2 n_layer n_ctx d`` for attention scores; training (forward + backward) is 3x the forward. With
    PaLM's accounting (Chowdhery et al. 2022, Appendix B) both attention matmuls (``Q K^T`` and ``A V``)
    are counted, giving ``12 n_layer d n_ctx`` per token for training:

    - encoder: ``6 N`` with ``N = n_layer * (4 h^2 + 2 h i)`` (Q/K/V/output projections and the two
      feed-forward matmuls; biases, LayerNorm and softmax are ignored as in both papers);
    - attention: ``12 * n_layer * h * seq_length``;
    - LM head: ``6 * (h^2 + h V)`` (dense transform + vocabulary projection), times ``masked_fraction``
      when the head runs only at masked positions (hf-tpu-ext's trainer), or at every position when
      ``masked_fraction`` is None (the stock ``TFRobertaForMaskedLM`` call).

    Embedding lookups cost no matmul FLOPs and are not counted.

    Args:
        config: a transformers config with ``hidden_size``, ``num_hidden_layers``, ``intermediate_size``
            (default ``4 * hidden_size``) and ``vocab_size``.
        seq_length: tokens per sequence (the attention context).
        masked_fraction: share of positions the LM head runs at (e.g. ``max_predictions_per_seq /
            seq_length``), in [0, 1]; None for every position.

    Returns:
        FLOPs per token (float). Multiply by tokens/s to get model FLOP/s.

    Raises:
        ArgumentError: ``seq_length < 1`` or ``masked_fraction`` outside [0, 1].
    """
    from hf_tpu_ext.errors import ArgumentError

    if seq_length < 1:
        raise ArgumentError(f"seq_length must be >= 1, got {seq_length}.")
    if masked_fraction is not None and not 0.0 <= masked_fraction <= 1.0:
        raise ArgumentError(f"masked_fraction must be in [0, 1] (or None for every position), got {masked_fraction}.")
    h = float(config.hidden_size)
    n_layer = float(config.num_hidden_layers)
    inter = float(getattr(config, "intermediate_size", None) or 4 * config.hidden_size)
    vocab = float(config.vocab_size)
    non_embedding = n_layer * (4.0 * h * h + 2.0 * h * inter)
    attention = 12.0 * n_layer * h * float(seq_length)
    head = 6.0 * (h * h + h * vocab) * (1.0 if masked_fraction is None else float(masked_fraction))
    return 6.0 * non_embedding + attention + head


# Dense (no sparsity) peak FLOP/s per device as TensorFlow sees it (one replica), bf16/fp16 matmuls
# unless noted. Sources: Google Cloud TPU system-architecture pages (v3: 123 TFLOP/s per chip = 2 cores,
# v4: 275, v5e: 197, v5p: 459, v6e/Trillium: 918 TFLOP/s bf16 per chip); NVIDIA A100 datasheet
# (312 TFLOP/s bf16, 156 TF32), H100/H200 SXM datasheet (989 TFLOP/s bf16 dense, 495 TF32), H100 PCIe
# (756 bf16, 378 TF32), V100 (125 TFLOP/s fp16 tensor core, 15.7 fp32).
# float32 on GPUs: TensorFlow runs float32 matmuls as TF32 on Ampere and newer by default, so the
# TF32 figure is the relevant peak. float32 on TPUs: XLA's default precision multiplies in bf16, so
# the bf16 peak applies. Order matters: the first matching substring wins.
_PEAKS = (
    # (substring of the lowercased device kind, bf16 peak, float32 peak)
    ("v6e", 918e12, 918e12),
    ("v6 lite", 918e12, 918e12),
    ("v5p", 459e12, 459e12),
    ("v5e", 197e12, 197e12),
    ("v5 lite", 197e12, 197e12),
    ("v5litepod", 197e12, 197e12),
    ("tpu v4", 275e12, 275e12),
    ("tpu v3", 61.5e12, 61.5e12),  # TF sees each of the 2 cores of a chip as a replica
    ("h100 pcie", 756e12, 378e12),
    ("h100", 989e12, 495e12),
    ("h200", 989e12, 495e12),
    ("a100", 312e12, 156e12),
    ("v100", 125e12, 15.7e12),
)


def known_peak_flops(device_kind: Optional[str], dtype: str = "bfloat16") -> Optional[float]:
    """Datasheet peak FLOP/s of one device (one replica), dense math.

    Args:
        device_kind: a device name such as ``"TPU v4"``, ``"TPU v5 lite"``, ``"NVIDIA H100 80GB HBM3"``,
            ``"NVIDIA A100-SXM4-40GB"`` (case-insensitive substring match).
        dtype: the matmul dtype of training: ``"bfloat16"``/``"float16"`` or ``"float32"`` (TF32 peak on
            NVIDIA Ampere+, bf16 peak on TPUs, see the source notes in this module).

    Returns:
        FLOP/s, or None for an unknown device (CPUs included: measure with :func:`measure_peak_flops`).
    """
    if not device_kind:
        return None
    kind = device_kind.lower()
    half = str(dtype).lower() in ("bfloat16", "bf16", "float16", "fp16", "half", "mixed_bfloat16", "mixed_float16")
    for key, bf16, fp32 in _PEAKS:
        if key in kind:
            return bf16 if half else fp32
    return None


def default_device_kind() -> str:
    """A name for the device TensorFlow computes on: the GPU's name, ``"TPU"``, or ``"CPU"``.

    Returns:
        e.g. ``"NVIDIA H100 80GB HBM3"`` (from ``tf.config.experimental.get_device_details``), ``"TPU"``
        (TensorFlow does not report the TPU generation; pass it to :func:`known_peak_flops` yourself), or
        ``"CPU"``.
    """
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        try:
            return str(tf.config.experimental.get_device_details(gpus[0]).get("device_name") or "GPU")
        except Exception:  # details are optional
            return "GPU"
    if tf.config.list_logical_devices("TPU"):
        return "TPU"
    return "CPU"


def measure_peak_flops(dtype: str = "float32", size: Optional[int] = None, iterations: Optional[int] = None,
                       target_seconds: float = 1.0) -> float:
    """Achievable matmul FLOP/s of the default device, from an XLA-compiled chain of square matmuls.

    A stand-in for the datasheet peak where none is known (CPUs, new chips). It measures what XLA
    reaches on large matmuls, so MFU against it reads higher than against a datasheet peak.

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


def _peak_cache_path() -> str:
    """``$HF_HOME/hf_tpu_ext/peak_flops.json`` (huggingface_hub's cache home), else ``~/.cache/hf_tpu_ext``."""
    import os

    try:
        from huggingface_hub import constants

        home = os.environ.get("HF_HOME") or constants.HF_HOME
    except ImportError:
        home = None
    return os.path.join(home, "hf_tpu_ext", "peak_flops.json") if home else os.path.join(
        os.path.expanduser("~"), ".cache", "hf_tpu_ext", "peak_flops.json")


def usable_cpu_cores() -> int:
    """CPU cores this process may run on: ``os.sched_getaffinity`` (respects ``taskset`` and container CPU sets),
    ``os.cpu_count()`` where that does not exist; at least 1."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _machine_key(device_kind: str, dtype: str) -> str:
    """What a measured peak depends on: the device, the CPU model and cores usable, dtype and TF version."""
    import os
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = usable_cpu_cores()
    try:
        from importlib.metadata import version

        tf_version = version("tensorflow")
    except Exception:  # noqa: BLE001 (metadata missing: the key just carries less)
        tf_version = "?"
    return f"{device_kind}|{cpu}|{cores} cores|{dtype}|tensorflow {tf_version}"


def peak_flops(device_kind: str, dtype: str = "float32", *, cache_path: Optional[str] = None) -> Optional[float]:
    """Peak FLOP/s of one device for MFU: the datasheet value (:func:`known_peak_flops`), else a measured one.

    Devices without a datasheet entry (CPUs, a TPU whose generation TensorFlow does not report) get
    :func:`measure_peak_flops` once per machine: the result is cached in a JSON file keyed by device,
    CPU model, usable cores, dtype and TensorFlow version (:func:`_peak_cache_path`), so later runs do not
    spend the ~2 s again.

    Args:
        device_kind: e.g. ``"CPU"``, ``"NVIDIA H100 80GB HBM3"`` (:func:`default_device_kind`).
        dtype: compute dtype (``"float32"`` or ``"bfloat16"``).
        cache_path: the cache file (default: :func:`_peak_cache_path`).

    Returns:
        FLOP/s, or None when the probe fails.
    """
    import json
    import os

    known = known_peak_flops(device_kind, dtype)
    if known:
        return known
    path = cache_path or _peak_cache_path()
    key = _machine_key(device_kind, dtype)
    cache = {}
    try:
        with open(path, encoding="utf-8") as f:
            cache = json.load(f)
        if isinstance(cache, dict) and isinstance(cache.get(key), (int, float)) and cache[key] > 0:
            return float(cache[key])
    except (OSError, ValueError):
        cache = {}
    try:
        value = measure_peak_flops(dtype)
    except Exception as err:  # noqa: BLE001 (MFU is optional: never fail a run over it)
        logger.debug("peak FLOP/s probe failed: %s", err)
        return None
    # a probe on a busy machine reads low and would make every later MFU read high: cache only an idle one
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cores = os.cpu_count() or 1
    if load > 0.5 * cores:
        logger.info("measured peak %.3g FLOP/s (%s matmul probe) with the machine busy (load %.1f on %d cores): used "
                    "for this run's MFU only, not cached", value, dtype, load, cores)
        return value
    cache = cache if isinstance(cache, dict) else {}
    cache[key] = value
    try:
        from hf_tpu_ext.fileio import atomic_write_text

        atomic_write_text(path, json.dumps(cache, indent=1))
    except OSError as err:
        logger.debug("could not cache the peak FLOP/s in %s: %s", path, err)
    logger.info("measured peak %.3g FLOP/s (%s matmul probe, cached for MFU)", value, dtype)
    return value
