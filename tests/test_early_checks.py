"""A bad data file is refused right after parsing, before any framework is imported (issue 30 leftover 1)."""

import os
import subprocess
import sys

from conftest import REPO_ROOT

FRAMEWORKS = ("transformers", "tensorflow", "tf_keras", "keras", "jax", "torch", "datasets", "pyarrow")
_CODE = ("import sys; from hf_tpu_ext import cli; rc = cli.main(['train', '--output_dir', 'out', *sys.argv[1:]]); "
         "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in %r))" % (FRAMEWORKS,))


def _train(tmp_path, *args):
    return subprocess.run([sys.executable, "-c", _CODE, *args], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))


def test_missing_train_file_is_refused_before_the_frameworks_load(tmp_path):
    proc = _train(tmp_path, "--train_file", "missing.txt")
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == ("hf-tpu train: error: --train_file missing.txt does not exist; check the path (relative "
                           "paths start at the current folder).\n")
    assert not (tmp_path / "out").exists()  # nothing written: not even the run's lock


def test_compressed_validation_file_is_refused_before_the_frameworks_load(tmp_path):
    (tmp_path / "train.txt").write_text("one line of text\n")
    (tmp_path / "valid.txt").write_bytes(b"\x1f\x8b\x08\x00" + bytes(60))
    proc = _train(tmp_path, "--train_file", "train.txt", "--validation_file", "valid.txt")
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == ("hf-tpu train: error: --validation_file valid.txt is gzip-compressed, not text: unpack it "
                           "first (e.g. `gunzip -c IN > OUT`) and pass the text file.\n")


def test_resume_source_that_does_not_exist_is_refused_before_the_frameworks_load(tmp_path):
    (tmp_path / "train.txt").write_text("one line of text\n")
    proc = _train(tmp_path, "--train_file", "train.txt", "--resume_from_checkpoint", "/nope/checkpoint-5")
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == ("hf-tpu train: error: --resume_from_checkpoint '/nope/checkpoint-5' is neither a local "
                           "checkpoint/folder, 'true', nor a Hub repo id 'user/name[@revision]'.\n")
    assert not (tmp_path / "out").exists()
