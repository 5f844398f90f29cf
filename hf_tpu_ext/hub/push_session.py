"""The push session: what a push is, once, for ``hf-tpu train`` and the three push callbacks.

A :class:`PushSession` owns every decision about pushing a run to the Hub; the training run and the
tf_keras, Keras 3 and ``Trainer`` adapters only know how their framework writes a model folder and a
checkpoint, and ask the session:

- **configuration**: one :class:`~hf_tpu_ext.hub.push_policy.PushConfig` (transformers' argument names), from ``TrainingArguments``
  (:meth:`PushConfig.from_training_args`) or from a callback's keywords;
- **preflight**: token, repo, write access and the card fields, before the first step (chief only);
- **cadence**: ``save_strategy``/``save_steps`` (global steps, a multiple crossed inside one execution
  counts), ``save_best_only`` on ``monitor``/``mode`` (:meth:`PushSession.is_save_step`,
  :meth:`PushSession.improved`);
- **strategy**: ``hub_strategy`` as in transformers, which folders a commit carries
  and the commit titles: :mod:`hf_tpu_ext.hub.push_policy` decides them: :meth:`PushSession.admit` gives one
  :class:`~hf_tpu_ext.hub.push_policy.PushPlan` per save (``None``: not pushed now), and that plan object is what
  :meth:`PushSession.save` and the pusher (:meth:`~hf_tpu_ext.hub.pusher.HubPusher.push_plan`) carry out;
- **the commit budget** (:class:`~hf_tpu_ext.hub.commit_budget.CommitBudget`): at most ``hub_commit_budget``
  commits per ``budget_period`` seconds (default 100 per hour, the Hub allows 128), paced over the window
  with one commit kept for the final push. A save that does not fit is not written or uploaded: it
  *coalesces* into the next commit (the newest state wins). A 429 blocks further saves until its
  ``Retry-After`` (training never waits); the final push and the save of a SIGINT/SIGTERM are never refused
  by the budget (the final push replaces a stale upload waiting for a ``Retry-After``);
- **the card's fields**: from the run's summary, else what the callbacks measured (:meth:`PushSession.note_logs`:
  throughput, steps, wall time) and what the folder shows (:meth:`PushSession.write_card`);
- **trainer_state.json** of a checkpoint (:meth:`PushSession.write_trainer_state`: one shape,
  :class:`hf_tpu_ext.outputs.TrainerState`);
- **the report**: :meth:`PushSession.report_dict` (``training_summary.json`` ``hub_pushes``: the landed,
  failed, superseded pushes plus the coalesced and skipped saves).

The uploads themselves (snapshots, retries, ``Retry-After``, the card check in the push job, cleanup) are
:class:`~hf_tpu_ext.hub.pusher.HubPusher` on :class:`~hf_tpu_ext.hub.push_queue.PushQueue`. Signals belong to
:mod:`hf_tpu_ext.interrupts` (the pusher only registers a callback there that reports what is pending); an
unfinished session's pusher is closed at interpreter exit (the pusher's ``atexit`` hook, the one there is) and
the session by its context manager.

Example:
    >>> config = PushConfig(output_dir="out", hub_model_id="alice/tiny", hub_strategy="checkpoint")
    >>> with PushSession(config) as session:
    ...     session.preflight()
    ...     plan = session.admit(100)                  # None: not pushed now (coalesced, strategy "end")
    ...     if plan is not None:                       # the budget has room: write and push
    ...         session.save(plan, "out", checkpoint_folder="out/last-checkpoint")
    ...     session.save(session.admit(200, final=True), "out")
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import time
from typing import Any, Callable, Dict, List, Optional

from hf_tpu_ext import interrupts
from hf_tpu_ext.args import HUB_STRATEGIES  # noqa: F401 (the flag's choices, re-exported)
from hf_tpu_ext.distributed import is_main_process
from hf_tpu_ext.errors import ModelCardError
from hf_tpu_ext.fileio import atomic_write_text
from hf_tpu_ext.hub.card_check import validate_model_card
from hf_tpu_ext.hub.card_facts import eval_results_from_logs
from hf_tpu_ext.hub.card_guard import write_card
from hf_tpu_ext.hub.card_render import initialization_fields, load_summary, render_model_card
from hf_tpu_ext.hub.commit_budget import (API_CALLS_PER_COMMIT, DEFAULT_BUDGET_PERIOD, DEFAULT_COMMIT_BUDGET,  # noqa: F401
                                          HUB_API_CALLS, HUB_API_PERIOD, HUB_COMMITS_PER_HOUR, CommitBudget,
                                          budget_for, reset_budgets, seed_from_hub)
from hf_tpu_ext.hub.push_policy import (DEFAULT_HUB_STRATEGY, DEFAULT_SAVE_STRATEGY, SAVE_STRATEGIES,  # noqa: F401
                                        PushConfig, PushPlan, crossed_save_step, improves, monitor_value, plan_save,
                                        strategy_rule)
from hf_tpu_ext.hub.push_queue import PushReport, note_step
from hf_tpu_ext.hub.pusher import HubPusher
from hf_tpu_ext.hub.resume import LAST_CHECKPOINT
from hf_tpu_ext.outputs import TrainerState

logger = logging.getLogger("hf_tpu_ext.hub")

class PushSession:
    """One run's pushes to one Hub repo (see the module doc).

    Args:
        config: the :class:`PushConfig`.
        pusher: a :class:`~hf_tpu_ext.hub.pusher.HubPusher` to push through (default: one made from
            ``config`` at :meth:`preflight`).
        api: the :class:`huggingface_hub.HfApi` for the uploads (tests; default: one on ``HF_ENDPOINT``).
        is_chief: whether this process talks to the Hub (default: :func:`hf_tpu_ext.distributed.is_main_process`).
            Other processes get a session that pushes nothing (its methods return at once).

    Attributes:
        repo_id: the full ``"namespace/name"`` after :meth:`preflight`.
        coalesced_steps: saves the budget folded into a later commit (not written, not uploaded).
        best, best_step: the best ``monitor`` value so far and its step (``save_best_only``).
    """

    def __init__(self, config: PushConfig, *, pusher=None, api=None, is_chief: Optional[bool] = None):
        self.config = config
        self.is_chief = is_main_process() if is_chief is None else bool(is_chief)
        self.pusher = pusher
        self.repo_id: Optional[str] = getattr(pusher, "repo_id", None)
        self._api = api
        self.coalesced_steps: List[int] = []
        self._coalesced_total = 0
        self._signal_saves = 0
        self.best: Optional[float] = None
        self.best_step: Optional[int] = None
        self.budget: Optional[CommitBudget] = None
        self._last_save_step: Optional[int] = None
        self._last_due_step: Optional[int] = None
        self._measured: Dict[str, Any] = {}
        self._started: Optional[float] = None
        self._warned_monitor = False
        self._closed = False
        self._preflighted = False
        self._final_report = None

    def __repr__(self):  # the token stays out of logs and tracebacks
        c = self.config
        return (f"PushSession(repo_id={self.repo_id or c.hub_model_id!r}, hub_strategy={c.hub_strategy!r}, "
                f"save_strategy={c.save_strategy!r})")

    # ---- Hub access --------------------------------------------------------------------------
    @property
    def token(self) -> Optional[str]:
        """The resolved token (after :meth:`preflight`), for other Hub calls of the same run."""
        return self.pusher.token if self.pusher is not None else self.config.hub_token

    @property
    def pushed_steps(self) -> List[int]:
        """The steps of the saves handed to the pusher (the final one included; the last 100): the pusher's note."""
        return self.pusher.pushed_steps if self.pusher is not None else []

    @property
    def push_timeout(self) -> Optional[float]:
        return self.config.push_timeout

    @property
    def active(self) -> bool:
        """This process pushes (the chief) and the session is open."""
        return self.is_chief and not self._closed

    def preflight(self) -> Optional[str]:
        """Token, repo, write access and card fields, before training; idempotent. Chief only.

        Returns:
            The full repo id (``None`` on other processes).

        Raises:
            HubAuthError, HubRepoError, HubError: see :meth:`hf_tpu_ext.hub.pusher.HubPusher.preflight`.
            ModelCardError: the card fields (license, language, dataset) do not validate.
        """
        if not self.is_chief:
            return None
        if self._preflighted:  # once per session (the pusher's own preflight is once per pusher)
            return self.repo_id
        c = self.config
        if self.pusher is None:
            self.pusher = HubPusher(c.hub_model_id, token=c.hub_token, hub_strategy=c.hub_strategy,
                                    private=c.hub_private_repo, revision=c.hub_revision, output_dir=c.output_dir,
                                    api=self._api, max_retries=c.max_retries, backoff_seconds=c.backoff_seconds,
                                    push_timeout=c.push_timeout, card_fields=c.card_fields)
        self.repo_id = self.pusher.preflight()
        if self.budget is None:
            self.budget = budget_for(self.repo_id, c.hub_commit_budget, c.budget_period)
            self.pusher.set_rate_limit_listener(self.budget.note_rate_limited)
            hub_api = getattr(self.pusher, "_hf_api", None)  # a test's stand-in pusher has none: the bucket starts full
            if hub_api is not None:  # a resume within the window counts what the earlier process committed
                seed_from_hub(self.budget, hub_api(), self.repo_id, revision=c.hub_revision, token=self.token)
        self._preflighted = True
        return self.repo_id

    # ---- cadence -----------------------------------------------------------------------------
    def begin(self, step: int) -> None:
        """Training starts (or resumes) at global ``step``: the save cadence and the wall clock start here."""
        self._last_save_step = int(step)
        if self._started is None:
            self._started = time.monotonic()

    def is_save_step(self, step: int) -> bool:
        """``save_strategy="steps"``: ``step`` crossed a multiple of ``save_steps`` since the last save (with
        ``steps_per_execution > 1`` the step jumps; the save happens at the first step past the multiple)."""
        c = self.config
        return c.save_strategy == "steps" and crossed_save_step(step, self._last_save_step, c.save_steps)

    @property
    def saves_each_epoch(self) -> bool:
        """``save_strategy="epoch"``: a save at every epoch end."""
        return self.config.save_strategy == "epoch"

    def due(self, step: int, logs: Optional[dict] = None) -> bool:
        """Whether the save point at ``step`` saves: not a second save of the step just saved, and with
        ``save_best_only`` an improvement. Every process asks (the answer is the same on all: checkpoint
        writes may be collective); the cadence of :meth:`is_save_step` restarts at ``step`` either way."""
        step = int(step)
        if step == self._last_due_step:
            return False
        self._last_save_step = self._last_due_step = step
        return self.improved(logs, step)

    def save_interval(self, steps_per_epoch: Optional[int] = None) -> Optional[int]:
        """Global steps between saves: ``save_steps``; with ``save_strategy="epoch"`` ``steps_per_epoch`` (None
        when unknown); None with ``"no"`` (a trainer state's ``save_steps``)."""
        if self.config.save_strategy == "steps":
            return int(self.config.save_steps)
        return int(steps_per_epoch) if self.config.save_strategy == "epoch" and steps_per_epoch else None

    def checkpoint_folder(self) -> str:
        """The local folder an adapter writes a save's resumable checkpoint into (``output_dir/last-checkpoint``,
        rewritten by each save; the pusher snapshots it, ``all_checkpoints`` names it ``checkpoint-<step>/``
        on the Hub). Model pushes never include it."""
        return os.path.join(self.config.output_dir or ".", LAST_CHECKPOINT)

    def improved(self, logs: Optional[dict], step: int) -> bool:
        """``save_best_only``: whether ``logs[monitor]`` (Keras' ``val_*`` or ``eval_*`` name) beats the best so far.

        Without ``save_best_only`` always True. A missing or NaN value is not an improvement (warned once).
        """
        c = self.config
        if not c.save_best_only:
            return True
        value = monitor_value(logs, c.monitor)
        if value is None:
            if not self._warned_monitor:
                logger.warning("save_best_only: %r is not in the logs at step %d; nothing saved.", c.monitor, step)
                self._warned_monitor = True
            return False
        if improves(value, self.best, c.mode):
            self.best, self.best_step = value, int(step)
            return True
        return False

    def wants_checkpoint(self, final: bool = False) -> bool:
        """Whether a save's commit carries a resumable checkpoint (``"checkpoint"``: ``last-checkpoint/``;
        ``"all_checkpoints"``: ``checkpoint-<step>/`` of each save, the final one included, as transformers'
        Trainer pushes them): the strategy's rule, for an adapter whose checkpoint write is collective (every
        process writes it before the chief's :meth:`admit`). ``final`` is accepted for symmetry with :meth:`admit`."""
        return strategy_rule(self.config.hub_strategy).checkpoint is not None

    def admit(self, step: int, final: bool = False, max_steps: Optional[int] = None) -> Optional[PushPlan]:
        """The :class:`~hf_tpu_ext.hub.push_policy.PushPlan` of the save at ``step`` when it is pushed now (the
        adapter writes the folders and hands them with this plan to :meth:`save`), else ``None``.

        The one decision per save (:func:`~hf_tpu_ext.hub.push_policy.plan_save`). ``hub_strategy="end"`` pushes the final state only. A save the commit budget
        has no room for is *coalesced*: recorded (``coalesced_steps``), not written, and its state reaches the Hub
        with the next save that fits, or the final push. A save at the run's last step (``step == max_steps``,
        global optimizer steps) coalesces into the final push that follows with the same state: one commit
        instead of two against the Hub's 128 per hour. The final push is always admitted, and so is a save after
        a SIGINT/SIGTERM (:func:`hf_tpu_ext.interrupts.received`): it is the state a resume starts from, pushed
        within the grace budget whatever the pacing. Non-chief processes and a closed session: ``None``.
        """
        if not self.active:
            return None
        signum = None if final else interrupts.received()
        wait = self.budget.wait_seconds() if self.budget is not None and not final and signum is None else 0.0
        plan = plan_save(self.config.hub_strategy, step, final=final, max_steps=max_steps,
                         signalled=signum is not None, budget_wait=wait)
        if plan.coalesced:
            note_step(self.coalesced_steps, step)
        if plan.reason == "signal":  # the save of a SIGINT/SIGTERM is what a resume starts from: as a final push
            logger.info("Save at step %d after %s: pushed now, past the commit budget's pacing (within the %g s "
                        "grace budget).", step, signal.Signals(signum).name, interrupts.grace())
            self._signal_saves += 1
        elif plan.reason == "budget":
            self._coalesced_total += 1
            logger.info("Save at step %d coalesced into the next push (commit budget %d per %.0f s; room in %.0f s).",
                        step, self.budget.commits, self.budget.period, wait)
        return plan if plan.push else None

    # ---- pushes ------------------------------------------------------------------------------
    def save(self, plan: Optional[PushPlan], model_folder: Optional[str], *, checkpoint_folder: Optional[str] = None,
             checkpoint_path: Optional[str] = None,
             export_checkpoint: Optional[Callable[[str, str], Any]] = None) -> None:
        """Carry out ``plan`` (:meth:`admit`'s) with the written save: hand it to the pusher (returns at once; the
        upload runs in the background).

        Args:
            plan: the save's plan from :meth:`admit` (``None``: nothing to do).
            model_folder: the model folder (weights, config, tokenizer, card, run files); ``None``: none.
            checkpoint_folder: a resumable checkpoint of the step (with its ``trainer_state.json``), copied into the
                snapshot; used when the plan puts a checkpoint somewhere (``hub_strategy`` checkpoint,
                all_checkpoints).
            checkpoint_path, export_checkpoint: instead of ``checkpoint_folder``: a backend's checkpoint and its
                ``export_checkpoint(checkpoint_path, folder)``, which writes the Hub layout straight into the
                pusher's staging folder (one copy on disk), only when the plan pushes a checkpoint.

        Raises:
            HubAuthError, HubRepoError, HubError: from :meth:`preflight` (the save's one call; idempotent) when it
                has not run yet.
        """
        if plan is None or not self.active:
            return
        self.preflight()
        if self.budget is not None:
            self.budget.note_commit(final=plan.final)
        staged = None
        if plan.checkpoint is not None and checkpoint_folder is None and checkpoint_path is not None \
                and export_checkpoint is not None:
            staged = self.pusher.staging_folder()
            export_checkpoint(checkpoint_path, staged)
        self.pusher.push_plan(plan, model_folder, staged or checkpoint_folder, staged=staged is not None)
        self._last_save_step = plan.step

    # ---- measurements and files -------------------------------------------------------------
    def note_logs(self, logs: Optional[dict], step: Optional[int] = None, epoch: Optional[float] = None) -> None:
        """Remember what the callbacks measured, for the card (``tokens_per_second`` of the throughput callback,
        evaluation results, the step and epoch)."""
        logs = logs or {}
        m = self._measured
        for key, name in (("tokens_per_second", "train_tokens_per_second"), ("samples_per_second", "samples_per_second")):
            value = logs.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
                m[name] = float(value)
        found = eval_results_from_logs(logs)
        if found:
            m["eval_results"] = found
        if step is not None:
            m["global_step"] = int(step)
        if epoch is not None:
            m["epoch"] = float(epoch)

    def measured(self, **known) -> Dict[str, Any]:
        """The card fields this session measured, completed with ``known`` ones (the adapter's: batch size,
        accelerator, precision): wall time so far, throughput, tokens seen (``step x batch x sequence``, with
        the sequence length from the throughput figures)."""
        out = dict(self._measured)
        out.update({k: v for k, v in known.items() if v is not None})
        if self._started is not None:
            out.setdefault("train_runtime", time.monotonic() - self._started)
        tps, sps = out.get("train_tokens_per_second"), out.pop("samples_per_second", None)
        if out.get("global_step") and out.get("global_batch_size") and tps and sps:
            out.setdefault("tokens_seen", int(out["global_step"] * out["global_batch_size"] * round(tps / sps)))
        return out

    def write_card(self, folder: str, summary=None, name_or_path: Optional[str] = None, **known) -> Optional[str]:
        """Render the fill-mask card of ``folder`` into ``folder/README.md`` (checked locally; the Hub checks
        it in the push job).

        Args:
            folder: the model folder.
            summary: the run's training summary, or a callable returning it (a failing one is logged and
                ignored); ``None``: what the folder holds, completed with what this session measured and ``known``.
            name_or_path: what the weights were loaded from (the card's ``base_model``/``initialized_from``).
            **known: the adapter's facts (``global_batch_size``, ``accelerator``, ``backend``, ``precision``, ...).

        Returns:
            The card path, or ``None`` when the card did not validate (logged; training goes on).
        """

        if callable(summary):
            try:
                summary = summary()
            except Exception as err:  # a summary problem must not stop training
                logger.warning("summary_fn failed (%s: %s); the card uses what the output folder shows.",
                               type(err).__name__, err)
                summary = None
        if summary is None:
            summary = load_summary(folder)
            facts = dict(self.measured(**known), **initialization_fields(name_or_path))
            for key, value in facts.items():
                if summary.get(key) in (None, {}, "") and value is not None:
                    summary[key] = value
        try:
            card = render_model_card(folder, repo_id=self.repo_id or self.config.hub_model_id, summary=summary,
                                     **self.config.card_fields)
            validate_model_card(card, remote=False)
            path = os.path.join(folder, "README.md")
            write_card(folder, card)  # a README.md the user wrote keeps its text (metadata merged)
            return path
        except ModelCardError as err:
            logger.error("Model card not updated: %s", err)
            return None

    def write_trainer_state(self, folder: str, step: int, *, epoch: float, max_steps: int = 0,
                            state: Optional[dict] = None, name: str = "trainer_state.json",
                            known_only: bool = False) -> str:
        """Write ``folder/trainer_state.json`` of a save (:class:`hf_tpu_ext.outputs.TrainerState`'s shape).

        Args:
            folder: the checkpoint folder.
            step, epoch, max_steps: where training is (global optimizer steps; epochs as a float).
            state: the run's state (log history, best metric, ...); ``global_step``, ``epoch`` and
                ``max_steps`` are set from the arguments, ``best_metric``/``best_global_step`` from this session
                when the state has none.
            name: the file name.
            known_only: write only the fields given (``state``'s, the arguments', a best metric) instead of every
                :class:`~hf_tpu_ext.outputs.TrainerState` field with its default (a drop-in callback's fit does
                not know them all; transformers' ``TrainerState`` fills a missing field with its own default).

        Returns:
            The path written.
        """

        fields = {f.name for f in dataclasses.fields(TrainerState)}
        data = {k: v for k, v in dict(state or {}).items() if k in fields}
        data.update(global_step=int(step), epoch=float(epoch), max_steps=int(max_steps or 0))
        if data.get("best_metric") is None:
            data.update(best_metric=self.best, best_global_step=self.best_step)
        if self.config.save_steps and "save_steps" not in (state or {}):
            data["save_steps"] = self.config.save_steps
        if not known_only:
            return TrainerState(**data).save(os.path.join(folder, name))
        given = set(data) - ({"best_metric", "best_global_step"} if data.get("best_metric") is None else set())
        full = dataclasses.asdict(TrainerState(**data))  # only TrainerState field names, as its save writes them
        return atomic_write_text(os.path.join(folder, name),
                                 json.dumps({k: v for k, v in full.items() if k in given}, indent=2, sort_keys=True) + "\n")

    # ---- the end -----------------------------------------------------------------------------
    def report(self):
        """The pusher's :class:`~hf_tpu_ext.hub.push_queue.PushReport` so far (after :meth:`finish`: the final one)."""
        if self._final_report is not None:
            return self._final_report
        if self.pusher is not None:
            return self.pusher.report()

        return PushReport(repo_id=self.repo_id, revision=self.config.hub_revision)

    def find_push(self, push_id: str) -> Optional[str]:
        """The commit id of an earlier push (``push_id`` from a report's ``unfinished``) on the Hub, else ``None``
        (see :meth:`hf_tpu_ext.hub.pusher.HubPusher.find_push`); ``None`` on non-chief processes."""
        if not self.active:
            return None
        self.preflight()
        return self.pusher.find_push(push_id)

    def finish(self, timeout: Optional[float] = None):
        """Wait for the uploads (``timeout`` seconds; default ``push_timeout``), log the report, close.

        Returns:
            The final :class:`~hf_tpu_ext.hub.push_queue.PushReport` (``None`` on non-chief processes).
        """
        if not self.is_chief:
            return None
        if self._final_report is not None:
            return self._final_report
        try:
            if self.pusher is not None:
                self._final_report = self.pusher.finish(self.config.push_timeout if timeout is None else timeout)
        finally:
            self._close()
        return self._final_report

    def close(self) -> None:
        """Stop without waiting: pending uploads are dropped (and reported), staging removed; idempotent."""
        if self.pusher is not None and self._final_report is None:
            self.pusher.close()
            self._final_report = self.pusher.report()
        self._close()

    def abandon(self, why: str) -> None:
        """Report what is pending (``why``: the reason) and close without waiting."""
        if self._closed:
            return
        try:
            if self.pusher is not None:
                self.pusher.log_pending(why)
        finally:
            self.close()

    def _close(self) -> None:
        self._closed = True

    def report_dict(self) -> dict:
        """``training_summary.json``'s ``hub_pushes``: the pusher's report (:meth:`PushReport.to_dict`) plus
        ``coalesced_saves``/``skipped_saves`` (steps whose state a later commit carried / that no commit carried),
        their totals, and ``commit_budget``."""
        report = self.report()
        data = report.to_dict()
        landed = [o.step for o in report.outcomes if o.status == "pushed" and o.step is not None]
        last = max(landed) if landed else None
        not_landed = sorted(set(self.coalesced_steps) | {o.step for o in report.outcomes
                                                          if o.status in ("superseded", "failed", "dropped")
                                                          and o.step is not None})
        data["coalesced_saves"] = [s for s in not_landed if last is not None and s <= last]
        data["skipped_saves"] = [s for s in not_landed if last is None or s > last]
        data["coalesced_by_budget"] = self._coalesced_total
        data["signal_saves"] = self._signal_saves
        data["commit_budget"] = self.budget.to_dict() if self.budget is not None else {
            "commits": self.config.hub_commit_budget, "period_seconds": self.config.budget_period}
        return data

    def __enter__(self) -> "PushSession":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish()
        else:
            what = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else f"stopped by {exc_type.__name__}"
            self.abandon(f"Training {what}")
        return False


def _from_session(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.session, name), doc=doc)


def _from_config(name: str) -> property:
    return property(lambda self: getattr(self.session.config, name), doc=f":attr:`PushConfig.{name}` of the session.")


class SessionBacked:
    """Mixin of the push adapters: ``repo_id``, ``pushed_steps``, ``best``, ``best_step``, ``pusher`` and the
    configuration's fields (``hub_model_id``, ``hub_strategy``, ``save_steps``, ``output_dir``, ...; never the token)
    are read-only properties over the adapter's ``session``, so the adapter's public attributes stay what they were."""

    session: PushSession

    repo_id = _from_session("repo_id", "The full repo id (after :meth:`preflight`).")
    pushed_steps = _from_session("pushed_steps", ":attr:`PushSession.pushed_steps`.")
    best = _from_session("best", "The best ``monitor`` value so far (``save_best_only``).")
    best_step = _from_session("best_step", "The step of :attr:`best`.")
    pusher = _from_session("pusher", "The session's :class:`~hf_tpu_ext.hub.pusher.HubPusher` (after preflight).")
    output_dir = _from_config("output_dir")
    hub_model_id = _from_config("hub_model_id")
    hub_strategy = _from_config("hub_strategy")
    hub_private_repo = _from_config("hub_private_repo")
    hub_revision = _from_config("hub_revision")
    save_strategy = _from_config("save_strategy")
    save_steps = _from_config("save_steps")
    save_best_only = _from_config("save_best_only")
    monitor = _from_config("monitor")
    mode = _from_config("mode")
    push_timeout = _from_config("push_timeout")
    max_retries = _from_config("max_retries")
    backoff_seconds = _from_config("backoff_seconds")
    hub_commit_budget = _from_config("hub_commit_budget")
    budget_period = _from_config("budget_period")
    card_fields = _from_config("card_fields")

    def preflight(self) -> Optional[str]:
        """Token, write access, repo and card fields before training (chief only; idempotent); returns the repo id
        (:meth:`PushSession.preflight`)."""
        return self.session.preflight()
