"""Tests of the data layer: corpus, loading, tokenizer, blocks, masking, TFRecords and tf.data pipelines."""

import functools
import json
import os

import numpy as np
import pytest

from hf_tpu_ext.args import DataTrainingArguments
from hf_tpu_ext.errors import (
    CorpusTooSmallError,
    DataError,
    DataFileNotFoundError,
    TokenizerError,
)

L = 32
SPECIAL = [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def corpus():
    from hf_tpu_ext.data.corpus import default_corpus_texts

    return default_corpus_texts()


@pytest.fixture(scope="session")
def small_texts(corpus):
    return corpus[:400]


@pytest.fixture(scope="session")
def tokenizer(small_texts):
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    return train_bpe_tokenizer(small_texts, vocab_size=500, model_max_length=L)


@pytest.fixture(scope="session")
def tf():
    import tensorflow

    return tensorflow


@pytest.fixture(scope="session")
def mask_fn(tf):
    from hf_tpu_ext.data.masking import mask_tokens

    return functools.partial(
        mask_tokens, mask_token_id=4, vocab_size=500, special_token_ids=SPECIAL, max_predictions=5, pad_token_id=1
    )


def identity_mask_fn(input_ids, seed):
    """A mask_fn that shows which blocks and seed a batch got."""
    return {"input_ids": input_ids, "seed": seed}


def numbered_blocks(n, length=8):
    """Blocks whose token 0 is the block number (+5), the rest arbitrary non-special ids."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(5, 500, size=(n, length)).astype(np.int32)
    blocks[:, 0] = np.arange(n) + 5
    return blocks


def texts(dataset):
    return list(dataset["text"])


def materialize(dataset, k=None):
    ds = dataset.take(k) if k is not None else dataset
    return [{key: v.numpy() for key, v in b.items()} for b in ds]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


# ---------------------------------------------------------------- corpus


def test_default_corpus_is_nonempty_and_deterministic(corpus):
    from hf_tpu_ext.data.corpus import DEFAULT_CORPUS_DESCRIPTION, default_corpus_texts

    assert len(corpus) > 1000
    assert sum(map(len, corpus)) > 300_000
    assert all(t and t == t.strip() and "\n" not in t for t in corpus)
    assert default_corpus_texts() == corpus
    assert "pydoc_data.topics" in DEFAULT_CORPUS_DESCRIPTION
    import sys

    assert f"{sys.version_info.major}.{sys.version_info.minor}" in DEFAULT_CORPUS_DESCRIPTION


def test_default_corpus_split_is_seeded(corpus):
    from hf_tpu_ext.data.loading import load_text_datasets

    args = DataTrainingArguments(validation_split_percentage=10)
    a = load_text_datasets(args, seed=1)
    b = load_text_datasets(args, seed=1)
    c = load_text_datasets(args, seed=2)
    assert set(a) == {"train", "validation"}
    assert a["train"].column_names == ["text"] and a["validation"].column_names == ["text"]
    assert len(a["train"]) + len(a["validation"]) == len(corpus)
    assert len(a["validation"]) == int(np.ceil(0.1 * len(corpus)))
    assert sorted(texts(a["train"]) + texts(a["validation"])) == sorted(corpus)
    assert texts(a["validation"]) == texts(b["validation"])
    assert texts(a["validation"]) != texts(c["validation"])
    # no hold-out asked: everything trains, validation is empty
    d = load_text_datasets(DataTrainingArguments(validation_split_percentage=0), seed=1)
    assert len(d["train"]) == len(corpus) and len(d["validation"]) == 0


# ---------------------------------------------------------------- loading files


def _write(path, fmt, texts, column="text"):
    import pandas as pd

    if fmt == "txt":
        path.write_text("\n".join(texts) + "\n\n")  # trailing empty lines are dropped
    elif fmt == "json":
        path.write_text(json.dumps([{column: t, "n": i} for i, t in enumerate(texts)]))
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({column: t, "n": i}) + "\n" for i, t in enumerate(texts)))
    elif fmt == "csv":
        pd.DataFrame({"n": range(len(texts)), column: texts}).to_csv(path, index=False)
    elif fmt == "parquet":
        pd.DataFrame({"n": range(len(texts)), column: texts}).to_parquet(path)
    return str(path)


@pytest.mark.parametrize("fmt", ["txt", "json", "jsonl", "csv", "parquet"])
def test_each_file_format_loads(tmp_path, small_texts, fmt):
    from hf_tpu_ext.data.loading import load_text_datasets

    train = [t.replace("\n", " ") for t in small_texts[:40]]
    val = [t.replace("\n", " ") for t in small_texts[40:50]]
    args = DataTrainingArguments(
        train_file=_write(tmp_path / f"train.{fmt}", fmt, train),
        validation_file=_write(tmp_path / f"val.{fmt}", fmt, val),
    )
    raw = load_text_datasets(args, seed=0, cache_dir=str(tmp_path / "cache"))
    assert texts(raw["train"]) == train
    assert texts(raw["validation"]) == val
    assert raw["train"].column_names == ["text"]


def test_hold_out_from_train_file_and_other_text_column(tmp_path, small_texts):
    from hf_tpu_ext.data.loading import load_text_datasets

    rows = small_texts[:40]
    path = _write(tmp_path / "t.csv", "csv", rows, column="body")  # columns: n (int), body (str)
    raw = load_text_datasets(DataTrainingArguments(train_file=path, validation_split_percentage=25), seed=0, cache_dir=str(tmp_path / "c"))
    assert len(raw["validation"]) == 10 and len(raw["train"]) == 30
    assert sorted(texts(raw["train"]) + texts(raw["validation"])) == sorted(rows)
    raw = load_text_datasets(DataTrainingArguments(train_file=path, text_column_name="body"), seed=0, cache_dir=str(tmp_path / "c"))
    assert raw["train"].column_names == ["text"]


def test_missing_file_names_the_path(tmp_path):
    from hf_tpu_ext.data.loading import load_text_datasets

    missing = str(tmp_path / "nope.txt")
    with pytest.raises(DataFileNotFoundError) as err:
        load_text_datasets(DataTrainingArguments(train_file=missing), seed=0)
    assert missing in str(err.value) and "does not exist" in str(err.value)
    assert isinstance(err.value, FileNotFoundError)


def test_unsupported_extension_lists_supported(tmp_path):
    from hf_tpu_ext.data.loading import load_text_datasets

    bad = tmp_path / "data.xml"
    bad.write_text("<a>text</a>")
    with pytest.raises(DataError) as err:
        load_text_datasets(DataTrainingArguments(train_file=str(bad)), seed=0)
    msg = str(err.value)
    assert "'.xml'" in msg
    for ext in (".csv", ".json", ".jsonl", ".parquet", ".txt"):
        assert ext in msg


def test_empty_and_unreadable_files(tmp_path):
    from hf_tpu_ext.data.loading import load_text_datasets

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="is empty"):
        load_text_datasets(DataTrainingArguments(train_file=str(empty)), seed=0)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    with pytest.raises(DataError, match="no non-empty text"):
        load_text_datasets(DataTrainingArguments(train_file=str(blank)), seed=0, cache_dir=str(tmp_path / "c"))
    broken = tmp_path / "broken.json"
    broken.write_text('{"text": "a"')
    with pytest.raises(DataError, match=r"could not be read as json data.*supported extensions: \.csv"):
        load_text_datasets(DataTrainingArguments(train_file=str(broken)), seed=0, cache_dir=str(tmp_path / "c"))


def test_text_column_errors_list_the_columns(tmp_path):
    import pandas as pd

    from hf_tpu_ext.data.loading import load_text_datasets

    path = _write(tmp_path / "t.jsonl", "jsonl", ["a b c", "d e f"], column="body")
    with pytest.raises(DataError) as err:
        load_text_datasets(DataTrainingArguments(train_file=path, text_column_name="content"), seed=0, cache_dir=str(tmp_path / "c"))
    assert "'content' does not exist" in str(err.value)
    assert "body (string)" in str(err.value) and "n (int64)" in str(err.value)
    numbers = tmp_path / "numbers.parquet"
    pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]}).to_parquet(numbers)
    with pytest.raises(DataError) as err:
        load_text_datasets(DataTrainingArguments(train_file=str(numbers)), seed=0, cache_dir=str(tmp_path / "c"))
    assert "no string column" in str(err.value) and "a (int64), b (float64)" in str(err.value)
    assert "--text_column_name" in str(err.value)


def test_hub_dataset_offline_is_a_data_error(monkeypatch, tmp_path):
    import datasets
    import huggingface_hub

    from hf_tpu_ext.data.loading import load_text_datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as err:
        load_text_datasets(DataTrainingArguments(dataset_name="someone/not-cached"), seed=0, cache_dir=str(tmp_path / "c"))
    assert "'someone/not-cached'" in str(err.value) and "local cache" in str(err.value) and "--train_file" in str(err.value)


def test_tfrecord_folder_detection(tmp_path):
    from hf_tpu_ext.data.loading import describe_data_source, is_tfrecord_source, load_text_datasets

    folder = tmp_path / "shards"
    folder.mkdir()
    assert not is_tfrecord_source(str(folder)) and not is_tfrecord_source(None)
    (folder / "manifest.json").write_text("{}")
    assert is_tfrecord_source(str(folder))
    assert not is_tfrecord_source(str(folder / "manifest.json"))
    with pytest.raises(DataError, match="TFRecord shards"):
        load_text_datasets(DataTrainingArguments(train_file=str(folder)), seed=0)
    assert describe_data_source(DataTrainingArguments(train_file=str(tmp_path / "a.txt"))) == "the file a.txt"
    assert describe_data_source(DataTrainingArguments(dataset_name="w", dataset_config_name="c")) == "the Hub dataset w (c)"


# ---------------------------------------------------------------- tokenizer


def test_trained_tokenizer_round_trip(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    assert len(tokenizer) == 500
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")] == [0, 1, 2, 3, 4]
    tokenizer.save_pretrained(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert type(loaded).__name__ == "RobertaTokenizerFast"
    assert loaded.model_max_length == L
    assert (loaded.bos_token_id, loaded.pad_token_id, loaded.eos_token_id, loaded.unk_token_id, loaded.mask_token_id) == (0, 1, 2, 3, 4)
    ids = loaded("Hello <mask>!")["input_ids"]
    assert ids[0] == 0 and ids[-1] == 2 and ids.count(4) == 1
    # lstrip: the space before <mask> belongs to the mask token, not to a separate "Ġ" token
    tokens = loaded.convert_ids_to_tokens(ids)
    assert tokens[tokens.index("<mask>") - 1] != "Ġ"
    text = "The assert statement is a convenient way."
    assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_tokenizer_without_mask_token_is_rejected(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from hf_tpu_ext.data.tokenizer import check_mlm_tokenizer, load_tokenizer

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    plain = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    with pytest.raises(TokenizerError) as err:
        check_mlm_tokenizer(plain)
    assert "no mask token" in str(err.value) and "omit --tokenizer_name" in str(err.value)
    plain.save_pretrained(tmp_path / "plain")
    with pytest.raises(TokenizerError, match="no mask token"):
        check_mlm_tokenizer(load_tokenizer(str(tmp_path / "plain")))
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(str(tmp_path / "does-not-exist"))
    assert "does-not-exist" in str(err.value) and "omit --tokenizer_name" in str(err.value)


def test_prepare_tokenizer_loads_or_trains(tokenizer, small_texts, tmp_path):
    from hf_tpu_ext.args import ModelArguments
    from hf_tpu_ext.data.tokenizer import prepare_tokenizer

    tokenizer.save_pretrained(tmp_path / "tok")
    loaded = prepare_tokenizer(ModelArguments(tokenizer_name=str(tmp_path / "tok")), [], 16)
    assert loaded.get_vocab() == tokenizer.get_vocab()
    trained = prepare_tokenizer(ModelArguments(vocab_size=400), small_texts[:100], 16)
    assert len(trained) == 400 and trained.mask_token_id == 4 and trained.model_max_length == 16


# ---------------------------------------------------------------- blocks


def test_blocks_shape_and_remainder(tokenizer, small_texts):
    from datasets import Dataset, DatasetDict

    from hf_tpu_ext.data.blocks import group_into_blocks

    raw = DatasetDict({"train": Dataset.from_dict({"text": small_texts[:60]}), "validation": Dataset.from_dict({"text": small_texts[60:63]})})
    blocks = group_into_blocks(raw, tokenizer, L)
    for split in ("train", "validation"):
        flat = [i for t in texts(raw[split]) for i in tokenizer(t)["input_ids"]]
        n = len(flat) // L
        assert blocks[split].dtype == np.int32 and blocks[split].shape == (n, L)
        np.testing.assert_array_equal(blocks[split].reshape(-1), np.array(flat[: n * L], dtype=np.int32))
        assert blocks.num_tokens[split] == len(flat)
    assert len(texts(raw["train"])) and blocks["train"][0, 0] == 0  # each document starts with <s>
    assert (blocks["train"] == 2).sum() >= 10  # and ends with </s>
    # a split shorter than one block gives [0, L]
    tiny = group_into_blocks(DatasetDict({"train": Dataset.from_dict({"text": ["a b"]})}), tokenizer, L)
    assert tiny["train"].shape == (0, L) and tiny.num_tokens["train"] == len(tokenizer("a b")["input_ids"])


def test_check_blocks_message_gives_sizes(tokenizer):
    from hf_tpu_ext.data.blocks import Blocks, check_blocks

    blocks = Blocks({"train": np.zeros((3, L), np.int32), "validation": np.zeros((0, L), np.int32)}, {"train": 100, "validation": 20}, L)
    check_blocks(blocks, 3, "train")  # exactly one batch is enough
    with pytest.raises(CorpusTooSmallError) as err:
        check_blocks(blocks, 8, "train")
    msg = str(err.value)
    assert "100 tokens make 3 blocks of 32 tokens" in msg and "global batch of 8 blocks" in msg
    assert "--max_seq_length" in msg and "--per_device_train_batch_size" in msg
    with pytest.raises(CorpusTooSmallError, match=r"20 tokens make 0 blocks.*--per_device_eval_batch_size"):
        check_blocks(blocks, 1, "validation")
    with pytest.raises(CorpusTooSmallError, match="64 tokens make 2 blocks"):
        check_blocks(np.zeros((2, L), np.int32), 4, "train")


# ---------------------------------------------------------------- masking


@pytest.fixture(scope="session")
def mask_batch():
    rng = np.random.default_rng(1)
    ids = rng.integers(5, 500, size=(64, L)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 0, 2
    ids[3, 10:] = 1  # padded row: 9 maskable tokens
    ids[4, 1:4] = 3  # <unk> tokens are special too
    ids[5, 1:-1] = 1  # no maskable token at all
    return ids


def test_mask_tokens_contract(tf, mask_fn, mask_batch):
    out = {k: v.numpy() for k, v in mask_fn(mask_batch, tf.constant([7, 3])).items()}
    B, P = 64, 5
    assert {k: (v.dtype, v.shape) for k, v in out.items()} == {
        "input_ids": (np.int32, (B, L)),
        "attention_mask": (np.int32, (B, L)),
        "masked_lm_positions": (np.int32, (B, P)),
        "masked_lm_ids": (np.int32, (B, P)),
        "masked_lm_weights": (np.float32, (B, P)),
    }
    maskable = (~np.isin(mask_batch, SPECIAL)).sum(axis=1)
    n = np.minimum(P, maskable)
    np.testing.assert_array_equal(out["masked_lm_weights"].sum(axis=1), n)
    assert n[3] == 5 and n[5] == 0
    np.testing.assert_array_equal(out["attention_mask"], (mask_batch != 1).astype(np.int32))
    for b in range(B):
        k = int(n[b])
        pos = out["masked_lm_positions"][b]
        assert list(out["masked_lm_weights"][b]) == [1.0] * k + [0.0] * (P - k)
        assert np.all(np.diff(pos[:k]) > 0) and np.all(pos[k:] == 0) and np.all(out["masked_lm_ids"][b, k:] == 0)
        assert not np.isin(mask_batch[b, pos[:k]], SPECIAL).any()
        np.testing.assert_array_equal(out["masked_lm_ids"][b, :k], mask_batch[b, pos[:k]])
        untouched = np.ones(L, bool)
        untouched[pos[:k]] = False
        np.testing.assert_array_equal(out["input_ids"][b, untouched], mask_batch[b, untouched])
        assert not np.isin(out["input_ids"][b, pos[:k]], [0, 1, 2, 3]).any()  # replacements are never special


def test_mask_tokens_ratio_and_seeding(tf, mask_fn, mask_batch):
    outs = [mask_fn(mask_batch, tf.constant([s, 0])) for s in range(40)]
    masked = replaced = kept = 0
    for o in outs:
        w = o["masked_lm_weights"].numpy() > 0
        new = np.take_along_axis(o["input_ids"].numpy(), o["masked_lm_positions"].numpy(), axis=1)[w]
        orig = o["masked_lm_ids"].numpy()[w]
        masked += (new == 4).sum()
        kept += (new == orig).sum()
        replaced += ((new != 4) & (new != orig)).sum()
    total = masked + replaced + kept
    assert total == 40 * 63 * 5  # 63 rows with >= 5 maskable tokens, one with none
    assert abs(masked / total - 0.8) < 0.03
    assert abs(kept / total - 0.1) < 0.02  # includes the rare random draw equal to the original
    assert abs(replaced / total - 0.1) < 0.02
    # positions are uniform over the maskable tokens: every inner position gets chosen
    chosen = np.concatenate([o["masked_lm_positions"].numpy()[0] for o in outs])
    assert set(chosen) == set(range(1, L - 1))
    again = mask_fn(mask_batch, tf.constant([0, 0], tf.int64))
    for k in again:
        np.testing.assert_array_equal(again[k].numpy(), outs[0][k].numpy())
    assert not np.array_equal(outs[0]["masked_lm_positions"].numpy(), outs[1]["masked_lm_positions"].numpy())
    assert not np.array_equal(
        outs[0]["masked_lm_positions"].numpy(), mask_fn(mask_batch, tf.constant([0, 1]))["masked_lm_positions"].numpy()
    )


def test_mask_tokens_under_xla_matches_eager(tf, mask_fn, mask_batch):
    compiled = tf.function(mask_fn, jit_compile=True)
    seed = tf.constant([5, 11], tf.int64)
    xla, eager = compiled(tf.constant(mask_batch), seed), mask_fn(mask_batch, seed)
    for k in eager:
        np.testing.assert_array_equal(xla[k].numpy(), eager[k].numpy(), err_msg=k)


def test_make_mask_fn_uses_the_tokenizer(tf, tokenizer):
    from hf_tpu_ext.data.masking import default_max_predictions, make_mask_fn

    assert default_max_predictions(128, 0.15) == 19 and default_max_predictions(8, 0.01) == 1
    fn = make_mask_fn(tokenizer, max_predictions=4)
    ids = np.array([tokenizer("the statement is a way to do it and more")["input_ids"][:8]], np.int32)
    out = fn(ids, tf.constant([0, 0]))
    assert out["masked_lm_positions"].shape == (1, 4)
    assert int(out["masked_lm_weights"].numpy().sum()) == min(4, int((~np.isin(ids, tokenizer.all_special_ids)).sum()))


# ---------------------------------------------------------------- TFRecords


def test_tfrecord_round_trip_and_manifest(tf, tmp_path):
    from hf_tpu_ext.data.tfrecord import read_manifest, read_tfrecord_blocks, write_tfrecord_shards

    blocks = numbered_blocks(23)
    out = str(tmp_path / "shards")
    entry = write_tfrecord_shards(blocks, out, "train", 4, tokenizer="tokenizer", num_tokens=23 * 8 + 5)
    assert entry == {
        "num_blocks": 23,
        "num_tokens": 189,
        "files": [f"train-{i:05d}-of-00004.tfrecord" for i in range(4)],
    }
    write_tfrecord_shards(blocks[:2], out, "validation", 8)  # fewer blocks than shards: 2 files
    manifest = read_manifest(out)
    assert manifest["max_seq_length"] == 8 and manifest["tokenizer"] == "tokenizer"
    assert manifest["splits"]["validation"]["files"] == ["validation-00000-of-00002.tfrecord", "validation-00001-of-00002.tfrecord"]
    assert sorted(os.listdir(out)) == sorted(manifest["splits"]["train"]["files"] + manifest["splits"]["validation"]["files"] + ["manifest.json"])
    ds, n, length = read_tfrecord_blocks(out, "train")
    assert (n, length) == (23, 8) and ds.element_spec.shape == (8,) and ds.element_spec.dtype == tf.int32
    np.testing.assert_array_equal(np.stack([x.numpy() for x in ds]), blocks)
    # rewriting a split with fewer shards removes the old files
    write_tfrecord_shards(blocks, out, "train", 1)
    assert sorted(f for f in os.listdir(out) if f.startswith("train")) == ["train-00000-of-00001.tfrecord"]
    with pytest.raises(DataError, match="blocks of 8 tokens, not 4"):
        write_tfrecord_shards(numbered_blocks(3, 4), out, "test", 1)
    with pytest.raises(DataError, match=r"no 'test' split \(it has: train, validation\)"):
        read_tfrecord_blocks(out, "test")
    with pytest.raises(DataError, match="not a folder written by `hf-tpu prepare-data`"):
        read_tfrecord_blocks(str(tmp_path), "train")


def test_tpu_node_needs_gcs(tmp_path):
    from hf_tpu_ext.data.tfrecord import check_tfrecord_location

    with pytest.raises(DataError) as err:
        check_tfrecord_location(str(tmp_path), is_tpu_node=True)
    assert "gs://" in str(err.value) and "TPU Node" in str(err.value)
    check_tfrecord_location(str(tmp_path), is_tpu_node=False)
    check_tfrecord_location("gs://bucket/shards", is_tpu_node=True)


# ---------------------------------------------------------------- pipelines


def test_train_pipeline_static_shapes(tf, mask_fn):
    from hf_tpu_ext.data.pipeline import make_train_dataset, steps_per_epoch

    blocks = numbered_blocks(20, L)
    ds = make_train_dataset(blocks, global_batch_size=4, seed=1, mask_fn=mask_fn)
    spec = ds.element_spec
    assert spec["input_ids"].shape == (4, L) and spec["input_ids"].dtype == tf.int32
    assert spec["masked_lm_positions"].shape == (4, 5) and spec["masked_lm_weights"].dtype == tf.float32
    assert steps_per_epoch(20, 4) == 5 and steps_per_epoch(23, 4) == 5 and steps_per_epoch(3, 4) == 0
    with pytest.raises(CorpusTooSmallError, match="3 blocks of 32 tokens"):
        make_train_dataset(blocks[:3], global_batch_size=4, seed=1, mask_fn=mask_fn)


def test_train_pipeline_epochs_and_seeds(tf):
    from hf_tpu_ext.data.pipeline import make_train_dataset

    blocks = numbered_blocks(23)  # spe = 5 with B = 4: 3 blocks dropped per epoch
    batches = materialize(make_train_dataset(blocks, global_batch_size=4, seed=9, mask_fn=identity_mask_fn), 15)
    ids = [b["input_ids"][:, 0] - 5 for b in batches]
    epochs = [np.concatenate(ids[e * 5 : (e + 1) * 5]) for e in range(3)]
    for order in epochs:
        assert len(order) == 20 and len(set(order)) == 20 and set(order) <= set(range(23))
    assert not np.array_equal(epochs[0], epochs[1])
    assert [tuple(b["seed"]) for b in batches] == [(9, g) for g in range(15)]
    for b in batches:  # the block's tokens travel unchanged
        np.testing.assert_array_equal(b["input_ids"], blocks[b["input_ids"][:, 0] - 5])
    other = materialize(make_train_dataset(blocks, global_batch_size=4, seed=10, mask_fn=identity_mask_fn), 5)
    assert not np.array_equal(np.concatenate([b["input_ids"][:, 0] for b in other]), epochs[0] + 5)


@pytest.mark.parametrize("source", ["array", "tfrecord"])
def test_resume_yields_the_same_batches(tf, mask_fn, tmp_path, source):
    from hf_tpu_ext.data.pipeline import make_train_dataset

    blocks = numbered_blocks(23, L)
    kwargs = dict(global_batch_size=4, seed=3, mask_fn=mask_fn)
    if source == "tfrecord":
        from hf_tpu_ext.data.tfrecord import read_tfrecord_blocks, write_tfrecord_shards

        write_tfrecord_shards(blocks, str(tmp_path), "train", 3)
        data, n, _ = read_tfrecord_blocks(str(tmp_path), "train")
        kwargs.update(num_blocks=n, shuffle_buffer_size=8)
    else:
        data = blocks
    straight = materialize(make_train_dataset(data, **kwargs), 17)
    for start in (5, 13) if source == "tfrecord" else (5, 7, 13):  # epoch boundary, mid-epoch, a later epoch
        resumed = materialize(make_train_dataset(data, start_step=start, **kwargs), 17 - start)
        assert_same_batches(straight[start:], resumed)
    # the global TF seed does not change the order
    tf.random.set_seed(1234)
    assert_same_batches(straight[:6], materialize(make_train_dataset(data, **kwargs), 6))


def test_tfrecord_epochs_are_windowed_permutations(tf, tmp_path):
    from hf_tpu_ext.data.pipeline import make_train_dataset
    from hf_tpu_ext.data.tfrecord import read_tfrecord_blocks, write_tfrecord_shards

    blocks = numbered_blocks(23)
    write_tfrecord_shards(blocks, str(tmp_path), "train", 2)
    data, n, _ = read_tfrecord_blocks(str(tmp_path), "train")
    batches = materialize(
        make_train_dataset(data, num_blocks=n, global_batch_size=4, seed=3, mask_fn=identity_mask_fn, shuffle_buffer_size=8), 10
    )
    order = [np.concatenate([b["input_ids"][:, 0] - 5 for b in batches[e * 5 : (e + 1) * 5]]) for e in range(2)]
    for e in range(2):
        assert sorted(order[e]) == list(range(20))  # the first spe * B blocks, each once
        for w in range(0, 20, 8):  # permuted inside windows of 8
            assert sorted(order[e][w : w + 8]) == list(range(w, min(w + 8, 20)))
    assert not np.array_equal(order[0], order[1]) and not np.array_equal(order[0], np.arange(20))


def test_eval_pipeline_is_fixed(tf, mask_fn):
    from hf_tpu_ext.data.pipeline import input_pipeline_tokens_per_second, make_eval_dataset, make_train_dataset

    blocks = numbered_blocks(11, L)
    ds, steps = make_eval_dataset(blocks, global_batch_size=4, seed=2, mask_fn=mask_fn)
    assert steps == 2
    first, second = materialize(ds), materialize(ds)
    assert len(first) == 2
    assert_same_batches(first, second)
    for i, b in enumerate(first):  # in order, masked with seed (seed, -1 - i)
        np.testing.assert_array_equal(b["masked_lm_ids"], mask_fn(blocks[4 * i : 4 * i + 4], tf.constant([2, -1 - i]))["masked_lm_ids"].numpy())
    seeds = [tuple(b["seed"]) for b in materialize(make_eval_dataset(blocks, global_batch_size=4, seed=2, mask_fn=identity_mask_fn)[0])]
    assert seeds == [(2, -1), (2, -2)]
    with pytest.raises(CorpusTooSmallError, match="--per_device_eval_batch_size"):
        make_eval_dataset(blocks, global_batch_size=12, seed=2, mask_fn=mask_fn)
    speed = input_pipeline_tokens_per_second(make_train_dataset(blocks, global_batch_size=4, seed=0, mask_fn=mask_fn), 3)
    assert speed > 0


def test_a_vocab_size_the_text_cannot_fill_is_named_with_the_size_trained(small_texts, caplog):
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    with caplog.at_level("INFO", logger="hf_tpu_ext"):
        tok = train_bpe_tokenizer(small_texts[:20], vocab_size=50_000, model_max_length=L)
    assert len(tok) < 50_000
    assert caplog.messages == [
        f"vocab_size 50000 asks for more tokens than the training text gives: the tokenizer (and the model built on "
        f"it) has {len(tok)}; more text or a smaller --vocab_size makes them equal."]
    caplog.clear()
    with caplog.at_level("INFO", logger="hf_tpu_ext"):
        assert len(train_bpe_tokenizer(small_texts, vocab_size=400, model_max_length=L)) == 400
    assert caplog.messages == []
