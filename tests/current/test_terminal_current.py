"""What ``hf-tpu`` prints in the current stack (transformers 5) without torch: no "PyTorch was not found" notice
before our own line (``--log_level info`` brings it back), and the run's last line saying where the model is.

Run: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q tests/current/test_terminal_current.py``.
"""

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT

MISSING_FILE_LINE = ("hf-tpu train: error: --train_file missing.txt does not exist; check the path (relative paths "
                     "start at the current folder).")
# the console script without torch (as in a `.[jax,demo]` venv): the import finds torch absent
WITHOUT_TORCH = ('import sys; sys.modules["torch"] = None; from hf_tpu_ext.cli import main; '
                 'sys.argv = ["hf-tpu", *sys.argv[1:]]; sys.exit(main())')


def _hf_tpu(args, cwd):
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(REPO_ROOT))
    env.pop("TRANSFORMERS_NO_ADVISORY_WARNINGS", None)
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


def test_missing_train_file_is_one_line_without_torch(tmp_path):
    proc = _hf_tpu(["train", "--train_file", "missing.txt"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [MISSING_FILE_LINE]
    # refused before transformers is imported: no notice even with --log_level info
    proc = _hf_tpu(["train", "--train_file", "missing.txt", "--log_level", "info"], tmp_path)
    assert proc.stderr.splitlines() == [MISSING_FILE_LINE]


def test_import_notice_only_with_log_level_info(tmp_path):
    # an existing file gets past the early checks, so transformers is imported before the run stops on an error
    (tmp_path / "train.txt").write_text("hello world\nfoo bar\n")
    (tmp_path / "empty-tokenizer").mkdir()  # a local folder passes the early reference check
    args = ["train", "--train_file", "train.txt", "--tokenizer_name", "empty-tokenizer",
            "--output_dir", "out"]
    quiet, verbose = _hf_tpu(args, tmp_path), _hf_tpu([*args, "--log_level", "info"], tmp_path)
    assert quiet.returncode == verbose.returncode == 1
    assert "PyTorch was not found" not in quiet.stderr and "PyTorch was not found" in verbose.stderr
    assert quiet.stderr.splitlines()[-1].startswith("hf-tpu train: error: ")


def test_saved_line_names_the_folder_its_files_and_the_push(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from hf_tpu_ext.commands.train import saved_line

    out = tmp_path / "out"
    out.mkdir()
    assert saved_line(str(out)) == ""  # no config.json: nothing to announce
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md"):
        (out / name).write_text("{}")
    assert saved_line(str(out)) == (f"model saved to {out}: model.safetensors, config.json, tokenizer, "
                                    "model card README.md")
    monkeypatch.setattr(constants, "ENDPOINT", "https://huggingface.co")
    (out / "training_summary.json").write_text(json.dumps(
        {"hub_pushes": {"repo_id": "alice/tiny", "revision": "main", "final_pushed": True}}))
    assert saved_line(str(out)).endswith("model card README.md; pushed to https://huggingface.co/alice/tiny")
    (out / "training_summary.json").write_text(json.dumps(
        {"hub_pushes": {"repo_id": "alice/tiny", "revision": "main", "final_pushed": False}}))
    assert saved_line(str(out)).endswith("model card README.md")
