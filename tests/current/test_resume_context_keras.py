"""Context extension by resume (issue 51 item 4): a resume with a longer ``--max_seq_length`` is a new phase.

BERT's recipe (128 -> 512) at tiny lengths (32 -> 64) and ModernBERT's (256 -> 1,024, a new global RoPE theta) on
tiny widths: the step, the optimizer state and the data position (in tokens) go on; ``tokens_seen`` sums both
phases; the learning-rate schedule is the arguments'; ``training_summary.json`` and the card list each phase; a
kill -9 during phase 2 resumes to the uninterrupted phase 2's losses. The position table's limit (BERT's 512)
stays: 512 accepted, 513 refused naming it.
"""

import json
import logging
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

BATCH, SHORT, LONG, LR = 8, 32, 64, 1e-3


def _args(output_dir, *extra, steps=6, model_type="bert", batch=BATCH):
    return ["--backend", "keras", "--model_type", model_type, "--output_dir", str(output_dir),
            "--hidden_size", "32", "--num_hidden_layers", "1", "--num_attention_heads", "2",
            "--intermediate_size", "64", "--vocab_size", "300", "--max_train_samples", "128",
            "--per_device_train_batch_size", str(batch),
            "--do_eval", "false", "--logging_steps", "1", "--learning_rate", str(LR), "--lr_scheduler_type", "linear",
            "--max_steps", str(steps), "--save_steps", "2", "--seed", "7", "--disable_tqdm", "true", *extra]


def _train(args):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args(list(map(str, args))))


@pytest.fixture(scope="session")
def bert_phase1(tmp_path_factory):
    """4 steps of a tiny BERT at 32 tokens, global batch 8 (checkpoints at 2 and 4)."""
    out = tmp_path_factory.mktemp("context") / "run"
    _train(_args(out, "--max_seq_length", SHORT, steps=4))
    return out


def _copy(src, tmp_path, name="run"):
    shutil.copytree(src, tmp_path / name)
    return tmp_path / name


def _read(out, name):
    return json.loads((out / name).read_text())


def test_a_longer_max_seq_length_is_a_new_phase(bert_phase1, tmp_path, hf_log):
    out = _copy(bert_phase1, tmp_path)
    with hf_log.at_level(logging.INFO, logger="hf_tpu_ext"):
        _train(_args(out, "--resume_from_checkpoint", "true", "--max_seq_length", LONG))
    first_tokens = 4 * BATCH * SHORT  # 1,024: 2 steps of 8 x 64 tokens, the data position at the new length
    assert ("--max_seq_length 64 (the checkpoint trained at 32): a new phase from step 4; the step, the optimizer "
            "state and the data position go on (the data re-blocked at 64 tokens, read on from token 1,024, block 16 "
            "of the 64-token blocks), recorded in training_summary.json (phases) and the model card."
            ) in [r.getMessage() for r in hf_log.records]
    phases = [{"start_step": 0, "end_step": 4, "max_seq_length": SHORT, "mlm_probability": 0.15,
               "tokens": first_tokens},
              {"start_step": 4, "end_step": 6, "max_seq_length": LONG, "mlm_probability": 0.15,
               "tokens": 2 * BATCH * LONG}]
    summary, state = _read(out, "training_summary.json"), _read(out, "trainer_state.json")
    assert summary["phases"] == state["phases"] == phases
    assert summary["tokens_seen"] == state["num_input_tokens_seen"] == 1024 + 1024 == _read(
        out, "all_results.json")["tokens_seen"]
    assert (summary["global_step"], summary["max_seq_length"]) == (6, LONG)
    lrs = {e["step"]: e for e in state["log_history"] if "learning_rate" in e}
    assert lrs[5]["learning_rate"] == pytest.approx(LR * (6 - 5) / 6, rel=1e-5)  # linear over the 6 steps given
    assert lrs[6]["learning_rate"] == pytest.approx(0.0, abs=1e-9)
    # 128 blocks (--max_train_samples) of either length, 16 steps an epoch: step 4 ended epoch 0.25 at 32 tokens,
    # which is data step 2 at 64 tokens (1,024 tokens), so step 5 reads data step 3 (not 5)
    assert [lrs[s]["epoch"] for s in (4, 5, 6)] == [0.25, round(3 / 16, 4), 0.25]
    assert (" Trained in 2 phases: steps 0-4 masking 15% of 32-token sequences (1,024 tokens), steps 4-6 masking 15% "
            "of 64-token sequences (1,024 tokens).") in (out / "README.md").read_text()
    assert _read(out / "checkpoint-6", "trainer_state.json")["phases"] == phases


def test_the_position_table_bounds_the_new_length(bert_phase1):
    """BERT's 512 positions: a phase at 512 is accepted, 513 refused naming 512 (the run's and the early checks'
    rule, :func:`hf_tpu_ext.run.resume.apply_checkpoint_shape`)."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.backends.keras.checkpoint import read_checkpoint_info
    from hf_tpu_ext.errors import CheckpointError
    from hf_tpu_ext.run.resume import apply_checkpoint_shape

    info = read_checkpoint_info(str(bert_phase1 / "checkpoint-4"), tensors=False)
    argv = ["--output_dir", str(bert_phase1), "--resume_from_checkpoint", "true", "--model_type", "bert",
            "--max_steps", "6", "--max_seq_length"]
    model_args, data_args, args = parse_args(argv + ["512"])
    notes = apply_checkpoint_shape(info, model_args, data_args, args, str)
    assert [n for n in notes if n.startswith("--max_seq_length 512 (the checkpoint trained at 32): a new phase")]
    assert (data_args.phase_start_step, data_args.tokens_before_phase) == (4, 4 * BATCH * SHORT)
    with pytest.raises(CheckpointError) as err:
        apply_checkpoint_shape(info, *parse_args(argv + ["513"]), str)
    assert ("--max_seq_length 513 (the checkpoint's model holds 512 tokens)") in str(err.value)
    # hf-tpu train's checks before JAX starts run the same rule: the same line
    from hf_tpu_ext.commands.early_checks import check_resume_shape

    with pytest.raises(CheckpointError) as early:
        check_resume_shape(*parse_args(argv + ["513", "--backend", "keras"]))
    assert str(early.value) == (f"These flags contradict the checkpoint {bert_phase1 / 'checkpoint-4'} being "
                                "resumed: --max_seq_length 513 (the checkpoint's model holds 512 tokens). Drop them "
                                "(the checkpoint's values are used) or start a new run in another --output_dir.")
    check_resume_shape(*parse_args(argv + ["512", "--backend", "keras"]))  # accepted: no error


def test_the_data_position_goes_on_in_tokens():
    """Step s of a phase at 64 tokens after 1,024 tokens of batch 8 reads the blocks a one-length run reads at
    data step 2 + (s - 4): :func:`hf_tpu_ext.backends.base.data_step` and ``TrainBatches(step_offset=)``."""
    from types import SimpleNamespace

    from hf_tpu_ext.backends.base import data_step, run_progress, tokens_seen
    from hf_tpu_ext.data.numpy_batches import TrainBatches

    plan = SimpleNamespace(global_batch_size=8, seq_length=64, phase_start_step=4, tokens_before_phase=1024,
                           steps_per_epoch=5, streaming=False)
    assert [data_step(plan, s) for s in (4, 5, 9)] == [2, 3, 7]
    assert (tokens_seen(plan, 6), run_progress(plan, 5)) == (1024 + 2 * 512, {"epoch": 0.6})
    blocks = np.arange(40 * 4, dtype=np.int32).reshape(40, 4)
    masker = lambda rows, seed, positions: {"input_ids": rows}  # noqa: E731 (the blocks as read)
    plain, shifted = TrainBatches(blocks, 8, 7, masker), TrainBatches(blocks, 8, 7, masker, step_offset=-2)
    for step in (4, 5, 6, 7):  # one permutation per epoch of 5 steps: 6 and 7 wrap into epoch 1
        np.testing.assert_array_equal(shifted.block_indices(step), plain.block_indices(step - 2))
    assert sorted(np.concatenate([shifted.block_indices(s) for s in range(2, 7)]).tolist()) == list(range(40))


def test_kill_9_during_phase_2_resumes_exactly(bert_phase1, tmp_path):
    """Phase 2 (64 tokens) to step 8 in one go, and again killed (-9) once checkpoint-6 is written, then resumed:
    the losses of steps 5-8 agree within 1e-5 and so do the phases."""
    from mlm_reference import _train_process, step_losses

    whole = _copy(bert_phase1, tmp_path, "whole")
    _train(_args(whole, "--resume_from_checkpoint", "true", "--max_seq_length", LONG, steps=8))
    cut = _copy(bert_phase1, tmp_path, "cut")
    argv = _args(cut, "--resume_from_checkpoint", "true", "--max_seq_length", LONG, steps=8)
    proc = _train_process(argv, kill_at="saved@6")
    assert proc.returncode == -9, proc.stderr[-3000:]
    proc = _train_process(argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "checkpoint-6" in proc.stderr
    ours, ref = (step_losses(_read(d, "trainer_state.json")["log_history"]) for d in (cut, whole))
    assert sorted(ours) == sorted(ref) == list(range(1, 9))
    np.testing.assert_allclose([ours[s] for s in range(5, 9)], [ref[s] for s in range(5, 9)], rtol=0, atol=1e-5)
    assert _read(cut, "training_summary.json")["phases"] == _read(whole, "training_summary.json")["phases"]


def test_modernbert_256_to_1024_with_a_new_rope_theta(tmp_path, hf_log):
    """ModernBERT's recipe on a tiny width: 2 steps at 256 tokens, then 1 at 1,024 with ``global_rope_theta``
    320000 (accepted with one line); the export's config holds the new theta, the phases both lengths."""
    out = tmp_path / "run"
    _train(_args(out, "--max_seq_length", 256, steps=2, model_type="modernbert", batch=2))
    with hf_log.at_level(logging.INFO, logger="hf_tpu_ext"):
        _train(_args(out, "--resume_from_checkpoint", "true", "--max_seq_length", 1024, "--config_overrides",
                     "global_rope_theta=320000", steps=3, model_type="modernbert", batch=2))
    lines = [r.getMessage() for r in hf_log.records]
    assert ("--config_overrides global_rope_theta=320000 (the checkpoint's 160000): RoPE's theta changes from step "
            "2, as a context extension's phase does.") in lines
    assert [n for n in lines if n.startswith("--max_seq_length 1024 (the checkpoint trained at 256): a new phase "
                                             "from step 2;")]
    summary = _read(out, "training_summary.json")
    assert [(p["start_step"], p["end_step"], p["max_seq_length"], p["tokens"]) for p in summary["phases"]] == [
        (0, 2, 256, 2 * 2 * 256), (2, 3, 1024, 2 * 1024)]
    assert summary["tokens_seen"] == 1024 + 2048
    assert _read(out, "config.json")["rope_parameters"]["full_attention"]["rope_theta"] == 320000.0
    assert ("steps 0-2 masking 15% of 256-token sequences (1,024 tokens), steps 2-3 masking 15% of 1024-token "
            "sequences (2,048 tokens).") in (out / "README.md").read_text()
