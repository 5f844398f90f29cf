"""Counter-based dropout (hf_tpu_ext.backends.tensorflow.dropout): rate, scaling, keys, XLA == eager, Keras layers."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from hf_tpu_ext.backends.tensorflow import dropout as cbd


def test_fmix32_matches_reference_values():
    # MurmurHash3 fmix32 computed by hand in Python integers
    def ref(h):
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)

    xs = np.array([0, 1, 2, 12345, 0xDEADBEEF, 0xFFFFFFFF], dtype=np.uint32)
    got = cbd.fmix32(tf.constant(xs)).numpy()
    assert got.tolist() == [ref(int(x)) for x in xs]
    assert got[0] == 0 and got[1] == 0x514E28B7  # published fmix32(1)


def test_keep_fraction_scale_and_independence():
    x = tf.ones([64, 128, 128])
    key = cbd.dropout_key(42, step=7, replica_id=0)
    y = cbd.dropout(x, 0.1, key).numpy()
    kept = y != 0
    assert y.shape == (64, 128, 128) and y.dtype == np.float32
    assert abs(kept.mean() - 0.9) < 0.002  # 1M draws: 3 sigma ~ 0.0009
    np.testing.assert_allclose(y[kept], 1 / 0.9, rtol=1e-6)
    # neighbouring elements are not correlated
    a, b = kept.reshape(-1)[:-1].astype(float), kept.reshape(-1)[1:].astype(float)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.01
    # bits are uniform over their 16 top-bit buckets
    bits = cbd.uniform_bits([1 << 20], key).numpy()
    counts = np.bincount(bits >> 28, minlength=16)
    assert counts.min() > 0.97 * (1 << 16) and counts.max() < 1.03 * (1 << 16)


def test_same_key_same_mask_other_step_or_replica_other_mask():
    x = tf.ones([32, 1000])
    m = lambda key: (cbd.dropout(x, 0.5, key).numpy() != 0)  # noqa: E731
    base = m(cbd.dropout_key(1, 10, 0))
    assert (base == m(cbd.dropout_key(1, 10, 0))).all()
    for other in (cbd.dropout_key(1, 11, 0), cbd.dropout_key(1, 10, 1), cbd.dropout_key(2, 10, 0)):
        agreement = (base == m(other)).mean()
        assert 0.48 < agreement < 0.52, agreement  # independent masks agree half the time at rate 0.5


def test_xla_and_eager_give_the_same_mask_and_gradient():
    x = tf.random.stateless_normal([4, 16, 32], seed=[1, 2])
    key = cbd.dropout_key(3, 5, 2)

    def f(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = cbd.dropout(x, 0.25, key)
            loss = tf.reduce_sum(y * y)
        return y, tape.gradient(loss, x)

    y_eager, g_eager = f(x)
    y_xla, g_xla = tf.function(f, jit_compile=True)(x)
    np.testing.assert_array_equal(y_eager.numpy(), y_xla.numpy())
    np.testing.assert_allclose(g_xla.numpy(), g_eager.numpy(), rtol=1e-6)
    np.testing.assert_allclose(g_eager.numpy(), 2 * y_eager.numpy() / 0.75, rtol=1e-6)  # d/dx (x*m/0.75)^2


def test_bad_rate_and_dynamic_shape_raise():
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\)"):
        cbd.dropout(tf.ones([3]), 1.0, cbd.dropout_key(0, 0))
    np.testing.assert_array_equal(cbd.dropout(tf.ones([3]), 0.0, cbd.dropout_key(0, 0)).numpy(), np.ones(3))

    @tf.function(input_signature=[tf.TensorSpec([None, 4])])
    def dynamic(x):
        return cbd.dropout(x, 0.1, cbd.dropout_key(0, 0))

    with pytest.raises(ValueError, match="static shape"):
        dynamic.get_concrete_function()


def test_keras_dropout_layers_use_it_only_inside_the_block():
    layer = tf_keras.layers.Dropout(0.5)
    x = tf.ones([8, 256])
    key = cbd.dropout_key(9, 3)
    with cbd.counter_based_dropout(key):
        first = layer(x, training=True).numpy()
        second = layer(x, training=True).numpy()  # second call in the block: its own key
    with cbd.counter_based_dropout(key):
        again = layer(x, training=True).numpy()
    np.testing.assert_array_equal(first, again)  # the call counter restarts per block
    assert (first != second).any()
    expected = cbd.dropout(x, 0.5, cbd.fmix32(key + tf.constant(0x632BE5AB, tf.uint32))).numpy()
    np.testing.assert_array_equal(first, expected)
    # outside the block: the layer's own (stateful) generator, and inference is untouched
    outside = [layer(x, training=True).numpy() for _ in range(2)]
    assert (outside[0] != outside[1]).any()
    with cbd.counter_based_dropout(key):
        np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    with cbd.counter_based_dropout(None):  # None: nothing changes
        assert (layer(x, training=True).numpy() != first).any()


def test_keras_noise_shape_broadcasts_the_mask_in_an_xla_function():
    layer = tf_keras.layers.Dropout(0.5, noise_shape=(None, 1, 64))
    x = tf.ones([4, 16, 64])

    @tf.function(jit_compile=True)
    def f(x):
        with cbd.counter_based_dropout(cbd.dropout_key(5, 1)):
            return layer(x, training=True)

    y = f(x).numpy()
    assert y.shape == (4, 16, 64)
    assert (y == y[:, :1, :]).all()  # one mask row per sequence, broadcast over axis 1
    assert 0.3 < (y[:, 0, :] != 0).mean() < 0.7
    assert set(np.unique(y)) <= {0.0, 2.0}


def test_rate_near_one_drops_almost_everything():
    y = cbd.dropout(tf.ones([1000]), 1 - 2**-34, cbd.dropout_key(0, 0)).numpy()
    assert (y == 0).all()
