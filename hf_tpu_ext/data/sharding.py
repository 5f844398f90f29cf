"""Where each block goes on disk: a seeded permutation computable block by block, and contiguous shards.

``hf-tpu prepare-data`` writes training blocks in a seeded random order so the training pipeline's windowed
shuffle draws from the whole corpus. The order is a bijection ``position = permute(index)`` on ``[0, n)``
that needs only ``(index, n, seed)``: a 6-round Feistel network over the next even power of two, with cycle
walking back into ``[0, n)`` (Black & Rogaway, "Ciphers with Arbitrary Finite Domains", CT-RSA 2002). So a
distributed writer (the Apache Beam pipeline, :mod:`hf_tpu_ext.data.beam_prepare`) places every block
without a global sort or an ``n``-sized permutation table, and writes the same bytes as the local writer.

Shards are contiguous ranges of positions, sized like ``numpy.array_split`` (the first ``n % S`` shards
hold one block more). Pure numpy: no TensorFlow, so the Beam workers need none.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

_ROUNDS = 6
_M1 = np.uint64(0xFF51AFD7ED558CCD)  # MurmurHash3 fmix64 constants
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _fmix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(33))
    x = x * _M1
    x = x ^ (x >> np.uint64(33))
    x = x * _M2
    return x ^ (x >> np.uint64(33))


def _feistel(x: np.ndarray, half_bits: int, seed: int) -> np.ndarray:
    mask = np.uint64((1 << half_bits) - 1)
    left, right = x >> np.uint64(half_bits), x & mask
    key = _fmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    for r in range(_ROUNDS):
        round_key = key ^ np.uint64(((r + 1) * _GOLDEN) & _MASK64)
        left, right = right, left ^ (_fmix64(right ^ round_key) & mask)
    return (left << np.uint64(half_bits)) | right


def permute(indices, n: int, seed: int) -> np.ndarray:
    """Positions of blocks ``indices`` in a seeded random order of ``n`` blocks.

    Args:
        indices: int array-like of block indices in ``[0, n)``.
        n: number of blocks (>= 1).
        seed: the permutation's seed (``--seed``).

    Returns:
        int64 array, same shape: a bijection of ``[0, n)`` (distinct indices give distinct positions).

    Raises:
        ValueError: an index outside ``[0, n)``.
    """
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"block indices must lie in [0, {n}), got [{idx.min()}, {idx.max()}].")
    bits = max(2, int(n - 1).bit_length())
    bits += bits % 2
    x = idx.astype(np.uint64)
    out = _feistel(x, bits // 2, seed)
    # cycle walking: the domain 2**bits < 4n, so on average fewer than 4 passes per index
    outside = out >= np.uint64(n)
    while outside.any():
        out[outside] = _feistel(out[outside], bits // 2, seed)
        outside = out >= np.uint64(n)
    return out.astype(np.int64)


def permutation_order(n: int, seed: int) -> np.ndarray:
    """The block index at each position: ``order[permute(i)] = i`` (int64 ``[n]``)."""
    order = np.empty(n, dtype=np.int64)
    if n:
        order[permute(np.arange(n), n, seed)] = np.arange(n)
    return order


def shard_ranges(n: int, num_shards: int) -> Tuple[Tuple[int, int], ...]:
    """``(start, stop)`` positions of each of ``min(num_shards, n)`` contiguous shards, sized as ``np.array_split``."""
    shards = min(num_shards, n)
    if shards <= 0:
        return ()
    size, extra = divmod(n, shards)
    bounds = [0]
    for i in range(shards):
        bounds.append(bounds[-1] + size + (1 if i < extra else 0))
    return tuple(zip(bounds[:-1], bounds[1:]))


def shard_of(positions, n: int, num_shards: int) -> np.ndarray:
    """Shard index of each position (see :func:`shard_ranges`), int64, same shape as ``positions``."""
    starts = np.array([start for start, _ in shard_ranges(n, num_shards)], dtype=np.int64)
    return np.searchsorted(starts, np.asarray(positions, dtype=np.int64), side="right") - 1
