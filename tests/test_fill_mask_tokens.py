"""The fill-mask demo and probes with every mask token: ``<mask>`` (RoBERTa) and ``[MASK]`` (BERT, DistilBERT,
ModernBERT). The no-mask message names the model's token once; the filled sentence keeps the user's text (casing,
spacing) and joins a WordPiece ``##`` piece to the word before it; probes written with ``<mask>`` score on a
``[MASK]`` model.

A tiny BERT folder (an uncased WordPiece trained here with ``tokenizers``, a 1-layer ``BertForMaskedLM``) stands
for the ``[MASK]`` models; its forward pass is replaced by logits that rank a chosen token first, so the expected
strings are exact.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hf_tpu_ext.fill_mask.predictor import filled_sentence, no_mask_message

SENTENCES = ["the cats sat on the mat", "paris is the capital of france", "the dogs sat on the rug"] * 10


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    pytest.importorskip("torch")
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    out = str(tmp_path_factory.mktemp("tiny-bert"))
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(SENTENCES, vocab_size=120, min_frequency=1)
    wordpiece.save_model(out)
    tokenizer = BertTokenizerFast(os.path.join(out, "vocab.txt"), do_lower_case=True, model_max_length=32)
    tokenizer.save_pretrained(out)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    BertForMaskedLM(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def bert_predictor(bert_folder):
    from hf_tpu_ext.fill_mask import FillMaskPredictor

    return FillMaskPredictor(bert_folder, backend="torch")


def _rank_first(monkeypatch, predictor, token):
    """Make the forward pass rank ``token`` (a vocabulary entry) first at every mask."""
    chosen = predictor.tokenizer.convert_tokens_to_ids(token)
    assert chosen != predictor.tokenizer.unk_token_id, token

    def gather_logits(input_ids, attention_mask, rows, cols):
        logits = np.zeros((len(rows), predictor.vocab_size), np.float32)
        logits[:, chosen] = 10.0
        return logits

    monkeypatch.setattr(predictor._forward, "gather_logits", gather_logits)


def test_the_no_mask_message_names_the_models_mask_token_once(bert_predictor):
    assert no_mask_message("<mask>") == ("No mask in the input: put <mask> where the missing word goes "
                                         "([MASK] works too).")
    result = bert_predictor.predict("Hello world.")
    assert result["ok"] is False and result["mask_token"] == "[MASK]"
    assert result["message"] == "No mask in the input: put [MASK] where the missing word goes (<mask> works too)."
    assert result["message"].count("[MASK]") == 1


@pytest.mark.parametrize("text, mask, fills, prefix, expected", [
    # byte-level BPE, <mask> swallowing the space before it (RoBERTa): the candidate's own spacing counts
    ("Paris is the <mask> of France.", "<mask>", [(" capital", "Ġcapital")], None, "Paris is the capital of France."),
    ("<mask> is the Capital.", "<mask>", [(" Paris", "ĠParis")], None, "Paris is the Capital."),
    ("The <mask> sat on the <mask>.", "<mask>", [(" cat", "Ġcat"), (" mat", "Ġmat")], None,
     "The cat sat on the mat."),
    ("The Cat <mask> sat.", "<mask>", [("s", "s")], None, "The Cats sat."),
    # WordPiece (BERT): words keep the user's spacing, ## pieces join the word before
    ("Paris is the [MASK] of France.", "[MASK]", [("capital", "capital")], "##", "Paris is the capital of France."),
    ("The Cat [MASK] sat.", "[MASK]", [("##s", "##s")], "##", "The Cats sat."),
    ("The [MASK] [MASK] sat.", "[MASK]", [("dog", "dog"), ("##s", "##s")], "##", "The dogs sat."),
    ("No mask here.", "[MASK]", [("dog", "dog")], "##", None),
])
def test_the_filled_sentence_keeps_the_users_text(text, mask, fills, prefix, expected):
    assert filled_sentence(text, mask, fills, prefix, mask_lstrip=mask == "<mask>") == expected


def test_a_bert_fill_keeps_the_casing_and_joins_pieces(bert_predictor, monkeypatch):
    _rank_first(monkeypatch, bert_predictor, "capital")
    result = bert_predictor.predict("Paris is the <mask> of France.", 1)  # <mask> read as [MASK]
    assert result["ok"] is True and result["text"] == "Paris is the [MASK] of France."
    assert result["filled"] == "Paris is the capital of France."  # not the uncased decode "paris is the ..."
    _rank_first(monkeypatch, bert_predictor, "##s")
    result = bert_predictor.predict("The Cat [MASK] sat.", 1)
    assert result["masks"][0][0]["raw_token"] == "##s" and result["filled"] == "The Cats sat."


def test_probes_written_with_mask_score_on_a_bracket_mask_model(bert_predictor, monkeypatch):
    from hf_tpu_ext import probes

    _rank_first(monkeypatch, bert_predictor, "capital")
    parsed = probes.parse_probes("Paris is the <mask> of France. => capital\nThe [MASK] sat on the mat. => capital")
    result = bert_predictor.score_probes(parsed, strict=True)
    assert (result.n, result.top1, result.mrr) == (2, 1.0, 1.0)
