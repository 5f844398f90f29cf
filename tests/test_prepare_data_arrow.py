"""`hf-tpu prepare-data --shard_format arrow`: Arrow block shards read row by row without TensorFlow.

The shards hold the blocks TFRecord shards hold (same seeded order), local or at an fsspec URL (``memory://``);
a reader fetches only the record batches of the rows asked for; the manifest's tokenizer fingerprint and sequence
length refuse another tokenizer or ``--max_seq_length`` in one line; the batches one process builds from the
shards are the in-memory blocks' batches, and two processes' rows put side by side are one process's batch.
"""

import contextlib
import io
import json

import numpy as np
import pytest

from hf_tpu_ext.args import DataTrainingArguments


def _prepare(argv):
    from hf_tpu_ext.commands.prepare_data import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return buf.getvalue()


@pytest.fixture(scope="module")
def arrow(tmp_path_factory):
    """One arrow prepare-data run on a small text file: (root, shard folder, stdout, argv pieces)."""
    from hf_tpu_ext.data.corpus import default_corpus_texts

    root = tmp_path_factory.mktemp("arrow")
    (root / "train.txt").write_text("\n".join(default_corpus_texts()[:300]) + "\n")
    common = ["--train_file", str(root / "train.txt"), "--cache_dir", str(root / "cache"),
              "--validation_split_percentage", "10", "--vocab_size", "500", "--seed", "7", "--num_proc", "1",
              "--shard_format", "arrow"]
    out = root / "shards"
    stdout = _prepare(common + ["--max_seq_length", "32", "--num_shards", "3", "--output_path", str(out)])
    return root, out, stdout, common


def _expected_blocks(root, out):
    from hf_tpu_ext.data.blocks import group_into_blocks
    from hf_tpu_ext.data.loading import load_text_datasets
    from hf_tpu_ext.data.sharding import permutation_order
    from hf_tpu_ext.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(out / "tokenizer"))
    raw = load_text_datasets(DataTrainingArguments(train_file=str(root / "train.txt"), validation_split_percentage=10,
                                                   max_seq_length=32), seed=7, cache_dir=str(root / "cache"))
    blocks = group_into_blocks(raw, tokenizer, 32)
    return tokenizer, blocks, {"train": blocks["train"][permutation_order(len(blocks["train"]), 7)],
                               "validation": blocks["validation"]}


def test_arrow_shards_hold_the_blocks_locally_and_at_a_url(arrow):
    from hf_tpu_ext.data.block_shards import FORMAT, is_arrow_source, load_split, read_manifest, tokenizer_fingerprint
    from hf_tpu_ext.data.loading import check_data_file, is_tfrecord_source

    root, out, stdout, common = arrow
    tokenizer, blocks, expected = _expected_blocks(root, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert str(root) not in json.dumps(manifest)  # no machine paths
    assert (manifest["format"], manifest["max_seq_length"], manifest["tokenizer"]) == (FORMAT, 32, "tokenizer")
    assert manifest["tokenizer_sha256"] == tokenizer_fingerprint(tokenizer)
    assert is_arrow_source(str(out)) and not is_tfrecord_source(str(out)) and check_data_file(str(out)) == "arrow"
    url = "memory://h5-shards/corpus"
    _prepare(common + ["--max_seq_length", "32", "--num_shards", "2", "--output_path", url])
    for path, files in ((str(out), 3), (f"file://{out}", 3), (url, 2)):
        manifest = read_manifest(path)
        for split in ("train", "validation"):
            entry = manifest["splits"][split]
            assert entry["num_tokens"] == blocks.num_tokens[split]
            names = [f"{split}-{i:05d}-of-{files:05d}.arrow" for i in range(files)]
            assert [f["name"] for f in entry["files"]] == names
            shards = load_split(path, split, manifest)
            assert shards.shape == expected[split].shape
            np.testing.assert_array_equal(np.asarray(shards), expected[split])
            rows = np.array([len(expected[split]) - 1, 0, 3, 3])
            np.testing.assert_array_equal(shards[rows], expected[split][rows])
        if path == str(out):
            assert f"train: {len(expected['train'])} blocks of 32 tokens ({blocks.num_tokens['train']} tokens) in 3 " \
                   "file(s)" in stdout


def test_a_read_fetches_only_the_record_batches_of_its_rows(monkeypatch):
    from hf_tpu_ext.data import block_shards
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    monkeypatch.setattr(block_shards, "ROWS_PER_BATCH", 4)
    blocks = np.arange(30 * 6, dtype=np.int32).reshape(30, 6)
    url, manifest = "memory://h5-rows/set", {}
    block_shards.write_split(blocks, url, "train", 2, manifest)  # files of 15 rows: batches of 4, 4, 4, 3
    tokenizer = train_bpe_tokenizer(["a few words of text"] * 20, vocab_size=300, model_max_length=6)
    block_shards.write_manifest(url, manifest, tokenizer, "tokenizer")
    shards = block_shards.load_split(url, "train", block_shards.read_manifest(url))
    fetched = []
    original = block_shards.ShardBlocks._batch_rows
    monkeypatch.setattr(block_shards.ShardBlocks, "_batch_rows",
                        lambda self, f, b: fetched.append((f, b)) or original(self, f, b))
    rows = np.array([17, 1, 15, 29, 2, 16])
    np.testing.assert_array_equal(shards[rows], blocks[rows])
    assert sorted(fetched) == [(0, 0), (1, 0), (1, 3)]  # rows 1, 2 | 15, 16, 17 | 29: one read per record batch
    assert shards.limit(10).shape == (10, 6)
    with pytest.raises(IndexError, match="rows 10..10 outside the 10 blocks of memory://h5-rows/set"):
        shards[np.array([10])]


def test_shards_of_another_tokenizer_or_length_are_refused_in_one_line(arrow, tmp_path):
    from hf_tpu_ext.data.run_data import load_shard_blocks
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer
    from hf_tpu_ext.errors import DataError

    root, out, _, _ = arrow
    model_args = type("M", (), {"tokenizer_name": None, "model_name_or_path": None})()
    tok, blocks, source = load_shard_blocks(model_args, DataTrainingArguments(train_file=str(out), max_seq_length=32))
    assert (blocks["train"].shape, blocks["validation"].shape[1], source) == ((606, 32), 32, "the file train.txt")
    with pytest.raises(DataError) as err:
        load_shard_blocks(model_args, DataTrainingArguments(train_file=str(out), max_seq_length=64))
    assert str(err.value) == (f"The block shards in {out} hold blocks of 32 tokens but --max_seq_length is 64; pass "
                              "--max_seq_length 32 or prepare the shards again.")
    other = train_bpe_tokenizer(["another corpus entirely, other merges"] * 50, vocab_size=400, model_max_length=32)
    other.save_pretrained(str(tmp_path / "other"))
    model_args.tokenizer_name = str(tmp_path / "other")
    with pytest.raises(DataError) as err:
        load_shard_blocks(model_args, DataTrainingArguments(train_file=str(out), max_seq_length=32))
    message = str(err.value)
    assert message.startswith(f"The block shards in {out} were tokenized with another tokenizer (sha256 ")
    assert message.endswith(f"); drop --tokenizer_name to use {out}/tokenizer, or prepare the shards with this one.")
    assert "\n" not in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"has no manifest.json; it is not a folder written by `hf-tpu prepare-data`"):
        load_shard_blocks(model_args, DataTrainingArguments(train_file=str(tmp_path / "empty"), max_seq_length=32))


def test_batches_from_shards_are_the_in_memory_batches_for_one_and_two_processes(arrow):
    from hf_tpu_ext.data.block_shards import load_split, read_manifest
    from hf_tpu_ext.data.numpy_batches import NumpyMasker, TrainBatches

    root, out, _, _ = arrow
    tokenizer, _, expected = _expected_blocks(root, out)
    shards = load_split(str(out), "train", read_manifest(str(out)))
    masker = NumpyMasker.for_tokenizer(tokenizer, 5)
    memory, disk = TrainBatches(expected["train"], 16, 7, masker), TrainBatches(shards, 16, 7, masker)
    halves = [TrainBatches(shards, 16, 7, masker, rows=np.arange(8) + 8 * p) for p in (0, 1)]
    for step in (0, 1, 37, 38):  # 37 steps per epoch: 37 and 38 are in epoch 1
        want = memory(step)
        np.testing.assert_array_equal(disk(step)["input_ids"], want["input_ids"])
        np.testing.assert_array_equal(np.concatenate([h(step)["input_ids"] for h in halves]), want["input_ids"])
        np.testing.assert_array_equal(want["masked_lm_ids"] * want["masked_lm_weights"].astype(np.int32),
                                      np.take_along_axis(expected["train"][memory.block_indices(step)],
                                                         want["masked_lm_positions"], 1)
                                      * want["masked_lm_weights"].astype(np.int32))


def test_prepare_data_refuses_shards_as_text_and_existing_arrow_output(arrow, capsys, tmp_path):
    from hf_tpu_ext.cli import main as cli_main

    _, out, _, common = arrow
    assert cli_main(["prepare-data", "--train_file", str(out), "--shard_format", "arrow",
                     "--output_path", str(tmp_path / "o")]) == 1
    assert f"--train_file {out} already holds Arrow block shards; give text data to prepare." in capsys.readouterr().err
    assert cli_main(["prepare-data", *common, "--output_path", str(out)]) == 1
    assert "already holds shards (manifest.json); pass --overwrite_output_path" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_backend_that_does_not_read_arrow_shards_refuses_them_in_one_line(arrow):
    from types import SimpleNamespace

    from hf_tpu_ext.errors import DataError
    from hf_tpu_ext.run.data import load_blocks

    _, out, _, _ = arrow
    backend = SimpleNamespace(name="tensorflow", supports_tfrecord=True, needs_remote_data=False)
    with pytest.raises(DataError) as err:
        load_blocks(None, DataTrainingArguments(train_file=str(out), max_seq_length=32), None, backend, None)
    assert str(err.value) == (f"{out} holds Arrow block shards, which --backend tensorflow does not read; use "
                              "--backend keras, or `hf-tpu prepare-data --shard_format tfrecord` for TensorFlow.")
