"""The Apache Beam prepare-data pipeline (DirectRunner) writes the local command's shards and manifest, byte for byte.

Runs in the Beam environment (``scripts/test_env_beam.sh``: ``.venv-beam`` with ``.[beam]``, no TensorFlow);
skipped where apache_beam is not installed. The expected bytes are ``data/expected``, which
``tests/test_prepare_data.py::test_local_prepare_matches_the_beam_fixture`` checks the local command still writes.
"""

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("apache_beam")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from make_fixture import DATA, FLAGS  # noqa: E402


def _run(argv):
    from hf_tpu_ext.data.beam_prepare import main

    return main(argv + ["--", "--runner", "DirectRunner", "--direct_num_workers", "1"])


def test_beam_shards_are_byte_identical_to_local(tmp_path):
    out = tmp_path / "beam"
    assert _run(["--train_file", str(DATA / "train.txt"), "--tokenizer_name", str(DATA / "tokenizer"),
                 "--output_path", str(out), *FLAGS]) == 0
    expected = sorted(os.listdir(DATA / "expected"))
    assert len(expected) == 7  # manifest + 3 train + 3 validation shards
    assert sorted(f for f in os.listdir(out) if f != "tokenizer") == expected
    for name in expected:
        assert (out / name).read_bytes() == (DATA / "expected" / name).read_bytes(), name
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == (DATA / "tokenizer" / "tokenizer.json").read_bytes()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["num_blocks"] == 606 and manifest["source"] == "the file train.txt"


def test_beam_refuses_an_existing_output(tmp_path):
    from hf_tpu_ext.errors import OutputDirError

    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(OutputDirError, match="already holds shards"):
        _run(["--train_file", str(DATA / "train.txt"), "--tokenizer_name", str(DATA / "tokenizer"),
              "--output_path", str(tmp_path)])


def test_beam_cap_and_validation_file(tmp_path):
    """--max_train_samples keeps the first positions of the same order; a validation file is read in order."""
    from hf_tpu_ext.data.sharding import permutation_order  # noqa: F401  (pure numpy: importable without TF)

    out = tmp_path / "cap"
    assert _run(["--train_file", str(DATA / "train.txt"), "--validation_file", str(DATA / "train.txt"),
                 "--tokenizer_name", str(DATA / "tokenizer"), "--output_path", str(out), "--max_seq_length", "32",
                 "--num_shards", "2", "--seed", "7", "--max_train_samples", "5"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"] == {"num_blocks": 5, "num_tokens": 160,
                                           "files": ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]}
    assert manifest["splits"]["validation"]["num_blocks"] == (19418 + 2427) // 32  # the whole file, in order
    assert manifest["source"] == "the file train.txt (validation: train.txt)"
