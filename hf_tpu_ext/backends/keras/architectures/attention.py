"""Scaled dot-product attention for every architecture of the Keras backend: :func:`attend`.

Which implementation runs (``keras.ops.dot_product_attention`` has no dropout argument):

* inference, or training with an attention-probability dropout rate of 0: ``keras.ops.dot_product_attention(q, k,
  v, mask=mask)``. What Keras 3.15's JAX backend runs then: on CPU ``jax.nn.dot_product_attention``'s XLA
  composition (einsums, masked softmax); on a GPU its cuDNN fused kernel where Keras' flash-attention check passes
  (bf16/fp16 inputs, Ampere or newer, cuDNN present; the boolean mask becomes an additive bias), else the XLA
  composition; on a TPU the XLA composition: Keras' Splash-kernel path applies batch row 0's mask to every row
  (wrong for per-row padding) and needs a concrete mask anyway (inside ``jit`` the mask is traced), so
  :func:`flash_attention_setting` turns it off there;
* training with a nonzero rate: the same math written out (``Q K^T`` in float32, the mask, a float32 softmax cast
  to the compute dtype, ``keras.layers.Dropout`` on the probabilities, then ``A V``), as transformers' eager
  attention computes it; no fused kernel applies dropout here.

Imported only on the Keras backend, after the framework starts.
"""

from __future__ import annotations

from typing import Optional

import keras
from keras import ops

#: where the softmax must not look: finite, so a query whose keys are all masked gets a uniform row, not NaN
#: (no real token reads such a query's output)
MASKED_LOGIT = -1e30


def flash_attention_setting() -> Optional[bool]:
    """``flash_attention`` for ``keras.ops.dot_product_attention``: ``False`` on a JAX TPU (module doc), else
    ``None`` (Keras decides: cuDNN or XLA)."""
    if keras.config.backend() == "jax":
        import jax

        if jax.default_backend() == "tpu":
            return False
    return None


def attend(query, key, value, mask, probs_dropout, training: bool, scale: Optional[float] = None):
    """Multi-head attention of projected ``query``/``key``/``value`` (module doc says which path runs when).

    Args:
        query: ``[B, T, N, D]`` (compute dtype); key, value: ``[B, S, N, D]``.
        mask: bool, broadcastable to ``[B, N, T, S]``; True where a query may attend to a key.
        probs_dropout: the ``keras.layers.Dropout`` of the attention probabilities (its ``rate``; the step's
            counter-based dropout patches it).
        training: Keras' training flag.
        scale: multiplies ``Q K^T``; None: ``1 / sqrt(D)``.

    Returns:
        ``[B, T, N, D]`` in ``value``'s dtype.
    """
    if not (training and probs_dropout.rate > 0):
        return ops.dot_product_attention(query, key, value, mask=mask, scale=scale,
                                         flash_attention=flash_attention_setting())
    scale = float(query.shape[-1]) ** -0.5 if scale is None else float(scale)
    scores = ops.einsum("btnh,bsnh->bnts", ops.cast(query, "float32"), ops.cast(key, "float32")) * scale
    probs = ops.softmax(ops.where(mask, scores, MASKED_LOGIT), axis=-1)
    probs = probs_dropout(ops.cast(probs, value.dtype), training=True)
    return ops.einsum("bnts,bsnh->btnh", probs, value)
