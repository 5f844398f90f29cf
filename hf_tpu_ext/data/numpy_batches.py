"""Masked global batches in NumPy, deterministic and resumable, without TensorFlow (the Keras/JAX backend's feed).

The same contract as the tf.data pipeline (:mod:`hf_tpu_ext.data.pipeline`, ARCHITECTURE.md "Training batch"),
computed with NumPy's counter-based Philox generator instead of TensorFlow's stateless ops:

* order: with ``spe = N // B`` steps per epoch (the short last batch dropped: static shapes), row ``r`` of global
  step ``g`` is block ``perm_e((g % spe) * B + r)`` of epoch ``e = g // spe``, ``perm_e`` a bijection of
  ``[0, N)`` seeded by ``(seed, e)`` and computed per position (:func:`hf_tpu_ext.data.sharding.permute`: no
  ``N``-sized table, so memory does not grow with the corpus);
* masks: row ``r`` of step ``g`` is masked by a generator seeded by ``(seed, g, r)`` (evaluation batch ``i``:
  ``(seed, i, r)`` in another stream): per sequence exactly ``min(P, maskable)`` positions drawn uniformly
  without replacement among non-special tokens, ascending, padding slots last (position 0, weight 0); 80%
  ``<mask>``, 10% a random non-special id, 10% unchanged;
* packed documents (``--pack_documents``, :func:`document_segments`): ``segment_ids`` and ``position_ids`` int32
  ``[B, L]`` from the unmasked block, a new segment after each separator (the token that ends every document in
  :mod:`hf_tpu_ext.data.blocks`), positions from 0 in each; absent otherwise.

Nothing depends on the history of an iterator, so a run started at ``start_step`` sees exactly the batches an
uninterrupted run sees from there on; and nothing depends on which process builds a row, so a process of ``N``
builds only its own rows (``rows=``: :meth:`hf_tpu_ext.backends.keras.placement.Placement.process_batch_rows`)
and reads only their blocks, and ``1`` or ``N`` processes train on the same global batches. The draws are
NumPy's, so the masks are not bit-equal to the TensorFlow backend's (same distribution).

Why NumPy and not tf.data: the Keras backend then needs no TensorFlow at all (the ``[jax]`` extra installs none),
and one small-preset batch (32 x 128 tokens) masks in well under a millisecond, far below a training step, so a
background thread (:class:`Prefetcher`) hides it completely.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Dict, Iterable, Iterator, Optional

import numpy as np

from hf_tpu_ext.data.sharding import permute
from hf_tpu_ext.errors import DataError

TRAIN_STREAM, _EVAL, _ORDER = 0, 1, 2  # stream ids mixed into the seed: masks, evaluation masks, epoch order


class NumpyMasker:
    """Masks an int ``[B, L]`` block batch for masked language modeling (see the module doc for the rules).

    Args:
        mask_token_id: id of ``<mask>``.
        vocab_size: random replacements come from ``[0, vocab_size)`` minus ``special_token_ids``.
        special_token_ids: ids never chosen nor drawn as replacements.
        max_predictions: ``P`` per sequence (``data_args.max_predictions_per_seq``), ``1 <= P <= L``.
        pad_token_id: ``attention_mask`` is 0 where ``input_ids == pad_token_id`` (None: all ones).
        separator_token_id: packed documents: the id that ends each document (``sep_token``, else ``eos_token``);
            the batches then carry ``segment_ids`` and ``position_ids`` (:func:`document_segments`). None: off.

    Raises:
        DataError: ``max_predictions < 1`` or no id left for random replacement.
    """

    def __init__(self, mask_token_id: int, vocab_size: int, special_token_ids: Iterable[int], max_predictions: int,
                 pad_token_id: Optional[int] = None, separator_token_id: Optional[int] = None):
        self.mask_token_id = int(mask_token_id)
        self.special = np.array(sorted({int(i) for i in special_token_ids if i is not None}) or [-1], np.int32)
        self.replacement_ids = np.setdiff1d(np.arange(int(vocab_size), dtype=np.int32), self.special)
        if not len(self.replacement_ids):
            raise DataError(f"vocab_size={vocab_size} leaves no non-special token id for random replacement.")
        self.max_predictions = int(max_predictions)
        if self.max_predictions < 1:
            raise DataError(f"max_predictions_per_seq must be >= 1, got {max_predictions}.")
        self.pad_token_id = pad_token_id
        self.separator_token_id = None if separator_token_id is None else int(separator_token_id)

    @classmethod
    def for_tokenizer(cls, tokenizer, max_predictions: int, pack_documents: bool = False) -> "NumpyMasker":
        """The masker of a tokenizer with a mask token (``len(tokenizer)`` as vocabulary size); ``pack_documents``:
        segments end at the tokenizer's ``sep_token_id``, else its ``eos_token_id``.

        Raises:
            DataError: ``pack_documents`` with a tokenizer that has neither.
        """
        separator = None
        if pack_documents:
            separator = next((i for i in (tokenizer.sep_token_id, tokenizer.eos_token_id) if i is not None), None)
            if separator is None:
                raise DataError("--pack_documents true needs a tokenizer with a sep_token or eos_token ending each "
                                "document; this one has neither: pass --pack_documents false.")
        return cls(tokenizer.mask_token_id, len(tokenizer), tokenizer.all_special_ids, max_predictions,
                   tokenizer.pad_token_id, separator)

    def __call__(self, ids: np.ndarray, seed, rows: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
        """Mask ``ids`` (int ``[B, L]``): row ``i`` with a generator seeded by ``(*seed, rows[i])``.

        Args:
            ids: int ``[B, L]`` blocks.
            seed: a sequence of ints >= 0 (the batch's seed).
            rows: int ``[B]``, each row's position in its global batch (default ``0 .. B-1``): a row's masks
                depend on its position only, not on which rows are masked with it.

        Returns:
            ``input_ids`` int32 ``[B, L]``, ``attention_mask`` int32 ``[B, L]``, ``masked_lm_positions`` int32
            ``[B, P]``, ``masked_lm_ids`` int32 ``[B, P]``, ``masked_lm_weights`` float32 ``[B, P]``.

        Raises:
            DataError: ``P > L``.
        """
        ids = np.asarray(ids, np.int32)
        batch, length = ids.shape
        P = self.max_predictions
        if P > length:
            raise DataError(f"max_predictions_per_seq={P} exceeds the sequence length {length}.")
        scores, action, pick = self._draws(seed, np.arange(batch) if rows is None else rows, length)
        scores[np.isin(ids, self.special)] = -1.0
        top = np.argpartition(-scores, P - 1, axis=1)[:, :P] if P < length else np.tile(np.arange(length), (batch, 1))
        valid = np.take_along_axis(scores, top, axis=1) >= 0
        positions = np.sort(np.where(valid, top, length), axis=1)
        valid = positions < length
        positions = np.where(valid, positions, 0).astype(np.int32)
        original = np.take_along_axis(ids, positions, axis=1)
        random_ids = self.replacement_ids[pick]
        new = np.where(action < 8, self.mask_token_id, np.where(action < 9, random_ids, original)).astype(np.int32)
        masked = ids.copy()
        rows = np.broadcast_to(np.arange(batch)[:, None], (batch, P))
        masked[rows[valid], positions[valid]] = new[valid]
        attention = (np.ones_like(ids) if self.pad_token_id is None
                     else (ids != int(self.pad_token_id)).astype(np.int32))
        out = {"input_ids": masked, "attention_mask": attention, "masked_lm_positions": positions,
               "masked_lm_ids": np.where(valid, original, 0).astype(np.int32),
               "masked_lm_weights": valid.astype(np.float32)}
        if self.separator_token_id is not None:
            out["segment_ids"], out["position_ids"] = document_segments(ids, self.separator_token_id)
        return out

    def _draws(self, seed, rows, length: int):
        """Per row, one generator each: ``[L]`` uniform scores, ``[P]`` actions 0..9, ``[P]`` replacement indices."""
        batch, P = len(rows), self.max_predictions
        scores = np.empty((batch, length))
        action = np.empty((batch, P), np.int64)
        pick = np.empty((batch, P), np.int64)
        base = [int(s) for s in seed]
        for i, row in enumerate(rows):
            rng = np.random.Generator(np.random.Philox(np.random.SeedSequence(base + [int(row)])))
            scores[i] = rng.random(length)
            action[i] = rng.integers(0, 10, size=P)
            pick[i] = rng.integers(0, len(self.replacement_ids), size=P)
        return scores, action, pick


def document_segments(ids: np.ndarray, separator_token_id: int):
    """``(segment_ids, position_ids)``, int32 ``[B, L]`` each, of blocks ``ids`` (int ``[B, L]``) that concatenate
    documents each ending with ``separator_token_id``: segment 0 from the block's start, a new one after each
    separator (which belongs to the document it ends); positions count from 0 in each segment.

    E.g. ``[CLS] a [SEP] [CLS] b c [SEP] [CLS]`` -> segments ``0 0 0 1 1 1 1 2``, positions ``0 1 2 0 1 2 3 0``.
    """
    ids = np.asarray(ids)
    ends = ids == int(separator_token_id)
    segments = np.cumsum(ends, axis=1) - ends  # the separator stays in its document
    index = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    starts = np.zeros(ids.shape, bool)
    starts[:, 0] = True
    starts[:, 1:] = ends[:, :-1]
    first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)  # each token's segment start
    return segments.astype(np.int32), (index - first).astype(np.int32)


class TrainBatches:
    """The masked global batch of any global step (random access; see the module doc).

    Args:
        blocks: int ``[N, L]`` training blocks: an array (a memory-mapped one is read row by row) or any object
            with ``shape`` and ``blocks[int array] -> [k, L]`` (:class:`hf_tpu_ext.data.block_shards.ShardBlocks`).
        global_batch_size: ``B``, sequences per optimizer step.
        seed: the run's ``--seed`` (int >= 0).
        masker: a :class:`NumpyMasker`.
        rows: int ``[R]``, the positions in each global batch this process builds (default: all ``B``), in the
            order they are returned.
        step_offset: global step ``s`` reads the blocks of step ``s + step_offset`` (not 0 after a resume at
            another block length: :func:`hf_tpu_ext.backends.base.data_step`); the masks stay seeded by ``s``.

    Raises:
        DataError: fewer than ``B`` blocks.
    """

    def __init__(self, blocks, global_batch_size: int, seed: int, masker: NumpyMasker,
                 rows: Optional[np.ndarray] = None, step_offset: int = 0):
        self.blocks = as_blocks(blocks)
        self.batch = int(global_batch_size)
        self.seed = int(seed)
        self.masker = masker
        self.rows = np.arange(self.batch) if rows is None else np.asarray(rows, np.int64)
        self.num_blocks = int(self.blocks.shape[0])
        self.step_offset = int(step_offset)
        self.steps_per_epoch = self.num_blocks // self.batch
        if self.steps_per_epoch < 1:
            raise DataError(f"{self.num_blocks} training blocks are fewer than one global batch of {self.batch}.")

    def epoch_seed(self, epoch: int) -> int:
        """The seed of ``epoch``'s permutation (from ``(seed, epoch)``)."""
        return int(np.random.SeedSequence([self.seed, _ORDER, int(epoch)]).generate_state(1, np.uint64)[0])

    def order(self, epoch: int) -> np.ndarray:
        """The block at each position of ``epoch`` (int64 ``[N]``; for tests and tools, training never lists it)."""
        return permute(np.arange(self.num_blocks), self.num_blocks, self.epoch_seed(epoch))

    def block_indices(self, step: int) -> np.ndarray:
        """The blocks (int64 ``[R]``) of this process's rows of global step ``step``."""
        epoch, index = divmod(int(step) + self.step_offset, self.steps_per_epoch)
        return permute(index * self.batch + self.rows, self.num_blocks, self.epoch_seed(epoch))

    def __call__(self, step: int) -> Dict[str, np.ndarray]:
        """This process's rows of the masked batch of global step ``step`` (int >= 0); ``[R, ...]`` arrays."""
        rows = read_rows(self.blocks, self.block_indices(step))
        return self.masker(rows, (self.seed, TRAIN_STREAM, int(step)), self.rows)


def as_blocks(blocks):
    """``blocks`` as it is when it reads rows lazily (an array, a memory map, shards), else an int32 array."""
    return blocks if hasattr(blocks, "shape") and hasattr(blocks, "__getitem__") else np.asarray(blocks, np.int32)


def read_rows(blocks, indices: np.ndarray) -> np.ndarray:
    """``blocks[indices]`` as int32 ``[k, L]`` (only those rows are read)."""
    return np.asarray(blocks[np.asarray(indices, np.int64)], np.int32)


def eval_batches(blocks, batch_size: int, seed: int, masker: NumpyMasker,
                 rows: Optional[np.ndarray] = None) -> Iterator[Dict[str, np.ndarray]]:
    """The evaluation split in order, ``len(blocks) // batch_size`` full batches (static shapes), fixed masks.

    ``rows``: the positions in each batch this process builds (default: all), as in :class:`TrainBatches`.
    """
    blocks = as_blocks(blocks)
    rows = np.arange(int(batch_size)) if rows is None else np.asarray(rows, np.int64)
    for i in range(int(blocks.shape[0]) // int(batch_size)):
        yield masker(read_rows(blocks, i * batch_size + rows), (int(seed), _EVAL, i), rows)


class Prefetcher:
    """Runs ``produce(step)`` for ``steps`` in a background thread, ``depth`` results ahead of the consumer.

    A step may be any value compared with ``==`` (the Keras loop passes ``(first step, steps)`` of a device call).

    ``produce`` may also put the batch on the accelerator (``jax.device_put``), so the training loop's host work
    per step is one ``queue.get``. An exception in ``produce`` is raised by :meth:`get`. :meth:`close` stops the
    thread (it is a daemon: a killed run leaves nothing behind).
    """

    def __init__(self, produce: Callable[[int], object], steps: Iterable[int], depth: int = 2):
        self._queue: "queue.Queue" = queue.Queue(maxsize=max(1, int(depth)))
        self._stop = threading.Event()
        # iterated in the thread, not listed: a long run's steps take no memory up front
        self._thread = threading.Thread(target=self._run, args=(produce, iter(steps)), daemon=True,
                                        name="hf-tpu-prefetch")
        self._thread.start()

    def _run(self, produce, steps):
        for step in steps:
            try:
                item = (step, produce(step), None)
            except BaseException as err:  # handed to the consumer, which raises it
                item = (step, None, err)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or item[2] is not None:
                return

    def get(self, step: int):
        """The result for ``step`` (steps come in the order given)."""
        got, value, err = self._queue.get()
        if err is not None:
            raise err
        if got != step:
            raise RuntimeError(f"prefetcher out of order: expected step {step}, got {got}")
        return value

    def close(self) -> None:
        self._stop.set()
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
