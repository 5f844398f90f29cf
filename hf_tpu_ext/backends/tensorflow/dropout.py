"""Counter-based dropout for XLA-compiled steps: masks from a hash of (key, element index).

Used by the XLA training step and by the bf16 step on TensorFlow's kernels whose element-wise ops XLA fuses
(:mod:`hf_tpu_ext.backends.tensorflow.fusion`: the hash fuses there too, ``RandomUniform`` does not).

Why: XLA lowers TensorFlow's random ops (``tf.nn.dropout``'s uniform sampler, and Philox/ThreeFry
``RngBitGenerator``) into element-wise code that is slow on XLA:CPU: measured on the small preset (2 CPU
cores, batch 16 x 128 tokens), forward+backward took 364 ms with stock dropout under XLA, 280 ms with
dropout off, 294 ms with the masks below (see ``benchmarks/NOTES.md``). A counter-based generator
(Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") needs no RNG state: the bits of
element ``i`` are a pure function of ``(key, i)``, so XLA fuses them into the consumer of the mask.

The mixing function is MurmurHash3's 32-bit finalizer ``fmix32`` (Appleby), applied twice; a
dropout key is derived from ``(seed, global step, replica id)`` and a per-call counter, so masks
differ per layer, step and replica, and a resumed run draws the same masks as an uninterrupted one.

The dropout itself keeps the semantics of ``tf.nn.dropout``: an element is kept with probability
``1 - rate`` (exact to 2**-32) and kept elements are scaled by ``1 / (1 - rate)``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional, Sequence

import tensorflow as tf

_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads consecutive counters (Knuth's multiplicative hash)
_CALL_STRIDE = 0x632BE5AB
_ROUND_KEY_MUL, _ROUND_KEY_ADD = 0x6A09E667, 0xBB67AE85  # fractional bits of sqrt(2), sqrt(3) (SHA-256 IVs)

_active = threading.local()


def _u32(value: int) -> tf.Tensor:
    return tf.constant(value & 0xFFFFFFFF, tf.uint32)


def fmix32(x: tf.Tensor) -> tf.Tensor:
    """MurmurHash3's 32-bit finalizer, element-wise on a uint32 tensor (a bijection with full avalanche)."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))
    x = x * _u32(0x85EBCA6B)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(13)))
    x = x * _u32(0xC2B2AE35)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))


def dropout_key(seed: int, step, replica_id=0) -> tf.Tensor:
    """The uint32 key of one training step on one replica.

    Args:
        seed: the run's ``--seed`` (Python int).
        step: the global step (int tensor or int; ``optimizer.iterations`` before the update).
        replica_id: ``replica_id_in_sync_group`` (int tensor or int).

    Returns:
        scalar uint32 tensor.
    """
    step = tf.bitcast(tf.cast(tf.cast(step, tf.int64) % (1 << 31), tf.int32), tf.uint32)
    replica = tf.bitcast(tf.cast(replica_id, tf.int32), tf.uint32)
    key = fmix32(_u32(seed) + _u32(_GOLDEN))
    key = fmix32(tf.bitwise.bitwise_xor(key, step * _u32(_GOLDEN)) + _u32(1))
    return fmix32(tf.bitwise.bitwise_xor(key, replica * _u32(_CALL_STRIDE)) + _u32(2))


def uniform_bits(shape: Sequence[int], key: tf.Tensor) -> tf.Tensor:
    """uint32 pseudo-random bits of a static ``shape`` from a scalar uint32 ``key``.

    Raises:
        ValueError: the shape is not fully static, or has 2**31 elements or more.
    """
    dims = [int(d) if d is not None else None for d in tf.TensorShape(shape).as_list()]
    if any(d is None for d in dims):
        raise ValueError(f"counter-based dropout needs a static shape (XLA step), got {dims}.")
    count = 1
    for d in dims:
        count *= d
    if count >= 2**31:
        raise ValueError(f"counter-based dropout: {count} elements is more than one 31-bit counter covers.")
    counter = tf.bitcast(tf.range(count, dtype=tf.int32), tf.uint32)
    x = fmix32(counter * _u32(_GOLDEN) + key)
    x = fmix32(tf.bitwise.bitwise_xor(x, key * _u32(_ROUND_KEY_MUL) + _u32(_ROUND_KEY_ADD)))
    return tf.reshape(x, dims)


def static_noise_shape(inputs: tf.Tensor, noise_shape) -> Optional[tf.TensorShape]:
    """``noise_shape`` (list, TensorShape or a constant tensor, as tf_keras passes it) with unknown entries
    taken from ``inputs``; None when it is not known at trace time."""
    if noise_shape is None:
        return inputs.shape
    if isinstance(noise_shape, tf.Tensor):
        noise_shape = tf.get_static_value(noise_shape, partial=True)
        if noise_shape is None:
            return None
    dims = [inputs.shape[i] if d is None or int(d) < 0 else int(d)
            for i, d in enumerate(list(noise_shape))]
    if any(d is None for d in dims):
        return None
    return tf.TensorShape(dims)


def dropout(inputs: tf.Tensor, rate: float, key: tf.Tensor, noise_shape=None) -> tf.Tensor:
    """``tf.nn.dropout`` with masks from :func:`uniform_bits` (same dtype and shape as ``inputs``).

    Args:
        inputs: float tensor of static shape.
        rate: drop probability in ``[0, 1)``.
        key: scalar uint32 key (one per call: reusing a key reuses the mask).
        noise_shape: as in ``tf.nn.dropout`` (broadcast to ``inputs``).

    Raises:
        ValueError: ``rate`` outside ``[0, 1)``.
    """
    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}.")
    if rate == 0.0:
        return tf.identity(inputs)
    shape = inputs.shape if noise_shape is None else static_noise_shape(inputs, noise_shape)
    threshold = min(int(round(rate * 2**32)), 0xFFFFFFFF)  # P(bits >= threshold) = 1 - rate
    keep = uniform_bits(shape, key) >= _u32(threshold)
    scaled = inputs * tf.cast(1.0 / (1.0 - rate), inputs.dtype)
    # a product with the 0/1 mask, not tf.where(keep, scaled, zeros): the zeros are a constant of the input's
    # shape, and under XLA auto-clustering (precision.py's fused element-wise path) such constants inside the
    # step's while loop made TensorFlow's clustering build a graph with a cycle ("N nodes in a cycle")
    return scaled * tf.cast(keep, scaled.dtype)


def _tf_keras_random_generator():
    """``tf_keras``' ``RandomGenerator`` class (``tf_keras.src.backend``: its ``dropout`` is what
    ``tf_keras.layers.Dropout`` calls).

    The one adapter over this private module. The public alternative: ``tf.nn.experimental.stateless_dropout``
    (counter-based, seeded) called by a model's own dropout layer; tf_keras has no public hook into its layers'
    random generator.
    """
    from tf_keras.src import backend

    return backend.RandomGenerator


def _install() -> None:
    """Route ``tf_keras`` ``RandomGenerator.dropout`` through a thread-local switch (once per process).

    Outside :func:`counter_based_dropout` the switch is off and the original method runs unchanged.
    """
    generator_class = _tf_keras_random_generator()
    original = generator_class.dropout
    if getattr(original, "_hf_tpu_counter_based", False):
        return

    def dispatching_dropout(generator, inputs, rate, noise_shape=None):
        state = getattr(_active, "state", None)
        # outside the block, or a rate/shape only known at run time: the layer's own generator
        if (state is None or not isinstance(rate, (int, float)) or not inputs.shape.is_fully_defined()
                or (noise_shape is not None and static_noise_shape(inputs, noise_shape) is None)):
            return original(generator, inputs, rate, noise_shape=noise_shape)
        state["calls"] += 1
        call_key = fmix32(state["key"] + _u32(state["calls"] * _CALL_STRIDE))
        return dropout(inputs, rate, call_key, noise_shape=noise_shape)

    dispatching_dropout._hf_tpu_counter_based = True
    generator_class.dropout = dispatching_dropout


@contextlib.contextmanager
def counter_based_dropout(key: Optional[tf.Tensor]) -> Iterator[None]:
    """While tracing a model call inside this block, ``tf_keras`` Dropout layers use :func:`dropout`.

    Every dropout call gets its own key (``key`` mixed with a call counter that restarts at each
    block, so a retrace gives the same keys). Only the tracing thread is affected; layers called outside
    the block keep their own random generator. ``key=None`` changes nothing.

    Limits: a layer's own ``seed`` is not used inside the block; a Dropout inside a ``tf.while_loop`` body
    is traced once, so it reuses one key on every loop pass; code re-run outside the block (e.g. by
    ``tf.recompute_grad``) draws other masks. A rate or shape only known at run time falls back to the
    layer's own generator.

    Example:
        >>> with counter_based_dropout(dropout_key(42, step=0)):
        ...     hidden = model.roberta(input_ids, training=True)  # doctest: +SKIP
    """
    if key is None:
        yield
        return
    _install()
    previous = getattr(_active, "state", None)
    _active.state = {"key": tf.convert_to_tensor(key, tf.uint32), "calls": 0}
    try:
        yield
    finally:
        _active.state = previous
