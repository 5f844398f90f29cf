"""The push side of signals (issue 31): a SIGINT/SIGTERM save is pushed past the commit budget, a signal after the
last step still ends with the final model on the Hub, the grace budget is kept whatever the Hub's latency, a final
push in flight at exit is not pushed twice, the budget is paced over its window, and a lost reply's no-op retry
says so in the project's own line.

Runs are the tiny TensorFlow ones of tests/conftest.py (``tiny_train_args``) against the loopback Hub.
"""

import json
import logging
import os
import signal
import time

import pytest
from conftest import tiny_train_args

from hf_tpu_ext import interrupts
from hf_tpu_ext.hub.commit_budget import HUB_COMMITS_PER_HOUR, CommitBudget
from hf_tpu_ext.hub.push_policy import FINAL_COMMIT_TITLE
from hf_tpu_ext.hub.push_session import PushConfig, PushSession

REPO = "alice/signal-push"


@pytest.fixture
def hf_log(caplog):
    """caplog that also sees the ``hf_tpu_ext`` and ``huggingface_hub`` loggers (they may not propagate)."""
    loggers = [logging.getLogger("hf_tpu_ext"), logging.getLogger("huggingface_hub")]
    for logger in loggers:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="hf_tpu_ext")
    caplog.set_level(logging.INFO, logger="huggingface_hub")
    yield caplog
    for logger in loggers:
        logger.removeHandler(caplog.handler)


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _train(args):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args(args), argv=["train", *args])


def _hub_args(hub, *extra):
    return ["--push_to_hub", "true", "--hub_strategy", "checkpoint", "--hub_model_id", REPO, "--hub_token", hub.token,
            *extra]


def _signal_at(step, sig=signal.SIGTERM, second=None, delay=1.0):
    """A registered tf_keras callback that sends ``sig`` to this process after global step ``step`` (and ``second``
    ``delay`` s later when given: a preemption's SIGTERM, then another while the run waits for its push)."""
    import threading

    import tf_keras

    from hf_tpu_ext.callbacks import register_callback

    name = f"test_signal_push_{int(sig)}_{int(second or 0)}_at_{step}"

    @register_callback(name, "Test only: send a signal to this process after a global step.")
    class SignalAt(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == step:
                os.kill(os.getpid(), sig)
                if second is not None:
                    threading.Timer(delay, os.kill, (os.getpid(), second)).start()

    return name


def _interrupted_run(args):
    """Train ``args`` until it stops by a signal: (its TrainingInterrupted, seconds from the first signal to it)."""
    import gc

    from hf_tpu_ext.errors import TrainingInterrupted

    gc.collect()  # earlier runs' TensorFlow garbage: a full collection of it inside the timed wait took seconds

    heard = []
    handle = interrupts.on_signal(lambda signum: heard.append(time.monotonic()))
    try:
        with pytest.raises(TrainingInterrupted) as stop:
            _train(args)
        return stop.value, time.monotonic() - heard[0]
    finally:
        handle.remove()


# ---- the budget: paced, and a signal's save is not refused -------------------------------------------------------
def test_an_hour_of_saves_every_second_stays_under_the_hubs_quota_and_is_paced():
    """Saves every second for two hours against the default budget (100 per hour): no 3,600 s window holds more
    than 99 commits (one is the final push's; the Hub allows 128), after the burst of 5 the commits are 38-39 s
    apart (3600 / 94 on a 1 s save clock: the Hub copy is never older than one interval, the window's cap never
    stalls them), and the final push never waits."""
    clock = _Clock()
    budget = CommitBudget(clock=clock)
    starts = []
    for _ in range(7200):
        if budget.wait_seconds() == 0:
            budget.note_commit()
            starts.append(clock.now)
        clock.now += 1.0
    assert budget.wait_seconds(final=True) == 0
    most = max(sum(1 for t in starts if s <= t < s + 3600) for s in starts)
    assert most <= budget.commits - 1 < HUB_COMMITS_PER_HOUR, most
    assert starts[:budget.burst] == [1000.0 + i for i in range(budget.burst)]  # the burst: one save after another
    assert starts[budget.burst] - starts[budget.burst - 1] <= 39.0  # the bucket refilled during the burst
    gaps = [b - a for a, b in zip(starts[budget.burst:], starts[budget.burst + 1:])]
    assert min(gaps) == 38.0 and max(gaps) == 39.0, sorted(set(gaps))
    assert budget.to_dict() == {"commits": 100, "period_seconds": 3600.0, "burst": 5, "seconds_per_commit": 38.298,
                                "reserved_for_final": 1, "commits_started": len(starts), "rate_limited": 0,
                                "hub_commits_at_start": None}


def test_a_save_after_a_signal_is_admitted_past_the_budget(hf_log):
    session = PushSession(PushConfig(output_dir="out", hub_model_id="alice/x", hub_strategy="checkpoint"),
                          is_chief=True)
    session.budget = CommitBudget(1, 3600.0)
    session.budget.note_commit()
    assert session.admit(4) is None and session.coalesced_steps == [4]
    interrupts.reset()
    try:
        interrupts.record(signal.SIGTERM)
        plan = session.admit(6)
        assert plan.reason == "signal" and plan.push and plan.step == 6
        assert session.admit(8, max_steps=8) is None  # the final push carries it
    finally:
        interrupts.reset()
    assert ("Save at step 6 after SIGTERM: pushed now, past the commit budget's pacing (within the 25 s grace "
            "budget).") in hf_log.text
    assert session.report_dict()["signal_saves"] == 1


# ---- a signal during training, the budget spent --------------------------------------------------------------------
def test_sigterm_with_the_budget_spent_puts_the_step_reached_on_the_hub(loopback_hub, tmp_path, hf_log):
    """``--hub_commit_budget 1``: the save of step 2 takes the hour's commit, 4..12 coalesce; SIGTERM right after
    the (coalesced) save of step 12: that checkpoint is pushed within the grace budget, last-checkpoint/ is at 12,
    nothing is reported missing."""
    from hf_tpu_ext.errors import TrainingInterrupted

    out = tmp_path / "o"
    args = tiny_train_args(out, "--max_steps", "20", "--save_strategy", "steps", "--save_steps", "2",
                           "--eval_strategy", "no", "--jit_compile", "false", "--callbacks", _signal_at(12),
                           *_hub_args(loopback_hub, "--hub_commit_budget", "1", "--save_on_signal_timeout", "10"))
    with pytest.raises(TrainingInterrupted) as stop:
        _train(args)
    assert stop.value.step == 12 and stop.value.signum == signal.SIGTERM
    assert "Save at step 12 coalesced into the next push" in hf_log.text
    assert "Save at step 12 after SIGTERM: pushed now" in hf_log.text
    files = loopback_hub.server.files(REPO)
    assert json.loads(files["last-checkpoint/trainer_state.json"])["global_step"] == 12
    assert "last-checkpoint/ckpt-12.index" in files and "last-checkpoint/ckpt-2.index" not in files
    messages = [c["message"] for c in loopback_hub.server.commits(REPO)]
    assert messages[1:] == ["Training in progress, step 2", "Training in progress, step 12"]
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["interrupted"]["not_pushed"] == [] and summary["interrupted"]["global_step"] == 12
    assert summary["hub_pushes"]["signal_saves"] == 1 and summary["hub_pushes"]["pushed"] == 2


# ---- a second signal while the run reports the first ----------------------------------------------------------------
def test_a_second_sigterm_during_the_push_wait_stops_it_and_the_summary_is_written(loopback_hub, tmp_path, hf_log):
    """SIGTERM after step 6, commits take 4 s, a second SIGTERM 1 s later: the wait stops there (not after the
    4 s commit, not by SIGTERM's default killing the process; the upload in flight gets 0.5 s to end, not the 2 s
    of a single signal), the summary names the push not landed."""
    loopback_hub.server.latency(4.0, route="commit")
    out = tmp_path / "o"
    args = tiny_train_args(out, "--max_steps", "20", "--save_strategy", "steps", "--save_steps", "3",
                           "--eval_strategy", "no", "--jit_compile", "false",
                           "--callbacks", _signal_at(6, second=signal.SIGTERM),
                           *_hub_args(loopback_hub, "--save_on_signal_timeout", "20"))
    try:
        error, stopped = _interrupted_run(args)
    finally:
        loopback_hub.server.latency(0.0, route="commit")
    assert error.step == 6 and error.signum == signal.SIGTERM and interrupts.count() == 2
    assert 1.0 <= stopped < 2.5, stopped
    interrupted = json.loads((out / "training_summary.json").read_text())["interrupted"]
    assert interrupted["global_step"] == 6 and interrupted["signal"] == "SIGTERM"
    assert "Training in progress, step 6" in interrupted["not_pushed"], interrupted["not_pushed"]


def test_a_double_ctrl_c_landing_in_the_summary_write_still_writes_it(tmp_path, monkeypatch, hf_log):
    """Ctrl+C after step 6 (saved), the second Ctrl+C while training_summary.json is written: the file is written
    whole first (issue 31: a double SIGINT left no summary), then the run stops with 130's error."""
    import hf_tpu_ext.run.files as run_files
    from hf_tpu_ext.errors import TrainingInterrupted

    write = run_files.write_training_summary

    def write_during_a_second_ctrl_c(output_dir, summary):
        if "interrupted" in summary:
            os.kill(os.getpid(), signal.SIGINT)  # handled before kill() returns (main thread)
        write(output_dir, summary)

    monkeypatch.setattr(run_files, "write_training_summary", write_during_a_second_ctrl_c)
    out = tmp_path / "o"
    args = tiny_train_args(out, "--max_steps", "20", "--save_strategy", "steps", "--save_steps", "100",
                           "--eval_strategy", "no", "--jit_compile", "false",
                           "--callbacks", _signal_at(6, signal.SIGINT))
    with pytest.raises(TrainingInterrupted) as stop:
        _train(args)
    assert stop.value.step == 6 and stop.value.signum == signal.SIGINT and interrupts.count() == 2
    interrupted = json.loads((out / "training_summary.json").read_text())["interrupted"]
    assert interrupted == {"signal": "SIGINT", "global_step": 6, "checkpoint": os.path.join("checkpoints", "ckpt-6"),
                           "save_on_signal_timeout": 25.0, "not_pushed": []}


# ---- a signal after the last step ----------------------------------------------------------------------------------
@pytest.mark.parametrize("phase", ["export", "card"])
def test_a_signal_during_the_export_or_the_card_still_ends_with_the_final_model_on_the_hub(
        loopback_hub, tmp_path, monkeypatch, hf_log, phase):
    monkeypatch.setenv(interrupts.SIGNAL_ENV, phase)
    out = tmp_path / "o"
    results = _train(tiny_train_args(out, "--max_steps", "4", "--eval_strategy", "no", "--save_strategy", "no",
                                     "--jit_compile", "false", "--callbacks", "",
                                     *_hub_args(loopback_hub, "--save_on_signal_timeout", "15")))
    assert results["global_step"] == 4
    assert "SIGTERM received after the last step: export, card and final push finished within the 15 s" in hf_log.text
    commits = loopback_hub.server.commits(REPO)
    assert commits[-1]["message"] == FINAL_COMMIT_TITLE
    files = loopback_hub.server.files(REPO)
    assert files["model.safetensors"] == (out / "model.safetensors").read_bytes()
    assert json.loads(files["last-checkpoint/trainer_state.json"])["global_step"] == 4
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["interrupted"] == {"signal": "SIGTERM", "global_step": 4,
                                      "checkpoint": os.path.join("checkpoints", "ckpt-4"),
                                      "save_on_signal_timeout": 15.0, "not_pushed": [], "completed": True}
    assert summary["hub_pushes"]["final_pushed"] is True
    assert json.loads((out / "run_state.json").read_text())["phases"]["push"] == "pushed"


@pytest.mark.parametrize("phase", ["checkpoint_weights@4", "export"])
def test_a_signal_after_the_last_step_without_a_push_still_exports_and_writes_the_card(
        tmp_path, monkeypatch, hf_log, phase):
    """No --push_to_hub: SIGTERM while the final checkpoint or the export is written is no stop (issue 31 item 6):
    the model folder and card are finished and the summary says the run completed within the budget."""
    monkeypatch.setenv(interrupts.SIGNAL_ENV, phase)
    out = tmp_path / "o"
    results = _train(tiny_train_args(out, "--max_steps", "4", "--eval_strategy", "no", "--save_strategy", "no",
                                     "--jit_compile", "false", "--callbacks", "", "--save_on_signal_timeout", "15"))
    assert results["global_step"] == 4
    assert "SIGTERM received after the last step: export and card finished within the 15 s grace" in hf_log.text
    assert "signal received: saving step" not in hf_log.text
    assert (out / "model.safetensors").stat().st_size > 0 and "fill-mask" in (out / "README.md").read_text()
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["interrupted"] == {"signal": "SIGTERM", "global_step": 4,
                                      "checkpoint": os.path.join("checkpoints", "ckpt-4"),
                                      "save_on_signal_timeout": 15.0, "not_pushed": [], "completed": True}
    phases = json.loads((out / "run_state.json").read_text())["phases"]
    assert phases == {"train": "done", "export": "done", "card": "done", "push": "skipped"}


# ---- a signal during a slow final push -----------------------------------------------------------------------------
def test_sigterm_during_a_slow_final_push_keeps_the_budget_and_the_resume_does_not_push_it_twice(
        loopback_hub, tmp_path, monkeypatch, hf_log):
    """6 s per commit, 3 s of grace, SIGTERM as the final push starts: the run stops within the budget (not the
    6 s the commit takes), reports "End of training" not pushed; the commit lands after; the resume finds it by
    its push id and does not commit again."""
    monkeypatch.setenv(interrupts.SIGNAL_ENV, "push")
    loopback_hub.server.latency(6.0, route="commit")
    out = tmp_path / "o"
    args = tiny_train_args(out, "--max_steps", "4", "--eval_strategy", "no", "--save_strategy", "no",
                           "--jit_compile", "false", "--callbacks", "",
                           *_hub_args(loopback_hub, "--save_on_signal_timeout", "3"))
    error, stopped = _interrupted_run(args)
    # the wait ends 0.3 s (a tenth) before the budget; closing and the summary fit in it (0.5 s of slack for a
    # loaded machine), and it is not the 6 s the commit takes
    assert error.step == 4 and 2.5 <= stopped < 3.5, stopped
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["interrupted"]["not_pushed"] == [FINAL_COMMIT_TITLE]
    state = json.loads((out / "run_state.json").read_text())
    unfinished = state["hub_pushes"][-1]["report"]["unfinished"]
    assert [(u["commit_message"], u["step"], u["final"]) for u in unfinished] == [(FINAL_COMMIT_TITLE, 4, True)]
    deadline = time.monotonic() + 15
    while FINAL_COMMIT_TITLE not in [c["message"] for c in loopback_hub.server.commits(REPO)]:
        assert time.monotonic() < deadline, "the final commit never landed"
        time.sleep(0.2)

    loopback_hub.server.latency(0.0, route="commit")
    monkeypatch.delenv(interrupts.SIGNAL_ENV)
    _train([a for a in args] + ["--resume_from_checkpoint", "true"])
    assert "The final push of step 4 by the process before landed after it stopped" in hf_log.text
    assert [c["message"] for c in loopback_hub.server.commits(REPO)].count(FINAL_COMMIT_TITLE) == 1
    state = json.loads((out / "run_state.json").read_text())
    assert state["phases"]["push"] == "pushed"
    assert json.loads((out / "training_summary.json").read_text())["hub_pushes"]["final_pushed"] is True


# ---- a lost reply whose retry finds nothing to commit ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["huggingface_hub.hf_api", "huggingface_hub._upload_pipeline"])
def test_huggingface_hubs_no_op_warning_becomes_one_line_of_ours(tmp_path, hf_log, name):
    """A retry after a lost reply whose commit landed has nothing to commit: huggingface_hub (< 1.0: hf_api,
    >= 1.0: _upload_pipeline) warns "No files have been modified ..." and returns the head. The raw line is held
    back; the queue says what happened, once."""
    from types import SimpleNamespace

    from hf_tpu_ext.hub.push_queue import PushQueue

    class NoChanges:  # what upload_folder does when the Hub already has every file
        def upload_folder(self, **kwargs):
            logging.getLogger(name).warning("No files have been modified since last commit. Skipping to prevent "
                                            "empty commit.")
            return SimpleNamespace(oid="0123456789abcdef", commit_url=None)

    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "roberta"}')
    queue = PushQueue("alice/noop", "hf_unused", api=NoChanges())
    try:
        queue.submit(str(folder), commit_message=FINAL_COMMIT_TITLE, step=3, final=True)
        report = queue.wait(30)
    finally:
        queue.close()
    assert report.final_pushed and report.pushed == [(FINAL_COMMIT_TITLE, "0123456789abcdef")]
    records = list({id(r): r for r in hf_log.records}.values())  # a record may reach the handler twice
    assert not [r for r in records if "No files have been modified" in r.getMessage()]
    lines = [r.getMessage() for r in records if "already holds these files" in r.getMessage()]
    assert lines == ["Push 'End of training': the Hub already holds these files (an earlier attempt whose reply was "
                     "lost landed, or nothing changed): no new commit."]
    logging.getLogger(name).warning("No files have been modified (outside a push worker)")  # other threads: kept
    assert [r.getMessage() for r in hf_log.records][-1] == "No files have been modified (outside a push worker)"
