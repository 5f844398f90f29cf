"""ModernBERT at long sequences through the attention kernels that skip what the window masks and hold no
``L x L`` (``architectures/attention.py``): logits equal transformers' (eager, float32, <= 1e-4) at seq 64 / 200 /
1,000 with ``local_attention`` 16 / 64 on right-padded batches whose lengths are not a multiple of the block (local
layers: block-local; global: dense below 512, chunked from 512), and a tiny ModernBERT trains at seq 8,192, batch 1,
on CPU (the from-scratch cap of 4,096 is gone).

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_keras_modernbert_long.py``.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
jax = pytest.importorskip("jax")

import keras  # noqa: E402

from hf_tpu_ext.backends.keras.architectures import attention, get_architecture  # noqa: E402
from modernbert_support import keras_logits, random_torch_model, tiny_config, torch_logits, torch_state  # noqa: E402

TOLERANCE = 1e-4
ARCH = get_architecture("modernbert")


def _batch(length, seed=2):
    """3 rows of ``length``: full, right-padded to ``length - length // 3 - 1`` and to 5 real tokens; 4 masked
    positions per row at real tokens (both ends included)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 100, size=(3, length))
    mask = np.ones((3, length), dtype=np.int64)
    reals = (length, length - length // 3 - 1, 5)
    for row, real in enumerate(reals):
        ids[row, real:], mask[row, real:] = 0, 0
    positions = np.array([[0, real // 2, real - 2, real - 1] for real in reals])
    return ids, mask, positions


@pytest.mark.parametrize("length,local_attention", [(64, 16), (200, 64), (1000, 16), (1000, 64)])
def test_logits_equal_transformers_at_long_sequences(length, local_attention, caplog):
    config = tiny_config(local_attention=local_attention, max_position_embeddings=1024)
    reference = random_torch_model(config)
    model = ARCH.build(config, "float32")
    ARCH.assign(model, torch_state(reference), config)
    batch = _batch(length)
    caplog.set_level("INFO", logger=attention.__name__)
    attention._LOGGED.clear()
    np.testing.assert_allclose(keras_logits(model, batch), torch_logits(reference, batch), rtol=0, atol=TOLERANCE)
    global_path = "chunked" if length >= attention.CHUNKED_MIN_LENGTH else "dense"
    assert [r.getMessage().split(": ", 1)[1].split(" (")[0] for r in caplog.records
            if r.getMessage().startswith(f"Attention at seq {length}")] == [f"global layers: {global_path}"]
    assert f"local layers: local (the window (+-{local_attention // 2})" in caplog.text


def test_trains_at_seq_8192_batch_1_on_cpu():
    """The backend's own jitted step at 8,192 tokens (tiny width, local layers block-local, global chunked): two
    AdamW steps, finite and lower loss."""
    from hf_tpu_ext.backends.keras.step import make_train_step, split_micro_batches

    length = 8192
    config = tiny_config(max_position_embeddings=length, local_attention=128, num_hidden_layers=2,
                         global_attn_every_n_layers=2)
    model = ARCH.build(config, "float32")
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 100, size=(1, length)).astype(np.int32)
    positions = np.sort(rng.choice(length, size=(1, 64), replace=False), axis=1).astype(np.int32)
    batch = split_micro_batches({
        "input_ids": ids, "attention_mask": np.ones_like(ids),
        "masked_lm_positions": positions, "masked_lm_ids": np.take_along_axis(ids, positions, axis=1),
        "masked_lm_weights": np.ones((1, 64), np.float32)}, 1)
    optimizer = keras.optimizers.AdamW(1e-2)
    optimizer.build(model.trainable_variables)
    state = tuple([v.value for v in vs] for vs in
                  (model.trainable_variables, model.non_trainable_variables, optimizer.variables))
    step = jax.jit(make_train_step(model, optimizer, seed=1, accumulation=1, bf16_dots=False))
    losses = []
    for s in range(2):
        state, loss_sum, count = step(state, batch, np.int32(s))
        assert float(count) == 64.0
        losses.append(float(loss_sum) / float(count))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
