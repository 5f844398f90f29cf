"""The run's shape on resume (README, "Resuming: the run's shape"), every row of the table on the Keras backend.

One tiny run (session fixture) trains 4 steps at global batch 16 (``--per_device_train_batch_size 16`` on one
device) and 32 tokens per block, with a linear learning-rate schedule; each row resumes a copy of its folder to
step 6. Flags left at their defaults take the checkpoint's values; the same global batch split another way is
accepted with one line; another global batch, another ``--max_seq_length`` or another data source is refused in one
line naming both values, before anything is written. The first resumed step's learning rate, epoch and the tokens
seen are checked against numbers computed here. Rows that need several processes or a streamed checkpoint are
checked on :func:`hf_tpu_ext.run.resume.apply_checkpoint_shape` with the :class:`RunShape` such a run has.
"""

import json
import logging
import os
import shutil

import pytest

pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

BATCH, LENGTH, BLOCKS, LR = 16, 32, 128, 1e-3
STEPS_PER_EPOCH = BLOCKS // BATCH  # 8


def _args(output_dir, *extra, steps=6):
    """A tiny run; the batch and block length are given by the caller (the fixture) or left to the checkpoint."""
    return ["--backend", "keras", "--output_dir", str(output_dir),
            "--hidden_size", "32", "--num_hidden_layers", "1", "--num_attention_heads", "2",
            "--intermediate_size", "64", "--vocab_size", "300", "--max_train_samples", str(BLOCKS),
            "--do_eval", "false", "--logging_steps", "1", "--learning_rate", str(LR), "--lr_scheduler_type", "linear",
            "--max_steps", str(steps), "--save_steps", "4", "--seed", "7", "--disable_tqdm", "true", *extra]


def _train(args):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args(list(map(str, args))))


@pytest.fixture(scope="session")
def four_steps(tmp_path_factory):
    out = tmp_path_factory.mktemp("shape") / "run"
    _train(_args(out, "--per_device_train_batch_size", BATCH, "--max_seq_length", LENGTH, steps=4))
    return out


def _copy(four_steps, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(four_steps, out)
    return out


def _assert_resumed_true(out):
    """Steps 5-6 at the checkpoint's shape: global batch 16, 32 tokens; schedule, epoch and tokens counted so."""
    state = json.loads((out / "trainer_state.json").read_text())
    assert (state["global_step"], state["train_batch_size"]) == (6, BATCH)
    first = next(e for e in state["log_history"] if e.get("step") == 5 and "learning_rate" in e)
    assert first["learning_rate"] == pytest.approx(LR * (6 - 5) / 6, rel=1e-5)  # linear, no warmup, 6 steps
    assert first["epoch"] == pytest.approx(5 / STEPS_PER_EPOCH)
    results = json.loads((out / "all_results.json").read_text())
    assert results["tokens_seen"] == 6 * BATCH * LENGTH == state["num_input_tokens_seen"]
    assert results["epoch"] == pytest.approx(6 / STEPS_PER_EPOCH)
    summary = json.loads((out / "training_summary.json").read_text())
    assert (summary["global_batch_size"], summary["max_seq_length"], summary["tokens_seen"]) == (BATCH, LENGTH, 3072)
    assert "| Tokens seen | 3,072 |" in (out / "README.md").read_text()


def test_flags_left_at_their_defaults_take_the_checkpoints_batch_and_length(four_steps, tmp_path, hf_log):
    out = _copy(four_steps, tmp_path)
    with hf_log.at_level(logging.INFO, logger="hf_tpu_ext"):
        _train(_args(out, "--resume_from_checkpoint", "true"))
    _assert_resumed_true(out)
    lines = [r.getMessage() for r in hf_log.records]
    assert ("--per_device_train_batch_size not given: resuming with the checkpoint's global batch 16 = 16 per device "
            "x 1 device(s) over 1 process(es) x 1 accumulation step(s).") in lines
    assert "--max_seq_length not given: resuming with the checkpoint's 32 (the default is 128)." in lines
    # the fixture's run had 4 steps: the schedule of steps 5-6 is a 6-step run's (_assert_resumed_true's rate)
    assert ("--max_steps 6 (the checkpoint's run had 4): from step 4 the learning-rate schedule is that of a 6-step "
            "run, as in transformers' Trainer.") in lines


def test_the_same_global_batch_split_another_way_is_accepted_with_one_line(four_steps, tmp_path, hf_log):
    out = _copy(four_steps, tmp_path)
    with hf_log.at_level(logging.INFO, logger="hf_tpu_ext"):
        _train(_args(out, "--resume_from_checkpoint", "true", "--per_device_train_batch_size", "8",
                     "--gradient_accumulation_steps", "2", "--max_seq_length", LENGTH))
    _assert_resumed_true(out)
    assert ("from step 4: global batch 16 = 8 per device x 1 device(s) over 1 process(es) x 2 accumulation step(s) "
            "(the checkpoint's).") in [r.getMessage() for r in hf_log.records]


REFUSALS = [
    (["--per_device_train_batch_size", "8"],
     "global batch 8 (--per_device_train_batch_size 8 x 1 device(s) over 1 process(es) x 1 accumulation step(s); "
     "the checkpoint trained with global batch 16: pass a per-device batch and accumulation that multiply to it)"),
    (["--max_seq_length", "16"],
     "--max_seq_length 16 (the checkpoint trained at 32; a new length is a new run: --model_name_or_path on its "
     "exported model)"),
    (["--model_type", "bert"], "--model_type bert (the checkpoint is a 'roberta' model)"),
    (["--config_overrides", "hidden_size=64"], "--config_overrides hidden_size=64 (the checkpoint has 32)"),
]


def _refusal(out, conflict):
    return (f"These flags contradict the checkpoint {out / 'checkpoint-4'} being resumed: {conflict}. Drop them "
            "(the checkpoint's values are used) or start a new run in another --output_dir.")


@pytest.mark.parametrize("flags, conflict", REFUSALS)
def test_another_value_is_refused_naming_both_before_anything_is_written(four_steps, tmp_path, flags, conflict):
    from hf_tpu_ext.errors import CheckpointError

    out = _copy(four_steps, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    with pytest.raises(CheckpointError) as err:
        _train(_args(out, "--resume_from_checkpoint", "true", *flags))
    assert str(err.value) == _refusal(out, conflict)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".hf-tpu-train.lock"} == {
        p: t for p, t in before.items() if p.name != ".hf-tpu-train.lock"}


def test_model_type_left_out_takes_the_checkpoints_architecture(four_steps, tmp_path):
    """A resume without ``--model_type`` builds the checkpoint's architecture (recorded in ``checkpoint.json``),
    with one line; ``xlm-roberta``/``camembert`` checkpoints are RoBERTa's here."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run.resume import apply_checkpoint_shape

    meta = json.loads((four_steps / "checkpoint-4" / "checkpoint.json").read_text())
    assert (meta["model_config"]["model_type"], meta["model_config"]["_name_or_path"]) == ("roberta", "")
    for saved, expected, line in [("bert", "bert", ["--model_type not given: resuming the checkpoint's 'bert' model."]),
                                  ("xlm-roberta", "roberta", []), ("modernbert", "modernbert",
                                   ["--model_type not given: resuming the checkpoint's 'modernbert' model."])]:
        info = _info(tmp_path)
        info.model_config["model_type"] = saved
        model_args, data_args, args = parse_args(["--output_dir", str(tmp_path), "--resume_from_checkpoint", "true",
                                                  "--max_steps", "6", "--max_seq_length", str(LENGTH)])
        notes = apply_checkpoint_shape(info, model_args, data_args, args, str)
        assert model_args.model_type == expected
        assert [n for n in notes if "--model_type" in n] == line


def test_a_continued_models_checkpoint_needs_its_model_again(tmp_path):
    """A checkpoint of a model continued from --model_name_or_path (its config's ``_name_or_path``) is built from
    that model's config, not a preset: a resume that names no model is refused in one line."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.errors import CheckpointError
    from hf_tpu_ext.run.resume import apply_checkpoint_shape

    info = _info(tmp_path)
    info.model_config.update(model_type="bert", _name_or_path="alice/tiny-bert")
    model_args, data_args, args = parse_args(["--output_dir", str(tmp_path), "--resume_from_checkpoint", "true",
                                              "--max_steps", "6", "--max_seq_length", str(LENGTH)])
    with pytest.raises(CheckpointError) as err:
        apply_checkpoint_shape(info, model_args, data_args, args, str)
    assert str(err.value) == _refusal(tmp_path, "no --model_name_or_path or --config_name (the checkpoint's model "
                                      "was built from 'alice/tiny-bert': pass it again as the run that made it did; "
                                      "the weights are the checkpoint's)").replace(str(tmp_path / "checkpoint-4"),
                                                                                   str(tmp_path))


def _info(path, batch=16):
    from hf_tpu_ext.backends.base import CheckpointInfo

    return CheckpointInfo(path=str(path), global_step=4, model_config={"max_position_embeddings": LENGTH + 2},
                          trainer_state={"global_step": 4, "train_batch_size": batch,
                                         "num_input_tokens_seen": 4 * batch * LENGTH})


def _apply(path, argv, shape):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run.resume import apply_checkpoint_shape

    model_args, data_args, args = parse_args(["--output_dir", str(path), "--resume_from_checkpoint", "true",
                                              "--max_steps", "6", *argv])
    return apply_checkpoint_shape(_info(path), model_args, data_args, args, str, shape), data_args, args


def test_a_grown_slice_keeps_the_global_batch_and_a_stream_its_process_count(tmp_path):
    from hf_tpu_ext.errors import CheckpointError
    from hf_tpu_ext.run.resume import RunShape

    # 2 processes of 2 devices each: the per-device batch left at its default is 16 / 4
    notes, _, args = _apply(tmp_path, [], RunShape(replicas=4, processes=2))
    assert args.per_device_train_batch_size == 4
    assert notes[-1] == ("--per_device_train_batch_size not given: resuming with the checkpoint's global batch 16 = 4 "
                         "per device x 4 device(s) over 2 process(es) x 1 accumulation step(s).")
    with pytest.raises(CheckpointError, match=r"global batch 48 \(--per_device_train_batch_size 16 x 3 device"):
        _apply(tmp_path, ["--per_device_train_batch_size", "16"], RunShape(replicas=3, processes=3))
    with pytest.raises(CheckpointError, match=r"resumed: global batch 24 \(--per_device_train_batch_size 8 x 3 "):
        _apply(tmp_path, [], RunShape(replicas=3, processes=3))  # 16 does not divide over 3 devices
    # a streamed checkpoint (one process's position): --streaming left unset follows it; 2 processes are refused
    stream = ["--train_file", "c.txt", "--tokenizer_name", "t"]
    notes, data_args, _ = _apply(tmp_path, stream, RunShape(streaming=True, stream_processes=1))
    assert data_args.streaming is True
    assert notes[-1] == "--streaming not given: resuming the checkpoint's stream (--streaming true)."
    with pytest.raises(CheckpointError, match=r"resumed: 2 process\(es\) \(the checkpoint's stream positions are of 1: "
                                              r"a stream resumes with the same process count\)\. Drop them"):
        _apply(tmp_path, stream, RunShape(replicas=2, processes=2, streaming=True, stream_processes=1))
    with pytest.raises(CheckpointError, match=r"resumed: --streaming false \(the checkpoint was trained with "
                                              r"--streaming true\)"):
        _apply(tmp_path, [*stream, "--streaming", "false"], RunShape(streaming=True, stream_processes=1))
    with pytest.raises(CheckpointError, match=r"resumed: --streaming true \(the checkpoint was trained with "
                                              r"--streaming false\)"):
        _apply(tmp_path, [*stream, "--streaming", "true"], RunShape(streaming=False))


FRAMEWORKS = ("transformers", "tensorflow", "tf_keras", "keras", "jax", "torch", "datasets", "pyarrow")
_CLI = ("import sys, time; from hf_tpu_ext import cli; t = time.perf_counter(); "
        "rc = cli.main(['train', *sys.argv[1:]]); print(rc, sorted(m for m in sys.modules if m.split('.')[0] in %r), round(time.perf_counter() - t, 2))"
        % (FRAMEWORKS,))
_TWO_PROCESSES = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0", "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1"}
_STREAMED = ["--streaming", "true", "--train_file", "corpus.txt"]


@pytest.mark.parametrize("flags, conflict, env, streamed", [
    *((flags, conflict, {}, False) for flags, conflict in REFUSALS),
    (["--per_device_train_batch_size", "16"],  # 3 processes of 1 device each: 48 sequences a step
     "global batch 48 (--per_device_train_batch_size 16 x 3 device(s) over 3 process(es) x 1 accumulation step(s); "
     "the checkpoint trained with global batch 16: pass a per-device batch and accumulation that multiply to it)",
     {"JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": "0", "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1"}, False),
    (["--per_device_train_batch_size", "4"],  # XLA_FLAGS' simulated devices count too: 4 x 2 = 8
     "global batch 8 (--per_device_train_batch_size 4 x 2 device(s) over 1 process(es) x 1 accumulation step(s); "
     "the checkpoint trained with global batch 16: pass a per-device batch and accumulation that multiply to it)",
     {"JAX_NUM_CPU_DEVICES": "", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, False),
    (_STREAMED, "--streaming true (the checkpoint was trained with --streaming false)", {}, False),
    (["--streaming", "false"], "--streaming false (the checkpoint was trained with --streaming true)", {}, True),
    (_STREAMED, "2 process(es) (the checkpoint's stream positions are of 1: a stream resumes with the same process "
                "count)", _TWO_PROCESSES, True),
])
def test_each_refusal_arrives_before_jax_starts(four_steps, tmp_path, flags, conflict, env, streamed):
    """``hf-tpu train``'s argument checks run the same rules on the local checkpoint (issue 43, items 1 and 8):
    the run's line, exit status 1, no framework imported, nothing written; the device count comes from
    ``JAX_PLATFORMS=cpu`` with ``JAX_NUM_CPU_DEVICES`` / ``XLA_FLAGS`` times ``JAX_NUM_PROCESSES``."""
    import subprocess
    import sys

    from conftest import REPO_ROOT

    out = _copy(four_steps, tmp_path)
    if streamed:  # the position of one process's stream (only its presence and count matter to the rules)
        (out / "checkpoint-4" / "data_state-0.json").write_text("{}")
    (tmp_path / "corpus.txt").write_text("a few words\n" * 8)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_")) and k != "KERAS_BACKEND"}
    variables = {**clean, "PYTHONPATH": str(REPO_ROOT), "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1", **env}
    argv = list(map(str, _args(out, "--resume_from_checkpoint", "true", *flags)))
    if flags == _STREAMED:  # a stream reads --max_steps x the batch (no sample cap) with the run's tokenizer
        argv[argv.index("--max_train_samples"):argv.index("--max_train_samples") + 2] = ["--tokenizer_name", str(out)]
    proc = subprocess.run([sys.executable, "-c", _CLI, *argv],
                          capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                          env={k: v for k, v in variables.items() if v != ""})
    rc, modules, seconds = proc.stdout.strip().rsplit(" ", 1)[0], proc.stdout, proc.stdout.split()[-1]
    print(f"refused after {seconds} s")  # under 2 s on an idle machine; not asserted (shared CI machines)
    assert rc == "1 []", (modules, proc.stderr[-2000:])
    assert proc.stderr == f"hf-tpu train: error: {_refusal(out, conflict)}\n"
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_a_max_steps_before_the_checkpoint_is_refused_before_jax_starts(four_steps, tmp_path):
    """The run's --max_steps refusal (tests/current/test_run_truth_keras.py) from the argument checks: the fixture's
    run was 4 steps long and ended there, so it is refused only for a checkpoint of an unfinished run."""
    import subprocess
    import sys

    from conftest import REPO_ROOT

    out = _copy(four_steps, tmp_path)
    (out / "run_state.json").unlink()  # the run that wrote checkpoint-4 is not finished
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_")) and k != "KERAS_BACKEND"}
    proc = subprocess.run([sys.executable, "-c", _CLI, *map(str, _args(out, "--resume_from_checkpoint", "true",
                                                                       steps=3))],
                          capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                          env={**clean, "PYTHONPATH": str(REPO_ROOT), "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"})
    assert proc.stdout.strip().rsplit(" ", 1)[0] == "1 []", proc.stderr[-2000:]
    assert proc.stderr == (f"hf-tpu train: error: --max_steps 3 ends before the checkpoint {out / 'checkpoint-4'} "
                           "(global step 4): pass --max_steps 4 or more to finish that run, or resume an earlier "
                           "checkpoint.\n")


def test_a_resume_that_changes_the_masking_rate_is_a_new_phase(four_steps, tmp_path, hf_log):
    """A phase of mmBERT's masking schedule (30 -> 15 -> 5 %): the fixture's 4 steps at the default 15 %, a resume
    to step 6 at 5 % (accepted with one line), then one to step 8 without the flag (the checkpoint's 5 % goes on:
    the same phase, longer). Each phase is recorded in trainer_state.json, training_summary.json and the card."""
    out = _copy(four_steps, tmp_path)
    per_step = BATCH * LENGTH
    first = {"start_step": 0, "end_step": 4, "max_seq_length": LENGTH, "mlm_probability": 0.15, "tokens": 4 * per_step}
    assert json.loads((out / "trainer_state.json").read_text())["phases"] == [first]
    with hf_log.at_level(logging.INFO, logger="hf_tpu_ext"):
        _train(_args(out, "--resume_from_checkpoint", "true", "--mlm_probability", "0.05"))
    lines = [r.getMessage() for r in hf_log.records]
    assert ("--mlm_probability 0.05 (the checkpoint's phase masked 0.15): a new phase from step 4, recorded in "
            "training_summary.json (phases) and the model card.") in lines
    second = {"start_step": 4, "end_step": 6, "max_seq_length": LENGTH, "mlm_probability": 0.05,
              "tokens": 2 * per_step}
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["phases"] == [first, second]
    assert json.loads((out / "trainer_state.json").read_text())["phases"] == [first, second]
    assert (summary["hyperparameters"]["mlm_probability"], summary["hyperparameters"]["max_predictions_per_seq"]) == (
        0.05, 2)  # round(32 x 0.05): the masks of steps 5-6 hold 2 positions, not 5
    assert summary["tokens_seen"] == sum(p["tokens"] for p in summary["phases"]) == 6 * per_step
    assert (" Trained in 2 phases: steps 0-4 masking 15% of 32-token sequences (2,048 tokens), steps 4-6 masking 5% "
            "of 32-token sequences (1,024 tokens).") in (out / "README.md").read_text()
    hf_log.clear()
    with hf_log.at_level(logging.INFO, logger="hf_tpu_ext"):
        _train(_args(out, "--resume_from_checkpoint", "true", steps=8))
    assert ("--mlm_probability not given: resuming with the checkpoint's 0.05 (the default is 0.15)."
            in [r.getMessage() for r in hf_log.records])
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["phases"] == [first, dict(second, end_step=8, tokens=4 * per_step)]
    assert summary["hyperparameters"]["mlm_probability"] == 0.05


def test_a_checkpoint_without_phases_starts_them_with_an_unknown_rate(tmp_path):
    """A checkpoint saved before phases were recorded: its steps are one phase of unrecorded rate, the resumed
    steps the next; nothing is said about a rate it does not know."""
    from types import SimpleNamespace

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run.resume import apply_checkpoint_shape
    from hf_tpu_ext.run.state import run_phases

    model_args, data_args, args = parse_args(["--output_dir", str(tmp_path), "--resume_from_checkpoint", "true",
                                              "--max_steps", "6", "--mlm_probability", "0.3"])
    notes = apply_checkpoint_shape(_info(tmp_path), model_args, data_args, args, str)
    assert not [n for n in notes if "mlm_probability" in n]
    plan = SimpleNamespace(seq_length=LENGTH, global_batch_size=BATCH)
    assert run_phases(data_args, plan, 6) == [
        {"start_step": 0, "end_step": 4, "max_seq_length": LENGTH, "mlm_probability": None, "tokens": 4 * BATCH * LENGTH},
        {"start_step": 4, "end_step": 6, "max_seq_length": LENGTH, "mlm_probability": 0.3, "tokens": 2 * BATCH * LENGTH}]
