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
            assert page.locator("#fill-mask-message").inner_text().strip() == "Filled 1 mask."
            page.screenshot(path=os.path.join(ARTIFACTS, "demo.png"), full_page=True)

            # no mask: a message says what to type (the mask token shown literally), no table rows
            sentence.fill("hello world")
            page.get_by_role("button", name="Fill", exact=True).click()
            message = page.locator("#fill-mask-message")
            page.wait_for_function("() => document.querySelector('#fill-mask-message').innerText.includes('No mask')",
                                   timeout=30_000)
            assert "put <mask> (or [MASK])" in message.inner_text()
            assert filled.input_value() == ""
        finally:
            browser.close()
