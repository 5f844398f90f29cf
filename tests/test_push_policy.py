"""The push policy (hf_tpu_ext.hub.push_policy): pure Python, no Hub, no clock -- every strategy x save kind -> plan."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hf_tpu_ext.args import HUB_STRATEGIES
from hf_tpu_ext.errors import ArgumentError
from hf_tpu_ext.hub.push_policy import (MONITOR_ALIASES, STRATEGY_TABLE, PushPlan, check_hub_strategy, commit_title,
                                        crossed_save_step, improves, monitor_value, plan_save)

ROOT = Path(__file__).resolve().parent.parent

# save kind -> plan_save keywords (step 40 of a 100-step run unless said)
KINDS = {
    "paced": dict(step=40, max_steps=100),
    "budget": dict(step=40, max_steps=100, budget_wait=12.5),
    "last_step": dict(step=100, max_steps=100),
    "last_step_signal": dict(step=100, max_steps=100, signalled=True),
    "signal": dict(step=40, max_steps=100, signalled=True, budget_wait=12.5),
    "final": dict(step=100, max_steps=100, final=True, budget_wait=12.5),
    "final_unknown_max": dict(step=7, final=True),
}
# the plan of a save that pushes during training, per kind: (push, reason, budget_wait)
DURING = {"paced": (True, "paced", 0.0), "budget": (False, "budget", 12.5), "last_step": (False, "last_step", 0.0),
          "last_step_signal": (False, "last_step", 0.0), "signal": (True, "signal", 0.0),
          "final": (True, "final", 0.0), "final_unknown_max": (True, "final", 0.0)}
# strategy -> (checkpoint, checkpoint_path of a step-40 save, inherit)
WHERE = {"end": (None, None, ()), "every_save": (None, None, ()),
         "checkpoint": ("with_model", "last-checkpoint", ("last-checkpoint",)),
         "all_checkpoints": ("own_commit", "checkpoint-{step}", ())}
CASES = [(s, k) for s in HUB_STRATEGIES for k in KINDS]


def _expected(strategy: str, kind: str) -> PushPlan:
    kw = KINDS[kind]
    step, final = kw["step"], kw.get("final", False)
    push, reason, wait = DURING[kind]
    if strategy == "end" and not final:
        push, reason, wait = False, "end_strategy", 0.0
    checkpoint, path, inherit = WHERE[strategy]
    return PushPlan(step=step, final=final, push=push, reason=reason,
                    commit_message="End of training" if final else f"Training in progress, step {step}",
                    checkpoint=checkpoint, checkpoint_path=path and path.format(step=step),
                    checkpoint_message=f"Checkpoint at step {step}" if strategy == "all_checkpoints" else None,
                    inherit=inherit, budget_wait=wait)


@pytest.mark.parametrize("strategy,kind", CASES, ids=[f"{s}-{k}" for s, k in CASES])
def test_every_strategy_and_save_kind_has_one_plan(strategy, kind):
    assert plan_save(strategy, **KINDS[kind]) == _expected(strategy, kind)


def test_plan_facts():
    assert plan_save("every_save", 5, budget_wait=3.0).coalesced and plan_save("every_save", 5, max_steps=5).coalesced
    assert not plan_save("end", 5).coalesced and not plan_save("every_save", 5).coalesced
    assert plan_save("checkpoint", 9, final=True, commit_message="Upload x").commit_message == "Upload x"
    with pytest.raises(AttributeError):  # frozen
        plan_save("end", 1).push = True


def test_the_table_covers_every_flag_value_and_the_one_check():
    assert tuple(STRATEGY_TABLE) == HUB_STRATEGIES
    assert [r.name for r in STRATEGY_TABLE.values()] == list(HUB_STRATEGIES)
    assert [n for n, r in STRATEGY_TABLE.items() if not r.pushes_saves] == ["end"]
    assert check_hub_strategy("checkpoint") == "checkpoint"
    with pytest.raises(ArgumentError) as err:
        check_hub_strategy("sometimes")
    assert str(err.value) == "hub_strategy must be one of end, every_save, checkpoint, all_checkpoints, got 'sometimes'."
    with pytest.raises(ArgumentError, match="^--hub_strategy must be one of end, every_save, checkpoint, all_checkpoints, "
                                            "got 'x'.$"):
        check_hub_strategy("x", "--hub_strategy")
    with pytest.raises(ArgumentError, match="^hub_strategy must be one of"):
        plan_save("x", 1)


def test_commit_titles():
    assert [commit_title(7), commit_title(7, final=True), commit_title(7, checkpoint_only=True)] == [
        "Training in progress, step 7", "End of training", "Checkpoint at step 7"]


@pytest.mark.parametrize("logs,monitor,value", [
    ({"eval_loss": 2.5}, "eval_loss", 2.5), ({"val_loss": 2.5}, "eval_loss", 2.5),
    ({"eval_accuracy": "0.75"}, "val_accuracy", 0.75), ({"eval_loss": float("nan")}, "eval_loss", None),
    ({"eval_loss": "n/a"}, "eval_loss", None), ({}, "eval_loss", None), (None, "perplexity", None),
    ({"eval_loss": 1.0, "val_loss": 2.0}, "val_loss", 2.0),
])
def test_monitor_value(logs, monitor, value):
    assert monitor_value(logs, monitor) == value
    assert MONITOR_ALIASES["val_loss"] == "eval_loss"


def test_best_model_and_cadence():
    assert improves(3.0, None, "min") and improves(2.0, 3.0, "min") and not improves(3.0, 3.0, "min")
    assert improves(0.6, 0.5, "max") and not improves(0.4, 0.5, "max")
    assert not improves(float("inf"), None, "max") and not improves(float("-inf"), 1.0, "min")  # never a best
    # steps 1..10 with save_steps 4, one step per call: saves at 4 and 8; with 3 steps a call: at 6 (crossed 4), 9
    last, saved = 0, []
    for step in range(1, 11):
        if crossed_save_step(step, last, 4):
            saved, last = saved + [step], step
    assert saved == [4, 8]
    assert [s for s in (3, 6, 9) if crossed_save_step(s, s - 3, 4)] == [6, 9]


# ---- one place decides: no strategy name, title or monitor alias in the modules that carry plans out ------------
CARRIERS = ("hf_tpu_ext/hub/push_session.py", "hf_tpu_ext/hub/pusher.py", "hf_tpu_ext/hub/push_queue.py",
            "hf_tpu_ext/hub/commit_budget.py")


@pytest.mark.parametrize("path", CARRIERS)
def test_policy_literals_live_only_in_the_policy(path):
    tree = ast.parse((ROOT / path).read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and id(n) not in docs]
    policy = set(HUB_STRATEGIES) | set(MONITOR_ALIASES) | {"last-checkpoint"}
    found = [s for s in strings if s in policy or any(t in s for t in ("End of training", "Training in progress",
                                                                        "Checkpoint at step", "checkpoint-{"))]
    assert found == [], f"{path} decides push policy: {found}"
    assert "hub_strategy ==" not in (ROOT / path).read_text()


# ---- one Retry-After clock per repo, one atexit owner ---------------------------------------------------
def test_the_queue_and_the_budget_read_one_retry_after_clock():
    from hf_tpu_ext.hub.commit_budget import budget_for, reset_budgets
    from hf_tpu_ext.hub.push_queue import PushQueue
    from hf_tpu_ext.hub.retry_policy import retry_after_for

    reset_budgets()
    try:
        budget = budget_for("alice/clock", 100, 3600.0)
        queue = PushQueue("alice/clock", None, api=object())
        try:
            assert queue.retry_after is budget.retry_after is retry_after_for("alice/clock")
            queue.retry_after.note(30.0)  # what the queue does at a 429 with Retry-After: 30
            assert 29.0 < budget.wait_seconds(final=True) <= 30.0  # the final push waits for it too
            assert budget_for("alice/clock", 10, 3600.0).retry_after is queue.retry_after  # a stricter budget keeps it
            assert retry_after_for("alice/other").seconds_left() == 0.0
        finally:
            queue.close()
    finally:
        reset_budgets()
    assert retry_after_for("alice/clock").seconds_left() == 0.0  # a fresh Hub forgets it


def test_one_atexit_owner_in_the_hub_layer():
    owners = sorted(p.name for p in (ROOT / "hf_tpu_ext" / "hub").glob("*.py") if "atexit.register(" in p.read_text())
    assert owners == ["pusher.py"]


def _recording_session(config):
    """A session whose Hub side is stood in for: preflight makes the commit budget only (no Hub), the saves it would
    queue are recorded, nothing is uploaded."""
    from hf_tpu_ext.hub.commit_budget import budget_for
    from hf_tpu_ext.hub.push_session import PushSession

    class Recording(PushSession):
        saves = []

        def preflight(self):
            if self.budget is None:
                self.repo_id = config.hub_model_id
                self.budget = budget_for(self.repo_id, config.hub_commit_budget, config.budget_period)
            return self.repo_id

        def _submit(self, plan, model_folder, checkpoint, replaced=()):
            self.saves.append({"step": plan.step, "checkpoint_folder": checkpoint, "final": plan.final,
                               "commit_message": plan.commit_message})
            self.pushed_steps.append(plan.step)

    return Recording(config, is_chief=True)


def test_a_session_carries_the_plans_out(monkeypatch):
    from hf_tpu_ext import interrupts
    from hf_tpu_ext.hub.commit_budget import reset_budgets
    from hf_tpu_ext.hub.push_session import PushConfig

    reset_budgets()
    config = PushConfig(output_dir="out", hub_model_id="alice/plans", hub_strategy="all_checkpoints",
                        hub_commit_budget=1, budget_period=3600.0)
    session = pusher = _recording_session(config)
    try:
        session.preflight()
        plan = session.admit(2, max_steps=10)
        assert (plan.reason, plan.step, plan.checkpoint_path) == ("paced", 2, "checkpoint-2")
        session.save(plan, "out", checkpoint_folder="ck-2")
        assert session.admit(4, max_steps=10) is None  # the hour's commit is spent: coalesced by the budget
        assert session.report_dict()["coalesced_by_budget"] == 1 and session.budget.wait_seconds() > 3000
        assert session.admit(10, max_steps=10) is None  # the last step's save: carried by the final push
        assert session.report_dict()["coalesced_by_budget"] == 1
        monkeypatch.setattr(interrupts, "received", lambda: 15)
        assert session.admit(6, max_steps=10).reason == "signal"
        plan = session.admit(10, final=True)
        assert (plan.reason, plan.final) == ("final", True)
        session.save(plan, "out", checkpoint_folder="ck-10")
        assert session.pushed_steps == [2, 10]  # noted once per save
        assert pusher.saves == [
            {"step": 2, "checkpoint_folder": "ck-2", "final": False, "commit_message": "Training in progress, step 2"},
            {"step": 10, "checkpoint_folder": "ck-10", "final": True, "commit_message": "End of training"}]
        assert session.coalesced_steps == [4, 10]
        assert session.report_dict()["coalesced_by_budget"] == 1 and session.report_dict()["signal_saves"] == 1
    finally:
        session.close()
        reset_budgets()
