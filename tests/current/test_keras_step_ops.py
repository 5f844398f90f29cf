"""The Keras backend's step-level replacement of Keras' exact GELU (erfc) by the same function through erf.

The host allocator settings are tested framework-free in tests/test_host_memory.py.

Runs in the current-releases venv (``KERAS_BACKEND=jax``).
"""

import os

import numpy as np
import pytest

pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("the JAX step's ops", allow_module_level=True)
os.environ.setdefault("KERAS_BACKEND", "jax")


def test_erf_gelu_is_the_exact_gelu_and_only_inside_its_block():
    import jax
    import jax.numpy as jnp
    import keras

    from hf_tpu_ext.backends.keras.gelu import erf_gelu, gelu_erf

    x = jnp.linspace(-12.0, 12.0, 20001, dtype=jnp.float32)
    exact = jax.nn.gelu(x, approximate=False)
    assert float(jnp.max(jnp.abs(gelu_erf(x) - exact))) < 1e-6
    # transformers' GELUActivation at a few points (0.5 x (1 + erf(x / sqrt 2)), values from its formula in float64)
    from math import erf, sqrt

    points = np.array([-3.0, -1.0, -0.1, 0.0, 0.5, 2.0], np.float32)
    want = [0.5 * p * (1 + erf(p / sqrt(2))) for p in points.astype(np.float64)]
    np.testing.assert_allclose(np.asarray(gelu_erf(jnp.asarray(points))), want, rtol=1e-6, atol=1e-7)

    with erf_gelu():
        inside = keras.activations.gelu(x)
        approximate = keras.activations.gelu(x, approximate=True)  # the tanh form is not touched
    assert bool(jnp.all(inside == gelu_erf(x)))
    assert bool(jnp.all(approximate == jax.nn.gelu(x, approximate=True)))
    assert bool(jnp.all(keras.activations.gelu(x) == exact))  # outside the block: Keras' own again


def test_erf_gelu_in_a_traced_model_call_matches_the_model():
    import jax
    import jax.numpy as jnp
    from transformers import RobertaConfig

    from hf_tpu_ext.backends.keras.gelu import erf_gelu
    from hf_tpu_ext.backends.keras.model import build_masked_lm

    config = RobertaConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=34)
    model = build_masked_lm(config, seed=3)
    inputs = {"token_ids": jnp.asarray(np.random.default_rng(0).integers(3, 300, (2, 32)), jnp.int32),
              "padding_mask": jnp.ones((2, 32), jnp.int32), "mask_positions": jnp.asarray([[1, 5], [2, 30]], jnp.int32)}
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def logits(tv):
        with erf_gelu():
            return model.stateless_call(tv, non_trainable, inputs, training=False)[0]

    ours = jax.jit(logits)(trainable)
    theirs = model(inputs, training=False)
    assert ours.shape == (2, 2, 300)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-5)

