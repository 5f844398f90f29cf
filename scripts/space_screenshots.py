"""Screenshots of the fill-mask test bench for the README (``docs/space_side_by_side.png``, ``docs/space_probe_chart.png``).

A tiny RoBERTa (``tests/demo_support.py``: 2 layers, hidden 64) is trained on eight sentences for 160 steps;
its states after 15, 40 and 80 steps (same seed, so the same run) and at the end are pushed to a loopback Hub
(``tests/loopback_hub.py``) as "Training in progress, step N" / "End of training" commits. The app is launched
against that repo and driven in headless Chromium: revisions A (step 15) and B (end) side by side, then a probe
set scored on the four revisions, with 95% intervals: every word of the eight sentences and of one sentence the
tokenizer never saw (so its words are several tokens) masked in turn, two templates a line (the sentence, and
"we read : " before it) and two distractors (other words of the corpus).

Usage (from the repository root; needs playwright and Debian's chromium):
    python scripts/space_screenshots.py [--out docs]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
REPO = "alice/tiny-fill-mask"
STEPS = (15, 40, 80, 160)
EXTRA = ["my friend likes watermelon and pineapple ."]  # trained on, not in the tokenizer's corpus: multi-token words


def _shrink(path: str) -> None:
    """Palette PNG (a screenshot has few colours): a fraction of the size."""
    from PIL import Image

    Image.open(path).convert("RGB").quantize(colors=128).save(path, optimize=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs"))
    args = parser.parse_args()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.makedirs(args.out, exist_ok=True)

    import pytest
    from huggingface_hub import HfApi
    from playwright.sync_api import sync_playwright

    from demo_support import CORPUS, build_tiny_fill_mask_model, launched_demo
    from hub_fixtures import ALICE_TOKEN, USERS
    from loopback_hub import LoopbackHubServer
    from test_demo_revisions import _patch_hub

    tmp = tempfile.mkdtemp(prefix="bench-shots-")
    server = LoopbackHubServer(USERS)
    mp = pytest.MonkeyPatch()
    try:
        from pathlib import Path

        _patch_hub(mp, server.endpoint, Path(tmp) / "hf_home")
        api = HfApi(endpoint=server.endpoint, token=ALICE_TOKEN)
        api.create_repo(REPO)
        for step in STEPS:
            folder = build_tiny_fill_mask_model(os.path.join(tmp, f"step-{step}"), train_steps=step,
                                                extra_sentences=EXTRA)
            final = step == STEPS[-1]
            if final:
                with open(os.path.join(folder, "trainer_state.json"), "w") as f:
                    json.dump({"global_step": step}, f)
            api.upload_folder(repo_id=REPO, folder_path=folder,
                              commit_message="End of training" if final else f"Training in progress, step {step}")
        commits = {c["message"]: f"{c['message']} \u00b7 {c['sha'][:7]}" for c in server.commits(REPO)}
        probes = []
        vocabulary = sorted({w for line in CORPUS + EXTRA for w in line.split() if w.isalpha() and len(w) > 2})
        for sentence in CORPUS + EXTRA:
            words = sentence.split()
            for i, w in enumerate(words):
                if i > 0 and w.isalpha():
                    masked = " ".join(words[:i] + ["<mask>"] + words[i + 1:])
                    others = [v for v in vocabulary if v != w]
                    rivals = [others[(i * 7) % len(others)], others[(i * 7 + 3) % len(others)]]
                    probes.append(f"{masked} | we read : {masked} \u21d2 {w} | " + " | ".join(rivals))

        with launched_demo(REPO, backend="torch") as (demo, url), sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                         args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1200, "height": 1150})
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            page.get_by_label("Sentence").wait_for(timeout=60_000)
            page.wait_for_timeout(1500)
            for box, title in (("Revision A", "Training in progress, step 15"), ("Revision B (optional)", "End of training")):
                page.locator("h1").first.click()
                field = page.get_by_label(box, exact=True)
                field.click()
                listbox = field.get_attribute("aria-controls")  # this dropdown's own option list
                page.locator(f"#{listbox}").get_by_role("option", name=commits[title], exact=True).click()
            page.get_by_label("Sentence").fill("paris is the <mask> of <mask> .")
            page.get_by_role("button", name="Fill", exact=True).click()
            page.wait_for_function("() => document.querySelector('#fill-mask-table-b').innerText.includes(\"'\")",
                                   timeout=60_000)
            page.wait_for_timeout(500)
            side = os.path.join(args.out, "space_side_by_side.png")
            bottom = page.locator("#fill-mask-table-b").bounding_box()
            page.screenshot(path=side, clip={"x": 0, "y": 0, "width": 1200, "height": bottom["y"] + bottom["height"] + 10})
            _shrink(side)

            page.set_viewport_size({"width": 1200, "height": 2400})  # the whole tab on screen: page coordinates
            page.get_by_role("tab", name="Probe set").click()
            page.locator("#probe-text textarea").fill("\n".join(probes))
            for title in [f"Training in progress, step {s}" for s in STEPS[:-1]] + ["End of training"]:
                page.get_by_label(commits[title], exact=True).check()
            page.get_by_role("button", name="Score probe set").click()
            page.wait_for_function("() => /Scored/.test(document.querySelector('#probe-message').innerText)",
                                   timeout=120_000)
            page.locator("#probe-compare").scroll_into_view_if_needed()
            page.locator("#probe-plot").scroll_into_view_if_needed()
            page.locator("#probe-plot img").first.wait_for(timeout=30_000)
            page.wait_for_timeout(1000)
            chart = os.path.join(args.out, "space_probe_chart.png")
            top = page.locator("#probe-revisions").bounding_box()
            end = page.locator("#probe-plot").bounding_box()
            page.screenshot(path=chart,
                            clip={"x": 0, "y": top["y"] - 10, "width": 1200, "height": end["y"] + end["height"] - top["y"] + 60})
            _shrink(chart)
            browser.close()
        print(side, os.path.getsize(side), "bytes;", chart, os.path.getsize(chart), "bytes;", len(probes), "probes")
    finally:
        mp.undo()
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
