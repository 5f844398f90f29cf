"""The framework-free Hub pusher: the uploads of a push session and of ``hf-tpu push``.

:class:`HubPusher` turns one save into commits: the preflight (token, repo, write access, card fields), the
``hub_strategy`` mapping of a save's folders to commits, the background queue with retries
(:class:`~hf_tpu_ext.hub.push_queue.PushQueue`), the card check in the push job, the end-of-run report and
the cleanup of its staging folders. What a save's commits carry and their titles are
:func:`hf_tpu_ext.hub.push_policy.plan_save`'s plan, which :meth:`HubPusher.push_plan` carries out (a backend's
checkpoint export written into :meth:`HubPusher.staging_folder` is moved into the commit's snapshot, not copied); when
to save, the plan and the budget are the push session's (:mod:`hf_tpu_ext.hub.push_session`), which the training run
and the push callbacks use; ``hf-tpu push`` and scripts call :meth:`HubPusher.push_save` (plan and push in one). The pusher owns the hub layer's one
``atexit`` hook: every live pusher (a session's too) reports what is pending and cleans up at interpreter exit.

It imports only the standard library, ``huggingface_hub`` and ``hf_tpu_ext.hub``/ground modules: never
TensorFlow, torch or Keras.

``hub_strategy``: see :mod:`hf_tpu_ext.hub.push_policy` (:data:`~hf_tpu_ext.hub.push_policy.STRATEGY_TABLE`). With
``"checkpoint"`` a resumable checkpoint lands with every upload that lands, however often saves outpace uploads
(a newer save replaces a pending one; the in-flight upload always finishes).

Example:
    >>> with HubPusher("alice/tiny-mlm", hub_strategy="checkpoint", output_dir="out") as pusher:
    ...     pusher.preflight()                      # before the first step
    ...     pusher.push_save("out", step=100, checkpoint_folder="out/checkpoint-100")
    ...     pusher.push_save("out", step=200, final=True)
    >>> pusher.report().final_pushed
    True
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import weakref
from typing import Callable, Optional

from hf_tpu_ext import interrupts
from hf_tpu_ext.args import HUB_STRATEGIES, check_repo_id  # the flag's choices: defined once, with the argument
from hf_tpu_ext.errors import ArgumentError, HubError
from hf_tpu_ext.hub import card_guard  # its guard called through the module (tests stand in for it)
from hf_tpu_ext.hub.card_check import card_expectations, check_card_on_hub, validate_card_file, validate_model_card
from hf_tpu_ext.hub.card_render import render_model_card
from hf_tpu_ext.hub.checkpoint_layouts import push_later_command
from hf_tpu_ext.hub.preflight import endpoint, preflight, resolve_token
from hf_tpu_ext.hub.push_policy import (CHECKPOINT_PREFIX, DEFAULT_HUB_STRATEGY, OWN_COMMIT, WITH_MODEL,  # noqa: F401
                                        PushPlan, check_hub_strategy, checkpoint_folder_name, plan_save)
from hf_tpu_ext.hub.push_queue import REPORT_LIMIT, STAGING_PREFIX, PushQueue, PushReport, note_step
from hf_tpu_ext.hub.resume import LAST_CHECKPOINT

logger = logging.getLogger("hf_tpu_ext.hub")

__all__ = ["HUB_STRATEGIES", "MODEL_IGNORE_PATTERNS", "LAST_CHECKPOINT", "LAST_CHECKPOINT_DELETE_PATTERNS",
           "CHECKPOINT_PREFIX", "STAGING_PREFIX", "HubPusher", "PushReport", "checkpoint_folder_name",
           "log_push_report", "note_step"]

# What of an output folder never goes into a model push: optimizer state (TensorFlow checkpoint shards,
# the Trainer's checkpoint folders), local checkpoint folders, temp and hidden files, pickled arguments.
MODEL_IGNORE_PATTERNS = ("checkpoints/*", f"{LAST_CHECKPOINT}/*", "checkpoint-*", f"hub-{LAST_CHECKPOINT}/*",
                         "*.index", "*.data-*", "*.tmp", ".*", "training_args.bin", "run_state.json")
# files under last-checkpoint/ on the Hub that a new checkpoint does not re-upload are deleted in its commit
# (older ckpt-N shards, rng states of other ranks): what lands there is exactly one checkpoint
LAST_CHECKPOINT_DELETE_PATTERNS = (f"{LAST_CHECKPOINT}/*",)
DEFAULT_PUSH_TIMEOUT = 600.0


def log_push_report(report: PushReport, repo_id: str, output_dir: Optional[str], final_step: Optional[int]) -> None:
    """Log what the run left on the Hub, and how to push what did not land.

    Args:
        report: the pusher's report.
        repo_id: the target repo (for the messages).
        output_dir: the local folder that holds everything (``None``: not said).
        final_step: the last global step (``None``: not said).
    """
    for message, oid in report.pushed[-5:]:
        logger.info("On the Hub: %r (commit %s).", message, oid[:8] if oid else "?")
    missing = [m for m, _ in report.failed] + list(report.pending)
    if missing:
        logger.error(
            "Not pushed to %s: %s. The local folder %s has everything; push it and its newest checkpoint (what "
            "resumes) later with `%s`.", repo_id, "; ".join(missing), output_dir or "the output folder",
            push_later_command(output_dir, repo_id, report.revision))
    else:
        logger.info("All %d pushes to %s landed%s.", report.counts.get("pushed", 0), repo_id,
                    f" (final step {final_step})" if final_step is not None else "")


# ---- process exit: every live pusher cleans up at interpreter exit; signals are interrupts.py's -----
_LIVE: "weakref.WeakSet[HubPusher]" = weakref.WeakSet()
_HOOKS = threading.Lock()
_atexit_done = False


def _close_all_at_exit() -> None:
    for pusher in list(_LIVE):
        pusher._abandon("The process is exiting")


def _install_hooks(pusher: "HubPusher") -> None:
    """atexit cleanup, and a callback at the first SIGINT/SIGTERM (:func:`hf_tpu_ext.interrupts.on_signal`, which
    outside a training run makes SIGTERM unwind so ``finally``/atexit clean up) that says what is pending."""
    global _atexit_done

    with _HOOKS:
        _LIVE.add(pusher)
        if not _atexit_done:
            atexit.register(_close_all_at_exit)
            _atexit_done = True
    pusher._signal_handle = interrupts.on_signal(pusher._on_signal)


def _remove_hooks(pusher: "HubPusher") -> None:
    with _HOOKS:
        _LIVE.discard(pusher)
    handle, pusher._signal_handle = getattr(pusher, "_signal_handle", None), None
    if handle is not None:
        handle.remove()


class HubPusher:
    """Push a run's model folder and checkpoints to one Hub repo in the background, by ``hub_strategy``.

    Args:
        repo_id: ``"namespace/name"`` or ``"name"`` (the token's user is the namespace); ``None`` uses the
            name of ``output_dir``.
        token: the Hub token (default: ``HF_TOKEN``, else the cached login). Kept in memory only; never
            logged, written or put in a report or exception.
        hub_strategy: one of :data:`HUB_STRATEGIES` (see the module doc).
        private: create the repo private (an existing repo is left as it is).
        revision: the branch to push to (created from ``main`` when missing; ``None``: main).
        output_dir: the run's local folder (named in the messages about what did not land).
        api: the :class:`huggingface_hub.HfApi` for the uploads (default: one on ``HF_ENDPOINT``).
        max_retries: retries per push after its first attempt (connection errors, timeouts, 5xx, 429).
        backoff_seconds: the first retry's wait (doubles per retry, at most 60 s); a ``Retry-After`` from the
            Hub (seconds or HTTP date, at most 300 s) replaces it.
        push_timeout: seconds the context manager's normal exit waits in :meth:`finish` (``None``: no limit).
        card_fields: when given, :meth:`preflight` renders a card with them (``license``, ``language``,
            ``dataset_name``, ...) and has the Hub validate it, so a bad license fails before training.

    Attributes:
        repo_id: the full ``"namespace/name"`` after :meth:`preflight`.
        pushed_steps: the steps of the saves that were queued, in order (the final push included; the last
            ``REPORT_LIMIT``).
        card_problems: after :meth:`finish`, when the final push carried a README.md: what the Hub does not show
            of its metadata (``[]``: all of it; ``None``: not checked), see
            :func:`hf_tpu_ext.hub.card_check.check_card_on_hub`. Before the first push :meth:`preflight` keeps
            README.md out of Git LFS (:func:`hf_tpu_ext.hub.card_guard.keep_card_out_of_lfs`).

    Raises:
        ArgumentError: an unknown ``hub_strategy``.
    """

    def __init__(self, repo_id: Optional[str], *, token: Optional[str] = None, hub_strategy: str = DEFAULT_HUB_STRATEGY,
                 private: Optional[bool] = None, revision: Optional[str] = None, output_dir: Optional[str] = None,
                 api=None, max_retries: int = 5, backoff_seconds: float = 1.0,
                 push_timeout: Optional[float] = DEFAULT_PUSH_TIMEOUT, card_fields: Optional[dict] = None):
        check_hub_strategy(hub_strategy)
        if repo_id is None and output_dir is None:
            raise ArgumentError("HubPusher needs a repo_id (or an output_dir whose name becomes the repo name).")
        if repo_id is not None:
            check_repo_id(repo_id, "repo_id")  # a malformed id fails here, not at the first push
        self.repo_id = repo_id
        self.hub_strategy, self.private, self.revision = hub_strategy, private, revision
        self.output_dir = os.fspath(output_dir) if output_dir is not None else None
        self.max_retries, self.backoff_seconds = int(max_retries), float(backoff_seconds)
        self.push_timeout = push_timeout
        self.card_fields = card_fields
        self.pushed_steps = []
        self._token = token
        self._api = api
        self._queue: Optional[PushQueue] = None
        self._preflight_done = False
        self._closed = False
        self._final_step: Optional[int] = None
        self._last_report: Optional[PushReport] = None
        self._signal_handle = None
        self._final_card: Optional[dict] = None
        self.card_problems: Optional[list] = None  # after finish(): the card read-back's problems ([]: none)
        self._on_rate_limited: Optional[Callable[[Optional[float]], None]] = None

    def __repr__(self):  # the token stays out of logs and tracebacks
        return (f"HubPusher(repo_id={self.repo_id!r}, hub_strategy={self.hub_strategy!r}, "
                f"revision={self.revision!r})")

    @property
    def token(self) -> Optional[str]:
        """The resolved token (for other Hub calls of the same run, e.g. a Space deploy)."""
        return self._token

    @property
    def staging_root(self) -> Optional[str]:
        """The ``hf-tpu-push-*`` temp folder of the snapshots (``None`` before :meth:`preflight`)."""
        return self._queue.staging_root if self._queue is not None else None

    # ---- preflight -------------------------------------------------------------------------------
    def preflight(self) -> str:
        """Before training: token present and valid, repo created or found, WRITE access proven; idempotent.

        Write access is proven from the token itself (whoami: a read-only token, a fine-grained token without
        ``repo.write`` on the repo or its namespace, or a namespace the user cannot write to are refused), so
        an existing repo does not let a read-only token through. With ``card_fields`` the Hub also validates
        the card metadata. Then the background queue starts.

        Returns:
            The full repo id.

        Raises:
            HubAuthError: no token, an invalid or read-only token, or no write access to the repo/namespace.
            HubRepoError: a malformed repo id, or the branch cannot be made.
            HubError: the Hub could not be reached.
            ModelCardError: ``card_fields`` do not validate.
        """
        if self._preflight_done:
            return self.repo_id
        if self._closed:
            raise HubError("This HubPusher is closed; create a new one to push again.")

        self._token = resolve_token(self._token)
        default_name = os.path.basename(os.path.abspath(self.output_dir)) if self.output_dir else None
        self.repo_id = preflight(self.repo_id, self._token, private=self.private, revision=self.revision,
                                 default_name=default_name)
        if self.card_fields is not None:

            card = render_model_card(self.output_dir or ".", repo_id=self.repo_id,
                                     summary={"mask_token": "<mask>"}, **self.card_fields)
            validate_model_card(card, token=self._token)
        self._keep_card_out_of_lfs()
        self._queue = PushQueue(self.repo_id, self._token, revision=self.revision, max_retries=self.max_retries,
                                backoff_seconds=self.backoff_seconds, api=self._api,
                                on_rate_limited=self._on_rate_limited)
        _install_hooks(self)
        self._preflight_done = True
        return self.repo_id

    def set_rate_limit_listener(self, listener: Optional[Callable[[Optional[float]], None]]) -> None:
        """Call ``listener(retry_after_seconds_or_None)`` at each 429 answer (the push session's commit budget)."""
        self._on_rate_limited = listener
        if self._queue is not None:
            self._queue.on_rate_limited = listener

    # ---- pushes ----------------------------------------------------------------------------------
    def push_save(self, model_folder: Optional[str], *, step: int, checkpoint_folder: Optional[str] = None,
                  final: bool = False, commit_message: Optional[str] = None) -> None:
        """Queue what ``hub_strategy`` pushes for the save at global ``step``; returns without waiting.

        Only a snapshot copy of the files is made here (a later save cannot tear the upload); the upload,
        its retries and the Hub's card check (a card the Hub rejects is left out, the weights still go)
        run in the background.

        Args:
            model_folder: the model folder (weights, config, tokenizer, card, logs); files matching
                :data:`MODEL_IGNORE_PATTERNS` are left out. ``None``: no model files (checkpoint only).
            step: the global optimizer step of the save.
            checkpoint_folder: a resumable checkpoint of this step (its ``trainer_state.json`` written by the
                caller with the true ``epoch`` and ``max_steps``). Pushed to ``last-checkpoint/`` with the
                model (``"checkpoint"``; also with ``final=True``) or to ``checkpoint-<step>/``
                (``"all_checkpoints"``); ignored by the other strategies.
            final: the final state: pushed whatever the strategy; ``report().final_pushed`` says whether
                it landed.
            commit_message: the commit summary (default:
                :func:`hf_tpu_ext.hub.push_policy.commit_title`).

        Raises:
            RuntimeError: the pusher is closed.
            FileNotFoundError: a folder does not exist.
            HubAuthError, HubRepoError, HubError: from :meth:`preflight` when it has not run yet.
        """
        if self._closed:
            raise RuntimeError("This HubPusher is closed; create a new one to push again.")
        plan = plan_save(self.hub_strategy, step, final=final, commit_message=commit_message)
        if plan.push:  # else a strategy that pushes the final state only
            self.preflight()
            self.push_plan(plan, model_folder, checkpoint_folder)

    def staging_folder(self) -> str:
        """An empty folder in this pusher's staging area for a save's checkpoint (a backend's export writes into
        it; :meth:`push_plan` with ``staged=True`` then moves it into the commit's snapshot: one copy on disk).
        Needs :meth:`preflight`; the folder is removed with the staging area if it is never pushed."""
        if self._queue is None:
            raise RuntimeError("HubPusher.staging_folder needs preflight() first.")
        return self._queue.new_staging()

    def push_plan(self, plan: PushPlan, model_folder: Optional[str], checkpoint_folder: Optional[str] = None, *,
                  staged: bool = False) -> None:
        """Carry out ``plan`` (:func:`~hf_tpu_ext.hub.push_policy.plan_save`'s, ``plan.push`` true): queue its
        commits (the model folder, the checkpoint where ``plan.checkpoint`` puts it) and return without waiting.

        Args:
            plan: the save's :class:`~hf_tpu_ext.hub.push_policy.PushPlan`.
            model_folder, checkpoint_folder: as in :meth:`push_save` (``checkpoint_folder`` ignored when the plan
                puts no checkpoint anywhere).
            staged: ``checkpoint_folder`` is a :meth:`staging_folder`: moved into the snapshot, not copied.

        Raises:
            RuntimeError: the pusher is closed, or :meth:`preflight` has not run.
            FileNotFoundError: a folder does not exist.
        """
        if self._closed or self._queue is None:
            raise RuntimeError("This HubPusher is closed or not preflighted; push_plan needs preflight() first.")
        step, final = plan.step, plan.final
        if final and model_folder is not None:  # what the read-back in finish() expects the Hub to show
            self._final_card = card_expectations(model_folder)
        check_card = functools.partial(validate_card_file, token=self._token)
        ckpt = checkpoint_folder if plan.checkpoint is not None else None
        with_model = [(ckpt, plan.checkpoint_path)] if ckpt is not None and plan.checkpoint == WITH_MODEL else []
        if model_folder is not None or with_model:
            delete = list(LAST_CHECKPOINT_DELETE_PATTERNS) if with_model else None
            self._queue.submit(model_folder, commit_message=plan.commit_message,
                               ignore_patterns=list(MODEL_IGNORE_PATTERNS), delete_patterns=delete, key="model",
                               before_upload=check_card, step=step, final=final, inherit=plan.inherit,
                               **{"moved" if staged else "also": with_model})
        if ckpt is not None and plan.checkpoint == OWN_COMMIT:
            self._queue.submit(None if staged else ckpt, moved=[(ckpt, "")] if staged else (),
                               path_in_repo=plan.checkpoint_path, commit_message=plan.checkpoint_message,
                               key=plan.checkpoint_path, step=step)
        note_step(self.pushed_steps, step)
        if final:
            self._final_step = step

    # ---- end of the run --------------------------------------------------------------------------
    def report(self) -> PushReport:
        """A snapshot of what landed, failed, is pending or was superseded (see :class:`PushReport`)."""
        if self._queue is not None:
            return self._queue.report
        return self._last_report or PushReport(repo_id=self.repo_id, revision=self.revision)

    def finish(self, timeout: Optional[float] = None) -> PushReport:
        """Wait for the pending uploads (``timeout`` seconds; ``None``: no limit), log the report, close.

        Ctrl-C while waiting stops the wait: the pushes still pending are reported as not landed, the
        staging folders removed, and the KeyboardInterrupt raised on. After a SIGINT/SIGTERM the card
        read-back is skipped (its requests would not fit the grace budget).

        Returns:
            The final :class:`PushReport` (``timed_out`` when uploads were still running at the deadline;
            they are dropped).
        """
        if self._queue is None:
            self.close()
            return self.report()
        try:
            report = self._queue.wait(timeout)
        except KeyboardInterrupt:
            self.log_pending("Interrupted again")
            self.close()
            raise
        self._close_queue(timed_out=report.timed_out)
        log_push_report(self._last_report, self.repo_id, self.output_dir, self._final_step)

        if interrupts.received() is None:  # after a signal the grace budget has no room for the read-back's requests
            self._check_card(self._last_report)
        return self._last_report

    def find_push(self, push_id: str) -> Optional[str]:
        """The commit id of the push ``push_id`` (from a report's ``unfinished``, maybe of an earlier process) on
        the branch, ``None`` when it is not among the newest commits (or the Hub cannot be asked). Needs
        :meth:`preflight`."""
        self.preflight()
        return self._queue.find_push(push_id) if self._queue is not None else None

    # ---- the card on the Hub (hub.card_guard, hub.card_check): never an LFS pointer, read back after the final push -------
    def _hf_api(self):
        if self._api is not None:
            return self._api
        from huggingface_hub import HfApi

        return HfApi(endpoint=endpoint(), token=self._token)

    def _keep_card_out_of_lfs(self) -> None:
        """At preflight: a repo whose .gitattributes routes README.md through LFS gets it back as a regular file."""
        try:
            card_guard.keep_card_out_of_lfs(self._hf_api(), self.repo_id, self.revision)
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

    def close(self) -> None:
        """Stop the worker (pending uploads are dropped) and remove the staging folders; idempotent."""
        self._close_queue(timed_out=False)

    def _close_queue(self, timed_out: bool) -> None:
        self._closed = True
        queue, self._queue = self._queue, None
        if queue is not None:
            report = queue.close(timeout=0)
            report.timed_out = report.timed_out or timed_out
            self._last_report = report
        _remove_hooks(self)

    def _on_signal(self, signum: int) -> None:
        """The first SIGINT/SIGTERM (called inside the signal handler: log only, never wait). What then happens to
        the pending pushes is the caller's (a training run waits within its grace budget; at exit they are
        reported with the command that pushes them later)."""
        import signal

        queue = self._queue
        pending = queue.report.pending if queue is not None else []
        if pending:
            logger.warning("%s received: %d push(es) to %s pending (%s).", signal.Signals(signum).name, len(pending),
                           self.repo_id, "; ".join(pending))

    def log_pending(self, why: str) -> None:
        """Log the pushes not finished yet and how to push them later (``why``: what stopped the run)."""
        queue = self._queue
        if queue is None:
            return
        pending = queue.report.pending
        if pending:
            logger.warning("%s: %d push(es) to %s not finished (%s); push them and the newest checkpoint (what "
                           "resumes) later with `%s`.", why, len(pending), self.repo_id, "; ".join(pending),
                           push_later_command(self.output_dir, self.repo_id, self.revision))

    def _abandon(self, why: str) -> None:
        """Report what is pending and clean up without waiting (exceptions, interrupts, interpreter exit)."""
        try:
            self.log_pending(why)
        finally:
            self.close()

    def __enter__(self) -> "HubPusher":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish(self.push_timeout)
        else:
            what = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else f"stopped by {exc_type.__name__}"
            self._abandon(f"Training {what}")
        return False

    def __del__(self):  # a pusher dropped without close(): never leave a staging folder behind
        try:
            if self._queue is not None:
                self._queue.close(timeout=0)
        except Exception:
            pass
