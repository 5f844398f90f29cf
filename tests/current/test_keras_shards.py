"""`hf-tpu train --backend keras` on `hf-tpu prepare-data --shard_format arrow` shards (no TensorFlow).

A process reads only its rows of each global batch from the shards, and the position is the global step: a run
killed after a checkpoint and resumed trains what an uninterrupted run trains, and 2 processes x 2 devices train
what 1 process x 4 devices trains (losses to 1e-5), from the same shards. Shards of another sequence length are
refused in one line before anything is written. (The token ids of those batches: tests/test_prepare_data_arrow.py.)

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import contextlib
import io
import json
import os

import numpy as np
import pytest

pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

from test_keras_multiprocess import STEPS, _losses, _start, _weights, finish, mp_args, start_cluster  # noqa: E402


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Arrow shards of 32-token blocks of the embedded corpus (a byte-level BPE of 300 tokens)."""
    from hf_tpu_ext.commands.prepare_data import main
    from hf_tpu_ext.data.corpus import default_corpus_texts

    root = tmp_path_factory.mktemp("shards")
    (root / "train.txt").write_text("\n".join(default_corpus_texts()) + "\n")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["--train_file", str(root / "train.txt"), "--vocab_size", "300", "--max_seq_length", "32",
                     "--num_shards", "2", "--num_proc", "1", "--shard_format", "arrow", "--seed", "7",
                     "--cache_dir", str(root / "cache"), "--output_path", str(root / "arrow")]) == 0
    return root / "arrow"


@pytest.fixture(scope="module")
def runs(shards, tmp_path_factory):
    """From the shards: 1 process x 4 devices (the reference) beside 2 processes x 2 devices, then 1 process x 4
    devices SIGKILLed right after its first checkpoint (step 4). (Not all four at once: on a loaded machine the
    pair's gloo connect can time out.)"""
    root = tmp_path_factory.mktemp("runs")
    one = _start(mp_args(root / "one", "--train_file", shards, "--save_steps", "4"), JAX_NUM_CPU_DEVICES=4)
    pair = start_cluster([root / "p0", root / "p1"], extra=("--train_file", shards))
    first = finish([one, *pair])
    cut = _start(mp_args(root / "cut", "--train_file", shards, "--save_steps", "4"), JAX_NUM_CPU_DEVICES=4,
                 HF_TPU_EXT_TEST_KILL_AT="train")
    return root, first[:1] + finish([cut]) + first[1:]


def test_two_processes_read_their_rows_of_the_shards_and_train_what_one_does(runs):
    root, results = runs
    for rc, err in results[:1] + results[2:]:
        assert rc == 0, err[-3000:]
    assert "4 cpu device(s) in 2 process(es)" in results[2][1]
    ours, ref = _losses(root / "p0"), _losses(root / "one")
    assert [s for s, _ in ours] == list(range(1, STEPS + 1)) == [s for s, _ in ref]
    np.testing.assert_allclose([l for _, l in ours], [l for _, l in ref], atol=1e-5, rtol=0)
    assert not (root / "p1").exists()


def test_a_kill_and_resume_from_shards_trains_what_one_run_does(runs, shards):
    root, results = runs
    assert results[0][0] == 0, results[0][1][-3000:]
    assert results[1][0] == -9, results[1][1][-3000:]
    assert sorted(p.name for p in (root / "cut").glob("checkpoint-*")) == ["checkpoint-4"]
    resumed = _start(mp_args(root / "cut", "--train_file", shards, "--save_steps", "4",
                             "--resume_from_checkpoint", "true"), JAX_NUM_CPU_DEVICES=4)
    [(rc, err)] = finish([resumed])
    assert rc == 0, err[-3000:]
    assert "resuming from" in err and "checkpoint-4" in err
    ours, ref = _losses(root / "cut"), _losses(root / "one")
    assert [s for s, _ in ours] == list(range(1, STEPS + 1)) == [s for s, _ in ref]
    np.testing.assert_allclose([l for _, l in ours], [l for _, l in ref], atol=1e-5, rtol=0)
    for name, value in _weights(root / "one").items():
        np.testing.assert_allclose(_weights(root / "cut")[name], value, atol=1e-5, rtol=0, err_msg=name)
    summary = json.loads((root / "one" / "training_summary.json").read_text())
    assert summary["global_step"] == STEPS


def test_shards_of_another_length_are_one_line_before_anything_is_written(shards, tmp_path, capsys):
    from hf_tpu_ext.cli import main

    out = tmp_path / "never"
    argv = mp_args(out, "--train_file", str(shards))
    argv[argv.index("--max_seq_length") + 1] = "64"
    assert main(["train", *map(str, argv)]) == 1
    err = capsys.readouterr().err
    assert (f"The block shards in {shards} hold blocks of 32 tokens but --max_seq_length is 64; pass "
            "--max_seq_length 32 or prepare the shards again.") in err
    assert not out.exists()
