"""The Keras backend's bf16 dots with float32 results (hf_tpu_ext/backends/keras/bf16_dot.py): the gradient specs,
the values against float32, what the compiled HLO multiplies in, float32 untouched.

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


def _dot_operand_types(hlo_text):
    """``[(lhs dtype, rhs dtype, result dtype)]`` of every ``dot`` in an optimized HLO module's text."""
    types = {}
    for line in hlo_text.splitlines():
        header = re.match(r"\s*%\S+ \((.*)\) -> ", line)
        if header:
            for param in header.group(1).split(", "):
                name, _, ty = param.partition(": ")
                types[name.strip()] = ty.split("[")[0]
        defined = re.match(r"\s*(?:ROOT )?%(\S+) = (\w+)\[", line)
        if defined:
            types[defined.group(1)] = defined.group(2)
    dots = re.findall(r"= (\w+)\[[^\]]*\]\S* dot\(%([^,\s]+), %([^,\s)]+)\)", hlo_text)
    return [(types.get(a), types.get(b), out) for out, a, b in dots]


def test_grad_specs_of_dense_attention_and_unsupported_einsums():
    from hf_tpu_ext.backends.keras.bf16_dot import _grad_specs, _matmul_spec

    assert _grad_specs("abc,cde->abde") == ("abde,cde->abc", "abde,abc->cde")  # EinsumDense (q/k/v projection)
    assert _grad_specs("aecd,abcd->acbe") == ("acbe,abcd->aecd", "acbe,aecd->abcd")  # attention scores
    assert _grad_specs("ij,jk") is None  # implicit output
    assert _grad_specs("ii,ij->j") is None  # a trace
    assert _grad_specs("ij,jk->k") is None  # sums i over the left operand alone
    assert _grad_specs("...ij,jk->...ik") is None
    assert _matmul_spec(3, 2) == "ayz,zw->ayw"
    assert _matmul_spec(4, 4) == "abyz,abzw->abyw"
    assert _matmul_spec(3, 4) is None and _matmul_spec(1, 2) is None


def test_values_and_gradients_match_float32_to_bf16_rounding():
    import jax
    import jax.numpy as jnp

    from hf_tpu_ext.backends.keras.bf16_dot import bf16_einsum, bf16_matmul

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    for spec, sa, sb in [("abc,cde->abde", (2, 5, 8), (8, 3, 4)), ("aecd,abcd->acbe", (2, 6, 3, 4), (2, 5, 3, 4))]:
        a = jax.random.normal(keys[0], sa).astype(jnp.bfloat16)
        b = jax.random.normal(keys[1], sb).astype(jnp.bfloat16)
        out = bf16_einsum(spec, a, b)
        assert out.dtype == jnp.bfloat16
        want = jnp.einsum(spec, a.astype(jnp.float32), b.astype(jnp.float32))
        assert float(jnp.max(jnp.abs(out.astype(jnp.float32) - want)) / jnp.max(jnp.abs(want))) < 8e-3

        def loss(a, b, fn):
            return jnp.sum(fn(a, b).astype(jnp.float32) ** 2)

        got = jax.grad(loss, (0, 1))(a, b, lambda x, y: bf16_einsum(spec, x, y))
        ref = jax.grad(loss, (0, 1))(a.astype(jnp.float32), b.astype(jnp.float32),
                                     lambda x, y: jnp.einsum(spec, x, y))
        for g, r in zip(got, ref):
            assert g.dtype == jnp.bfloat16
            assert float(jnp.max(jnp.abs(g.astype(jnp.float32) - r)) / jnp.max(jnp.abs(r))) < 2e-2
    a = jax.random.normal(keys[2], (2, 5, 8)).astype(jnp.bfloat16)
    w = jax.random.normal(keys[3], (8, 3)).astype(jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(bf16_matmul(a, w), np.float32),
                               np.asarray(a, np.float32) @ np.asarray(w, np.float32), rtol=1e-2, atol=2e-2)


def test_a_dense_layers_step_multiplies_bf16_inside_the_block_only():
    import jax
    import jax.numpy as jnp
    import keras

    from hf_tpu_ext.backends.keras.bf16_dot import native_bf16_dots

    # a model, as in the step: its layers' __call__ casts inputs and variables to bf16 (a bare layer's
    # stateless_call does not)
    model = keras.Sequential([keras.Input((32, 128)), keras.layers.Dense(256, dtype="mixed_bfloat16")])
    x = jnp.ones((2, 32, 128), jnp.bfloat16)  # a bf16 activation (a float32 input's cast XLA may fold away)

    def grads(enabled):
        def loss(trainable, x):
            with native_bf16_dots(enabled):
                y, _ = model.stateless_call(trainable, [], x)
            return jnp.sum(y.astype(jnp.float32) ** 2)

        trainable = [v.value for v in model.trainable_variables]
        return jax.jit(jax.grad(loss, (0, 1))).lower(trainable, x).compile().as_text()

    # forward and both backward dots with bf16 operands and a float32 result: what XLA:CPU runs natively
    assert sorted(_dot_operand_types(grads(True))) == [("bf16", "bf16", "f32")] * 3
    # Keras' own bf16 x bf16 -> bf16 dot: XLA:CPU converts the operands to float32 first
    assert all(t[:2] == ("f32", "f32") for t in _dot_operand_types(grads(False)))
    with native_bf16_dots():  # float32 operands: Keras' own matmul, bit for bit
        a = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
        assert keras.ops.matmul(a, a.T).dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(keras.ops.matmul(a, a.T)), np.asarray(a) @ np.asarray(a).T)


def test_a_bf16_roberta_step_runs_with_native_dots_and_trains_as_without():
    """The whole training step (tiny RoBERTa, mixed_bfloat16) with and without the bf16 dots: it executes (no
    batched bf16 -> float32 dot reaches XLA:CPU's DotThunk), its projections multiply bf16, the losses agree."""
    import jax
    import keras
    from transformers import RobertaConfig

    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.step import make_train_step

    config = RobertaConfig(vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=34)
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(5, 120, (1, 4, 32)).astype(np.int32),
             "attention_mask": np.ones((1, 4, 32), np.int32),
             "masked_lm_positions": np.tile(np.arange(1, 6, dtype=np.int32), (1, 4, 1)),
             "masked_lm_ids": rng.integers(5, 120, (1, 4, 5)).astype(np.int32),
             "masked_lm_weights": np.ones((1, 4, 5), np.float32)}
    runs = {}
    for dots in (False, True):
        model = build_masked_lm(config, dtype="mixed_bfloat16", seed=0)
        optimizer = keras.optimizers.AdamW(1e-3)
        optimizer.build(model.trainable_variables)
        state = tuple([v.value for v in vs] for vs in
                      (model.trainable_variables, model.non_trainable_variables, optimizer.variables))
        step = jax.jit(make_train_step(model, optimizer, 3, 1, bf16_dots=dots))
        compiled = step.lower(state, batch, np.int32(0)).compile()  # one compilation: inspected, then run
        types = _dot_operand_types(compiled.as_text())
        losses = []
        for s in range(3):
            state, loss_sum, count = compiled(state, batch, np.int32(s))
            losses.append(float(loss_sum) / float(count))
        runs[dots] = (types, losses)
    keras_types, native_types = runs[False][0], runs[True][0]
    assert all(t[:2] == ("f32", "f32") for t in keras_types)
    # q/k/v/output projections, both feed-forward dots and the head's two, forward and backward
    assert native_types.count(("bf16", "bf16", "f32")) >= 20
    np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=2e-2)
    assert runs[True][1][2] < runs[True][1][0]  # it trains
