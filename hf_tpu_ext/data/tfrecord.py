"""TFRecord shards of token blocks, for large corpora and for TPUs that read from Cloud Storage.

Layout of a folder written by ``hf-tpu prepare-data`` (a local folder or a ``gs://`` URL; all I/O goes
through ``tf.io.gfile``)::

    manifest.json                         {"format": ..., "max_seq_length": L, "tokenizer": "tokenizer",
                                           "splits": {"train": {"num_blocks", "num_tokens", "files"}, ...}}
    train-00000-of-00008.tfrecord ...     one tf.train.Example per block: "input_ids" int64 [L]
    validation-00000-of-00001.tfrecord
    tokenizer/                            the tokenizer the ids were made with

File names in the manifest are relative to the folder, so it can be copied (``gsutil -m cp -r``) as is.
"""

from __future__ import annotations

import json
from typing import Optional, Tuple

import numpy as np

from hf_tpu_ext.errors import DataError

MANIFEST_NAME = "manifest.json"
FORMAT = "hf-tpu-ext/blocks-v1"
FEATURE = "input_ids"


def _join(base: str, name: str) -> str:
    return str(base).rstrip("/") + "/" + name


def shard_file_name(split: str, index: int, num_shards: int) -> str:
    """``{split}-{index:05d}-of-{num_shards:05d}.tfrecord``."""
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


def read_manifest(path: str) -> dict:
    """Read ``{path}/manifest.json``.

    Args:
        path: a folder written by ``hf-tpu prepare-data`` (local or ``gs://``).

    Returns:
        dict: the manifest (see the module docstring).

    Raises:
        DataError: there is no readable manifest, so ``path`` is not a prepare-data folder.
    """
    import tensorflow as tf

    manifest_path = _join(path, MANIFEST_NAME)
    if not tf.io.gfile.exists(manifest_path):
        raise DataError(f"{path} has no {MANIFEST_NAME}; it is not a folder written by `hf-tpu prepare-data`. Run it first.")
    try:
        with tf.io.gfile.GFile(manifest_path, "r") as f:
            return json.load(f)
    except (json.JSONDecodeError, tf.errors.OpError) as e:
        raise DataError(f"{manifest_path} cannot be read ({e}); write the shards again with `hf-tpu prepare-data`.") from None


def manifest_text(manifest: dict) -> str:
    """The bytes-stable text of a manifest (sorted keys, indent 2): the local and the Beam writer share it."""
    return json.dumps(manifest, indent=2, sort_keys=True)


def _write_manifest(path: str, manifest: dict) -> None:
    import tensorflow as tf

    tmp = _join(path, MANIFEST_NAME + ".tmp")
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(manifest_text(manifest))
    tf.io.gfile.rename(tmp, _join(path, MANIFEST_NAME), overwrite=True)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def serialize_blocks(blocks: np.ndarray, feature: str = FEATURE) -> list:
    """``tf.train.Example`` bytes of each block, without TensorFlow (the Beam workers have none).

    The encoding is protobuf's wire format of ``Example{features{feature{key: feature, value: Feature{
    int64_list{value: row}}}}}`` with the packed ``int64_list`` TensorFlow writes; a test checks it equals
    ``tf.train.Example.SerializeToString()``.

    Args:
        blocks: integer ``[N, L]`` array of non-negative token ids.
        feature: the feature key.

    Returns:
        list of ``N`` ``bytes``.

    Raises:
        DataError: a negative id (protobuf would need 10-byte varints; token ids never are).
    """
    values = np.asarray(blocks)
    if values.size and values.min() < 0:
        raise DataError("Token ids must be >= 0 to be written as TFRecord examples.")
    v = values.astype(np.uint64)
    nbytes = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):  # varint length: 7 bits per byte
        nbytes += v >= np.uint64(1 << (7 * k))
    width = int(nbytes.max()) if v.size else 1
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    digits = ((v[..., None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)  # [N, L, width]
    position = np.arange(width)
    digits |= ((position < nbytes[..., None] - 1) * 0x80).astype(np.uint8)  # continuation bits
    keep = position < nbytes[..., None]
    flat = digits[keep].tobytes()
    row_sizes = keep.reshape(len(values), -1).sum(axis=1) if len(values) else []
    key = feature.encode()
    entry_key = b"\x0a" + _varint(len(key)) + key
    out, start = [], 0
    for size in row_sizes:
        size = int(size)
        int64_list = b"\x0a" + _varint(size) + flat[start:start + size]
        start += size
        value = b"\x1a" + _varint(len(int64_list)) + int64_list  # Feature.int64_list (field 3)
        entry = entry_key + b"\x12" + _varint(len(value)) + value  # map entry: key 1, value 2
        features = b"\x0a" + _varint(len(entry)) + entry  # Features.feature (field 1)
        out.append(b"\x0a" + _varint(len(features)) + features)  # Example.features (field 1)
    return out


def write_tfrecord_shards(
    blocks: np.ndarray,
    output_path: str,
    split: str,
    num_shards: int,
    tokenizer: Optional[str] = None,
    num_tokens: Optional[int] = None,
    metadata: Optional[dict] = None,
) -> dict:
    """Write the blocks of one split as TFRecord shards and record them in ``{output_path}/manifest.json``.

    Blocks are cut into ``min(num_shards, N)`` contiguous shards of nearly equal size (no empty shards; an
    empty split writes no file). Shards of this split left by an earlier run are removed. The manifest is
    read, updated for this split and rewritten, so splits can be written one after another.

    Args:
        blocks: int32 ``[N, L]`` token blocks.
        output_path: a local folder or a ``gs://`` URL (created when missing).
        split: the split name, e.g. ``"train"``.
        num_shards: wanted number of files (>= 1).
        tokenizer: where the tokenizer is, recorded in the manifest (relative to ``output_path`` or a repo
            id), e.g. ``"tokenizer"``; ``None`` keeps the manifest's current value.
        num_tokens: tokens of the split before the last partial block was dropped (default ``N * L``).
        metadata: extra JSON-able top-level manifest fields (e.g. ``{"source": ..., "seed": ...}``).

    Returns:
        dict: the split's manifest entry ``{"num_blocks": N, "num_tokens": T, "files": [names]}``.

    Raises:
        DataError: ``blocks`` is not a 2-D integer array, ``num_shards < 1``, or ``L`` differs from the
            ``max_seq_length`` of splits already in the manifest.
    """
    import tensorflow as tf

    blocks = np.asarray(blocks)
    if blocks.ndim != 2 or not np.issubdtype(blocks.dtype, np.integer):
        raise DataError(f"blocks must be an integer array [N, L], got {blocks.dtype} {blocks.shape}.")
    if num_shards < 1:
        raise DataError(f"--num_shards must be >= 1, got {num_shards}.")
    n, L = int(blocks.shape[0]), int(blocks.shape[1])
    tf.io.gfile.makedirs(output_path)
    manifest_path = _join(output_path, MANIFEST_NAME)
    manifest = read_manifest(output_path) if tf.io.gfile.exists(manifest_path) else {}
    if manifest.get("max_seq_length") not in (None, L):
        raise DataError(
            f"{output_path} holds blocks of {manifest['max_seq_length']} tokens, not {L}; write to another folder or "
            "rewrite every split with the same --max_seq_length."
        )

    for old in tf.io.gfile.glob(_join(output_path, f"{split}-*-of-*.tfrecord")):
        tf.io.gfile.remove(old)
    shards = min(num_shards, n)
    files = []
    for i, part in enumerate(np.array_split(blocks, shards) if shards else []):
        name = shard_file_name(split, i, shards)
        with tf.io.TFRecordWriter(_join(output_path, name)) as writer:
            for record in serialize_blocks(part):
                writer.write(record)
        files.append(name)

    entry = {"num_blocks": n, "num_tokens": int(num_tokens if num_tokens is not None else n * L), "files": files}
    manifest.setdefault("splits", {})[split] = entry
    manifest["format"] = FORMAT
    manifest["feature"] = FEATURE
    manifest["max_seq_length"] = L
    if tokenizer is not None:
        manifest["tokenizer"] = tokenizer
    manifest.setdefault("tokenizer", None)
    if metadata:
        reserved = {"splits", "format", "feature", "max_seq_length", "tokenizer"}
        manifest.update({k: v for k, v in metadata.items() if k not in reserved})
    _write_manifest(output_path, manifest)
    return entry


def read_tfrecord_blocks(path: str, split: str) -> Tuple["tf.data.Dataset", int, int]:  # noqa: F821
    """Read one split of a prepare-data folder back as a dataset of blocks.

    Files are read in manifest order, one after another, so the examples come in the order they were
    written (the pipeline shuffles them).

    Args:
        path: the folder (local or ``gs://``).
        split: e.g. ``"train"`` or ``"validation"``.

    Returns:
        tuple: ``(dataset, num_blocks, max_seq_length)``; ``dataset`` yields int32 tensors of static
        shape ``[L]``.

    Raises:
        DataError: no manifest, the split is not in it, or a listed file is missing.
    """
    import tensorflow as tf

    manifest = read_manifest(path)
    splits = manifest.get("splits", {})
    if split not in splits:
        raise DataError(f"{path} has no {split!r} split (it has: {', '.join(splits) or 'none'}); run `hf-tpu prepare-data` for it.")
    L = int(manifest["max_seq_length"])
    entry = splits[split]
    files = [_join(path, name) for name in entry["files"]]
    missing = [f for f in files if not tf.io.gfile.exists(f)]
    if missing:
        raise DataError(f"{len(missing)} shard(s) listed in {path}/{MANIFEST_NAME} are missing, e.g. {missing[0]}; write them again.")
    spec = {manifest.get("feature", FEATURE): tf.io.FixedLenFeature([L], tf.int64)}

    def parse(record):
        return tf.cast(tf.io.parse_single_example(record, spec)[FEATURE], tf.int32)

    if files:
        records = tf.data.TFRecordDataset(files, buffer_size=8 << 20)
    else:
        records = tf.data.Dataset.from_tensor_slices(tf.constant([], tf.string))
    dataset = records.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset, int(entry["num_blocks"]), L


def check_tfrecord_location(path: str, is_tpu_node: bool) -> None:
    """Check that the TPU can read the shards.

    On a TPU Node (``--tpu_name`` of a remote TPU, not a TPU VM) the input pipeline runs on the TPU's own
    host, which cannot see this machine's disk: shards must be in Cloud Storage.

    Args:
        path: the shard folder given as ``--train_file``.
        is_tpu_node: whether the run uses a TPU Node.

    Raises:
        DataError: ``is_tpu_node`` and ``path`` is not a ``gs://`` URL; the message says to copy the shards
            to a bucket.
    """
    if is_tpu_node and not str(path).startswith("gs://"):
        raise DataError(
            f"--train_file {path} is a local folder, but a TPU Node reads its input on the TPU host, which cannot see "
            "local files. Copy the shards to a Cloud Storage bucket in the TPU's region (gsutil -m cp -r <folder> "
            "gs://<bucket>/<name>) and pass --train_file gs://<bucket>/<name>."
        )
