"""The Gradio fill-mask demo: the predictor's input rules, the /fill_mask API over gradio_client, the Space files,
and the ``hf-tpu demo`` command's argument errors."""

from __future__ import annotations

import os

import pytest

from demo_support import gradio_client, launched_demo

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_DIR = os.path.join(REPO_ROOT, "spaces_demo")
SPECIAL_STRINGS = ("<s>", "</s>", "<pad>", "<unk>", "<mask>")
# Written to hold for any byte-level BPE RoBERTa folder, so trained_model_dir may come from `hf-tpu train`.
OOV_WORD = "zqxjkvwq"  # never one token of a real vocabulary


@pytest.fixture(scope="session")
def predictor(trained_model_dir):
    from hf_tpu_ext.fill_mask import FillMaskPredictor

    return FillMaskPredictor(trained_model_dir, backend="torch")


@pytest.fixture(scope="module")
def demo_url(predictor):
    with launched_demo(None, predictor=predictor, concurrency_limit=2) as (_, url):
        yield url


@pytest.fixture(scope="module")
def client(demo_url):
    return gradio_client(demo_url)


def _call(client, text, top_k=5, targets=""):
    return client.predict(text, top_k, targets, api_name="/fill_mask")


def _check_ranked(ranked, k, special_ids=(0, 1, 2, 3, 4)):
    scores = [c["score"] for c in ranked]
    assert len(ranked) == k
    assert all(0.0 < s <= 1.0 for s in scores)
    assert scores == sorted(scores, reverse=True)
    assert [c["rank"] for c in ranked] == list(range(1, k + 1))
    for c in ranked:
        assert c["token_str"].strip() not in SPECIAL_STRINGS and c["raw_token"] not in SPECIAL_STRINGS
        assert c["token"] not in special_ids


# --- gradio_client against the launched app ---------------------------------------------------------------


def test_api_one_mask(client, predictor):
    r = _call(client, "paris is the <mask> of france .", top_k=4)
    assert r["ok"] is True and r["top_k"] == 4 and r["mask_token"] == "<mask>"
    assert len(r["masks"]) == 1
    _check_ranked(r["masks"][0], 4, predictor.special_ids)
    assert r["filled"] == f"paris is the{r['masks'][0][0]['token_str']} of france ."
    # same numbers as calling the predictor directly (JSON round trip loses nothing)
    direct = predictor.predict("paris is the <mask> of france .", 4)
    assert [c["token"] for c in direct["masks"][0]] == [c["token"] for c in r["masks"][0]]
    assert r["masks"][0][0]["score"] == pytest.approx(direct["masks"][0][0]["score"], rel=1e-6)


def test_api_two_masks(client, predictor):
    r = _call(client, "the <mask> sat on the <mask> .", top_k=3)
    assert r["ok"] is True and len(r["masks"]) == 2
    for ranked in r["masks"]:
        _check_ranked(ranked, 3, predictor.special_ids)
    assert "<mask>" not in r["filled"]
    best = [m[0]["token_str"] for m in r["masks"]]
    assert r["filled"] == f"the{best[0]} sat on the{best[1]} ."
    assert "independently" in r["message"]


def test_api_bracket_mask_is_mapped(client):
    a = _call(client, "the cat sat on the [MASK] .", top_k=3)
    b = _call(client, "the cat sat on the [mask] .", top_k=3)
    c = _call(client, "the cat sat on the <mask> .", top_k=3)
    assert a["ok"] and b["ok"]
    assert a["text"] == "the cat sat on the <mask> ."
    assert [x["token"] for x in a["masks"][0]] == [x["token"] for x in c["masks"][0]] == [x["token"] for x in b["masks"][0]]
    assert "[MASK]" not in a["filled"] and "<mask>" not in a["filled"]


def test_api_no_mask(client):
    r = _call(client, "the cat sat on the mat .")
    assert r["ok"] is False and r["masks"] == [] and r["filled"] is None
    assert "No mask" in r["message"] and "<mask>" in r["message"]


@pytest.mark.parametrize("text", ["", "   \n "])
def test_api_empty_input(client, text):
    r = _call(client, text)
    assert r["ok"] is False and r["masks"] == []
    assert r["message"].startswith("Empty input") and "<mask>" in r["message"]


def test_api_too_long(client, predictor):
    limit = predictor.max_length
    assert 8 <= limit <= predictor.config.max_position_embeddings
    text = "the cat sat on the mat and " * (limit // 2) + "<mask> ."
    r = _call(client, text)
    assert r["ok"] is False and r["masks"] == []
    assert r["max_length"] == limit and r["num_tokens"] == len(predictor.tokenizer(text)["input_ids"]) > limit
    assert f"{r['num_tokens']} tokens" in r["message"] and f"at most {limit}" in r["message"]
    assert f"by {r['num_tokens'] - limit} tokens" in r["message"]
    # one token under the limit is accepted
    ok = predictor.tokenizer.decode(predictor.tokenizer(text)["input_ids"][1:limit - 2]) + " <mask>"
    assert _call(client, ok)["ok"] is True


def _two_vocabulary_words(predictor):
    """Two words that are single ``Ġword`` tokens of the vocabulary and not single tokens without the space."""
    vocab = predictor.tokenizer.get_vocab()
    words = sorted(t[1:] for t in vocab if t.startswith("Ġ") and t[1:].isalpha() and len(t) > 4 and t[1:] not in vocab)
    assert len(words) >= 2
    return words[:2]


def test_api_targets_with_out_of_vocabulary_word(client, predictor):
    w1, w2 = _two_vocabulary_words(predictor)
    r = _call(client, "i like to drink <mask> in the morning .", top_k=5, targets=f"{w1}, {OOV_WORD} ,{w2}")
    assert r["ok"] is True
    assert r["rejected_targets"] == [OOV_WORD]
    assert f"'{OOV_WORD}'" in r["message"] and "Not scored" in r["message"]
    ranked = r["masks"][0]
    assert {c["token_str"] for c in ranked} == {" " + w1, " " + w2}
    _check_ranked(ranked, 2, predictor.special_ids)
    assert r["top_k"] == 2 and "2 accepted targets" in r["message"]
    # target scores are the unrestricted probabilities, not renormalized
    full = predictor.predict("i like to drink <mask> in the morning .", predictor.num_candidates)
    by_id = {c["token"]: c["score"] for c in full["masks"][0]}
    for c in ranked:
        assert c["score"] == pytest.approx(by_id[c["token"]], rel=1e-9)


def test_api_only_unknown_targets(client):
    r = _call(client, "the cat sat on the <mask> .", targets=f"{OOV_WORD}, qqzzqqzz")
    assert r["ok"] is False and r["masks"] == [] and r["rejected_targets"] == [OOV_WORD, "qqzzqqzz"]
    assert "None of the targets" in r["message"]


def test_api_top_k_larger_than_vocab(client, predictor):
    r = _call(client, "the cat sat on the <mask> .", top_k=100000)
    n = predictor.num_candidates
    assert n == min(len(predictor.tokenizer), predictor.vocab_size) - len(predictor.special_ids)
    assert set(predictor.tokenizer.all_special_ids) <= set(predictor.special_ids)
    assert r["ok"] is True and r["top_k"] == n
    assert f"top_k 100000 is more than the {n}" in r["message"]
    _check_ranked(r["masks"][0], n, predictor.special_ids)
    assert sum(c["score"] for c in r["masks"][0]) == pytest.approx(1.0, abs=1e-9)
    assert len({c["token"] for c in r["masks"][0]}) == n


def test_api_top_k_invalid(client):
    r = _call(client, "the cat sat on the <mask> .", top_k=0)
    assert r["ok"] is False and "top_k must be >= 1" in r["message"]


def test_api_endpoints_and_optional_parameters(client):
    info = client.view_api(return_format="dict", print_info=False)
    assert sorted(info["named_endpoints"]) == ["/compare", "/fill_mask", "/probe", "/revisions"]
    params = {name: [(p["parameter_name"], p["parameter_has_default"], p["parameter_default"])
                     for p in ep["parameters"]] for name, ep in info["named_endpoints"].items()}
    assert params["/fill_mask"] == [("text", False, None), ("top_k", True, 5), ("targets", True, ""),
                                    ("revision", True, "")]
    assert [p[1] for p in params["/compare"]] == [False, True, True, True, True, True]
    assert params["/probe"] == [("probes_text", False, None), ("revisions", True, ""), ("model", True, ""),
                                ("strict", True, False)]


def test_api_only_text_is_required(client, predictor):
    r = client.predict("the <mask> sat on the mat .", api_name="/fill_mask")
    assert r["ok"] is True and r["top_k"] == 5 and len(r["masks"][0]) == 5
    assert r["rejected_targets"] == [] and r["targets"] == []
    direct = predictor.predict("the <mask> sat on the mat .", 5)
    assert [c["token"] for c in r["masks"][0]] == [c["token"] for c in direct["masks"][0]]


@pytest.mark.parametrize("top_k, message", [
    ("abc", "top_k must be a whole number >= 1, got 'abc'."),
    ("inf", "top_k must be a finite whole number >= 1, got 'inf'."),
    ("nan", "top_k must be a finite whole number >= 1, got 'nan'."),
    ("1e400", "top_k must be a finite whole number >= 1, got '1e400'."),
    ("2.5", "top_k must be a whole number >= 1, got '2.5'."),
    (-3, "top_k must be >= 1, got -3."),
])
def test_api_bad_top_k_gets_the_apps_message(client, top_k, message):
    r = client.predict("the cat sat on the <mask> .", top_k, api_name="/fill_mask")
    assert r["ok"] is False and r["masks"] == [] and r["message"] == message


def test_api_top_k_as_numeric_string(client):
    r = client.predict("the cat sat on the <mask> .", "3", api_name="/fill_mask")
    assert r["ok"] is True and r["top_k"] == 3 and len(r["masks"][0]) == 3


@pytest.mark.parametrize("char", ["é", "ü", "°"])
def test_api_byte_level_target_is_refused_with_the_reason(client, predictor, char):
    tok = predictor.tokenizer
    assert char in tok.get_vocab()  # the lone byte entry that used to be scored (shown as U+FFFD)
    spaced = tok.convert_ids_to_tokens(tok(" " + char, add_special_tokens=False)["input_ids"])
    bare = tok.convert_ids_to_tokens(tok(char, add_special_tokens=False)["input_ids"])
    assert len(spaced) > 1 and len(bare) > 1
    r = client.predict("the cat sat on the <mask> .", 5, f"{char}", api_name="/fill_mask")
    assert r["ok"] is False and r["masks"] == [] and r["rejected_targets"] == [char]
    reason = (f"it is not one word-level token of this vocabulary: ' {char}' is {len(spaced)} tokens {spaced} and "
              f"'{char}' is {len(bare)} tokens {bare}; its vocabulary entry '{char}' is one byte of a multi-byte "
              "character (it decodes to '\ufffd'), not a whole word")
    assert r["message"] == (f"Not scored: '{char}' ({reason}). None of the targets can be scored: give words that "
                            "are one token, or clear targets.")


def test_api_target_mapping_is_stated(client, predictor):
    w1, _ = _two_vocabulary_words(predictor)
    vocab = predictor.tokenizer.get_vocab()
    r = client.predict("the cat sat on the <mask> .", 5, f"{w1}, é", api_name="/fill_mask")
    assert r["ok"] is True and r["rejected_targets"] == ["é"]
    assert f"'{w1}' is scored as ' {w1}' (Ġ{w1})." in r["message"]
    assert r["targets"] == [{"target": w1, "note": f"'{w1}' is scored as ' {w1}' (Ġ{w1})",
                             "scored_as": [{"token": vocab["Ġ" + w1], "token_str": " " + w1,
                                            "raw_token": "Ġ" + w1}]}]
    assert [c["token_str"] for c in r["masks"][0]] == [" " + w1]
    assert all("\ufffd" not in c["token_str"] for c in r["masks"][0])


def test_queued_sentences_share_forward_passes(client, predictor):
    """16 concurrent /fill_mask calls: Gradio hands queued calls over in batches, and a batch is one forward pass."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"the <mask> sat on the {w} ." for w in ("mat", "rug", "cat", "dog")] * 4
    before = predictor.forward_passes
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda t: _call(client, t, top_k=2), texts))
    passes = predictor.forward_passes - before
    assert all(a["ok"] for a in answers) and len(answers) == 16
    assert 1 <= passes < 16, passes  # concurrency_limit=2: at most 2 batches run at once, the rest queue up
    direct = predictor.predict(texts[0], 2)  # batched (padded) answers equal the one-sentence answer
    assert [c["token"] for c in answers[0]["masks"][0]] == [c["token"] for c in direct["masks"][0]]
    assert answers[0]["masks"][0][0]["score"] == pytest.approx(direct["masks"][0][0]["score"], rel=1e-5)


def test_load_benchmark_concurrent_requests(demo_url):
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo_load", os.path.join(REPO_ROOT, "benchmarks", "demo_load.py"))
    demo_load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_load)
    res = demo_load.run_load(demo_url, requests=12, top_k=3)
    assert res["failures"] == []
    assert len(res["latencies_s"]) == 12 and all(0 < x <= res["wall_s"] for x in res["latencies_s"])
    assert demo_load.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def test_probe_view_shows_intervals_spread_and_comparison(trained_model_dir, predictor):
    """What the Probe set tab renders: figures with 95% intervals, the template spread, the paired comparison."""
    from hf_tpu_ext.fill_mask import FillMaskBench, report
    from hf_tpu_ext.probes import parse_probes
    from spaces_demo.app import PROBE_HEADERS, probe_chart, probe_notes, probe_rows

    words = sorted(t[1:] for t in predictor.tokenizer.get_vocab() if t.startswith("\u0120") and t[1:].isalpha()
                   and t[1:].isascii() and len(t) > 4)[:8]
    text = "\n".join(f"the {a} of the <mask> is good . | {a} is the <mask> . \u21d2 {b}ings | {a}"
                      for a, b in zip(words, words[1:] + words[:1]))
    result = FillMaskBench(trained_model_dir, backend="torch", predictor=predictor).probe(text)
    assert result["ok"] and result["message"] == "Scored 16 probes on 1 revision." and result["comparisons"] == []
    row = result["rows"][0]
    assert row["n"] == 16 and row["multi_token"] == 16 and row["templates"]["templates"] == 2
    (cells,) = probe_rows(result)
    assert len(cells) == len(PROBE_HEADERS) and cells[:3] == [row["label"], row["step"], 16]
    for cell, key in zip(cells[3:7], ("top1", "top5", "mrr", "loglik_per_char")):
        low, high = row["intervals"][key]
        assert cell == f"{row[key]:.3f} [{low:.3f}, {high:.3f}]"
    scored = predictor.score_probes(parse_probes(text))
    comparison = report.compare(scored, scored, "A", "B")
    assert comparison["n"] == 16 and not any(m["differs"] for m in comparison["metrics"].values())
    notes = probe_notes(dict(result, comparisons=[comparison])).splitlines()
    spread = row["templates"]["spread"]
    assert notes[0].startswith(f"- **{row['label']}**: 2 templates, top-1/MRR per template #1 ")
    assert notes[0].endswith(f"spread (max - min) top-1 {spread['top1']:.3f}, MRR {spread['mrr']:.3f}")
    assert notes[1] == ("- B vs A on 16 paired probes (8 facts): top-1 +0.000 (McNemar exact p=1); MRR +0.000 "
                        "(paired bootstrap p=1); log-lik +0.000 (paired bootstrap p=1): too few probes to call any "
                        "difference real (8 &lt; 30).")  # escaped for the Markdown view
    fig = probe_chart(result)
    assert [c.get_label() for c in fig.axes[0].containers] == ["top-1", "top-5", "MRR"]  # one error-bar series each


def test_quiet_terminal(predictor, capsys, monkeypatch):
    """No per-request Starlette warning, no download bars or library notices, no analytics, the CLI's own flags."""
    import warnings

    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from starlette import status
    from transformers.utils import logging as hf_logging

    from demo_support import free_port
    from hf_tpu_ext.fill_mask.quiet import quiet_libraries
    from spaces_demo.app import build_demo, launch

    monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED", raising=False)
    verbosity = hf_logging.get_verbosity()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert status.HTTP_422_UNPROCESSABLE_ENTITY == 422  # what Gradio's routes read per request
            assert [str(w.message) for w in caught if "HTTP_422_UNPROCESSABLE_ENTITY" in str(w.message)]
            caught.clear()
            quiet_libraries()
            assert status.HTTP_422_UNPROCESSABLE_ENTITY == 422
            assert caught == []
        assert are_progress_bars_disabled() and hf_logging.get_verbosity() == hf_logging.ERROR
        assert os.environ["GRADIO_ANALYTICS_ENABLED"] == "False"
        enable_progress_bars()
        hf_logging.set_verbosity(verbosity)
        with warnings.catch_warnings():
            quiet_libraries("info")  # --log_level info: bars and notices stay
            assert not are_progress_bars_disabled() and hf_logging.get_verbosity() == verbosity
        with pytest.raises(ValueError, match="Unknown log level 'loud'; use one of: debug, info, warning, error"):
            quiet_libraries("loud")
    finally:
        enable_progress_bars()
        hf_logging.set_verbosity(verbosity)

    demo = build_demo(None, predictor=predictor)
    try:
        launch(demo, "127.0.0.1", free_port(), share_hint="--share yes")
        out = capsys.readouterr().out
    finally:
        demo.close()
    assert out.splitlines() == [f"Fill-mask test bench running on {demo.local_url}", "For a public link, pass --share yes."]
    assert "share=True" not in out


# --- predictor rules without the server --------------------------------------------------------------------


def test_normalize_mask_variants(predictor):
    assert predictor.normalize("a [MASK] b <MASK> c [Mask] d < mask > e <mask>") == \
        "a <mask> b <mask> c <mask> d <mask> e <mask>"


def test_targets_with_and_without_leading_space(predictor):
    tok = predictor.tokenizer
    vocab = tok.get_vocab()
    w1, w2 = _two_vocabulary_words(predictor)
    ids, rejected = predictor.resolve_targets(f"{w1}, Ġ{w2}, {OOV_WORD}, {w1}")
    assert rejected == [OOV_WORD]
    assert ids == [vocab["Ġ" + w1], vocab["Ġ" + w2]]  # unique, in the order given
    # a word that is one token without the leading space (e.g. at the start of a text) is accepted too
    bare = next(t for t in vocab if t.isascii() and t.isalpha() and len(t) > 1 and "Ġ" + t not in vocab)
    assert predictor.resolve_targets(bare) == ([vocab[bare]], [])
    both = next((t for t in vocab if t.isascii() and t.isalpha() and len(t) > 1 and "Ġ" + t in vocab), None)
    if both:  # both forms are scored
        assert predictor.resolve_targets(both)[0] == [vocab["Ġ" + both], vocab[both]]
    assert predictor.resolve_targets(["", " "]) == ([], [])


def test_duplicate_display_strings_are_not_merged(predictor):
    # two ids whose decoded text is identical must both be listed
    full = predictor.predict("the cat sat on the <mask> .", predictor.num_candidates)
    strings = [c["token_str"] for c in full["masks"][0]]
    ids = [c["token"] for c in full["masks"][0]]
    assert len(ids) == len(set(ids)) == predictor.num_candidates
    decoded = {}
    for i in range(len(predictor.tokenizer)):
        decoded.setdefault(predictor.tokenizer.decode([i]), []).append(i)
    dupes = {s: v for s, v in decoded.items() if len(v) > 1 and not set(v) & set(predictor.special_ids)}
    # byte-level BPE: the lone bytes >= 0x80 all decode to U+FFFD
    assert len(dupes.get("\ufffd", [])) >= 64
    for s, v in dupes.items():
        assert strings.count(s) == len(v)


def test_special_tokens_never_candidates(predictor):
    full = predictor.predict("<mask> <mask>", predictor.num_candidates)
    assert full["ok"]
    for ranked in full["masks"]:
        assert not {c["token"] for c in ranked} & set(predictor.special_ids)


def test_result_rows_for_the_table(predictor):
    from spaces_demo.app import RESULT_HEADERS, result_rows

    r = predictor.predict("the <mask> sat on the <mask> .", 2)
    rows = result_rows(r)
    assert len(rows) == 4 and len(rows[0]) == len(RESULT_HEADERS)
    assert [(row[0], row[1]) for row in rows] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert rows[0][4] == r["masks"][0][0]["token"] and rows[0][5] == round(r["masks"][0][0]["score"], 4)


def test_tensorflow_backend_matches_torch(trained_model_dir, predictor):
    pytest.importorskip("tensorflow")
    from hf_tpu_ext.fill_mask import FillMaskPredictor

    tf_pred = FillMaskPredictor(trained_model_dir, backend="tensorflow")
    assert tf_pred.backend == "tensorflow"
    text = "the <mask> sat on the <mask> ."
    a, b = predictor.predict(text, 5), tf_pred.predict(text, 5)
    assert a["filled"] == b["filled"]
    for ra, rb in zip(a["masks"], b["masks"]):
        assert [c["token"] for c in ra] == [c["token"] for c in rb]
        assert [c["score"] for c in ra] == pytest.approx([c["score"] for c in rb], abs=1e-4)


def test_select_backend(monkeypatch):
    from hf_tpu_ext.fill_mask import select_backend

    monkeypatch.delenv("FILL_MASK_BACKEND", raising=False)
    assert select_backend() == "torch"  # torch is installed in the test environment
    monkeypatch.setenv("FILL_MASK_BACKEND", "tf")
    assert select_backend() == "tensorflow"
    assert select_backend("pytorch") == "torch"
    with pytest.raises(ValueError, match="Unknown fill-mask backend 'jax'"):
        select_backend("jax")


def test_default_model_id(monkeypatch, tmp_path):
    import spaces_demo.app as app

    monkeypatch.setenv("MODEL_ID", "alice/m1")
    assert app.default_model_id() == "alice/m1"
    monkeypatch.delenv("MODEL_ID")
    monkeypatch.setattr(app, "__file__", str(tmp_path / "app.py"))
    assert app.default_model_id() is None
    (tmp_path / "model_id.txt").write_text("alice/m2\n")
    assert app.default_model_id() == "alice/m2"


# --- Space files ---------------------------------------------------------------------------------------------


def _space_metadata():
    from huggingface_hub import SpaceCard

    with open(os.path.join(DEMO_DIR, "README.md"), encoding="utf-8") as f:
        return SpaceCard(f.read()).data


def test_space_readme_metadata_matches_gradio():
    import gradio

    data = _space_metadata()
    assert data.sdk == "gradio"
    assert data.sdk_version == gradio.__version__
    assert data.app_file == "app.py"
    assert data.title and data.emoji and data.colorFrom and data.colorTo
    assert data.license == "apache-2.0"
    assert isinstance(data.models, list) and data.models
    assert 0 < len(data.short_description) <= 60


def test_space_requirements_pinned_to_the_tested_versions():
    from importlib.metadata import version

    with open(os.path.join(DEMO_DIR, "requirements.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    # CPU torch: PyTorch's CPU index, and the +cpu build pinned (PyPI's Linux torch pulls CUDA libraries)
    assert lines[0] == "--extra-index-url https://download.pytorch.org/whl/cpu"
    pins = dict(line.split("==") for line in lines[1:])
    assert set(pins) == {"torch", "numpy", "safetensors", "tokenizers", "transformers", "huggingface_hub", "gradio",
                         "matplotlib"}
    assert pins.pop("torch") == version("torch").split("+")[0] + "+cpu"
    for name, pinned in pins.items():
        assert pinned == version(name), name


def test_app_is_the_ui_on_the_fill_mask_library():
    """app.py imports only hf_tpu_ext.fill_mask (uploaded with the Space) and no framework at module level."""
    import ast

    with open(os.path.join(DEMO_DIR, "app.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names] + \
        [n.module for n in top if isinstance(n, ast.ImportFrom)]
    ours = [n for n in names if n.startswith("hf_tpu_ext")]
    assert ours and all(n.startswith("hf_tpu_ext.fill_mask") for n in ours)
    assert not any(n.startswith(("tensorflow", "torch", "gradio", "transformers")) for n in names)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"FillMaskPredictor", "ModelCache", "list_revisions"}.isdisjoint(
        {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))})
    assert "build_demo" in functions


# --- hf-tpu demo ----------------------------------------------------------------------------------------------


def test_demo_command_argument_errors(tmp_path, monkeypatch, capsys):
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as hf_logging

    from hf_tpu_ext import cli

    monkeypatch.delenv("MODEL_ID", raising=False)
    assert cli.main(["demo"]) == 1
    assert "hf-tpu demo OUTPUT_DIR" in capsys.readouterr().err
    enable_progress_bars()
    verbosity = hf_logging.get_verbosity()
    assert cli.main(["demo", str(tmp_path)]) == 1
    assert "has no config.json" in capsys.readouterr().err
    # the command quieted the libraries while it ran (in this process) and put them back when it ended
    assert not are_progress_bars_disabled() and hf_logging.get_verbosity() == verbosity
    with pytest.raises(SystemExit):
        cli.main(["demo", str(tmp_path), "--share", "maybe"])


def test_demo_command_builds_app(trained_model_dir, predictor):
    from hf_tpu_ext.commands.demo import build_parser, load_demo

    args = build_parser().parse_args([str(trained_model_dir), "--port", "7861", "--share", "no"])
    assert (args.host, args.port, args.share) == ("127.0.0.1", 7861, False)
    demo = load_demo(args.model, backend="torch", concurrency_limit=2)
    assert demo.predictor.max_length == predictor.max_length
    assert any(fn.api_name == "fill_mask" for fn in demo.fns.values())
