"""Cloze probes: parsing (lines, CSV, JSONL, templates, distractors), answers -> token ids, ranks/top-k/MRR,
multi-token answers (left-to-right log-likelihood), partial probe sets, and ``hf-tpu probe``."""

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


def test_parse_templates_and_distractors():
    text = ("The capital of France is <mask>. | France's capital: [MASK]. \u21d2 Paris | Lyon | Paris | Rome\n"
            "x <mask> => y\n")
    assert parse_probes(text) == [
        Probe("The capital of France is <mask>.", "Paris", 1, ("Lyon", "Rome"), 0),  # answer dropped, order kept
        Probe("France's capital: <mask>.", "Paris", 1, ("Lyon", "Rome"), 1),
        Probe("x <mask>", "y", 2),
    ]
    jsonl = '{"text": ["a <mask>", "b <mask>"], "answer": "x", "distractors": ["y", "z"]}\n'
    assert parse_probes(jsonl) == [Probe("a <mask>", "x", 1, ("y", "z"), 0), Probe("b <mask>", "x", 1, ("y", "z"), 1)]
    csv_text = "text,answer,distractors\na <mask> | b <mask>,x,y|z\n"
    assert parse_probes(csv_text) == [Probe("a <mask>", "x", 2, ("y", "z"), 0), Probe("b <mask>", "x", 2, ("y", "z"), 1)]
    with pytest.raises(ProbeError, match=r"^A probe has exactly one <mask> \(or \[MASK\]\): line 1: 0 masks.$"):
        parse_probes("a <mask> | no mask here => x\n")


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
    from hf_tpu_ext.fill_mask import FillMaskPredictor

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


def test_unscorable_probes_are_skipped_or_refused_with_strict(predictor):
    tok = predictor.tokenizer
    word = _spaced_words(tok, 1)[0]
    k = len(tok(" zqxjkvwq", add_special_tokens=False)["input_ids"])
    target = predictor.max_length - k + 2  # fits with its one mask, one token too long with k masks
    fits = next(t for t in (" ".join([word] * m) + " <mask> ." for m in range(1, predictor.max_length))
                if len(tok(t)["input_ids"]) >= target)
    lst = [Probe(f"the <mask> is {word}", word, 1), Probe("the <mask> sat", "zqxjkvwq", 2, (word,)),  # scored
           Probe("x " * 40 + "<mask>", word, 3), Probe(fits, "zqxjkvwq", 4, (word,)),
           Probe("the <mask> sat", "zqxjkvwq", 5)]  # several tokens and nothing to rank them against
    n3 = len(tok(lst[2].text)["input_ids"])
    n4 = len(tok(lst[3].text)["input_ids"])
    assert n3 > predictor.max_length and n4 <= predictor.max_length < n4 + k - 1  # fits with 1 mask, not with k
    reason3 = f"{n3} tokens, the model reads at most {predictor.max_length}"
    reason4 = f"{n4 + k - 1} tokens with {k} masks for the longest candidate, the model reads at most {predictor.max_length}"
    pieces = tok.convert_ids_to_tokens(tok(" zqxjkvwq", add_special_tokens=False)["input_ids"])
    reason5 = (f"answer 'zqxjkvwq' is {k} tokens {pieces} and the line has no distractors to rank it against (it "
               "would rank last against single tokens): add some, '\u21d2 zqxjkvwq | other | ...'")
    with pytest.raises(ProbeError) as info:
        probes.encode_probes(lst, tok, predictor.vocab_size, predictor.max_length)  # strict by default (training)
    assert str(info.value) == (f"3 of 5 probes cannot be scored: line 3: {reason3}; line 4: {reason4}; "
                               f"line 5: {reason5}. Fix or remove those lines.")
    enc = probes.encode_probes(lst, tok, predictor.vocab_size, predictor.max_length, strict=False)
    assert [p.line for p in enc.probes] == [1, 2]
    assert [(p.line, why) for p, why in enc.skipped] == [(3, reason3), (4, reason4), (5, reason5)]
    assert enc.candidates[1] == [tok(" zqxjkvwq", add_special_tokens=False)["input_ids"], [tok.get_vocab()["\u0120" + word]]]
    result = predictor.score_probes(lst)  # the bench and `hf-tpu probe` default: skip and list
    assert result.n == 2 and result.num_tokens == [1, k]
    assert result.skipped == [(3, 0, reason3), (4, 0, reason4), (5, 0, reason5)]
    with pytest.raises(ProbeError, match="^4 of 4 probes cannot be scored"):  # nothing left: an error either way
        predictor.score_probes([lst[2]] * 2 + [lst[3]] * 2)


def test_a_malformed_line_is_listed_and_the_rest_scored(predictor):
    words = _spaced_words(predictor.tokenizer, 3)
    text = (f"the <mask> of {words[0]} is good . => {words[1]}\n"
            f"the {words[2]} has no mask at all . => {words[0]}\n"
            f"the <mask> of {words[1]} is good . => {words[2]}\n")
    with pytest.raises(ProbeError, match=r"^A probe has exactly one <mask> \(or \[MASK\]\): line 2: 0 masks.$"):
        parse_probes(text)  # strict (the training run's --probe_file)
    lst = parse_probes(text, strict=False)
    assert [p.line for p in lst] == [1, 3] and lst.malformed == [(2, "0 masks: a probe has exactly one <mask> (or [MASK])")]
    result = predictor.score_probes(lst)
    assert result.n == 2 and result.lines == [1, 3]
    assert result.skipped == [(2, 0, "0 masks: a probe has exactly one <mask> (or [MASK])")]
    with pytest.raises(ProbeError, match=r"^1 of 3 probes cannot be scored: line 2: 0 masks"):
        predictor.score_probes(lst, strict=True)
    assert parse_probes("no arrow\na <mask> => b\n", strict=False).malformed == [
        (1, "no arrow: write 'sentence with <mask> \u21d2 answer' (or '=>')")]
    with pytest.raises(ProbeError, match=r"^No line of the probe set is a probe: line 1: 0 masks"):
        parse_probes("a => b\n", strict=False)


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


def test_multi_token_score_is_the_left_to_right_sum_of_log_probs(predictor):
    """The answer's score equals sum_i log p(t_i | context, t_<i, masks after) computed here by hand."""
    import torch

    tok, model = predictor.tokenizer, predictor._forward.model
    text, word = "the <mask> of the module is used .", "zqxjkvwq"
    cand = tok(" " + word, add_special_tokens=False)["input_ids"]
    k = len(cand)
    assert k >= 3  # several tokens in any byte-level vocabulary
    rival = _spaced_words(tok, 1)[0]
    with_rival = predictor.score_probes([Probe(text, word, 1, (rival,)), Probe(text, word, 2, (rival, "the"))],
                                        batch_size=3)
    ids = tok(text.replace("<mask>", tok.mask_token))["input_ids"]
    pos = ids.index(tok.mask_token_id)
    blocked = torch.as_tensor(probes.blocked_ids(tok, predictor.vocab_size))

    def log_probs(row, at):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([row])).logits[0, at].double()
        return torch.log_softmax(logits.masked_fill(blocked, float("-inf")), dim=-1)

    total = sum(log_probs(ids[:pos] + cand[:i] + [tok.mask_token_id] * (k - i) + ids[pos + 1:], pos + i)[cand[i]].item()
                for i in range(k))
    one_mask = log_probs(ids, pos)
    assert with_rival.logprobs[0] == pytest.approx(total, abs=1e-5)
    assert with_rival.logprobs[1] == pytest.approx(total, abs=1e-5) and with_rival.num_tokens == [k, k]
    assert with_rival.chars == [len(word)] * 2
    assert with_rival.loglik_per_char == pytest.approx(total / len(word), abs=1e-5)
    rival_lp = one_mask[tok.get_vocab()["\u0120" + rival]].item()
    assert with_rival.ranks[0] == (1 if total >= rival_lp else 2)  # ranked against the file's distractor
    the_lp = one_mask[tok.get_vocab()["\u0120the"]].item()
    assert with_rival.ranks[1] == 1 + (rival_lp > total) + (the_lp > total)
    # no distractors: not ranked against single tokens (it would always come last), skipped with the reason
    alone = predictor.score_probes([Probe(text, word, 1, (rival,)), Probe(text, word, 2)])
    assert alone.n == 1 and alone.skipped[0][:2] == (2, 0) and "the line has no distractors" in alone.skipped[0][2]


@pytest.fixture(scope="module")
def memorized_model_dir(tmp_path_factory):
    """A tiny torch model that has seen 'my friend likes watermelon and pineapple .'; its tokenizer has not, so
    both fruit are several tokens."""
    from demo_support import build_tiny_fill_mask_model

    return build_tiny_fill_mask_model(str(tmp_path_factory.mktemp("memorized")), vocab_size=360, train_steps=120,
                                      extra_sentences=["my friend likes watermelon and pineapple ."])


def test_known_multi_token_answer_ranks_first(memorized_model_dir):
    from hf_tpu_ext.fill_mask import FillMaskPredictor

    pred = FillMaskPredictor(memorized_model_dir, backend="torch")
    tok = pred.tokenizer
    assert len(tok(" watermelon", add_special_tokens=False)["input_ids"]) >= 2
    assert len(tok(" pineapple", add_special_tokens=False)["input_ids"]) >= 2
    lst = parse_probes("my friend likes <mask> and pineapple . => watermelon | coffee | morning | capital\n"
                       "my friend likes watermelon and <mask> . => pineapple | coffee | watermelon\n"
                       "paris is the <mask> of france . => capital | morning | watermelon\n")
    result = pred.score_probes(lst)
    assert result.ranks == [1, 1, 1] and result.top1 == 1.0
    assert result.num_tokens[0] >= 2 and result.num_tokens[1] >= 2 and all(lp < 0 for lp in result.logprobs)


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
    from hf_tpu_ext.fill_mask.stats import wilson_interval

    assert out["intervals"]["top1"] == list(wilson_interval(round(direct.top1 * 8), 8))
    assert out["intervals"]["mrr"][0] <= direct.mrr <= out["intervals"]["mrr"][1]
    assert out["skipped"] == [] and out["templates"] is None

    assert cli.main(["probe", str(trained_model_dir), str(path)]) == 0
    line = capsys.readouterr().out.strip()
    lo, hi = out["intervals"]["top1"]
    assert line.startswith(f"{trained_model_dir}: probes=8 top1={direct.top1:.4f} [{lo:.4f}, {hi:.4f}] "
                           f"top5={direct.top5:.4f} [")


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
    partial = tmp_path / "partial.txt"
    partial.write_text("the <mask> sat => zqxjkvwq | cat\n" + "x " * 40 + "<mask> => cat | dog\n", encoding="utf-8")
    assert cli.main(["probe", str(trained_model_dir), str(partial)]) == 0  # the multi-token line is scored
    out, err = capsys.readouterr()
    assert out.startswith(f"{trained_model_dir}: probes=1 top1=")
    assert err.startswith("hf-tpu probe: skipped 1 of 2 probes that cannot be scored (--strict makes this an error):\n"
                          "  line 2: ") and "the model reads at most" in err
    assert cli.main(["probe", str(trained_model_dir), str(partial), "--strict"]) == 1
    assert capsys.readouterr().err.startswith("hf-tpu probe: error: partial.txt: 1 of 2 probes cannot be scored: line 2: ")
    malformed = tmp_path / "malformed.txt"
    malformed.write_text("the <mask> sat => cat | dog\nthe cat sat => mat\n", encoding="utf-8")
    assert cli.main(["probe", str(trained_model_dir), str(malformed)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{trained_model_dir}: probes=1 top1=")
    assert err == ("hf-tpu probe: skipped 1 of 2 probes that cannot be scored (--strict makes this an error):\n"
                   "  line 2: 0 masks: a probe has exactly one <mask> (or [MASK])\n")
    assert cli.main(["probe", str(trained_model_dir), str(malformed), "--strict"]) == 1
    assert capsys.readouterr().err.strip() == ("hf-tpu probe: error: malformed.txt: A probe has exactly one <mask> "
                                               "(or [MASK]): line 2: 0 masks.")


def test_split_model_ref(tmp_path):
    from hf_tpu_ext.commands.probe import split_model_ref

    assert split_model_ref("alice/m@main,0a1b2c3") == ("alice/m", ["main", "0a1b2c3"])
    assert split_model_ref("alice/m") == ("alice/m", [None])
    assert split_model_ref(str(tmp_path)) == (str(tmp_path), [None])
