"""Only this run's files go up, and a rerun says what it does (issue 43), on the Keras backend (the default) with the
loopback Hub: ``--overwrite_output_dir`` + push leaves one TensorBoard events file on the Hub and no
``run_state.json``; the finished run rerun pushes nothing new; a ``--max_steps`` below the checkpoint's step of an
unfinished run is one line; a JSON config's hub fields with ``--push_to_hub false`` train without pushing.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import json
import logging
import os

import pytest

pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

REPO = "alice/keras-overwrite"


def _args(output_dir, *extra, steps=2):
    return ["--backend", "keras", "--output_dir", str(output_dir), "--hidden_size", "32", "--num_hidden_layers", "1",
            "--num_attention_heads", "2", "--intermediate_size", "64", "--vocab_size", "300", "--max_seq_length", "32",
            "--per_device_train_batch_size", "8", "--max_train_samples", "64", "--logging_steps", "1",
            "--max_steps", str(steps), "--save_steps", "2", "--eval_strategy", "no", "--disable_tqdm", "true",
            *map(str, extra)]


def _train(args):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args(list(args)), argv=["train", *args])


def test_overwrite_and_push_put_only_this_runs_files_and_a_rerun_pushes_nothing(loopback_hub, tmp_path, hf_log):
    out = tmp_path / "run"
    _train(_args(out))  # the earlier run: its events file stays in runs/ unless removed
    earlier = sorted(p.name for p in (out / "runs").rglob("events.out.tfevents*"))
    assert len(earlier) == 1
    push = ["--push_to_hub", "true", "--hub_model_id", REPO, "--hub_token", loopback_hub.token]
    with hf_log.at_level(logging.INFO, logger="hf_tpu_ext"):
        _train(_args(out, "--overwrite_output_dir", "true", *push))
    assert "--overwrite_output_dir: removed the earlier run's TensorBoard events runs." in hf_log.messages
    local = sorted(p.name for p in (out / "runs").rglob("events.out.tfevents*"))
    assert len(local) == 1 and local != earlier
    files = loopback_hub.server.files(REPO)
    assert [n for n in files if "tfevents" in n] == [f"runs/{local[0]}"]
    assert "run_state.json" not in files and (out / "run_state.json").is_file()
    assert ".hf-tpu-train.lock" not in files
    commits = [c["message"] for c in loopback_hub.server.commits(REPO)]
    assert commits[-1] == "End of training"
    # the finished run, rerun as a resume: nothing trained, nothing pushed, said in one line
    hf_log.clear()
    with hf_log.at_level(logging.INFO, logger="hf_tpu_ext"):
        _train(_args(out, "--resume_from_checkpoint", "true", *push))
    assert [c["message"] for c in loopback_hub.server.commits(REPO)] == commits
    assert any(m.startswith("The checkpoint is at global step 2, the run asks for 2 steps, and the export, card and "
                            "pushes are done: nothing to do.") for m in hf_log.messages)


def test_max_steps_below_an_unfinished_checkpoint_is_one_line(tmp_path, monkeypatch):
    from hf_tpu_ext import interrupts
    from hf_tpu_ext.errors import CheckpointError, TrainingInterrupted

    out = tmp_path / "run"
    monkeypatch.setenv(interrupts.SIGNAL_ENV, "checkpoint_weights@4")  # a preemption while step 4 is saved
    monkeypatch.setattr(interrupts, "_test_signal_sent", False)  # once per process: another test may have sent it
    with pytest.raises(TrainingInterrupted):
        _train(_args(out, "--save_steps", 4, steps=8))
    monkeypatch.delenv(interrupts.SIGNAL_ENV)
    before = sorted(os.listdir(out))
    with pytest.raises(CheckpointError) as err:
        _train(_args(out, "--save_steps", 4, "--resume_from_checkpoint", "true", steps=3))
    assert str(err.value) == (f"--max_steps 3 ends before the checkpoint {out / 'checkpoint-4'} (global step 4): pass "
                              "--max_steps 4 or more to finish that run, or resume an earlier checkpoint.")
    assert sorted(os.listdir(out)) == before


def test_a_config_with_hub_fields_and_push_to_hub_false_trains_without_pushing(loopback_hub, tmp_path, hf_log):
    cfg = tmp_path / "run.json"
    config = {"backend": "keras", "output_dir": str(tmp_path / "run"), "hidden_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 300, "max_seq_length": 32,
              "per_device_train_batch_size": 8, "max_train_samples": 64, "max_steps": 2, "eval_strategy": "no",
              "disable_tqdm": True, "push_to_hub": True, "hub_model_id": "alice/from-config",
              "hub_strategy": "checkpoint"}
    cfg.write_text(json.dumps(config))
    with hf_log.at_level(logging.INFO, logger="hf_tpu_ext"):
        results = _train([str(cfg), "--push_to_hub", "false", "--max_steps", "1"])
    assert results["global_step"] == 1  # the command line's --max_steps over the file's 2
    assert (f"{cfg}: hub_model_id, hub_strategy unused (--push_to_hub false: nothing is pushed)."
            in hf_log.messages)
    assert json.loads((tmp_path / "run" / "run_state.json").read_text())["phases"]["push"] == "skipped"
    assert ("model", "alice/from-config") not in loopback_hub.server.repos


def test_a_streamed_run_reports_its_passes_over_the_data_not_epochs(tmp_path, hf_log):
    """A 6-text file streamed until its 8th pass is read: the stream has completed 7 passes at the last step; the
    summary, all_results.json and the card say 7 passes (no ``epoch``: step / max_steps would say 1); so do each
    step's log line and log history entry (the passes after that step) and trainer_state.json (``epoch`` null)."""
    pytest.importorskip("datasets")
    from transformers import AutoTokenizer

    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    texts = default_corpus_texts()[:6]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    train_bpe_tokenizer(default_corpus_texts()[:200], vocab_size=300, model_max_length=32).save_pretrained(
        str(tmp_path / "tok"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    lengths = [len(tok(t)["input_ids"]) for t in texts]
    per_step = 8 * 32  # one process: every row of the global batch, 32 tokens each
    def passes_after(steps):  # examples are read while fewer than a step's tokens are held
        need, held, read = steps * per_step, 0, 0
        while held < need:
            held += lengths[read % len(lengths)]
            read += 1
        return (read - 1) // len(lengths)  # the pass of the last example read (counted from 0) = passes completed

    steps = next(s for s in range(1, 1000) if passes_after(s) == 7)  # the first step at which pass 7 is read
    out = tmp_path / "run"
    with hf_log.at_level(logging.INFO, logger="hf_tpu_ext"):
        _train(["--backend", "keras", "--streaming", "true", "--train_file", str(tmp_path / "train.jsonl"),
                "--tokenizer_name", str(tmp_path / "tok"), "--output_dir", str(out), "--hidden_size", "32",
                "--num_hidden_layers", "1", "--num_attention_heads", "2", "--intermediate_size", "64",
                "--max_seq_length", "32", "--per_device_train_batch_size", "8", "--max_steps", str(steps),
                "--save_steps", str(steps), "--eval_strategy", "no", "--disable_tqdm", "true", "--report_to", "none",
                "--logging_steps", "1"])
    state = json.loads((out / "trainer_state.json").read_text())
    entries = [e for e in state["log_history"] if "loss" in e]
    assert [(e["step"], e["stream_passes"]) for e in entries] == [(s, passes_after(s)) for s in range(1, steps + 1)]
    assert not any("epoch" in e for e in state["log_history"]) and state["epoch"] is None
    # each record once (the fixture's handler and caplog's may both hold it)
    lines = list(dict.fromkeys(r.getMessage() for r in hf_log.records if r.getMessage().startswith("step ")))
    assert [line.split(":")[0] for line in lines] == [f"step {s} (stream passes {passes_after(s)})"
                                                      for s in range(1, steps + 1)]
    ends = {r.getMessage() for r in hf_log.records if r.levelno == logging.INFO and "reached the end of" in r.getMessage()}
    assert ends == {f"--streaming: the reader reached the end of --train_file {tmp_path / 'train.jsonl'} (pass 1) and starts it "
                    "again; the step lines count the passes trained on"}  # once, not once per pass
    summary = json.loads((out / "training_summary.json").read_text())
    assert (summary["stream_passes"], summary["epoch"], summary["global_step"]) == (7, None, steps)
    results = json.loads((out / "all_results.json").read_text())
    assert results["stream_passes"] == 7 and "epoch" not in results
    card = (out / "README.md").read_text()
    assert "| Passes over the data (streamed) | 7 complete |" in card and "| Epochs |" not in card


def test_the_card_names_the_validation_file_and_the_evaluations_size(tmp_path):
    from hf_tpu_ext.data.corpus import default_corpus_texts

    texts = default_corpus_texts()
    (tmp_path / "train.txt").write_text("\n".join(texts[:150]) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(texts[150:200]) + "\n")
    out = tmp_path / "run"
    args = [a for a in _args(out) if a not in ("--eval_strategy", "no")]
    _train([*args, "--train_file", str(tmp_path / "train.txt"), "--validation_file", str(tmp_path / "valid.txt"),
            "--max_eval_samples", "4", "--per_device_eval_batch_size", "2"])
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["evaluation"] == {"data": "the first blocks of the validation file valid.txt", "blocks": 4,
                                     "tokens": 4 * 32}
    card = (out / "README.md").read_text()
    assert ("Measured after training on the first blocks of the validation file valid.txt: 4 blocks of 32 tokens "
            "(128 tokens).") in card
    assert "held-out split" not in card
