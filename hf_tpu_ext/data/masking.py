"""Stateless masked-LM masking in TensorFlow (graph, tf.data and XLA friendly).

Per sequence exactly ``n = min(P, number of maskable tokens)`` positions are drawn uniformly without
replacement among the non-special tokens (uniform integer scores, -1 on special ids, ``top_k``),
as BERT's TPU pre-training data does with ``max_predictions_per_seq``. Of the chosen positions 80%
become ``<mask>``, 10% a random non-special token and 10% stay unchanged (decided independently per
position). Everything is seeded by a ``[2]`` seed through ``tf.random.stateless_*``: the same ids and seed
always give the same batch, on any host, which makes resumed runs see the same masks.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, Iterable, Optional

import tensorflow as tf

_ALG = "philox"
_SCORE_RANGE = 1 << 30

def default_max_predictions(max_seq_length: int, mlm_probability: float = 0.15) -> int:
    """``max(1, round(max_seq_length * mlm_probability))`` (BERT's ``max_predictions_per_seq`` rule)."""
    return max(1, int(round(max_seq_length * mlm_probability)))


def mask_tokens(
    input_ids,
    seed,
    *,
    mask_token_id: int,
    vocab_size: int,
    special_token_ids: Iterable[int],
    max_predictions: Optional[int] = None,
    mlm_probability: float = 0.15,
    pad_token_id: Optional[int] = None,
) -> Dict[str, tf.Tensor]:
    """Mask a batch of token blocks for masked language modeling.

    Args:
        input_ids: int32/int64 ``[B, L]`` token ids (``L`` should be static for XLA).
        seed: int32/int64 ``[2]`` seed of the ``tf.random.stateless_*`` ops, e.g. ``(seed, global_step)``.
        mask_token_id: id of ``<mask>``.
        vocab_size: random replacements are drawn from ``[0, vocab_size)`` minus ``special_token_ids``
            (use ``len(tokenizer)``).
        special_token_ids: ids never chosen for prediction nor drawn as replacements (``<s>``, ``</s>``,
            ``<pad>``, ``<unk>``, ``<mask>``; e.g. ``tokenizer.all_special_ids``).
        max_predictions: ``P``, predicted positions per sequence (default
            ``round(L * mlm_probability)``, at least 1); must be ``<= L``.
        mlm_probability: only used for the default of ``max_predictions``.
        pad_token_id: ``attention_mask`` is 0 where ``input_ids == pad_token_id`` (``None``: all ones).

    Returns:
        dict[str, tf.Tensor] (the training-batch contract of ARCHITECTURE.md):
        ``input_ids`` int32 ``[B, L]`` (after masking), ``attention_mask`` int32 ``[B, L]``,
        ``masked_lm_positions`` int32 ``[B, P]`` (ascending, 0 where padded), ``masked_lm_ids`` int32
        ``[B, P]`` (original ids, 0 where padded), ``masked_lm_weights`` float32 ``[B, P]`` (1.0 real,
        0.0 padding).

    Raises:
        ValueError: ``max_predictions`` exceeds a static ``L``, or no token id is left for random
            replacement.
    """
    ids = tf.cast(tf.convert_to_tensor(input_ids), tf.int32)
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    P, special, replacement_ids = _masking_plan(ids.shape[-1], max_predictions, mlm_probability, special_token_ids,
                                                vocab_size)
    shape = tf.shape(ids)
    batch = shape[0]
    choose_seed, action_seed, random_id_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=3, alg=_ALG))

    # Only integer draws with an explicit algorithm: they give the same bits eagerly, in tf.data and
    # under XLA (float draws differ between the XLA and non-XLA kernels).
    positions, valid = _choose_positions(ids, special, P, choose_seed)
    weights = tf.cast(valid, tf.float32)
    original = tf.gather(ids, positions, batch_dims=1)
    masked_lm_ids = tf.where(valid, original, tf.zeros_like(original))

    # 2) action in {0..9}: 0-7 -> <mask> (80%), 8 -> random non-special token (10%), 9 -> unchanged (10%)
    action = tf.random.stateless_uniform([batch, P], seed=action_seed, minval=0, maxval=10, dtype=tf.int32, alg=_ALG)
    table = tf.constant(replacement_ids, tf.int32)
    random_idx = tf.random.stateless_uniform(
        [batch, P], seed=random_id_seed, minval=0, maxval=len(replacement_ids), dtype=tf.int32, alg=_ALG
    )
    random_ids = tf.gather(table, random_idx)
    mask_ids = tf.fill([batch, P], tf.constant(mask_token_id, tf.int32))
    new_ids = tf.where(action < 8, mask_ids, tf.where(action < 9, random_ids, original))

    # 3) write back: add (new - original) at the chosen positions; padding slots add 0, so the
    # duplicate index 0 of padding slots never changes anything (scatter-add is order independent)
    delta = tf.where(valid, new_ids - original, tf.zeros_like(original))
    batch_idx = tf.broadcast_to(tf.range(batch)[:, None], [batch, P])
    scatter_idx = tf.stack([batch_idx, positions], axis=-1)
    masked_input = ids + tf.scatter_nd(scatter_idx, delta, shape)

    if pad_token_id is None:
        attention_mask = tf.ones_like(ids)
    else:
        attention_mask = tf.cast(tf.not_equal(ids, int(pad_token_id)), tf.int32)
    return {
        "input_ids": masked_input,
        "attention_mask": attention_mask,
        "masked_lm_positions": positions,
        "masked_lm_ids": masked_lm_ids,
        "masked_lm_weights": weights,
    }


def _masking_plan(static_len, max_predictions, mlm_probability: float, special_token_ids, vocab_size):
    """``(P, sorted special ids, replacement ids)`` of :func:`mask_tokens`' arguments (``static_len``: ``L`` or None).

    Raises:
        ValueError: see :func:`mask_tokens`.
    """
    if max_predictions is None:
        if static_len is None:
            raise ValueError("max_predictions is needed when the sequence length is not static.")
        max_predictions = default_max_predictions(static_len, mlm_probability)
    P = int(max_predictions)
    if static_len is not None and P > static_len:
        raise ValueError(f"max_predictions={P} exceeds the sequence length {static_len}.")
    special = sorted({int(i) for i in special_token_ids if i is not None})
    replacement_ids = [i for i in range(int(vocab_size)) if i not in set(special)]
    if not replacement_ids:
        raise ValueError(f"vocab_size={vocab_size} leaves no non-special token id for random replacement.")
    return P, special, replacement_ids


def _choose_positions(ids, special, P: int, choose_seed):
    """Step 1 of :func:`mask_tokens`: uniform integer scores, -1 on special ids, top ``P``.

    Returns:
        ``(positions, valid)``: int32 ``[B, P]`` ascending positions (0 where padded) and bool ``[B, P]``.
    """
    shape = tf.shape(ids)
    batch, length = shape[0], shape[1]
    is_special = tf.reduce_any(tf.equal(ids[:, :, None], tf.constant(special or [-1], tf.int32)[None, None, :]), axis=-1)
    scores = tf.random.stateless_uniform(
        [batch, length], seed=choose_seed, minval=0, maxval=_SCORE_RANGE, dtype=tf.int32, alg=_ALG
    )
    scores = tf.where(is_special, -tf.ones_like(scores), scores)
    top_scores, top_pos = tf.math.top_k(scores, k=P, sorted=True)
    valid = top_scores >= 0  # the first min(P, maskable) slots
    # ascending positions with the padding slots last: give padding slots the key `length`
    positions = tf.sort(tf.where(valid, top_pos, length + tf.zeros_like(top_pos)), axis=-1)
    valid = positions < length
    positions = tf.where(valid, positions, tf.zeros_like(positions))
    return positions, valid


def make_mask_fn(tokenizer, max_predictions: int, mlm_probability: float = 0.15) -> Callable:
    """A ``mask_fn(input_ids [B, L], seed [2]) -> batch dict`` for :mod:`hf_tpu_ext.data.pipeline`.

    Args:
        tokenizer: a tokenizer with a mask token; gives ``mask_token_id``, ``len(tokenizer)`` as vocab
            size, ``all_special_ids`` and ``pad_token_id``.
        max_predictions: ``P`` (``data_args.max_predictions_per_seq``).
        mlm_probability: ``data_args.mlm_probability``.

    Returns:
        Callable: :func:`mask_tokens` with every keyword bound.
    """
    return functools.partial(
        mask_tokens,
        mask_token_id=int(tokenizer.mask_token_id),
        vocab_size=len(tokenizer),
        special_token_ids=list(tokenizer.all_special_ids),
        max_predictions=int(max_predictions),
        mlm_probability=float(mlm_probability),
        pad_token_id=tokenizer.pad_token_id,
    )
