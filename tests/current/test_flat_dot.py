"""The Keras backend's float32 projections as 2-D dots (``flat_dots`` in hf_tpu_ext/backends/keras/bf16_dot.py):
which einsums it takes, the values, the gradients, and the transposes the compiled step no longer holds.

Runs in the current-releases venv (``KERAS_BACKEND=jax``).
"""

import os
import re

import numpy as np
import pytest

pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("the JAX step's ops", allow_module_level=True)
os.environ.setdefault("KERAS_BACKEND", "jax")


def _transpose_fusions(hlo_text):
    """How many copy/transpose fusions (physical transposes) the optimized module's entry computation runs."""
    entry = hlo_text[hlo_text.index("\nENTRY "):]
    return len(re.findall(r"^\s*(?:ROOT )?%(?:copy|transpose)\w*\.?\d* = \S+ fusion\(", entry, re.M))


def test_flat_einsum_takes_the_projection_forms_only_and_matches_einsum():
    import jax.numpy as jnp

    from hf_tpu_ext.backends.keras.bf16_dot import flat_einsum

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 3, 4)), jnp.float32)
    cases = {"abc,cde->abde": (x, jnp.asarray(rng.standard_normal((4, 5, 6)), jnp.float32)),  # q/k/v
             "abcd,cde->abe": (jnp.asarray(rng.standard_normal((2, 3, 5, 6)), jnp.float32),  # attention output
                               jnp.asarray(rng.standard_normal((5, 6, 4)), jnp.float32)),
             "abz,zw->abw": (x, jnp.asarray(rng.standard_normal((4, 7)), jnp.float32))}  # Dense
    for spec, (a, b) in cases.items():
        out = flat_einsum(spec, a, b)
        want = jnp.einsum(spec, a, b)
        assert out.shape == want.shape and out.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-6)
    y = jnp.asarray(rng.standard_normal((2, 5, 3, 6)), jnp.float32)
    assert flat_einsum("aecd,abcd->acbe", y, y) is None  # batched (attention scores): Keras' own path
    assert flat_einsum("abc,dc->abd", x, jnp.ones((7, 4))) is None  # contraction not leading in the kernel
    assert flat_einsum("abc,cd->adb", x, jnp.ones((4, 7))) is None  # output not free dims in order


def test_a_float32_roberta_step_with_flat_dots_trains_as_without_and_holds_fewer_transposes():
    """The whole float32 training step (tiny RoBERTa) with and without flat dots: same losses to 1e-5 relative
    over 3 steps; the compiled step runs fewer physical transposes (the Dense kernels' gradients read the
    cotangent in place)."""
    import jax
    import keras
    from transformers import RobertaConfig

    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.step import make_train_step

    config = RobertaConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=34)
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(5, 120, (1, 4, 32)).astype(np.int32),
             "attention_mask": np.ones((1, 4, 32), np.int32),
             "masked_lm_positions": np.tile(np.arange(1, 6, dtype=np.int32), (1, 4, 1)),
             "masked_lm_ids": rng.integers(5, 120, (1, 4, 5)).astype(np.int32),
             "masked_lm_weights": np.ones((1, 4, 5), np.float32)}
    runs = {}
    for flat in (False, True):
        model = build_masked_lm(config, dtype="float32", seed=0)
        optimizer = keras.optimizers.AdamW(1e-3)
        optimizer.build(model.trainable_variables)
        state = tuple([v.value for v in vs] for vs in
                      (model.trainable_variables, model.non_trainable_variables, optimizer.variables))
        compiled = jax.jit(make_train_step(model, optimizer, 3, 1, bf16_dots=flat)).lower(
            state, batch, np.int32(0)).compile()
        losses = []
        for s in range(3):
            state, loss_sum, _ = compiled(state, batch, np.int32(s))
            losses.append(float(loss_sum))
        runs[flat] = (losses, _transpose_fusions(compiled.as_text()))
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-5)
    assert runs[False][0][2] < runs[False][0][0]  # it trains
    assert runs[True][1] < runs[False][1], runs
