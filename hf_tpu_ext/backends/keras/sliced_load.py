"""A transformers checkpoint read by slices into ``--fsdp``'s sharded weights (issue 50 item 3): each process
reads from ``model.safetensors`` (or its shards) only the blocks its devices hold, straight into the placed
sharding (:func:`hf_convert.sharded_weight`), so the load adds no whole host copy of the model: what a process
holds at once is one device's block of one tensor (a ``QKV_*``/``OUT_KERNEL`` block's heads whole).

The architectures' ``assign`` functions read a state dict; here its values are :class:`SlicedTensor` s. A name
table row whose variable ``--fsdp`` shards takes :meth:`SlicedTensor.placed` (:func:`.architectures.layouts.
placed_value`); every other read (a weight kept whole, RoBERTa's position rows, a comparison) reads the tensor
whole through ``np.asarray``, as before.

No JAX import at module level.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np

from hf_tpu_ext.backends.keras.hf_convert import sharded_weight
from hf_tpu_ext.backends.keras.sharding import plan_state
from hf_tpu_ext.backends.model_files import pt_safetensors_files


class ReadCount:
    """What a sliced load read: ``bytes`` in all (float32, as read), ``largest_block`` bytes of one read, and
    ``weights`` read by blocks."""

    def __init__(self):
        self.bytes = self.largest_block = self.weights = 0

    def add(self, array: np.ndarray) -> np.ndarray:
        self.bytes += int(array.nbytes)
        self.largest_block = max(self.largest_block, int(array.nbytes))
        return array


def _float32(array) -> np.ndarray:
    array = np.asarray(array)
    return array if array.dtype == np.float32 else array.astype(np.float32)


class _Counted:
    """A safetensors slice whose reads are counted (``get_shape``, ``[index]``: what ``sharded_weight`` calls)."""

    def __init__(self, slices, count: ReadCount):
        self._slices, self._count = slices, count

    def get_shape(self):
        return self._slices.get_shape()

    def __getitem__(self, index):
        return self._count.add(_float32(self._slices[index]))


class SlicedTensor:
    """One tensor of an open safetensors file, read only as far as asked.

    Attributes:
        shape: the tensor's shape (transformers' layout).

    ``np.asarray(t)`` reads it whole (float32); ``t[index]`` reads a block; :meth:`placed` builds a variable's
    value on its ``--fsdp`` sharding from the blocks each device holds.
    """

    def __init__(self, slices, sharding_for: Callable[[Any], Any], count: ReadCount):
        self._slices, self._sharding_for, self._count = slices, sharding_for, count
        self.shape = tuple(int(d) for d in slices.get_shape())

    def __getitem__(self, index) -> np.ndarray:
        return _float32(self._slices[index])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self[tuple(slice(None) for _ in self.shape)] if self.shape else _float32(self._slices[:])
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def placed(self, kind: str, variable):
        """``variable``'s value (float32 ``jax.Array`` of its ``--fsdp`` sharding) read by blocks, or ``None``
        when the variable is kept whole (then the caller reads the tensor whole).

        Raises:
            CheckpointError: the tensor's shape is not the variable's in transformers' layout (named).
        """
        sharding = self._sharding_for(variable)
        if sharding is None:
            return None
        self._count.weights += 1
        return sharded_weight(_Counted(self._slices, self._count), kind, tuple(variable.shape), sharding)


@contextlib.contextmanager
def sliced_state(folder: str, sharding_for: Callable[[Any], Any]
                 ) -> Iterator[Tuple[Optional[Dict[str, SlicedTensor]], ReadCount]]:
    """``({transformers name: SlicedTensor}, its ReadCount)`` of ``folder``'s PyTorch-format safetensors (shards
    merged), the files open inside the block; the state is ``None`` when the folder has none
    (``pytorch_model.bin``: the caller reads it whole).

    Args:
        sharding_for: Keras variable -> its ``jax.sharding.Sharding`` under ``--fsdp``, or None (kept whole):
            :func:`fsdp_shardings`.
    """
    from safetensors import safe_open

    count = ReadCount()
    files = pt_safetensors_files(folder)
    if files is None:
        yield None, count
        return
    with contextlib.ExitStack() as stack:
        state: Dict[str, SlicedTensor] = {}
        for path in files:
            f = stack.enter_context(safe_open(path, framework="numpy"))
            state.update({name: SlicedTensor(f.get_slice(name), sharding_for, count) for name in f.keys()})
        yield state, count


def fsdp_shardings(model, placement, config) -> Callable[[Any], Any]:
    """Keras variable -> the sharding ``placement.put_state`` will give it under ``--fsdp`` (its plan,
    :func:`~hf_tpu_ext.backends.keras.sharding.plan_state`, for the model's trainable variables), ``None`` for a
    variable kept whole (small, or ``shard_grad_op``'s weights) or not trainable.

    Raises:
        BackendError: a weight of 1 MiB or more the fsdp axis cannot shard (the plan's refusal, named).
    """
    from jax.sharding import NamedSharding, PartitionSpec

    variables = list(model.trainable_variables)
    plan = plan_state(variables, [], [], placement.strategy, placement.mesh_shape["fsdp"],
                      placement.min_num_params, config)
    by_id = {id(v): NamedSharding(placement.mesh, PartitionSpec(*spec))
             for v, spec in zip(variables, plan.trainable) if spec}
    return lambda variable: by_id.get(id(variable))

