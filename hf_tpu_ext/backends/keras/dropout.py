"""Counter-based dropout for the JAX training step: masks from a hash of (key, global element index).

Why: Keras' JAX dropout draws ``jax.random.bernoulli`` from a threefry key; XLA:CPU lowers threefry to
element-wise code that costs more than the matmuls of a small model's step (the same finding as the TensorFlow
backend's :mod:`hf_tpu_ext.backends.tensorflow.dropout`, whose idea this follows: Salmon et al. 2011,
"Parallel random numbers: as easy as 1, 2, 3"). Here the bits of an element are MurmurHash3's 32-bit finalizer
``fmix32`` (Appleby) applied twice to ``(key, counter)``, which XLA fuses into the consumer of the mask.

The counter is the element's index in the GLOBAL batch (``micro_batch * elements_per_micro_batch + i``, see
:func:`counter_based_dropout`), so the masks do not depend on how the batch is split: 4 devices x 8 sequences,
1 device x 32 and 4 accumulated micro-batches of 8 draw the same masks, and a resumed run draws the masks of
an uninterrupted one. The key mixes ``(seed, global step, micro-batch)`` and a per-call counter (one per
``Dropout`` call while tracing), so masks differ per layer, step and micro-batch.

Semantics of ``keras.random.dropout``: an element is kept with probability ``1 - rate`` (exact to 2**-32) and
kept elements are scaled by ``1 / (1 - rate)``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional

_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio (Knuth's multiplicative hash)
_CALL_STRIDE = 0x632BE5AB
_ROUND_KEY_MUL, _ROUND_KEY_ADD = 0x6A09E667, 0xBB67AE85  # fractional bits of sqrt(2), sqrt(3) (SHA-256 IVs)

_active = threading.local()


def fmix32(x):
    """MurmurHash3's 32-bit finalizer, element-wise on a ``jnp.uint32`` array (a bijection, full avalanche)."""
    import jax.numpy as jnp

    x = x ^ (x >> jnp.uint32(16))
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> jnp.uint32(13))
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> jnp.uint32(16))


def dropout_key(seed: int, step, micro_batch=0):
    """The uint32 key of one micro-batch of one training step.

    Args:
        seed: the run's ``--seed`` (Python int).
        step: the global step (int scalar, traced or not).
        micro_batch: the micro-batch index inside the step (gradient accumulation), int scalar.

    Returns:
        scalar ``jnp.uint32``.
    """
    import jax.numpy as jnp

    def u32(v):
        return jnp.asarray(v).astype(jnp.uint32)

    key = fmix32(jnp.uint32((int(seed) + _GOLDEN) & 0xFFFFFFFF))
    key = fmix32((key ^ (u32(step) * jnp.uint32(_GOLDEN))) + jnp.uint32(1))
    return fmix32((key ^ (u32(micro_batch) * jnp.uint32(_CALL_STRIDE))) + jnp.uint32(2))


def uniform_bits(shape, key, offset=0):
    """uint32 pseudo-random bits of a static ``shape`` from a scalar uint32 ``key``; element ``i`` (row-major)
    uses counter ``offset + i``."""
    import jax
    import jax.numpy as jnp

    counter = jax.lax.iota(jnp.uint32, int(_size(shape))).reshape(shape) + jnp.asarray(offset).astype(jnp.uint32)
    x = fmix32(counter * jnp.uint32(_GOLDEN) + key)
    return fmix32(x ^ (key * jnp.uint32(_ROUND_KEY_MUL) + jnp.uint32(_ROUND_KEY_ADD)))


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def dropout(inputs, rate: float, key, offset=0, noise_shape=None):
    """``keras.random.dropout`` with masks from :func:`uniform_bits` (same dtype and shape as ``inputs``).

    Raises:
        ValueError: ``rate`` outside ``[0, 1)``.
    """
    import jax.numpy as jnp

    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}.")
    if rate == 0.0:
        return inputs
    shape = tuple(inputs.shape) if noise_shape is None else tuple(
        inputs.shape[i] if d is None else int(d) for i, d in enumerate(noise_shape))
    threshold = min(int(round(rate * 2**32)), 0xFFFFFFFF)  # P(bits >= threshold) = 1 - rate
    keep = uniform_bits(shape, key, offset) >= jnp.uint32(threshold)
    keep = jnp.broadcast_to(keep, inputs.shape)
    return jnp.where(keep, inputs * jnp.asarray(1.0 / (1.0 - rate), inputs.dtype), jnp.zeros_like(inputs))


def _keras_backend_random():
    """Keras' backend ``random`` module (``keras.src.backend``'s: the ``dropout`` that ``keras.layers.Dropout``
    calls).

    The one adapter over this private module. The public alternative: ``keras.random.dropout(..., seed=...)``
    called by a model's own dropout layer with a ``keras.random.SeedGenerator``; Keras has no public hook into the
    op its built-in layer calls.
    """
    from keras.src import backend

    return backend.random


def _install() -> None:
    """Route Keras' backend ``random.dropout`` (what ``keras.layers.Dropout`` calls) through a thread-local
    switch, once per process; outside :func:`counter_based_dropout` the original runs unchanged."""
    module = _keras_backend_random()
    original = module.dropout
    if getattr(original, "_hf_tpu_counter_based", False):
        return

    def dispatching_dropout(inputs, rate, noise_shape=None, seed=None):
        state = getattr(_active, "state", None)
        if state is None or not isinstance(rate, (int, float)) or any(d is None for d in inputs.shape):
            return original(inputs, rate, noise_shape=noise_shape, seed=seed)
        state["calls"] += 1
        import jax.numpy as jnp

        call_key = fmix32(state["key"] + jnp.uint32((state["calls"] * _CALL_STRIDE) & 0xFFFFFFFF))
        # the counter of element i of this micro-batch in the global batch: micro_batch * size + i
        micro = state["micro_batch"]
        offset = (jnp.asarray(micro).astype(jnp.uint32) * jnp.uint32(_size(inputs.shape) & 0xFFFFFFFF)
                  if micro is not None else 0)
        return dropout(inputs, rate, call_key, offset=offset, noise_shape=noise_shape)

    dispatching_dropout._hf_tpu_counter_based = True
    module.dropout = dispatching_dropout


@contextlib.contextmanager
def counter_based_dropout(key, micro_batch=None) -> Iterator[None]:
    """While tracing a model call inside this block, ``keras.layers.Dropout`` uses :func:`dropout`.

    Args:
        key: scalar uint32 key (:func:`dropout_key`); ``None`` changes nothing.
        micro_batch: the micro-batch index (traced int) when the step accumulates gradients: element ``i``
            of a dropout input of ``n`` elements gets counter ``micro_batch * n + i`` (its index in the
            global batch); ``None``: ``i``.

    Every dropout call gets its own key (``key`` mixed with a call counter that restarts at each block, so a
    retrace gives the same keys). Only the tracing thread is affected. A layer's own ``seed`` is not used.
    """
    if key is None:
        yield
        return
    _install()
    previous = getattr(_active, "state", None)
    _active.state = {"key": key, "calls": 0, "micro_batch": micro_batch}
    try:
        yield
    finally:
        _active.state = previous
