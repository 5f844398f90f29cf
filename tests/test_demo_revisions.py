"""The Space as a test bench, end to end on the loopback Hub.

One ``hf-tpu train --push_to_hub --hub_strategy all_checkpoints --probe_file probes.txt --hub_space_id ...`` run
(20 steps, evaluation at steps 10 and 20, saves pushed at steps 5, 10 and 15, the save at step 20 in the final
push) fills a model repo and deploys the Space; the Space's own
files (``app.py`` + the ``hf_tpu_ext/fill_mask`` library as uploaded) are then launched against the repo and driven
with gradio_client: the revision list is the repo's commits (the initial commit marked not loadable), two revisions
answer differently, and a 200-line probe file scores the same in the app, in ``hf-tpu probe`` and in the training
log, with intervals and a paired comparison.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import pytest

from conftest import tiny_train_args
from demo_support import free_port, gradio_client

REPO = "alice/bench-mlm"
SPACE = "alice/bench-mlm-demo"
SENTENCE = "the <mask> of the module is used ."

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def _patch_hub(mp: pytest.MonkeyPatch, endpoint: str, home) -> None:
    """Point huggingface_hub at the loopback Hub for a whole module (what the ``loopback_hub`` fixture does)."""
    from huggingface_hub import constants, file_download, hf_api

    mp.setenv("HF_ENDPOINT", endpoint)
    mp.setenv("HF_HUB_DISABLE_XET", "1")
    mp.setenv("HF_HOME", str(home))
    mp.delenv("HF_TOKEN", raising=False)
    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    mp.setattr(constants, "ENDPOINT", endpoint)
    mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    mp.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
    mp.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    mp.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    mp.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    mp.setattr(hf_api.api, "endpoint", endpoint)


def write_probe_file(path, tokenizer, n: int = 200, max_tokens: int = 30) -> int:
    """``n`` cloze lines cut from the default corpus: a mid-sentence word that is one ``Ġword`` token masked."""
    from hf_tpu_ext.data.corpus import default_corpus_texts

    vocab = tokenizer.get_vocab()
    lines = []
    for text in default_corpus_texts():
        words = text.split()
        for start in range(0, max(0, len(words) - 10), 7):
            window = words[start:start + 10]
            for j in range(2, len(window)):
                w = window[j]
                if w.isalpha() and w.islower() and "\u0120" + w in vocab:
                    sentence = " ".join(window[:j] + ["<mask>"] + window[j + 1:])
                    if sentence.startswith("#") or "=>" in sentence or "\u21d2" in sentence or "|" in sentence:
                        break  # a comment line or an arrow inside the sentence would change the probe
                    if len(tokenizer(sentence.replace("<mask>", tokenizer.mask_token))["input_ids"]) <= max_tokens:
                        lines.append(f"{sentence} \u21d2 {w}")
                    break
            if len(lines) == n:
                path.write_text("\n".join(lines) + "\n", encoding="utf-8")
                return n
    raise AssertionError(f"only {len(lines)} probe lines found")


@pytest.fixture(scope="module")
def bench(loopback_hub_server, trained_model_dir, tmp_path_factory):
    """The pushed repo, the training results, and the deployed Space's app launched against the repo."""
    from transformers import AutoTokenizer

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train
    from hub_fixtures import ALICE_TOKEN

    server = loopback_hub_server
    server.reset()
    tmp = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as mp:
        _patch_hub(mp, server.endpoint, tmp / "hf_home")
        probe_path = tmp / "probes.txt"
        write_probe_file(probe_path, AutoTokenizer.from_pretrained(trained_model_dir))
        out = tmp / "run"
        results = train(*parse_args(tiny_train_args(
            out, "--max_steps", "20", "--save_strategy", "steps", "--save_steps", "5", "--eval_strategy", "steps",
            "--eval_steps", "10", "--push_to_hub", "true", "--hub_model_id", REPO, "--hub_strategy", "all_checkpoints",
            "--hub_token", ALICE_TOKEN, "--probe_file", str(probe_path), "--tokenizer_name", str(trained_model_dir),
            "--hub_space_id", SPACE, "--learning_rate", "5e-3")))

        # the Space exactly as deployed: its files in a folder of their own, app.py imported from there
        space_dir = tmp / "space"
        space_dir.mkdir()
        for name, data in server.files(SPACE, "space").items():
            (space_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (space_dir / name).write_bytes(data)
        spec = importlib.util.spec_from_file_location("deployed_space_app", str(space_dir / "app.py"))
        app = importlib.util.module_from_spec(spec)
        mp.setattr("sys.path", list(sys.path))  # app.py puts its own folder first; undone with the patch
        spec.loader.exec_module(app)
        mp.delenv("MODEL_ID", raising=False)
        demo = app.build_demo(app.default_model_id(), backend="torch", cache_size=3)
        demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
        try:
            yield {"server": server, "out": out, "results": results, "probe_path": probe_path, "app": app,
                   "demo": demo, "client": gradio_client(demo.local_url), "url": demo.local_url}
        finally:
            demo.close()
            server.reset()


def _commit(bench, title):
    return next(c for c in reversed(bench["server"].commits(REPO)) if c["message"] == title)


def _log_history(bench):
    with open(bench["out"] / "trainer_state.json", encoding="utf-8") as f:
        return json.load(f)["log_history"]


def test_deployed_space_shows_the_repo(bench):
    assert bench["app"].default_model_id() == REPO
    assert bench["app"].FillMaskBench.__module__ == "hf_tpu_ext.fill_mask.bench"  # the library, uploaded with it
    assert bench["demo"].bench.model == REPO


def test_revision_list_matches_the_repo_commits(bench):
    commits = list(reversed(bench["server"].commits(REPO)))  # newest first
    titles = [c["message"] for c in commits]
    listing = bench["client"].predict(api_name="/revisions")
    branches = [r for r in listing if r["kind"] == "branch"]
    assert [(b["value"], b["sha"]) for b in branches] == [("main", commits[0]["sha"])]
    assert branches[0]["label"] == f"main (branch) · {titles[0]} · {commits[0]['sha'][:7]}"
    listed = [r for r in listing if r["kind"] == "commit"]
    # one entry per commit: the commit main points to is listed once, as main
    assert [r["sha"] for r in listing] == [c["sha"] for c in commits] and branches[0]["refs"] == ["main"]
    assert [r["value"] for r in listed] == [c["sha"] for c in commits[1:]]
    # the initial commit (only .gitattributes) is listed as not loadable, with the reason; every push is loadable
    assert [(r["title"], r["loadable"], r["reason"]) for r in listed if not r["loadable"]] == \
        [("initial commit", False, "no config.json, no model weights (model.safetensors), no tokenizer files")]
    assert branches[0]["loadable"] is True and bench["demo"].bench.default_value() == "main"
    assert commits[-1]["sha"] not in [r["value"] for r in bench["demo"].bench.offered()]
    assert [r["label"] for r in listed] == [f"{c['message']} · {c['sha'][:7]}" for c in commits[1:]]
    steps = {r["title"]: r["step"] for r in listing}
    assert steps["End of training"] is None  # no step in the title: read from trainer_state.json when scored
    # saves at steps 5, 10, 15 push the model and checkpoint-<step>/; the save at the last step (20) is carried by
    # the final push: the model in "End of training", checkpoint-20/ in its own commit
    # (the upload order of a save's two commits is the push queue's: compared as a set)
    assert sorted(titles) == sorted(["End of training", "initial commit"] + [
        t for s in (5, 10, 15) for t in (f"Training in progress, step {s}", f"Checkpoint at step {s}")]
        + ["Checkpoint at step 20"])  # all_checkpoints: the final push carries checkpoint-20/ too, as the Trainer's
    assert titles[-1] == "initial commit"
    assert steps["Training in progress, step 10"] == 10 and steps["Checkpoint at step 15"] == 15


def test_two_revisions_give_different_answers(bench):
    from spaces_demo.app import FillMaskPredictor

    early, final = _commit(bench, "Training in progress, step 10")["sha"], _commit(bench, "End of training")["sha"]
    both = bench["client"].predict(SENTENCE, 5, "", early, final, api_name="/compare")
    a, b = both["a"], both["b"]
    assert a["ok"] and b["ok"]
    assert a["revision"]["sha"] == early and b["revision"]["sha"] == final and b["revision"]["step"] == 20
    scores_a = [c["score"] for c in a["masks"][0]]
    scores_b = [c["score"] for c in b["masks"][0]]
    assert scores_a != pytest.approx(scores_b, rel=1e-2)
    # the final revision is the local output folder's model
    local = FillMaskPredictor(bench["out"], backend="torch").predict(SENTENCE, 5)
    assert [c["token"] for c in b["masks"][0]] == [c["token"] for c in local["masks"][0]]
    assert scores_b == pytest.approx([c["score"] for c in local["masks"][0]], rel=1e-5)
    # a short sha and a branch name resolve to the same commits
    assert bench["client"].predict(SENTENCE, 5, "", early[:7], api_name="/fill_mask")["masks"] == a["masks"]
    assert bench["client"].predict(SENTENCE, 5, "", "main", api_name="/fill_mask")["masks"] == b["masks"]


def test_initial_commit_is_refused_with_a_message(bench):
    initial = bench["server"].commits(REPO)[0]
    r = bench["client"].predict(SENTENCE, api_name="/fill_mask", revision=initial["sha"])
    assert r["ok"] is False and r["masks"] == []
    assert r["message"] == (f"Revision '{initial['message']} · {initial['sha'][:7]}' of {REPO} has no loadable model "
                            "(no config.json, no model weights (model.safetensors), no tokenizer files); "
                            "pick another revision.")


def test_probe_scores_match_in_app_cli_and_training_log(bench, capsys):
    from hf_tpu_ext import cli

    history = {e["step"]: e for e in _log_history(bench) if "probe_mrr" in e}
    assert sorted(history) == [10, 20] and history[20]["probe_n"] == 200
    early, final = _commit(bench, "Training in progress, step 10")["sha"], _commit(bench, "End of training")["sha"]
    text = bench["probe_path"].read_text(encoding="utf-8")
    result = bench["client"].predict(text, f"{early},{final}", api_name="/probe")
    assert result["ok"] is True and result["n"] == 200
    assert result["message"] == "Scored 200 probes on 2 revisions."
    rows = {r["step"]: r for r in result["rows"]}
    assert sorted(rows) == [10, 20] and rows[10]["sha"] == early and rows[20]["sha"] == final
    assert cli.main(["probe", f"{REPO}@{early},{final}", str(bench["probe_path"]), "--json"]) == 0
    cli_rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [c["revision"] for c in cli_rows] == [early, final]
    for step, cli_row in zip((10, 20), cli_rows):
        app_row, logged = rows[step], history[step]
        # app and CLI: the same code on the same PyTorch weights
        assert (cli_row["n"], cli_row["top1"], cli_row["top5"], cli_row["mrr"]) == \
            (app_row["n"], app_row["top1"], app_row["top5"], app_row["mrr"])
        # training: TensorFlow's forward pass on the weights of that step
        assert (logged["probe_n"], logged["probe_top1"], logged["probe_top5"]) == \
            (app_row["n"], app_row["top1"], app_row["top5"])
        assert logged["probe_mrr"] == pytest.approx(app_row["mrr"], abs=1e-9)
    assert 0 < rows[20]["mrr"] <= 1 and rows[20]["lines_per_second"] > 0
    for row in rows.values():  # every figure with its 95% interval
        for metric in ("top1", "top5", "mrr", "loglik"):
            low, high = row["intervals"][metric]
            assert low <= row[metric] <= high
    (comparison,) = result["comparisons"]  # step 20 against step 10 on the same 200 probes
    assert comparison["n"] == 200 and comparison["b"] == rows[20]["label"]
    assert comparison["metrics"]["top1"]["diff"] == pytest.approx(rows[20]["top1"] - rows[10]["top1"])
    assert comparison["facts"] == 200 and comparison["enough"] is True and "corrected_over" not in comparison
    # main and the sha it points to are one commit: one row, nothing compared with itself
    main_sha = bench["server"].commits(REPO)[-1]["sha"]
    once = bench["client"].predict(text, f"main,{main_sha}", api_name="/probe")
    assert once["ok"] is True and [r["sha"] for r in once["rows"]] == [main_sha] and once["comparisons"] == []
    assert once["message"] == (f"Scored 200 probes on 1 revision. {main_sha} is the same commit as main "
                               f"({main_sha[:7]}): scored once.")
    assert cli.main(["probe", f"{REPO}@main,{main_sha}", str(bench["probe_path"])]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and out.startswith(f"{REPO}@main: probes=200 ")  # no comparison with itself
    assert err == f"hf-tpu probe: {REPO}@{main_sha} is the same commit as {REPO}@main ({main_sha[:7]}): scored once.\n"


def test_probe_scores_land_in_the_card(bench):
    card = bench["server"].files(REPO)["README.md"].decode()
    last = [e for e in _log_history(bench) if "probe_mrr" in e][-1]
    mrr = f"{last['probe_mrr']:.4f}".rstrip("0").rstrip(".")
    assert f"| Cloze probes: mean reciprocal rank (200 probes) | {mrr} |" in card
    assert "| Cloze probes: top-1 accuracy (200 probes) |" in card


def test_models_cached_by_revision_least_recently_used_out(bench):
    cache = bench["demo"].bench.cache
    shas = [c["sha"] for c in reversed(bench["server"].commits(REPO)) if c["message"] != "initial commit"]
    assert len(shas) >= 4  # every commit after the first has the model at its root
    for sha in shas[:3]:
        bench["client"].predict(SENTENCE, api_name="/fill_mask", revision=sha)
    assert cache.max_models == 3 and cache.keys() == [(REPO, sha) for sha in shas[:3]]
    loads = cache.loads
    bench["client"].predict(SENTENCE, api_name="/fill_mask", revision=shas[0])  # a hit: moves to the end
    assert cache.loads == loads and cache.keys()[-1] == (REPO, shas[0])
    bench["client"].predict(SENTENCE, api_name="/fill_mask", revision="main")
    main_sha = bench["server"].commits(REPO)[-1]["sha"]
    assert len(cache.keys()) == 3 and cache.keys()[-1] == (REPO, main_sha)
    if main_sha not in shas[:3]:
        assert (REPO, shas[1]) not in cache.keys()  # the least recently used went out


def test_bad_model_b_is_refused(bench):
    both = bench["client"].predict(SENTENCE, 5, "", "", "", "../etc", api_name="/compare")
    assert both["a"]["ok"] is True and both["b"]["ok"] is False
    assert re.match(r"'\.\./etc' is not a (valid )?Hub repo id", both["b"]["message"])


class _FakeApi:
    """``HfApi`` with two branches and a tag on a repo of three commits (main and v1 on the newest)."""

    def __init__(self, token=None):
        from types import SimpleNamespace as NS
        from datetime import datetime, timezone

        when = datetime(2026, 1, 1, tzinfo=timezone.utc)
        self.commits = [NS(commit_id=c * 40, title=t, created_at=when) for c, t in
                        (("c", "End of training"), ("b", "Training in progress, step 10"), ("a", "initial commit"))]
        self.refs = NS(branches=[NS(name="dev", target_commit="b" * 40), NS(name="main", target_commit="c" * 40)],
                       tags=[NS(name="v1", target_commit="c" * 40)])

    def list_repo_refs(self, model):
        return self.refs

    def list_repo_commits(self, model):
        return self.commits

    def list_repo_files(self, model, revision=None):
        return [".gitattributes"] if revision == "a" * 40 else ["config.json", "model.safetensors", "tokenizer.json"]


def test_one_entry_per_commit(monkeypatch):
    import huggingface_hub

    from hf_tpu_ext.fill_mask import revisions

    monkeypatch.setattr(huggingface_hub, "HfApi", _FakeApi)
    listing = revisions.list_revisions("alice/fake")
    assert [(r["value"], r["kind"], r["refs"], r["sha"][0]) for r in listing] == [
        ("main", "branch", ["main", "v1"], "c"), ("dev", "branch", ["dev"], "b"), ("a" * 40, "commit", [], "a")]
    assert listing[0]["label"] == f"main (branch), v1 (tag) · End of training · {'c' * 7}"
    assert [r["loadable"] for r in listing] == [True, True, False] and listing[1]["step"] == 10
