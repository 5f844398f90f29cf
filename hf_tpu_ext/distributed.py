"""Which process does what in a distributed run (accelerate-style helpers, TensorFlow flavour).

The chief is the process that writes the output folder and talks to the Hub. Work that every replica
must take part in (collective ops, checkpoint writes under MultiWorkerMirroredStrategy) must never sit
inside a chief-only branch.
"""

from __future__ import annotations

import enum
import functools
import json
import os


class DistributedType(str, enum.Enum):
    """The kind of ``tf.distribute`` strategy a run uses (mirrors accelerate's ``DistributedType``)."""

    NO = "NO"  # one device: OneDeviceStrategy / default strategy
    MULTI_DEVICE = "MULTI_DEVICE"  # MirroredStrategy over several local GPUs (or logical CPUs in tests)
    MULTI_WORKER = "MULTI_WORKER"  # MultiWorkerMirroredStrategy, TF_CONFIG set
    TPU = "TPU"  # TPUStrategy


def tf_config() -> dict:
    """The parsed ``TF_CONFIG`` environment variable (``{}`` when unset).

    Raises:
        ValueError: ``TF_CONFIG`` is set but is not JSON.
    """
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}); see the tf.distribute multi-worker guide.") from None


def process_index() -> int:
    """This process's index among the processes of a run: 0 is the chief. The one answer every module asks.

    In order: a multi-host JAX run (``jax.distributed.initialize`` done: ``jax.process_index()``); torch_xla's
    global ordinal when its runtime is loaded; an initialized ``torch.distributed`` group's rank; the
    ``RANK`` variable torchrun/accelerate set; ``TF_CONFIG`` (``chief`` is 0; ``worker`` i is i, or i + 1 when
    the cluster has a chief; other task types (``ps``, ``evaluator``) are never the chief). Nothing is imported
    or initialized to answer: only frameworks the process already loaded are asked.

    Raises:
        ValueError: ``TF_CONFIG`` is set but is not JSON.
    """
    import sys

    jax_distributed = sys.modules.get("jax._src.distributed")
    state = getattr(jax_distributed, "global_state", None)
    if state is not None and getattr(state, "client", None) is not None:
        return int(getattr(state, "process_id", 0) or 0)
    xla_runtime = sys.modules.get("torch_xla.runtime")
    if xla_runtime is not None:
        try:
            return int(xla_runtime.global_ordinal())
        except Exception:  # the runtime is not initialized in this process
            pass
    torch_distributed = sys.modules.get("torch.distributed")
    if torch_distributed is not None:
        try:
            if torch_distributed.is_available() and torch_distributed.is_initialized():
                return int(torch_distributed.get_rank())
        except Exception:
            pass
    if os.environ.get("RANK", "").strip().isdigit():
        return int(os.environ["RANK"])
    cfg = tf_config()
    task = cfg.get("task") or {}
    if not task:
        return 0
    task_type, index = task.get("type"), int(task.get("index", 0))
    if task_type == "chief":
        return 0
    if task_type == "worker":
        return index + (1 if "chief" in (cfg.get("cluster") or {}) else 0)
    return -1  # ps / evaluator tasks: not a training process that writes


def is_main_process() -> bool:
    """True on the chief (:func:`process_index` is 0): the process that writes the output folder and pushes."""
    return process_index() == 0


def on_main_process(fn):
    """Decorator: run ``fn`` only on the chief; other processes get ``None``.

    Use it only for host-side work (files, Hub requests), never around collective ops.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if is_main_process():
            return fn(*args, **kwargs)
        return None

    return wrapper
