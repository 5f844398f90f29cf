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


def is_main_process() -> bool:
    """True on the chief: no ``TF_CONFIG``, task type ``chief``, or ``worker`` 0 when the cluster has no chief."""
    cfg = tf_config()
    task = cfg.get("task") or {}
    if not task:
        return True
    cluster = cfg.get("cluster") or {}
    task_type, index = task.get("type"), int(task.get("index", 0))
    if task_type == "chief":
        return True
    return task_type == "worker" and index == 0 and "chief" not in cluster


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
