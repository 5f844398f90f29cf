"""Deterministic, resumable ``tf.data`` pipelines of masked global batches.

Training (:func:`make_train_dataset`) yields an endless stream of GLOBAL batches (the trainer splits them
over replicas with ``strategy.experimental_distribute_dataset``). With ``spe = N // global_batch_size``
steps per epoch (the partial last batch of an epoch is dropped), global step ``g`` lies in epoch
``e = g // spe`` and takes slice ``g % spe`` of epoch ``e``'s order:

* blocks in memory (int32 ``[N, L]`` array): the order is a full permutation seeded by ``(seed, e)``
  (``tf.random.experimental.stateless_shuffle``);
* blocks from TFRecords (a ``tf.data.Dataset`` of ``[L]`` examples): the first ``spe * B`` examples
  in file order, permuted within consecutive windows of ``shuffle_buffer_size`` examples, each window
  seeded by ``(seed, e, window)`` (``hf-tpu prepare-data`` writes the blocks already shuffled, so the
  windows are random samples of the corpus).

Masks of step ``g`` are seeded by ``(seed, g)``. Nothing depends on the iterator's history, so a run
started at ``start_step`` yields exactly the batches a straight run yields from that step on.

Evaluation (:func:`make_eval_dataset`) is finite, unshuffled, with fixed masks seeded by
``(seed, -1 - batch_index)``.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Tuple, Union

import numpy as np
import tensorflow as tf

from hf_tpu_ext.errors import CorpusTooSmallError, DataError

DEFAULT_SHUFFLE_BUFFER = 10_000
_ALG = "philox"


def steps_per_epoch(num_blocks: int, global_batch_size: int) -> int:
    """Full global batches per epoch: ``num_blocks // global_batch_size`` (may be 0).

    Args:
        num_blocks: ``N``, blocks in the training split.
        global_batch_size: blocks per step over all replicas (>= 1).

    Returns:
        int: steps per epoch.

    Raises:
        DataError: ``global_batch_size < 1``.
    """
    if global_batch_size < 1:
        raise DataError(f"global_batch_size must be >= 1, got {global_batch_size}.")
    return int(num_blocks) // int(global_batch_size)


def _source(blocks, num_blocks: Optional[int]):
    """(array or None, dataset or None, N, L) of an in-memory array or a TFRecord example dataset."""
    if isinstance(blocks, tf.data.Dataset):
        if num_blocks is None:
            raise DataError("num_blocks is needed with a tf.data.Dataset source (read_tfrecord_blocks returns it).")
        length = blocks.element_spec.shape[-1]
        if length is None:
            raise DataError("The block dataset must have a static length [L]; use read_tfrecord_blocks.")
        return None, blocks, int(num_blocks), int(length)
    array = np.asarray(blocks)
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"blocks must be an integer array [N, L], got {array.dtype} {array.shape}.")
    return array.astype(np.int32, copy=False), None, int(array.shape[0]), int(array.shape[1])


def _too_small(n: int, length: int, global_batch_size: int, split: str, flag: str) -> CorpusTooSmallError:
    return CorpusTooSmallError(
        f"The {split} split is too small: {n} blocks of {length} tokens ({n * length} tokens), fewer than one global "
        f"batch of {global_batch_size} blocks. Add more text, use a smaller --max_seq_length, or a smaller {flag} "
        "(global batch = per-device batch x replicas)."
    )


def _pair(a, b) -> tf.Tensor:
    return tf.stack([tf.cast(a, tf.int64), tf.cast(b, tf.int64)])


def _epoch_orders(array, examples, n: int, per_epoch: int, seed: int, shuffle_buffer_size: int):
    """``(epoch_items, to_ids)`` of :func:`make_train_dataset`: ``epoch_items(epoch)`` is the dataset of the
    epoch's ``per_epoch`` items in its seeded order (row indices of ``array``, or examples of the dataset source
    ``examples``), ``to_ids(item_batch)`` turns a batch of items into int32 ``[B, L]`` ids."""
    if array is not None:
        table = tf.constant(array)

        @tf.autograph.experimental.do_not_convert
        def epoch_items(epoch):
            order = tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int32), seed=_pair(seed, epoch), alg=_ALG)
            return tf.data.Dataset.from_tensor_slices(order[:per_epoch])

        def to_ids(index_batch):
            return tf.gather(table, index_batch)

    else:
        window = int(max(1, min(shuffle_buffer_size, n)))

        @tf.autograph.experimental.do_not_convert
        def epoch_items(epoch):
            # Windowed stateless shuffle: consecutive windows of `window` examples, each permuted with
            # a seed folded from (seed, epoch, window index). Unlike Dataset.shuffle it does not depend
            # on tf.random.set_seed, only on (seed, epoch).
            epoch_seed = _pair(seed, epoch)

            @tf.autograph.experimental.do_not_convert
            def permute(index, rows):
                key = tf.random.experimental.stateless_fold_in(epoch_seed, index, alg=_ALG)
                return tf.random.experimental.stateless_shuffle(rows, seed=key, alg=_ALG)

            windows = examples.take(per_epoch).batch(window).enumerate()
            return windows.map(permute).unbatch()

        def to_ids(example_batch):
            return example_batch

    return epoch_items, to_ids


def make_train_dataset(
    blocks: Union[np.ndarray, tf.data.Dataset],
    *,
    global_batch_size: int,
    seed: int,
    start_step: int = 0,
    mask_fn: Callable,
    num_blocks: Optional[int] = None,
    shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
) -> tf.data.Dataset:
    """An endless dataset of masked global training batches, starting at global step ``start_step``.

    Args:
        blocks: int32 ``[N, L]`` array (held in the dataset graph: keep it under ~1 GiB, larger corpora go
            through TFRecords), or a ``tf.data.Dataset`` of int32 ``[L]`` examples
            (:func:`hf_tpu_ext.data.tfrecord.read_tfrecord_blocks`) together with ``num_blocks``.
        global_batch_size: ``B``, blocks per step over all replicas.
        seed: seeds epoch orders ``(seed, epoch)`` and masks ``(seed, global_step)``.
        start_step: the first global step to yield (0, or the step of the checkpoint resumed from).
        mask_fn: ``mask_fn(input_ids int32 [B, L], seed int64 [2]) -> batch dict``, e.g.
            :func:`hf_tpu_ext.data.masking.make_mask_fn`.
        num_blocks: ``N`` for a dataset source (ignored for arrays).
        shuffle_buffer_size: window of the per-epoch shuffle of a dataset source (a full shuffle when
            ``>= N``); a window of ``W`` blocks of ``L`` int32 tokens holds ``4 * W * L`` bytes.

    Returns:
        tf.data.Dataset: infinite; element ``k`` is the batch dict of global step ``start_step + k`` with
        static shapes (``input_ids`` int32 ``[B, L]``, ...). Prefetched with AUTOTUNE.

    Raises:
        CorpusTooSmallError: ``N < global_batch_size`` (zero steps per epoch).
        DataError: a malformed source or ``start_step < 0``.
    """
    array, examples, n, length = _source(blocks, num_blocks)
    spe = steps_per_epoch(n, global_batch_size)
    if spe == 0:
        raise _too_small(n, length, global_batch_size, "train", "--per_device_train_batch_size")
    if start_step < 0:
        raise DataError(f"start_step must be >= 0, got {start_step}.")
    B = int(global_batch_size)
    per_epoch = spe * B
    start_epoch, offset = divmod(int(start_step), spe)

    epoch_items, to_ids = _epoch_orders(array, examples, n, per_epoch, seed, shuffle_buffer_size)
    items = tf.data.Dataset.range(start_epoch, np.iinfo(np.int64).max).flat_map(epoch_items)
    # every epoch contributes exactly spe * B items, so skipping offset * B keeps batches aligned
    batches = items.skip(offset * B).batch(B, drop_remainder=True)
    steps = tf.data.Dataset.range(int(start_step), np.iinfo(np.int64).max)

    @tf.autograph.experimental.do_not_convert  # straight-line TF ops: AutoGraph's conversion only costs start-up
    def make_batch(step, item_batch):
        return mask_fn(to_ids(item_batch), _pair(seed, step))

    dataset = tf.data.Dataset.zip((steps, batches)).map(make_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.deterministic = True
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def make_eval_dataset(
    blocks: Union[np.ndarray, tf.data.Dataset],
    *,
    global_batch_size: int,
    seed: int,
    mask_fn: Callable,
    num_blocks: Optional[int] = None,
) -> Tuple[tf.data.Dataset, int]:
    """A finite dataset of masked global evaluation batches, identical on every pass.

    Args:
        blocks: int32 ``[N, L]`` array, or a ``tf.data.Dataset`` of int32 ``[L]`` examples with
            ``num_blocks``.
        global_batch_size: ``B``, blocks per step over all replicas.
        seed: batch ``i`` is masked with seed ``(seed, -1 - i)`` (never equal to a training step's seed).
        mask_fn: as in :func:`make_train_dataset`.
        num_blocks: ``N`` for a dataset source.

    Returns:
        tuple: ``(dataset, num_steps)`` with ``num_steps = N // B`` batches in order (the partial last
        batch is dropped), static shapes, prefetched.

    Raises:
        CorpusTooSmallError: ``N < global_batch_size``.
    """
    array, examples, n, length = _source(blocks, num_blocks)
    num_steps = steps_per_epoch(n, global_batch_size)
    if num_steps == 0:
        raise _too_small(n, length, global_batch_size, "validation", "--per_device_eval_batch_size")
    B = int(global_batch_size)
    if array is not None:
        source = tf.data.Dataset.from_tensor_slices(array[: num_steps * B].reshape(num_steps, B, length))
    else:
        source = examples.take(num_steps * B).batch(B, drop_remainder=True)

    @tf.autograph.experimental.do_not_convert  # straight-line TF ops: AutoGraph's conversion only costs start-up
    def make_batch(index, ids):
        return mask_fn(ids, _pair(seed, -1 - index))

    dataset = tf.data.Dataset.zip((tf.data.Dataset.range(num_steps), source)).map(
        make_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    return dataset.prefetch(tf.data.AUTOTUNE), num_steps


def input_pipeline_tokens_per_second(dataset: tf.data.Dataset, num_batches: int) -> float:
    """Measure how fast a batch pipeline produces tokens on this host (for benchmarks).

    One batch is taken first to warm up (graph tracing, prefetch buffers) and not timed.

    Args:
        dataset: yields batch dicts with ``input_ids`` ``[B, L]``.
        num_batches: batches to time (>= 1).

    Returns:
        float: ``input_ids`` elements per second of wall time over the timed batches.

    Raises:
        DataError: ``num_batches < 1`` or the dataset ends before the first timed batch.
    """
    if num_batches < 1:
        raise DataError(f"num_batches must be >= 1, got {num_batches}.")
    iterator = iter(dataset)
    try:
        next(iterator)
    except StopIteration:
        raise DataError("The dataset is empty.") from None
    tokens = 0
    start = time.perf_counter()
    for _ in range(num_batches):
        try:
            batch = next(iterator)
        except StopIteration:
            break
        tokens += int(np.prod(batch["input_ids"].shape))
    elapsed = time.perf_counter() - start
    if tokens == 0:
        raise DataError("The dataset ended after the warm-up batch; give more batches.")
    return tokens / max(elapsed, 1e-9)
