"""Background uploads to the Hub that never block training.

:class:`PushQueue` copies the files of a folder into a private staging folder when a push is submitted
(so later saves cannot tear an upload that is in flight) and uploads it from one worker thread with
:meth:`huggingface_hub.HfApi.upload_folder`. Per ``key`` at most one push is pending: a newer submission
replaces the older pending one, so after the in-flight upload the newest state is uploaded (never
skipped). Connection errors, timeouts, 5xx and 429 are retried with exponential backoff; other 4xx are not.

Example:
    >>> q = PushQueue("alice/my-model", token)
    >>> q.submit("output", commit_message="Training in progress, step 100", ignore_patterns=["checkpoints/*"])
    >>> report = q.wait(timeout=600)
    >>> q.close()
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple, Union

from hf_tpu_ext.hub.preflight import scrub

logger = logging.getLogger("hf_tpu_ext.hub")

Patterns = Optional[Union[str, Sequence[str]]]
MAX_BACKOFF_SECONDS = 60.0


@dataclass
class PushReport:
    """What a :class:`PushQueue` did so far.

    Attributes:
        pushed: ``(commit_message, commit_oid)`` of each push that landed, in order.
        failed: ``(commit_message, error text)`` of each push given up on (the text never holds the token).
        pending: commit messages of the pushes not finished yet (in flight first).
        superseded: commit messages of pending pushes replaced by a newer submission with the same key.
        timed_out: ``wait`` returned because its timeout ran out, with pushes still pending.
    """

    pushed: List[Tuple[str, str]] = field(default_factory=list)
    failed: List[Tuple[str, str]] = field(default_factory=list)
    pending: List[str] = field(default_factory=list)
    superseded: List[str] = field(default_factory=list)
    timed_out: bool = False


@dataclass
class _Job:
    key: str
    staging: str
    path_in_repo: Optional[str]
    commit_message: str
    delete_patterns: Optional[List[str]]
    seq: int
    before_upload: Optional[Callable[[str], None]] = None


def _as_list(patterns: Patterns) -> Optional[List[str]]:
    if patterns is None:
        return None
    return [patterns] if isinstance(patterns, str) else list(patterns)


def _matches(path: str, patterns: Optional[List[str]]) -> bool:
    return any(fnmatch.fnmatch(path, p) or (p.endswith("/") and path.startswith(p)) for p in patterns or [])


def is_retryable(err: BaseException) -> bool:
    """True for errors worth retrying: connection errors, timeouts, HTTP 5xx and 429."""
    import requests

    if isinstance(err, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
        return True
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    return status is not None and (status >= 500 or status == 429)


class PushQueue:
    """A single-worker background uploader with per-key coalescing and retries.

    Args:
        repo_id: the full repo id (see :func:`hf_tpu_ext.hub.preflight.preflight`).
        token: the Hub token (kept in memory only, scrubbed from every message).
        revision: branch to push to (``None``: main).
        repo_type: ``"model"`` or ``"space"``.
        max_retries: retries of one push after its first attempt (retryable errors only).
        backoff_seconds: the first retry waits this long (seconds); each next one twice as long, at most 60 s.
    """

    def __init__(self, repo_id: str, token: Optional[str], *, revision: Optional[str] = None, repo_type: str = "model",
                 max_retries: int = 5, backoff_seconds: float = 1.0):
        self.repo_id, self.revision, self.repo_type = repo_id, revision, repo_type
        self.max_retries, self.backoff_seconds = int(max_retries), float(backoff_seconds)
        self._token = token
        self._cond = threading.Condition()
        self._pending: List[_Job] = []  # at most one per key, in submission order
        self._in_flight: Optional[_Job] = None
        self._report = PushReport()
        self._closed = False
        self._seq = 0
        self._staging_root = tempfile.mkdtemp(prefix="hf-tpu-push-")
        self._thread = threading.Thread(target=self._run, name=f"hf-tpu-push-{repo_id}", daemon=True)
        self._thread.start()

    def __repr__(self):  # no token
        return f"PushQueue(repo_id={self.repo_id!r}, revision={self.revision!r}, repo_type={self.repo_type!r})"

    # ---- public API ------------------------------------------------------------------------------
    def submit(self, folder: Union[str, os.PathLike], *, path_in_repo: Optional[str] = None, commit_message: str,
               allow_patterns: Patterns = None, ignore_patterns: Patterns = None, delete_patterns: Patterns = None,
               key: str = "model", before_upload: Optional[Callable[[str], None]] = None) -> None:
        """Snapshot ``folder`` now and upload it in the background.

        Only the local copy is done in the caller's thread (files are copied, not hard-linked, because
        ``save_pretrained``/safetensors rewrite files in place).

        Args:
            folder: the local folder to upload.
            path_in_repo: where in the repo its files go (``None``: the root).
            commit_message: the commit summary.
            allow_patterns / ignore_patterns: fnmatch patterns on paths relative to ``folder`` (as in
                ``upload_folder``); a pattern ending in ``/`` matches a whole folder.
            delete_patterns: remote files (relative to ``path_in_repo``) to delete in the same commit unless
                re-uploaded, e.g. ``"*.index"`` to drop files of an older checkpoint.
            key: pushes with the same key coalesce: a pending one is replaced by this one.
            before_upload: called in the background thread with the snapshot folder before its first upload
                attempt (e.g. to validate the model card with the Hub off the training thread); it may edit
                the snapshot. If it raises, the push is recorded as failed and nothing is uploaded.

        Raises:
            RuntimeError: the queue is closed.
            FileNotFoundError: ``folder`` does not exist.
        """
        if self._closed:
            raise RuntimeError("PushQueue is closed; create a new one to push again.")
        folder = os.fspath(folder)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"Cannot push {folder}: it is not a folder.")
        allow, ignore = _as_list(allow_patterns), _as_list(ignore_patterns)
        with self._cond:
            self._seq += 1
            seq = self._seq
        staging = os.path.join(self._staging_root, f"{seq:06d}")
        n_files = 0
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                src = os.path.join(root, name)
                rel = os.path.relpath(src, folder).replace(os.sep, "/")
                if allow is not None and not _matches(rel, allow):
                    continue
                if _matches(rel, ignore) or rel.startswith(".cache/") or "/.git/" in f"/{rel}":
                    continue
                dest = os.path.join(staging, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copy2(src, dest)
                n_files += 1
        os.makedirs(staging, exist_ok=True)
        job = _Job(key, staging, path_in_repo, commit_message, _as_list(delete_patterns), seq, before_upload)
        with self._cond:
            for old in [j for j in self._pending if j.key == key]:
                self._pending.remove(old)
                self._report.superseded.append(old.commit_message)
                shutil.rmtree(old.staging, ignore_errors=True)
                logger.info("Push %r superseded by %r before it started.", old.commit_message, commit_message)
            self._pending.append(job)
            self._cond.notify_all()
        logger.info("Queued push %r (%d files) to %s.", commit_message, n_files, self.repo_id)

    def wait(self, timeout: Optional[float] = None) -> PushReport:
        """Block until every submitted push landed or failed, or ``timeout`` seconds passed.

        Returns:
            A snapshot :class:`PushReport` (``timed_out`` True when pushes are still pending).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending or self._in_flight is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    report = self._snapshot()
                    report.timed_out = True
                    return report
                self._cond.wait(left)
            return self._snapshot()

    @property
    def report(self) -> PushReport:
        """The current :class:`PushReport` (a copy)."""
        with self._cond:
            return self._snapshot()

    def close(self, timeout: Optional[float] = 0) -> PushReport:
        """Stop accepting pushes, wait up to ``timeout`` seconds (None: forever) for pending ones, stop the worker.

        Pushes still pending afterwards are dropped (listed in the returned report's ``pending``).
        """
        report = self.wait(timeout) if timeout != 0 else self.report
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
        if not report.pending:
            self._thread.join(timeout=5)
            shutil.rmtree(self._staging_root, ignore_errors=True)
        return report

    # ---- worker ----------------------------------------------------------------------------------
    def _snapshot(self) -> PushReport:
        pending = ([self._in_flight.commit_message] if self._in_flight else []) + [j.commit_message for j in self._pending]
        return PushReport(list(self._report.pushed), list(self._report.failed), pending, list(self._report.superseded), False)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed and not self._pending:
                    return
                job = self._pending.pop(0)
                self._in_flight = job
            try:
                if job.before_upload is not None:
                    job.before_upload(job.staging)
                oid = self._push_with_retries(job)
                with self._cond:
                    self._report.pushed.append((job.commit_message, oid))
                logger.info("Pushed %r to %s (commit %s).", job.commit_message, self.repo_id, oid[:8] if oid else "?")
            except Exception as err:  # the worker must survive any failure
                text = scrub(f"{type(err).__name__}: {_describe(err)}", self._token)
                with self._cond:
                    self._report.failed.append((job.commit_message, text))
                logger.error("Push %r to %s failed: %s", job.commit_message, self.repo_id, text)
            finally:
                shutil.rmtree(job.staging, ignore_errors=True)
                with self._cond:
                    self._in_flight = None
                    self._cond.notify_all()

    def _push_with_retries(self, job: _Job) -> str:
        from huggingface_hub import HfApi, constants

        api = HfApi(endpoint=constants.ENDPOINT, token=self._token)
        attempt = 0
        while True:
            try:
                info = api.upload_folder(
                    repo_id=self.repo_id, folder_path=job.staging, path_in_repo=job.path_in_repo,
                    commit_message=job.commit_message, revision=self.revision, repo_type=self.repo_type,
                    delete_patterns=job.delete_patterns,
                )
                return info.oid
            except Exception as err:
                if attempt >= self.max_retries or not is_retryable(err) or self._closed:
                    raise
                wait = min(self.backoff_seconds * (2 ** attempt), MAX_BACKOFF_SECONDS)
                attempt += 1
                logger.warning("Push %r failed (%s); retry %d/%d in %.1f s.", job.commit_message,
                               scrub(_describe(err), self._token), attempt, self.max_retries, wait)
                time.sleep(wait)


def _describe(err: BaseException) -> str:
    status = getattr(getattr(err, "response", None), "status_code", None)
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"HTTP {status}: {first}" if status is not None else first


def log_push_report(report: PushReport, repo_id: str, output_dir: str, final_step: int) -> None:
    """Log what the end of training left on the Hub, and how to push what did not land.

    Args:
        report: the queue's report after :meth:`PushQueue.wait`.
        repo_id: the target repo (for the messages).
        output_dir: the local folder that holds everything.
        final_step: the last global step.
    """
    for message, oid in report.pushed:
        logger.info("On the Hub: %r (commit %s).", message, oid[:8] if oid else "?")
    if report.failed or report.pending:
        missing = [m for m, _ in report.failed] + list(report.pending)
        logger.error(
            "Not pushed to %s: %s. The local folder %s has everything; push it later with "
            "`hf-tpu push %s --hub_model_id %s`.", repo_id, "; ".join(missing), output_dir, output_dir, repo_id)
    else:
        logger.info("All %d pushes to %s landed (final step %d).", len(report.pushed), repo_id, final_step)


def open_push_queue(output_dir: str, hub_model_id: Optional[str], token: Optional[str], *,
                    private: Optional[bool] = None, revision: Optional[str] = None, max_retries: int = 5,
                    backoff_seconds: float = 1.0, card_summary: Optional[dict] = None,
                    card_fields: Optional[dict] = None):
    """The preflight every Hub-push callback runs before the first step, whichever backend it serves.

    Resolves the token, checks it and the namespace and creates the repo/branch
    (:func:`hf_tpu_ext.hub.preflight.preflight`), validates the card fields against the Hub (a bad license
    fails now, not at the first save) and starts the background queue.

    Returns:
        ``(repo_id, token, queue)``: the full repo id, the resolved token, a :class:`PushQueue`.

    Raises:
        HubAuthError, HubRepoError, HubError, ModelCardError: what to fix, without the token.
    """
    from hf_tpu_ext.hub.model_card import render_model_card, validate_model_card
    from hf_tpu_ext.hub.preflight import preflight, resolve_token

    token = resolve_token(token)
    repo_id = preflight(hub_model_id, token, private=private, revision=revision,
                        default_name=os.path.basename(os.path.abspath(output_dir)))
    card = render_model_card(output_dir, repo_id=repo_id, summary=card_summary or {"mask_token": "<mask>"},
                             **(card_fields or {}))
    validate_model_card(card, token=token)
    queue = PushQueue(repo_id, token, revision=revision, max_retries=max_retries, backoff_seconds=backoff_seconds)
    return repo_id, token, queue


def submit_model_folder(queue: PushQueue, folder: str, commit_message: str, token: Optional[str],
                        ignore_patterns: Patterns) -> None:
    """Queue a model-folder push (key ``"model"``) whose card the Hub validates in the push job.

    Used by the push callbacks of both backends; see :func:`hf_tpu_ext.hub.model_card.validate_card_file` for
    what happens to a card the Hub rejects.
    """
    import functools

    from hf_tpu_ext.hub.model_card import validate_card_file

    queue.submit(folder, commit_message=commit_message, ignore_patterns=ignore_patterns, key="model",
                 before_upload=functools.partial(validate_card_file, token=token))


def finish_pushes(queue: PushQueue, repo_id: str, output_dir: str, final_step: int, timeout: Optional[float]) -> PushReport:
    """Wait for the queue (``timeout`` seconds), log what landed and what did not, close it; returns the report."""
    report = queue.wait(timeout)
    log_push_report(report, repo_id, output_dir, final_step)
    queue.close(timeout=0)
    return report
