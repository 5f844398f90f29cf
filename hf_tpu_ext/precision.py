"""Which precision and which compiler path a training run takes (``--bf16``, ``--jit_compile``).

Measured (benchmarks/NOTES.md, "bf16 on CPUs"): on a CPU with native bfloat16 instructions (x86
``avx512_bf16`` or ``amx_bf16``, Arm ``bf16``) TensorFlow's own oneDNN kernels run a 2048x2048 matmul at
408 GFLOP/s in bf16 against 217 in float32, while XLA:CPU stays at 199-205 GFLOP/s in both: there the
fastest bf16 step is TensorFlow's kernels, not XLA. On TPUs and GPUs XLA is the fast path in both
precisions. A CPU without native bf16 emulates it (on XLA little or no gain over float32: 522 vs 539 ms/step on
the small preset), so ``--bf16 auto`` keeps float32 there.

XLA:CPU does not multiply a bf16 x bf16 -> bf16 dot natively even where the CPU can: jaxlib 0.10.2's optimized
HLO of such a dot on an AMX-BF16/AVX512-BF16 Xeon is ``convert`` bf16 -> f32, an f32 dot (YNNPACK), ``convert``
back, so Keras' own bf16 layers ran ``--bf16 true`` at 0.83x their float32 speed on the Keras backend (issue 29:
579 vs 479 ms/step, small preset, idle AVX512-BF16 machine). A bf16 x bf16 dot with a *float32 result* is kept
and runs on the CPU's bf16 instructions; the Keras backend's step computes its projections that way
(:mod:`hf_tpu_ext.backends.keras.bf16_dot`, ``bf16_dots=True`` here). Whether that step beats its float32 one
depends on the CPU's bf16 unit: with AMX-BF16 it did, 1.24-1.52x in CPU time (benchmarks/NOTES.md "Round six")
and 1.09-1.12x in wall time on the small preset (2026-12-03, benchmarks/RESULTS.md, quiet headline round); with
AVX512-BF16 alone (AMD Zen 4, 2026-12-03, benchmarks/RESULTS.md) it runs 1.18x its float32 (718 vs 846 ms/step,
small preset; 1.32x in the step benchmark's alternating rounds; the 0.92x of 2026-12-02 was
measured before the dot routing's one switch), so ``--bf16 auto`` picks bf16 on XLA:CPU where
:data:`FAST_BF16_DOT_CPU_FLAGS` are present (:func:`xla_bf16_dots_faster`); Arm BF16 is not measured. A step
on XLA:CPU without those dots (the TensorFlow backend with ``--jit_compile true``) keeps float32 under auto; the
TensorFlow backend (``--jit_compile`` unset or false) keeps bf16 on TensorFlow's oneDNN kernels (AMX
``brg_matmul``), 1.10-1.14x its float32 there (issue 29; benchmarks/RESULTS.md 2026-12-03), 1.21x on
AVX512-BF16 (Zen 4). With ``--jit_compile`` unset the element-wise ops between those kernels are fused by XLA
auto-clustering (``elementwise_fusion``, :mod:`hf_tpu_ext.backends.tensorflow.fusion`): the op profile of the
unfused bf16 step (``benchmarks.tf_step_profile``, 2026-12-04) had its matmuls at 0.11 s of 0.39 s and the rest in
~700 element-wise kernels and ``RandomUniform``; fused, 1.4-1.5x the float32 XLA step (benchmarks/RESULTS.md).

Resolution (:func:`resolve_precision`):

==========  ===========================================================================
``--bf16``  meaning
==========  ===========================================================================
unset       ``auto`` on a TPU, float32 elsewhere
``auto``    bf16 where the hardware has it natively and the step's compiler uses it: TPU, GPU
            with compute capability >= 8.0, CPU with one of :data:`NATIVE_BF16_CPU_FLAGS`
            when the step runs on TensorFlow's kernels, or on XLA:CPU with ``bf16_dots`` where
            :data:`FAST_BF16_DOT_CPU_FLAGS` are present (see above)
``true``    bf16 mixed precision (float32 weights, loss and softmax of the loss in float32)
``false``   float32
==========  ===========================================================================

``--jit_compile`` unset: XLA, except bf16 on a CPU with native bf16 (TensorFlow's kernels: see above). On a
CPU without it XLA is the faster bf16 path too (small preset, idle 2-core AMD EPYC: 526 ms/step with XLA,
853 on TensorFlow's kernels). An explicit ``--jit_compile true/false`` is always kept. On
TensorFlow's kernels without the fusion (``--jit_compile false``) dropout uses TensorFlow's own RNG, so a resumed
run draws other dropout masks than an uninterrupted one (the XLA step's and the fused path's counter-based masks
do not).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, FrozenSet, Optional, Union

#: /proc/cpuinfo flags of CPUs with bfloat16 dot-product instructions (x86 AVX512-BF16 and AMX, Arm BF16)
NATIVE_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
#: CPU flags under which XLA:CPU's bf16 x bf16 -> float32 dots beat its float32 step (measured: AMX-BF16 yes;
#: AVX512-BF16 yes, 1.18x on Zen 4; Arm BF16 not measured, so not assumed)
FAST_BF16_DOT_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
BF16_CHOICES = ("auto", "true", "false")
#: why ``--bf16 auto`` keeps float32 on a native-bf16 CPU whose step is XLA (the Keras backend; --jit_compile true)
AUTO_XLA_CPU_REASON = ("--bf16 auto: float32, this CPU has native bf16 but the step runs on XLA:CPU, which "
                       "multiplies bf16 -> bf16 dots in float32: slower than float32")
#: why ``--bf16 auto`` picks bf16 on a native-bf16 CPU whose XLA step has bf16 x bf16 -> float32 dots (Keras/JAX)
AUTO_BF16_DOTS_REASON = ("--bf16 auto: this CPU has native bf16 and the step's matmuls multiply bf16 natively "
                         "on XLA:CPU (bf16 x bf16 -> float32 dots)")
#: why ``--bf16 auto`` keeps float32 on a native-bf16 CPU where those dots were not measured faster (Arm BF16)
AUTO_SLOW_BF16_DOTS_REASON = ("--bf16 auto: float32, this CPU has native bf16 but neither AMX nor AVX512-BF16: "
                              "the XLA step's bf16 dots are not known to beat float32 here")
#: added to the reason of ``--bf16 true`` in that case
TRUE_SLOW_BF16_DOTS_NOTE = ("; the XLA step's bf16 dots are not known to beat float32 without AMX or AVX512-BF16, "
                            "and --bf16 auto would keep float32")
#: after the compiler path of TensorFlow's kernels when XLA fuses the element-wise ops between them
FUSED_COMPILER_SUFFIX = ", element-wise ops fused by XLA"
#: added to the reason of ``--bf16 true`` on an XLA:CPU step without bf16 x bf16 -> float32 dots
TRUE_XLA_CPU_NOTE = ("; XLA:CPU multiplies bf16 -> bf16 dots in float32 even on this native-bf16 CPU: slower "
                     "than float32, and --bf16 auto would keep float32")


def parse_bf16(value: Union[None, bool, str]) -> Union[None, bool, str]:
    """Normalize a ``--bf16`` value: ``None`` (unset), ``True``, ``False`` or ``"auto"``.

    Raises:
        ValueError: anything else (the argument parser turns it into an ``ArgumentError``).
    """
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    if text == "auto":
        return "auto"
    raise ValueError(f"--bf16 must be one of {', '.join(BF16_CHOICES)}, got {value!r}.")


def cpu_flags(cpuinfo_text: Optional[str] = None) -> FrozenSet[str]:
    """The CPU feature flags of ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``); empty where unreadable.

    Args:
        cpuinfo_text: the file's content (default: read ``/proc/cpuinfo``; tests pass their own).
    """
    if cpuinfo_text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo_text = f.read()
        except OSError:
            return frozenset()
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return frozenset()


def gpu_has_native_bf16() -> bool:
    """Whether the first GPU TensorFlow sees has bf16 tensor cores (compute capability >= 8.0, Ampere on)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return False
    capability = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability") or (0, 0)
    return tuple(capability) >= (8, 0)


def has_native_bf16(accelerator: str, gpu_check: Callable[[], bool] = gpu_has_native_bf16) -> bool:
    """Whether ``accelerator`` (``"TPU"``, ``"GPU"`` or ``"CPU"``) multiplies bf16 natively: a TPU always, a GPU
    as ``gpu_check`` says (default: TensorFlow's view of the first GPU; a backend passes its framework's), a CPU
    with one of :data:`NATIVE_BF16_CPU_FLAGS` in :func:`cpu_flags`."""
    if accelerator == "GPU":
        return bool(gpu_check())
    if accelerator == "CPU":
        return bool(cpu_flags() & NATIVE_BF16_CPU_FLAGS)
    return True


def xla_bf16_dots_faster(accelerator: str, flags: Optional[FrozenSet[str]] = None) -> bool:
    """Whether the Keras backend's bf16 x bf16 -> float32 dots beat its float32 step on ``accelerator``: off a CPU
    always; on a CPU where one of :data:`FAST_BF16_DOT_CPU_FLAGS` is in ``flags`` (default :func:`cpu_flags`)."""
    if accelerator.upper() != "CPU":
        return True
    return bool((cpu_flags() if flags is None else flags) & FAST_BF16_DOT_CPU_FLAGS)


@dataclasses.dataclass(frozen=True)
class PrecisionPlan:
    """What a run computes in and how it is compiled.

    Attributes:
        bf16: mixed bfloat16 compute (``mixed_bfloat16`` Keras policy; weights stay float32).
        jit_compile: the training step is XLA-compiled.
        native_bf16: the hardware multiplies bf16 natively.
        precision: ``"bf16 mixed"`` or ``"float32"`` (the card's "Precision" row).
        compiler: the compiler path in words, e.g. ``"TensorFlow kernels (oneDNN)"`` or ``"XLA"``.
        reason: why, in one sentence (logged).
        fuse_elementwise: on TensorFlow's kernels, the element-wise ops between them are fused by XLA
            auto-clustering (:mod:`hf_tpu_ext.backends.tensorflow.fusion`).
        bf16_dots: the XLA:CPU step routes its dots (:mod:`hf_tpu_ext.backends.keras.bf16_dot`): a bf16 model's
            matmuls as bf16 x bf16 -> float32 (natively bf16 there), a float32 model's projections as 2-D dots. Only
            the Keras backend on JAX asks for it, and only an XLA step on a CPU gets it (TPU/GPU compilers need none).

    The plan is made once per run (the backend's ``setup``) and read from the backend afterwards; the parsed
    arguments keep what the user asked for (``--bf16 auto`` stays ``"auto"``).
    """

    bf16: bool
    jit_compile: bool
    native_bf16: bool
    precision: str
    compiler: str
    reason: str
    fuse_elementwise: bool = False
    bf16_dots: bool = False

    @property
    def keras_policy(self) -> str:
        """The Keras dtype policy of the model: ``"mixed_bfloat16"`` (bf16 compute, float32 variables) or
        ``"float32"``."""
        return "mixed_bfloat16" if self.bf16 else "float32"


def resolve_precision(bf16: Union[None, bool, str], jit_compile: Optional[bool], accelerator: str,
                      native_bf16: bool, bf16_dots: bool = False, bf16_dots_faster: bool = True,
                      elementwise_fusion: bool = False) -> PrecisionPlan:
    """Decide bf16 and the compiler path (see the module docstring's table).

    Args:
        bf16: ``--bf16`` after :func:`parse_bf16`.
        jit_compile: ``--jit_compile`` (``None``: unset); the Keras backend passes True (its step is always one
            XLA program), so on a CPU ``--bf16 auto`` keeps float32 there (module docstring).
        accelerator: ``"TPU"``, ``"GPU"`` or ``"CPU"``.
        native_bf16: the accelerator multiplies bf16 natively (TPU: always; GPU: :func:`gpu_has_native_bf16`;
            CPU: :data:`NATIVE_BF16_CPU_FLAGS` in :func:`cpu_flags`).
        bf16_dots: the XLA step can multiply bf16 x bf16 -> float32 (the Keras backend on JAX:
            :mod:`hf_tpu_ext.backends.keras.bf16_dot`), which XLA:CPU runs natively; the plan's ``bf16_dots`` is
            this on an XLA:CPU step.
        bf16_dots_faster: with ``bf16_dots`` on a CPU, whether those dots beat float32 there
            (:func:`xla_bf16_dots_faster`: AMX-BF16, AVX512-BF16); ``--bf16 auto`` keeps float32 where not.
        elementwise_fusion: the backend can fuse the element-wise ops around TensorFlow's kernels with XLA
            (TensorFlow with :data:`hf_tpu_ext.backends.tensorflow.fusion.FUSION_FLAGS` in effect); used on the
            path ``--jit_compile`` unset picks for bf16 on a native-bf16 CPU, not on an explicit ``false``.

    Returns:
        PrecisionPlan.
    """
    accelerator = accelerator.upper()
    native = bool(native_bf16 or accelerator == "TPU")
    xla_cpu = accelerator == "CPU" and jit_compile is True
    slow_xla_cpu = xla_cpu and not bf16_dots  # its bf16 dots run in float32
    slow_dots = xla_cpu and bf16_dots and not bf16_dots_faster  # native bf16 dots, slower than float32 here
    if bf16 is None:
        use_bf16 = accelerator == "TPU"
        why = ("bf16 by default on a TPU" if use_bf16
               else "float32 is the default off a TPU; --bf16 auto uses bf16 where the hardware has it")
    elif bf16 == "auto":
        # XLA:CPU converts bf16 -> bf16 dot operands to float32 whatever the CPU has: no gain, only casts
        use_bf16 = native and not slow_xla_cpu and not slow_dots
        if use_bf16 and xla_cpu:
            why = AUTO_BF16_DOTS_REASON
        elif use_bf16:
            why = f"--bf16 auto: this {accelerator} has native bf16"
        elif native:
            why = AUTO_SLOW_BF16_DOTS_REASON if slow_dots else AUTO_XLA_CPU_REASON
        else:
            why = f"--bf16 auto: this {accelerator} has no native bf16, float32 is faster"
    else:
        use_bf16 = bool(bf16)
        why = f"--bf16 {str(use_bf16).lower()}"
        if use_bf16 and not native:
            why += (f" on a {accelerator} without native bf16: emulated, little or no gain over float32, and "
                    "--bf16 auto would keep float32")
    # bf16 on a CPU with native bf16: TensorFlow's oneDNN kernels run its matmuls at ~2x XLA:CPU's rate.
    # Without native bf16 XLA is faster (idle machine, small preset: 526 vs 853 ms/step; benchmarks/NOTES.md)
    cpu_kernels_faster = use_bf16 and accelerator == "CPU" and native
    fuse = False
    if jit_compile is None:
        xla = not cpu_kernels_faster
        if cpu_kernels_faster:
            why += "; TensorFlow's oneDNN bf16 kernels, not XLA: about 2x XLA:CPU's bf16 matmul rate"
            fuse = elementwise_fusion
            if fuse:
                why += ", with the element-wise ops between them fused by XLA"
        elif use_bf16 and accelerator == "CPU":
            why += "; XLA, faster than TensorFlow's kernels on emulated bf16"
    else:
        xla = bool(jit_compile)
        if use_bf16 and native and slow_xla_cpu:
            why += TRUE_XLA_CPU_NOTE
        elif use_bf16 and native and slow_dots:
            why += TRUE_SLOW_BF16_DOTS_NOTE
    if xla:
        compiler = "XLA"
    else:
        compiler = "TensorFlow kernels (oneDNN)" if accelerator == "CPU" else "TensorFlow kernels"
        compiler += FUSED_COMPILER_SUFFIX if fuse else ""
    return PrecisionPlan(bf16=use_bf16, jit_compile=xla, native_bf16=native,
                         precision="bf16 mixed" if use_bf16 else "float32", compiler=compiler, reason=why,
                         fuse_elementwise=fuse, bf16_dots=bool(bf16_dots and xla_cpu))
