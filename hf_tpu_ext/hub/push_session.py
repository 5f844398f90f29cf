"""The push session: the one push object of ``hf-tpu train``, the three push callbacks and ``hf-tpu push``.

A :class:`PushSession` owns every decision about pushing a run to one Hub repo and carries them out; the training
run, the tf_keras, Keras 3 and ``Trainer`` adapters and ``hf-tpu push`` only know how their framework writes a model
folder and a checkpoint:

- **configuration**: one :class:`~hf_tpu_ext.hub.push_policy.PushConfig` (transformers' argument names);
- **preflight**: token, repo created or found, WRITE access proven from the token, the card fields validated by the
  Hub, README.md kept out of Git LFS, before the first step (chief only); then the upload queue starts;
- **the plan**: :meth:`PushSession.admit` gives one :class:`~hf_tpu_ext.hub.push_policy.PushPlan` per save
  (:func:`~hf_tpu_ext.hub.push_policy.plan_save`: ``hub_strategy``, titles, the last step, a signal, the budget;
  ``None``: not pushed now), and :meth:`PushSession.save` carries it out;
- **the commit budget** (:class:`~hf_tpu_ext.hub.commit_budget.CommitBudget`): at most ``hub_commit_budget``
  commits per ``budget_period`` seconds, paced with one commit kept for the final push; a save that does not fit
  *coalesces* into the next commit; a 429 blocks saves until its ``Retry-After``; the final push and the save of a
  SIGINT/SIGTERM are never refused by it;
- **the queue** (:class:`~hf_tpu_ext.hub.push_queue.PushQueue`): a save is snapshotted when it is queued (the model
  folder copied, a backend's checkpoint hard-linked: it is pushed as written, whatever later happens to its
  folder), uploaded in the background with retries and ``Retry-After``, the card checked in the push job and read
  back after the final push;
- **the report**: :meth:`PushSession.report` / :meth:`PushSession.report_dict` (``training_summary.json``
  ``hub_pushes``).

The callbacks' cadence, their card and ``trainer_state.json`` are :class:`hf_tpu_ext.callbacks.push_cadence.CallbackSession`
(this class plus the callbacks-only half). Scripts push a folder with :func:`push_save` over a session of
:meth:`PushSession.for_script`. Signals belong to :mod:`hf_tpu_ext.interrupts`; process exit to
:mod:`hf_tpu_ext.hub.pusher` (the hub layer's one ``atexit`` hook).

Example:
    >>> config = PushConfig(output_dir="out", hub_model_id="alice/tiny", hub_strategy="checkpoint")
    >>> with PushSession(config) as session:
    ...     session.preflight()
    ...     plan = session.admit(100)                  # None: not pushed now (coalesced, strategy "end")
    ...     if plan is not None:                       # the budget has room: write and push
    ...         session.save(plan, "out", checkpoint_files=backend.checkpoint_files("out/checkpoint-100"))
    ...     session.save(session.admit(200, final=True), "out")
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from typing import List, Mapping, Optional, Sequence, Union

from hf_tpu_ext import interrupts
from hf_tpu_ext.args import HUB_STRATEGIES, check_repo_id  # noqa: F401 (HUB_STRATEGIES: the flag's choices, re-exported)
from hf_tpu_ext.distributed import is_main_process
from hf_tpu_ext.errors import ArgumentError, HubError
from hf_tpu_ext.hub import card_guard  # its guard called through the module (tests stand in for it)
from hf_tpu_ext.hub.card_check import card_expectations, check_card_on_hub, validate_card_file, validate_model_card
from hf_tpu_ext.hub.card_render import render_model_card
from hf_tpu_ext.hub.checkpoint_layouts import push_later_command
from hf_tpu_ext.hub.commit_budget import (API_CALLS_PER_COMMIT, DEFAULT_BUDGET_PERIOD, DEFAULT_COMMIT_BUDGET,  # noqa: F401
                                          HUB_API_CALLS, HUB_API_PERIOD, HUB_COMMITS_PER_HOUR, CommitBudget,
                                          budget_for, reset_budgets, seed_from_hub)
from hf_tpu_ext.hub.preflight import endpoint, preflight, resolve_token
from hf_tpu_ext.hub.push_policy import (DEFAULT_HUB_STRATEGY, DEFAULT_SAVE_STRATEGY, OWN_COMMIT,  # noqa: F401
                                        SAVE_STRATEGIES, WITH_MODEL, PushConfig, PushPlan, plan_save, strategy_rule)
from hf_tpu_ext.hub.push_queue import PushQueue, PushReport, note_step
from hf_tpu_ext.hub.pusher import (LAST_CHECKPOINT_DELETE_PATTERNS, MODEL_IGNORE_PATTERNS, install_hooks,
                                   log_push_report, remove_hooks)

logger = logging.getLogger("hf_tpu_ext.hub")

#: a checkpoint as a push takes it: a folder (copied when queued), or a backend's ``checkpoint_files`` (linked)
Checkpoint = Union[str, Mapping[str, Union[str, bytes]]]


class PushSession:
    """One run's pushes to one Hub repo (see the module doc).

    Args:
        config: the :class:`PushConfig`.
        api: the :class:`huggingface_hub.HfApi` for the uploads (tests; default: one on ``HF_ENDPOINT``).
        is_chief: whether this process talks to the Hub (default: :func:`hf_tpu_ext.distributed.is_main_process`).
            Other processes get a session that pushes nothing (its methods return at once).
        paced: a run's session: the commit budget paces its saves and :meth:`preflight` has the Hub validate the
            card fields; ``False``: a script's (:meth:`for_script`: no budget, the script checks its own card).

    Attributes:
        repo_id: the full ``"namespace/name"`` after :meth:`preflight`.
        pushed_steps: the steps of the saves queued, in order (the final push included; the last 100).
        coalesced_steps: saves the budget folded into a later commit (not written, not uploaded).
        card_problems: after :meth:`finish`, when the final push carried a README.md: what the Hub does not show of
            its metadata (``[]``: all of it; ``None``: not checked).
    """

    def __init__(self, config: PushConfig, *, api=None, is_chief: Optional[bool] = None, paced: bool = True):
        self.config = config
        self.is_chief = is_main_process() if is_chief is None else bool(is_chief)
        self.repo_id: Optional[str] = None
        self.pushed_steps: List[int] = []
        self.coalesced_steps: List[int] = []
        self.card_problems: Optional[list] = None
        self.budget: Optional[CommitBudget] = None
        self._api, self._paced, self._token = api, paced, config.hub_token
        self._queue: Optional[PushQueue] = None
        self._coalesced_total = self._signal_saves = 0
        self._closed = self._preflighted = False
        self._final_report: Optional[PushReport] = None
        self._last_report: Optional[PushReport] = None
        self._final_step: Optional[int] = None
        self._final_card: Optional[dict] = None
        self._signal_handle = None

    @classmethod
    def for_script(cls, repo_id: Optional[str], *, token: Optional[str] = None,
                   hub_strategy: str = DEFAULT_HUB_STRATEGY, private: Optional[bool] = None,
                   revision: Optional[str] = None, output_dir: Optional[str] = None, api=None, max_retries: int = 5,
                   backoff_seconds: float = 1.0, push_timeout: Optional[float] = None) -> "PushSession":
        """A script's session (``hf-tpu push``, :func:`push_save`): this process pushes, no commit budget.

        Args:
            repo_id: ``"namespace/name"`` or ``"name"``; ``None``: the name of ``output_dir``.
            push_timeout: seconds :meth:`finish` (and the context manager) wait by default (``None``: no limit).
            others: see :class:`PushConfig` (``hub_token``, ``hub_private_repo``, ``hub_revision``, ...).

        Raises:
            ArgumentError: an unknown ``hub_strategy``, a malformed ``repo_id``, neither ``repo_id`` nor ``output_dir``.
        """
        if repo_id is None and output_dir is None:
            raise ArgumentError("A push needs a repo_id (or an output_dir whose name becomes the repo name).")
        if repo_id is not None:
            check_repo_id(repo_id, "repo_id")  # a malformed id fails here, named as the caller named it
        config = PushConfig(output_dir, repo_id, token, hub_strategy, private, revision, save_strategy="no",
                            push_timeout=push_timeout, max_retries=max_retries, backoff_seconds=backoff_seconds)
        return cls(config, api=api, is_chief=True, paced=False)

    def __repr__(self):  # the token stays out of logs and tracebacks
        c = self.config
        return (f"PushSession(repo_id={self.repo_id or c.hub_model_id!r}, hub_strategy={c.hub_strategy!r}, "
                f"save_strategy={c.save_strategy!r})")

    # ---- Hub access --------------------------------------------------------------------------
    @property
    def token(self) -> Optional[str]:
        """The resolved token (after :meth:`preflight`), for other Hub calls of the same run."""
        return self._token

    @property
    def push_timeout(self) -> Optional[float]:
        return self.config.push_timeout

    @property
    def active(self) -> bool:
        """This process pushes (the chief) and the session is open."""
        return self.is_chief and not self._closed

    @property
    def staging_root(self) -> Optional[str]:
        """The ``hf-tpu-push-*`` temp folder of the snapshots (``None`` before :meth:`preflight`, after close)."""
        return self._queue.staging_root if self._queue is not None else None

    def preflight(self) -> Optional[str]:
        """Token present and valid, repo created or found, WRITE access proven, card fields valid; idempotent.

        Write access is proven from the token itself (whoami: a read-only token, a fine-grained token without
        ``repo.write`` on the repo or its namespace are refused), so an existing repo does not let a read-only token
        through. Then the commit budget (seeded with the commits of the window already on the Hub) and the upload
        queue start. Chief only.

        Returns:
            The full repo id (``None`` on other processes).

        Raises:
            HubAuthError: no token, an invalid or read-only token, or no write access to the repo/namespace.
            HubRepoError: a malformed repo id, or the branch cannot be made.
            HubError: the Hub could not be reached, or the session is closed.
            ModelCardError: the card fields (license, language, dataset) do not validate.
        """
        if not self.is_chief:
            return None
        if self._preflighted:
            return self.repo_id
        if self._closed:
            raise HubError("This push session is closed; open a new one to push again.")
        c = self.config
        self._token = resolve_token(self._token)
        default_name = os.path.basename(os.path.abspath(c.output_dir)) if c.output_dir else None
        self.repo_id = preflight(c.hub_model_id, self._token, private=c.hub_private_repo, revision=c.hub_revision,
                                 default_name=default_name)
        if self._paced:
            card = render_model_card(c.output_dir or ".", repo_id=self.repo_id, summary={"mask_token": "<mask>"},
                                     **c.card_fields)
            validate_model_card(card, token=self._token)
        self._keep_card_out_of_lfs()
        if self._paced and self.budget is None:  # a resume within the window counts what the earlier process committed
            self.budget = budget_for(self.repo_id, c.hub_commit_budget, c.budget_period)
            seed_from_hub(self.budget, self._hf_api(), self.repo_id, revision=c.hub_revision, token=self._token)
        self._queue = PushQueue(self.repo_id, self._token, revision=c.hub_revision, max_retries=c.max_retries,
                                backoff_seconds=c.backoff_seconds, api=self._api,
                                on_rate_limited=self.budget.note_rate_limited if self.budget is not None else None)
        self._signal_handle = install_hooks(self)
        self._preflighted = True
        return self.repo_id

    # ---- the plan ----------------------------------------------------------------------------
    def wants_checkpoint(self, final: bool = False) -> bool:
        """Whether a save's commit carries a resumable checkpoint (the strategy's rule), for an adapter whose
        checkpoint write is collective (every process writes it before the chief's :meth:`admit`). ``final`` is
        accepted for symmetry with :meth:`admit`."""
        return strategy_rule(self.config.hub_strategy).checkpoint is not None

    def admit(self, step: int, final: bool = False, max_steps: Optional[int] = None) -> Optional[PushPlan]:
        """The :class:`~hf_tpu_ext.hub.push_policy.PushPlan` of the save at ``step`` when it is pushed now (the
        caller writes the folders and hands them with this plan to :meth:`save`), else ``None``.

        The one decision per save (:func:`~hf_tpu_ext.hub.push_policy.plan_save`). A save the commit budget has no
        room for is *coalesced*: recorded (``coalesced_steps``), not written, and its state reaches the Hub with the
        next save that fits, or the final push. A save at the run's last step (``step == max_steps``) coalesces
        into the final push. The final push is always admitted, and so is a save after a SIGINT/SIGTERM (what a
        resume starts from, pushed within the grace budget). Non-chief processes and a closed session: ``None``.
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
             checkpoint_files: Optional[Mapping[str, Union[str, bytes]]] = None, replaced: Sequence[str] = ()) -> None:
        """Carry out ``plan`` (:meth:`admit`'s): snapshot the save and queue its commits (returns at once; the
        upload runs in the background).

        Args:
            plan: the save's plan (``None``: nothing to do).
            model_folder: the model folder (weights, config, tokenizer, card, run files; optimizer state and local
                checkpoints left out, :data:`~hf_tpu_ext.hub.pusher.MODEL_IGNORE_PATTERNS`), copied into the
                snapshot; ``None``: none.
            checkpoint_folder: a resumable checkpoint of the step (with its ``trainer_state.json``), copied into the
                snapshot (a callback's folder, rewritten by its next save).
            checkpoint_files: instead, a backend's checkpoint (the files its save handed to ``on_save``, or
                ``Backend.checkpoint_files`` of one on disk), hard-linked into the snapshot: pushed as written, even
                if its folder is rotated away before the upload.
            Either is used only where the plan puts a checkpoint (``hub_strategy`` checkpoint, all_checkpoints).
            replaced: patterns of model-folder files their writer replaces, never rewrites in place (a backend's
                ``export_replaces``): hard-linked into the snapshot instead of copied.

        Raises:
            HubAuthError, HubRepoError, HubError: from :meth:`preflight` (idempotent) when it has not run yet.
            FileNotFoundError: a folder or file does not exist.
        """
        if plan is None or not self.active:
            return
        self.preflight()
        if self.budget is not None:
            self.budget.note_commit(final=plan.final)
        checkpoint = checkpoint_files if checkpoint_files is not None else checkpoint_folder
        self._submit(plan, model_folder, checkpoint if plan.checkpoint is not None else None, tuple(replaced))

    def _submit(self, plan: PushPlan, model_folder: Optional[str], checkpoint: Optional[Checkpoint],
                replaced: Sequence[str] = ()) -> None:
        """Queue ``plan``'s commits: the model folder, the checkpoint where ``plan.checkpoint`` puts it."""
        step, final = plan.step, plan.final
        if final and model_folder is not None:  # what the read-back in finish() expects the Hub to show
            self._final_card = card_expectations(model_folder)

        def carrying(prefix: str) -> dict:  # a folder is copied, a backend's files are linked
            if checkpoint is None:
                return {}
            return {"also": [(checkpoint, prefix)]} if isinstance(checkpoint, (str, os.PathLike)) else {
                "linked": [(checkpoint, prefix)]}

        with_model = carrying(plan.checkpoint_path) if plan.checkpoint == WITH_MODEL else {}
        if model_folder is not None or with_model:
            self._queue.submit(model_folder, commit_message=plan.commit_message,
                               ignore_patterns=list(MODEL_IGNORE_PATTERNS), key="model",
                               delete_patterns=list(LAST_CHECKPOINT_DELETE_PATTERNS) if with_model else None,
                               before_upload=functools.partial(validate_card_file, token=self._token), step=step,
                               final=final, inherit=plan.inherit, link_patterns=list(replaced) or None, **with_model)
        if checkpoint is not None and plan.checkpoint == OWN_COMMIT:
            self._queue.submit(None, path_in_repo=plan.checkpoint_path, commit_message=plan.checkpoint_message,
                               key=plan.checkpoint_path, step=step, **carrying(""))
        note_step(self.pushed_steps, step)
        if final:
            self._final_step = step

    # ---- the end -----------------------------------------------------------------------------
    def report(self) -> PushReport:
        """What landed, failed, is pending or was superseded so far (after :meth:`finish`: the final report)."""
        if self._final_report is not None:
            return self._final_report
        if self._queue is not None:
            return self._queue.report
        return self._last_report or PushReport(repo_id=self.repo_id, revision=self.config.hub_revision)

    def find_push(self, push_id: str) -> Optional[str]:
        """The commit id of an earlier push (``push_id`` from a report's ``unfinished``, maybe of an earlier process)
        among the branch's newest commits, else ``None``; ``None`` on non-chief processes."""
        if not self.active:
            return None
        self.preflight()
        return self._queue.find_push(push_id) if self._queue is not None else None

    def finish(self, timeout: Optional[float] = None) -> Optional[PushReport]:
        """Wait for the uploads (``timeout`` seconds; default ``push_timeout``, ``None`` there: no limit), log the
        report, read the card back from the Hub (not after a signal: no room in the grace budget), close.

        Ctrl-C while waiting stops the wait: the pending pushes are reported as not landed and the KeyboardInterrupt
        raised on.

        Returns:
            The final :class:`~hf_tpu_ext.hub.push_queue.PushReport` (``timed_out`` when uploads were still running
            at the deadline; they are dropped); ``None`` on non-chief processes.
        """
        if not self.is_chief:
            return None
        if self._final_report is not None:
            return self._final_report
        if self._queue is None:
            self.close()
            return self.report()
        try:
            report = self._queue.wait(self.config.push_timeout if timeout is None else timeout)
        except KeyboardInterrupt:
            self.abandon("Interrupted again")
            raise
        self._close_queue(timed_out=report.timed_out)
        log_push_report(self._last_report, self.repo_id, self.config.output_dir, self._final_step)
        if interrupts.received() is None:
            self._check_card(self._last_report)
        self._final_report = self._last_report
        return self._final_report

    def close(self) -> None:
        """Stop without waiting: pending uploads are dropped (and reported), staging removed; idempotent."""
        self._close_queue(timed_out=False)
        if self._final_report is None and self._last_report is not None:
            self._final_report = self._last_report

    def abandon(self, why: str) -> None:
        """Report what is pending (``why``: the reason) and close without waiting."""
        if self._closed:
            return
        try:
            self.log_pending(why)
        finally:
            self.close()

    def log_pending(self, why: str) -> None:
        """Log the pushes not finished yet and how to push them later (``why``: what stopped the run)."""
        pending = self._queue.report.pending if self._queue is not None else []
        if pending:
            logger.warning("%s: %d push(es) to %s not finished (%s); push them and the newest checkpoint (what "
                           "resumes) later with `%s`.", why, len(pending), self.repo_id, "; ".join(pending),
                           push_later_command(self.config.output_dir, self.repo_id, self.config.hub_revision))

    def _close_queue(self, timed_out: bool) -> None:
        self._closed = True
        queue, self._queue = self._queue, None
        if queue is not None:
            report = queue.close(timeout=0)
            report.timed_out = report.timed_out or timed_out
            self._last_report = report
        remove_hooks(self, self._signal_handle)
        self._signal_handle = None

    def on_signal(self, signum: int) -> None:
        """The first SIGINT/SIGTERM (called inside the signal handler: log only, never wait): what is pending. What
        then happens to it is the caller's (a run waits within its grace budget; at exit it is reported)."""
        pending = self._queue.report.pending if self._queue is not None else []
        if pending:
            logger.warning("%s received: %d push(es) to %s pending (%s).", signal.Signals(signum).name, len(pending),
                           self.repo_id, "; ".join(pending))

    def report_dict(self) -> dict:
        """``training_summary.json``'s ``hub_pushes``: :meth:`PushReport.to_dict` plus ``coalesced_saves`` /
        ``skipped_saves`` (steps whose state a later commit carried / that no commit carried), their totals, and
        ``commit_budget``."""
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

    # ---- the card on the Hub (hub.card_guard, hub.card_check): never an LFS pointer, read back after the final push
    def _hf_api(self):
        if self._api is not None:
            return self._api
        from huggingface_hub import HfApi

        return HfApi(endpoint=endpoint(), token=self._token)

    def _keep_card_out_of_lfs(self) -> None:
        """At preflight: a repo whose .gitattributes routes README.md through LFS gets it back as a regular file."""
        try:
            card_guard.keep_card_out_of_lfs(self._hf_api(), self.repo_id, self.config.hub_revision)
        except Exception as err:  # the pushes must not depend on it; the read-back will say if the card is lost
            logger.warning("Could not check %s's .gitattributes for README.md (%s).", self.repo_id, type(err).__name__)

    def _check_card(self, report: PushReport) -> None:
        """After the final push landed with a README.md: the metadata the Hub parsed must be the card's
        (:func:`hf_tpu_ext.hub.card_check.check_card_on_hub`); problems go to :attr:`card_problems` and the log."""
        landed = [o for o in report.outcomes if o.status == "pushed" and o.final and o.commit_oid]
        if self._final_card is None or not landed:
            return
        try:
            self.card_problems = check_card_on_hub(self._hf_api(), self.repo_id, landed[-1].commit_oid,
                                                   **self._final_card)
        except Exception as err:  # the Hub could not be asked: not a card problem
            logger.warning("Could not read back the model card of %s (%s).", self.repo_id, type(err).__name__)
            return
        if self.card_problems:
            logger.error("The Hub does not show the model card pushed to %s: %s.", self.repo_id,
                         "; ".join(self.card_problems))

    def __enter__(self) -> "PushSession":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish()
        else:
            what = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else f"stopped by {exc_type.__name__}"
            self.abandon(f"Training {what}")
        return False

    def __del__(self):  # a session dropped without close(): never leave a staging folder behind
        try:
            if self._queue is not None:
                self._queue.close(timeout=0)
        except Exception:
            pass


def push_save(session: PushSession, model_folder: Optional[str], *, step: int, checkpoint_folder: Optional[str] = None,
              final: bool = False, commit_message: Optional[str] = None) -> None:
    """A script's save: plan it (:func:`~hf_tpu_ext.hub.push_policy.plan_save`, no budget) and queue what
    ``hub_strategy`` pushes for it through ``session``; returns without waiting.

    Args:
        session: the session (e.g. :meth:`PushSession.for_script`).
        model_folder: the model folder (``None``: checkpoint only).
        step: the global optimizer step of the save.
        checkpoint_folder: a resumable checkpoint of this step (its ``trainer_state.json`` written by the caller),
            to ``last-checkpoint/`` (``"checkpoint"``; also with ``final=True``) or ``checkpoint-<step>/``
            (``"all_checkpoints"``); ignored by the other strategies.
        final: the final state: pushed whatever the strategy (``report().final_pushed`` says whether it landed).
        commit_message: the commit summary (default: :func:`hf_tpu_ext.hub.push_policy.commit_title`).

    Raises:
        RuntimeError: the session is closed. FileNotFoundError: a folder does not exist.
        HubAuthError, HubRepoError, HubError: from :meth:`PushSession.preflight` when it has not run yet.
    """
    if not session.active:
        raise RuntimeError("This push session is closed; open a new one to push again.")
    plan = plan_save(session.config.hub_strategy, step, final=final, commit_message=commit_message)
    if plan.push:  # else a strategy that pushes the final state only
        session.save(plan, model_folder, checkpoint_folder=checkpoint_folder)
