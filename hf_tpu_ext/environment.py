"""The process variables: how a process learns it is one of several, and what JAX's start is told; read here only.

Several modules need them before any framework loads (the argument checks, the run lock's process id, the resume
line of one process, the callbacks' XLA dump, JAX's multi-process start in ``backends/keras/processes.py``); each
asks :func:`process_variables`, so every one of these variables has one reader (``tests/test_code_shape.py``).
Imports nothing of the project and no framework.
"""

from __future__ import annotations

import os
from typing import Dict

#: ``jax.distributed.initialize``'s own variable (the coordinator, ``host:port``; jax reads it itself)
JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
#: process count and this process's id: read here (jax 0.10 reads neither) and passed as arguments
JAX_NUM_PROCESSES, JAX_PROCESS_ID = "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
#: ``HF_TPU_JAX_DISTRIBUTED=1``: this process is one of several (JAX finds the cluster: a TPU slice, Slurm, MPI)
JAX_DISTRIBUTED_SWITCH = "HF_TPU_JAX_DISTRIBUTED"
#: the devices each process simulates on a CPU (with ``JAX_PLATFORMS=cpu``; the global batch counts them)
JAX_NUM_CPU_DEVICES, JAX_PLATFORMS, XLA_FLAGS = "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS", "XLA_FLAGS"
#: seconds: every process joins within it (jax's ``initialization_timeout``), a lost heartbeat, the wait at exit
JAX_TIMEOUTS = ("HF_TPU_JAX_INITIALIZATION_TIMEOUT", "HF_TPU_JAX_HEARTBEAT_TIMEOUT", "HF_TPU_JAX_SHUTDOWN_TIMEOUT")
#: what tells a process its place without JAX's variables: torch's rank, a TPU slice's hosts, Slurm, Open MPI
CLUSTER_VARIABLES = ("RANK", "TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE")
#: every variable :func:`process_variables` reads
PROCESS_VARIABLE_NAMES = (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID, JAX_DISTRIBUTED_SWITCH,
                          JAX_NUM_CPU_DEVICES, JAX_PLATFORMS, XLA_FLAGS, *JAX_TIMEOUTS, *CLUSTER_VARIABLES)


def process_variables() -> Dict[str, str]:
    """``{name: value}`` of the :data:`PROCESS_VARIABLE_NAMES` set in this process's environment now (a copy:
    writing to it changes nothing)."""
    found = {name: os.environ.get(name) for name in PROCESS_VARIABLE_NAMES}
    return {name: value for name, value in found.items() if value is not None}
