"""JAX attention kernels that never hold an ``L x L`` tensor: block-local (sliding window) and chunked global.

Both take the layout of :func:`.attention.attend`: ``query`` ``[B, T, N, D]``, ``key``/``value`` ``[B, S, N, D]``
(self-attention: ``T == S == L``), ``key_padding`` bool ``[B, S]`` (True: a real key), optionally
``segment_ids`` int ``[B, L]`` (documents packed in one block, ``--pack_documents``: a query sees only the keys of
its own segment), and return ``[B, T, N, D]`` in ``value``'s dtype. Scores and the softmax are float32 (``preferred_element_type``), as the dense path's.

* :func:`local_attention`: a query at position ``i`` sees the real keys ``j`` with ``|i - j| <= half_window``
  (transformers' ModernBERT ``sliding_window``, both ends inclusive). Queries are cut into blocks of ``block``
  positions; block ``b`` reads the key blocks ``b - r .. b + r`` with ``r = ceil(half_window / block)``, so every
  query scores ``(2 r + 1) block`` keys instead of ``L`` (memory and time linear in ``L``). ``L`` need not be a
  multiple of ``block`` (the tail is padded with keys that never count).
* :func:`chunked_attention`: global attention by key chunks with an online softmax (Milakov & Gimelshein 2018;
  FlashAttention's recurrence), a ``jax.custom_vjp`` whose forward keeps only the output and the per-query
  log-sum-exp, and whose backward recomputes each chunk's probabilities: forward and backward temporaries are
  ``[B, N, T, chunk]``, never ``[B, N, T, S]``.

A query that sees no real key (only possible at padded positions) gets a finite output that no real token reads:
:func:`chunked_attention` gives the uniform average over all ``S`` keys, as the dense path does;
:func:`local_attention` the average over its window.

Imported only on the JAX backend.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

#: a key the query must not see (masked by padding or by the window): the dense path's value
MASKED_LOGIT = -1e30
#: a key that does not exist (block or chunk padding past ``S``): far below MASKED_LOGIT, so it gets weight 0 even
#: in a row whose every real key is masked (that row stays the dense path's uniform average over the ``S`` keys)
ABSENT_LOGIT = -3e30


def _dot(spec: str, a, b):
    """``einsum`` with a float32 result. XLA:CPU's batched dot rejects bf16 x bf16 -> f32 ("Unsupported element
    type for DotThunk::Execute", see ``backends/keras/bf16_dot.py``), so on CPU non-float32 operands are upcast
    first; accelerators multiply them natively with float32 accumulation."""
    if (a.dtype != jnp.float32 or b.dtype != jnp.float32) and jax.default_backend() == "cpu":
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def local_block_size(half_window: int) -> int:
    """The query block of :func:`local_attention`: ``half_window`` rounded up to a multiple of 8 (at least 8, at
    most 256), so three blocks (``r = 1``) cover the window: each query scores ``3 block`` keys against the
    ``2 half_window + 1`` it needs (192 for ModernBERT's 129)."""
    return int(min(256, max(8, -(-int(half_window) // 8) * 8)))


def local_attention(query, key, value, key_padding, half_window: int, scale: float, block: int = 0,
                    segment_ids=None):
    """Sliding-window attention computing only the blocks that cover the window (module doc).

    Args:
        query: ``[B, L, N, D]``; key, value: ``[B, L, N, D]`` (self-attention).
        key_padding: bool ``[B, L]``, True at real keys.
        half_window: keys seen on each side (``|i - j| <= half_window``), >= 0.
        scale: multiplies ``Q K^T``.
        block: query block length; 0: :func:`local_block_size`.
        segment_ids: None, or int ``[B, L]``: a query sees only keys of its own segment (packed documents).

    Returns:
        ``[B, L, N, D]`` in ``value``'s dtype.
    """
    batch, length, heads, dim = query.shape
    block = int(block) or local_block_size(half_window)
    block = min(block, length)
    reach = -(-int(half_window) // block) if half_window > 0 else 0  # key blocks on each side
    blocks = -(-length // block)
    tail = blocks * block - length
    pad = [(0, 0), (reach * block, reach * block + tail), (0, 0), (0, 0)]
    key_p, value_p = jnp.pad(key, pad), jnp.pad(value, pad)
    valid = jnp.pad(key_padding.astype(bool), [(0, 0), (reach * block, reach * block + tail)])
    present = jnp.pad(jnp.ones((length,), bool), [(reach * block, reach * block + tail)])
    span = 2 * reach + 1

    def windows(t):  # [B, (blocks + 2 reach) block, ...] -> [B, blocks, span * block, ...]
        t = t.reshape((batch, blocks + 2 * reach, block) + t.shape[2:])
        return jnp.concatenate([t[:, o:o + blocks] for o in range(span)], axis=2)

    keys_w, values_w, valid_w = windows(key_p), windows(value_p), windows(valid)
    q = jnp.pad(query, [(0, 0), (0, tail), (0, 0), (0, 0)]).reshape(batch, blocks, block, heads, dim)
    scores = _dot("bcqnd,bcknd->bcnqk", q, keys_w) * scale
    # positions: query block c row i is c*block + i; its key column k is (c - reach)*block + k
    q_pos = jnp.arange(block)[:, None]
    k_pos = jnp.arange(span * block)[None, :] - reach * block
    in_window = jnp.abs(q_pos - k_pos) <= half_window  # [block, span*block]: same for every block
    exists = _existing_keys(present, blocks, block, span)
    allowed = jnp.logical_and(valid_w[:, :, None, None, :], in_window[None, None, None])
    if segment_ids is not None:  # packed documents: the window stops at the document's edges
        seg_q = jnp.pad(segment_ids, [(0, 0), (0, tail)], constant_values=-1).reshape(batch, blocks, block)
        seg_k = windows(jnp.pad(segment_ids, [(0, 0), (reach * block, reach * block + tail)], constant_values=-1))
        allowed = jnp.logical_and(allowed, (seg_q[:, :, :, None] == seg_k[:, :, None, :])[:, :, None])
    scores = jnp.where(allowed, scores, MASKED_LOGIT)
    scores = jnp.where(exists[None, :, None, None, :], scores, ABSENT_LOGIT)
    probs = jax.nn.softmax(scores, axis=-1).astype(value.dtype)
    out = jnp.einsum("bcnqk,bcknd->bcqnd", probs, values_w)
    return out.reshape(batch, blocks * block, heads, dim)[:, :length]


def _existing_keys(present, blocks: int, block: int, span: int):
    """``[blocks, span * block]`` bool: whether each window column is a position of the sequence."""
    padded = present.reshape(-1, block)
    return jnp.concatenate([padded[o:o + blocks] for o in range(span)], axis=1)


def _chunks(t, chunk: int, fill):
    """``[B, S, ...]`` -> ``[S / chunk, B, chunk, ...]``, ``S`` padded up with ``fill``."""
    pad = -t.shape[1] % chunk
    t = jnp.pad(t, [(0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 2), constant_values=fill)
    t = t.reshape((t.shape[0], t.shape[1] // chunk, chunk) + t.shape[2:])
    return jnp.moveaxis(t, 1, 0)


def _bias_chunks(key_padding, chunk: int):
    """``[S / chunk, B, chunk]`` float32: 0 at real keys, MASKED_LOGIT at padding, ABSENT_LOGIT past ``S``."""
    bias = jnp.where(key_padding.astype(bool), 0.0, MASKED_LOGIT).astype(jnp.float32)
    return _chunks(bias, chunk, ABSENT_LOGIT)


def _same_segment(s, segments, segment_chunk):
    """``s`` ``[B, N, T, chunk]`` with MASKED_LOGIT where the key's segment differs from the query's (packed
    documents); unchanged when ``segments`` is None (no operation traced)."""
    if segments is None:
        return s
    same = segments[:, None, :, None] == segment_chunk[:, None, None, :]
    return jnp.where(same, s, MASKED_LOGIT)


def _segment_chunks(segments, chunk: int):
    return None if segments is None else _chunks(segments, chunk, -1)


def _forward(query, key, value, key_padding, segments, scale, chunk):
    keys, values, biases = _chunks(key, chunk, 0), _chunks(value, chunk, 0), _bias_chunks(key_padding, chunk)
    segment_chunks = _segment_chunks(segments, chunk)
    batch, length, heads, dim = query.shape
    init = (jnp.full((batch, heads, length), -jnp.inf, jnp.float32), jnp.zeros((batch, heads, length), jnp.float32),
            jnp.zeros((batch, length, heads, dim), jnp.float32))

    def step(carry, xs):
        top, total, acc = carry
        k, v, bias, segment_chunk = xs
        s = _same_segment(_dot("btnd,bsnd->bnts", query, k) * scale, segments, segment_chunk)
        s = s + bias[:, None, None, :]
        new_top = jnp.maximum(top, s.max(-1))
        p = jnp.exp(s - new_top[..., None])
        decay = jnp.exp(top - new_top)
        total = total * decay + p.sum(-1)
        pv = _dot("bnts,bsnd->btnd", p.astype(value.dtype), v)
        acc = acc * jnp.moveaxis(decay, 1, 2)[..., None] + pv
        return (new_top, total, acc), None

    (top, total, acc), _ = jax.lax.scan(step, init, (keys, values, biases, segment_chunks))
    out = (acc / jnp.moveaxis(total, 1, 2)[..., None]).astype(value.dtype)
    return out, top + jnp.log(total)  # [B, T, N, D], log-sum-exp [B, N, T]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _chunked(query, key, value, key_padding, segments, scale, chunk):
    return _forward(query, key, value, key_padding, segments, scale, chunk)[0]


def _chunked_fwd(query, key, value, key_padding, segments, scale, chunk):
    out, lse = _forward(query, key, value, key_padding, segments, scale, chunk)
    return out, (query, key, value, key_padding, segments, out, lse)


def _chunked_bwd(scale, chunk, residuals, d_out):
    query, key, value, key_padding, segments, out, lse = residuals
    length = key.shape[1]
    keys, values, biases = _chunks(key, chunk, 0), _chunks(value, chunk, 0), _bias_chunks(key_padding, chunk)
    segment_chunks = _segment_chunks(segments, chunk)
    d_out32 = d_out.astype(jnp.float32)
    delta = jnp.einsum("btnd,btnd->bnt", d_out32, out.astype(jnp.float32))  # rowsum(dO * O)

    def step(d_query, xs):
        k, v, bias, segment_chunk = xs
        s = _same_segment(_dot("btnd,bsnd->bnts", query, k) * scale, segments, segment_chunk)
        p = jnp.exp(s + bias[:, None, None, :] - lse[..., None])
        d_value = jnp.einsum("bnts,btnd->bsnd", p, d_out32)
        d_p = jnp.einsum("btnd,bsnd->bnts", d_out32, v.astype(jnp.float32))
        d_s = p * (d_p - delta[..., None]) * scale
        d_key = jnp.einsum("bnts,btnd->bsnd", d_s, query.astype(jnp.float32))
        d_query = d_query + jnp.einsum("bnts,bsnd->btnd", d_s, k.astype(jnp.float32))
        return d_query, (d_key, d_value)

    d_query, (d_keys, d_values) = jax.lax.scan(step, jnp.zeros(query.shape, jnp.float32),
                                               (keys, values, biases, segment_chunks))

    def unchunk(t):  # [S / chunk, B, chunk, N, D] -> [B, S, N, D]
        t = jnp.moveaxis(t, 0, 1)
        return t.reshape((t.shape[0], -1) + t.shape[3:])[:, :length]

    no_gradient = jnp.zeros(key_padding.shape, jax.dtypes.float0)  # a bool input has no cotangent
    no_segment_gradient = None if segments is None else jnp.zeros(segments.shape, jax.dtypes.float0)
    return (d_query.astype(query.dtype), unchunk(d_keys).astype(key.dtype), unchunk(d_values).astype(value.dtype),
            no_gradient, no_segment_gradient)


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def chunked_attention(query, key, value, key_padding, scale: float, chunk: int = 512, segment_ids=None):
    """Global attention over key chunks of ``chunk`` (module doc); forward and backward in ``O(T chunk)`` memory.

    Args:
        query: ``[B, T, N, D]``; key, value: ``[B, S, N, D]``.
        key_padding: bool ``[B, S]``, True at real keys.
        scale: multiplies ``Q K^T``.
        chunk: keys per step (``S`` need not be a multiple).
        segment_ids: None, or int ``[B, L]`` (self-attention): a query sees only keys of its own segment.

    Returns:
        ``[B, T, N, D]`` in ``value``'s dtype.
    """
    chunk = max(1, min(int(chunk), key.shape[1]))
    segments = None if segment_ids is None else jnp.asarray(segment_ids).astype(jnp.int32)
    return _chunked(query, key, value, key_padding.astype(bool), segments, float(scale), chunk)


def dense_attention(query, key, value, mask, scale: float):
    """The reference: all ``T x S`` scores, float32 softmax, ``mask`` bool broadcastable to ``[B, N, T, S]``."""
    s = _dot("btnd,bsnd->bnts", query, key) * scale
    probs = jax.nn.softmax(jnp.where(mask, s, MASKED_LOGIT), axis=-1).astype(value.dtype)
    return jnp.einsum("bnts,bsnd->btnd", probs, value)
