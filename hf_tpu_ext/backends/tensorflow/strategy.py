"""Pick the ``tf.distribute`` strategy for the machine the run is on.

Order (first that applies): ``tpu_name`` given -> ``TPUStrategy`` via ``TPUClusterResolver``;
``TF_CONFIG`` set -> ``MultiWorkerMirroredStrategy``; more than one GPU -> ``MirroredStrategy``;
more than one logical CPU device configured (tests) -> ``MirroredStrategy`` over them; otherwise the
default one-device strategy. Global batch = per-device batch x ``num_replicas_in_sync``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Dict, Optional

import tensorflow as tf

from hf_tpu_ext.distributed import DistributedType, is_main_process, tf_config
from hf_tpu_ext.errors import ArgumentError
from hf_tpu_ext.host_memory import keep_step_memory

logger = logging.getLogger("hf_tpu_ext")


@dataclasses.dataclass
class StrategyInfo:
    """What the run is distributed over (also written into the model card)."""

    strategy: tf.distribute.Strategy
    distributed_type: DistributedType
    accelerator: str  # "TPU", "GPU" or "CPU"
    num_devices: int  # devices of that kind in the whole run
    num_replicas: int
    num_workers: int
    is_tpu_node: bool  # TPU reached over the network (not a TPU VM): data must be on gs://
    is_chief: bool

    @property
    def strategy_name(self) -> str:
        if self.distributed_type == DistributedType.MULTI_WORKER:
            return "MultiWorkerMirroredStrategy"  # its class is named CollectiveAllReduceStrategy
        return type(self.strategy).__name__


def tpu_error_message(tpu_name: str, error: BaseException) -> str:
    """One line saying why ``--tpu_name`` could not be resolved and what to check (no traceback).

    ``TPUClusterResolver`` looks a TPU name up through the GCE metadata server (a ``URLError`` off Google
    Cloud) and the Cloud TPU API (``cloud-tpu-client``, or TensorFlow's fallback needing the Google API client).
    """
    text = " ".join(str(error).split())[:300]
    if tpu_name == "local" and not isinstance(error, ImportError):
        # "local" names no TPU to look up: the TPU runtime of this machine found none (e.g. "TPUs not found in
        # the cluster" on a CPU machine); advising "use --tpu_name local" would repeat what failed
        first = text.split(". ")[0].rstrip(".")
        return (f"--tpu_name local: this machine has no TPU that TensorFlow can use ({type(error).__name__}: {first}). "
                "'local' is the TPU of the Cloud TPU VM the run is on, with TensorFlow's TPU runtime (libtpu). To "
                "train on this machine's CPU or GPUs, drop --tpu_name; for a TPU Node, give its name (with "
                "--tpu_zone and --gcp_project) or its address grpc://IP:8470.")
    if isinstance(error, ImportError) or "Google API client" in text or "googleapiclient" in text:
        return (f"--tpu_name {tpu_name}: looking up a TPU Node by name needs the Cloud TPU client, which is not "
                "installed: `pip install cloud-tpu-client`. On a TPU VM use --tpu_name local instead.")
    if isinstance(error, OSError):  # urllib's URLError: no GCE metadata server here
        reason = getattr(error, "reason", None) or text
        return (f"--tpu_name {tpu_name}: the TPU name cannot be looked up because this machine is not on Google Cloud "
                f"(the metadata server metadata.google.internal is unreachable: {reason}). Run on a Google Cloud VM in "
                "the TPU's project (--gcp_project, --tpu_zone), give the TPU's address as --tpu_name grpc://IP:8470, or "
                "on a TPU VM use --tpu_name local.")
    return (f"Could not reach TPU {tpu_name!r} ({type(error).__name__}: {text}). On a TPU VM use --tpu_name local; "
            "for a TPU Node check its name, --tpu_zone and --gcp_project, and that it is READY.")


def resolve_strategy(tpu_name: Optional[str] = None, tpu_zone: Optional[str] = None,
                     gcp_project: Optional[str] = None) -> StrategyInfo:
    """Create the strategy (see module docstring for the order).

    Args:
        tpu_name: a TPU name or ``grpc://`` address, or ``"local"`` on a TPU VM.
        tpu_zone, gcp_project: where a named TPU Node lives.

    Raises:
        ArgumentError: ``tpu_name`` was given but no TPU could be reached (the message says what was tried).
    """
    if tpu_name:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
                tpu=tpu_name, zone=tpu_zone, project=gcp_project
            )
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, tf.errors.OpError, RuntimeError, ImportError, OSError) as e:
            raise ArgumentError(tpu_error_message(tpu_name, e)) from None
        strategy = tf.distribute.TPUStrategy(resolver)
        n = strategy.num_replicas_in_sync
        return StrategyInfo(strategy, DistributedType.TPU, "TPU", n, n,
                            max(1, len(resolver.cluster_spec().as_dict().get("worker", [])) or 1),
                            is_tpu_node=tpu_name != "local" and not tpu_name.startswith("local"),
                            is_chief=True)

    if tf_config().get("cluster"):
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        cluster = tf_config()["cluster"]
        workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
        gpus = tf.config.list_logical_devices("GPU")
        return StrategyInfo(strategy, DistributedType.MULTI_WORKER, "GPU" if gpus else "CPU",
                            strategy.num_replicas_in_sync, strategy.num_replicas_in_sync, workers,
                            is_tpu_node=False, is_chief=is_main_process())

    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        strategy = tf.distribute.MirroredStrategy([d.name for d in gpus])
        return StrategyInfo(strategy, DistributedType.MULTI_DEVICE, "GPU", len(gpus), len(gpus), 1, False, True)
    cpus = tf.config.list_logical_devices("CPU")
    if not gpus and len(cpus) > 1:
        strategy = tf.distribute.MirroredStrategy([d.name for d in cpus])
        return StrategyInfo(strategy, DistributedType.MULTI_DEVICE, "CPU", len(cpus), len(cpus), 1, False, True)
    device = gpus[0].name if gpus else cpus[0].name
    strategy = tf.distribute.OneDeviceStrategy(device)
    return StrategyInfo(strategy, DistributedType.NO, "GPU" if gpus else "CPU", 1, 1, 1, False, True)



def configure_host_memory() -> Dict[str, bool]:
    """Keep the host allocator from returning memory to the OS between steps (the "slow mode" of a CPU step).

    Measured on the small benchmark preset (benchmarks/NOTES.md, "steady fp32 speed"): with TensorFlow's default
    CPU allocator and glibc's malloc, every step page-faulted 66-84 thousand fresh 4 KiB pages with XLA and
    ~240 thousand with TensorFlow's kernels (the step's temporaries are ``mmap``-ed and unmapped again, and
    glibc's dynamic mmap threshold moves with the allocation history, so processes differ). With
    TensorFlow's BFC allocator for CPU memory (``TF_CPU_ALLOCATOR_USE_BFC``, read when TensorFlow creates its
    CPU allocator) and glibc told not to ``mmap`` (``M_MMAP_MAX=0``) nor trim the heap below 1 GiB
    (``M_TRIM_THRESHOLD``), the steady steps fault no page at all. Memory freed by a step is kept for the
    next one (peak RSS does not grow). An explicit ``TF_CPU_ALLOCATOR_USE_BFC`` in the environment is kept.

    Call it before TensorFlow allocates its first tensor (``hf-tpu train`` does, first thing).

    Returns:
        ``{"bfc_allocator": bool, "malloc_tuned": bool}``: what is in effect (``malloc_tuned`` is False off glibc).
    """
    import os

    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    tuned = keep_step_memory()  # TensorFlow's own threads allocate through BFC: no single arena needed
    return {"bfc_allocator": os.environ["TF_CPU_ALLOCATOR_USE_BFC"].lower() in ("1", "true"), "malloc_tuned": tuned}


def split_cpu(num_devices: int) -> None:
    """Split the physical CPU into ``num_devices`` logical devices (multi-replica tests on a CPU).

    Must run before TensorFlow initializes its devices (before any op).

    Raises:
        RuntimeError: TensorFlow's devices are already initialized.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
