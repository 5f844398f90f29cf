"""The Keras backend's loop pieces, in this process and without a run: steps per execution, the export's bytes.

- ``make_multi_step`` (``--steps_per_execution``): a call of 4 stacked batches and a short call of 2 (an epoch's
  end) give the single steps' losses and weights (1e-5), from one compiled program; ``executions`` cuts calls
  where the TensorFlow backend does.
- A re-export of the same weights (a resume that changes nothing) leaves every file byte-equal, also with the
  tokenizer loaded back from the folder and other keras-hub models built in between (layer names, special-token
  order and the preset's save date would change them).

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("keras_hub")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)


def test_executions_are_cut_at_epoch_ends_and_the_last_step():
    from hf_tpu_ext.cadence import crossed, executions

    assert list(executions(0, 12, 5, 4)) == [(0, 4), (4, 1), (5, 4), (9, 1), (10, 2)]
    assert list(executions(3, 7, 100, 50)) == [(3, 4)]
    assert list(executions(0, 3, 10, 1)) == [(0, 1), (1, 1), (2, 1)]
    # a cadence the call length does not divide fires at the first call boundary past each multiple
    assert [s for s in (4, 8, 12, 16) if crossed(s - 4, s, 6)] == [8, 12]


def test_multi_step_equals_single_steps_with_one_program():
    import jax
    from transformers import RobertaConfig

    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.optimization import make_optimizer
    from hf_tpu_ext.backends.keras.placement import Placement
    from hf_tpu_ext.backends.keras.step import make_multi_step, make_train_step, split_micro_batches, state_to_host
    from hf_tpu_ext.backends.keras.trainer import stack_batches
    from hf_tpu_ext.data.numpy_batches import NumpyMasker, TrainBatches

    args = SimpleNamespace(lr_scheduler_type="linear", learning_rate=1e-3, num_warmup_steps=lambda total: 2,
                           max_grad_norm=1.0, optim="adamw_torch", weight_decay=0.01, adam_beta1=0.9,
                           adam_beta2=0.999, adam_epsilon=1e-8)
    config = RobertaConfig(vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=18)
    blocks = np.random.default_rng(0).integers(5, 120, size=(48, 16)).astype(np.int32)
    batches = TrainBatches(blocks, 8, 3, NumpyMasker(4, 120, [0, 1, 2, 3, 4], 3, 1))
    place = Placement(jax.devices()[:1])
    runs = {}
    for name in ("single", "multi"):
        model = build_masked_lm(config, seed=0)  # dropout 0.1: keyed by the global step, so the same in both
        optimizer, _ = make_optimizer(args, 10)
        optimizer.build(model.trainable_variables)
        state = tuple(place.put_replicated([v.value for v in vs]) for vs in
                      (model.trainable_variables, model.non_trainable_variables, optimizer.variables))
        step = make_train_step(model, optimizer, 3, 2, bf16_dots=True)  # 2 accumulated micro-batches
        micro = [split_micro_batches(batches(s), 2) for s in range(6)]
        losses = []
        if name == "single":
            fn = jax.jit(step, donate_argnums=(0,))
            for s in range(6):
                state, loss_sum, count = fn(state, place.put_batch(micro[s], axis=1), np.int32(s))
                losses.append(float(loss_sum) / float(count))
        else:
            fn = jax.jit(make_multi_step(step, 4), donate_argnums=(0,))
            for first, n in ((0, 4), (4, 2)):  # the second call is short: zeros stacked after its 2 batches
                stacked = place.put_batch(stack_batches(micro[first:first + n], 4), axis=2)
                state, sums, counts = fn(state, stacked, np.int32(first), np.int32(n))
                sums, counts = np.asarray(sums), np.asarray(counts)
                assert (sums[n:] == 0).all() and (counts[n:] == 0).all()
                losses += (sums[:n] / counts[:n]).tolist()
        runs[name] = (losses, state_to_host(state), fn._cache_size())
    np.testing.assert_allclose(runs["multi"][0], runs["single"][0], atol=1e-5, rtol=0)
    for part_multi, part_single in zip(runs["multi"][1], runs["single"][1]):
        for a, b in zip(part_multi, part_single):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert runs["multi"][2] == 1 and runs["single"][2] == 1


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def test_a_re_export_of_the_same_weights_leaves_every_file_byte_equal(tmp_path):
    import keras_hub
    from transformers import AutoTokenizer

    from hf_tpu_ext.backends.keras.export import export_masked_lm
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    words = "the quick brown fox jumps over a lazy dog while seven tiny robots sing about rivers".split()
    rng = np.random.default_rng(0)
    tokenizer = train_bpe_tokenizer([" ".join(rng.choice(words, size=10)) for _ in range(200)], vocab_size=300,
                                    model_max_length=16)
    backbone = keras_hub.models.RobertaBackbone(vocabulary_size=len(tokenizer), num_layers=1, num_heads=2,
                                                hidden_dim=16, intermediate_dim=32, dropout=0.0,
                                                max_sequence_length=16)
    model = keras_hub.models.RobertaMaskedLM(backbone=backbone)
    folder = tmp_path / "model"
    tokenizer.save_pretrained(folder)  # what the run writes first
    export_masked_lm(model, str(folder), tokenizer)
    first = _files(folder)
    assert {"model.safetensors", "config.json", "tokenizer.json", "keras_hub/config.json",
            "keras_hub/metadata.json", "keras_hub/preprocessor.json"} <= set(first)
    # a resumed process: the tokenizer loaded back from the folder, other keras-hub objects numbered before
    export_masked_lm(model, str(tmp_path / "other"), tokenizer)
    export_masked_lm(model, str(folder), AutoTokenizer.from_pretrained(str(folder)))
    again = _files(folder)
    assert sorted(again) == sorted(first)
    assert [name for name in first if again[name] != first[name]] == []
    # into a new folder (a Hub resume): the source folder's tokenizer bytes, not a re-save's
    copy = tmp_path / "copy"
    export_masked_lm(model, str(copy), AutoTokenizer.from_pretrained(str(folder)))
    assert [n for n, data in _files(copy).items() if n in first and data != first[n]
            and not n.endswith("metadata.json")] == []


def test_no_steady_rate_before_a_call_without_compilation_and_first_step_is_the_first_call():
    """The first (compiling) call gives no tokens/s or MFU in the log; ``first_step_seconds`` is its wall time
    whatever --steps_per_execution (not divided by N)."""
    from hf_tpu_ext.backends.loop import LoopMeter
    from hf_tpu_ext.backends.loop import format_entry as _format_entry

    def mfu_of(rate):
        return 0.5

    meter = LoopMeter(100)
    meter.add([6.0, 6.0, 6.0, 6.0], 4.0)  # --steps_per_execution 4: the compiling call
    entry = meter.log_entry(4, 5e-5, {"epoch": 0.01}, mfu_of)
    assert entry == {"loss": 6.0, "learning_rate": 5e-5, "epoch": 0.01, "step": 4}
    assert _format_entry(entry) == ("step 4 (epoch 0.01): loss 6.0000, lr 5e-05 | no steady rate yet (only the "
                                    "compiling first call ran)")
    assert meter.first_step == 4.0 and meter.steady_rate() == 100.0
    meter.add([5.0, 5.0, 5.0, 5.0], 0.4)
    entry = meter.log_entry(8, 5e-5, {"stream_passes": 1}, mfu_of)  # a --streaming run's place
    assert entry["tokens_per_second"] == 1000.0 and entry["mfu"] == 0.5 and "epoch" not in entry
    assert _format_entry(entry).startswith("step 8 (stream passes 1): loss 5.0000, lr 5e-05 | steady 1,000 ")
    assert _format_entry(entry).endswith("| steady 1,000 tokens/s (median training step; compilation, evaluation "
                                         "and checkpoints excluded), MFU 50.0%")
    assert _format_entry(entry, explain=False).endswith("lr 5e-05 | steady 1,000 tokens/s, MFU 50.0%")  # later lines
    assert meter.first_step == 4.0 and meter.steady_rate() == 1000.0
