"""Where the Keras backend's arrays live: a device mesh over every device of every process.

Without ``--fsdp``: a 1-D mesh (axis ``"data"``), the state replicated. With ``--fsdp``: a 2-D mesh
``("data", "fsdp")`` (``--fsdp_config`` ``mesh``; default every device on ``"fsdp"``) and each state variable put
with the spec :mod:`~hf_tpu_ext.backends.keras.sharding` plans (:meth:`Placement.put_state`). Each batch is
sharded by rows over every device (``"data"``, or both axes). Each process builds
only the rows its own devices hold (:meth:`Placement.process_batch_rows`) and hands them over with
``jax.make_array_from_process_local_data`` (:meth:`Placement.put_batch`), so host input work and memory per
process scale with its devices, not with the global batch.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

import numpy as np

from hf_tpu_ext.args.fsdp import fsdp_strategy
from hf_tpu_ext.backends.keras.sharding import StatePlan, describe, gather_whole, held_bytes, plan_state
from hf_tpu_ext.errors import BackendError

logger = logging.getLogger("hf_tpu_ext")


def mesh_shape(mesh: Optional[Dict[str, int]], devices: int) -> Dict[str, int]:
    """``{"data": D, "fsdp": F}`` with ``D x F = devices`` from ``--fsdp_config`` ``mesh`` (a missing axis is what
    the device count leaves; none: ``{"data": 1, "fsdp": devices}``).

    Raises:
        BackendError: sizes whose product is not the device count.
    """
    mesh = dict(mesh or {})
    if "data" in mesh and "fsdp" not in mesh and devices % mesh["data"] == 0:
        mesh["fsdp"] = devices // mesh["data"]
    if "fsdp" in mesh and "data" not in mesh and devices % mesh["fsdp"] == 0:
        mesh["data"] = devices // mesh["fsdp"]
    shape = {"data": int(mesh.get("data", 1)), "fsdp": int(mesh.get("fsdp", devices))}
    if shape["data"] * shape["fsdp"] != devices:
        given = " x ".join(f"{k} {v}" for k, v in (mesh or {}).items())
        raise BackendError(f"--fsdp_config mesh {given} does not cover the run's {devices} devices (data x fsdp must "
                           f"equal them); pass sizes whose product is {devices}.")
    return shape


class Placement:
    """Where arrays live: a ``jax.sharding.Mesh`` over every device of every process.

    Args:
        devices: the mesh's devices (default: ``jax.devices()``, every process's).
        fsdp: ``--fsdp`` (None: the state replicated over a 1-D ``"data"`` mesh).
        fsdp_config: ``--fsdp_config`` as read by :func:`hf_tpu_ext.args.fsdp.parse_fsdp_config` (``mesh``,
            ``min_num_params``).

    Attributes:
        mesh: the mesh; ``replicated``: a replicated sharding; ``num_devices``: devices in the mesh;
        ``strategy``: ``"full_shard"``, ``"shard_grad_op"`` or None; ``plan``: the state's specs (after
        :meth:`put_state` under ``--fsdp``); ``memory``: the compiled step's figures per device (after its first
        call, :class:`~hf_tpu_ext.backends.keras.step.TrainStep`).

    Raises:
        BackendError: a ``--fsdp_config`` mesh that does not cover the devices.
    """

    def __init__(self, devices=None, fsdp: Optional[str] = None, fsdp_config: Optional[Dict[str, Any]] = None):
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.devices = list(devices if devices is not None else jax.devices())
        self.num_devices = len(self.devices)
        self.strategy = fsdp_strategy(fsdp)
        config = fsdp_config or {}
        if self.strategy is None:
            self.mesh_shape = {"data": self.num_devices}
            self.mesh = Mesh(np.array(self.devices), ("data",))
            self.batch_axes = "data"
        else:  # "data" across hosts or slices (process-major device order), "fsdp" within
            self.mesh_shape = mesh_shape(config.get("mesh"), self.num_devices)
            grid = np.array(self.devices).reshape(self.mesh_shape["data"], self.mesh_shape["fsdp"])
            self.mesh = Mesh(grid, ("data", "fsdp"))
            self.batch_axes = ("data", "fsdp")  # the batch still split over every device
        self.min_num_params = int(config.get("min_num_params", 0))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self._P, self._NamedSharding = PartitionSpec, NamedSharding
        self.plan: Optional[StatePlan] = None
        self.memory: Dict[str, Any] = {}

    def batch_sharding(self, axis: int):
        """Rows (dimension ``axis``) split over every device, the rest replicated."""
        spec = [None] * (axis + 1)
        spec[axis] = self.batch_axes
        return self._NamedSharding(self.mesh, self._P(*spec))

    def put_state(self, trainable, non_trainable, optimizer_variables, config=None):
        """The train state ``(trainable, non_trainable, optimizer)`` (tuple of lists of jax.Arrays) from Keras
        variables: replicated, or under ``--fsdp`` with the specs of :func:`~hf_tpu_ext.backends.keras.sharding.
        plan_state` (planned at the first call, logged once; ``config``: the model's, naming the dimensions).

        Raises:
            BackendError: a weight of 1 MiB or more that the fsdp axis cannot shard (named).
        """
        groups = (trainable, non_trainable, optimizer_variables)
        if self.strategy is None:
            return tuple(self.put_replicated([v.value for v in vs]) for vs in groups)
        plan = self.plan_for(*groups, config=config)
        specs = (plan.trainable, plan.non_trainable, plan.optimizer)
        return tuple([self.put_sharded(v.value, spec) for v, spec in zip(vs, sp)] for vs, sp in zip(groups, specs))

    def plan_for(self, trainable, non_trainable, optimizer_variables, config=None) -> StatePlan:
        """The ``--fsdp`` state plan :meth:`put_state` places by (:func:`~hf_tpu_ext.backends.keras.sharding.
        plan_state` over this mesh's fsdp axis and ``min_num_params``), made at the first call and logged once; it
        reads only each variable's ``path``, ``shape`` and ``dtype`` (benchmarks/compiled_memory.py plans deferred
        variables so). Under no ``--fsdp`` there is none (BackendError).

        Raises:
            BackendError: no ``--fsdp`` strategy; a weight of 1 MiB or more the fsdp axis cannot shard (named).
        """
        if self.strategy is None:
            raise BackendError("The state is planned only under --fsdp; pass --fsdp full_shard or shard_grad_op.")
        if self.plan is None:
            self.plan = plan_state(trainable, non_trainable, optimizer_variables, self.strategy,
                                   self.mesh_shape["fsdp"], self.min_num_params, config)
            logger.info("%s.", describe(self.plan, self.mesh_shape, self.strategy))
        return self.plan

    def put_sharded(self, value, spec: tuple):
        """One global array of the host ``value`` (every process holds it whole) with ``PartitionSpec(*spec)``:
        each device gets only its slice."""
        import jax

        sharding = self._NamedSharding(self.mesh, self._P(*spec))
        if getattr(value, "sharding", None) is not None and value.sharding.is_equivalent_to(sharding, value.ndim):
            return value  # already placed (a --fsdp load read by slices: hf_tpu_ext.backends.keras.sliced_load)
        host = np.asarray(value)
        # each slice copied: on a CPU both np.asarray and the device put may alias (zero-copy), and a shard that is
        # a view would keep the whole array (and the Keras variable's buffer under it) alive
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index].copy())

    def grad_sharding(self, grads):
        """``grads`` (one per trainable weight, inside the traced step) constrained to the plan's specs under
        ``--fsdp`` (``jax.lax.with_sharding_constraint``: a reduce-scatter instead of an all-reduce); as they are
        otherwise. Read while the step is traced, after :meth:`put_state`."""
        if self.plan is None:
            return grads
        import jax

        return [jax.lax.with_sharding_constraint(g, self._NamedSharding(self.mesh, self._P(*spec)))
                for g, spec in zip(grads, self.plan.grads)]

    def gather_for_use(self, trainable):
        """``trainable`` (inside the traced step, where the forward reads it) with each ``full_shard``-sharded weight
        constrained whole on every device (``jax.lax.with_sharding_constraint`` to replicated: one all-gather per
        weight, and the gradient's transpose summed over the batch as in the replicated step, then cut to the
        shards by :meth:`grad_sharding`). Without it GSPMD's propagation alone split activations along weights'
        sharded dimensions instead: with the word embeddings sharded on the hidden dimension (a vocabulary no
        device count divides, as ``hf-tpu train``'s small preset gets) every layer's activations were split on
        hidden and resharded (small preset, 4 devices: 51 all-gathers, 61 all-reduces, 53 all-to-alls, 406 MB;
        now 72 all-gathers of the weights, the replicated step's 2 all-reduces, 45 MB). As they are otherwise
        (replicated, ``shard_grad_op``). Read while the step is traced, after :meth:`put_state`."""
        if self.plan is None or self.strategy != "full_shard":
            return trainable
        import jax

        return [jax.lax.with_sharding_constraint(w, self.replicated) if spec else w
                for w, spec in zip(trainable, self.plan.trainable)]

    def gather_updated(self, trainable):
        """``shard_grad_op``: the weights the optimizer step returns (traced), updated on their gradients' shards and
        made whole again by one all-gather per module (:attr:`StatePlan.gather_groups`,
        :func:`~hf_tpu_ext.backends.keras.sharding.gather_whole`; 75 all-gathers -> 8 on the small preset, the same
        CPU time); as they are otherwise."""
        if self.plan is None or self.strategy != "shard_grad_op":
            return trainable
        rows = self._NamedSharding(self.mesh, self._P("fsdp", None))
        out = list(trainable)
        for group in self.plan.gather_groups:
            dims = [self.plan.grads[i].index("fsdp") for i in group]
            whole = gather_whole([trainable[i] for i in group], dims, self.mesh_shape["fsdp"], rows, self.replicated)
            for i, w in zip(group, whole):
                out[i] = w
        return out

    def summary_fields(self, state=None) -> Dict[str, Any]:
        """``training_summary.json``'s sharding and memory figures: ``fsdp``, ``mesh``, ``state_bytes_per_device``
        (from ``state``'s shardings) and the compiled step's :attr:`memory`."""
        fields: Dict[str, Any] = {"fsdp": self.strategy, "mesh": dict(self.mesh_shape)}
        if state is not None:
            arrays = [a for part in state for a in part]
            fields["state_bytes_per_device"] = held_bytes(arrays)
            fields["replicated_state_bytes_per_device"] = held_bytes([a for a in arrays if a.sharding.is_fully_replicated])
        if self.memory:
            fields["step_memory_per_device"] = dict(self.memory)
        return fields

    def process_rows(self, rows: int) -> np.ndarray:
        """The positions (int64, ascending) of a ``rows``-long sharded axis that this process's devices hold.

        Ascending is the order ``jax.make_array_from_process_local_data`` maps process-local data to its devices.
        One process: ``0 .. rows-1``.

        Raises:
            ValueError: ``rows`` is not a multiple of the device count.
        """
        if rows % self.num_devices:
            raise ValueError(f"{rows} rows do not split over {self.num_devices} devices.")
        held = self.batch_sharding(0).addressable_devices_indices_map((int(rows),))
        return np.unique(np.concatenate([np.arange(rows)[index[0]] for index in held.values()]))

    def process_batch_rows(self, global_batch: int, accumulation: int = 1) -> np.ndarray:
        """This process's positions (int64 ``[A * R]``) in a global batch of ``B`` rows split into ``A`` micro-batches.

        Micro-batch ``i`` holds global rows ``i * B/A .. (i+1) * B/A - 1`` (the step's ``[A, B/A, ...]`` layout,
        sharded on the ``B/A`` axis), so the result is micro-batch-major: reshaped to ``[A, R]`` it is each
        micro-batch's rows of this process.
        """
        per_micro = int(global_batch) // int(accumulation)
        local = self.process_rows(per_micro)
        return (np.arange(int(accumulation))[:, None] * per_micro + local[None, :]).reshape(-1)

    def put_batch(self, batch: Dict[str, np.ndarray], axis: int) -> Dict[str, Any]:
        """This process's rows of a batch (``axis``: its rows, ordered as :meth:`process_rows`) as global arrays.

        ``jax.make_array_from_process_local_data``: the global row count is this process's times the process
        count (a uniform data-parallel mesh), each device gets its slice; one process hands over the whole batch.
        """
        import jax

        sharding = self.batch_sharding(axis)
        return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}

    def any_process(self, flag: bool) -> bool:
        """True when ``flag`` is true in any process (a collective: every process calls it at the same point).

        One process: ``flag`` itself, no device work. Several: a ``process_allgather`` of one int32 per process
        (the signal agreement at each call boundary; a few ms on CPU, measured in the multi-process test).
        """
        import jax

        if jax.process_count() == 1:
            return bool(flag)
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.array([int(bool(flag))], np.int32))))

    def gather_texts(self, text: str) -> list:
        """Every process's ``text`` (str), by process index (a collective: every process calls it at the same point).

        One process: ``[text]``. Several: two ``process_allgather`` calls (the lengths, then the UTF-8 bytes
        padded to the longest), a few hundred bytes per process for a ``--streaming`` position.
        """
        import jax

        if jax.process_count() == 1:
            return [text]
        from jax.experimental import multihost_utils

        data = np.frombuffer(text.encode("utf-8"), np.uint8)
        sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[: data.size] = data
        rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
        return [bytes(row[: int(n)]).decode("utf-8") for row, n in zip(rows, sizes)]

    def put_replicated(self, values):
        import jax

        return [jax.make_array_from_callback(np.shape(v), self.replicated, lambda index, v=v: np.asarray(v)[index])
                for v in values]
