"""``hf-tpu train --model_name_or_path <a EuroBertForMaskedLM folder>`` on the Keras backend.

A tiny random EuroBERT (transformers 5: hidden 32, 2 layers, 2 query heads over 1 key/value head, its untied
``lm_head``) with a Llama-3-style tokenizer (``train_llama_bpe_tokenizer``, EuroBERT's kind) continues pre-training
for 20 steps: the loss falls, the export is a ``EuroBertForMaskedLM`` folder (``lm_head.weight`` of its own) that
``AutoModelForMaskedLM`` loads with the trained weights and transformers' logits equal the Keras model's read back
from it (<= 1e-4, a right-padded batch), ``pipeline("fill-mask")`` answers ``<|mask|>``; kill -9 and SIGTERM
resume to the uninterrupted run; ``--bf16 auto`` trains.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_keras_eurobert_run.py``.
"""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)
if not hasattr(transformers, "EuroBertForMaskedLM"):
    pytest.skip("transformers has no EuroBERT (5.x has it)", allow_module_level=True)

from mlm_reference import check_resume_after_kill_and_sigterm, rerun, step_losses  # noqa: E402

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def continued(tmp_path_factory):
    """(the starting folder, the run's output folder, its command line)."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import train_llama_bpe_tokenizer
    from hf_tpu_ext.run import train

    root = tmp_path_factory.mktemp("eurobert")
    tokenizer = train_llama_bpe_tokenizer(default_corpus_texts(), 300, 32)
    torch.manual_seed(0)
    config = transformers.EuroBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        mask_token_id=tokenizer.mask_token_id)
    start = root / "start"
    transformers.EuroBertForMaskedLM(config).save_pretrained(start)
    tokenizer.save_pretrained(start)
    out = root / "run"
    argv = ["--backend", "keras", "--model_name_or_path", str(start), "--output_dir", str(out),
            "--max_seq_length", "32", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
            "--max_train_samples", "256", "--max_eval_samples", "32", "--max_steps", "20", "--logging_steps", "1",
            "--learning_rate", "3e-3", "--seed", "7", "--disable_tqdm", "true"]
    train(*parse_args(argv))
    return start, out, argv


def test_twenty_steps_learn_and_the_export_is_a_eurobert(continued):
    from safetensors.numpy import load_file

    start, out, _ = continued
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == ["EuroBertForMaskedLM"] and written["tie_word_embeddings"] is False
    before, after = load_file(str(start / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(after) == sorted(before) and "lm_head.weight" in after  # untied: its own weight
    assert not np.allclose(after["lm_head.weight"], before["lm_head.weight"])
    losses = step_losses(json.loads((out / "trainer_state.json").read_text())["log_history"])
    assert sorted(losses) == list(range(1, 21))
    assert np.mean([losses[s] for s in range(16, 21)]) < np.mean([losses[s] for s in range(1, 6)]) - 0.3


def test_transformers_logits_equal_the_keras_model_of_the_export(continued):
    from hf_tpu_ext.backends.keras import hf_convert

    _, out, _ = continued
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    encoded = tokenizer(["The quick brown fox jumps over the lazy dog.", "A short one."], padding="max_length",
                        max_length=32, truncation=True, return_tensors="np")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    assert 0 < mask[1].sum() < 32
    reference = transformers.AutoModelForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(reference).__name__ == "EuroBertForMaskedLM"
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    keras_model, _ = hf_convert.load_masked_lm(str(out))
    real = int(mask[1].sum())
    positions = np.array([[0, 3, 7, int(mask[0].sum()) - 1], [0, 1, real // 2, real - 1]], dtype=np.int32)
    got = np.asarray(keras_model({"token_ids": ids.astype("int32"), "padding_mask": mask.astype("int32"),
                                  "mask_positions": positions}))
    np.testing.assert_allclose(got, np.take_along_axis(expected, positions[..., None], axis=1), rtol=0,
                               atol=TOLERANCE)


def test_fill_mask_pipeline_answers_its_mask_token(continued):
    _, out, _ = continued
    fill = transformers.pipeline("fill-mask", model=str(out), top_k=3)
    assert fill.tokenizer.mask_token == "<|mask|>"
    answers = fill(f"The quick brown {fill.tokenizer.mask_token} jumps.")
    assert len(answers) == 3 and answers[0]["score"] >= answers[1]["score"] >= answers[2]["score"]
    assert all("<|mask|>" not in a["sequence"] for a in answers)


def test_bf16_auto_trains(continued, tmp_path):
    """``--bf16 auto``: finite losses; the precision the summary records is the one the CPU's flags select."""
    from hf_tpu_ext.precision import xla_bf16_dots_faster

    _, _, argv = continued
    history, summary = rerun(argv, tmp_path / "auto", "--bf16", "auto", "--max_steps", "6")
    losses = step_losses(history)
    assert sorted(losses) == list(range(1, 7)) and np.isfinite(list(losses.values())).all()
    assert summary["precision"] == ("bf16 mixed" if xla_bf16_dots_faster("cpu") else "float32")


def test_resume_after_kill_9_and_sigterm_ends_as_the_uninterrupted_run(continued, tmp_path):
    _, out, argv = continued
    check_resume_after_kill_and_sigterm(argv, out, tmp_path / "interrupted")
