"""Cloze probes: parsing (lines, CSV, JSONL), answers -> vocabulary ids, ranks/top-k/MRR, and ``hf-tpu probe``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf_tpu_ext import probes
from hf_tpu_ext.probes import Probe, ProbeError, parse_probes


# --- parsing ---------------------------------------------------------------------------------------------------


def test_parse_plain_lines_both_arrows_comments_and_mask_spellings():
    text = ("# capitals\n"
            "The capital of France is <mask>. \u21d2 Paris\n"
            "\n"
            "  [MASK] is the capital of Germany => Berlin  \n"
            "a => b <MASK> => c\n")
    assert parse_probes(text) == [
        Probe("The capital of France is <mask>.", "Paris", 2),
        Probe("<mask> is the capital of Germany", "Berlin", 4),
        Probe("a => b <mask>", "c", 5),  # split at the last arrow
    ]


def test_parse_csv_with_and_without_header():
    with_header = 'answer,text\nParis,"The capital of France is <mask>."\nBerlin,"[mask], capital of Germany"\n'
    assert parse_probes(with_header) == [Probe("The capital of France is <mask>.", "Paris", 2),
                                         Probe("<mask>, capital of Germany", "Berlin", 3)]
    plain = '"The capital of France is <mask>.",Paris\n'
    assert parse_probes(plain, "csv") == [Probe("The capital of France is <mask>.", "Paris", 1)]
    assert parse_probes("sentence\tlabel\nA <mask> b\tx\n") == [Probe("A <mask> b", "x", 2)]


def test_parse_jsonl():
    text = '{"text": "The capital of France is <mask>.", "answer": "Paris"}\n\n{"sentence": "<mask> ok", "target": "x"}\n'
    assert parse_probes(text) == [Probe("The capital of France is <mask>.", "Paris", 1), Probe("<mask> ok", "x", 3)]


@pytest.mark.parametrize("text, fmt, message", [
    ("", None, "The probe set is empty: give lines like 'The capital of France is <mask>. \u21d2 Paris'."),
    ("a <mask> => x\nno arrow here\n", "lines",
     "line 2 has no arrow: write 'The capital of France is <mask>. \u21d2 Paris' (or '=>')."),
    ("a b => x\na <mask> <mask> => y\n", None,
     "A probe has exactly one <mask> (or [MASK]): line 1: 0 masks; line 2: 2 masks."),
    ("a <mask> => \n", None, "line 1: the answer after the arrow is empty."),
    ('{"text": "a <mask>"}\n', None, "line 1 needs the keys 'text' and 'answer', got ['text']."),
    ('{"text": "a <mask>", "answer": "x"}\n{oops\n', None,
     "line 2 is not valid JSON (Expecting property name enclosed in double quotes); one object per line, e.g. "
     '{"text": "The capital of France is <mask>.", "answer": "Paris"}.'),
    ("only one column\n", "csv", "line 1 has fewer than 2 columns: give a text column and an answer column "
                                 "(header 'text,answer')."),
    ("x", "xml", "Unknown probe format 'xml'; use one of: lines, csv, tsv, jsonl."),
])
def test_parse_errors_name_the_line(text, fmt, message):
    with pytest.raises(ProbeError) as info:
        parse_probes(text, fmt)
    assert str(info.value) == message


def test_read_probe_file_formats_and_errors(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"text": "a <mask>", "answer": "x"}\n', encoding="utf-8")
    assert probes.read_probe_file(tmp_path / "p.jsonl") == [Probe("a <mask>", "x", 1)]
    (tmp_path / "p.csv").write_text("text,answer\na <mask>,x\n", encoding="utf-8")
    assert probes.read_probe_file(tmp_path / "p.csv") == [Probe("a <mask>", "x", 2)]
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 <mask> => x\n".encode("latin-1"))
    with pytest.raises(ProbeError, match=r"latin1.txt is not UTF-8 text \(byte 3\); save it as UTF-8."):
        probes.read_probe_file(tmp_path / "latin1.txt")
    with pytest.raises(ProbeError, match="does not exist"):
        probes.read_probe_file(tmp_path / "missing.txt")
    (tmp_path / "bad.txt").write_text("a <mask> x\n", encoding="utf-8")
    with pytest.raises(ProbeError, match=r"^bad.txt: line 1 has no arrow"):
        probes.read_probe_file(tmp_path / "bad.txt")


# --- ranks and summary -------------------------------------------------------------------------------------------


def test_answer_ranks_skip_blocked_ids_and_count_strictly_greater():
    logits = np.array([[9.0, 1.0, 5.0, 3.0, 5.0],
                       [9.0, 4.0, 1.0, 2.0, 3.0],
                       [0.0, 0.0, 0.0, 0.0, 7.0]])
    blocked = np.array([True, False, False, False, False])  # id 0 (a special token) never counts
    ranks = probes.answer_ranks(logits, np.array([2, 1, 3]), blocked)
    assert ranks.tolist() == [1, 1, 2]  # ties with id 4 do not push id 2 down; id 0's 9.0 is ignored
    s = probes.summarize_ranks([1, 1, 2, 10])
    assert s == {"n": 4, "top1": 0.5, "top5": 0.75, "mrr": pytest.approx((1 + 1 + 0.5 + 0.1) / 4)}
    assert probes.summarize_ranks([]) == {"n": 0, "top1": 0.0, "top5": 0.0, "mrr": 0.0}


def test_pad_batch_shapes():
    ids, mask = probes.pad_batch([[0, 5, 2], [0, 2]], pad_id=1)
    assert ids.tolist() == [[0, 5, 2], [0, 2, 1]] and mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    ids, mask = probes.pad_batch([[0, 2]], pad_id=1, length=4)
    assert ids.shape == mask.shape == (1, 4) and ids.dtype == np.int64


# --- with the session's model --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def predictor(trained_model_dir):
    from spaces_demo.app import FillMaskPredictor

    return FillMaskPredictor(trained_model_dir, backend="torch")


def _spaced_words(tok, n):
    vocab = tok.get_vocab()
    return sorted(t[1:] for t in vocab if t.startswith("\u0120") and t[1:].isascii() and t[1:].isalpha() and len(t) > 3)[:n]


def test_answer_token_depends_on_the_space_before_the_mask(predictor):
    tok = predictor.tokenizer
    vocab = tok.get_vocab()
    word = _spaced_words(tok, 1)[0]
    blocked = probes.blocked_ids(tok, predictor.vocab_size)
    token, reason = probes.answer_token(tok, "the <mask> sat", word, blocked)
    assert reason is None and token.id == vocab["\u0120" + word] and token.token_str == " " + word
    if word not in vocab:  # bare form at the start of a text is several tokens
        pieces = tok.convert_ids_to_tokens(tok(word, add_special_tokens=False)["input_ids"])
        token, reason = probes.answer_token(tok, "<mask> sat", word, blocked)
        assert token is None
        assert reason == (f"answer '{word}' at the start of the text or glued to the previous character is "
                          f"{len(pieces)} tokens {pieces}, not one word-level token")


def test_encode_refuses_unscorable_probes_with_lines(predictor):
    word = _spaced_words(predictor.tokenizer, 1)[0]
    lst = [Probe(f"the <mask> is {word}", word, 1), Probe("the <mask> sat", "zqxjkvwq", 2),
           Probe("x " * 40 + "<mask>", word, 3)]
    with pytest.raises(ProbeError) as info:
        probes.encode_probes(lst, predictor.tokenizer, predictor.vocab_size, predictor.max_length)
    msg = str(info.value)
    assert msg.startswith("2 of 3 probes cannot be scored: line 2: answer 'zqxjkvwq' after a space is ")
    n = len(predictor.tokenizer(lst[2].text)["input_ids"])
    assert n > predictor.max_length
    assert f"line 3: {n} tokens, the model reads at most {predictor.max_length}" in msg
    assert msg.endswith("Fix or remove those lines.")


def test_scores_match_a_direct_ranking(predictor):
    """score_probes (sorted, batched, padded) gives the ranks of one-sentence-at-a-time full softmax ranking."""
    words = _spaced_words(predictor.tokenizer, 12)
    lst = [Probe(f"the {a} is the <mask> of {b} .", c, i + 1) for i, (a, b, c) in
           enumerate(zip(words, words[3:] + words[:3], words[6:] + words[:6]))]
    result = predictor.score_probes(lst, batch_size=5)
    assert result.n == len(lst) == 12
    expected = []
    for p in lst:
        full = predictor.predict(p.text, predictor.num_candidates)["masks"][0]
        scores = {c["raw_token"]: c["score"] for c in full}
        target = scores["\u0120" + p.answer]
        expected.append(1 + sum(s > target * (1 + 1e-9) for s in scores.values()))
    assert result.ranks == expected
    assert result.top1 == pytest.approx(np.mean([r == 1 for r in expected]))
    assert result.mrr == pytest.approx(np.mean([1 / r for r in expected]))


# --- hf-tpu probe -----------------------------------------------------------------------------------------------


def test_probe_cli_json_matches_the_predictor(trained_model_dir, predictor, tmp_path, capsys):
    from hf_tpu_ext import cli

    words = _spaced_words(predictor.tokenizer, 8)
    lines = [f"the <mask> of {w} is good . => {words[(i + 1) % len(words)]}" for i, w in enumerate(words)]
    path = tmp_path / "p.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert cli.main(["probe", str(trained_model_dir), str(path), "--json", "--ranks"]) == 0
    out = json.loads(capsys.readouterr().out)
    direct = predictor.score_probes(parse_probes(path.read_text(encoding="utf-8")))
    assert (out["n"], out["top1"], out["top5"], out["mrr"], out["ranks"]) == \
        (direct.n, direct.top1, direct.top5, direct.mrr, direct.ranks)
    assert out["model"] == str(trained_model_dir) and out["revision"] is None

    assert cli.main(["probe", str(trained_model_dir), str(path)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{trained_model_dir}: probes=8 top1={direct.top1:.4f} top5={direct.top5:.4f} "
                           f"mrr={direct.mrr:.4f} (")


def test_probe_cli_errors_are_fast_and_clear(trained_model_dir, tmp_path, capsys):
    from hf_tpu_ext import cli

    good = tmp_path / "p.txt"
    good.write_text("the <mask> sat => cat\n", encoding="utf-8")
    assert cli.main(["probe", str(trained_model_dir), str(tmp_path / "nope.jsonl")]) == 1
    assert capsys.readouterr().err.strip() == f"hf-tpu probe: error: Probe file {tmp_path / 'nope.jsonl'} does not exist."
    assert cli.main(["probe", "not a repo!", str(good)]) == 1
    assert "MODEL 'not a repo!' is neither an existing local folder nor a valid Hub repo id" in capsys.readouterr().err
    assert cli.main(["probe", str(tmp_path), str(good)]) == 1
    assert f"{tmp_path} has no config.json" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_text("the <mask> sat => zqxjkvwq\n", encoding="utf-8")
    assert cli.main(["probe", str(trained_model_dir), str(bad)]) == 1
    assert "bad.txt: 1 of 1 probes cannot be scored: line 1: answer 'zqxjkvwq'" in capsys.readouterr().err


def test_split_model_ref(tmp_path):
    from hf_tpu_ext.commands.probe import split_model_ref

    assert split_model_ref("alice/m@main,0a1b2c3") == ("alice/m", ["main", "0a1b2c3"])
    assert split_model_ref("alice/m") == ("alice/m", [None])
    assert split_model_ref(str(tmp_path)) == (str(tmp_path), [None])
