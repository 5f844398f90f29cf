"""Rotary position embeddings (Su et al. 2021, RoFormer) as transformers' default RoPE computes them, shared by the
Keras architectures that use them (ModernBERT, EuroBERT).

transformers' convention (``rotate_half``, not interleaved pairs): ``inv_freq_j = theta^(-2j/head_dim)`` for ``j <
head_dim / 2``; the angle of position ``p`` is ``p * inv_freq`` repeated twice (``[L, head_dim]``); a query or key
``x`` becomes ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = concat(-x2, x1)``. Positions start at 0.

Imported only on the Keras backend, after the framework starts.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
from keras import ops


def inverse_frequencies(theta: float, head_dim: int) -> np.ndarray:
    """``theta^(-2j/head_dim)`` for ``j < head_dim / 2``: float32 ``[head_dim // 2]``."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (1.0 / (np.float32(theta) ** exponent)).astype(np.float32)


def rope_tables(inv_freq: np.ndarray, length: int, position_ids=None) -> Tuple[object, object]:
    """``(cos, sin)``: float32 tensors ``[length, 2 * len(inv_freq)]`` of positions ``0..length-1`` (constants: the
    length is static under ``jit``); with ``position_ids`` (int ``[B, L]``: packed documents, positions restarting
    in each) ``[B, L, 2 * len(inv_freq)]`` of those positions."""
    if position_ids is not None:
        freqs = ops.cast(position_ids, "float32")[..., None] * ops.convert_to_tensor(inv_freq)
        angles = ops.concatenate([freqs, freqs], axis=-1)
        return ops.cos(angles), ops.sin(angles)
    freqs = np.arange(length, dtype=np.float32)[:, None] * inv_freq[None, :]
    angles = ops.convert_to_tensor(np.concatenate([freqs, freqs], axis=-1))
    return ops.cos(angles), ops.sin(angles)


def rotate_half(x):
    """``concat(-x[..., d/2:], x[..., :d/2])`` on the last axis."""
    half = x.shape[-1] // 2
    return ops.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x, rope):
    """``x`` (``[B, L, N, D]``, any float dtype) rotated by ``rope = (cos, sin)`` (``[L, D]`` float32), computed in
    float32 (as transformers' ``apply_rotary_pos_emb`` with float32 tables) and cast back to ``x``'s dtype; tables
    of ``[B, L, D]`` (:func:`rope_tables` with position ids) rotate each row by its own positions."""
    cos, sin = (r[None, :, None, :] if len(r.shape) == 2 else r[:, :, None, :] for r in rope)
    x32 = ops.cast(x, "float32")
    return ops.cast(x32 * cos + rotate_half(x32) * sin, x.dtype)
