"""Tokenize text and cut it into fixed-length blocks (the static shapes XLA/TPUs want).

Each document is tokenized with the tokenizer's special tokens (``<s> ... </s>`` for RoBERTa), all
documents of a split are concatenated in order and cut into blocks of ``max_seq_length`` tokens; the
last partial block is dropped (as in transformers' ``run_mlm`` ``group_texts``, but over the whole split,
so at most ``max_seq_length - 1`` tokens per split are lost). Blocks are full, so they need no padding.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Union

import numpy as np

from hf_tpu_ext.errors import CorpusTooSmallError, DataError
from hf_tpu_ext.flops import usable_cpu_cores


class Blocks(dict):
    """``dict[str, np.ndarray]`` of int32 blocks ``[N, L]`` per split, plus token counts.

    Attributes:
        num_tokens: ``dict[str, int]``: tokens per split before the last partial block was dropped.
        max_seq_length: ``L``.
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], num_tokens: Mapping[str, int], max_seq_length: int):
        super().__init__(arrays)
        self.num_tokens = dict(num_tokens)
        self.max_seq_length = int(max_seq_length)


def _tokenize_fn(tokenizer, text_column: str):
    def tokenize(batch):
        return {"input_ids": tokenizer(batch[text_column], add_special_tokens=True, return_attention_mask=False)["input_ids"]}

    return tokenize


def column_texts(dataset, column: str = "text") -> list:
    """The ``column`` of a ``datasets.Dataset`` as a Python list, in row order (selections respected).

    Read through Arrow in one call: iterating ``dataset[column]`` (a lazy ``Column`` in datasets >= 4)
    costs ~0.1 ms a row, 27 s for the 270 k lines of a 10 MB text file on 2 cores (benchmarks/NOTES.md).
    """
    return _arrow_column(dataset, column).to_pylist() if len(dataset) else []


def _arrow_column(dataset, column: str):
    """pyarrow (Chunked)Array of ``column``, in row order (respects selections such as ``train_test_split``).

    A selection is read with one Arrow ``take`` over its indices: ``datasets`` gathers such rows slice by slice
    (~1 s for the 258 k rows of a 20 MB split, 0.05 s with ``take``; benchmarks/NOTES.md). The indices mapping
    is a private attribute of ``datasets.Dataset``; without it the public (slower) path is taken.
    """
    table = getattr(dataset, "data", None)
    if table is None or not hasattr(dataset, "_indices"):
        return dataset.with_format("arrow")[:][column]
    indices = dataset._indices  # one column of row numbers, or None when the dataset is not a selection
    return table.column(column) if indices is None else table.column(column).take(indices.column(0))


def _flat_ids(dataset) -> np.ndarray:
    """All ``input_ids`` of a tokenized dataset, concatenated in row order (int64 [T])."""
    column = _arrow_column(dataset, "input_ids")  # of lists
    if hasattr(column, "combine_chunks"):
        column = column.combine_chunks()
    if len(column) == 0:
        return np.zeros([0], dtype=np.int64)
    return column.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def group_into_blocks(
    raw,
    tokenizer,
    max_seq_length: int,
    num_proc: Optional[int] = None,
    text_column: str = "text",
    load_from_cache_file: bool = True,
) -> Blocks:
    """Tokenize every split of ``raw`` and cut each into blocks of ``max_seq_length`` tokens.

    Args:
        raw: ``datasets.DatasetDict`` (e.g. from :func:`hf_tpu_ext.data.loading.load_text_datasets`).
        tokenizer: a transformers tokenizer; its special tokens wrap each document.
        max_seq_length: ``L``, tokens per block.
        num_proc: processes for ``datasets.map`` (``None``: this process).
        text_column: the column holding the text.
        load_from_cache_file: ``False`` recomputes cached tokenization (``--overwrite_cache``).

    Returns:
        Blocks: a ``dict`` split -> ``np.ndarray`` int32 ``[N, L]`` with ``N = tokens // L``, also carrying
        ``num_tokens`` per split. A split with fewer than ``L`` tokens gives a ``[0, L]`` array.

    Raises:
        DataError: ``text_column`` is missing, or a token id does not fit int32.

    Datasets held in memory (the default corpus, splits made by ``train_test_split``) are tokenized in
    memory, so no cache files are written; file-backed datasets cache their tokenization next to the
    ``datasets`` cache of the source file.
    """
    arrays: Dict[str, np.ndarray] = {}
    counts: Dict[str, int] = {}
    L = int(max_seq_length)
    # Warn-once flag transformers checks before logging "sequence length is longer than the maximum":
    # whole documents are longer than L on purpose, they are cut into blocks below.
    warned = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    for split, ds in raw.items():
        if text_column not in ds.column_names:
            raise DataError(f"Split {split!r} has no column {text_column!r} (columns: {', '.join(ds.column_names)}).")
        in_memory = not ds.cache_files
        tokenized = ds.map(
            _tokenize_fn(tokenizer, text_column),
            batched=True,
            num_proc=num_proc if num_proc and num_proc > 1 and len(ds) >= num_proc else None,
            remove_columns=ds.column_names,
            keep_in_memory=in_memory,
            load_from_cache_file=load_from_cache_file and not in_memory,
            desc=f"Tokenizing {split}",
        )
        ids = _flat_ids(tokenized)
        if ids.size and (ids.max() > np.iinfo(np.int32).max or ids.min() < 0):
            raise DataError(f"Token ids of split {split!r} do not fit int32; use a tokenizer with < 2**31 tokens.")
        n = ids.size // L
        arrays[split] = np.ascontiguousarray(ids[: n * L].reshape(n, L).astype(np.int32))
        counts[split] = int(ids.size)
    return Blocks(arrays, counts, L)


_WORKER_TOKENIZER = None  # the fast tokenizer of this process (a pool worker builds its own in _init_worker)


def _init_worker(tokenizer_json: str) -> None:
    global _WORKER_TOKENIZER
    from tokenizers import Tokenizer

    _WORKER_TOKENIZER = Tokenizer.from_str(tokenizer_json)


def _encode_chunk(texts) -> np.ndarray:
    encodings = _WORKER_TOKENIZER.encode_batch_fast(texts, add_special_tokens=True)
    if not encodings:
        return np.zeros([0], dtype=np.int64)
    return np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encodings])


#: texts that make a spawned tokenizing process worth its start (~0.3-0.5 s; one process encodes ~19 k lines/s here)
TEXTS_PER_PROCESS = 10_000


def default_num_proc(num_texts: Optional[int] = None) -> int:
    """Tokenizing processes when none are asked for: the CPU cores this process may use
    (:func:`hf_tpu_ext.flops.usable_cpu_cores`), at most one per :data:`TEXTS_PER_PROCESS` of ``num_texts``
    (so a small corpus is not spread over many cores).
    """
    cores = usable_cpu_cores()
    if num_texts is not None:
        cores = min(cores, num_texts // TEXTS_PER_PROCESS)
    return max(1, cores)


def _batches(texts, num_proc: int, batch_size: int):
    texts = list(texts)
    if num_proc > 1:  # at least 4 batches per process, so the processes finish together
        batch_size = max(1, min(batch_size, -(-len(texts) // (4 * num_proc))))
    return [texts[i:i + batch_size] for i in range(0, len(texts), batch_size)]


@contextlib.contextmanager
def _one_tokenizer_thread():
    """Turn the tokenizers library's own thread pool off for this block (it reads the variable on each call),
    so ``num_proc`` processes use ``num_proc`` cores; the spawned workers inherit it. Restored afterwards."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


@contextlib.contextmanager
def _encoder(tokenizer, num_proc: int) -> Iterator[Callable[[List[List[str]]], List[np.ndarray]]]:
    """A function ``batches -> [int64 ids per batch]`` that tokenizes in ``num_proc`` processes: this one and
    ``num_proc - 1`` spawned workers, one tokenizer thread each.

    The workers take batches from the front and this process from the back until they meet
    (:func:`_share`), so no process idles while another works. The workers start once and serve every
    split: starting a spawned worker (interpreter, numpy, tokenizers, the tokenizer rebuilt from its JSON)
    costs ~0.3-0.5 s on 2 cores (benchmarks/NOTES.md).
    """
    global _WORKER_TOKENIZER
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    _WORKER_TOKENIZER = backend

    def here(batches):
        return [_encode_chunk(b) for b in batches]

    try:
        with _one_tokenizer_thread():
            if num_proc > 1:
                import multiprocessing

                # spawned, not forked: a fork of a process whose Rust or TensorFlow thread pools already ran can
                # deadlock in the child (seen here); each worker rebuilds the tokenizer from its JSON
                with multiprocessing.get_context("spawn").Pool(num_proc - 1, initializer=_init_worker,
                                                               initargs=(backend.to_str(),)) as pool:
                    yield functools.partial(_share, pool, num_proc - 1)
            else:
                yield here
    finally:
        _WORKER_TOKENIZER = None


def _share(pool, workers: int, batches: List[List[str]]) -> List[np.ndarray]:
    """Encode ``batches`` in ``pool`` and in this process, meeting in the middle; results in batch order.

    Each worker has at most two batches queued; a finished batch's callback (the pool's result thread)
    queues the next one from the front, while this process encodes from the back. A static split
    left one side waiting for the other by up to 1 s of ~8 (this process also feeds the pool and
    collects its results, so it is the slower side; benchmarks/NOTES.md).

    Raises:
        The first error of a worker or of this process (e.g. ``TypeError`` for a text that is not a str);
        nothing more is queued once one is seen.
    """
    results: List[Optional[np.ndarray]] = [None] * len(batches)
    state = {"front": 0, "back": len(batches), "queued": 0}
    errors: List[BaseException] = []
    done = threading.Condition()

    def queue_next() -> None:  # called with ``done`` held
        if state["front"] < state["back"] and not errors:
            i = state["front"]
            state["front"] += 1
            state["queued"] += 1
            pool.apply_async(_encode_chunk, (batches[i],), callback=functools.partial(finished, i),
                             error_callback=failed)

    def finished(i: int, ids: np.ndarray) -> None:
        with done:
            results[i] = ids
            state["queued"] -= 1
            queue_next()
            done.notify()

    def failed(error: BaseException) -> None:
        with done:
            errors.append(error)
            state["queued"] -= 1
            done.notify()

    with done:
        for _ in range(2 * workers):
            queue_next()
    while True:
        with done:
            if state["front"] >= state["back"] or errors:
                break
            state["back"] -= 1
            i = state["back"]
        try:
            results[i] = _encode_chunk(batches[i])
        except BaseException as error:  # queue nothing more: the pool is closed on the way out
            with done:
                errors.append(error)
            raise
    with done:
        done.wait_for(lambda: state["queued"] == 0)
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]


def _concat(parts: List[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros([0], dtype=np.int64)


def tokenize_texts(texts, tokenizer, num_proc: int = 1, batch_size: int = 1000) -> np.ndarray:
    """Token ids of ``texts`` (each wrapped in the tokenizer's special tokens), concatenated in order.

    The same ids as ``tokenizer(texts)["input_ids"]`` of a transformers fast tokenizer, from its Rust
    backend's ``encode_batch_fast`` (no offsets, no per-token Python objects). With ``num_proc > 1`` the
    batches are spread over that many spawned processes (``multiprocessing`` ``spawn`` context). Every
    process, this one included when ``num_proc`` is 1, tokenizes with the tokenizers library's thread
    pool off (as the Beam workers do), so ``num_proc`` is the number of cores used; see benchmarks/NOTES.md
    for the measurements against that thread pool.

    Args:
        texts: sequence of str.
        tokenizer: a transformers fast tokenizer (``backend_tokenizer``) or a ``tokenizers.Tokenizer``.
        num_proc: processes, one core each (1: this one).
        batch_size: documents per ``encode_batch_fast`` call.

    Returns:
        int64 ``[T]``.
    """
    batches = _batches(texts, num_proc, batch_size)
    with _encoder(tokenizer, num_proc if len(batches) > 1 else 1) as encode:
        return _concat(encode(batches))


def tokenize_into_blocks(raw, tokenizer, max_seq_length: int, num_proc: int = 1, text_column: str = "text") -> Blocks:
    """Like :func:`group_into_blocks`, tokenizing with :func:`tokenize_texts` (no ``datasets`` cache).

    ``hf-tpu prepare-data`` uses it: tokenization is its main work, so it is timed and parallelized
    here, and re-running it re-tokenizes (the reported tokens/s is always real work).

    Raises:
        DataError: ``text_column`` is missing, or a token id does not fit int32.
    """
    arrays: Dict[str, np.ndarray] = {}
    counts: Dict[str, int] = {}
    L = int(max_seq_length)
    for split, ds in raw.items():
        if text_column not in ds.column_names:
            raise DataError(f"Split {split!r} has no column {text_column!r} (columns: {', '.join(ds.column_names)}).")
    # the workers start while this process reads the text out of the datasets
    with _encoder(tokenizer, num_proc if sum(len(ds) for ds in raw.values()) > 1 else 1) as encode:
        splits = {split: _batches(column_texts(ds, text_column), num_proc, 1000) for split, ds in raw.items()}
        parts = encode([b for batches in splits.values() for b in batches])  # one map over all splits
    start = 0
    for split, batches in splits.items():
        ids = _concat(parts[start:start + len(batches)])
        start += len(batches)
        if ids.size and ids.max() > np.iinfo(np.int32).max:
            raise DataError(f"Token ids of split {split!r} do not fit int32; use a tokenizer with < 2**31 tokens.")
        n = ids.size // L
        arrays[split] = np.ascontiguousarray(ids[: n * L].reshape(n, L).astype(np.int32))
        counts[split] = int(ids.size)
    return Blocks(arrays, counts, L)


def check_blocks(
    blocks: Union[np.ndarray, Mapping[str, np.ndarray]],
    global_batch_size: int,
    split: str,
    num_tokens: Optional[int] = None,
) -> None:
    """Raise when a split has fewer blocks than one global batch.

    Args:
        blocks: the split's int32 ``[N, L]`` array, or the :class:`Blocks` dict (then ``blocks[split]`` is
            checked and its token count used).
        global_batch_size: blocks per step over all replicas (per-device batch x replicas).
        split: the split's name, e.g. ``"train"`` (used in the message).
        num_tokens: tokens of the split before dropping the last partial block (default: from
            :class:`Blocks`, else ``N * L``).

    Raises:
        CorpusTooSmallError: ``N < global_batch_size``; the message gives tokens, blocks, block size and
            global batch size and what to change.
    """
    if isinstance(blocks, Mapping):
        if split not in blocks:
            raise DataError(f"There is no {split!r} split (splits: {', '.join(blocks)}).")
        if num_tokens is None and isinstance(blocks, Blocks):
            num_tokens = blocks.num_tokens.get(split)
        blocks = blocks[split]
    n, L = int(blocks.shape[0]), int(blocks.shape[1])
    if num_tokens is None:
        num_tokens = n * L
    if n >= global_batch_size:
        return
    batch_flag = "--per_device_eval_batch_size" if split != "train" else "--per_device_train_batch_size"
    hint = (
        "Add more text"
        + (" (or a larger --validation_split_percentage / a --validation_file)" if split != "train" else "")
        + f", use a smaller --max_seq_length, or a smaller {batch_flag} (global batch = per-device batch x replicas)."
    )
    raise CorpusTooSmallError(
        f"The {split} split is too small: {num_tokens} tokens make {n} blocks of {L} tokens, fewer than one "
        f"global batch of {global_batch_size} blocks ({global_batch_size * L} tokens). {hint}"
    )
