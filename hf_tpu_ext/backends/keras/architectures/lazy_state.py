"""A state dict whose tensors are made when read: what an export walks tensor by tensor.

An architecture's ``state_dict`` returns a :class:`LazyState`: each name knows its shape (float32) and how to make
its array from the model's variable; the array is made on each read and not kept, so a writer that reads one tensor,
writes it and drops it (``export.write_safetensors``) holds one tensor of the model at a time, not a second copy of
the model. Reading it as a dict (``dict(state)``, ``state.items()``) makes every tensor, as a plain dict would hold.

A weight sharded over *processes* (``--fsdp`` on several hosts) is not whole on any one of them: inside
:func:`reading_through` such an array is made by the reader given for it (the export reads it from the blocks every
process wrote at the last checkpoint: :func:`~hf_tpu_ext.backends.keras.tensor_files.bound_to_checkpoint`).
"""

from __future__ import annotations

import contextlib
from collections.abc import MutableMapping
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np


class LazyState(MutableMapping):
    """``{transformers name: float32 array}``, iterated in name order, each array made on read.

    ``lazy[name] = array`` stores an array as it is; :meth:`defer` stores a maker and its result's shape (and
    dtype: a checkpoint's blocks are of any dtype).
    """

    def __init__(self):
        self._makers: Dict[str, Tuple[Tuple[int, ...], Callable[[], np.ndarray]]] = {}
        self._dtypes: Dict[str, str] = {}

    def defer(self, name: str, shape: Tuple[int, ...], make: Callable[[], np.ndarray], dtype: Any = "float32") -> None:
        """``name``'s array will be ``make()`` (``dtype``, C-contiguous, of ``shape``), made at each read."""
        self._makers[name] = (tuple(int(d) for d in shape), make)
        self._dtypes[name] = str(np.dtype(dtype))

    def shape(self, name: str) -> Tuple[int, ...]:
        """The shape of ``name``'s array, without making it."""
        return self._makers[name][0]

    def dtype(self, name: str) -> str:
        """The NumPy dtype name of ``name``'s array (``"float32"``), without making it."""
        return self._dtypes[name]

    def maker(self, name: str) -> Callable[[], np.ndarray]:
        """What makes ``name``'s array (to build another tensor from it, still lazily)."""
        return self._makers[name][1]

    def __getitem__(self, name: str) -> np.ndarray:
        return self._makers[name][1]()

    def __setitem__(self, name: str, array: Any) -> None:
        array = np.asarray(array, order="C")  # (ascontiguousarray makes a 0-d array 1-d)
        self._makers[name] = (tuple(array.shape), lambda: array)
        self._dtypes[name] = str(array.dtype)

    def __delitem__(self, name: str) -> None:
        del self._makers[name]
        del self._dtypes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._makers))

    def __len__(self) -> int:
        return len(self._makers)

    def __repr__(self) -> str:
        return f"LazyState({len(self)} tensors)"


#: id(array) -> what makes that array whole on this process (inside :func:`reading_through` only)
_READERS: Dict[int, Callable[[], np.ndarray]] = {}


@contextlib.contextmanager
def reading_through(arrays: Sequence[Any], readers: Sequence[Callable[[], np.ndarray]]):
    """Inside the block, ``reader_of(arrays[i])`` is ``readers[i]`` (each makes its array whole, float32, on this
    process): how an array sharded over processes is read where the process holds only its blocks. The arrays stay
    alive through the block (their ids are the keys)."""
    keys = [id(a) for a in arrays]
    _READERS.update(zip(keys, readers))
    try:
        yield
    finally:
        for key in keys:
            _READERS.pop(key, None)


def reader_of(value: Any) -> Optional[Callable[[], np.ndarray]]:
    """The reader :func:`reading_through` gave for ``value``, or None."""
    return _READERS.get(id(value))
