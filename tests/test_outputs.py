"""Run files of the output folder: training_args.json, trainer_state.json, all_results.json, summary, loss plot."""

import ast
import dataclasses
import json
import subprocess
import sys

import pytest

from hf_tpu_ext import outputs
from hf_tpu_ext.args import DataTrainingArguments, ModelArguments, TrainingArguments
from hf_tpu_ext.outputs import (
    TrainerState,
    TrainingSummary,
    framework_versions,
    plot_loss_curve,
    read_training_summary,
    write_all_results,
    write_training_args,
    write_training_summary,
)

TOKEN = "hf_SecretTokenValue1234567890"


def test_training_args_merged_and_token_redacted(tmp_path):
    model_args = ModelArguments(vocab_size=500, hidden_size=64, num_attention_heads=2)
    data_args = DataTrainingArguments(max_seq_length=32)
    training_args = TrainingArguments(output_dir=str(tmp_path), max_steps=7, hub_token=TOKEN, learning_rate=1e-3)
    path = write_training_args(str(tmp_path), model_args, data_args, training_args)
    assert path == str(tmp_path / "training_args.json")
    text = open(path).read()
    assert TOKEN not in text
    data = json.loads(text)
    assert data["hub_token"] == "<redacted>"
    assert (data["vocab_size"], data["hidden_size"], data["max_seq_length"], data["max_predictions_per_seq"]) == (500, 64, 32, 5)
    assert (data["max_steps"], data["learning_rate"], data["output_dir"]) == (7, 1e-3, str(tmp_path))
    # One flat dict holding every field of the three dataclasses.
    import dataclasses

    names = {f.name for dc in (ModelArguments, DataTrainingArguments, TrainingArguments) for f in dataclasses.fields(dc)}
    assert set(data) == names
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_trainer_state_roundtrip_and_transformers_file(tmp_path):
    state = TrainerState(global_step=20, epoch=1.25, max_steps=40, num_train_epochs=2.0, logging_steps=5, eval_steps=10,
                         save_steps=10, train_batch_size=16, best_metric=3.5, best_model_checkpoint="checkpoints/ckpt-20")
    state.log_history.append({"step": 5, "epoch": 0.3125, "loss": 5.5, "learning_rate": 1e-4})
    state.log_history.append({"step": 10, "epoch": 0.625, "eval_loss": 4.0, "perplexity": 54.6})
    path = state.save(str(tmp_path / "trainer_state.json"))
    data = json.load(open(path))
    assert data["global_step"] == 20 and data["epoch"] == 1.25 and data["train_batch_size"] == 16
    assert data["log_history"][1]["eval_loss"] == 4.0 and data["is_world_process_zero"] is True
    assert TrainerState.load(path) == state
    # A transformers trainer_state.json with fields we do not model still loads.
    data["stateful_callbacks"] = {"TrainerControl": {}}
    data["trial_name"] = None
    (tmp_path / "hf.json").write_text(json.dumps(data))
    assert TrainerState.load(str(tmp_path / "hf.json")).global_step == 20


def test_all_results_are_merged(tmp_path):
    write_all_results(str(tmp_path), {"train_loss": 4.0, "train_runtime": 12.5})
    path = write_all_results(str(tmp_path), {"eval_loss": 3.0, "train_loss": 3.9})
    assert json.load(open(path)) == {"train_loss": 3.9, "train_runtime": 12.5, "eval_loss": 3.0}


def test_training_summary_has_every_key(tmp_path):
    import numpy as np

    assert read_training_summary(str(tmp_path)) is None
    summary = {
        "backend": "tensorflow", "accelerator": "TPU", "num_devices": 8, "num_replicas": 8, "global_step": np.int64(100),
        "eval_results": {"eval_loss": 2.0, "perplexity": float(np.exp(2.0)), "eval_accuracy": 0.4},
        "train_tokens_per_second": np.float32(1500.5), "mask_token": "<mask>", "extra": "kept",
    }
    write_training_summary(str(tmp_path), summary)
    back = read_training_summary(str(tmp_path))
    fields = [f.name for f in dataclasses.fields(TrainingSummary)]
    assert len(fields) == 37 and set(fields) <= set(back) and back["extra"] == "kept"
    assert back["base_model"] is None and back["dataset_name"] is None
    assert back["global_step"] == 100 and back["train_tokens_per_second"] == 1500.5
    assert back["eval_results"]["perplexity"] == pytest.approx(7.389056, rel=1e-6)


def test_loss_curve_png(tmp_path):
    import matplotlib.image

    history = [{"step": s, "loss": 6.0 - 0.1 * s, "learning_rate": 1e-4} for s in range(1, 30, 3)]
    history += [{"step": 10, "eval_loss": 5.0}, {"step": 20, "eval_loss": 4.2}, {"train_runtime": 3.0}]
    path = str(tmp_path / "plots" / "loss_curve.png")
    assert plot_loss_curve(history, path) == path
    raw = open(path, "rb").read()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.shape[0] == 400 and image.shape[1] == 640 and image.shape[2] in (3, 4)
    assert image[..., :3].std() > 0.01  # not a blank canvas


def test_no_plot_without_loss(tmp_path):
    path = str(tmp_path / "loss_curve.png")
    assert plot_loss_curve([], path) is None
    assert plot_loss_curve([{"step": 1, "learning_rate": 1e-4}, {"step": 2, "loss": float("nan")}], path) is None
    assert not (tmp_path / "loss_curve.png").exists()


def test_framework_versions_and_light_import():
    from importlib.metadata import version

    versions = framework_versions()
    assert versions["transformers"] == version("transformers")
    assert versions["tensorflow"] == version("tensorflow")
    assert versions["python"].count(".") == 2
    assert "not-a-package" not in versions
    # outputs.py must not pull TensorFlow, torch or matplotlib in at import time.
    code = (
        "import sys, hf_tpu_ext.outputs as o; o.framework_versions(); "
        "print([m for m in ('tensorflow', 'torch', 'matplotlib', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    assert outputs.LOSS_CURVE_NAME == "loss_curve.png"


def test_every_summary_field_has_its_own_docstring():
    """``training_summary.json``'s fields are documented where they are declared: one docstring per field."""
    tree = ast.parse(open(outputs.__file__, encoding="utf-8").read())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainingSummary").body
    undocumented = [node.target.id for node, after in zip(body, body[1:] + [None]) if isinstance(node, ast.AnnAssign)
                    and not (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant))]
    assert undocumented == [] and sum(isinstance(n, ast.AnnAssign) for n in body) == 37
