"""Hub layer without TensorFlow: preflight, the push queue, model cards, resume specs, `hf-tpu push`."""

import json
import os
import logging
import socket
import time

import pytest

from hf_tpu_ext.errors import CheckpointError, HubAuthError, HubError, HubRepoError, ModelCardError
from hf_tpu_ext.hub.model_card import check_card_metadata, render_model_card, save_model_card, validate_model_card
from hf_tpu_ext.hub.preflight import preflight, resolve_token
from hf_tpu_ext.hub.push_queue import PushQueue
from hf_tpu_ext.hub.resume import download_last_checkpoint, looks_like_repo_spec, parse_repo_spec

SUMMARY = {
    "backend": "tensorflow", "accelerator": "TPU", "num_devices": 8, "strategy": "TPUStrategy", "num_replicas": 8,
    "global_batch_size": 256, "precision": "bf16 mixed", "jit_compile": True, "global_step": 1200, "epoch": 3.0,
    "tokens_seen": 39321600, "train_runtime": 3723.4, "train_tokens_per_second": 10560.3, "base_model": None,
    "dataset_name": None, "dataset_description": "the embedded default corpus", "num_parameters": 123456,
    "model_config": {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"], "hidden_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 300},
    "hyperparameters": {"learning_rate": 0.0005, "weight_decay": 0.01, "mlm_probability": 0.15, "hub_token": "x"},
    "eval_results": {"eval_loss": 2.0794, "perplexity": 8.0, "eval_accuracy": 0.4567},
    "framework_versions": {"transformers": "4.57.6", "tensorflow": "2.21.0"}, "mask_token": "<mask>",
}


def _folder(tmp_path, name="out", mask="<mask>"):
    out = tmp_path / name
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "roberta", "architectures": ["RobertaForMaskedLM"],
                                                 "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 300}))
    (out / "model.safetensors").write_bytes(b"\0" * 4096)
    (out / "tokenizer_config.json").write_text(json.dumps({"mask_token": mask}))
    return out


# ---- preflight --------------------------------------------------------------------------------
def test_preflight_fills_namespace_creates_repo_and_branch(loopback_hub):
    t = loopback_hub.token
    assert preflight("my-model", t) == "alice/my-model"
    assert loopback_hub.server.repo("alice/my-model").private is False
    assert preflight("alice-org/shared", t, private=True, revision="dev") == "alice-org/shared"
    repo = loopback_hub.server.repo("alice-org/shared")
    assert repo.private is True and set(repo.branches) == {"main", "dev"}
    assert preflight("alice/my-model", t) == "alice/my-model"  # idempotent
    assert preflight(None, t, default_name="from-dir") == "alice/from-dir"


@pytest.mark.parametrize("repo_id,token_attr,expected", [
    ("bob/model", "token", "User 'alice' cannot write to namespace 'bob'"),
    ("readers/model", "token", "cannot write to namespace 'readers'"),
    ("alice/model", "other_token", "User 'bob' cannot write to namespace 'alice'"),
])
def test_preflight_refuses_foreign_namespaces(loopback_hub, repo_id, token_attr, expected):
    token = getattr(loopback_hub, token_attr)
    with pytest.raises(HubAuthError, match=expected) as info:
        preflight(repo_id, token)
    assert token not in str(info.value)
    assert not loopback_hub.server.repos.get(("model", repo_id))  # nothing created


def test_preflight_bad_token_bad_id_unreachable(loopback_hub, monkeypatch):
    with pytest.raises(HubAuthError, match="token invalid: the Hub rejected the token passed as --hub_token") as info:
        preflight("alice/x", "hf_definitelyWrongToken")
    assert "hf_definitelyWrongToken" not in str(info.value)
    with pytest.raises(HubAuthError, match="No Hub token"):
        preflight("alice/x", None)
    n = len(loopback_hub.server.requests)
    with pytest.raises(HubRepoError, match="Invalid Hub repo id 'alice/bad--name..'"):
        preflight("alice/bad--name..", loopback_hub.token)
    assert len(loopback_hub.server.requests) == n  # checked locally, before any request

    from huggingface_hub import constants

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", dead)  # read at call time (hub.preflight.endpoint), before constants.ENDPOINT
    monkeypatch.setattr(constants, "ENDPOINT", dead)
    with pytest.raises(HubError, match=f"Could not reach the Hub at {dead}") as info:
        preflight("alice/x", loopback_hub.token)
    assert loopback_hub.token not in str(info.value)


def test_resolve_token_order(loopback_hub, monkeypatch):
    from huggingface_hub import constants

    assert resolve_token(None) is None
    with open(constants.HF_TOKEN_PATH, "w") as f:
        f.write("hf_fromCachedLogin")
    assert resolve_token(None) == "hf_fromCachedLogin"
    monkeypatch.setenv("HF_TOKEN", "hf_fromEnv")
    assert resolve_token(None) == "hf_fromEnv"
    assert resolve_token("hf_explicit") == "hf_explicit"


# ---- push queue -------------------------------------------------------------------------------
def test_push_queue_coalesces_and_uploads_snapshots(loopback_hub, tmp_path):
    repo = preflight("queue", loopback_hub.token)
    folder = tmp_path / "f"
    folder.mkdir()
    loopback_hub.server.latency(0.4, route="commit")
    q = PushQueue(repo, loopback_hub.token, backoff_seconds=0.01)
    for i in range(4):
        (folder / "state.txt").write_text(f"state {i}")
        q.submit(folder, commit_message=f"push {i}")
        if i == 0:  # let push 0 start before the others arrive
            deadline = time.monotonic() + 10
            while not any(r["route"] == "preupload" for r in loopback_hub.server.requests) and time.monotonic() < deadline:
                time.sleep(0.01)
    (folder / "state.txt").write_text("written after the last submit")
    report = q.wait(timeout=30)
    q.close()
    assert not report.timed_out and not report.failed and report.pending == []
    # push 0 was in flight; 1 and 2 were replaced by the newer pending state; 3 was uploaded
    assert [m for m, _ in report.pushed] == ["push 0", "push 3"]
    assert report.superseded == ["push 1", "push 2"]
    assert loopback_hub.server.files(repo)["state.txt"] == b"state 3"
    history = [c["message"] for c in loopback_hub.server.commits(repo)]
    assert history == ["initial commit", "push 0", "push 3"]
    assert report.pushed[-1][1] == loopback_hub.server.commits(repo)[-1]["sha"]


def test_push_queue_before_upload_runs_in_worker_on_the_snapshot(loopback_hub, tmp_path):
    import threading

    repo = preflight("hook", loopback_hub.token)
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "keep.txt").write_text("kept")
    (folder / "drop.txt").write_text("dropped by the hook")
    seen = []

    def hook(snapshot):
        seen.append((threading.current_thread().name, sorted(os.listdir(snapshot))))
        os.remove(os.path.join(snapshot, "drop.txt"))

    def bad_hook(snapshot):
        raise ValueError("hook refused")

    q = PushQueue(repo, loopback_hub.token, backoff_seconds=0.01)
    q.submit(folder, commit_message="with hook", before_upload=hook)
    q.wait(timeout=30)
    q.submit(folder, commit_message="bad hook", before_upload=bad_hook, key="other")
    report = q.wait(timeout=30)
    q.close()
    assert seen == [(f"hf-tpu-push-{repo}", ["drop.txt", "keep.txt"])]  # the worker thread, the whole snapshot
    files = loopback_hub.server.files(repo)
    assert files["keep.txt"] == b"kept" and "drop.txt" not in files
    assert (folder / "drop.txt").is_file()  # only the snapshot was edited
    assert [m for m, _ in report.pushed] == ["with hook"]
    assert report.failed == [("bad hook", "ValueError: hook refused")]
    assert [c["message"] for c in loopback_hub.server.commits(repo)] == ["initial commit", "with hook"]


def test_push_queue_retries_5xx_not_4xx_and_times_out(loopback_hub, tmp_path, caplog):
    repo = preflight("retry", loopback_hub.token)
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    q = PushQueue(repo, loopback_hub.token, backoff_seconds=0.01, max_retries=5)
    loopback_hub.server.fail_next(3, status=503, route="commit")
    q.submit(folder, commit_message="after 503s")
    report = q.wait(timeout=30)
    assert [m for m, _ in report.pushed] == ["after 503s"]
    statuses = [r["status"] for r in loopback_hub.server.requests if r["route"] == "commit"]
    assert statuses == [503, 503, 503, 200]

    loopback_hub.server.fail_next(1, status=429, route="preupload")
    loopback_hub.server.fail_next(1, status=400, route="commit")
    (folder / "a.txt").write_text("b")
    q.submit(folder, commit_message="bad request")
    report = q.wait(timeout=30)
    assert [m for m, _ in report.failed] == ["bad request"] and "HTTP 400" in report.failed[0][1]
    statuses = [r["status"] for r in loopback_hub.server.requests if r["route"] == "commit"]
    assert statuses[-1] == 400 and statuses.count(400) == 1  # not retried

    loopback_hub.server.latency(1.0, route="commit")
    (folder / "a.txt").write_text("c")
    q.submit(folder, commit_message="slow")
    report = q.wait(timeout=0.2)
    assert report.timed_out and report.pending == ["slow"]
    assert q.wait(timeout=10).pushed[-1][0] == "slow"
    q.close()


def test_push_queue_failure_text_has_no_token(loopback_hub, tmp_path, caplog):
    preflight("alice/owned", loopback_hub.token)
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    caplog.set_level(logging.DEBUG)
    q = PushQueue("alice/owned", loopback_hub.other_token, backoff_seconds=0.01)  # bob cannot write
    q.submit(folder, commit_message="forbidden")
    report = q.close(timeout=30)
    assert [m for m, _ in report.failed] == ["forbidden"] and "403" in report.failed[0][1]
    assert loopback_hub.other_token not in repr(report) and loopback_hub.other_token not in repr(q)
    assert all(loopback_hub.other_token not in r.getMessage() for r in caplog.records)


# ---- model card --------------------------------------------------------------------------------
def test_from_scratch_card_without_dataset_validates(loopback_hub, tmp_path):
    out = _folder(tmp_path)
    card = render_model_card(str(out), repo_id="alice/tiny", summary=SUMMARY, license="apache-2.0", language="en")
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "fill-mask"
    assert set(data["tags"]) >= {"tensorflow", "xla", "tpu", "hf-tpu-ext", "fill-mask"}
    assert "datasets" not in data and "base_model" not in data
    (result,) = data["model-index"][0]["results"]
    assert result["dataset"] == {"name": "the embedded default corpus", "type": "text"}
    assert {m["type"]: m["value"] for m in result["metrics"]} == {"perplexity": 8.0, "accuracy": 0.4567, "loss": 2.0794}
    text = str(card)
    assert "fine-tuned" not in text.lower() and "pre-trained from scratch" in text
    assert 'pipeline("fill-mask", model="alice/tiny")' in text and "is <mask>." in text
    assert "| Accelerator | 8 x TPU |" in text and "| Global batch size (sequences) | 256 |" in text
    assert "| Tokens seen | 39,321,600 |" in text and "| Training wall time | 1h 02m 03s |" in text
    assert "| learning_rate | 0.0005 |" in text and "hub_token" not in text
    assert "| Perplexity | 8 |" in text and "| Masked-token accuracy | 0.4567 |" in text
    assert "loss_curve.png" not in text and "- tensorflow 2.21.0" in text
    assert check_card_metadata(data) == []
    n = len(loopback_hub.server.requests)
    validate_model_card(card)
    assert [r["route"] for r in loopback_hub.server.requests[n:]] == ["validate_yaml"]


def test_card_with_dataset_base_model_and_loss_curve(loopback_hub, tmp_path):
    out = _folder(tmp_path)
    (out / "loss_curve.png").write_bytes(b"\x89PNG")
    summary = dict(SUMMARY, dataset_name="wikitext", dataset_config_name="wikitext-2-raw-v1", base_model="FacebookAI/roberta-base",
                   backend="torch_xla", accelerator="GPU", jit_compile=False)
    card = render_model_card(str(out), repo_id="alice/tiny", summary=summary, license="mit", language="en")
    data = card.data.to_dict()
    assert data["datasets"] == ["wikitext"] and data["base_model"] == "FacebookAI/roberta-base"
    assert "pytorch" in data["tags"] and "xla" not in data["tags"] and "tpu" not in data["tags"]
    assert data["model-index"][0]["results"][0]["dataset"] == {"name": "wikitext", "type": "wikitext", "config": "wikitext-2-raw-v1"}
    text = str(card)
    assert "continues the masked-language-model pre-training of [FacebookAI/roberta-base]" in text
    assert "![Training and evaluation loss](loss_curve.png)" in text
    validate_model_card(card)


def test_card_without_summary_uses_folder(loopback_hub, tmp_path):
    out = _folder(tmp_path, mask="[MASK]")
    path = save_model_card(str(out), repo_id="alice/tiny", validate=True, license="apache-2.0")
    text = open(path).read()
    assert "is [MASK]." in text and "RobertaForMaskedLM (2 layers, 64 hidden size" in text
    assert "model-index" not in text and "datasets:" not in text


def test_card_validation_errors(loopback_hub, tmp_path):
    out = _folder(tmp_path)
    with pytest.raises(ModelCardError, match="'license' 'made-up' is not a known license"):
        validate_model_card(render_model_card(str(out), summary=SUMMARY, license="made-up"))
    # passes the local checks, rejected by the Hub: the Hub's message is shown
    card = render_model_card(str(out), summary=SUMMARY, license="apache-2.0")
    card.data.pipeline_tag = "not-a-task"
    with pytest.raises(ModelCardError, match="HTTP 400.*pipeline_tag.*not-a-task"):
        validate_model_card(card)


def test_card_check_hub_trouble_keeps_card_rejection_removes_it(loopback_hub, tmp_path, caplog):
    from hf_tpu_ext.hub.model_card import validate_card_file

    out = _folder(tmp_path)
    card = render_model_card(str(out), summary=SUMMARY, license="apache-2.0")
    loopback_hub.server.fail_next(1, status=503, route="validate_yaml")
    validate_model_card(card)  # the Hub's trouble: accepted after the local checks, with a warning
    assert "answered HTTP 503" in caplog.text
    loopback_hub.server.fail_next(1, status=503, route="validate_yaml")
    with pytest.raises(ModelCardError, match="HTTP 503"):
        validate_model_card(card, offline_ok=False)

    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    assert validate_card_file(str(snapshot)) is True  # no card: nothing to check
    card.save(str(snapshot / "README.md"))
    assert validate_card_file(str(snapshot), token=loopback_hub.token) is True
    loopback_hub.server.fail_next(1, status=502, route="validate_yaml")
    assert validate_card_file(str(snapshot)) is True and (snapshot / "README.md").is_file()
    card.data.pipeline_tag = "not-a-task"
    card.save(str(snapshot / "README.md"))
    assert validate_card_file(str(snapshot), token=loopback_hub.token) is False
    assert not (snapshot / "README.md").exists()
    assert "Model card not pushed" in caplog.text and loopback_hub.token not in caplog.text


# ---- resume specs ----------------------------------------------------------------------------
def test_repo_specs(tmp_path, monkeypatch):
    assert parse_repo_spec("alice/m") == ("alice/m", None)
    assert parse_repo_spec("alice/m@dev") == ("alice/m", "dev")
    with pytest.raises(HubRepoError, match="user/name@revision"):
        parse_repo_spec("just-a-name")
    monkeypatch.chdir(tmp_path)
    assert looks_like_repo_spec("alice/m@v1") and not looks_like_repo_spec("true")
    (tmp_path / "alice" / "m").mkdir(parents=True)
    assert not looks_like_repo_spec("alice/m")  # an existing local path wins


def test_download_last_checkpoint_missing(loopback_hub, tmp_path):
    preflight("nockpt", loopback_hub.token)
    with pytest.raises(CheckpointError, match="has no last-checkpoint/"):
        download_last_checkpoint("alice/nockpt", loopback_hub.token, str(tmp_path / "dl"))
    with pytest.raises(HubRepoError):
        download_last_checkpoint("alice/nockpt@nobranch", loopback_hub.token, str(tmp_path / "dl"))


# ---- hf-tpu push --------------------------------------------------------------------------------
def test_push_command(loopback_hub, tmp_path, capsys):
    from hf_tpu_ext.cli import main

    out = _folder(tmp_path, name="my-run")
    (out / "training_summary.json").write_text(json.dumps(SUMMARY))
    for rel in ("checkpoints/ckpt-5.index", "checkpoints/ckpt-5.data-00000-of-00001", "last-checkpoint/ckpt-5.index",
                "runs/events.out", "checkpoint-5/ckpt-5.index"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(b"state")
    from huggingface_hub.utils import are_progress_bars_disabled

    rc = main(["push", str(out), "--hub_token", loopback_hub.token, "--private", "--license", "mit"])
    assert rc == 0
    url = capsys.readouterr().out.strip()
    assert not are_progress_bars_disabled()  # restored for the rest of the process
    (last,) = loopback_hub.server.commits("alice/my-run")[-1:]
    assert url == f"{loopback_hub.endpoint}/alice/my-run/commit/{last['sha']}"
    assert loopback_hub.server.repo("alice/my-run").private is True
    # the newest checkpoint goes up as last-checkpoint/ by default (what --resume_from_checkpoint resumes from)
    assert sorted(last["files"]) == [".gitattributes", "README.md", "config.json", "last-checkpoint/checkpoint",
                                     "last-checkpoint/ckpt-5.data-00000-of-00001", "last-checkpoint/ckpt-5.index",
                                     "model.safetensors", "runs/events.out", "tokenizer_config.json",
                                     "training_summary.json"]
    assert last["message"] == "Upload model (step 1200) and last-checkpoint/ (step 5) with hf-tpu-ext"
    assert b"license: mit" in last["files"]["README.md"]
    assert loopback_hub.token not in last["files"]["README.md"].decode()

    rc = main(["push", str(out), "--hub_model_id", "bob/x", "--hub_token", loopback_hub.token])
    err = capsys.readouterr().err
    assert rc == 1 and "cannot write to namespace 'bob'" in err and loopback_hub.token not in err


def test_push_command_hides_upload_bars_while_it_pushes(tmp_path, monkeypatch, capsys):
    from huggingface_hub.utils import are_progress_bars_disabled

    from hf_tpu_ext.cli import main
    from hf_tpu_ext.commands import push as push_command

    seen = []
    monkeypatch.setattr(push_command, "push", lambda *a, **k: seen.append(are_progress_bars_disabled()) or "url")
    assert not are_progress_bars_disabled()
    assert main(["push", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "url\n"
    assert seen == [True]  # huggingface_hub's upload bars off during the push
    assert not are_progress_bars_disabled()  # and back on afterwards


def test_huggingface_hubs_retry_lines_are_said_once_by_the_push(loopback_hub, tmp_path, caplog, monkeypatch):
    """The Hub down during an LFS upload: huggingface_hub retries it itself (``Retrying in 1s [Retry 1/5].``);
    the terminal gets one line of the push's instead of its two per retry."""
    import types

    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=lambda seconds: None))  # its backoff: no wait
    repo = preflight("down", loopback_hub.token)
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 64)  # an LFS file: its upload runs huggingface_hub's retries
    caplog.set_level(logging.INFO)
    q = PushQueue(repo, loopback_hub.token, backoff_seconds=0.01)
    loopback_hub.server.fail_next(3, status=503, route="lfs_upload")
    q.submit(folder, commit_message="while down")
    assert [m for m, _ in q.wait(timeout=30).pushed] == ["while down"]
    q.close()
    assert [r["status"] for r in loopback_hub.server.requests if r["route"] == "lfs_upload"] == [503, 503, 503, 200]
    said = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("huggingface_hub")
            or r.levelno >= logging.WARNING]
    assert said == [("hf_tpu_ext.hub", "WARNING", "Push 'while down': the Hub did not answer (HTTP Error 503); "
                                                  "retrying.")]
