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
    ``safe_open(...).get_slice(name)[slices]``), so only the values the block holds are read (a ``QKV_*``/
    ``OUT_KERNEL`` block cut inside the heads' ``head_dim``: one read per head).

    Raises:
        ValueError: an unknown ``kind``.
    """
    b = [(int(x), int(y)) for x, y in bounds]
    if kind == SAME:
        return read(tuple(slice(x, y) for x, y in b))
    if kind == LINEAR:  # [in, out] <- [out, in]
        return read((slice(*b[1]), slice(*b[0]))).T
    if kind == QKV_KERNEL:  # [hidden, heads, head_dim] <- [heads * head_dim, hidden]
        (a, z), heads, dims = b
        return _per_head(lambda rows: read((rows, slice(a, z))), heads, dims, int(keras_shape[2])).transpose(2, 0, 1)
    if kind == QKV_BIAS:  # [heads, head_dim] <- [heads * head_dim]
        return _per_head(lambda rows: read((rows,))[:, None], b[0], b[1], int(keras_shape[1]))[:, :, 0]
    if kind == OUT_KERNEL:  # [heads, head_dim, hidden] <- [hidden, heads * head_dim]
        heads, dims, (a, z) = b
        return _per_head(lambda cols: read((slice(a, z), cols)).T, heads, dims, int(keras_shape[1]))
    raise ValueError(kind)


def _per_head(read_rows, heads, dims, head_dim: int) -> np.ndarray:
    """``[heads, dims, ...]`` from a transformers dimension of ``heads * head_dim`` features (head-major):
    ``read_rows(slice)`` returns those features' rows ``[n, ...]``. Whole heads: one read; else one per head."""
    (h0, h1), (d0, d1) = heads, dims
    if (d0, d1) == (0, head_dim):
        rows = read_rows(slice(h0 * head_dim, h1 * head_dim))
        return rows.reshape(h1 - h0, head_dim, *rows.shape[1:])
    return np.stack([read_rows(slice(h * head_dim + d0, h * head_dim + d1)) for h in range(h0, h1)])


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


def placed_value(value, kind: str, variable):
    """``variable``'s value read by blocks onto its placed sharding when ``value`` offers that (a ``placed(kind,
    variable)`` method: :class:`hf_tpu_ext.backends.keras.sliced_load.SlicedTensor` under ``--fsdp``) and its
    shape is the variable's in transformers' layout; ``None`` otherwise (the caller reads ``value`` whole, and
    names a wrong shape its own way)."""
    placed = getattr(value, "placed", None)
    if placed is None or tuple(value.shape) != hf_shape(kind, tuple(int(d) for d in variable.shape)):
        return None
    return placed(kind, variable)


def same_values(a, b, rows: int = 4096) -> bool:
    """Whether two arrays (or tensors read by slices, ``a[i:j]``) hold equal values, compared ``rows`` rows at a
    time (two vocabulary-sized tensors are never read whole at once)."""
    if np.shape(a) != np.shape(b):  # np.shape reads a tensor's .shape, not its values
        return False
    length = int(np.shape(a)[0]) if np.shape(a) else 0
    if length == 0:
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return all(np.array_equal(np.asarray(a[i: i + rows]), np.asarray(b[i: i + rows])) for i in range(0, length, rows))
