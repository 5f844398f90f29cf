"""Load the raw text of a run into a ``datasets.DatasetDict`` with splits ``train`` and ``validation``.

Sources, in the order :func:`load_text_datasets` checks them:

1. ``--dataset_name`` (+ ``--dataset_config_name``): ``datasets.load_dataset`` from the Hub or its cache.
2. ``--train_file`` (+ ``--validation_file``): ``.txt`` (one example per line), ``.json``/``.jsonl``,
   ``.csv`` or ``.parquet``, read by the matching ``datasets`` builder.
3. Neither: the embedded default corpus (:mod:`hf_tpu_ext.data.corpus`).

Without validation data, ``validation_split_percentage`` % of the training examples are held out with a
seeded shuffle. Every result has exactly one string column, ``text``; empty texts are dropped.

A folder of TFRecord shards written by ``hf-tpu prepare-data`` is not text: detect it with
:func:`is_tfrecord_source` and read it with :func:`hf_tpu_ext.data.tfrecord.read_tfrecord_blocks`.
"""

from __future__ import annotations

import math
import os
from typing import Optional

from hf_tpu_ext.data.block_shards import is_arrow_source
from hf_tpu_ext.data.corpus import DEFAULT_CORPUS_DESCRIPTION, default_corpus_texts
from hf_tpu_ext.errors import DataError, DataFileNotFoundError

# file extension -> datasets packaged builder
SUPPORTED_EXTENSIONS = {
    ".txt": "text",
    ".text": "text",
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}
MANIFEST_NAME = "manifest.json"
_REMOTE_PREFIXES = ("gs://", "s3://", "hf://", "http://", "https://")


def _supported_list() -> str:
    return ", ".join(sorted(SUPPORTED_EXTENSIONS))


def _is_remote(path: str) -> bool:
    return str(path).startswith(_REMOTE_PREFIXES)


def is_tfrecord_source(path: Optional[str]) -> bool:
    """Whether ``path`` is a folder of TFRecord shards written by ``hf-tpu prepare-data``.

    Args:
        path: a local folder or a ``gs://`` URL (``None`` gives ``False``).

    Returns:
        bool: ``True`` when ``{path}/manifest.json`` exists and is not an Arrow shard folder's
        (:func:`hf_tpu_ext.data.block_shards.is_arrow_source`: text-like, read by :func:`load_text_blocks`'s
        caller). Local paths are checked without importing TensorFlow; ``gs://`` paths use ``tf.io.gfile``.
    """
    if not path or is_arrow_source(path):
        return False
    path = str(path)
    if path.startswith("gs://"):
        import tensorflow as tf

        return bool(tf.io.gfile.exists(path.rstrip("/") + "/" + MANIFEST_NAME))
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST_NAME))


def describe_data_source(data_args) -> str:
    """A one-line human description of where the text comes from (for logs and the model card).

    Args:
        data_args: :class:`hf_tpu_ext.args.DataTrainingArguments`.

    Returns:
        str: e.g. ``"the Hub dataset wikitext (wikitext-2-raw-v1)"``, ``"train.txt"`` or the default
        corpus description. Only file names (not full local paths) are used.
    """
    if data_args.dataset_name:
        config = f" ({data_args.dataset_config_name})" if data_args.dataset_config_name else ""
        return f"the Hub dataset {data_args.dataset_name}{config}"
    if data_args.train_file:
        def name(p):
            return p if _is_remote(p) else os.path.basename(os.path.normpath(p))

        text = f"the file {name(data_args.train_file)}"
        if data_args.validation_file:
            text += f" (validation: {name(data_args.validation_file)})"
        return text
    return DEFAULT_CORPUS_DESCRIPTION


def check_data_file(path: str, option: str = "--train_file") -> str:
    """Check a text data file before any heavy work and return its ``datasets`` builder name.

    Args:
        path: the file given on the command line.
        option: the command-line option it came from (used in messages).

    Returns:
        str: ``"text"``, ``"json"``, ``"csv"`` or ``"parquet"``; ``"arrow"`` for a folder of Arrow block shards.

    Raises:
        DataFileNotFoundError: the local file does not exist (the message names the path).
        DataError: the path is a folder, the extension is not supported (the message lists the supported
            ones) or the file is empty.
    """
    path = str(path)
    if is_arrow_source(path):  # prepare-data's Arrow shards: read by hf-tpu train (data/run_data.py)
        return "arrow"
    if is_tfrecord_source(path):
        raise DataError(
            f"{option} {path} is a folder of TFRecord shards from `hf-tpu prepare-data`; it holds tokens, not "
            "text. Read it with hf_tpu_ext.data.tfrecord.read_tfrecord_blocks (`hf-tpu train --train_file` does)."
        )
    ext = os.path.splitext(path)[1].lower()
    if ext not in SUPPORTED_EXTENSIONS:
        raise DataError(
            f"{option} {path} has an unsupported extension {ext or '(none)'!r}; use one of: {_supported_list()} "
            "(or a folder of TFRecord shards written by `hf-tpu prepare-data`)."
        )
    if _is_remote(path):
        return SUPPORTED_EXTENSIONS[ext]  # existence is checked by the reader
    if not os.path.exists(path):
        raise DataFileNotFoundError(f"{option} {path} does not exist; check the path (relative paths start at the current folder).")
    if os.path.isdir(path):
        raise DataError(f"{option} {path} is a folder; give a file with one of the extensions {_supported_list()}.")
    if os.path.getsize(path) == 0:
        raise DataError(f"{option} {path} is empty; give a file with text in it.")
    if SUPPORTED_EXTENSIONS[ext] != "parquet":
        problem = not_text_message(path, option)
        if problem:
            raise DataError(problem)
    return SUPPORTED_EXTENSIONS[ext]


# magic numbers of compressed files (a .txt that is really an archive); the tool that unpacks each
COMPRESSED_MAGIC = ((b"\x1f\x8b", "gzip", "gunzip -c IN > OUT"), (b"PK\x03\x04", "zip", "unzip IN"),
                    (b"BZh", "bzip2", "bunzip2 -c IN > OUT"), (b"\xfd7zXZ\x00", "xz", "unxz -c IN > OUT"),
                    (b"\x28\xb5\x2f\xfd", "zstd", "zstd -dc IN > OUT"))
# control bytes that text has: tab, newline, vertical tab, form feed, carriage return, escape, backspace
TEXT_CONTROL_BYTES = frozenset(b"\t\n\x0b\x0c\r\x1b\x08")
SNIFF_BYTES = 1 << 16


def not_text_message(path: str, option: str = "--train_file") -> Optional[str]:
    """Tell a binary, compressed or UTF-16 file from text, by its first 64 KiB; ``None`` when it looks like text.

    Text in any 8-bit encoding (UTF-8, Latin-1, Windows-1252) has no NUL bytes and almost no control bytes
    other than whitespace; UTF-16 has a byte-order mark or a NUL in every other byte; compressed files start
    with their format's magic number; anything else with a NUL, or with more than 5% control bytes, is binary
    (git's "NUL in the first block" rule, plus the control-byte share for short files without a NUL). A
    wrong 8-bit encoding is left to the loader, whose message names the offset (Latin-1 advice).

    Returns:
        The message to raise (what the file is, what to do), or ``None``.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return None
    if not head:
        return None
    for magic, kind, command in COMPRESSED_MAGIC:
        if head.startswith(magic):
            return (f"{option} {path} is {kind}-compressed, not text: unpack it first (e.g. `{command}`) and pass the "
                    "text file.")
    even_nuls, odd_nuls = head[0::2].count(0), head[1::2].count(0)
    utf16 = head[:2] in (b"\xff\xfe", b"\xfe\xff") or (
        len(head) >= 4 and min(even_nuls, odd_nuls) == 0 and max(even_nuls, odd_nuls) >= len(head) // 4)
    if utf16:
        return (f"{option} {path} is UTF-16 text, not UTF-8: convert it, e.g. `iconv -f utf-16 -t utf-8 IN > OUT` "
                "(Windows editors save \"Unicode\" as UTF-16).")
    nul = head.find(0)
    controls = sum(1 for b in head if b < 0x20 and b not in TEXT_CONTROL_BYTES)
    if nul >= 0 or controls > len(head) * 0.05:
        where = (f"a NUL byte at offset {nul:,}" if nul >= 0
                 else f"{controls:,} control bytes in its first {len(head):,}")
        return (f"{option} {path} is not text: it looks like a binary file ({where}), not text in another encoding. "
                "Give a text file (UTF-8: .txt with one text per line, .jsonl, .csv), or check the path.")
    return None


def pick_text_column(dataset, text_column_name: Optional[str] = None, source: str = "the data") -> str:
    """Choose the column holding the text.

    Args:
        dataset: a ``datasets.Dataset``.
        text_column_name: the column asked for; ``None`` picks ``"text"`` when present, else the first
            string column.
        source: how to name the data in messages.

    Returns:
        str: the column name.

    Raises:
        DataError: the asked column is missing or not a string column, or there is no string column; the
            message lists the columns with their types.
    """
    from datasets import Value

    features = dataset.features
    string_cols = [n for n, f in features.items() if isinstance(f, Value) and f.dtype in ("string", "large_string")]
    listing = ", ".join(f"{n} ({getattr(f, 'dtype', type(f).__name__)})" for n, f in features.items()) or "(none)"
    if text_column_name:
        if text_column_name not in string_cols:
            what = "is not a string column" if text_column_name in features else "does not exist"
            raise DataError(
                f"--text_column_name {text_column_name!r} {what} in {source}; its columns are: {listing}. "
                "Pass one of the string columns."
            )
        return text_column_name
    if "text" in string_cols:
        return "text"
    if string_cols:
        return string_cols[0]
    raise DataError(f"{source} has no string column to read text from; its columns are: {listing}. Pass --text_column_name.")


def _to_text_only(dataset, text_column_name: Optional[str], source: str):
    """Keep only the text column, renamed ``text``, without empty or missing texts."""
    col = pick_text_column(dataset, text_column_name, source)
    dataset = dataset.select_columns([col])
    if col != "text":
        dataset = dataset.rename_column(col, "text")
    # keep_in_memory: no cache files for the filtered copy
    dataset = dataset.filter(
        lambda batch: [bool(t and t.strip()) for t in batch["text"]], batched=True, keep_in_memory=True
    )
    return dataset


def first_non_utf8_offset(path: str, chunk_size: int = 1 << 20) -> Optional[int]:
    """Byte offset of the first byte sequence in ``path`` that is not valid UTF-8, or None (valid, unreadable
    or not a local file). Reads the file in ``chunk_size`` pieces with an incremental decoder."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    done = 0
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(chunk_size)
                try:
                    decoder.decode(chunk, final=not chunk)
                except UnicodeDecodeError as err:
                    # err.start counts from the bytes the decoder held back plus this chunk
                    held = len(err.object) - len(chunk)
                    return done - held + err.start
                if not chunk:
                    return None
                done += len(chunk)
    except OSError:
        return None


def _load_file(path: str, builder: str, option: str, cache_dir: Optional[str]):
    from datasets import load_dataset

    try:
        return load_dataset(builder, data_files={"train": path}, split="train", cache_dir=cache_dir)
    except Exception as e:  # datasets raises many types (DatasetGenerationError, ArrowInvalid, ...)
        problem = not_text_message(path, option) if builder in ("text", "json", "csv") else None
        if problem:
            raise DataError(problem) from None
        offset = first_non_utf8_offset(path) if builder in ("text", "json", "csv") else None
        if offset is not None:
            raise DataError(
                f"{option} {path} is not UTF-8 text: the bytes at offset {offset:,} do not decode as UTF-8 (a Latin-1 "
                "or Windows-1252 file?). Convert it, e.g. `iconv -f latin1 -t utf-8 IN > OUT`."
            ) from None
        raise DataError(
            f"{option} {path} could not be read as {builder} data ({type(e).__name__}: {e}). Check the file's format; "
            f"supported extensions: {_supported_list()}."
        ) from e


def _unreachable(err: BaseException) -> bool:
    """Whether ``err`` (or what caused it) says the Hub was not reached: datasets raises ``ConnectionError``
    ("Couldn't reach ... on the Hub"), the HTTP clients their connect/timeout errors, offline mode its own."""
    seen: Optional[BaseException] = err
    for _ in range(5):
        if seen is None:
            return False
        names = " ".join(c.__name__ for c in type(seen).__mro__)
        if isinstance(seen, (ConnectionError, TimeoutError)) or any(w in names for w in ("Connect", "Timeout",
                                                                                          "Offline")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def hub_dataset_error(name: str, config: Optional[str], err: BaseException) -> DataError:
    """The one-line :class:`DataError` for ``load_dataset(name, config)`` raising ``err``.

    The offline hint (cache, ``HF_DATASETS_OFFLINE``) only when the Hub was not reached; when it answered, the
    line says what it answered: a config that does not exist (with the ones that do), a dataset it does not have.
    """
    what = f"the dataset {name!r}" + (f" (config {config!r})" if config else "")
    detail = f"{type(err).__name__}: {err}"
    if _unreachable(err):
        return DataError(
            f"Could not load {what}: {detail}. Without network access a Hub dataset only loads from the local cache "
            "(download it once where the Hub is reachable, then set HF_DATASETS_OFFLINE=1), or pass --train_file.")
    text = str(err)
    if config and isinstance(err, ValueError) and "BuilderConfig" in text and "not found" in text:
        available = text.split("Available:", 1)[1].strip().rstrip(".") if "Available:" in text else "see its page"
        return DataError(f"--dataset_config_name {config!r} is not a config of the dataset {name!r} (available: "
                         f"{available}); pass one of them, or leave --dataset_config_name out.")
    if type(err).__name__ == "DatasetNotFoundError":
        return DataError(f"--dataset_name {name!r}: {text} Check the name (and HF_TOKEN for a private or gated "
                         "dataset), or pass --train_file.")
    return DataError(f"Could not load {what}: {detail}. Check --dataset_name and --dataset_config_name, or pass "
                     "--train_file.")


def _load_hub_dataset(data_args, cache_dir: Optional[str]):
    from datasets import DatasetDict, load_dataset

    name = data_args.dataset_name
    try:
        loaded = load_dataset(name, data_args.dataset_config_name, cache_dir=cache_dir)
    except Exception as e:
        raise hub_dataset_error(name, data_args.dataset_config_name, e) from e
    if not isinstance(loaded, DatasetDict):  # pragma: no cover - load_dataset without split gives a dict
        loaded = DatasetDict({"train": loaded})
    if "train" not in loaded:
        raise DataError(f"The dataset {name!r} has no 'train' split (it has: {', '.join(loaded)}).")
    validation = loaded.get("validation", loaded.get("valid"))
    return loaded["train"], validation


def load_text_datasets(data_args, seed: int, cache_dir: Optional[str] = None):
    """Load the run's text into splits ``train`` and ``validation`` with one string column ``text``.

    Args:
        data_args: :class:`hf_tpu_ext.args.DataTrainingArguments`; uses ``dataset_name``,
            ``dataset_config_name``, ``train_file``, ``validation_file``, ``text_column_name`` and
            ``validation_split_percentage``.
        seed: seeds the hold-out split when there is no validation data (same seed, same split).
        cache_dir: the ``datasets`` cache for files and Hub datasets (default: ``HF_DATASETS_CACHE``).
            The default corpus is built in memory and never written to a cache.

    Returns:
        datasets.DatasetDict: ``{"train": Dataset, "validation": Dataset}``, column ``text`` (str). The
        validation split is empty when ``validation_split_percentage`` is 0 and no validation data is given.

    Raises:
        DataFileNotFoundError: a local data file is missing.
        DataError: an unsupported extension, an empty or unreadable file, a TFRecord folder given as text,
            a missing text column, a Hub dataset that cannot be loaded (offline), or too little text to hold
            out a validation split.
    """
    from datasets import Dataset, DatasetDict

    # cheap checks first, before reading anything
    train_builder = val_builder = None
    if data_args.train_file and not data_args.dataset_name:
        train_builder = check_data_file(data_args.train_file, "--train_file")
    if data_args.validation_file:
        val_builder = check_data_file(data_args.validation_file, "--validation_file")

    validation = None
    if data_args.dataset_name:
        train, validation = _load_hub_dataset(data_args, cache_dir)
        source = f"the dataset {data_args.dataset_name!r}"
        val_source = source
    elif data_args.train_file:
        train = _load_file(data_args.train_file, train_builder, "--train_file", cache_dir)
        source = f"--train_file {data_args.train_file}"
        val_source = source
    else:
        train = Dataset.from_dict({"text": default_corpus_texts()})
        source = "the default corpus"
        val_source = source
    if data_args.validation_file:
        validation = _load_file(data_args.validation_file, val_builder, "--validation_file", cache_dir)
        val_source = f"--validation_file {data_args.validation_file}"

    train = _to_text_only(train, data_args.text_column_name, source)
    if len(train) == 0:
        raise DataError(f"{source} has no non-empty text; give data with text in it.")
    if validation is not None:
        validation = _to_text_only(validation, data_args.text_column_name, val_source)
        if len(validation) == 0:
            raise DataError(f"{val_source} has no non-empty text; give validation data with text in it.")
    elif data_args.validation_split_percentage > 0:
        if len(train) < 2:
            raise DataError(
                f"{source} has a single text example; holding out {data_args.validation_split_percentage}% for "
                "validation needs at least 2. Give more text, a --validation_file, or --validation_split_percentage 0."
            )
        # own seeded split (Dataset.train_test_split refuses keep_in_memory on file-backed data)
        import numpy as np

        n_val = int(math.ceil(len(train) * data_args.validation_split_percentage / 100.0))
        order = np.random.default_rng(seed).permutation(len(train))
        validation = train.select(order[:n_val], keep_in_memory=True)
        train = train.select(order[n_val:], keep_in_memory=True)
    else:
        validation = train.select([], keep_in_memory=True)
    return DatasetDict({"train": train, "validation": validation})
