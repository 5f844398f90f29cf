"""Where the Keras backend's arrays live: a 1-D device mesh over every device of every process.

The state is replicated; each batch is sharded by rows over the mesh's ``"data"`` axis.
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

    def put_batch(self, batch: Dict[str, np.ndarray], axis: int) -> Dict[str, Any]:
        """A host batch (the same global values on every process) as global arrays sharded by rows.

        Uses ``jax.make_array_from_callback``: each process fills only its own devices' shards, so it works on a
        multi-host TPU slice as on one host.
        """
        import jax

        out = {}
        for k, v in batch.items():
            sharding = self.batch_sharding(axis)
            out[k] = jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index])
        return out

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

    def put_replicated(self, values):
        import jax

        return [jax.make_array_from_callback(np.shape(v), self.replicated, lambda index, v=v: np.asarray(v)[index])
                for v in values]
