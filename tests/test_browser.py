"""The demo page in headless Chromium: type a sentence, submit, see ranked predictions (screenshot saved)."""

from __future__ import annotations

import os
import re

import pytest

from demo_support import launched_demo

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "artifacts")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}"),
]

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def test_page_shows_ranked_predictions(trained_model_dir):
    sync_api = pytest.importorskip("playwright.sync_api")

    os.makedirs(ARTIFACTS, exist_ok=True)
    with launched_demo(trained_model_dir, backend="torch") as (demo, url), sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1100})
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            sentence = page.get_by_label("Sentence")
            sentence.wait_for(timeout=60_000)
            assert sentence.get_attribute("placeholder") == "Paris is the <mask> of France."
            text = "paris is the <mask> of france ."
            expected = demo.predictor.predict(text, 3)
            best = [c["token_str"] for c in expected["masks"][0]]
            sentence.fill(text)
            page.get_by_label("top_k").fill("3")
            filled = page.get_by_label("Filled with the best guesses")
            # On a loaded machine the page can show its inputs before its event handlers are live, so an
            # early click may be lost: click again (at most 3 times) until the result arrives.
            for attempt in range(3):
                page.get_by_role("button", name="Fill", exact=True).click()
                try:
                    page.wait_for_function(
                        "want => [...document.querySelectorAll('#fill-mask-filled textarea, #fill-mask-filled input')]"
                        ".some(e => e.value === want)", arg=expected["filled"], timeout=40_000)
                    break
                except sync_api.TimeoutError:
                    page.screenshot(path=os.path.join(ARTIFACTS, f"demo-timeout-{attempt}.png"), full_page=True)
                    if attempt == 2:
                        raise
            assert filled.input_value() == f"paris is the{best[0]} of france ."

            # the Dataframe is a virtual table: read its visible text, one cell per line
            table = page.locator("#fill-mask-table")
            page.wait_for_function("want => document.querySelector('#fill-mask-table').innerText.includes(want)",
                                   arg=repr(best[0]), timeout=30_000)
            cells = [c.strip() for c in table.inner_text().splitlines() if c.strip()]
            tokens = [c for c in cells if re.fullmatch(r"'.*'", c)]
            scores = [float(c) for c in cells if re.fullmatch(r"\d+\.\d+", c)]
            assert tokens == [repr(t) for t in best]  # ranked, best first
            assert scores == [round(c["score"], 4) for c in expected["masks"][0]]
            assert scores == sorted(scores, reverse=True) and all(0 < x <= 1 for x in scores)
            for special in ("<s>", "</s>", "<pad>", "<mask>", "<unk>"):
                assert not any(special in c for c in tokens)
            lines = [x.strip() for x in page.locator("#fill-mask-message").inner_text().splitlines() if x.strip()]
            assert lines == [f"local folder {trained_model_dir.name}", "Filled 1 mask."]  # revision A's label
            page.screenshot(path=os.path.join(ARTIFACTS, "demo.png"), full_page=True)

            # no mask: a message says what to type (the mask token shown literally), no table rows
            sentence.fill("hello world")
            page.get_by_role("button", name="Fill", exact=True).click()
            message = page.locator("#fill-mask-message")
            page.wait_for_function("() => document.querySelector('#fill-mask-message').innerText.includes('No mask')",
                                   timeout=30_000)
            assert "put <mask> where the missing word goes ([MASK] works too)" in message.inner_text()
            assert filled.input_value() == ""
        finally:
            browser.close()


# --- the test bench: two revisions side by side, a probe set across revisions ----------------------------------

BENCH_REPO = "alice/bench-browser"


def _push_states(api, model_dir, tmp_path):
    """Three commits of the session model: noisier weights stand in for earlier steps (cheap, deterministic)."""
    import json
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    rng = np.random.default_rng(0)
    api.create_repo(BENCH_REPO)
    for step, noise in ((10, 1.0), (20, 0.4), (None, 0.0)):
        folder = tmp_path / f"state-{step}"
        shutil.copytree(model_dir, folder, ignore=shutil.ignore_patterns("checkpoints", "runs", "*.png"))
        noisy = {k: (v + noise * v.std() * rng.standard_normal(v.shape)).astype(v.dtype) if v.ndim > 1 and noise else v
                 for k, v in weights.items()}
        save_file(noisy, str(folder / "model.safetensors"), metadata={"format": "pt"})
        if step is None:
            (folder / "trainer_state.json").write_text(json.dumps({"global_step": 30}))
        api.upload_folder(repo_id=BENCH_REPO, folder_path=str(folder),
                          commit_message=f"Training in progress, step {step}" if step else "End of training")


def _pick(page, label, option):
    """Choose a dropdown option (again if the page re-rendered the list under the click)."""
    box = page.get_by_label(label, exact=True)
    for attempt in range(3):
        try:
            page.locator("h1").first.click()  # blur: a focused dropdown does not reopen on a click
            box.click()
            page.get_by_role("option", name=option, exact=True).click(timeout=10_000)
            page.wait_for_function("([l, want]) => document.querySelector(`input[aria-label=\"${l}\"]`).value === want",
                                   arg=[label, option], timeout=5_000)
            return
        except Exception:
            if attempt == 2:
                raise


def _table_tokens(page, elem_id):
    cells = [c.strip() for c in page.locator(f"#{elem_id}").inner_text().splitlines() if c.strip()]
    return [c for c in cells if re.fullmatch(r"'.*'", c)]


def _check_probe_chart(page, demo, label, sha):
    """The probe tab: a probe set with multi-token answers, two templates a line and a distractor, on two revisions;
    a row each with 95% intervals, the template spread and the paired comparison, and the chart."""
    bench = demo.bench
    page.get_by_role("tab", name="Probe set").click()
    tok = demo.predictor.tokenizer
    vocab = tok.get_vocab()
    words = sorted(t[1:] for t in vocab if t.startswith("\u0120") and t[1:].isascii() and t[1:].isalpha() and len(t) > 3)[:24]
    long_words = sorted({w + s for w in words for s in ("ings", "ers")
                         if len(tok(" " + w + s, add_special_tokens=False)["input_ids"]) >= 2})[:12]
    assert len(long_words) == 12
    probe_lines = [f"the {a} of the <mask> is {b} . | {b} is the <mask> . \u21d2 {c} | {a}"
                   for a, b, c in zip(words, words[12:], long_words)]
    page.locator("#probe-text textarea").fill("\n".join(probe_lines))
    ticked = ("Training in progress, step 10", "End of training")
    for title in ticked:
        page.get_by_label(label[title], exact=True).check()
    page.get_by_role("button", name="Score probe set").click()
    page.wait_for_function("() => /Scored|Not scored|Note/.test(document.querySelector('#probe-message').innerText)",
                           timeout=90_000)
    n = 2 * len(probe_lines)
    assert page.locator("#probe-message").inner_text().strip() == f"Scored {n} probes on 2 revisions."
    expected = bench.probe("\n".join(probe_lines), [sha[t] for t in ticked])
    assert all(r["multi_token"] == n for r in expected["rows"])
    page.wait_for_function("want => document.querySelector('#probe-table').innerText.includes(want)",
                           arg=label["End of training"], timeout=30_000)
    table = page.locator("#probe-table").inner_text()
    for title, row in zip(ticked, expected["rows"]):
        assert label[title] in table
        low, high = row["intervals"]["top1"]
        assert f"{row['top1']:.3f} [{low:.3f}, {high:.3f}]" in table  # the value and its 95% interval
        low, high = row["intervals"]["mrr"]
        assert f"{row['mrr']:.3f} [{low:.3f}, {high:.3f}]" in table
    notes = page.locator("#probe-compare").inner_text()
    assert "2 templates" in notes and "spread (max - min)" in notes
    assert f"on {n} paired probes" in notes and "McNemar exact" in notes
    page.locator("#probe-plot img").first.wait_for(timeout=30_000)  # the matplotlib chart
    page.wait_for_timeout(1000)  # let the chart finish drawing before the screenshot
    page.screenshot(path=os.path.join(ARTIFACTS, "bench-probe-chart.png"), full_page=True)


def test_bench_side_by_side_and_probe_chart(trained_model_dir, loopback_hub, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    from huggingface_hub import HfApi

    os.makedirs(ARTIFACTS, exist_ok=True)
    _push_states(HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token), str(trained_model_dir), tmp_path)
    commits = list(reversed(loopback_hub.server.commits(BENCH_REPO)))  # newest first
    label = {c["message"]: f"{c['message']} \u00b7 {c['sha'][:7]}" for c in commits}
    label[commits[0]["message"]] = "main (branch) \u00b7 " + label[commits[0]["message"]]  # one entry per commit
    sha = {c["message"]: c["sha"] for c in commits}
    text = "the <mask> of the module is used ."
    with launched_demo(BENCH_REPO, backend="torch") as (demo, url), sync_api.sync_playwright() as pw:
        bench = demo.bench
        early = bench.predictor(BENCH_REPO, sha["Training in progress, step 10"])[0].predict(text, 5)
        final = bench.predictor(BENCH_REPO, sha["End of training"])[0].predict(text, 5)
        want_a = [repr(c["token_str"]) for c in early["masks"][0]]
        want_b = [repr(c["token_str"]) for c in final["masks"][0]]
        assert want_a != want_b  # the two states really differ
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            page.get_by_label("Sentence").wait_for(timeout=60_000)
            # the page lists the repo's commits that hold a model, newest first, by their titles; the initial
            # commit (only .gitattributes) is not offered, and the note under the pickers says why
            page.get_by_label("Revision A", exact=True).click()
            options = page.get_by_role("option")
            shown = [options.nth(i).inner_text().strip().lstrip("\u2713").strip() for i in range(options.count())]
            assert shown == [label[c["message"]] for c in commits if c["message"] != "initial commit"]
            assert label["initial commit"] not in shown
            page.locator("h1").first.click()
            note = page.locator("#revisions-note").inner_text()
            assert f"Not offered (no model at that revision): {label['initial commit']} (no config.json" in note
            _pick(page, "Revision A", label["Training in progress, step 10"])
            _pick(page, "Revision B (optional)", label["End of training"])
            page.get_by_label("Sentence").fill(text)
            for attempt in range(3):  # an early click can be lost on a loaded machine
                page.get_by_role("button", name="Fill", exact=True).click()
                try:
                    page.wait_for_function(
                        "ids => ids.every(id => document.querySelector('#' + id).innerText.includes(\"'\"))",
                        arg=["fill-mask-table", "fill-mask-table-b"], timeout=40_000)
                    break
                except sync_api.TimeoutError:
                    if attempt == 2:
                        raise
            assert _table_tokens(page, "fill-mask-table") == want_a
            assert _table_tokens(page, "fill-mask-table-b") == want_b
            assert label["End of training"] in page.locator("#fill-mask-message-b").inner_text()
            page.screenshot(path=os.path.join(ARTIFACTS, "bench-side-by-side.png"), full_page=True)

            _check_probe_chart(page, demo, label, sha)
        finally:
            browser.close()
