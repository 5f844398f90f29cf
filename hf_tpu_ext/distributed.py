"""Which process does what in a distributed run (accelerate-style helpers, TensorFlow flavour).

The chief is the process that writes the output folder and talks to the Hub. Work that every replica
must take part in (collective ops, checkpoint writes under MultiWorkerMirroredStrategy) must never sit
inside a chief-only branch.

JAX's multi-process start (the Keras backend): :func:`jax_distributed_arguments` reads ``JAX_NUM_PROCESSES``/
``JAX_PROCESS_ID`` (jax 0.10 reads only ``JAX_COORDINATOR_ADDRESS``) and the time-outs, and
:func:`initialize_jax_distributed` joins the processes, refusing bad input in one line.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import os
import socket
import time


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
    if os.environ.get("JAX_PROCESS_ID", "").strip().isdigit():  # before jax.distributed.initialize (the run lock)
        return int(os.environ["JAX_PROCESS_ID"])
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


#: ``jax.distributed.initialize``'s own variable (the coordinator, ``host:port``; jax reads it itself)
JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
#: process count and this process's id: read here (jax 0.10 reads neither) and passed as arguments
JAX_NUM_PROCESSES, JAX_PROCESS_ID = "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
#: seconds to wait for every process to join (jax's ``initialization_timeout``; its default is 300)
JAX_INITIALIZATION_TIMEOUT = "HF_TPU_JAX_INITIALIZATION_TIMEOUT"
#: seconds without a heartbeat after which a process counts as lost and the others stop (default 30)
JAX_HEARTBEAT_TIMEOUT = "HF_TPU_JAX_HEARTBEAT_TIMEOUT"
DEFAULT_HEARTBEAT_TIMEOUT = 30


def _int_variable(environ, name: str, minimum: int):
    raw = str(environ.get(name, "")).strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(f"{name}={raw!r} is not an integer >= {minimum}: set it to one, or unset it.")
    return value


def jax_distributed_arguments(environ=None) -> dict:
    """Keyword arguments of ``jax.distributed.initialize`` from the environment (no JAX import).

    ``JAX_COORDINATOR_ADDRESS`` is left to JAX (it reads it itself); ``JAX_NUM_PROCESSES`` and
    ``JAX_PROCESS_ID`` become ``num_processes``/``process_id`` (absent on a TPU slice, Slurm or Open MPI: JAX finds
    them); ``HF_TPU_JAX_INITIALIZATION_TIMEOUT`` and ``HF_TPU_JAX_HEARTBEAT_TIMEOUT`` (seconds) become
    ``initialization_timeout`` and ``heartbeat_timeout_seconds`` (default 30, so a lost process stops the others
    within a minute instead of JAX's 100 s).

    Raises:
        ValueError: a variable is not an integer in range, the id is not below the count, or one of the two is
            set without the other (one line naming the variables).
    """
    env = os.environ if environ is None else environ
    count = _int_variable(env, JAX_NUM_PROCESSES, 1)
    index = _int_variable(env, JAX_PROCESS_ID, 0)
    if (count is None) != (index is None):
        raise ValueError(f"{JAX_NUM_PROCESSES} and {JAX_PROCESS_ID} go together: set both (0 <= id < count) "
                         "or neither (a TPU slice finds them itself).")
    if count is not None and index >= count:
        raise ValueError(f"{JAX_PROCESS_ID}={index} is not below {JAX_NUM_PROCESSES}={count}: "
                         f"number the processes 0 .. {count - 1}.")
    out = {"heartbeat_timeout_seconds": _int_variable(env, JAX_HEARTBEAT_TIMEOUT, 1) or DEFAULT_HEARTBEAT_TIMEOUT}
    timeout = _int_variable(env, JAX_INITIALIZATION_TIMEOUT, 1)
    if timeout is not None:
        out["initialization_timeout"] = timeout
    if count is not None:
        out.update(num_processes=count, process_id=index)
    return out


def wait_for_coordinator(address: str, timeout: float, poll: float = 0.5) -> None:
    """Wait until ``address`` (``host:port``) accepts a TCP connection, at most ``timeout`` seconds.

    Why: jax 0.10's client aborts the whole process (a C++ ``LOG(FATAL)``, exit 134, a stack trace) when the
    coordinator does not answer in time; checked here first, a process other than 0 fails with one line instead.

    Raises:
        ValueError: the address is not ``host:port``, or nothing accepted a connection within ``timeout``.
    """
    host, _, port = str(address).strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{JAX_COORDINATOR_ADDRESS}={address!r} is not host:port (e.g. 10.0.0.2:8476).")
    deadline = time.monotonic() + float(timeout)
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(5.0, max(0.1, timeout))):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise ValueError(
                    f"The JAX coordinator {address} ({JAX_COORDINATOR_ADDRESS}) did not answer within the "
                    f"{timeout:g} s time-out ({JAX_INITIALIZATION_TIMEOUT}): {err.strerror or err}. Start process 0 "
                    "first and give every process the same address (host:port of process 0).") from None
        time.sleep(poll)


def initialize_jax_distributed() -> None:
    """``jax.distributed.initialize`` with :func:`jax_distributed_arguments`; a process other than 0 first waits
    for the coordinator (:func:`wait_for_coordinator`). Must run before anything touches JAX's devices.

    Raises:
        ValueError: a bad variable, an unreachable coordinator (the time-out named), or JAX's own refusal (one
            line each).
    """
    import jax

    kwargs = jax_distributed_arguments()
    address = os.environ.get(JAX_COORDINATOR_ADDRESS, "").strip()
    timeout = kwargs.get("initialization_timeout", 300)
    logging.getLogger("hf_tpu_ext").info(
        "jax.distributed: process %s of %s, coordinator %s (time-out %d s, lost-process heartbeat %d s)",
        kwargs.get("process_id", "?"), kwargs.get("num_processes", "?"), address or "found by JAX", timeout,
        kwargs["heartbeat_timeout_seconds"])
    if address and kwargs.get("process_id", 0) > 0:
        wait_for_coordinator(address, timeout)
    try:
        jax.distributed.initialize(**kwargs)
    except (ValueError, RuntimeError) as err:  # e.g. "Number of processes must be defined."
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise ValueError(f"jax.distributed.initialize refused (coordinator {address or 'found by JAX'}): {reason} "
                         f"Set {JAX_COORDINATOR_ADDRESS}, {JAX_NUM_PROCESSES} and {JAX_PROCESS_ID} on every process, "
                         "or run on a TPU slice, Slurm or Open MPI (found by JAX).") from None
