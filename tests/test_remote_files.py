"""hf_tpu_ext.fileio.remote_files: the one choice of how files at a URL are read and written."""

import sys

import pytest

from hf_tpu_ext.fileio import remote_files


def test_a_url_round_trips_through_fsspec(tmp_path):
    files = remote_files("memory://remote-files/tok")
    files.makedirs("memory://remote-files/tok/sub")
    files.makedirs("memory://remote-files/tok/sub")  # an existing folder is fine
    (tmp_path / "vocab.json").write_text('{"a": 0}')
    files.put(str(tmp_path / "vocab.json"), "memory://remote-files/tok/sub/vocab.json")
    assert files.exists("memory://remote-files/tok/sub/vocab.json")
    assert not files.exists("memory://remote-files/tok/sub/merges.txt")
    files.get("memory://remote-files/tok/sub/vocab.json", str(tmp_path / "back.json"))
    assert (tmp_path / "back.json").read_text() == '{"a": 0}'


def test_gs_goes_through_tf_io_gfile_where_tensorflow_is_installed(monkeypatch):
    tf = pytest.importorskip("tensorflow")
    files = remote_files("gs://bucket/tokenizer")
    assert (files.makedirs, files.exists) == (tf.io.gfile.makedirs, tf.io.gfile.exists)
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # no TensorFlow: fsspec, which needs gcsfs for gs://
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="^Please install gcsfs to access Google Storage$"):
            remote_files("gs://bucket/tokenizer")
    else:
        assert remote_files("gs://bucket/tokenizer").exists != tf.io.gfile.exists


def test_a_tokenizer_saved_to_a_url_loads_back():
    """prepare-data's upload and the loader's download both go through remote_files."""
    from hf_tpu_ext.commands.prepare_data import _save_tokenizer
    from hf_tpu_ext.data.tokenizer import load_tokenizer, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(["a few words of text"] * 20, vocab_size=300, model_max_length=6)
    _save_tokenizer(tokenizer, "memory://remote-files/saved/tokenizer")
    assert remote_files("memory://x").exists("memory://remote-files/saved/tokenizer/tokenizer.json")
    loaded = load_tokenizer("memory://remote-files/saved/tokenizer")
    assert loaded("a few words")["input_ids"] == tokenizer("a few words")["input_ids"]
    assert loaded.model_max_length == 6
