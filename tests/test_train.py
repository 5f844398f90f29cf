"""`hf-tpu train`: the output folder, XLA compiled once, logits across TF/PyTorch, bad input errors."""

import json
import os
import struct
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import tiny_train_args

EXPECTED_FILES = [
    "config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors", "training_args.json",
    "trainer_state.json", "all_results.json", "training_summary.json", "loss_curve.png", "README.md",
]


def _safetensors_metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header.pop("__metadata__", {}), header


def test_output_folder_layout(trained_run):
    out, results = trained_run
    for name in EXPECTED_FILES:
        assert (out / name).is_file(), f"missing {name}"
    meta, tensors = _safetensors_metadata(out / "model.safetensors")
    assert meta.get("format") == "pt"
    assert "roberta.encoder.layer.1.attention.self.query.weight" in tensors
    assert tensors["roberta.embeddings.word_embeddings.weight"]["shape"] == [500, 64]

    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 30
    assert state["num_input_tokens_seen"] == 30 * 8 * 32 and state["total_flos"] > 0
    losses = [e for e in state["log_history"] if "loss" in e]
    assert [e["step"] for e in losses] == [5, 10, 15, 20, 25, 30]
    evals = [e for e in state["log_history"] if "eval_loss" in e]
    assert [e["step"] for e in evals] == [15, 30]
    assert evals[-1]["perplexity"] == pytest.approx(np.exp(evals[-1]["eval_loss"]), rel=1e-5)
    assert 0.0 <= evals[-1]["eval_accuracy"] <= 1.0

    all_results = json.loads((out / "all_results.json").read_text())
    assert all_results["global_step"] == 30
    assert all_results["eval_loss"] == pytest.approx(evals[-1]["eval_loss"], rel=1e-6)
    assert all_results["tokens_seen"] == 30 * 8 * 32

    for name in ("model.safetensors", "config.json", "trainer_state.json", "loss_curve.png"):
        assert (out / name).stat().st_mode & 0o044 == 0o044, f"{name} is not readable by others"
    args = json.loads((out / "training_args.json").read_text())
    assert args["per_device_train_batch_size"] == 8 and args["max_seq_length"] == 32 and args["hidden_size"] == 64

    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = [f for _, _, files in os.walk(out / "runs") for f in files if f.startswith("events.out.tfevents")]
    assert events, "no TensorBoard event file under runs/"
    # save_steps=10 with save_total_limit=2 keeps the last two
    ckpts = sorted(p.name for p in (out / "checkpoints").glob("ckpt-*.index"))
    assert ckpts == ["ckpt-20.index", "ckpt-30.index"]

    summary = json.loads((out / "training_summary.json").read_text())
    assert (summary["precision"], summary["compiler"]) == ("float32", "XLA, whole step in one program")

    card = (out / "README.md").read_text()
    assert "library_name: transformers" in card and "pipeline_tag: fill-mask" in card
    assert "fine-tuned" not in card.lower()
    assert "base_model" not in card


def test_train_step_compiled_once(trained_run):
    _, results = trained_run
    assert results["xla_step_traces"] == 1
    assert results["train_function_traces"] == 1


def test_tokenizer_loads_with_autotokenizer(trained_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(trained_model_dir)
    assert tok.mask_token == "<mask>" and len(tok) == 500
    ids = tok("The <mask> statement.")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id and tok.mask_token_id in ids


def test_checkpoint_and_exported_weights_agree(trained_model_dir):
    """The TF checkpoint and the PyTorch-format safetensors hold the same trained model (max diff 1e-5)."""
    import tensorflow as tf

    from hf_tpu_ext.backends.tensorflow.checkpoint import TrainingCheckpointer
    from hf_tpu_ext.backends.tensorflow.export import load_tf_model

    reloaded = load_tf_model(str(trained_model_dir))
    restored = load_tf_model(str(trained_model_dir))
    for w in restored.trainable_weights:  # clobber, so the restore below must bring every value back
        w.assign(tf.zeros_like(w))
    ckpt = TrainingCheckpointer(restored, None, str(trained_model_dir / "checkpoints"))
    assert ckpt.restore() == 30
    ids = tf.constant(np.random.default_rng(0).integers(5, 500, size=(2, 32)), tf.int32)
    a = reloaded(input_ids=ids, attention_mask=tf.ones_like(ids)).logits.numpy()
    b = restored(input_ids=ids, attention_mask=tf.ones_like(ids)).logits.numpy()
    assert a.shape == (2, 32, 500)
    assert np.abs(a - b).max() <= 1e-5


def test_pytorch_loads_same_logits(trained_model_dir):
    torch = pytest.importorskip("torch")
    import tensorflow as tf
    from transformers import RobertaForMaskedLM

    from hf_tpu_ext.backends.tensorflow.export import load_tf_model

    pt, info = RobertaForMaskedLM.from_pretrained(str(trained_model_dir), output_loading_info=True)
    assert not info["missing_keys"] or set(info["missing_keys"]) <= {"lm_head.decoder.weight", "lm_head.decoder.bias"}
    assert not info["unexpected_keys"]
    pt.eval()
    ids = np.random.default_rng(1).integers(5, 500, size=(2, 32))
    with torch.no_grad():
        pt_logits = pt(input_ids=torch.tensor(ids)).logits.numpy()
    tf_model = load_tf_model(str(trained_model_dir))
    tf_logits = tf_model(input_ids=tf.constant(ids, tf.int32)).logits.numpy()
    assert np.abs(pt_logits - tf_logits).max() <= 1e-4


def test_training_reduced_loss(trained_run):
    out, _ = trained_run
    state = json.loads((out / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert losses[-1] < losses[0]


def test_json_config_file(tmp_path):
    from hf_tpu_ext.args import parse_args

    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"output_dir": str(tmp_path / "o"), "max_steps": 7, "hidden_size": 64,
                               "num_attention_heads": 2, "per_device_train_batch_size": 4}))
    model_args, data_args, training_args = parse_args([str(cfg)])
    assert (training_args.max_steps, model_args.hidden_size, training_args.per_device_train_batch_size) == (7, 64, 4)
    assert data_args.max_predictions_per_seq == round(128 * 0.15)
    # flags after the file override it
    assert parse_args([str(cfg), "--max_steps", "9"])[2].max_steps == 9
    cfg.write_text(json.dumps({"output_dir": "o", "max_stepz": 7}))
    from hf_tpu_ext.errors import ArgumentError

    with pytest.raises(ArgumentError, match="unknown fields: max_stepz. Did you mean: --max_steps"):
        parse_args([str(cfg)])


def test_unknown_flags_are_named_not_abbreviated():
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"Unknown argument\(s\): --lr\."):
        parse_args(["--lr", "1e-3"])
    # argparse would accept this prefix of --num_train_epochs; we don't
    with pytest.raises(ArgumentError, match="Did you mean: --num_train_epochs"):
        parse_args(["--num_train_epoch", "2"])


# ----------------------------------------------------------------------------- bad input


def _train(args):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args(args))


def test_missing_train_file(tmp_path):
    from hf_tpu_ext.errors import DataFileNotFoundError

    with pytest.raises(DataFileNotFoundError, match="nope.txt"):
        _train(tiny_train_args(tmp_path / "o", "--train_file", str(tmp_path / "nope.txt")))
    assert not (tmp_path / "o").exists()


def test_corpus_too_small_says_sizes(tmp_path):
    from hf_tpu_ext.errors import CorpusTooSmallError

    small = tmp_path / "small.txt"
    small.write_text("A few words.\nNot nearly enough for a batch.\n" * 3)
    with pytest.raises(CorpusTooSmallError) as err:
        _train(tiny_train_args(tmp_path / "o", "--train_file", str(small), "--validation_file", str(small)))
    msg = str(err.value)
    assert "32" in msg and "global batch" in msg.lower(), msg
    assert not (tmp_path / "o" / "model.safetensors").exists()


def test_max_seq_length_beyond_positions(tmp_path, trained_model_dir, monkeypatch):
    from hf_tpu_ext.errors import ArgumentError

    def no_data_work(*a, **k):
        raise AssertionError("data was loaded before the sequence length was checked")

    monkeypatch.setattr("hf_tpu_ext.data.run_data.load_text_datasets", no_data_work)  # where the run loads it
    args = ["--output_dir", str(tmp_path / "o"), "--model_name_or_path", str(trained_model_dir),
            "--max_seq_length", "64", "--max_steps", "2", "--max_train_samples", "64"]
    with pytest.raises(ArgumentError, match="larger than the model allows .32 tokens"):
        _train(args)


def test_resuming_a_finished_run_changes_nothing(tmp_path, trained_model_dir):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(trained_model_dir, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    results = _train(tiny_train_args(run, "--max_steps", "30", "--resume_from_checkpoint", "true"))
    assert results["global_step"] == 30
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert after == before


def test_tokenizer_without_mask_token(tmp_path, trained_model_dir):
    from transformers import PreTrainedTokenizerFast

    from hf_tpu_ext.errors import TokenizerError

    tok = PreTrainedTokenizerFast(tokenizer_file=str(trained_model_dir / "tokenizer.json"), bos_token="<s>",
                                  eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    assert tok.mask_token is None
    tok.save_pretrained(tmp_path / "tok")
    with pytest.raises(TokenizerError, match="mask token"):
        _train(tiny_train_args(tmp_path / "o", "--tokenizer_name", str(tmp_path / "tok"), "--max_steps", "2"))


def test_output_dir_not_empty_is_untouched(tmp_path):
    from hf_tpu_ext.errors import OutputDirError

    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(OutputDirError, match="--overwrite_output_dir"):
        _train(tiny_train_args(out, "--max_steps", "2"))
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "precious"


def test_output_dir_entries_skip_the_lock_and_another_process_write_probe(tmp_path):
    """Process 0 of a 2-process run probes the shared output_dir (an empty ``.hf-tpu-write-check-*`` folder, made
    and removed) while process 1 lists it: that probe is not "a file in the folder" (it refused process 1 in CI and
    left process 0 waiting 300 s for it), a real file still is."""
    from hf_tpu_ext.fileio import WRITE_CHECK_PREFIX
    from hf_tpu_ext.run.checks import check_output_dir, output_dir_entries
    from hf_tpu_ext.run_lock import LOCK_NAME

    out = tmp_path / "o"
    out.mkdir()
    (out / LOCK_NAME).write_text("{}")
    (out / f"{WRITE_CHECK_PREFIX}ab12").mkdir()
    assert WRITE_CHECK_PREFIX == ".hf-tpu-write-check-" and output_dir_entries(str(out)) == []
    check_output_dir(SimpleNamespace(output_dir=str(out), overwrite_output_dir=False, resume_from_checkpoint=None))
    (out / "run_state.json").write_text("{}")
    assert output_dir_entries(str(out)) == ["run_state.json"]


def test_output_dir_that_is_a_file(tmp_path):
    from hf_tpu_ext.errors import OutputDirError

    out = tmp_path / "afile"
    out.write_text("precious")
    with pytest.raises(OutputDirError) as err:
        _train(tiny_train_args(out, "--max_steps", "2"))
    assert str(err.value) == f"--output_dir {str(out)!r} exists and is a file; choose a folder path."
    assert out.read_text() == "precious"


def test_checkpoint_of_other_shape(tmp_path, trained_model_dir):
    from hf_tpu_ext.errors import CheckpointError

    args = tiny_train_args(tmp_path / "o", "--max_steps", "2",
                           "--resume_from_checkpoint", str(trained_model_dir / "checkpoints"))
    args[args.index("--hidden_size") + 1] = "32"
    with pytest.raises(CheckpointError, match="hidden_size"):
        _train(args)


def test_unknown_callback_lists_known(tmp_path):
    from hf_tpu_ext.errors import UnknownCallbackError

    with pytest.raises(UnknownCallbackError) as err:
        _train(tiny_train_args(tmp_path / "o", "--callbacks", "throughput,nope"))
    assert "nope" in str(err.value) and "xla_recompile_guard" in str(err.value)
    assert not (tmp_path / "o").exists()


def test_unknown_backend():
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.errors import ArgumentError

    with pytest.raises(ArgumentError, match="torch_xla"):
        parse_args(["--backend", "jax"])


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    from hf_tpu_ext.cli import main

    rc = main(["train", "--output_dir", str(tmp_path / "o"), "--train_file", str(tmp_path / "missing.csv")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "hf-tpu train: error:" in err and "missing.csv" in err and "Traceback" not in err


def test_train_from_tfrecord_shards(tmp_path):
    """`hf-tpu prepare-data` shards feed `hf-tpu train --train_file <folder>` (the TPU path)."""
    from hf_tpu_ext.commands.prepare_data import main as prepare

    shards = tmp_path / "shards"
    assert prepare(["--vocab_size", "500", "--max_seq_length", "32", "--num_shards", "2", "--output_path",
                    str(shards), "--max_train_samples", "256", "--max_eval_samples", "32"]) == 0
    args = tiny_train_args(tmp_path / "o", "--train_file", str(shards), "--max_steps", "6", "--eval_strategy", "steps",
                           "--eval_steps", "6", "--callbacks", "")
    for flag in ("--max_train_samples", "--max_eval_samples", "--vocab_size"):
        i = args.index(flag)
        del args[i:i + 2]
    results = _train(args)
    assert results["global_step"] == 6 and np.isfinite(results["eval_loss"])
    summary = json.loads((tmp_path / "o" / "training_summary.json").read_text())
    assert summary["model_config"]["vocab_size"] == 500
    assert summary["tokens_seen"] == 6 * 8 * 32


# ----------------------------------------------------------------------------- TrainingArguments names


def _weights(folder):
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def test_gradient_accumulation_equals_large_batch(tmp_path):
    """4 accumulated micro-batches of 8 = one batch of 32 (dropout off): same weights after 5 optimizer steps."""
    common = ("--max_steps", "5", "--do_eval", "false", "--save_strategy", "no", "--callbacks", "",
              "--report_to", "none", "--logging_steps", "1")
    accumulated = _train(tiny_train_args(tmp_path / "accum", *common, "--gradient_accumulation_steps", "4"))
    args = tiny_train_args(tmp_path / "big", *common)
    args[args.index("--per_device_train_batch_size") + 1] = "32"
    big = _train(args)
    assert accumulated["global_step"] == big["global_step"] == 5
    assert accumulated["xla_step_traces"] == 1
    a, b = _weights(tmp_path / "accum"), _weights(tmp_path / "big")
    assert a.keys() == b.keys()
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= 1e-5
    # the logged step counts optimizer steps; each saw 32 sequences
    state = json.loads((tmp_path / "accum" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3, 4, 5]
    assert state["train_batch_size"] == 32 and state["num_input_tokens_seen"] == 5 * 32 * 32
    assert not (tmp_path / "accum" / "runs").exists()  # --report_to none: no TensorBoard files


def test_run_mlm_style_json_config_trains_and_keeps_the_best_model(tmp_path, monkeypatch):
    """A run_mlm-style JSON config trains; with load_best_model_at_end the output folder holds the best evaluation.

    ``metric_for_best_model accuracy`` with ``greater_is_better false`` picks an early evaluation (the lowest
    accuracy), so the best differs from the last; save_total_limit 1 rotates its regular checkpoint away.
    ``report_to trackio`` logs through a stand-in ``trackio`` module (the package is not a dependency).
    """
    import importlib.machinery
    import sys
    import types

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    calls = []
    trackio = types.ModuleType("trackio")
    trackio.__spec__ = importlib.machinery.ModuleSpec("trackio", None)
    trackio.init = lambda **kw: calls.append(("init", kw["project"], kw["config"]["lr_scheduler_type"]))
    trackio.log = lambda metrics, step=None: calls.append(("log", step, dict(metrics)))
    trackio.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "trackio", trackio)

    out = tmp_path / "o"
    out.mkdir()
    (out / "old.txt").write_text("from an earlier run")  # overwrite_output_dir lets the run use the folder
    base = dict(zip(tiny_train_args(out)[::2], tiny_train_args(out)[1::2]))

    def json_value(text):
        """The JSON value a config file holds for a command-line word: 64 and 1e-3 numbers, true a boolean."""
        try:
            return json.loads(text)
        except ValueError:
            return text  # a path

    cfg = {k.lstrip("-"): json_value(v) for k, v in base.items()}  # typed as in run_mlm's JSON files
    cfg.update({
        "do_train": True, "do_eval": True, "evaluation_strategy": "steps", "eval_steps": 2, "save_steps": 2,
        "save_total_limit": 1, "max_steps": 6, "gradient_accumulation_steps": 2, "per_device_train_batch_size": 4,
        "lr_scheduler_type": "cosine", "warmup_steps": 2, "report_to": ["trackio"], "line_by_line": False,
        "pad_to_max_length": True, "overwrite_output_dir": True, "logging_steps": 1, "callbacks": "",
        "load_best_model_at_end": True, "metric_for_best_model": "accuracy", "greater_is_better": False,
    })
    path = tmp_path / "run_mlm.json"
    path.write_text(json.dumps(cfg))
    results = train(*parse_args([str(path)]))
    assert results["global_step"] == 6

    state = json.loads((out / "trainer_state.json").read_text())
    # the logged learning rate follows transformers' cosine schedule (warmup 2 of 6 steps, peak 1e-3)
    from transformers.optimization import _get_cosine_schedule_with_warmup_lr_lambda as cosine

    logged = {e["step"]: e["learning_rate"] for e in state["log_history"] if "loss" in e}
    assert sorted(logged) == [1, 2, 3, 4, 5, 6]
    for step, lr in logged.items():
        assert lr == pytest.approx(1e-3 * cosine(step, num_warmup_steps=2, num_training_steps=6, num_cycles=0.5),
                                   abs=1e-9)
    evals = [e for e in state["log_history"] if "eval_loss" in e]
    assert [e["step"] for e in evals] == [2, 4, 6]
    best = min(evals, key=lambda e: e["eval_accuracy"])  # the first of equals, as the trainer keeps
    assert state["best_global_step"] == best["step"] and state["best_metric"] == best["eval_accuracy"]
    assert best["step"] != 6 and best["eval_loss"] != evals[-1]["eval_loss"]
    # the exported model is the best one: its final evaluation repeats the best evaluation
    all_results = json.loads((out / "all_results.json").read_text())
    assert all_results["eval_loss"] == pytest.approx(best["eval_loss"], rel=1e-5)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["eval_results"]["eval_loss"] == best["eval_loss"]
    assert summary["hyperparameters"]["lr_scheduler"] == "cosine"
    assert summary["hyperparameters"]["gradient_accumulation_steps"] == 2 and summary["global_batch_size"] == 8
    # the last checkpoint (resume point) is still the last step; the best one's was rotated away
    assert sorted(p.name for p in (out / "checkpoints").glob("ckpt-*.index")) == ["ckpt-6.index"]
    assert json.loads((out / "checkpoints" / "best" / "model.json").read_text())["global_step"] == best["step"]
    assert not (out / "runs").exists()  # no tensorboard in report_to
    # trackio saw every logged entry at its step, once initialised and finished once
    assert calls[0] == ("init", "o", "cosine") and calls[-1] == ("finish",)
    logged_to_trackio = [(c[1], c[2].get("loss", c[2].get("eval_loss"))) for c in calls if c[0] == "log"]
    history = [(e["step"], e.get("loss", e.get("eval_loss"))) for e in state["log_history"]]
    assert logged_to_trackio == history


def test_a_model_that_needs_autograph_is_traced_again_with_it():
    """The step is traced without AutoGraph (faster first step); a call() that branches on a tensor in Python
    makes that trace fail before anything runs, and the trainer rebuilds its functions with AutoGraph."""
    import tensorflow as tf

    from hf_tpu_ext.backends.tensorflow.trainer import TFTrainer

    def call(x):
        if tf.reduce_sum(x) > 0:  # Python control flow on a tensor: needs AutoGraph inside tf.function
            return x * 2.0
        return x

    class Rebuilt:
        def __init__(self):
            self.builds = []
            self._build_functions()

        def _build_functions(self, autograph=False):
            self.builds.append(autograph)
            self.autograph = autograph
            self.train_function = tf.function(lambda iterator, n: call(tf.cast(n, tf.float32)), autograph=autograph)

    first = Rebuilt()
    assert float(TFTrainer._call_train_function(first, None, 3, first=True)) == 6.0
    assert first.builds == [False, True]
    later = Rebuilt()  # only the first call may rebuild: a later failure is a real error
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        TFTrainer._call_train_function(later, None, 3, first=False)
    assert later.builds == [False]
