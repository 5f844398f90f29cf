"""Which process does what in a distributed run, for every backend (accelerate-style helpers).

The chief is the process that writes the output folder and talks to the Hub. Work that every replica
must take part in (collective ops, checkpoint writes under MultiWorkerMirroredStrategy) must never sit
inside a chief-only branch.

Imports no framework (``tests/test_code_shape.py`` checks that no JAX is imported): :func:`process_index` asks only
the frameworks a process already loaded. JAX's multi-process start and lost-process watch are the Keras backend's
(:mod:`hf_tpu_ext.backends.keras.processes`); what the ground modules need of it (the run lock waiting for this
host's id, the output folder the lost-process line names) is here.
"""

from __future__ import annotations

import enum
import logging
import json
import os
import sys
from typing import Callable, List, Optional

from hf_tpu_ext.environment import (JAX_COORDINATOR_ADDRESS, JAX_DISTRIBUTED_SWITCH,  # noqa: F401 (re-exported)
                                    JAX_NUM_PROCESSES, JAX_PROCESS_ID, process_variables)


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
    env = process_variables()
    if env.get(JAX_PROCESS_ID, "").strip().isdigit():  # before jax.distributed.initialize (the run lock)
        return int(env[JAX_PROCESS_ID])
    if env.get("RANK", "").strip().isdigit():
        return int(env["RANK"])
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



#: what waits for this host's process id (:func:`after_jax_initialize`)
_AFTER_INITIALIZE: List[Callable[[], None]] = []


def jax_process_id_pending(environ=None) -> bool:
    """Whether this process will learn its id from ``jax.distributed.initialize`` and has not yet: JAX's
    multi-process start is asked for (``HF_TPU_JAX_DISTRIBUTED=1``, or ``JAX_COORDINATOR_ADDRESS`` without
    ``JAX_PROCESS_ID``: Slurm, Open MPI) and JAX is not initialized. Until then :func:`process_index` cannot say
    whether this host is the chief."""
    env = process_variables() if environ is None else environ
    state = getattr(sys.modules.get("jax._src.distributed"), "global_state", None)
    if state is not None and getattr(state, "client", None) is not None:
        return False
    if str(env.get(JAX_PROCESS_ID, "")).strip():
        return False
    asked = str(env.get(JAX_DISTRIBUTED_SWITCH, "")).strip().lower() in ("1", "true", "yes")
    return asked or bool(str(env.get(JAX_COORDINATOR_ADDRESS, "")).strip())


def after_jax_initialize(fn: Callable[[], None]) -> None:
    """Call ``fn()`` once JAX's start (:func:`run_after_jax_initialize`) has joined the processes (this host's id
    known)."""
    _AFTER_INITIALIZE.append(fn)


def run_after_jax_initialize() -> None:
    """Call (once each, in order) what :func:`after_jax_initialize` queued: JAX's start has joined the processes
    (:func:`hf_tpu_ext.backends.keras.processes.initialize_jax_distributed`)."""
    while _AFTER_INITIALIZE:
        _AFTER_INITIALIZE.pop(0)()


def cancel_after_jax_initialize(fn: Callable[[], None]) -> None:
    """Drop ``fn`` from what waits for the id (the run ended before JAX was initialized)."""
    if fn in _AFTER_INITIALIZE:
        _AFTER_INITIALIZE.remove(fn)


#: the run's output folder (:func:`note_output_dir`), named in the lost-process line
_OUTPUT_DIR: List[str] = []


def note_output_dir(output_dir: Optional[str]) -> None:
    """Remember the run's ``--output_dir`` (the run lock tells it, in every process) for the lost-process line."""
    _OUTPUT_DIR[:] = [str(output_dir)] if output_dir else []


def noted_output_dir() -> Optional[str]:
    """The ``--output_dir`` :func:`note_output_dir` remembered (``None`` before the run lock)."""
    return (_OUTPUT_DIR or [None])[0]


# ---------------------------------------------------------------------------------------------- one run's processes
#: how the processes of a run agree (:func:`from_main_process`, :func:`agreed_exit_status`): set by the backend that
#: joined them (the Keras backend's key-value store, once JAX started); empty in a one-process run
_AGREEMENT: List[object] = []


def set_process_agreement(agreement: Optional[object]) -> None:
    """Install (``None``: remove) the object that carries values between the processes of this run: it has
    ``share(key, produce) -> str`` and ``exit_status(code) -> int`` (:class:`hf_tpu_ext.backends.keras.processes.
    KeyValueAgreement`)."""
    _AGREEMENT[:] = [agreement] if agreement is not None else []


def from_main_process(key: str, produce: Callable[[], str]) -> str:
    """``produce()`` run on the main process only, its result read by the others (e.g. the tokenizer the run
    trains: trained once, the same in every process). Every process calls it with the same ``key``.

    Returns:
        the main process's ``produce()`` (a str); ``produce()`` itself in a one-process run.

    Raises:
        whatever ``produce()`` raised on the main process (on the others: a RuntimeError naming it, one line).
    """
    if not _AGREEMENT:
        return produce()
    return _AGREEMENT[0].share(key, produce)


def agreed_exit_status(code: int) -> int:
    """This process's exit status, agreed with the run's: the main process publishes ``code``; another process
    waits for it and, having nothing wrong of its own (``code`` 0), ends with the main process's (a refused final
    push is exit 1 in every process, not 0 on the others before process 0 knows). ``code`` as is in a one-process
    run."""
    if not _AGREEMENT:
        return int(code)
    return int(_AGREEMENT[0].exit_status(int(code)))


#: ``logger.info(..., extra=OWN_LINE)``: a line only this process knows (shown on every process, tagged)
OWN_LINE = {"hf_tpu_own_line": True}


class ProcessLines(logging.Filter):
    """A log handler's filter that makes a slice's terminal one run's: on process 0 every line passes; on the others
    INFO lines are dropped (process 0 says the same) and warnings, errors and lines logged with
    ``extra=OWN_LINE`` (only that process knows them) are tagged ``[process i]``. The process index is asked per line (:func:`process_index`: known once JAX
    started)."""

    def filter(self, record: logging.LogRecord) -> bool:
        index = process_index()
        if index == 0:
            return True
        if record.levelno < logging.WARNING and not getattr(record, "hf_tpu_own_line", False):
            return False
        if not getattr(record, "hf_tpu_tagged", False):
            record.msg, record.hf_tpu_tagged = f"[process {index}] {record.msg}", True
        return True
