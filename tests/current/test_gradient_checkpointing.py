"""``--gradient_checkpointing`` on the Keras backend (``architectures/remat.py``): each encoder layer under
``jax.checkpoint`` while the step traces.

* The backend's own step (counter-based dropout on hidden states and attention probabilities, AdamW) trains the
  same with and without: losses of 3 steps within 1e-6 (relative), weights within 1e-4 (1% of the learning rate),
  for the shared post-LN encoder (RoBERTa's family), ModernBERT and EuroBERT (tiny configs, float32), and with 2
  accumulated micro-batches.
* The compiled step keeps fewer bytes: the residuals JAX saves for the backward pass shrink, and XLA:CPU's
  temporaries (``memory_analysis().temp_size_in_bytes``, compiled in a fresh process with the memory-minimizing
  scheduler, as ``benchmarks/compiled_memory.py`` compiles) are smaller.
* The flag: parsed as transformers' bool, handed to torch_xla's Trainer, refused in one line by TensorFlow.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("transformers")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
SEQ, ROWS, PREDICTIONS = 16, 4, 4
TINY = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
FAMILIES = {
    "roberta": dict(max_position_embeddings=SEQ + 2, pad_token_id=1, hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1),
    "modernbert": dict(max_position_embeddings=64, local_attention=4, pad_token_id=0, bos_token_id=1,
                       eos_token_id=2, cls_token_id=1, sep_token_id=2, attention_dropout=0.1, mlp_dropout=0.1,
                       embedding_dropout=0.1),
    "eurobert": dict(max_position_embeddings=64, num_key_value_heads=1, pad_token_id=0, bos_token_id=1,
                     eos_token_id=2, attention_dropout=0.1),
}


def _config(model_type):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **TINY, **FAMILIES[model_type])


def _batch(accumulation=1, seed=0):
    rng = np.random.default_rng(seed)
    from hf_tpu_ext.backends.keras.step import split_micro_batches

    mask = np.ones((ROWS, SEQ), np.int32)
    mask[1, SEQ - 5:] = 0  # one padded row
    positions = np.sort(np.argsort(rng.random((ROWS, SEQ - 5)), axis=1)[:, :PREDICTIONS], axis=1)
    return split_micro_batches({
        "input_ids": rng.integers(5, 100, (ROWS, SEQ)).astype(np.int32), "attention_mask": mask,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": rng.integers(5, 100, (ROWS, PREDICTIONS)).astype(np.int32),
        "masked_lm_weights": np.ones((ROWS, PREDICTIONS), np.float32)}, accumulation)


def _losses(model_type, gradient_checkpointing, accumulation=1, steps=3):
    import keras

    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.step import make_train_step

    model = build_masked_lm(_config(model_type), seed=7)
    optimizer = keras.optimizers.AdamW(1e-2, global_clipnorm=1.0)
    optimizer.build(model.trainable_variables)
    state = tuple([v.value for v in vs] for vs in
                  (model.trainable_variables, model.non_trainable_variables, optimizer.variables))
    step = jax.jit(make_train_step(model, optimizer, 3, accumulation, bf16_dots=False,
                                   gradient_checkpointing=gradient_checkpointing))
    batch, losses = _batch(accumulation), []
    for s in range(steps):
        state, loss_sum, count = step(state, batch, np.int32(s))
        losses.append(float(loss_sum) / float(count))
    return losses, [np.asarray(v) for v in state[0]]


@pytest.mark.parametrize("model_type,accumulation", [("roberta", 1), ("roberta", 2), ("modernbert", 1),
                                                     ("eurobert", 1)])
def test_losses_and_weights_equal_with_and_without(model_type, accumulation):
    plain, plain_weights = _losses(model_type, False, accumulation)
    remat, remat_weights = _losses(model_type, True, accumulation)
    assert len(plain) == 3 and plain[0] > 3.0  # ~ln(100): an untrained model's loss, dropout on
    np.testing.assert_allclose(remat, plain, rtol=1e-6)
    for a, b in zip(remat_weights, plain_weights):
        # recomputed in other fusions: gradients round differently, and AdamW's normalized update turns a near-zero
        # gradient's rounding into up to ~1% of the learning rate (1e-2): measured 3e-5 on EuroBERT
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_the_layers_are_checkpointed_and_save_fewer_residuals():
    """The step's jaxpr has one ``checkpoint`` per encoder layer; JAX's saved residuals of the forward shrink."""
    import jax.numpy as jnp
    import keras
    from jax._src.ad_checkpoint import saved_residuals

    from hf_tpu_ext.backends.keras.architectures.remat import layer_checkpointing
    from hf_tpu_ext.backends.keras.dropout import counter_based_dropout
    from hf_tpu_ext.backends.keras.model import build_masked_lm

    model = build_masked_lm(_config("roberta"), seed=7)
    batch = {k: v[0] for k, v in _batch().items()}
    inputs = {"token_ids": batch["input_ids"], "padding_mask": batch["attention_mask"],
              "mask_positions": batch["masked_lm_positions"]}
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(trainable, policy):
        with counter_based_dropout(jnp.uint32(3)), layer_checkpointing(policy):
            logits, _ = model.stateless_call(trainable, non_trainable, inputs, training=True)
        return jnp.sum(logits)

    trainable = [v.value for v in model.trainable_variables]
    jaxpr = str(jax.make_jaxpr(lambda t: jax.grad(loss)(t, "dots_with_no_batch_dims_saveable"))(trainable))
    assert jaxpr.count("checkpoint[") + jaxpr.count("remat") >= TINY["num_hidden_layers"]

    def saved(policy):
        return sum(a.size * a.dtype.itemsize for a, _ in saved_residuals(lambda t: loss(t, policy), trainable))

    plain, kept_dots, nothing = saved(None), saved("dots_with_no_batch_dims_saveable"), saved("nothing_saveable")
    assert nothing < kept_dots < plain, (nothing, kept_dots, plain)
    assert keras.backend.backend() == "jax"


_COMPILE = """
import json, sys
from benchmarks.compiled_memory import compiled_memory, model_config, set_cpu_devices
set_cpu_devices(1)
rows = {}
for model_type, fields in json.loads(sys.argv[1]).items():
    config = model_config(model_type, **fields)
    rows[model_type] = [compiled_memory(config, mode, per_device_batch=8, seq=256)["temp_bytes"]
                        for mode in ("replicated", "replicated+gc")]
print(json.dumps(rows))
"""


def test_compiled_temporaries_smaller_with_checkpointing():
    """XLA:CPU temporaries of the bf16 train step, 6 layers x 64, 8 x 256 tokens, dropout on: smaller with remat
    for the shared encoder and ModernBERT (measured 165 -> 110 MB and 116 -> 84 MB). A fresh process: the memory
    scheduler's flag (benchmarks/compiled_memory.py) is read once, when XLA starts."""
    fields = dict(TINY, hidden_size=64, num_hidden_layers=6, num_attention_heads=4, intermediate_size=256,
                  max_position_embeddings=256)
    families = {"bert": fields, "modernbert": dict(fields, local_attention=32, pad_token_id=0, bos_token_id=1,
                                                   eos_token_id=2, cls_token_id=1, sep_token_id=2)}
    env = dict(os.environ, PYTHONPATH=str(REPO), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(families)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    for model_type, (plain, remat) in rows.items():
        assert remat < 0.85 * plain, (model_type, plain, remat)


def test_flag_parsed_handed_to_torch_xla_and_refused_by_tensorflow():
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.errors import ArgumentError

    _, _, args = parse_args(["--backend", "keras", "--output_dir", "out", "--gradient_checkpointing"])
    assert args.gradient_checkpointing is True
    _, _, args = parse_args(["--backend", "keras", "--output_dir", "out"])
    assert args.gradient_checkpointing is False
    with pytest.raises(ArgumentError) as refused:
        parse_args(["--backend", "tensorflow", "--output_dir", "out", "--gradient_checkpointing", "true"])
    assert str(refused.value) == ("--gradient_checkpointing is not available with --backend tensorflow "
                                  "(transformers' TF models have none); use --backend keras or torch_xla, or drop it.")
    from hf_tpu_ext.backends.torch_xla import trainer

    assert "gradient_checkpointing" in trainer._SAME_NAME_FIELDS
