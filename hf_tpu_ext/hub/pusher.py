"""The framework-free Hub pusher: one push policy for every way hf-tpu-ext pushes a model.

:class:`HubPusher` owns the Hub side of a run: the preflight (token, repo, write access, card fields), the
``hub_strategy`` (what each save pushes), the background queue with retries
(:class:`~hf_tpu_ext.hub.push_queue.PushQueue`), the card check in the push job, the end-of-run report and
the cleanup of its staging folders. The tf_keras callback, the ``transformers.TrainerCallback``, the training
run and ``hf-tpu push`` are adapters: they write a folder and call :meth:`HubPusher.push_save`.

It imports only the standard library, ``huggingface_hub`` and ``hf_tpu_ext.hub``/ground modules: never
TensorFlow, torch or Keras.

``hub_strategy`` (the names and meaning of :class:`transformers.TrainingArguments`):

- ``"end"``: only the push with ``final=True`` (the model folder);
- ``"every_save"``: the model folder at every save;
- ``"checkpoint"``: the model folder and the newest checkpoint under ``last-checkpoint/`` *in one commit*,
  so a resumable checkpoint lands with every upload that lands, however often saves outpace uploads (a
  newer save replaces a pending one; the in-flight upload always finishes);
- ``"all_checkpoints"``: as ``"every_save"``, plus every checkpoint under ``checkpoint-<step>/`` (own commits,
  never replaced).

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
import signal
import threading
import weakref
from typing import Optional

from hf_tpu_ext.args import HUB_STRATEGIES, check_repo_id  # the flag's choices: defined once, with the argument
from hf_tpu_ext.errors import ArgumentError, HubError
from hf_tpu_ext.hub.push_queue import REPORT_LIMIT, STAGING_PREFIX, PushQueue, PushReport
from hf_tpu_ext.hub.resume import LAST_CHECKPOINT

logger = logging.getLogger("hf_tpu_ext.hub")

__all__ = ["HUB_STRATEGIES", "MODEL_IGNORE_PATTERNS", "LAST_CHECKPOINT", "LAST_CHECKPOINT_DELETE_PATTERNS",
           "CHECKPOINT_PREFIX", "STAGING_PREFIX", "HubPusher", "PushReport", "checkpoint_folder_name",
           "log_push_report", "note_step"]

# What of an output folder never goes into a model push: optimizer state (TensorFlow checkpoint shards,
# the Trainer's checkpoint folders), local checkpoint folders, temp and hidden files, pickled arguments.
MODEL_IGNORE_PATTERNS = ("checkpoints/*", f"{LAST_CHECKPOINT}/*", "checkpoint-*", f"hub-{LAST_CHECKPOINT}/*",
                         "*.index", "*.data-*", "*.tmp", ".*", "training_args.bin")
CHECKPOINT_PREFIX = "checkpoint-"
# files under last-checkpoint/ on the Hub that a new checkpoint does not re-upload are deleted in its commit
# (older ckpt-N shards, rng states of other ranks): what lands there is exactly one checkpoint
LAST_CHECKPOINT_DELETE_PATTERNS = (f"{LAST_CHECKPOINT}/*",)
DEFAULT_PUSH_TIMEOUT = 600.0


def note_step(steps: list, step: int, limit: int = REPORT_LIMIT) -> None:
    """Append ``step`` to a list of pushed steps, keeping the last ``limit`` (memory stays flat)."""
    steps.append(int(step))
    if len(steps) > limit:
        del steps[: len(steps) - limit]


def checkpoint_folder_name(step: int) -> str:
    """``checkpoint-<step>``: the Trainer's name for a checkpoint folder, also the Hub folder of ``all_checkpoints``."""
    return f"{CHECKPOINT_PREFIX}{int(step)}"


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
        where = output_dir or "the output folder"
        logger.error(
            "Not pushed to %s: %s. The local folder %s has everything; push it later with "
            "`hf-tpu push %s --hub_model_id %s`.", repo_id, "; ".join(missing), where, where, repo_id)
    else:
        logger.info("All %d pushes to %s landed%s.", report.counts.get("pushed", 0), repo_id,
                    f" (final step {final_step})" if final_step is not None else "")


# ---- process-wide hooks: atexit and SIGTERM, shared by every live pusher ---------------------------
_LIVE: "weakref.WeakSet[HubPusher]" = weakref.WeakSet()
_HOOKS = threading.Lock()
_atexit_done = False
_sigterm_previous = None  # the handler ours replaced (restored when the last pusher closes)
_sigterm_installed = False


def _close_all_at_exit() -> None:
    for pusher in list(_LIVE):
        pusher._abandon("The process is exiting")


def _on_sigterm(signum, frame):
    """SIGTERM: stop like Ctrl-C does (unwinding, so ``finally``/``__exit__``/atexit clean up), or chain."""
    previous = _sigterm_previous
    for pusher in list(_LIVE):
        pusher._log_pending("SIGTERM")
    if callable(previous):
        return previous(signum, frame)
    raise SystemExit(128 + signum)


def _install_hooks(pusher: "HubPusher") -> None:
    global _atexit_done, _sigterm_previous, _sigterm_installed
    with _HOOKS:
        _LIVE.add(pusher)
        if not _atexit_done:
            atexit.register(_close_all_at_exit)
            _atexit_done = True
        if not _sigterm_installed and threading.current_thread() is threading.main_thread():
            try:
                current = signal.getsignal(signal.SIGTERM)
                if current in (signal.SIG_DFL, None) or callable(current):
                    _sigterm_previous = current if callable(current) else None
                    signal.signal(signal.SIGTERM, _on_sigterm)
                    _sigterm_installed = True
            except (ValueError, OSError):  # not the main interpreter / no signals here
                pass


def _remove_hooks(pusher: "HubPusher") -> None:
    global _sigterm_previous, _sigterm_installed
    with _HOOKS:
        _LIVE.discard(pusher)
        if _LIVE or not _sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, _sigterm_previous or signal.SIG_DFL)
        except (ValueError, OSError):
            pass
        _sigterm_previous, _sigterm_installed = None, False


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

    Raises:
        ArgumentError: an unknown ``hub_strategy``.
    """

    def __init__(self, repo_id: Optional[str], *, token: Optional[str] = None, hub_strategy: str = "every_save",
                 private: Optional[bool] = None, revision: Optional[str] = None, output_dir: Optional[str] = None,
                 api=None, max_retries: int = 5, backoff_seconds: float = 1.0,
                 push_timeout: Optional[float] = DEFAULT_PUSH_TIMEOUT, card_fields: Optional[dict] = None):
        if hub_strategy not in HUB_STRATEGIES:
            raise ArgumentError(f"hub_strategy must be one of {', '.join(HUB_STRATEGIES)}, got {hub_strategy!r}.")
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
        from hf_tpu_ext.hub.preflight import preflight, resolve_token

        self._token = resolve_token(self._token)
        default_name = os.path.basename(os.path.abspath(self.output_dir)) if self.output_dir else None
        self.repo_id = preflight(self.repo_id, self._token, private=self.private, revision=self.revision,
                                 default_name=default_name)
        if self.card_fields is not None:
            from hf_tpu_ext.hub.model_card import render_model_card, validate_model_card

            card = render_model_card(self.output_dir or ".", repo_id=self.repo_id,
                                     summary={"mask_token": "<mask>"}, **self.card_fields)
            validate_model_card(card, token=self._token)
        self._queue = PushQueue(self.repo_id, self._token, revision=self.revision, max_retries=self.max_retries,
                                backoff_seconds=self.backoff_seconds, api=self._api)
        _install_hooks(self)
        self._preflight_done = True
        return self.repo_id

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
            commit_message: the commit summary (default: ``"Training in progress, step N"`` /
                ``"End of training"``).

        Raises:
            RuntimeError: the pusher is closed.
            FileNotFoundError: a folder does not exist.
            HubAuthError, HubRepoError, HubError: from :meth:`preflight` when it has not run yet.
        """
        if self._closed:
            raise RuntimeError("This HubPusher is closed; create a new one to push again.")
        if self.hub_strategy == "end" and not final:
            return
        self.preflight()
        step = int(step)
        message = commit_message or ("End of training" if final else f"Training in progress, step {step}")
        from hf_tpu_ext.hub.model_card import validate_card_file

        check_card = functools.partial(validate_card_file, token=self._token)
        also, delete = [], None
        if checkpoint_folder is not None and self.hub_strategy == "checkpoint":
            also, delete = [(checkpoint_folder, LAST_CHECKPOINT)], list(LAST_CHECKPOINT_DELETE_PATTERNS)
        if model_folder is not None or also:
            self._queue.submit(model_folder, commit_message=message, ignore_patterns=list(MODEL_IGNORE_PATTERNS),
                               delete_patterns=delete, key="model", before_upload=check_card, also=also,
                               step=step, final=final,
                               inherit=(LAST_CHECKPOINT,) if self.hub_strategy == "checkpoint" else ())
        if checkpoint_folder is not None and self.hub_strategy == "all_checkpoints":
            name = checkpoint_folder_name(step)
            self._queue.submit(checkpoint_folder, path_in_repo=name, commit_message=f"Checkpoint at step {step}",
                               key=name, step=step)
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
        staging folders removed, and the KeyboardInterrupt raised on.

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
            self._log_pending("Interrupted again")
            self.close()
            raise
        self._close_queue(timed_out=report.timed_out)
        log_push_report(self._last_report, self.repo_id, self.output_dir, self._final_step)
        return self._last_report

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

    def _log_pending(self, why: str) -> None:
        queue = self._queue
        if queue is None:
            return
        pending = queue.report.pending
        if pending:
            where = self.output_dir or "the output folder"
            logger.warning("%s: %d push(es) to %s not finished (%s); push them later with `hf-tpu push %s "
                           "--hub_model_id %s`.", why, len(pending), self.repo_id, "; ".join(pending), where,
                           self.repo_id)

    def _abandon(self, why: str) -> None:
        """Report what is pending and clean up without waiting (exceptions, interrupts, interpreter exit)."""
        try:
            self._log_pending(why)
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
