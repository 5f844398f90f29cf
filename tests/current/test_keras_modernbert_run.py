"""``hf-tpu train --model_name_or_path <a transformers ModernBertForMaskedLM folder>`` on the Keras backend.

A tiny random ModernBERT (transformers 5: hidden 32, 3 layers, 2 heads, ``local_attention`` 8 under
``--max_seq_length`` 32, so the window matters) with a byte-level BPE tokenizer continues pre-training for 20 steps;
the export is a ``ModernBertForMaskedLM`` folder that ``AutoModelForMaskedLM`` loads with the trained weights (the
Keras model read back from it gives transformers' logits, max abs difference <= 1e-4, on a right-padded batch) and
that ``pipeline("fill-mask")`` answers from. Issue 42's guarantees on the same run: its ``--eval_on_start`` loss is
transformers' (tests/mlm_reference.py), it continues from a pushed commit (``--model_revision``), and short reruns
check ``--steps_per_execution 2``, ``--bf16 true`` and ``--streaming``, and a run interrupted by kill -9 and by
SIGTERM resumes to the uninterrupted run's weights and log history.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_keras_modernbert_run.py``.
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

TOLERANCE = 1e-4

from mlm_reference import (  # noqa: E402
    check_bf16_trains, check_resume_after_kill_and_sigterm, check_steps_per_execution_2, check_streaming_exports,
    transformers_eval_loss)


@pytest.fixture(scope="module")
def continued(tmp_path_factory):
    """(the starting folder, the run's output folder, the run's results, its command line; ``--eval_on_start``: a
    first evaluation of the starting weights)."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer
    from hf_tpu_ext.run import train

    root = tmp_path_factory.mktemp("modernbert")
    tokenizer = train_bpe_tokenizer(default_corpus_texts(), 300, 32)
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
        local_attention=8, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id, cls_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
        sep_token_id=tokenizer.sep_token_id)
    start = root / "start"
    transformers.ModernBertForMaskedLM(config).save_pretrained(start)
    tokenizer.save_pretrained(start)
    out = root / "run"
    argv = ["--backend", "keras", "--model_name_or_path", str(start), "--output_dir", str(out),
            "--max_seq_length", "32", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
            "--max_train_samples", "256", "--max_eval_samples", "32", "--max_steps", "20", "--logging_steps", "1",
            "--learning_rate", "3e-3", "--seed", "7", "--disable_tqdm", "true", "--eval_on_start", "true"]
    results = train(*parse_args(argv))
    return start, out, results, argv


def test_export_is_a_modernbert_with_the_trained_weights(continued):
    from safetensors.numpy import load_file

    start, out, _, _ = continued
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "modernbert" and written["architectures"] == ["ModernBertForMaskedLM"]
    before, after = load_file(str(start / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(after) == sorted(before) and "decoder.weight" not in after  # the tie, as save_pretrained writes it
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 20
    assert not np.allclose(after["model.layers.1.attn.Wqkv.weight"], before["model.layers.1.attn.Wqkv.weight"])
    model = transformers.AutoModelForMaskedLM.from_pretrained(out)
    assert type(model).__name__ == "ModernBertForMaskedLM"
    np.testing.assert_array_equal(model.model.layers[2].mlp.Wi.weight.detach().numpy(), after["model.layers.2.mlp.Wi.weight"])


def test_transformers_logits_equal_the_keras_model_of_the_export(continued):
    from hf_tpu_ext.backends.keras import hf_convert

    _, out, _, _ = continued
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    texts = ["The quick brown fox jumps over the lazy dog and keeps running far away.", "A short one."]
    encoded = tokenizer(texts, padding="max_length", max_length=32, truncation=True, return_tensors="np")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    assert mask[1].sum() < 32 and mask[0].sum() > 8  # padding, and a sequence longer than the window
    reference = transformers.AutoModelForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    keras_model, _ = hf_convert.load_masked_lm(str(out))
    real = int(mask[1].sum())
    positions = np.array([[0, 5, 17, int(mask[0].sum()) - 1], [0, 1, real // 2, real - 1]], dtype=np.int32)
    got = np.asarray(keras_model({"token_ids": ids.astype("int32"), "padding_mask": mask.astype("int32"),
                                  "mask_positions": positions}))
    np.testing.assert_allclose(got, np.take_along_axis(expected, positions[..., None], axis=1), rtol=0,
                               atol=TOLERANCE)


def test_fill_mask_pipeline_answers(continued):
    _, out, _, _ = continued
    fill = transformers.pipeline("fill-mask", model=str(out), top_k=3)
    tokenizer = fill.tokenizer
    answers = fill(f"The quick brown {tokenizer.mask_token} jumps.")
    assert len(answers) == 3 and all(0.0 <= a["score"] <= 1.0 for a in answers)
    assert answers[0]["score"] >= answers[1]["score"] >= answers[2]["score"]


def test_flops_count_the_local_window(continued):
    """trainer_state.json's total_flos and the MFU figure use ModernBERT's own count (local layers attend to their
    window, not the whole sequence), not the encoder formula."""
    from hf_tpu_ext import model_types
    from hf_tpu_ext.model_types.record import encoder_flops_per_token as encoder_formula

    _, out, _, _ = continued
    config = transformers.AutoConfig.from_pretrained(out)
    state = json.loads((out / "trainer_state.json").read_text())
    summary = json.loads((out / "training_summary.json").read_text())
    fraction = summary["hyperparameters"]["max_predictions_per_seq"] / 32
    own = model_types.flops_per_token(config, 32, fraction)
    assert own != pytest.approx(encoder_formula(config, 32, fraction))
    assert state["num_input_tokens_seen"] == 20 * 8 * 32
    assert state["total_flos"] == pytest.approx(20 * 8 * 32 * own)


def test_first_evaluation_is_transformers_masked_lm_loss(continued):
    """``--eval_on_start``: the step-0 ``eval_loss`` (the Keras model of the starting folder, before any step)
    equals transformers' own (eager attention, local window included) on the same masked evaluation batches
    (float32 both; relative 1e-4)."""
    start, out, _, argv = continued
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    first = [e for e in history if "eval_loss" in e][0]
    assert first["step"] == 0
    assert first["eval_loss"] == pytest.approx(transformers_eval_loss(argv, start), rel=1e-4)


def test_continues_a_pushed_modernbert_from_its_commit(continued, loopback_hub, tmp_path):
    """The export pushed to the (loopback) Hub as ``alice/x``, then the starting weights committed on top: a run
    with ``--model_name_or_path alice/x --model_revision <first commit>`` starts from the trained export's weights
    (its step-0 ``eval_loss`` is transformers' loss of that folder, relative 1e-4; not the starting one's), and its
    card names ``base_model: alice/x``."""
    from huggingface_hub import HfApi

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    start, out, _, first_argv = continued
    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/x")
    model_files = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json"]
    sha = api.upload_folder(repo_id="alice/x", folder_path=str(out), allow_patterns=model_files).oid
    api.upload_file(repo_id="alice/x", path_or_fileobj=str(start / "model.safetensors"),
                    path_in_repo="model.safetensors")  # main now holds other weights: the revision must be used
    argv = [*first_argv[:first_argv.index("--model_name_or_path")], "--model_name_or_path", "alice/x",
            "--model_revision", sha, "--output_dir", str(tmp_path / "again"), "--max_seq_length", "32",
            "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--max_train_samples", "256",
            "--max_eval_samples", "32", "--max_steps", "2", "--logging_steps", "1", "--learning_rate", "3e-3",
            "--seed", "7", "--disable_tqdm", "true", "--eval_on_start", "true"]
    train(*parse_args(argv))
    history = json.loads((tmp_path / "again" / "trainer_state.json").read_text())["log_history"]
    first = [e for e in history if "eval_loss" in e][0]
    assert first["step"] == 0
    assert first["eval_loss"] == pytest.approx(transformers_eval_loss(first_argv, out), rel=1e-4)
    untrained = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "eval_loss" in e]
    assert first["eval_loss"] != pytest.approx(untrained[0]["eval_loss"], rel=1e-2)
    card = (tmp_path / "again" / "README.md").read_text()
    assert "base_model: alice/x" in card
    assert json.loads((tmp_path / "again" / "training_summary.json").read_text())["base_model"] == "alice/x"


def test_pushed_card_names_the_architecture(continued, loopback_hub, capsys):
    """``hf-tpu push`` of the run's folder: the card on the Hub names ``ModernBertForMaskedLM``."""
    from hf_tpu_ext.cli import main

    _, out, _, _ = continued
    assert main(["push", str(out), "--hub_model_id", "alice/modernbert-run", "--hub_token", loopback_hub.token]) == 0
    capsys.readouterr()
    (last,) = loopback_hub.server.commits("alice/modernbert-run")[-1:]
    card = last["files"]["README.md"].decode()
    assert "ModernBertForMaskedLM" in card and "RobertaForMaskedLM" not in card


#: --steps_per_execution 2 against 1: the same fp32 steps, compiled as one scan of 2 instead of one step; the
#: measured gap is float rounding (relative, per logged step loss)
SPE_TOLERANCE = 1e-4


def test_steps_per_execution_2_gives_the_same_step_losses(continued, tmp_path):
    """``--steps_per_execution 2`` (logs at call boundaries: steps 2, 4, ..., each the mean of its call's 2 steps)
    equals the mean of the same 2 steps of the one-step-per-call run, logged every step."""
    _, out, _, argv = continued
    check_steps_per_execution_2(argv, out, tmp_path / "spe2", SPE_TOLERANCE)


def test_bf16_trains(continued, tmp_path):
    """``--bf16 true``: finite losses, the summary's precision ``bf16 mixed``."""
    _, out, _, argv = continued
    check_bf16_trains(argv, tmp_path / "bf16")


def test_streaming_trains_and_exports(continued, tmp_path):
    """``--streaming`` (a text file of the default corpus, read as an IterableDataset) trains 10 steps and exports
    the class."""
    from hf_tpu_ext.data.corpus import default_corpus_texts

    _, out, _, argv = continued
    (tmp_path / "train.txt").write_text("\n".join(default_corpus_texts()), encoding="utf-8")
    cut = argv.index("--max_train_samples")  # a stream is read for --max_steps batches instead
    check_streaming_exports(argv[:cut] + argv[cut + 2:], tmp_path / "stream", "ModernBertForMaskedLM",
                            "--train_file", tmp_path / "train.txt")


def test_resume_after_kill_9_and_sigterm_ends_as_the_uninterrupted_run(continued, tmp_path):
    """kill -9 after checkpoint-5, resume, SIGTERM after step 13 (saved, exit 143), resume: the weights and the
    log history are the uninterrupted run's."""
    _, out, _, argv = continued
    check_resume_after_kill_and_sigterm(argv, out, tmp_path / "interrupted")
