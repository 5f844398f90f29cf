"""Where the Keras backend's arrays live: a 1-D device mesh over every device of every process.

The state is replicated; each batch is sharded by rows over the mesh's ``"data"`` axis. Each process builds
only the rows its own devices hold (:meth:`Placement.process_batch_rows`) and hands them over with
``jax.make_array_from_process_local_data`` (:meth:`Placement.put_batch`), so host input work and memory per
process scale with its devices, not with the global batch.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np


class Placement:
    """Where arrays live: a 1-D ``jax.sharding.Mesh`` (axis ``"data"``) over every device of every process.

    Attributes:
        mesh: the mesh; ``replicated``: sharding of the state; ``num_devices``: devices in the mesh.
    """

    def __init__(self, devices=None):
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.devices = list(devices if devices is not None else jax.devices())
        self.mesh = Mesh(np.array(self.devices), ("data",))
        self.num_devices = len(self.devices)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self._P, self._NamedSharding = PartitionSpec, NamedSharding

    def batch_sharding(self, axis: int):
        """Rows (dimension ``axis``) split over the devices, the rest replicated."""
        spec = [None] * (axis + 1)
        spec[axis] = "data"
        return self._NamedSharding(self.mesh, self._P(*spec))

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
