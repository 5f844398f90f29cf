"""Disk full during a Keras checkpoint save (issue 31 item 8, the TensorFlow backend's test in test_run_folder.py):
one line naming the folder, the newest intact checkpoint and the resume command, exit 1, no torn folder left
(nothing half-written is taken as newest), and the same command with ``--resume_from_checkpoint true`` finishes.

A stand-in for ``ENOSPC``: safetensors' own error text (``SafetensorError: Error while serializing: IoError(Os {
code: 28, kind: StorageFull, message: "No space left on device" })``) raised by the write of checkpoint 6's
optimizer file, after its model file is on disk.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import json
import os
import shlex

import pytest

pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)


def _args(out):
    return ["--backend", "keras", "--output_dir", str(out),
            "--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2",
            "--intermediate_size", "64", "--vocab_size", "300", "--max_seq_length", "32",
            "--per_device_train_batch_size", "4", "--max_train_samples", "64", "--logging_steps", "3",
            "--max_steps", "6", "--save_steps", "3", "--eval_strategy", "no", "--seed", "7",
            "--disable_tqdm", "true"]


def test_disk_full_during_a_keras_save_is_one_line_and_the_intact_checkpoint_resumes(tmp_path, monkeypatch, capsys):
    from safetensors import SafetensorError

    from hf_tpu_ext.backends.keras import checkpoint as ckpt
    from hf_tpu_ext.cli import main

    out = tmp_path / "run"
    args = _args(out)
    save = ckpt._save_tensors
    seen = []

    def full_at_step_6(path, tensors, metadata):
        seen.append(os.path.basename(os.path.dirname(path)))
        if ".checkpoint-6.tmp-" in path and path.endswith(ckpt.OPTIMIZER_NAME):
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                  '"No space left on device" })')
        return save(path, tensors, metadata)

    monkeypatch.setattr(ckpt, "_save_tensors", full_at_step_6)
    capsys.readouterr()
    rc = main(["train", *args])
    err = capsys.readouterr().err
    assert rc == 1
    assert len(seen) == 4 and seen[-1].startswith(".checkpoint-6.tmp-")  # 3's two files, then 6's model file
    lines = [e for e in err.splitlines() if e.startswith("hf-tpu train: error:")]
    assert lines == [f"hf-tpu train: error: Writing to --output_dir {out} failed: No space left on device; the "
                     "newest intact checkpoint is checkpoint-3 (step 3). Free some space, then resume with: "
                     f"hf-tpu train {shlex.join(args)} --resume_from_checkpoint true"]
    assert "Traceback" not in err
    # the torn save is gone whole: no temporary folder, no checkpoint-6; checkpoint-3 is what a resume takes
    assert sorted(n for n in os.listdir(out) if "checkpoint" in n) == ["checkpoint-3"]
    assert ckpt.find_checkpoints(str(out)) == [str(out / "checkpoint-3")]
    summary = json.loads((out / "training_summary.json").read_text()) if (out / "training_summary.json").exists() \
        else {}
    assert summary.get("global_step") != 6  # nothing claims the step that was not saved

    monkeypatch.setattr(ckpt, "_save_tensors", save)  # space again
    assert main(["train", *args, "--resume_from_checkpoint", "true"]) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [3, 6]
    assert sorted(n for n in os.listdir(out) if "checkpoint" in n) == ["checkpoint-3", "checkpoint-6"]
