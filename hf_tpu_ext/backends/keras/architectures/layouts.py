"""Array layouts shared by the architectures' transformers name tables: how a Keras variable's array becomes the
transformers (PyTorch) array of the same weight, and back. NumPy only (no framework import at module level).

- ``SAME``: the same array (embeddings, LayerNorm, biases of ``Dense``).
- ``LINEAR``: a ``Dense`` kernel ``[in, out]`` <-> a ``Linear.weight`` ``[out, in]`` (transposed).
- ``QKV_KERNEL``: an ``EinsumDense`` query/key/value kernel ``[hidden, heads, head_dim]`` <-> ``[heads * head_dim,
  hidden]`` (head-major features: a reshape, then the transpose).
- ``QKV_BIAS``: ``[heads, head_dim]`` <-> ``[heads * head_dim]``.
- ``OUT_KERNEL``: the attention output kernel ``[heads, head_dim, hidden]`` <-> ``[hidden, heads * head_dim]``.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from hf_tpu_ext.backends.keras.architectures.lazy_state import reader_of
from hf_tpu_ext.errors import CheckpointError

SAME, LINEAR, QKV_KERNEL, QKV_BIAS, OUT_KERNEL = "same", "linear", "qkv_kernel", "qkv_bias", "out_kernel"


def to_hf(kind: str, array: np.ndarray) -> np.ndarray:
    """A Keras array in transformers' layout (see the module doc); ``ValueError`` for an unknown ``kind``."""
    if kind == SAME:
        return array
    if kind == LINEAR:
        return array.T
    if kind == QKV_KERNEL:
        return array.reshape(array.shape[0], -1).T
    if kind == QKV_BIAS:
        return array.reshape(-1)
    if kind == OUT_KERNEL:
        return array.reshape(-1, array.shape[-1]).T
    raise ValueError(kind)


def from_hf(kind: str, array: np.ndarray, keras_shape: Tuple[int, ...]) -> np.ndarray:
    """The inverse of :func:`to_hf`: a transformers array as the Keras variable of shape ``keras_shape``."""
    if kind in (SAME, QKV_BIAS):
        return array.reshape(keras_shape)
    if kind in (LINEAR, QKV_KERNEL, OUT_KERNEL):  # inverse of the reshape-then-transpose
        return array.T.reshape(keras_shape)
    raise ValueError(kind)


def keras_block(kind: str, bounds, keras_shape: Tuple[int, ...], read) -> np.ndarray:
    """The block ``bounds`` (``[start, stop)`` per Keras dimension) of a Keras variable of ``keras_shape``, read from
    the transformers tensor of the same weight by slices: ``read(slices)`` returns that tensor's block (e.g.
    ``safe_open(...).get_slice(name)[slices]``), so only the rows and columns the block needs are read (a
    ``QKV_*``/``OUT_KERNEL`` block's heads whole: their ``head_dim`` features are contiguous).

    Raises:
        ValueError: an unknown ``kind``.
    """
    b = [(int(x), int(y)) for x, y in bounds]
    if kind == SAME:
        return read(tuple(slice(x, y) for x, y in b))
    if kind == LINEAR:  # [in, out] <- [out, in]
        return read((slice(*b[1]), slice(*b[0]))).T
    if kind == QKV_KERNEL:  # [hidden, heads, head_dim] <- [heads * head_dim, hidden]
        (a, z), (h0, h1), (d0, d1) = b
        hd = int(keras_shape[2])
        return read((slice(h0 * hd, h1 * hd), slice(a, z))).T.reshape(z - a, h1 - h0, hd)[:, :, d0:d1]
    if kind == QKV_BIAS:  # [heads, head_dim] <- [heads * head_dim]
        (h0, h1), (d0, d1) = b
        hd = int(keras_shape[1])
        return read((slice(h0 * hd, h1 * hd),)).reshape(h1 - h0, hd)[:, d0:d1]
    if kind == OUT_KERNEL:  # [heads, head_dim, hidden] <- [hidden, heads * head_dim]
        (h0, h1), (d0, d1), (a, z) = b
        hd = int(keras_shape[1])
        return read((slice(a, z), slice(h0 * hd, h1 * hd))).T.reshape(h1 - h0, hd, z - a)[:, d0:d1, :]
    raise ValueError(kind)


def hf_shape(kind: str, keras_shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """The transformers shape of a Keras variable of ``keras_shape``."""
    return tuple(to_hf(kind, np.zeros(keras_shape, dtype=np.float32)).shape)


def attribute(obj, path: str):
    """``obj.a.b[2].c`` for ``path`` ``"a.b.2.c"`` (integers index lists): the one reader of the name tables'
    attribute paths."""
    for name in path.split("."):
        obj = obj[int(name)] if name.isdigit() else getattr(obj, name)
    return obj


def shards_to_host(value, shards) -> np.ndarray:
    """A fully addressable ``jax.Array`` as a new NumPy array, built from its shards of ``replica_id`` 0: one host
    copy, none left cached on ``value`` (``np.asarray(value)`` keeps its copy inside the array while it lives: an
    export would leave a host copy of every weight inside the train state)."""
    out = np.empty(tuple(value.shape), dtype=value.dtype)
    for shard in shards:
        if shard.replica_id == 0:
            out[shard.index] = np.asarray(shard.data)
    return out


def variable_numpy(variable) -> np.ndarray:
    """A variable's value as a float32 numpy array (bf16/fp16 upcast; mixed precision keeps float32 anyway).

    Raises:
        CheckpointError: the value is sharded across processes (not fully replicated) and no reader is given for it
            (:func:`~.lazy_state.reading_through`).
    """
    from keras import ops  # the caller runs after the framework check (this module is read before it)

    value = variable.value if hasattr(variable, "value") else variable
    read = reader_of(value)  # sharded over processes: the blocks of the last checkpoint (lazy_state)
    if read is not None:
        array = read()  # a new host array already (convert_to_numpy would copy it again)
        return array if array.dtype == np.float32 else array.astype(np.float32)
    if getattr(value, "is_fully_addressable", True) is False:
        # a jax.Array of a multi-process run: every process holds a full copy when replicated (data parallel)
        if not getattr(value, "is_fully_replicated", False):
            raise CheckpointError(f"{getattr(variable, 'path', 'A variable')} is sharded across processes; gather it "
                                  "(jax.experimental.multihost_utils.process_allgather) before exporting.")
        value = value.addressable_data(0)
    shards = getattr(value, "addressable_shards", None)
    array = shards_to_host(value, shards) if shards is not None else np.asarray(ops.convert_to_numpy(value))
    if array.dtype != np.float32 and array.dtype.kind in ("f", "V"):
        array = array.astype(np.float32)
    return array


def take(state, name: str, shape, what: str) -> np.ndarray:
    """``state[name]`` as float32 of exactly ``shape``.

    Raises:
        CheckpointError: no ``name`` in ``state`` (``what`` names the architecture), or another shape.
    """
    if name not in state:
        raise CheckpointError(f"The checkpoint has no {name!r}; it is not a {what} model of this config.")
    array = np.asarray(state[name], dtype=np.float32)
    if tuple(array.shape) != tuple(shape):
        raise CheckpointError(f"{name} has shape {tuple(array.shape)}, the model needs {tuple(shape)} "
                              "(config.json and the weights do not match).")
    return array
