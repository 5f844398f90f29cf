"""The export's tensors moved one at a time: the train state into the model's variables, and a state dict into
``model.safetensors``, so the export's host memory peaks near the largest tensor, not near a copy of the model
(issue 50 item 3). A state sharded over processes is read, one weight at a time, from the blocks every process
wrote at the checkpoint of that state (:func:`bound_to_checkpoint`): the export runs on process 0 alone, so no
collective can gather there, and no process ever holds the whole state.

No JAX import at module level.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
from typing import Any, Mapping, Sequence

import numpy as np

from hf_tpu_ext.backends.keras.architectures.layouts import shards_to_host
from hf_tpu_ext.backends.keras.architectures.lazy_state import LazyState, reading_through
from hf_tpu_ext.backends.keras.sharded_state import whole_reader
from hf_tpu_ext.backends.model_files import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME
from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.fileio import atomic_write

logger = logging.getLogger("hf_tpu_ext")

#: safetensors' dtype names of the arrays an export writes
_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
           "int32": "I32", "uint32": "U32", "uint8": "U8", "bool": "BOOL"}


def host_array(value) -> np.ndarray:
    """One array of any sharding as a new NumPy array: gathered from this process's devices (only this array is
    copied, and no copy stays cached inside it: :func:`~.architectures.layouts.shards_to_host`).

    Raises:
        CheckpointError: the array is sharded across processes (this process does not hold all of it).
    """
    if getattr(value, "is_fully_addressable", True) is False and not getattr(value, "is_fully_replicated", False):
        raise CheckpointError("A weight is sharded across processes; the export gathers on one process only: "
                              "gather the state first (jax.experimental.multihost_utils.process_allgather).")
    if getattr(value, "is_fully_addressable", True) is False:
        value = value.addressable_data(0)
    shards = getattr(value, "addressable_shards", None)
    return shards_to_host(value, shards) if shards is not None else np.asarray(value)


def gathered_in_turn(named: Mapping[str, Any]) -> LazyState:
    """``named`` (arrays of any sharding) as a lazy mapping whose arrays are made whole on the host when read, one
    at a time: an array sharded over processes by a collective gather (``process_allgather``): every process must
    read the same names in the same order (the writer on process 0: :func:`write_safetensors`'s name order; the
    others: :func:`drain`), each dropping the tensor once written. No process holds more than one whole array."""
    lazy = LazyState()
    for name, value in named.items():
        lazy.defer(name, tuple(value.shape), lambda value=value: _whole(value), np.dtype(value.dtype))
    return lazy


def _whole(value) -> np.ndarray:
    if getattr(value, "is_fully_addressable", True) or value.is_fully_replicated:
        return host_array(value)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def drain(state: Mapping[str, Any]) -> None:
    """Read every array of ``state`` in name order and drop it: a process that does not write takes part in the
    collectives of :func:`gathered_in_turn` in the writer's order."""
    for name in sorted(state):
        state[name]


def variables_from_arrays(variables: Sequence[Any], arrays: Sequence[Any]) -> None:
    """Assign each array (any sharding) to its Keras variable as a host copy, one at a time (one array on the
    host at a time, not the whole state)."""
    for var, value in zip(variables, arrays):
        var.assign(host_array(value))


@contextlib.contextmanager
def bound_variables(variables: Sequence[Any], arrays: Sequence[Any]):
    """The Keras variables hold the given arrays themselves (no copy: ``jax.Array`` of any sharding) inside the
    block, their own values again after it.

    What the export reads the train state through: each weight is copied to the host only when the state dict
    makes its tensor (:func:`~.layouts.variable_numpy`), and the state's buffers, donated to the next train step,
    are never left inside the variables.
    """
    kept = [var.value for var in variables]
    try:
        for var, value in zip(variables, arrays):
            var.assign(value)
        yield
    finally:
        for var, value in zip(variables, kept):
            var.assign(value)


@contextlib.contextmanager
def bound_to_checkpoint(variables: Sequence[Any], arrays: Sequence[Any], folder: str, keys: Sequence[str],
                        stem: str):
    """:func:`bound_variables`, and each array made whole, when the export reads it, from its blocks in the
    checkpoint ``folder`` (``keys[i]``: ``arrays[i]``'s name in ``stem``; every process wrote its own blocks of
    exactly these arrays there): the state sharded over processes is never gathered, and this process holds one
    weight at a time. Yields the counts (``{"reads", "largest_bytes"}``), also logged once the block ends.

    Raises:
        CheckpointError: ``folder``'s blocks do not cover an array (:func:`~.sharded_state.state_index`).
    """
    read = whole_reader(folder, stem)
    counts = {"reads": 0, "largest_bytes": 0}

    def reader(key):
        def make():
            array = read(key)
            counts["reads"] += 1
            counts["largest_bytes"] = max(counts["largest_bytes"], int(array.nbytes))
            return array
        return make

    with bound_variables(variables, arrays):
        bound = [var.value for var in variables]  # what the state dict's makers read (Keras may wrap an array)
        with reading_through(bound, [reader(k) for k in keys]):
            yield counts
    logger.info("export of the state sharded over processes: %d weight reads from the blocks of %s, one at a "
                "time (largest %.2f MiB); no process gathered the state", counts["reads"],
                os.path.basename(os.path.normpath(folder)), counts["largest_bytes"] / 2**20)


def _shape_dtype(state: Mapping[str, Any], name: str):
    shape = getattr(state, "shape", None)
    if shape is not None:  # a LazyState: the shape and dtype without making the array
        return tuple(shape(name)), _DTYPES[state.dtype(name)]
    array = state[name]
    return tuple(array.shape), _DTYPES[str(array.dtype)]


def write_safetensors(path: str, state: Mapping[str, Any], metadata: Mapping[str, str]) -> None:
    """Write ``state`` as one safetensors file, each tensor made (a :class:`~.architectures.lazy_state.LazyState`
    makes it on read), written and dropped in turn; the bytes equal ``safetensors.numpy.save_file``'s for float32
    tensors (header: compact JSON, ``__metadata__`` first, tensors by name, padded with spaces to 8 bytes).

    Raises:
        CheckpointError: a tensor's made shape or dtype differs from the one announced.
    """
    names = sorted(state)
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    start, expected = 0, []
    for name in names:
        shape, dtype = _shape_dtype(state, name)
        size = int(np.prod(shape, dtype=np.int64)) * (2 if dtype in ("F16", "BF16") else
                                                       1 if dtype in ("U8", "BOOL") else 8 if dtype in ("F64", "I64")
                                                       else 4)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [start, start + size]}
        expected.append((shape, dtype, size))
        start += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, (shape, dtype, size) in zip(names, expected):
            array = np.asarray(state[name], order="C")  # (ascontiguousarray makes a 0-d array 1-d)
            if tuple(array.shape) != shape or _DTYPES.get(str(array.dtype)) != dtype:
                raise CheckpointError(f"Tensor {name} was announced as {dtype} {shape} but made as "
                                      f"{array.dtype} {tuple(array.shape)}.")
            f.write(array.reshape(-1).view(np.uint8).data)  # (bf16 has no buffer format of its own)
            del array
        f.flush()
        os.fsync(f.fileno())


def write_pt_safetensors(folder: str, state: Mapping[str, Any]) -> str:
    """``folder/model.safetensors`` (metadata ``{"format": "pt"}``) written tensor by tensor
    (:func:`write_safetensors`), atomically; a stale ``model.safetensors.index.json`` is removed so loaders do not
    pick an old sharded copy over the new file.

    Returns:
        ``"model.safetensors"``.
    """
    os.makedirs(folder, exist_ok=True)
    atomic_write(os.path.join(folder, SAFE_WEIGHTS_NAME), lambda tmp: write_safetensors(tmp, state, {"format": "pt"}))
    stale = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(stale):
        os.remove(stale)
    return SAFE_WEIGHTS_NAME
