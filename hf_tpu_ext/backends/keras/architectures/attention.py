"""Scaled dot-product attention for every architecture of the Keras backend: :func:`attend`.

Two ways to give the mask. ``mask`` (bool, broadcastable to ``[B, N, T, S]``), as before: the dense paths below.
Or ``key_padding`` (``[B, S]``, True/1 at real keys) with ``half_window`` (a sliding window ``|i - j| <=
half_window``, transformers' ModernBERT ``sliding_window``; None: global), which lets the JAX backend pick a path
that never holds ``L x L`` (:func:`attention_path` decides, :func:`describe_paths` says it in the log):

* ``"local"`` (a window narrower than the sequence, CPU/GPU): block-local, only the key blocks covering the
  window (:func:`.attention_kernels.local_attention`; time and memory linear in ``L``);
* ``"chunked"`` (global, ``L >= CHUNKED_MIN_LENGTH``, CPU; GPU in float32): online-softmax over key chunks with a
  recomputing backward (:func:`.attention_kernels.chunked_attention`);
* ``"cudnn"`` (global, GPU, bfloat16/float16): ``jax.nn.dot_product_attention(implementation="cudnn")``, cuDNN's
  flash attention with the padding as key lengths (right padding, as every batch here; its window is causal-only,
  so local layers take ``"local"``); where cuDNN refuses at trace time, ``"chunked"`` with one warning. Not run on
  a GPU in CI;
* ``"splash"`` (TPU, local and global): Pallas splash attention with a ``LocalMask`` and the padding as segment ids
  (:mod:`.attention_splash`), which skips masked blocks;
* ``"dense"``: everything else — short global sequences (measured faster below ``CHUNKED_MIN_LENGTH`` on CPU),
  a window covering the sequence, a non-JAX backend, and training with attention-probability dropout.

Packed documents (``--pack_documents``): ``segment_ids`` (int ``[B, L]``, one id per document of a block) restrict
each query to the keys of its own segment on every path: the dense mask becomes block-diagonal
(:func:`segment_mask`), block-local and chunked compare segment ids in their masks, splash takes them as its
segment ids, and ``"cudnn"`` gives way to ``"chunked"`` (``jax.nn.dot_product_attention`` has no segment ids).
Without ``segment_ids`` nothing of this is traced: the unpacked program is unchanged.

The dense paths:

* inference, or training with an attention-probability dropout rate of 0: ``keras.ops.dot_product_attention(q, k,
  v, mask=mask)``. What Keras 3.15's JAX backend runs then: on CPU ``jax.nn.dot_product_attention``'s XLA
  composition (einsums, masked softmax); on a GPU its cuDNN fused kernel where Keras' flash-attention check passes
  (bf16/fp16 inputs, Ampere or newer, cuDNN present; the boolean mask becomes an additive bias), else the XLA
  composition; on a TPU the XLA composition: Keras' Splash-kernel path applies batch row 0's mask to every row
  (wrong for per-row padding) and needs a concrete mask anyway (inside ``jit`` the mask is traced), so
  :func:`flash_attention_setting` turns it off there;
* training with a nonzero rate: the same math written out (``Q K^T`` in float32, the mask, a float32 softmax cast
  to the compute dtype, ``keras.layers.Dropout`` on the probabilities, then ``A V``), as transformers' eager
  attention computes it; no fused kernel applies dropout here, so this path stays dense (``L x L``) on every
  device.

Imported only on the Keras backend, after the framework starts.
"""

from __future__ import annotations

import logging
from typing import Optional

import keras
import numpy as np
from keras import ops

logger = logging.getLogger(__name__)

#: where the softmax must not look: finite, so a query whose keys are all masked gets a uniform row, not NaN
#: (no real token reads such a query's output)
MASKED_LOGIT = -1e30
#: global attention takes the chunked kernel from this length on (CPU; GPU float32). Measured (2-core Xeon, AVX-512,
#: fp32, 4 heads x 64, 4,096 tokens per batch, forward + backward): dense 51 / 90-105 / 160-166 / 479-605 ms at
#: 128 / 256 / 512 / 1,024 against chunked 52 / 84-93 / 102-105 / 230-312 ms: equal up to 256, faster from 512
CHUNKED_MIN_LENGTH = 512
#: keys per chunk of the chunked kernel (one chunk at 512: the same kernel, dense in effect)
GLOBAL_CHUNK = 512
_LOGGED = set()


def flash_attention_setting() -> Optional[bool]:
    """``flash_attention`` for ``keras.ops.dot_product_attention``: ``False`` on a JAX TPU (module doc), else
    ``None`` (Keras decides: cuDNN or XLA)."""
    if keras.config.backend() == "jax":
        import jax

        if jax.default_backend() == "tpu":
            return False
    return None


def attention_path(length: int, half_window: Optional[int], dtype="float32", platform: Optional[str] = None,
                   dropout: bool = False):
    """``(path, reason)``: which kernel :func:`attend` runs for self-attention over ``length`` positions (module
    doc). ``platform``: ``jax.default_backend()`` when None; ``dropout``: training with attention dropout > 0."""
    if keras.config.backend() != "jax":
        return "dense", f"the {keras.config.backend()} backend has only keras.ops.dot_product_attention"
    if dropout:
        return "dense", "attention-probability dropout while training needs the probabilities (no fused kernel)"
    if platform is None:
        import jax

        platform = jax.default_backend()
    local = half_window is not None and int(half_window) < int(length) - 1  # else the window holds every key
    if platform == "tpu":
        return "splash", "TPU: splash attention skips the blocks the mask removes"
    if local:
        return "local", f"the window (+-{half_window}) is narrower than the sequence ({length}): block-local"
    if platform == "gpu" and str(dtype) in ("bfloat16", "float16"):
        return "cudnn", f"GPU, {dtype}: cuDNN flash attention"
    if length >= CHUNKED_MIN_LENGTH:
        return "chunked", f"seq {length} >= {CHUNKED_MIN_LENGTH}: chunked online softmax, no L x L"
    return "dense", f"seq {length} < {CHUNKED_MIN_LENGTH}: dense attention is as fast here"


def describe_paths(length: int, half_windows, dtype="float32", dropout: bool = False) -> str:
    """One INFO line (logged once per distinct line per process): the path of each attention kind at ``length``.
    ``half_windows``: ``{name: half_window or None}``, e.g. ``{"global": None, "local": 64}``. Returns the line."""
    parts = []
    for name, half_window in half_windows.items():
        path, reason = attention_path(length, half_window, dtype, dropout=dropout)
        parts.append(f"{name} layers: {path} ({reason})")
    line = f"Attention at seq {length}: " + "; ".join(parts) + "."
    _log_once(line)
    return line


def _log_once(line: str, level: int = logging.INFO) -> None:
    if line not in _LOGGED:
        _LOGGED.add(line)
        logger.log(level, line)


def segment_mask(padding_mask, segment_ids):
    """bool ``[B, 1, L, L]``: True where key ``j`` is real (``padding_mask`` ``[B, L]``, 1/True: real) and in the
    query ``i``'s segment (``segment_ids`` int ``[B, L]``): the block-diagonal mask of packed documents."""
    segments = ops.convert_to_tensor(segment_ids)
    same = ops.equal(segments[:, None, :, None], segments[:, None, None, :])
    return ops.logical_and(ops.cast(padding_mask, "bool")[:, None, None, :], same)


def dense_mask(key_padding, half_window: Optional[int], length: int, segment_ids=None):
    """bool ``[B, 1, 1, L]`` (global) or ``[B, 1, L, L]`` (``|i - j| <= half_window``, or ``segment_ids`` given:
    also the same segment) from ``key_padding``."""
    if segment_ids is None:
        keys = ops.cast(key_padding, "bool")[:, None, None, :]
    else:
        keys = segment_mask(key_padding, segment_ids)
    if half_window is None:
        return keys
    position = np.arange(length)
    window = np.abs(position[:, None] - position[None, :]) <= int(half_window)
    return ops.logical_and(keys, ops.convert_to_tensor(window)[None, None])


def _kernel(path: str, query, key, value, key_padding, half_window, scale: float, segment_ids=None):
    import jax
    import jax.numpy as jnp

    padding = jnp.asarray(key_padding).astype(bool)
    # as keywords only when packed, so the unpacked calls (and programs) stay as they were
    packed = {} if segment_ids is None else {"segment_ids": jnp.asarray(segment_ids).astype(jnp.int32)}
    if path == "cudnn" and packed:
        _log_once("Packed documents on GPU: chunked global attention (cuDNN's has no segment ids).")
        path = "chunked"
    if path == "local":
        from hf_tpu_ext.backends.keras.architectures.attention_kernels import local_attention

        return local_attention(query, key, value, padding, int(half_window), scale, **packed)
    if path == "chunked":
        from hf_tpu_ext.backends.keras.architectures.attention_kernels import chunked_attention

        return chunked_attention(query, key, value, padding, scale, GLOBAL_CHUNK, **packed)
    if path == "splash":
        from hf_tpu_ext.backends.keras.architectures.attention_splash import splash_attention

        return splash_attention(query, key, value, padding, scale, half_window, **packed)
    # cudnn: the padding as key lengths (cuDNN's padding mask, no [T, S] bias: a bias must be [.., T, S]), which
    # holds for right padding (real tokens first: the collators' blocks and padded batches)
    lengths = jnp.sum(padding, axis=1, dtype=jnp.int32)
    try:
        return jax.nn.dot_product_attention(query, key, value, scale=scale, key_value_seq_lengths=lengths,
                                            implementation="cudnn")
    except (ValueError, NotImplementedError, RuntimeError) as error:  # cuDNN missing or refusing these shapes
        _log_once(f"cuDNN attention refused ({error}); chunked attention instead.", logging.WARNING)
        from hf_tpu_ext.backends.keras.architectures.attention_kernels import chunked_attention

        return chunked_attention(query, key, value, padding, scale, GLOBAL_CHUNK)


def attend(query, key, value, mask, probs_dropout, training: bool, scale: Optional[float] = None, *,
           key_padding=None, half_window: Optional[int] = None, segment_ids=None):
    """Multi-head attention of projected ``query``/``key``/``value`` (module doc says which path runs when).

    Args:
        query: ``[B, T, N, D]`` (compute dtype); key, value: ``[B, S, N, D]``.
        mask: bool, broadcastable to ``[B, N, T, S]``; True where a query may attend to a key. May be None when
            ``key_padding`` is given (then built from it where a dense path runs).
        probs_dropout: the ``keras.layers.Dropout`` of the attention probabilities (its ``rate``; the step's
            counter-based dropout patches it).
        training: Keras' training flag.
        scale: multiplies ``Q K^T``; None: ``1 / sqrt(D)``.
        key_padding: int/bool ``[B, S]``, True/1 at real keys (self-attention, ``T == S``): enables the kernels
            that never hold ``T x S`` (:func:`attention_path`); ``mask`` is then ignored.
        half_window: with ``key_padding``: a query ``i`` sees keys ``|i - j| <= half_window``; None: all keys.
        segment_ids: with ``key_padding``: None, or int ``[B, L]``: packed documents, a query sees only the keys of
            its own segment (module doc).

    Returns:
        ``[B, T, N, D]`` in ``value``'s dtype.

    Raises:
        ValueError: neither ``mask`` nor ``key_padding`` given.
    """
    dropout = bool(training and probs_dropout.rate > 0)
    if key_padding is not None:
        length = query.shape[1]
        path, _ = attention_path(length, half_window, keras.backend.standardize_dtype(query.dtype), dropout=dropout)
        if path != "dense":
            scale = float(query.shape[-1]) ** -0.5 if scale is None else float(scale)
            return _kernel(path, query, key, value, key_padding, half_window, scale, segment_ids)
        mask = dense_mask(key_padding, half_window, length, segment_ids)
    elif mask is None:
        raise ValueError("attend needs mask or key_padding.")
    if not dropout:
        return ops.dot_product_attention(query, key, value, mask=mask, scale=scale,
                                         flash_attention=flash_attention_setting())
    scale = float(query.shape[-1]) ** -0.5 if scale is None else float(scale)
    scores = ops.einsum("btnh,bsnh->bnts", ops.cast(query, "float32"), ops.cast(key, "float32")) * scale
    probs = ops.softmax(ops.where(mask, scores, MASKED_LOGIT), axis=-1)
    probs = probs_dropout(ops.cast(probs, value.dtype), training=True)
    return ops.einsum("bnts,bsnh->btnh", probs, value)
