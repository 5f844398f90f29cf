"""XLA fusion of the element-wise ops between TensorFlow's oneDNN kernels (the bf16 path on a native-bf16 CPU).

Why: on a CPU with AMX-BF16 the bf16 step on TensorFlow's kernels spends little time in its matmuls (oneDNN,
~0.11 s of a 0.39 s step on the small preset) and most in ~700 element-wise kernels a step (``Mul``, ``Cast``,
``Erfc``, ``Select``, ...) that TensorFlow runs one by one over bf16 tensors, and in ``RandomUniform`` for
dropout (``python -m benchmarks.tf_step_profile``; benchmarks/RESULTS.md, 2026-12-04). TensorFlow's XLA
auto-clustering restricted to fusible ops (``--tf_xla_ops_to_cluster``, :data:`OPS_TO_CLUSTER`) compiles the
runs of element-wise ops between two matmuls into XLA clusters and leaves the matmuls (and the attention softmax)
to oneDNN; with the XLA step's counter-based dropout masks (:mod:`hf_tpu_ext.backends.tensorflow.dropout`),
fusible too, the step took 0.30 s.

TensorFlow reads ``TF_XLA_FLAGS`` once, when it first initializes its devices, so :func:`prepare` adds the two
flags before that (``hf-tpu train`` does, before it picks the strategy). They change nothing until
auto-clustering is switched on (:func:`elementwise_fusion`, around the training of a run that uses it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator, List, MutableMapping, Optional, Tuple

#: the op groups of TensorFlow's auto-clustering allowlist (``mark_for_compilation_pass``) that are clustered:
#: its FUSIBLE set (point-wise ops, reductions, reshapes, transposes, bias gradients: no matmul, convolution or
#: random op) without ``Softmax``, which oneDNN runs faster than XLA:CPU's split reductions (small preset, bf16:
#: 295-301 vs 322-333 ms/step, alternating runs of ``benchmarks.tf_step_profile``), the loss's cross-entropy kept
OPS_TO_CLUSTER = "PW,RED,MISC,BN,SORT,REDUCEWINDOWPW,SparseSoftmaxCrossEntropyWithLogits"
#: what ``prepare`` adds to ``TF_XLA_FLAGS``: auto-clustering may run on CPU devices, only over those ops
FUSION_FLAGS = ("--tf_xla_cpu_global_jit", f"--tf_xla_ops_to_cluster={OPS_TO_CLUSTER}")


def _devices_initialized() -> bool:
    """Whether this process's TensorFlow has initialized its devices (and so read ``TF_XLA_FLAGS``).

    The one adapter over a private module (``tensorflow.python.eager.context``). The public alternative,
    ``tf.config.list_logical_devices()``, initializes the devices to answer, which is what must not happen yet.
    """
    import sys

    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    ctx = context.context()
    return getattr(ctx, "_context_handle", None) is not None or getattr(ctx, "_physical_devices", None) is not None


#: :func:`prepare`'s states: the fusion can run; TensorFlow had started (too late for ``TF_XLA_FLAGS``); the user's
#: own ``TF_XLA_FLAGS`` decide auto-clustering
READY, STARTED, USER = "ready", "started", "user"
#: the flags by which a user's ``TF_XLA_FLAGS`` decides auto-clustering itself
_CLUSTERING_FLAG_NAMES = ("--tf_xla_auto_jit", "--tf_xla_ops_to_cluster", "--tf_xla_cpu_global_jit")


def user_clustering_flags(tf_xla_flags: str) -> List[str]:
    """The flags of ``tf_xla_flags`` (a ``TF_XLA_FLAGS`` value) that set auto-clustering and are not
    :data:`FUSION_FLAGS` (e.g. ``--tf_xla_auto_jit=2``, ``--tf_xla_cpu_global_jit=false``), in their order."""
    return [f for f in tf_xla_flags.split() if f.split("=", 1)[0] in _CLUSTERING_FLAG_NAMES and f not in FUSION_FLAGS]


@dataclasses.dataclass(frozen=True)
class FusionSetup:
    """What :func:`prepare` found: ``state`` (:data:`READY`, :data:`STARTED` or :data:`USER`) and, for USER, the
    user's clustering flags."""

    state: str
    user_flags: Tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        """The flags are in effect: :func:`elementwise_fusion` fuses."""
        return self.state == READY

    @property
    def compiler_note(self) -> str:
        """What to add to the compiler path of a step on TensorFlow's kernels: ``", XLA auto-clustering as
        TF_XLA_FLAGS sets it"`` when the user's flags switch auto-clustering on themselves (``--tf_xla_auto_jit``),
        else nothing (without it TensorFlow clusters nothing, whatever the other flags say)."""
        on = any(f.split("=", 1)[0] == "--tf_xla_auto_jit" for f in self.user_flags)
        return ", XLA auto-clustering as TF_XLA_FLAGS sets it" if on else ""

    def not_fused_message(self) -> str:
        """The log line of a run whose precision plan would fuse while the state is not READY."""
        if self.state == USER:
            return (f"element-wise ops not fused by hf-tpu: your TF_XLA_FLAGS set XLA auto-clustering "
                    f"({' '.join(self.user_flags)}), so TensorFlow clusters as they say (see "
                    "hf_tpu_ext/backends/tensorflow/fusion.py).")
        return ("element-wise ops not fused by XLA: TensorFlow had started before hf-tpu could set TF_XLA_FLAGS; "
                "TensorFlow's kernels run alone (see hf_tpu_ext/backends/tensorflow/fusion.py).")


def prepare(environ: Optional[MutableMapping[str, str]] = None) -> FusionSetup:
    """Add :data:`FUSION_FLAGS` to ``TF_XLA_FLAGS`` unless TensorFlow has read them already or the user's own
    ``TF_XLA_FLAGS`` set auto-clustering (:func:`user_clustering_flags`: those are left as they are).

    Args:
        environ: the environment to change (default ``os.environ``; tests pass a dict).

    Returns:
        :class:`FusionSetup`: READY (both flags are in ``TF_XLA_FLAGS`` before TensorFlow reads them), STARTED
        (TensorFlow had read ``TF_XLA_FLAGS`` without them) or USER (with the user's flags).
    """
    environ = os.environ if environ is None else environ
    flags = environ.get("TF_XLA_FLAGS", "").split()
    mine = user_clustering_flags(" ".join(flags))
    if mine:
        return FusionSetup(USER, tuple(mine))
    if all(flag in flags for flag in FUSION_FLAGS):
        return FusionSetup(READY)
    if _devices_initialized():
        return FusionSetup(STARTED)
    environ["TF_XLA_FLAGS"] = " ".join(flags + [f for f in FUSION_FLAGS if f not in flags])
    return FusionSetup(READY)


@contextlib.contextmanager
def elementwise_fusion(enabled: bool = True) -> Iterator[None]:
    """Within the block, ``tf.function`` graphs traced on the CPU get their fusible ops clustered by XLA.

    ``tf.config.optimizer.set_jit("autoclustering")`` applies to functions instantiated while it is set; it is
    turned back to what it was at the end, so later code in the process is unaffected. ``enabled=False``
    changes nothing. Without :data:`FUSION_FLAGS` in effect (:func:`prepare` not ``ready``)
    auto-clustering does nothing on a CPU.
    """
    if not enabled:
        yield
        return
    import tensorflow as tf

    previous = tf.config.optimizer.get_jit()
    tf.config.optimizer.set_jit("autoclustering")
    try:
        yield
    finally:
        tf.config.optimizer.set_jit(previous or False)
