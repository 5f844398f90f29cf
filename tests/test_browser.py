"""The demo page in headless Chromium: type a sentence, submit, see ranked predictions (screenshot saved)."""

from __future__ import annotations

import os

import pytest

from test_demo_support import build_tiny_fill_mask_model, launched_demo

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "artifacts")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}"),
]

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


@pytest.fixture(scope="session")
def trained_model_dir(tmp_path_factory):
    """A tiny RoBERTa fill-mask folder (stand-in for the conftest fixture of the same name)."""
    return build_tiny_fill_mask_model(str(tmp_path_factory.mktemp("tiny_fill_mask")))


def test_page_shows_ranked_predictions(trained_model_dir):
    sync_api = pytest.importorskip("playwright.sync_api")

    os.makedirs(ARTIFACTS, exist_ok=True)
    with launched_demo(trained_model_dir, backend="torch") as (_, url), sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1100})
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            sentence = page.get_by_label("Sentence")
            sentence.wait_for(timeout=60_000)
            assert sentence.get_attribute("placeholder") == "Paris is the <mask> of France."
            sentence.fill("paris is the <mask> of france .")
            page.get_by_label("top_k").fill("3")
            page.get_by_role("button", name="Fill", exact=True).click()

            filled = page.get_by_label("Filled with the best guesses")
            page.wait_for_function(
                "() => [...document.querySelectorAll('#fill-mask-filled textarea, #fill-mask-filled input')]"
                ".some(e => e.value.includes('capital'))", timeout=60_000)
            assert filled.input_value() == "paris is the capital of france ."

            table = page.locator("#fill-mask-table")
            table.get_by_text("' capital'").first.wait_for(timeout=30_000)
            text = table.inner_text()
            # three ranked rows for mask 1, best first, no special tokens
            assert text.index("' capital'") >= 0
            for special in ("<s>", "</s>", "<pad>", "<mask>", "<unk>"):
                assert special not in text
            rows = page.locator("#fill-mask-table tbody tr")
            assert rows.count() == 3
            first = rows.nth(0).inner_text()
            assert "' capital'" in first and "Ġcapital" in first
            page.screenshot(path=os.path.join(ARTIFACTS, "demo.png"), full_page=True)
        finally:
            browser.close()
