"""The attention kernels that never hold ``L x L`` (``architectures/attention_kernels.py``, ``attention_splash.py``)
and :func:`attend`'s choice between them.

* block-local and chunked attention equal the dense reference (float32, <= 1e-5), outputs at real queries and the
  gradients of a loss read at real queries, for lengths that are not a multiple of the block or the chunk, windows
  narrower and wider than the block, and right-padded rows;
* ModernBERT through these paths equals transformers (eager) at seq 64 / 200 / 1,000, local_attention 16 / 64;
* the chunked gradient compiles without ``L x L`` temporaries (``memory_analysis``);
* splash attention (TPU) run by the Pallas interpreter on CPU equals the dense reference;
* the path chosen, and the one INFO line saying it.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_attention_kernels.py``.
"""

import logging

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from hf_tpu_ext.backends.keras.architectures import attention, attention_kernels as kernels  # noqa: E402

TOLERANCE = 1e-5
SCALE = 0.25


def _inputs(length, real=(None, 3), heads=2, dim=16, seed=0):
    """q, k, v float32 ``[2, length, heads, dim]`` and key_padding bool ``[2, length]`` (row 1 right-padded)."""
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(2, length, heads, dim)).astype("float32")) for _ in range(3))
    lengths = np.array([[length if n is None else n] for n in real])
    return q, k, v, np.arange(length)[None, :] < lengths


def _window_mask(padding, half_window):
    length = padding.shape[1]
    position = np.arange(length)
    keys = padding[:, None, None, :]
    if half_window is None:
        return keys
    return np.logical_and(keys, (np.abs(position[:, None] - position[None, :]) <= half_window)[None, None])


def _grads(fn, q, k, v, padding):
    """Gradients of ``sum(out * w)`` with ``w`` random at real queries, 0 at padded ones (nothing reads them)."""
    weight = np.random.default_rng(9).normal(size=q.shape).astype("float32") * padding[:, :, None, None]
    return jax.jit(jax.grad(lambda *qkv: jnp.sum(fn(*qkv) * weight), argnums=(0, 1, 2)))(q, k, v)


def _assert_equal_at_real_queries(fn, q, k, v, padding, half_window):
    reference = lambda *qkv: kernels.dense_attention(*qkv, _window_mask(padding, half_window), SCALE)  # noqa: E731
    got, expected = np.asarray(jax.jit(fn)(q, k, v)), np.asarray(reference(q, k, v))
    assert got.shape == expected.shape == q.shape
    assert np.abs(got - expected)[padding].max() <= TOLERANCE
    for mine, theirs in zip(_grads(fn, q, k, v, padding), _grads(reference, q, k, v, padding)):
        assert np.abs(np.asarray(mine) - np.asarray(theirs)).max() <= TOLERANCE


@pytest.mark.parametrize("length,half_window,block", [(37, 8, 0), (100, 20, 8), (65, 64, 0), (10, 64, 0),
                                                      (50, 0, 0)])
def test_local_equals_dense_masked(length, half_window, block):
    q, k, v, padding = _inputs(length, real=(None, max(1, length // 3)))
    fn = lambda *qkv: kernels.local_attention(*qkv, jnp.asarray(padding), half_window, SCALE, block)  # noqa: E731
    _assert_equal_at_real_queries(fn, q, k, v, padding, half_window)


def test_local_window_edges_are_inclusive_at_half_window():
    """One value per position: the output at query i averages exactly the positions i-h .. i+h (a key at distance
    h+1 changes nothing, one at h does)."""
    length, half = 40, 5
    q = jnp.zeros((1, length, 1, 8))  # equal scores: the softmax is the mean over the window
    v = jnp.broadcast_to(jnp.arange(length, dtype=jnp.float32)[None, :, None, None], (1, length, 1, 8))
    out = np.asarray(kernels.local_attention(q, q, v, jnp.ones((1, length), bool), half, 1.0))[0, :, 0, 0]
    expected = [np.mean(np.arange(max(0, i - half), min(length, i + half + 1))) for i in range(length)]
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("length,chunk", [(100, 32), (7, 512)])
def test_chunked_equals_dense(length, chunk):
    q, k, v, padding = _inputs(length, real=(None, max(1, length // 4)))
    fn = lambda *qkv: kernels.chunked_attention(*qkv, jnp.asarray(padding), SCALE, chunk)  # noqa: E731
    _assert_equal_at_real_queries(fn, q, k, v, padding, None)


def test_chunked_row_without_real_keys_is_the_dense_uniform_row():
    q, k, v, padding = _inputs(20, real=(None, 0))
    got = kernels.chunked_attention(q, k, v, jnp.asarray(padding), SCALE, 6)
    expected = kernels.dense_attention(q, k, v, padding[:, None, None, :], SCALE)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=0, atol=TOLERANCE)


def _temp_bytes(fn, length):
    q = jax.ShapeDtypeStruct((1, length, 2, 16), jnp.float32)
    padding = jax.ShapeDtypeStruct((1, length), jnp.bool_)
    grad = jax.grad(lambda q, k, v, p: jnp.sum(fn(q, k, v, p)), argnums=(0, 1, 2))
    return jax.jit(grad).lower(q, q, q, padding).compile().memory_analysis().temp_size_in_bytes


def test_gradients_compile_without_an_l_by_l_temporary():
    """Doubling L doubles the chunked and block-local gradients' temporaries (they grow as L x chunk, L x window)
    and quadruples the dense one's (``L x L`` scores); at L = 4,096 the new paths hold less than one float32
    score matrix of the 2 heads (128 MiB), the dense path several."""
    def temps(length):
        return [_temp_bytes(fn, length) for fn in (
            lambda q, k, v, p: kernels.dense_attention(q, k, v, p[:, None, None, :], SCALE),
            lambda q, k, v, p: kernels.chunked_attention(q, k, v, p, SCALE, 512),
            lambda q, k, v, p: kernels.local_attention(q, k, v, p, 64, SCALE))]

    (dense_2k, chunked_2k, local_2k), (dense_4k, chunked_4k, local_4k) = temps(2048), temps(4096)
    scores = 2 * 4096 * 4096 * 4
    assert dense_4k >= 3.5 * dense_2k and dense_4k >= scores
    assert chunked_4k <= 2.2 * chunked_2k and local_4k <= 2.2 * local_2k, (chunked_2k, chunked_4k, local_2k, local_4k)
    assert chunked_4k < scores and local_4k < scores // 4


def test_splash_in_pallas_interpret_mode_equals_dense():
    """The TPU kernels, interpreted on CPU: global and local (L = 200 padded to 256: two splash blocks)."""
    pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
    from hf_tpu_ext.backends.keras.architectures.attention_splash import splash_attention

    q, k, v, padding = _inputs(200, real=(None, 70), heads=1)
    for half_window in (None, 8):
        fn = lambda *qkv: splash_attention(*qkv, jnp.asarray(padding), SCALE, half_window,  # noqa: E731
                                           interpret=True)
        _assert_equal_at_real_queries(fn, q, k, v, padding, half_window)


@pytest.mark.parametrize("platform,length,half_window,dtype,path", [
    ("cpu", 2048, 64, "float32", "local"), ("cpu", 60, 64, "float32", "dense"),  # window holds the sequence
    ("cpu", 511, None, "float32", "dense"), ("cpu", 512, None, "float32", "chunked"),
    ("gpu", 8192, None, "bfloat16", "cudnn"), ("gpu", 8192, None, "float32", "chunked"),
    ("gpu", 8192, 64, "bfloat16", "local"), ("tpu", 8192, 64, "bfloat16", "splash"),
    ("tpu", 128, None, "float32", "splash")])
def test_attention_path(platform, length, half_window, dtype, path):
    assert attention.attention_path(length, half_window, dtype, platform)[0] == path
    assert attention.attention_path(length, half_window, dtype, platform, dropout=True)[0] == "dense"


def test_the_choice_is_logged_once(caplog):
    caplog.set_level(logging.INFO, logger=attention.__name__)
    attention._LOGGED.clear()
    for _ in range(3):
        line = attention.describe_paths(1000, {"global": None, "local": 32})
    assert line == ("Attention at seq 1000: global layers: chunked (seq 1000 >= 512: chunked online softmax, no L x "
                    "L); local layers: local (the window (+-32) is narrower than the sequence (1000): block-local).")
    assert [r.getMessage() for r in caplog.records] == [line]


def test_cudnn_refused_falls_back_to_chunked_with_one_warning(caplog):
    """Without cuDNN (this CPU) the GPU path's trace-time refusal gives the chunked kernel, said once."""
    caplog.set_level(logging.WARNING, logger=attention.__name__)
    attention._LOGGED.clear()
    q, k, v, padding = _inputs(20, real=(None, 7))
    for _ in range(2):
        got = attention._kernel("cudnn", q, k, v, padding, None, SCALE)
    expected = kernels.dense_attention(q, k, v, padding[:, None, None, :], SCALE)
    assert np.abs(np.asarray(got) - np.asarray(expected))[padding].max() <= TOLERANCE
    assert len(caplog.records) == 1 and caplog.records[0].getMessage().startswith("cuDNN attention refused (")
    assert caplog.records[0].getMessage().endswith("); chunked attention instead.")


def test_bfloat16_inputs_run_on_cpu_close_to_float32():
    """bf16 q/k/v (``--bf16``): scores upcast on CPU (XLA:CPU's batched dot rejects bf16 x bf16 -> f32), the
    jitted gradients of both kernels run and stay within bf16's precision of the float32 ones."""
    q, k, v, padding = _inputs(70, real=(None, 30))
    runs = {}
    for dtype in ("float32", "bfloat16"):
        qkv = [t.astype(dtype) for t in (q, k, v)]
        for name, fn in (("local", lambda *a: kernels.local_attention(*a, jnp.asarray(padding), 8, SCALE)),
                         ("chunked", lambda *a: kernels.chunked_attention(*a, jnp.asarray(padding), SCALE, 32))):
            out = jax.jit(fn)(*qkv)
            assert out.dtype == dtype
            runs[name, dtype] = [np.asarray(t, np.float32) for t in (out,) + _grads(fn, *qkv, padding)]
    for name in ("local", "chunked"):
        for low, high in zip(runs[name, "bfloat16"], runs[name, "float32"]):
            assert np.abs(low - high).max() <= 0.05 * np.abs(high).max() + 1e-3, name
