"""``--streaming`` (run_mlm's flag): training text read as a ``datasets`` IterableDataset, one slice per process.

``datasets.load_dataset(..., streaming=True)`` (a ``--dataset_name`` or the ``--train_file``/``--validation_file``
text/json/csv/parquet files) -> ``datasets.distributed.split_dataset_by_node(rank=process index,
world_size=process count)`` -> each example tokenized (special tokens around each, as run_mlm's tokenize) and
concatenated into blocks of ``max_seq_length`` tokens (run_mlm's ``group_texts``) -> ``R`` blocks per step for
this process's ``R = global batch / process count`` rows of the global batch. Nothing is downloaded up front and
memory holds one step's blocks, whatever the corpus size. When a pass ends before ``--max_steps``, the next pass
starts (as the Trainer's next epoch over an IterableDataset).

Position (resume): the library's ``IterableDataset.state_dict()`` / ``load_state_dict()``. The grouping buffer is
restarted at an example boundary instead of being saved: since examples are pulled only while fewer than ``R x L``
tokens are held, the tokens left over after a step are always a suffix of the *last* example read. So the state of
a step is ``{"pass", "dataset": the state_dict before that example, "skip": its tokens already used}`` -- a few
hundred bytes of JSON however long the documents are (saving the buffer would put up to one whole document into
each checkpoint); a resume re-reads and re-tokenizes that one example and drops ``skip`` tokens, then continues
exactly where the stopped run was.

The prefetch thread runs ahead of training, so :class:`StreamTrainBatches` keeps the state after each batch it
produced and the checkpoint takes the one of its step (:meth:`StreamTrainBatches.state_at`). The Keras backend
writes one ``data_state-<process index>.json`` (:data:`STATE_FILE`) per process into the checkpoint folder
before its atomic rename (gathered to process 0, which writes the checkpoint), so a checkpoint holds either every
process's position or does not exist; on resume each process loads its own.

Validation: the first ``--max_eval_samples`` blocks (default :data:`DEFAULT_EVAL_BLOCKS`) of the validation split
or ``--validation_file``, read once into an int32 array (every process the same), so evaluation is the one of a
run without ``--streaming``.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Dict, List, Optional

import numpy as np

from hf_tpu_ext.data.loading import check_data_file, describe_data_source
from hf_tpu_ext.data.numpy_batches import TRAIN_STREAM
from hf_tpu_ext.data.tokenizer import check_mlm_tokenizer, load_tokenizer
from hf_tpu_ext.errors import DataError, TokenizerError

logger = logging.getLogger("hf_tpu_ext")

#: validation blocks read with ``--streaming`` when ``--max_eval_samples`` is unset
DEFAULT_EVAL_BLOCKS = 1000
#: the position of process ``i`` inside a checkpoint folder
STATE_FILE = "data_state-{}.json"
STATE_FORMAT = "hf-tpu-ext streaming state 1"


class StreamSource:
    """Where ``--streaming`` reads: opens a fresh IterableDataset of a split on each call (nothing read up front).

    Args:
        data_args: :class:`hf_tpu_ext.args.DataTrainingArguments` (``dataset_name``, ``dataset_config_name``,
            ``train_file``, ``validation_file``, ``text_column_name``).
        cache_dir: the ``datasets`` cache (``--cache_dir``).
    """

    def __init__(self, data_args, cache_dir: Optional[str] = None):
        self.dataset_name, self.config_name = data_args.dataset_name, data_args.dataset_config_name
        self.train_file, self.validation_file = data_args.train_file, data_args.validation_file
        self.text_column, self.cache_dir = data_args.text_column_name, cache_dir
        self.name = (f"the dataset {self.dataset_name!r}" if self.dataset_name else f"--train_file {self.train_file}")

    def _load(self, builder_or_name, files=None, config=None):
        from datasets import load_dataset

        try:
            return load_dataset(builder_or_name, config, data_files=files, streaming=True, cache_dir=self.cache_dir)
        except Exception as err:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ...)
            line = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            raise DataError(f"--streaming cannot open {self.name}: {line}") from None

    def splits(self) -> Dict[str, Any]:
        """``{split name: IterableDataset}`` of the source (lazy: no example is read).

        Raises:
            DataError: the source cannot be opened (first line of the library's error).
        """
        if self.dataset_name:
            found = dict(self._load(self.dataset_name, config=self.config_name))
        else:
            found = dict(self._load(check_data_file(self.train_file, "--train_file"), {"train": self.train_file}))
        if self.validation_file:
            builder = check_data_file(self.validation_file, "--validation_file")
            found["validation"] = self._load(builder, {"validation": self.validation_file})["validation"]
        return found

    def open(self, split: str, rank: int = 0, world_size: int = 1):
        """The split as an IterableDataset, this process's slice of it (``split_dataset_by_node``).

        Raises:
            DataError: the source has no such split (the message lists the splits it has).
        """
        found = self.splits()
        if split not in found:
            have = ", ".join(sorted(found)) or "none"
            raise DataError(f"--streaming: {self.name} has no {split!r} split (it has: {have}); pass a "
                            f"--dataset_config_name or --train_file that has one.")
        ds = found[split]
        if world_size > 1:
            from datasets.distributed import split_dataset_by_node

            ds = split_dataset_by_node(ds, rank=int(rank), world_size=int(world_size))
        return ds

    def text_of(self, example: Dict[str, Any]) -> Optional[str]:
        """The text of one example: ``--text_column_name``, else ``"text"``, else its first string field.

        Raises:
            DataError: the asked column is missing, or the example has no string field.
        """
        if self.text_column:
            if self.text_column not in example:
                raise DataError(f"--text_column_name {self.text_column!r} does not exist in {self.name}; its "
                                f"columns are: {', '.join(example)}.")
            return example[self.text_column]
        if "text" in example:
            return example["text"]
        for value in example.values():
            if isinstance(value, str):
                return value
        raise DataError(f"{self.name} has no string column (columns: {', '.join(example)}); pass "
                        "--text_column_name.")


def tokenize(tokenizer, text: str) -> np.ndarray:
    """One example's token ids (int32 ``[n]``), special tokens around it (run_mlm's tokenize function)."""
    warned = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):  # documents are longer than L on purpose: they are cut into blocks
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    return np.asarray(tokenizer(text, add_special_tokens=True, return_attention_mask=False)["input_ids"], np.int32)


class StreamedBlocks:
    """This process's training blocks from a :class:`StreamSource`, in order: ``count`` blocks per call.

    Args:
        source: the :class:`StreamSource`.
        tokenizer: a transformers tokenizer.
        seq_length: ``L``, tokens per block.
        rank, world_size: this process's index and the process count (``split_dataset_by_node``).
    """

    def __init__(self, source: StreamSource, tokenizer, seq_length: int, rank: int = 0, world_size: int = 1):
        self.source, self.tokenizer, self.L = source, tokenizer, int(seq_length)
        self.rank, self.world_size = int(rank), int(world_size)
        self._start_pass(0, None, 0)

    def _start_pass(self, number: int, dataset_state: Optional[dict], skip: int) -> None:
        """Open pass ``number`` at ``dataset_state`` (None: its start); drop ``skip`` tokens of its next example."""
        self._pass, self._ds = int(number), self.source.open("train", self.rank, self.world_size)
        if dataset_state is not None:
            self._ds.load_state_dict(dataset_state)
        self._it, self._read_in_pass = iter(self._ds), 0
        self._whole_pass = dataset_state is None  # a resume at a pass's very end reads nothing more of it
        self._buffer = np.zeros(0, np.int32)
        self._anchor, self._skip = dataset_state, 0
        if skip:
            ids = self._next_example()
            self._buffer, self._skip = ids[int(skip):], int(skip)

    def _next_example(self) -> np.ndarray:
        """The next non-empty example's ids; ``_anchor`` becomes the dataset state before it (new pass at the end).

        Raises:
            DataError: a whole pass held no text for this process.
        """
        while True:
            state = self._ds.state_dict()
            try:
                example = next(self._it)
            except StopIteration:
                if not self._read_in_pass and self._whole_pass:
                    raise DataError(f"--streaming: {self.source.name} has no text for process {self.rank} of "
                                    f"{self.world_size}; give more data.") from None
                # once at INFO (the reader runs ahead of training: the step lines count the passes trained on)
                logger.log(logging.INFO if self._pass == 0 else logging.DEBUG,
                           "--streaming: the reader reached the end of %s (pass %d) and starts it again; the step "
                           "lines count the passes trained on", self.source.name, self._pass + 1)
                self._start_pass(self._pass + 1, None, 0)
                continue
            text = self.source.text_of(example)
            if text:
                self._read_in_pass += 1
                self._anchor, self._skip = state, 0
                return tokenize(self.tokenizer, text)

    def next_blocks(self, count: int) -> np.ndarray:
        """The next ``count`` blocks, int32 ``[count, L]``."""
        need = int(count) * self.L
        parts, held = [self._buffer], self._buffer.size
        while held < need:
            ids = self._next_example()  # the leftover becomes a suffix of this example (see the module doc)
            parts.append(ids)
            held += ids.size
        tokens = np.concatenate(parts)
        self._buffer = tokens[need:]
        if len(parts) == 1:  # no example read: the held suffix of the same example goes on
            self._skip += need
        else:
            self._skip = parts[-1].size - self._buffer.size
        if not self._buffer.size:  # an example boundary: the state after it, nothing to skip
            self._anchor, self._skip = self._ds.state_dict(), 0
        return tokens[:need].reshape(int(count), self.L)

    def state(self) -> Dict[str, Any]:
        """The position after the last block returned (JSON-able)."""
        return {"pass": self._pass, "dataset": self._anchor, "skip": int(self._skip)}

    def load_state(self, state: Dict[str, Any]) -> None:
        """Continue from a :meth:`state` (the next block is the one after it)."""
        self._start_pass(int(state["pass"]), state.get("dataset"), int(state.get("skip", 0)))


class StreamTrainBatches:
    """The masked batch of each step from a stream, read in step order (the Keras backend's train batch source).

    The same call and mask contract as :class:`hf_tpu_ext.data.numpy_batches.TrainBatches` (row ``r`` of step
    ``g`` masked by ``(seed, g, r)``), but the blocks come from :class:`StreamedBlocks`, so steps must be asked in
    order, from the step restored (:meth:`restore`) or 0.

    Args:
        blocks: this process's :class:`StreamedBlocks`.
        seed: ``--seed``. masker: a :class:`~hf_tpu_ext.data.numpy_batches.NumpyMasker`.
        rows: int ``[R]``, this process's positions in each global batch.
        keep: how many produced steps' states are kept (the prefetcher's lead, in steps, plus a margin).
    """

    def __init__(self, blocks: StreamedBlocks, seed: int, masker, rows, keep: int = 64):
        self.blocks, self.seed, self.masker = blocks, int(seed), masker
        self.rows = np.asarray(rows, np.int64)
        self.keep = max(2, int(keep))
        self.next_step = 0
        self._states: Dict[int, Dict[str, Any]] = {0: blocks.state()}
        self._lock = threading.Lock()
        self.world_size = blocks.world_size

    def __call__(self, step: int) -> Dict[str, np.ndarray]:
        """This process's rows of the masked batch of ``step`` (the next one in order); ``[R, ...]`` arrays.

        Raises:
            DataError: ``step`` is not the next step of the stream.
        """
        if int(step) != self.next_step:
            raise DataError(f"--streaming reads its steps in order: step {step} asked, step {self.next_step} next.")
        ids = self.blocks.next_blocks(len(self.rows))
        with self._lock:
            self.next_step = int(step) + 1
            self._states[self.next_step] = self.blocks.state()
            for old in [s for s in self._states if s <= self.next_step - self.keep]:
                del self._states[old]
        return self.masker(ids, (self.seed, TRAIN_STREAM, int(step)), self.rows)

    def state_at(self, steps_done: int) -> str:
        """The JSON position after ``steps_done`` trained steps (what a checkpoint of that step records).

        Raises:
            DataError: that step's state is no longer (or not yet) kept.
        """
        with self._lock:
            state = self._states.get(int(steps_done))
        if state is None:
            raise DataError(f"--streaming has no data position of step {steps_done} (kept: "
                            f"{sorted(self._states)}).")
        return json.dumps({"format": STATE_FORMAT, "global_step": int(steps_done), "process_count": self.world_size,
                           "rows": len(self.rows), "state": state}, sort_keys=True)

    def restore(self, text: str, steps_done: int, where: str) -> None:
        """Continue after ``steps_done`` steps from a :meth:`state_at` JSON text read from ``where``.

        Raises:
            DataError: the text is not such a state, or was saved by another step, process count or batch.
        """
        try:
            saved = json.loads(text)
            ok = saved.get("format") == STATE_FORMAT
        except (ValueError, AttributeError):
            ok = False
        if not ok:
            raise DataError(f"{where} is not a --streaming data position; delete the checkpoint.")
        mine = (int(steps_done), self.world_size, len(self.rows))
        theirs = (saved.get("global_step"), saved.get("process_count"), saved.get("rows"))
        if theirs != mine:
            raise DataError(f"{where} is the position of step {theirs[0]} for {theirs[1]} process(es) of {theirs[2]} "
                            f"rows, but this run resumes step {mine[0]} with {mine[1]} of {mine[2]}: resume with the "
                            "same process count and batch size.")
        self.blocks.load_state(saved["state"])
        with self._lock:
            self.next_step = int(steps_done)
            self._states = {self.next_step: self.blocks.state()}


def read_eval_blocks(source: StreamSource, tokenizer, seq_length: int, limit: Optional[int],
                     found: Optional[Dict[str, Any]] = None) -> Optional[np.ndarray]:
    """The first ``limit`` (default :data:`DEFAULT_EVAL_BLOCKS`) validation blocks, int32 ``[n, L]``; None when
    the source has no validation split (or fewer than ``L`` tokens of it). ``found``: the source's
    :meth:`StreamSource.splits`, when already opened."""
    found = source.splits() if found is None else found
    if "validation" not in found:
        logger.info("--streaming: %s has no validation split and no --validation_file was given: no evaluation.",
                    source.name)
        return None
    need = int(limit or DEFAULT_EVAL_BLOCKS) * int(seq_length)
    parts: List[np.ndarray] = []
    held = 0
    for example in found["validation"]:
        text = source.text_of(example)
        if text:
            parts.append(tokenize(tokenizer, text))
            held += parts[-1].size
        if held >= need:
            break
    n = min(held, need) // int(seq_length)
    if not n:
        return None
    return np.concatenate(parts)[: n * int(seq_length)].reshape(n, int(seq_length))


def load_stream_blocks(model_args, data_args, tokenizer_source: Optional[str] = None):
    """``(tokenizer, {"train": StreamSource, "validation": int32 [n, L] or None}, description)`` of a
    ``--streaming`` run; the train split's existence is checked here, before any model work.

    Raises:
        DataError: the source cannot be opened or has no train split (its splits named).
        TokenizerError: the tokenizer cannot be loaded or has no mask token, or a resume has none beside its
            checkpoint.
    """
    source = StreamSource(data_args, cache_dir=model_args.cache_dir)
    found = source.splits()
    if "train" not in found:
        raise DataError(f"--streaming: {source.name} has no 'train' split (it has: {', '.join(sorted(found)) or 'none'});"
                        " pass a --dataset_config_name or --train_file that has one.")
    name = tokenizer_source or model_args.tokenizer_name or model_args.model_name_or_path
    if not name:  # a resume whose checkpoint has no tokenizer beside it (the argument checks let a resume through)
        raise TokenizerError("--streaming: the checkpoint being resumed has no tokenizer beside it "
                             "(tokenizer.json, tokenizer_config.json); pass --tokenizer_name.")
    tok = load_tokenizer(name, cache_dir=None if tokenizer_source else model_args.cache_dir)
    check_mlm_tokenizer(tok)
    validation = read_eval_blocks(source, tok, data_args.max_seq_length, data_args.max_eval_samples, found)
    return tok, {"train": source, "validation": validation}, describe_data_source(data_args)


def is_stream(split) -> bool:
    """Whether a run's train split is a ``--streaming`` source."""
    return isinstance(split, StreamSource)
