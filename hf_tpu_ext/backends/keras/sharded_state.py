"""Named arrays of any sharding <-> safetensors files, one per writing process, restorable onto any mesh.

Why safetensors and not orbax-checkpoint: the checkpoint stays what the Hub, transformers and a checkpoint of an
older release read (a replicated state is one ``<stem>.safetensors`` of whole tensors, byte for byte today's
format), a checkpoint folder stays a few flat files (the Hub's ``last-checkpoint/`` and ``hf-tpu push`` take it as
it is), and the folder's atomicity stays the one tmp-folder rename of :mod:`.checkpoint`.

Layout of one stem (``model_state``, ``optimizer_state``) in a folder:

* process ``p`` writes ``<stem>.safetensors`` (p = 0) or ``<stem>-<p:05d>.safetensors`` with the shards it holds
  whose ``replica_id`` is 0 (each distinct block of every array is written once, by the process holding its
  first replica; a replicated array: process 0 writes it whole);
* a block covering the whole array is keyed by the array's name (today's format); a part is keyed
  ``<name>@<start>:<stop>,...`` and listed in the file's metadata ``pieces`` (JSON: key -> ``{"name", "shape",
  "index"}``: the array's global shape and the part's ``[start, stop)`` per dimension).

A restore (:func:`restore_state`) builds each target array with ``jax.make_array_from_callback``: every device's
block is cut from the parts that overlap it (``safe_open(...).get_slice``: only those bytes are read), so a state
saved on 4 devices sharded restores onto 2 devices, replicated, or another mesh, and each process reads only what
its devices hold.

No JAX import at module level (the checks before JAX starts read checkpoints too).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from hf_tpu_ext.backends.keras.architectures.lazy_state import LazyState
from hf_tpu_ext.errors import CheckpointError

#: metadata key of a file's parts (JSON)
PIECES_KEY = "pieces"
Bounds = List[Tuple[int, int]]


class Part(NamedTuple):
    """One stored block of a named array: the file it is in, its key there, its ``[start, stop)`` per dimension."""
    file: str
    key: str
    bounds: Tuple[Tuple[int, int], ...]


class Entry(NamedTuple):
    """A named array of a checkpoint: its global shape and the parts that hold it."""
    shape: Tuple[int, ...]
    parts: List[Part]


def process_file(stem: str, process_index: int) -> str:
    """The file process ``process_index`` writes for ``stem``: ``model_state.safetensors`` (process 0, the name of
    every checkpoint so far) or ``model_state-00001.safetensors``."""
    return f"{stem}.safetensors" if int(process_index) == 0 else f"{stem}-{int(process_index):05d}.safetensors"


def stem_files(folder: str, stem: str) -> List[str]:
    """The files of ``stem`` in ``folder`` (names, process 0's first)."""
    pattern = re.compile(rf"^{re.escape(stem)}(?:-(\d{{5}}))?\.safetensors$")
    found = [(int(m.group(1) or 0), n) for n in os.listdir(folder) for m in [pattern.match(n)] if m]
    return [n for _, n in sorted(found)]


def _bounds(index, shape) -> Bounds:
    """A shard's index (slices, ``None`` ends) as ``[start, stop)`` pairs of ``shape``."""
    return [tuple(int(x) for x in sl.indices(int(dim))[:2]) for sl, dim in zip(index, shape)]


def local_blocks(named: Dict[str, Any], process_index: int) -> Tuple[LazyState, Dict[str, Any]]:
    """This process's blocks to write: ``(tensors by key, pieces metadata)`` (module doc).

    ``named`` values: ``jax.Array`` of any sharding (its addressable shards of ``replica_id`` 0, each copied to the
    host only when its tensor is read: a :class:`~.architectures.lazy_state.LazyState`, so a writer that writes one
    tensor at a time holds one block on the host, not this process's share of the state) or host arrays (NumPy:
    written whole by process 0).
    """
    tensors = LazyState()
    pieces: Dict[str, Any] = {}
    for name, value in named.items():
        shards = getattr(value, "addressable_shards", None)
        if shards is None:
            if int(process_index) == 0:  # np.array, not ascontiguousarray: that turns a 0-d value into shape (1,)
                tensors[name] = np.array(value, order="C")
            continue
        shape = tuple(int(d) for d in value.shape)
        for shard in shards:
            if shard.replica_id != 0:
                continue
            bounds = _bounds(shard.index, shape)
            key = name
            if not all(b == (0, d) for b, d in zip(bounds, shape)):
                key = f"{name}@{','.join(f'{a}:{b}' for a, b in bounds)}"
            tensors.defer(key, [b - a for a, b in bounds], lambda data=shard.data: np.array(data, order="C"),
                          shard.data.dtype)
            if key != name:
                pieces[key] = {"name": name, "shape": list(shape), "index": [list(b) for b in bounds]}
    return tensors, pieces


def save_state(folder: str, named_arrays: Dict[str, Any], stem: str, process_index: Optional[int] = None,
               metadata: Optional[Dict[str, str]] = None, write=None) -> Optional[str]:
    """Write this process's blocks of ``named_arrays`` (any sharding) into ``folder/<stem>[-<p>].safetensors``,
    flushed to disk; a process other than 0 holding no first replica writes nothing.

    Every process of a multi-process run calls it with the same names (each writes its own file, concurrently;
    ``folder`` must be one folder they all see when the state is sharded across processes). The caller makes the
    folder atomic (:func:`hf_tpu_ext.backends.keras.checkpoint.save_checkpoint`).

    Args:
        named_arrays: name -> ``jax.Array`` (replicated or sharded) or NumPy array (process 0 writes it whole).
        stem: the file stem (``model_state``).
        process_index: this process (``None``: ``jax.process_index()`` when JAX is imported, else 0).
        metadata: extra string metadata of the file (``format``).
        write: ``(path, tensors, metadata) -> None`` writing and flushing one safetensors file (``tensors``: a
            lazy mapping, each block copied to the host when read; ``None``: ``safetensors.numpy.save_file`` of
            them all and ``fsync``).

    Returns:
        the file written, or None.
    """
    from safetensors.numpy import save_file

    if process_index is None:
        process_index = _process_index()
    tensors, pieces = local_blocks(named_arrays, process_index)
    if not tensors and process_index != 0:  # process 0's file always (the folder's mark, as before)
        return None
    os.makedirs(folder, exist_ok=True)  # another process's view of process 0's folder (one shared file system)
    meta = dict(metadata or {})
    if pieces:
        meta[PIECES_KEY] = json.dumps(pieces, sort_keys=True)
    path = os.path.join(folder, process_file(stem, process_index))
    if write is not None:
        write(path, tensors, meta)
        return path
    save_file(dict(tensors.items()), path, metadata=meta)
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    return path


def _process_index() -> int:
    import sys

    jax = sys.modules.get("jax")  # the Keras-on-TensorFlow process never imports JAX: one process
    return int(jax.process_index()) if jax is not None else 0


def state_index(folder: str, stem: str) -> Dict[str, Entry]:
    """Every named array of ``stem`` in ``folder`` with its shape and parts (file headers only; no tensor read).

    Raises:
        CheckpointError: no file of ``stem``, a file that is not safetensors, or an array whose parts do not cover
            it (a process's file missing: the state was sharded over processes whose output folders differ).
    """
    from safetensors import safe_open

    names = stem_files(folder, stem) if os.path.isdir(folder) else []
    if not names:
        raise CheckpointError(f"Checkpoint {folder} lacks {stem}.safetensors.")
    index: Dict[str, Entry] = {}
    for name in names:
        file = os.path.join(folder, name)
        try:
            with safe_open(file, framework="numpy") as f:
                pieces = json.loads((f.metadata() or {}).get(PIECES_KEY, "{}"))
                for key in f.keys():
                    piece = pieces.get(key)
                    if piece is None:
                        shape = tuple(f.get_slice(key).get_shape())
                        index[key] = Entry(shape, [Part(file, key, tuple((0, d) for d in shape))])
                        continue
                    entry = index.setdefault(piece["name"], Entry(tuple(piece["shape"]), []))
                    entry.parts.append(Part(file, key, tuple(tuple(b) for b in piece["index"])))
        except CheckpointError:
            raise
        except Exception as err:  # SafetensorError, OSError, a garbled metadata
            raise CheckpointError(f"Checkpoint file {file} cannot be read ({type(err).__name__}: "
                                  f"{str(err).splitlines()[0][:200] if str(err) else ''}).") from None
    for name, entry in index.items():
        held = sum(int(np.prod([b - a for a, b in part.bounds])) for part in entry.parts)
        if held != int(np.prod(entry.shape)):
            raise CheckpointError(
                f"Checkpoint {folder} holds {held} of the {int(np.prod(entry.shape))} values of {name} in "
                f"{len(names)} {stem} file(s): a process's file is missing (a state sharded over processes needs "
                "one --output_dir every process sees).")
    return index


def state_shapes(folder: str, stem: str) -> Dict[str, Tuple[int, ...]]:
    """``{name: global shape}`` of ``stem``'s arrays in ``folder`` (:func:`state_index`; same errors)."""
    return {name: entry.shape for name, entry in state_index(folder, stem).items()}


def _read_block(handles, entry: Entry, bounds: Bounds, dtype) -> np.ndarray:
    """The block ``bounds`` of one array, cut from the parts that overlap it."""
    if not bounds:  # 0-d: one part, whole
        part = entry.parts[0]
        return np.asarray(handles(part.file).get_tensor(part.key), dtype=dtype)
    out = np.empty([b - a for a, b in bounds], dtype=dtype)
    for part in entry.parts:
        cut = [(max(a, pa), min(b, pb)) for (a, b), (pa, pb) in zip(bounds, part.bounds)]
        if any(lo >= hi for lo, hi in cut):
            continue
        src = tuple(slice(lo - pa, hi - pa) for (lo, hi), (pa, _) in zip(cut, part.bounds))
        dst = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(cut, bounds))
        out[dst] = handles(part.file).get_slice(part.key)[src]
    return out


#: safetensors' dtype names -> NumPy's (BF16: JAX's bfloat16, a NumPy extension dtype)
_NUMPY_DTYPES = {"F32": "float32", "F16": "float16", "F64": "float64", "I64": "int64", "I32": "int32",
                 "U32": "uint32", "U8": "uint8", "BOOL": "bool"}


def _file_header(file: str) -> Tuple[Dict[str, Any], int]:
    """A safetensors file's header (name -> ``dtype``, ``shape``, ``data_offsets``) and where its data starts."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)), 8 + size


def _numpy_dtype(name: str):
    if name == "BF16":
        import jax.numpy as jnp  # the keras backend's own framework; its bfloat16 is the dtype arrays carry

        return np.dtype(jnp.bfloat16)
    return np.dtype(_NUMPY_DTYPES[name])


def whole_reader(folder: str, stem: str):
    """``read(name) -> array``: one named array of ``stem`` in ``folder`` made whole on this process from every
    process's blocks, each block read with plain file reads straight into the result where it is contiguous there
    (a block of dimension 0, ``--fsdp``'s usual cut), else through one block-sized buffer: no file stays mapped, so
    the host holds about the one array (headers read once here).

    Raises:
        CheckpointError: as :func:`state_index`; on read, a name the checkpoint lacks or a block cut short.
    """
    index = state_index(folder, stem)
    headers: Dict[str, Tuple[Dict[str, Any], int]] = {}

    def read(name: str) -> np.ndarray:
        entry = index.get(name)
        if entry is None:
            raise CheckpointError(f"Checkpoint {folder} lacks {stem} {name}.")
        out = None
        for part in entry.parts:
            if part.file not in headers:
                headers[part.file] = _file_header(part.file)
            header, start = headers[part.file]
            info = header[part.key]
            dtype = _numpy_dtype(info["dtype"])
            out = np.empty(entry.shape, dtype) if out is None else out
            view = out[tuple(slice(a, b) for a, b in part.bounds)] if part.bounds else out
            target = view if view.flags.c_contiguous else np.empty(view.shape, dtype)
            with open(part.file, "rb") as f:
                f.seek(start + int(info["data_offsets"][0]))
                got = f.readinto(target.reshape(-1).view(np.uint8))
            if got != target.nbytes:
                raise CheckpointError(f"Checkpoint {folder}: {part.key} of {os.path.basename(part.file)} is cut short.")
            if target is not view:
                view[...] = target
        return out

    return read


def restore_state(folder: str, targets: Dict[str, Any], stem: str) -> Dict[str, Any]:
    """Read ``stem``'s arrays from ``folder`` onto the targets' shardings, whatever sharding or device count they
    were saved from.

    Args:
        targets: checkpoint name -> ``jax.ShapeDtypeStruct`` with a ``sharding`` (the result is a ``jax.Array`` of
            that sharding; each process reads only the blocks its devices hold), or anything with ``shape`` and
            ``dtype`` and ``sharding = None`` (the result is a NumPy array, read whole).

    Returns:
        name -> array, in the targets' order and dtypes.

    Raises:
        CheckpointError: a name missing, a shape that differs (named), or a file that cannot be read.
    """
    from safetensors import safe_open

    index = state_index(folder, stem)
    with contextlib.ExitStack() as stack:
        opened: Dict[str, Any] = {}

        def handles(file):
            if file not in opened:
                opened[file] = stack.enter_context(safe_open(file, framework="numpy"))
            return opened[file]

        out: Dict[str, Any] = {}
        for name, target in targets.items():
            entry = index.get(name)
            shape = tuple(int(d) for d in target.shape)
            if entry is None or entry.shape != shape:
                raise CheckpointError(f"Checkpoint {folder} does not fit: {stem} {name} "
                                      f"{'is missing' if entry is None else f'has shape {entry.shape}, not {shape}'}.")
            dtype = np.dtype(target.dtype)
            sharding = getattr(target, "sharding", None)
            if sharding is None:
                out[name] = _read_block(handles, entry, [(0, d) for d in shape], dtype)
                continue
            import jax

            out[name] = jax.make_array_from_callback(
                shape, sharding, lambda i, e=entry, s=shape, t=dtype: _read_block(handles, e, _bounds(i, s), t))
        return out
