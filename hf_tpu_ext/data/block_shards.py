"""Pre-tokenized block shards the Keras backend reads without TensorFlow: Arrow IPC files, read row by row.

Layout of a folder written by ``hf-tpu prepare-data --shard_format arrow`` (a local folder or an fsspec URL:
``gs://``, ``s3://``, ``memory://``, ``file://``)::

    manifest.json                  {"format": FORMAT, "max_seq_length": L, "tokenizer": "tokenizer",
                                    "tokenizer_sha256": ..., "rows_per_batch": R,
                                    "splits": {"train": {"num_blocks", "num_tokens",
                                                         "files": [{"name", "num_blocks"}]}}}
    train-00000-of-00008.arrow     Arrow IPC file, one column "input_ids": fixed_size_list<int32>[L], record
                                   batches of R rows
    tokenizer/                     the tokenizer the ids were made with

Why Arrow IPC (the format of ``datasets``' own cache): uncompressed fixed-width rows, so a local file is
memory-mapped and a row is a zero-copy view (``pyarrow.memory_map``), and a remote one is read one record batch
of ``R`` rows at a time through fsspec; pyarrow and fsspec come with ``datasets`` in every extra, with no
TensorFlow. A process reads only the rows of its own share of each global batch
(:class:`hf_tpu_ext.data.numpy_batches.TrainBatches`), so its memory does not grow with the corpus.

The manifest records the tokenizer's fingerprint (:func:`tokenizer_fingerprint`) and ``L``: a run whose tokenizer
or ``--max_seq_length`` differs is refused in one line before any compute (:func:`check_shards`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Dict, Optional

import numpy as np

from hf_tpu_ext.errors import DataError

MANIFEST_NAME = "manifest.json"
FORMAT = "hf-tpu-ext/arrow-blocks-v1"
COLUMN = "input_ids"
#: rows per record batch: a remote read fetches one batch (R x L x 4 bytes: 128 KiB at L = 128)
ROWS_PER_BATCH = 256


def _join(base: str, name: str) -> str:
    return str(base).rstrip("/") + "/" + name


def _fs(path: str):
    """``(fsspec filesystem, path inside it)`` of a local path or URL."""
    import fsspec.core

    return fsspec.core.url_to_fs(str(path))


def _is_local(fs) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,))


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 (hex) of a tokenizer's vocabulary and special token ids: equal for the same tokenizer saved and
    reloaded, in transformers 4 and 5."""
    vocab = sorted((str(t), int(i)) for t, i in tokenizer.get_vocab().items())
    special = sorted(int(i) for i in tokenizer.all_special_ids)
    text = json.dumps({"vocab": vocab, "special_ids": special}, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def read_manifest(path: str) -> Optional[dict]:
    """``{path}/manifest.json`` as a dict, or None when there is none.

    Raises:
        DataError: it is there but not JSON.
    """
    fs, root = _fs(path)
    target = _join(root, MANIFEST_NAME)
    if not fs.exists(target):
        return None
    try:
        with fs.open(target, "r") as f:
            return json.load(f)
    except (ValueError, OSError) as e:
        raise DataError(f"{path}/{MANIFEST_NAME} cannot be read ({e}); write the shards again with "
                        "`hf-tpu prepare-data`.") from None


def is_arrow_source(path: Optional[str]) -> bool:
    """Whether ``path`` (a folder or fsspec URL) holds Arrow block shards (its manifest names :data:`FORMAT`)."""
    if not path:
        return False
    try:
        manifest = read_manifest(path)
    except (DataError, ImportError, ValueError, OSError):  # no such filesystem or folder: not Arrow shards
        return False
    return bool(manifest) and manifest.get("format") == FORMAT


def write_split(blocks: np.ndarray, output_path: str, split: str, num_shards: int, manifest: dict,
                num_tokens: Optional[int] = None) -> dict:
    """Write one split as ``min(num_shards, N)`` Arrow files and record it in ``manifest["splits"]`` (in memory).

    Args:
        blocks: int ``[N, L]`` token ids (written as int32).
        output_path: a folder or fsspec URL (created when missing).
        split: e.g. ``"train"``; num_shards: wanted files (>= 1).
        manifest: the manifest being built (:func:`write_manifest` writes it once every split is there).
        num_tokens: tokens before the last partial block was dropped (default ``N * L``).

    Returns:
        dict: the split's entry ``{"num_blocks", "num_tokens", "files": [{"name", "num_blocks"}]}``.

    Raises:
        DataError: not a 2-D integer array, or ``L`` differs from the manifest's ``max_seq_length``.
    """
    import pyarrow as pa

    blocks = np.asarray(blocks)
    if blocks.ndim != 2 or not np.issubdtype(blocks.dtype, np.integer):
        raise DataError(f"blocks must be an integer array [N, L], got {blocks.dtype} {blocks.shape}.")
    n, length = (int(d) for d in blocks.shape)
    if manifest.setdefault("max_seq_length", length) != length:
        raise DataError(f"{output_path}: the {split} blocks hold {length} tokens, the manifest says "
                        f"{manifest['max_seq_length']}.")
    fs, root = _fs(output_path)
    fs.makedirs(root, exist_ok=True)
    for old in fs.glob(_join(root, f"{split}-*-of-*.arrow")):
        fs.rm(old)
    shards = min(int(num_shards), n)
    files = []
    schema = pa.schema([(COLUMN, pa.list_(pa.int32(), length))])
    for i, part in enumerate(np.array_split(blocks.astype(np.int32), shards) if shards else []):
        name = f"{split}-{i:05d}-of-{shards:05d}.arrow"
        with fs.open(_join(root, name), "wb") as f, pa.ipc.new_file(f, schema) as writer:
            for start in range(0, len(part), ROWS_PER_BATCH):
                rows = np.ascontiguousarray(part[start:start + ROWS_PER_BATCH])
                column = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), length)
                writer.write_batch(pa.record_batch([column], schema=schema))
        files.append({"name": name, "num_blocks": int(len(part))})
    entry = {"num_blocks": n, "num_tokens": int(num_tokens if num_tokens is not None else n * length),
             "files": files}
    manifest.setdefault("splits", {})[split] = entry
    return entry


def write_manifest(output_path: str, manifest: dict, tokenizer, tokenizer_record: str) -> None:
    """Write ``manifest.json`` last (atomic where the filesystem renames), naming the tokenizer and its
    fingerprint: a folder without it is not a shard set, so a killed prepare-data leaves nothing usable."""
    manifest.update({"format": FORMAT, "feature": COLUMN, "rows_per_batch": ROWS_PER_BATCH,
                     "tokenizer": tokenizer_record, "tokenizer_sha256": tokenizer_fingerprint(tokenizer)})
    fs, root = _fs(output_path)
    text = json.dumps(manifest, indent=2, sort_keys=True)
    tmp = _join(root, MANIFEST_NAME + ".tmp")
    with fs.open(tmp, "w") as f:
        f.write(text)
    fs.mv(tmp, _join(root, MANIFEST_NAME))


def remove_manifest(output_path: str) -> None:
    """Delete ``manifest.json`` (an overwrite starts there, so a half-rewritten folder is never read)."""
    fs, root = _fs(output_path)
    target = _join(root, MANIFEST_NAME)
    if fs.exists(target):
        fs.rm(target)


class ShardBlocks:
    """One split of an Arrow shard folder as an ``[N, L]`` int32 block source read row by row.

    ``blocks[indices]`` (int array, any order) returns int32 ``[k, L]``, reading only the record batches that
    hold those rows: a local file through a memory map (zero-copy views), a remote one through fsspec, one
    record batch at a time, nothing cached. Files open on the first read (so a process that builds no rows of
    a split opens nothing).

    Attributes:
        shape: ``(N, L)``; path, split: where from.
    """

    def __init__(self, path: str, split: str, manifest: dict):
        entry = manifest["splits"][split]
        self.path, self.split = path, split
        self.shape = (int(entry["num_blocks"]), int(manifest["max_seq_length"]))
        self.rows_per_batch = int(manifest.get("rows_per_batch", ROWS_PER_BATCH))
        self.files = [f["name"] for f in entry["files"]]
        self.starts = np.cumsum([0] + [int(f["num_blocks"]) for f in entry["files"]])
        self._readers: Dict[int, object] = {}

    def __len__(self) -> int:
        return self.shape[0]

    def limit(self, n: Optional[int]) -> "ShardBlocks":
        """Keep the first ``n`` blocks (``--max_train_samples``/``--max_eval_samples``; None keeps all)."""
        if n is not None:
            self.shape = (min(int(n), self.shape[0]), self.shape[1])
        return self

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """Every block, read into memory (tools and tests; training reads rows)."""
        out = self[np.arange(self.shape[0])]
        return out if dtype is None else out.astype(dtype)

    def _reader(self, i: int):
        import pyarrow as pa

        if i not in self._readers:
            fs, root = _fs(self.path)
            name = _join(root, self.files[i])
            source = pa.memory_map(name, "r") if _is_local(fs) else fs.open(name, "rb")
            self._readers[i] = pa.ipc.open_file(source)
        return self._readers[i]

    def _batch_rows(self, i: int, b: int) -> np.ndarray:
        column = self._reader(i).get_batch(b).column(0)
        return column.values.to_numpy(zero_copy_only=True).reshape(-1, self.shape[1])

    def __getitem__(self, indices) -> np.ndarray:
        idx = np.asarray(indices, np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.shape[0]):
            raise IndexError(f"rows {idx.min()}..{idx.max()} outside the {self.shape[0]} blocks of {self.path}")
        out = np.empty((idx.size, self.shape[1]), np.int32)
        files = np.searchsorted(self.starts, idx, side="right") - 1
        local = idx - self.starts[files]
        batches = local // self.rows_per_batch
        for f, b in sorted(set(zip(files.tolist(), batches.tolist()))):
            sel = np.flatnonzero((files == f) & (batches == b))
            out[sel] = self._batch_rows(f, b)[local[sel] - b * self.rows_per_batch]
        return out


def load_split(path: str, split: str, manifest: dict) -> Optional[ShardBlocks]:
    """The split as :class:`ShardBlocks`, None when the manifest has no such split or it is empty.

    Raises:
        DataError: a listed file is missing (named).
    """
    entry = (manifest.get("splits") or {}).get(split)
    if not entry or not int(entry.get("num_blocks", 0)):
        return None
    fs, root = _fs(path)
    missing = [f["name"] for f in entry["files"] if not fs.exists(_join(root, f["name"]))]
    if missing:
        raise DataError(f"{len(missing)} shard(s) listed in {path}/{MANIFEST_NAME} are missing, e.g. {missing[0]}; "
                        "write them again with `hf-tpu prepare-data`.")
    return ShardBlocks(path, split, manifest)


def check_shards(path: str, manifest: dict, tokenizer, max_seq_length: int) -> None:
    """Refuse shards made with another tokenizer or sequence length, in one line naming both and the fix.

    Raises:
        DataError: the manifest's ``tokenizer_sha256`` or ``max_seq_length`` differs from this run's.
    """
    length = int(manifest.get("max_seq_length", -1))
    if length != int(max_seq_length):
        raise DataError(f"The block shards in {path} hold blocks of {length} tokens but --max_seq_length is "
                        f"{max_seq_length}; pass --max_seq_length {length} or prepare the shards again.")
    want, got = manifest.get("tokenizer_sha256"), tokenizer_fingerprint(tokenizer)
    if want != got:
        raise DataError(f"The block shards in {path} were tokenized with another tokenizer (sha256 "
                        f"{str(want)[:12]}) than this run's ({got[:12]}); drop --tokenizer_name to use "
                        f"{path}/{manifest.get('tokenizer') or 'tokenizer'}, or prepare the shards with this one.")

