"""The commit budget outlives the process (issue 31 item 2): a session seeds the repo's budget from the branch's
commits of the last window (one ``list_repo_commits`` at preflight), so a run resumed within the hour does not
start with a full bucket and exceed the Hub's 128 commits per hour; a Hub fault there starts it full, said once at
debug level."""

import datetime
import logging

import pytest
from huggingface_hub import HfApi

from hf_tpu_ext.hub.commit_budget import CommitBudget, reset_budgets
from hf_tpu_ext.hub.push_session import PushConfig, PushSession

NOW = 1_800_000_000.0  # seconds since the epoch the fake commit times are measured against


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _at(seconds_ago):
    return datetime.datetime.fromtimestamp(NOW - seconds_ago, tz=datetime.timezone.utc)


@pytest.fixture(autouse=True)
def _fresh_budgets():
    reset_budgets()
    yield
    reset_budgets()


def test_seed_counts_the_windows_commits_and_replays_the_bucket():
    clock = _Clock()
    budget = CommitBudget(100, 3600.0, clock=clock)  # a burst of 5, then one per 3600 / 94 = 38.3 s
    # three commits of an earlier process in the last hour (one 10 s ago), one older than the window
    assert budget.seed([_at(10), _at(4000), _at(1200), _at(1210)], now=NOW) == 3
    assert budget.seeded == 3 and budget.room() == 97
    assert budget.to_dict()["hub_commits_at_start"] == 3 and budget.to_dict()["commits_started"] == 0
    # the bucket is what the earlier process left: full (5) again 1,190 s after the pair, 4 after the last one, and
    # 10 s of refill since
    assert budget._tokens == pytest.approx(4 + 10 / (3600 / 94))
    clock.now += 3585.0  # the newest seeded commit leaves the window 3,600 s after it was made
    assert budget.room() == 99
    clock.now += 5.0
    assert budget.room() == 100


def test_a_full_window_of_earlier_commits_leaves_only_the_final_push():
    clock = _Clock()
    budget = CommitBudget(5, 60.0, burst=1, clock=clock)
    budget.seed([_at(50), _at(40), _at(30), _at(20)], now=NOW)  # 4 = 5 - 1 (the final push's) in the window
    assert budget.room() == 1
    assert budget.wait_seconds() == pytest.approx(10.0)  # the oldest of them leaves the window in 10 s
    assert budget.wait_seconds(final=True) == 0
    # a Hub clock ahead of this host's: a commit "from the future" counts as made now
    later = CommitBudget(5, 60.0, burst=1, clock=clock)
    assert later.seed([_at(-30)], now=NOW) == 1 and later.wait_seconds() == pytest.approx(20.0)


def _session(loopback_hub, repo, budget):
    return PushSession(PushConfig(output_dir="out", hub_model_id=repo, hub_token=loopback_hub.token,
                                  hub_strategy="checkpoint", hub_commit_budget=budget, budget_period=3600.0),
                       is_chief=True)


def _make_commits(loopback_hub, repo, n):
    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo(repo)
    for i in range(n):
        api.upload_file(path_or_fileobj=f"{i}".encode(), path_in_repo=f"f{i}.txt", repo_id=repo,
                        commit_message=f"Training in progress, step {i}")


def _listings(loopback_hub, repo):
    return [r for r in loopback_hub.server.requests if r["route"] == "commits" and repo in r["path"]]


def test_a_repo_with_recent_commits_leaves_the_window_less_those(loopback_hub):
    _make_commits(loopback_hub, "alice/seeded", 3)  # 3 commits + the Hub's "initial commit" of the creation
    session = _session(loopback_hub, "alice/seeded", 10)
    try:
        session.preflight()
        assert session.budget.seeded == 3 and session.budget.room() == 10 - 3
        assert session.report_dict()["commit_budget"]["hub_commits_at_start"] == 3
        assert len(_listings(loopback_hub, "alice/seeded")) == 1  # one API call
    finally:
        session.close()
    _make_commits(loopback_hub, "alice/spent", 3)
    session = _session(loopback_hub, "alice/spent", 4)  # 4 per hour: 3 for saves, 1 for the final push
    try:
        session.preflight()
        assert session.budget.room() == 1
        assert session.admit(2, max_steps=10) is None and session.report_dict()["coalesced_by_budget"] == 1
        assert session.budget.wait_seconds() > 3500  # the earlier commits leave the window in an hour
        assert session.admit(10, final=True).reason == "final"
    finally:
        session.close()


def test_a_hub_fault_starts_the_budget_full_said_once_at_debug_level(loopback_hub, caplog):
    _make_commits(loopback_hub, "alice/fault", 2)
    caplog.set_level(logging.DEBUG, logger="hf_tpu_ext.hub")
    logging.getLogger("hf_tpu_ext").addHandler(caplog.handler)
    loopback_hub.server.fail_next(1, 503, route="commits")
    first = _session(loopback_hub, "alice/fault", 10)
    second = _session(loopback_hub, "alice/fault", 10)  # a second session of the process: the same budget
    try:
        first.preflight()
        second.preflight()
        assert first.budget is second.budget and first.budget.seeded is None and first.budget.room() == 10
        assert first.report_dict()["commit_budget"]["hub_commits_at_start"] is None
        said = {id(r): r for r in caplog.records if "starts full" in r.getMessage()}  # the caplog handler may
        lines = [r.getMessage() for r in said.values()]  # see a record twice (root and hf_tpu_ext): one emission
        assert lines == ["Commit budget of alice/fault starts full: could not list its recent commits "
                         "(HfHubHTTPError: 503 Server Error: Service Unavailable for url: "
                         f"{loopback_hub.endpoint}/api/models/alice/fault/commits/main)."], lines
        assert [r.levelno for r in said.values()] == [logging.DEBUG]
        assert len(_listings(loopback_hub, "alice/fault")) == 1  # asked once, not again by the second session
        assert loopback_hub.token not in caplog.text
    finally:
        logging.getLogger("hf_tpu_ext").removeHandler(caplog.handler)
        first.close()
        second.close()
