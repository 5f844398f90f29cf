"""A tokenizer folder that transformers 5 loads with its special tokens only is refused, naming the folder and the
likely cause (``BertTokenizerFast(vocab_file=...)``, whose ``vocab_file`` transformers 5 ignores, then saved).

Runs in the current-releases venv (transformers 5): ``.venv-current/bin/python -m pytest -q
tests/current/test_tokenizer_folder.py``.
"""

import pytest

transformers = pytest.importorskip("transformers")


def test_a_folder_of_special_tokens_only_is_refused_with_its_cause(tmp_path):
    from hf_tpu_ext.data.tokenizer import check_mlm_tokenizer, load_tokenizer
    from hf_tpu_ext.errors import TokenizerError

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "fox", "##es"]))
    built = transformers.BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt"))
    if len(built) != 5:
        pytest.skip(f"this transformers ({transformers.__version__}) reads vocab_file=")
    built.save_pretrained(str(tmp_path / "saved"))
    loaded = load_tokenizer(str(tmp_path / "saved"))
    assert len(loaded) == 5
    with pytest.raises(TokenizerError) as err:
        check_mlm_tokenizer(loaded)
    assert str(err.value) == (
        f"The tokenizer in {tmp_path / 'saved'} loads with 5 tokens, all special: every word would be [UNK]. Its "
        "vocabulary was likely never read (transformers 5 ignores vocab_file= in BertTokenizerFast(...)): make it "
        "with BertTokenizerFast.from_pretrained(<the folder of vocab.txt>) and save_pretrained it again.")
    # the way out the line names: all 8 tokens, and the check passes
    fixed = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
    assert len(fixed) == 8
    check_mlm_tokenizer(fixed)
