"""The framework-free Hub pusher (hf_tpu_ext.hub.pusher) against the loopback Hub: strategies, write-access
preflight, retries (Retry-After, empty 200 replies), the end-of-run report, cleanup, and `hf-tpu push`."""

import email.utils
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from hf_tpu_ext.errors import HubAuthError, HubError
from hf_tpu_ext.hub import push_queue
from hf_tpu_ext.hub.push_queue import MAX_RETRY_AFTER_SECONDS, retry_after_seconds
from hf_tpu_ext.hub.push_session import PushSession, push_save
from hf_tpu_ext.hub.pusher import HUB_STRATEGIES, MODEL_IGNORE_PATTERNS

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model_folder(path, marker="0"):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "roberta", "marker": marker}))
    (path / "model.safetensors").write_bytes(b"\0" * 512 + marker.encode())
    (path / "optimizer.index").write_bytes(b"never pushed with the model")
    (path / "checkpoints").mkdir(exist_ok=True)
    (path / "checkpoints" / "ckpt-1.index").write_bytes(b"local only")
    return path


def _checkpoint(path, step, extra=None):
    path.mkdir(parents=True, exist_ok=True)
    for name in [f"ckpt-{step}.index", f"ckpt-{step}.data-00000-of-00001"] + list(extra or []):
        (path / name).write_bytes(f"{name} state".encode())
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": step / 4, "max_steps": 40}))
    return path


def _requests(hub, repo_id, routes=("commit",)):
    """The requests of ``routes`` to ``repo_id`` (an upload of an earlier test may still be in flight)."""
    return [r for r in hub.server.requests if r["route"] in routes and f"/{repo_id}/" in r["path"]]


def _staging_dirs(tmp):
    return [n for n in os.listdir(tmp) if n.startswith("hf-tpu-push-")]


def _wait_in_flight(queue, timeout=10):
    deadline = time.monotonic() + timeout
    while queue._in_flight is None:
        assert time.monotonic() < deadline, "the push never started"
        time.sleep(0.01)


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """A private temp dir for the staging folders, so a test can count them."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_policy_constants_are_defined_once():
    import hf_tpu_ext.args as args
    import hf_tpu_ext.commands.push as push_cmd
    import hf_tpu_ext.hub.resume as resume

    assert HUB_STRATEGIES is args.HUB_STRATEGIES == ("end", "every_save", "checkpoint", "all_checkpoints")
    assert "training_args.bin" in MODEL_IGNORE_PATTERNS and "*.index" in MODEL_IGNORE_PATTERNS
    assert resume.LAST_CHECKPOINT == "last-checkpoint"
    assert not hasattr(push_cmd, "MODEL_IGNORE_PATTERNS")


# ---- strategies ---------------------------------------------------------------------------------
def test_every_save_and_end(loopback_hub, tmp_path, own_tmp):
    out = _model_folder(tmp_path / "out")
    with PushSession.for_script("every", token=loopback_hub.token, output_dir=str(out), backoff_seconds=0.01) as pusher:
        assert pusher.preflight() == "alice/every"
        push_save(pusher, str(out), step=5, checkpoint_folder=str(_checkpoint(tmp_path / "ck", 5)))
        assert pusher.finish(30).final_pushed is False
    files = loopback_hub.server.files("alice/every")
    assert sorted(files) == [".gitattributes", "config.json", "model.safetensors"]  # no optimizer state, no checkpoint
    assert [c["message"] for c in loopback_hub.server.commits("alice/every")] == ["initial commit",
                                                                                  "Training in progress, step 5"]

    pusher = PushSession.for_script("end", token=loopback_hub.token, hub_strategy="end", backoff_seconds=0.01)
    pusher.preflight()
    n = len(loopback_hub.server.requests)
    push_save(pusher, str(out), step=5)  # not pushed by "end"
    assert len(loopback_hub.server.requests) == n and pusher.report().pending == []
    push_save(pusher, str(out), step=9, final=True)
    report = pusher.finish(30)
    assert report.final_pushed and [m for m, _ in report.pushed] == ["End of training"]
    assert pusher.pushed_steps == [9] and _staging_dirs(own_tmp) == []


def test_checkpoint_strategy_one_commit_replaces_older_checkpoint(loopback_hub, tmp_path):
    out = _model_folder(tmp_path / "out")
    pusher = PushSession.for_script("alice-org/ck", token=loopback_hub.token, hub_strategy="checkpoint", revision="dev",
                       backoff_seconds=0.01)
    pusher.preflight()
    push_save(pusher, str(out), step=4, checkpoint_folder=str(_checkpoint(tmp_path / "c4", 4, ["rng_state_1.pth"])))
    pusher.report()
    assert pusher._queue.wait(30).pushed  # the first one landed before the next save
    push_save(pusher, str(out), step=8, checkpoint_folder=str(_checkpoint(tmp_path / "c8", 8)), final=True)
    report = pusher.finish(30)
    assert report.final_pushed and report.counts["pushed"] == 2
    files = loopback_hub.server.files("alice-org/ck", revision="dev")
    assert sorted(p for p in files if p.startswith("last-checkpoint/")) == [
        "last-checkpoint/ckpt-8.data-00000-of-00001", "last-checkpoint/ckpt-8.index",
        "last-checkpoint/trainer_state.json"]  # step 4's files (and its rng state) are gone
    assert json.loads(files["last-checkpoint/trainer_state.json"]) == {"global_step": 8, "epoch": 2.0, "max_steps": 40}
    for commit in loopback_hub.server.commits("alice-org/ck", branch="dev")[1:]:
        assert "model.safetensors" in commit["added"] and "last-checkpoint/trainer_state.json" in commit["added"]


def test_all_checkpoints_each_in_own_folder(loopback_hub, tmp_path):
    out = _model_folder(tmp_path / "out")
    loopback_hub.server.latency(0.2, route="commit")
    pusher = PushSession.for_script("allck", token=loopback_hub.token, hub_strategy="all_checkpoints", backoff_seconds=0.01)
    pusher.preflight()
    for step in (2, 4, 6):
        push_save(pusher, str(out), step=step, checkpoint_folder=str(_checkpoint(tmp_path / f"c{step}", step)))
    report = pusher.finish(60)
    files = loopback_hub.server.files("alice/allck")
    for step in (2, 4, 6):  # never coalesced
        assert f"checkpoint-{step}/ckpt-{step}.index" in files
    assert not [p for p in files if p.startswith("last-checkpoint/")]
    assert report.counts["failed"] == 0 and "Checkpoint at step 6" in [m for m, _ in report.pushed]


def test_checkpoint_lands_while_saves_outpace_uploads(loopback_hub, tmp_path):
    """Issue: 60 saves against a slow Hub and not one last-checkpoint/ landed during training."""
    loopback_hub.server.latency(0.5, route="commit")
    out = _model_folder(tmp_path / "out")
    pusher = PushSession.for_script("starved", token=loopback_hub.token, hub_strategy="checkpoint", backoff_seconds=0.01)
    pusher.preflight()
    step, deadline = 0, time.monotonic() + 60
    while len(loopback_hub.server.commits("alice/starved")) < 4:  # until 3 uploads landed during training
        assert time.monotonic() < deadline, "no upload landed while saves went on"
        step += 1  # a save every 0.1 s, an upload takes > 0.5 s
        push_save(pusher, str(out), step=step, checkpoint_folder=str(_checkpoint(tmp_path / f"c{step}", step)))
        time.sleep(0.1)
    landed_during_training = loopback_hub.server.commits("alice/starved")[1:]
    report = pusher.finish(60)
    for commit in landed_during_training:  # every upload that landed carried a resumable checkpoint
        assert any(p.startswith("last-checkpoint/ckpt-") for p in commit["added"])
        assert "last-checkpoint/trainer_state.json" in commit["added"]
    assert report.counts["superseded"] >= step // 2 and report.counts["failed"] == 0  # saves outpaced uploads
    state = json.loads(loopback_hub.server.files("alice/starved")["last-checkpoint/trainer_state.json"])
    assert state["global_step"] == step  # the newest save always lands in the end


def test_final_push_without_checkpoint_keeps_the_replaced_pushs_checkpoint(loopback_hub, tmp_path):
    loopback_hub.server.latency(0.5, route="commit")
    out = _model_folder(tmp_path / "out")
    pusher = PushSession.for_script("inherit", token=loopback_hub.token, hub_strategy="checkpoint", backoff_seconds=0.01)
    pusher.preflight()
    push_save(pusher, str(out), step=1, checkpoint_folder=str(_checkpoint(tmp_path / "c1", 1)))
    _wait_in_flight(pusher._queue)
    push_save(pusher, str(out), step=2, checkpoint_folder=str(_checkpoint(tmp_path / "c2", 2)))
    push_save(pusher, str(out), step=2, final=True)  # replaces step 2's push, which alone carried ckpt-2
    report = pusher.finish(30)
    assert report.superseded == ["Training in progress, step 2"] and report.final_pushed
    final = loopback_hub.server.commits("alice/inherit")[-1]
    assert final["message"] == "End of training" and "last-checkpoint/ckpt-2.index" in final["added"]
    assert not [p for p in final["files"] if p.startswith("last-checkpoint/ckpt-1")]


def test_replaced_push_keeps_its_place_in_line(loopback_hub, tmp_path):
    loopback_hub.server.latency(0.3, route="commit")
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    from hf_tpu_ext.hub.preflight import preflight

    q = push_queue.PushQueue(preflight("line", loopback_hub.token), loopback_hub.token, backoff_seconds=0.01)
    q.submit(folder, commit_message="m0", key="model")
    _wait_in_flight(q)
    q.submit(folder, commit_message="m1", key="model")
    q.submit(folder, commit_message="c1", key="ckpt")
    q.submit(folder, commit_message="m2", key="model")  # replaces m1 ahead of c1, not behind it
    q.submit(folder, commit_message="c2", key="ckpt")
    report = q.wait(30)
    q.close()
    assert [m for m, _ in report.pushed] == ["m0", "m2", "c2"] and report.superseded == ["m1", "c1"]


# ---- preflight: write access --------------------------------------------------------------------
def test_read_only_token_refused_for_existing_repo(loopback_hub, tmp_path):
    from hf_tpu_ext.hub.preflight import preflight

    preflight("existing", loopback_hub.token)  # the repo exists
    n = len(loopback_hub.server.commits("alice/existing"))
    pusher = PushSession.for_script("alice/existing", token=loopback_hub.read_token)
    with pytest.raises(HubAuthError, match=r"token of user 'alice' is read-only \(role 'read'\): it cannot push "
                                           r"to alice/existing\. Create a token with write access") as info:
        pusher.preflight()
    assert loopback_hub.read_token not in str(info.value)
    assert len(loopback_hub.server.commits("alice/existing")) == n
    assert not [r for r in loopback_hub.server.requests if r["route"] in ("create_repo", "commit", "preupload")
                and r["user"] == "alice" and r["status"] != 200]


def test_fine_grained_token_needs_repo_write(loopback_hub):
    from hf_tpu_ext.hub.preflight import preflight

    preflight("alice/scoped", loopback_hub.token)  # a token scoped to one repo cannot create repos
    assert PushSession.for_script("alice/scoped", token=loopback_hub.scoped_token).preflight() == "alice/scoped"
    with pytest.raises(HubAuthError, match="fine-grained Hub token of user 'alice' has no 'repo.write' permission "
                                           "for alice/other or the namespace 'alice'"):
        PushSession.for_script("alice/other", token=loopback_hub.scoped_token).preflight()
    with pytest.raises(KeyError):
        loopback_hub.server.repo("alice/other")  # refused before anything was created


def test_loopback_whoami_reports_roles_like_the_hub(loopback_hub):
    from huggingface_hub import HfApi

    api = HfApi(endpoint=loopback_hub.endpoint)
    assert api.whoami(loopback_hub.read_token)["auth"]["accessToken"]["role"] == "read"
    assert api.whoami(loopback_hub.token)["auth"]["accessToken"]["role"] == "write"
    fine = api.whoami(loopback_hub.scoped_token)["auth"]["accessToken"]
    assert fine["role"] == "fineGrained"
    assert {"entity": {"type": "model", "name": "alice/scoped"}, "permissions": ["repo.content.read", "repo.write"]} \
        in fine["fineGrained"]["scoped"]


# ---- retries --------------------------------------------------------------------------------------
def _err(value):
    return SimpleNamespace(response=SimpleNamespace(headers={"Retry-After": value} if value is not None else {}))


def test_retry_after_values():
    now = time.time()
    assert retry_after_seconds(_err("7")) == 7.0
    assert retry_after_seconds(_err("0")) == 0.0
    assert retry_after_seconds(_err(None)) is None and retry_after_seconds(_err("soon")) is None
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28.0 <= retry_after_seconds(_err(date), now=now) <= 30.0
    assert retry_after_seconds(_err(email.utils.formatdate(now - 60, usegmt=True)), now=now) == 0.0
    assert retry_after_seconds(_err("86400")) == MAX_RETRY_AFTER_SECONDS
    assert retry_after_seconds(ValueError("no response")) is None


@pytest.mark.parametrize("header", ["seconds", "http-date"])
def test_429_retry_after_is_honoured(loopback_hub, tmp_path, header):
    folder = _model_folder(tmp_path / "out")
    value = "2" if header == "seconds" else email.utils.formatdate(time.time() + 3, usegmt=True)
    pusher = PushSession.for_script("limited", token=loopback_hub.token, backoff_seconds=0.01)
    pusher.preflight()
    loopback_hub.server.fail_next(1, status=429, route="commit", headers={"Retry-After": value})
    t0 = time.monotonic()
    push_save(pusher, str(folder), step=1, final=True)
    report = pusher.finish(60)
    assert report.final_pushed
    commits = _requests(loopback_hub, "alice/limited")
    assert [r["status"] for r in commits] == [429, 200]
    assert time.monotonic() - t0 >= 1.5  # waited as asked, not backoff_seconds=0.01
    assert report.outcomes[-1].attempts == 2


def test_empty_200_commit_reply_is_not_recommitted(loopback_hub, tmp_path, caplog):
    folder = _model_folder(tmp_path / "out")
    pusher = PushSession.for_script("emptyreply", token=loopback_hub.token, backoff_seconds=0.01)
    pusher.preflight()
    loopback_hub.server.empty_reply_next(1, route="commit")
    push_save(pusher, str(folder), step=3, final=True)
    report = pusher.finish(30)
    commits = loopback_hub.server.commits("alice/emptyreply")
    assert [c["message"] for c in commits] == ["initial commit", "End of training"]  # landed once
    assert report.final_pushed and report.failed == []
    assert report.pushed == [("End of training", commits[-1]["sha"])]
    assert "unreadable (JSONDecodeError) but the commit landed" in caplog.text
    assert [r["route"] for r in _requests(loopback_hub, "alice/emptyreply", ("commit", "commits"))] == [
        "commit", "commits"]


def test_empty_200_reply_of_a_commit_that_did_not_land_is_retried(loopback_hub, tmp_path):
    folder = _model_folder(tmp_path / "out")
    pusher = PushSession.for_script("lostcommit", token=loopback_hub.token, backoff_seconds=0.01)
    pusher.preflight()
    loopback_hub.server.empty_reply_next(1, route="commit", apply=False)
    push_save(pusher, str(folder), step=3, final=True)
    report = pusher.finish(30)
    assert [c["message"] for c in loopback_hub.server.commits("alice/lostcommit")] == ["initial commit",
                                                                                      "End of training"]
    assert report.final_pushed and report.outcomes[-1].attempts == 2
    assert [r["route"] for r in _requests(loopback_hub, "alice/lostcommit", ("commit", "commits"))] == [
        "commit", "commits", "commit"]


def test_second_interrupt_stops_waiting(loopback_hub, tmp_path, own_tmp, caplog):
    import threading

    loopback_hub.server.latency(5.0, route="commit")
    folder = _model_folder(tmp_path / "out")
    pusher = PushSession.for_script("waiting", token=loopback_hub.token, output_dir=str(folder), backoff_seconds=0.01)
    pusher.preflight()
    push_save(pusher, str(folder), step=1, final=True)
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        pusher.finish()  # no timeout: only Ctrl-C ends the wait
    assert time.monotonic() - t0 < 3
    assert "Interrupted again: 1 push(es) to alice/waiting not finished (End of training)" in caplog.text
    assert _staging_dirs(own_tmp) == [] and not pusher.report().final_pushed


def test_push_command_retries_503_and_429(loopback_hub, tmp_path, capsys):
    from hf_tpu_ext.cli import main

    out = _model_folder(tmp_path / "cli-run")
    (out / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<mask>"}))
    loopback_hub.server.fail_next(1, status=503, route="commit")
    loopback_hub.server.fail_next(1, status=429, route="commit", headers={"Retry-After": "1"})
    rc = main(["push", str(out), "--hub_token", loopback_hub.token])
    assert rc == 0
    commits = loopback_hub.server.commits("alice/cli-run")
    assert capsys.readouterr().out.strip() == f"{loopback_hub.endpoint}/alice/cli-run/commit/{commits[-1]['sha']}"
    assert [r["status"] for r in _requests(loopback_hub, "alice/cli-run")] == [503, 429, 200]
    assert "optimizer.index" not in commits[-1]["files"] and "checkpoints/ckpt-1.index" not in commits[-1]["files"]

    loopback_hub.server.fail_next(10, status=503, route="commit")
    rc = main(["push", str(out), "--hub_token", loopback_hub.token, "--max_retries", "0"])
    err = capsys.readouterr().err
    assert rc == 1 and "Could not push" in err and "HTTP 503" in err and loopback_hub.token not in err


def test_push_command_ctrl_c(loopback_hub, tmp_path):
    loopback_hub.server.latency(20.0, route="commit")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = _model_folder(tmp_path / "slow-run")
    env = dict(os.environ, TMPDIR=str(tmp), HF_ENDPOINT=loopback_hub.endpoint, HF_HUB_DISABLE_XET="1",
               PYTHONPATH=REPO_ROOT, HF_HOME=str(tmp_path / "home"))
    proc = subprocess.Popen([sys.executable, "-m", "hf_tpu_ext", "push", str(out), "--hub_token", loopback_hub.token],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not _requests(loopback_hub, "alice/slow-run"):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 10
    assert proc.returncode == 130 and "hf-tpu push: interrupted before the upload landed" in err
    assert "Traceback" not in err and loopback_hub.token not in err
    assert _staging_dirs(tmp) == []


def test_push_command_include_checkpoint_trainer_folder(loopback_hub, tmp_path, capsys):
    from hf_tpu_ext.cli import main

    out = _model_folder(tmp_path / "pt-run")
    _checkpoint(out / "checkpoint-3", 3)
    _checkpoint(out / "checkpoint-12", 12)
    assert main(["push", str(out), "--hub_token", loopback_hub.token, "--include_checkpoint"]) == 0
    files = loopback_hub.server.files("alice/pt-run")
    assert sorted(p for p in files if "checkpoint" in p) == [
        "last-checkpoint/ckpt-12.data-00000-of-00001", "last-checkpoint/ckpt-12.index",
        "last-checkpoint/trainer_state.json"]


# ---- report, cleanup, interrupts ------------------------------------------------------------------
def test_report_to_dict_bounded_and_without_token(loopback_hub, tmp_path, monkeypatch):
    import threading

    monkeypatch.setattr(push_queue, "REPORT_LIMIT", 3)
    folder = _model_folder(tmp_path / "out")
    def workers():
        return [t for t in threading.enumerate() if t.name.startswith("hf-tpu-push-")]

    assert workers() == []
    pusher = PushSession.for_script("many", token=loopback_hub.token, backoff_seconds=0.01)
    pusher.preflight()
    for step in range(1, 6):
        push_save(pusher, str(folder), step=step, final=step == 5)
        pusher._queue.wait(30)
        assert os.listdir(pusher.staging_root) == []  # no per-push leftovers
    assert len(workers()) == 1  # one worker, however many pushes
    loopback_hub.server.fail_next(1, status=400, route="commit")
    push_save(pusher, str(folder), step=6)
    report = pusher.finish(30)
    data = report.to_dict()
    assert data["final_pushed"] is True and data["pushed"] == 5 and data["failed"] == 1
    assert len(data["pushes"]) == 3 and len(report.pushed) == 3  # bounded lists, exact totals
    last = data["pushes"][-1]
    assert last["status"] == "failed" and last["step"] == 6 and "HTTP 400" in last["error"]
    assert data["pushes"][-2]["final"] is True and data["pushes"][-2]["commit"] == \
        loopback_hub.server.commits("alice/many")[-1]["sha"]
    text = json.dumps(data)
    assert loopback_hub.token not in text and data["repo_id"] == "alice/many"
    assert workers() == []  # the worker ended with finish()


def test_exception_in_training_reports_pending_and_cleans_staging(loopback_hub, tmp_path, own_tmp, caplog):
    loopback_hub.server.latency(2.0, route="commit")
    folder = _model_folder(tmp_path / "out")
    pusher = PushSession.for_script("boom", token=loopback_hub.token, output_dir=str(folder), backoff_seconds=0.01)
    with pytest.raises(FloatingPointError):
        with pusher:
            pusher.preflight()
            push_save(pusher, str(folder), step=1)
            _wait_in_flight(pusher._queue)
            push_save(pusher, str(folder), step=2)
            assert len(_staging_dirs(own_tmp)) == 1
            raise FloatingPointError("loss is nan")
    assert _staging_dirs(own_tmp) == []
    assert "Training stopped by FloatingPointError: 2 push(es) to alice/boom not finished" in caplog.text
    assert f"hf-tpu push {folder} --hub_model_id alice/boom" in caplog.text
    report = pusher.report()
    assert not report.final_pushed and "Training in progress, step 2" in report.pending
    pusher.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        push_save(pusher, str(folder), step=3)


def test_staging_folders_of_killed_processes_are_removed(loopback_hub, own_tmp):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = own_tmp / f"hf-tpu-push-{done.stdout.strip()}-abc123"
    (dead / "000001").mkdir(parents=True)
    (dead / "000001" / "model.safetensors").write_bytes(b"\0" * 64)
    alive = own_tmp / f"hf-tpu-push-{os.getppid()}-def456"  # a running process's folder stays
    alive.mkdir()
    pusher = PushSession.for_script("stale", token=loopback_hub.token)
    pusher.preflight()
    assert not dead.exists() and alive.is_dir()
    assert os.path.basename(pusher.staging_root).startswith(f"hf-tpu-push-{os.getpid()}-")
    pusher.close()
    assert sorted(_staging_dirs(own_tmp)) == [alive.name]


_CHILD = textwrap.dedent("""
    import os, sys, time, logging
    logging.basicConfig(level=logging.INFO)
    from hf_tpu_ext.hub.push_session import PushSession, push_save
    folder = sys.argv[1]
    pusher = PushSession.for_script("alice/child", token=os.environ["LOOPBACK_TOKEN"], output_dir=folder, backoff_seconds=0.01)
    pusher.preflight()
    push_save(pusher, folder, step=1)
    push_save(pusher, folder, step=2)
    print("PUSHING", flush=True)
    if sys.argv[2] == "raise":
        sys.stdin.readline()  # the parent has seen the staging folder (else the exit may beat its look)
        raise FloatingPointError("loss is nan")  # no context manager: atexit cleans up
    while True:  # a training loop
        time.sleep(0.05)
""")


@pytest.mark.parametrize("how", ["raise", "sigterm", "sigint"])
def test_process_exit_paths_clean_staging(loopback_hub, tmp_path, how):
    loopback_hub.server.latency(3.0, route="commit")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    folder = _model_folder(tmp_path / "out")
    env = dict(os.environ, TMPDIR=str(tmp), HF_ENDPOINT=loopback_hub.endpoint, HF_HUB_DISABLE_XET="1",
               LOOPBACK_TOKEN=loopback_hub.token, PYTHONPATH=REPO_ROOT, HF_HOME=str(tmp_path / "home"))
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(folder), how], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "PUSHING"
    assert len(_staging_dirs(tmp)) == 1
    t0 = time.monotonic()
    if how == "raise":
        proc.stdin.write("go\n")
        proc.stdin.flush()
    else:
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 10
    # an uncaught KeyboardInterrupt ends Python with SIGINT (-2), or 1 where finalization reports an error
    assert proc.returncode in {"raise": (1,), "sigterm": (143,), "sigint": (-signal.SIGINT, 1)}[how], err
    assert _staging_dirs(tmp) == []
    assert "push(es) to alice/child not finished" in err
    assert {"raise": "FloatingPointError", "sigterm": "SIGTERM", "sigint": "KeyboardInterrupt"}[how] in err
    assert loopback_hub.token not in err


def test_importing_the_hub_layer_needs_no_framework():
    code = ("import sys, hf_tpu_ext.hub, hf_tpu_ext.hub.pusher, hf_tpu_ext.hub.push_queue, hf_tpu_ext.hub.preflight\n"
            "from hf_tpu_ext.cli import main\n"
            "try:\n    main(['push', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'torch', 'tf_keras', 'keras', 'jax'))\n"
            "print('FRAMEWORKS', bad)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert proc.returncode == 0, proc.stderr
    assert "--include_checkpoint" in proc.stdout and "FRAMEWORKS []" in proc.stdout
