"""Tests of `hf-tpu prepare-data`: shards + manifest + tokenizer, read back identical."""

import json
import os
import re

import numpy as np
import pytest

from hf_tpu_ext.args import DataTrainingArguments


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """One prepare-data run on a small text file: (folder, stdout, argv pieces)."""
    from hf_tpu_ext.commands.prepare_data import main
    from hf_tpu_ext.data.corpus import default_corpus_texts

    root = tmp_path_factory.mktemp("prep")
    train_file = root / "train.txt"
    train_file.write_text("\n".join(default_corpus_texts()[:300]) + "\n")
    out = root / "shards"
    common = ["--train_file", str(train_file), "--cache_dir", str(root / "cache"), "--validation_split_percentage", "10"]
    argv = common + ["--vocab_size", "500", "--max_seq_length", "32", "--num_shards", "3", "--output_path", str(out), "--seed", "7",
                     "--num_proc", "1"]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return root, out, buf.getvalue(), common


def test_shards_match_the_blocks(prepared):
    from hf_tpu_ext.data.blocks import group_into_blocks
    from hf_tpu_ext.data.loading import is_tfrecord_source, load_text_datasets
    from hf_tpu_ext.data.tfrecord import read_tfrecord_blocks
    from hf_tpu_ext.data.tokenizer import load_tokenizer

    root, out, stdout, _ = prepared
    assert is_tfrecord_source(str(out))
    manifest_text = (out / "manifest.json").read_text()
    assert str(root) not in manifest_text  # no machine paths in the manifest
    manifest = json.loads(manifest_text)
    assert manifest["tokenizer"] == "tokenizer" and manifest["max_seq_length"] == 32
    assert manifest["source"] == "the file train.txt" and manifest["seed"] == 7 and manifest["vocab_size"] == 500

    tokenizer = load_tokenizer(str(out / manifest["tokenizer"]))
    assert len(tokenizer) == 500 and tokenizer.mask_token_id == 4
    raw = load_text_datasets(
        DataTrainingArguments(train_file=str(root / "train.txt"), validation_split_percentage=10, max_seq_length=32),
        seed=7,
        cache_dir=str(root / "cache"),
    )
    blocks = group_into_blocks(raw, tokenizer, 32)
    from hf_tpu_ext.data.sharding import permutation_order

    expected = {
        "train": blocks["train"][permutation_order(len(blocks["train"]), 7)],
        "validation": blocks["validation"],
    }
    for split in ("train", "validation"):
        entry = manifest["splits"][split]
        assert entry["num_blocks"] == len(blocks[split]) > 0
        assert entry["num_tokens"] == blocks.num_tokens[split]
        assert entry["files"] == [f"{split}-{i:05d}-of-00003.tfrecord" for i in range(3)]
        assert all((out / f).is_file() for f in entry["files"])
        ds, n, length = read_tfrecord_blocks(str(out), split)
        assert (n, length) == (len(blocks[split]), 32)
        np.testing.assert_array_equal(np.stack([x.numpy() for x in ds]), expected[split])
        assert f"{split}: {n} blocks of 32 tokens ({blocks.num_tokens[split]} tokens) in 3 file(s)" in stdout
    m = re.search(r"Tokenized (\d+) tokens in ([0-9.]+) s with 1 process\(es\) \(([0-9,]+) tokens/s\)", stdout)
    assert m and int(m.group(1)) == sum(blocks.num_tokens.values())
    seconds, rate = float(m.group(2)), int(m.group(3).replace(",", ""))
    # seconds are printed to 0.01 s: the rate must lie within what that rounding allows
    tokens = int(m.group(1))
    assert seconds > 0.005 and tokens / (seconds + 0.005) - 1 <= rate <= tokens / (seconds - 0.005) + 1


def test_num_proc_writes_the_same_bytes(prepared, tmp_path):
    """--num_proc 2 tokenizes in 2 processes and writes byte-identical shards and manifest."""
    import contextlib
    import io

    from hf_tpu_ext.commands.prepare_data import main

    root, out, _, common = prepared
    again = tmp_path / "np2"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(common + ["--tokenizer_name", str(out / "tokenizer"), "--max_seq_length", "32", "--num_shards", "3",
                              "--output_path", str(again), "--seed", "7", "--num_proc", "2"]) == 0
    assert "with 2 process(es)" in buf.getvalue()
    names = sorted(f for f in os.listdir(out) if f.endswith(".tfrecord") or f == "manifest.json")
    assert len(names) == 7 and sorted(f for f in os.listdir(again) if f != "tokenizer") == names
    for name in names:
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_num_proc_2_gives_the_ids_of_one_process_and_raises_a_bad_text(prepared):
    from tokenizers import Tokenizer

    from hf_tpu_ext.data.blocks import tokenize_texts

    _, out, _, _ = prepared
    tok = Tokenizer.from_file(str(out / "tokenizer" / "tokenizer.json"))
    texts = [f"line {i} of the text" for i in range(300)]
    one = tokenize_texts(texts, tok, num_proc=1, batch_size=7)
    assert one.dtype == np.int64 and one.size > 300 * 3
    np.testing.assert_array_equal(tokenize_texts(texts, tok, num_proc=2, batch_size=7), one)
    for bad in ([5] + texts, texts + [5]):  # in a worker's batch (front), then in this process's (back)
        with pytest.raises(TypeError):
            tokenize_texts(bad, tok, num_proc=2, batch_size=7)


def test_num_proc_defaults_to_the_usable_cores(monkeypatch):
    from hf_tpu_ext.commands.prepare_data import PrepareDataArguments
    from hf_tpu_ext.data.blocks import default_num_proc

    assert PrepareDataArguments(output_path="shards").num_proc is None  # resolved by default_num_proc() at run time
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert default_num_proc() == 3
    # a small corpus is not spread over every core: one process per 10,000 texts
    assert [default_num_proc(n) for n in (0, 300, 19_999, 20_000, 10 ** 6)] == [1, 1, 1, 2, 3]


def test_tokenizing_uses_one_tokenizer_thread_per_process_and_restores_the_setting(monkeypatch):
    from hf_tpu_ext.data import blocks

    seen = []
    monkeypatch.setattr(blocks, "_encode_chunk", lambda texts: seen.append(os.environ.get("TOKENIZERS_PARALLELISM"))
                        or np.arange(len(texts), dtype=np.int64))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    ids = blocks.tokenize_texts(["a", "b", "c"], object(), num_proc=1, batch_size=2)
    assert ids.tolist() == [0, 1, 0] and seen == ["false", "false"]
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


def test_text_of_a_split_selection_is_read_in_row_order():
    from datasets import Dataset

    from hf_tpu_ext.data.blocks import column_texts

    texts = [f"line {i}" for i in range(50)]
    split = Dataset.from_dict({"text": texts}).train_test_split(test_size=0.2, seed=3)
    for part in split.values():
        assert column_texts(part) == [row["text"] for row in part]
    assert sorted(column_texts(split["train"]) + column_texts(split["test"])) == sorted(texts)
    assert column_texts(Dataset.from_dict({"text": texts})) == texts


def test_serialized_examples_match_tensorflow():
    import tensorflow as tf

    from hf_tpu_ext.data.tfrecord import serialize_blocks

    rows = np.array([[0, 1, 127, 128, 300, 16383, 16384, 2 ** 21, 2 ** 31 - 1], [5] * 9], dtype=np.int32)
    for row, record in zip(rows, serialize_blocks(rows)):
        example = tf.train.Example(features=tf.train.Features(
            feature={"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=row.tolist()))}))
        assert record == example.SerializeToString()
    with pytest.raises(Exception, match="must be >= 0"):
        serialize_blocks(np.array([[-1]]))


def test_block_permutation_is_a_seeded_bijection():
    from hf_tpu_ext.data.sharding import permutation_order, permute, shard_of, shard_ranges

    for n in (1, 2, 5, 64, 1000, 4097):
        positions = permute(np.arange(n), n, 42)
        assert sorted(positions.tolist()) == list(range(n))
        np.testing.assert_array_equal(permutation_order(n, 42)[positions], np.arange(n))
        assert shard_ranges(n, 8) == tuple((int(a[0]), int(a[-1]) + 1) for a in np.array_split(np.arange(n), min(8, n)))
        assert [int(s) for s in shard_of(np.arange(n), n, 8)] == [
            i for i, a in enumerate(np.array_split(np.arange(n), min(8, n))) for _ in a]
    assert permute(np.arange(10), 10, 1).tolist() != permute(np.arange(10), 10, 2).tolist()
    assert permute([3], 1000, 7)[0] == permute(np.arange(1000), 1000, 7)[3]  # one block alone, same place
    with pytest.raises(ValueError, match=r"block indices must lie in \[0, 10\)"):
        permute([10], 10, 0)


def test_existing_output_needs_overwrite(prepared, capsys):
    from hf_tpu_ext.cli import main as cli_main
    from hf_tpu_ext.data.tfrecord import read_tfrecord_blocks

    root, out, _, common = prepared
    argv = ["prepare-data", *common, "--output_path", str(out), "--tokenizer_name", str(out / "tokenizer")]
    assert cli_main(argv + ["--max_seq_length", "16"]) == 1
    err = capsys.readouterr().err
    assert "already holds shards" in err and "--overwrite_output_path" in err
    # overwrite with another block size, a given tokenizer and a cap on training blocks
    assert cli_main(argv + ["--max_seq_length", "16", "--max_train_samples", "5", "--overwrite_output_path"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["max_seq_length"] == 16
    assert manifest["splits"]["train"]["num_blocks"] == 5 and manifest["splits"]["train"]["num_tokens"] == 80
    # default --num_shards 8, but never more files than blocks; the 3 old files are gone
    assert sorted(f for f in os.listdir(out) if f.startswith("train-")) == [f"train-{i:05d}-of-00005.tfrecord" for i in range(5)]
    assert len(manifest["splits"]["validation"]["files"]) == 8
    ds, n, length = read_tfrecord_blocks(str(out), "train")
    assert (n, length) == (5, 16) and len(list(ds)) == 5


def test_text_errors_reach_the_cli(prepared, capsys, tmp_path):
    from hf_tpu_ext.cli import main as cli_main

    _, out, _, _ = prepared
    missing = str(tmp_path / "missing.txt")
    assert cli_main(["prepare-data", "--train_file", missing, "--output_path", str(tmp_path / "o")]) == 1
    assert f"--train_file {missing} does not exist" in capsys.readouterr().err
    assert cli_main(["prepare-data", "--train_file", str(out), "--output_path", str(tmp_path / "o")]) == 1
    assert "already holds TFRecord shards" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_local_prepare_matches_the_beam_fixture(tmp_path):
    """The local command still writes tests/beam/data/expected, which the Beam pipeline's test compares against."""
    import sys
    from pathlib import Path

    beam_dir = Path(__file__).resolve().parent / "beam"
    sys.path.insert(0, str(beam_dir))
    try:
        from make_fixture import DATA, local_prepare
    finally:
        sys.path.remove(str(beam_dir))
    out = tmp_path / "local"
    local_prepare(DATA / "train.txt", out, DATA / "tokenizer")
    expected = sorted(os.listdir(DATA / "expected"))
    assert len(expected) == 7
    for name in expected:
        assert (out / name).read_bytes() == (DATA / "expected" / name).read_bytes(), (
            f"{name} differs: the shard layout changed; regenerate with `python tests/beam/make_fixture.py`")
