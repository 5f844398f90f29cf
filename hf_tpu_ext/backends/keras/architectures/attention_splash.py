"""TPU attention: Pallas splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``) with a local or
full mask and the padding as segment ids, skipping the blocks the window masks (forward and backward kernels).

Layout of :func:`.attention.attend`: ``query`` ``[B, L, N, D]``, ``key``/``value`` ``[B, L, N, D]``,
``key_padding`` bool ``[B, L]``. Padding becomes segment ids (1: real token, 0: padding), so a real query sees only
real keys and a padded query only padded keys (always itself: no empty softmax row, and no real token reads a
padded query's output). ``L`` is padded up to a multiple of the 128-position block with segment id 2 (positions
nothing else sees). Packed documents (``segment_ids``, ``--pack_documents``): a real token's segment id is its
document's id + 3, so a query sees only the real keys of its own document. The kernel does not scale: ``query`` is multiplied by ``scale`` first.

Runs compiled on a TPU; ``interpret=True`` runs the same kernels through the Pallas interpreter (CPU, tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

#: splash's query/key block (its default :class:`BlockSizes`): ``L`` is padded up to a multiple of it
SPLASH_BLOCK = 128


@functools.lru_cache(maxsize=32)
def _kernel(length: int, heads: int, half_window, interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    shape = (length, length)
    if half_window is None:
        head_mask = masks.FullMask(shape)
    else:
        head_mask = masks.LocalMask(shape, window_size=(int(half_window), int(half_window)), offset=0)
    with jax.ensure_compile_time_eval():  # concrete mask tables, cached across traces (no leaked tracers)
        return splash.make_splash_mha(masks.MultiHeadMask([head_mask] * heads), head_shards=1, q_seq_shards=1,
                                      interpret=interpret)


def splash_attention(query, key, value, key_padding, scale: float, half_window=None, interpret: bool = False,
                     segment_ids=None):
    """Self-attention by splash kernels (module doc); ``half_window`` None: global, else ``|i - j| <= half_window``;
    ``segment_ids`` None, or int ``[B, L]`` >= 0: packed documents (a query sees only its own segment's keys).

    Returns:
        ``[B, L, N, D]`` in ``value``'s dtype.
    """
    from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import SegmentIds

    batch, length, heads, _ = query.shape
    padded = -(-length // SPLASH_BLOCK) * SPLASH_BLOCK
    extra = padded - length

    def heads_first(t):  # [B, L, N, D] -> [B, N, padded, D]
        return jnp.moveaxis(jnp.pad(t, [(0, 0), (0, extra), (0, 0), (0, 0)]), 2, 1)

    segments = key_padding.astype(jnp.int32)
    if segment_ids is not None:  # 0: padding, 2: block padding, 3 + document: real tokens
        segments = jnp.where(key_padding, jnp.asarray(segment_ids).astype(jnp.int32) + 3, 0)
    segments = jnp.pad(segments, [(0, 0), (0, extra)], constant_values=2)
    kernel = _kernel(padded, heads, None if half_window is None else int(half_window), bool(interpret))
    q = heads_first((query.astype(jnp.float32) * np.float32(scale)).astype(query.dtype))
    k, v = heads_first(key), heads_first(value)
    out = jax.vmap(lambda q1, k1, v1, s1: kernel(q1, k1, v1, segment_ids=SegmentIds(q=s1, kv=s1)))(q, k, v, segments)
    return jnp.moveaxis(out, 1, 2)[:, :length].astype(value.dtype)
