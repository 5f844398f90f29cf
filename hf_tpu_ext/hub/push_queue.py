"""Background uploads to the Hub that never block training (the queue of :class:`~hf_tpu_ext.hub.push_session.PushSession`).

:class:`PushQueue` snapshots a push into a private staging folder when it is submitted (a folder's files
copied, a checkpoint's files hard-linked: :mod:`hf_tpu_ext.hub.staging`), so later saves cannot tear an upload
that is in flight, and uploads it from one worker thread with
:meth:`huggingface_hub.HfApi.upload_folder`. Per ``key`` at most one push is pending: a newer submission
replaces the older pending one *in its place in the line* (so a push that is replaced again and again is
never starved by pushes of other keys), and after the in-flight upload the newest state is uploaded.

Retries (see :func:`is_retryable`): connection errors, timeouts, HTTP 5xx and 429, with exponential backoff
(``backoff_seconds * 2**attempt``, at most :data:`MAX_BACKOFF_SECONDS`) unless the Hub sent ``Retry-After``
(seconds or an HTTP date, honoured up to :data:`MAX_RETRY_AFTER_SECONDS`). Other 4xx are not retried. A
commit whose reply is lost or unreadable (an empty 200, a dropped connection) is looked up in the repo's
commit list by a per-push id before it is sent again, so it is never committed twice.

The report keeps totals and the last :data:`REPORT_LIMIT` outcomes: memory stays flat however long a run
pushes. Staging folders live under one ``hf-tpu-push-<pid>-*`` temp folder that :meth:`PushQueue.close`
removes; a new queue removes those of processes that ended without cleaning up (``kill -9``).

Example:
    >>> q = PushQueue("alice/my-model", token)
    >>> q.submit("output", commit_message="Training in progress, step 100", ignore_patterns=["checkpoints/*"])
    >>> report = q.wait(timeout=600)
    >>> q.close()
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from hf_tpu_ext import interrupts
from hf_tpu_ext.hub.preflight import endpoint, scrub, transport_errors
from hf_tpu_ext.hub.retry_policy import (HUB_LINES, MAX_BACKOFF_SECONDS, MAX_RETRY_AFTER_SECONDS,  # noqa: F401
                                         describe, is_retryable, is_unreadable_reply, retry_after_for,
                                         retry_after_seconds, status_of)
from hf_tpu_ext.hub.staging import STAGING_PREFIX, copy_tree, link_files, remove_stale_staging  # noqa: F401 (re-exported)

logger = logging.getLogger("hf_tpu_ext.hub")

Patterns = Optional[Union[str, Sequence[str]]]
# outcomes kept in a report (totals are counted separately): bounded memory for runs with thousands of pushes
REPORT_LIMIT = 100
# the commit description carries this id so a commit whose reply was lost can be found
PUSH_ID_MARKER = "hf-tpu-ext push id"


def note_step(steps: list, step: int, limit: int = REPORT_LIMIT) -> None:
    """Append ``step`` to a list of pushed (or coalesced) steps, keeping the last ``limit`` (memory stays flat
    however long a run pushes)."""
    steps.append(int(step))
    if len(steps) > limit:
        del steps[: len(steps) - limit]


@dataclass
class PushOutcome:
    """What happened to one submitted push.

    Attributes:
        commit_message: the commit summary.
        status: ``"pushed"``, ``"failed"``, ``"superseded"`` (replaced by a newer pending push of its key) or
            ``"dropped"`` (still pending when the queue closed).
        step: the global step of the save (``None`` when not given).
        final: the push of the final state.
        commit_oid: the commit id (pushed only).
        commit_url: the commit's URL (pushed only).
        error: the error text, token scrubbed (failed only).
        attempts: upload attempts made (0 when it never started).
    """

    commit_message: str
    status: str
    step: Optional[int] = None
    final: bool = False
    commit_oid: Optional[str] = None
    commit_url: Optional[str] = None
    error: Optional[str] = None
    attempts: int = 0

    def to_dict(self) -> dict:
        return {"commit_message": self.commit_message, "status": self.status, "step": self.step, "final": self.final,
                "commit": self.commit_oid, "commit_url": self.commit_url, "error": self.error,
                "attempts": self.attempts}


@dataclass
class PushReport:
    """What a :class:`PushQueue` did so far (a snapshot; the lists hold the last :data:`REPORT_LIMIT` entries).

    Attributes:
        pushed: ``(commit_message, commit_oid)`` of each push that landed, in order.
        failed: ``(commit_message, error text)`` of each push given up on (the text never holds the token).
        pending: commit messages of the pushes not finished yet (in flight first; after ``close``, also those
            dropped unfinished).
        superseded: commit messages of pending pushes replaced by a newer submission with the same key.
        timed_out: ``wait`` returned because its timeout ran out, with pushes still pending.
        final_pushed: a push submitted with ``final=True`` landed.
        outcomes: one :class:`PushOutcome` per finished push (pushed, failed, superseded, dropped), in order.
        unfinished: the pending pushes as ``{"commit_message", "step", "final", "push_id"}`` (in flight first):
            ``push_id`` is in the commit description, so a later process can ask the Hub whether one that was
            in flight at exit landed (:meth:`PushQueue.find_push`).
        counts: totals over the whole run: ``{"pushed": n, "failed": n, "superseded": n, "dropped": n}``.
        repo_id: the target repo.
        revision: the target branch (``None``: main).
    """

    pushed: List[Tuple[str, str]] = field(default_factory=list)
    failed: List[Tuple[str, str]] = field(default_factory=list)
    pending: List[str] = field(default_factory=list)
    superseded: List[str] = field(default_factory=list)
    timed_out: bool = False
    final_pushed: bool = False
    outcomes: List[PushOutcome] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=lambda: {"pushed": 0, "failed": 0, "superseded": 0, "dropped": 0})
    repo_id: Optional[str] = None
    revision: Optional[str] = None
    unfinished: List[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing failed and nothing is pending."""
        return not self.counts.get("failed") and not self.pending

    def to_dict(self) -> dict:
        """A JSON-ready dict for ``training_summary.json`` (no token: errors are scrubbed when recorded).

        Keys: ``repo_id``, ``revision``, ``final_pushed``, ``pushed``/``failed``/``superseded``/``dropped``
        (totals), ``pending`` (commit messages), ``unfinished`` (their push ids), ``timed_out``, ``pushes``
        (the last outcomes, see :meth:`PushOutcome.to_dict`).
        """
        return {"repo_id": self.repo_id, "revision": self.revision, "final_pushed": bool(self.final_pushed),
                **{k: int(v) for k, v in self.counts.items()}, "pending": list(self.pending),
                "unfinished": [dict(u) for u in self.unfinished],
                "timed_out": bool(self.timed_out), "pushes": [o.to_dict() for o in self.outcomes]}


@dataclass
class _Job:
    key: str
    staging: str
    path_in_repo: Optional[str]
    commit_message: str
    delete_patterns: Optional[List[str]]
    seq: int
    before_upload: Optional[Callable[[str], None]] = None
    step: Optional[int] = None
    final: bool = False
    push_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    attempts: int = 0
    inherit: Tuple[str, ...] = ()
    # set to end a retry wait early: the queue closes, or a final push of the same key replaces this one
    wake: threading.Event = field(default_factory=threading.Event)
    replaced: bool = False


class _Replaced(Exception):
    """A push waiting for a retry was replaced by a newer final push of its key (which carries newer state)."""


def _snapshot(staging: str, sources, linked, allow: Optional[List[str]], ignore: Optional[List[str]],
              link: Optional[List[str]]) -> int:
    """Fill the snapshot folder ``staging``: the ``sources`` folders copied (the patterns filter the main folder,
    prefix ``""``, only), the ``linked`` checkpoint files hard-linked; returns the file count. A failure removes it."""
    try:
        n_files = 0
        for src, prefix in sources:
            main = prefix == ""
            n_files += copy_tree(src, os.path.join(staging, prefix) if prefix else staging,
                                 allow if main else None, ignore if main else None, link if main else None)
        for files, prefix in linked:
            n_files += link_files(files, os.path.join(staging, prefix) if prefix else staging)
        return n_files
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _as_list(patterns: Patterns) -> Optional[List[str]]:
    if patterns is None:
        return None
    return [patterns] if isinstance(patterns, str) else list(patterns)


class PushQueue:
    """A single-worker background uploader with per-key coalescing and retries.

    Args:
        repo_id: the full repo id (see :func:`hf_tpu_ext.hub.preflight.preflight`).
        token: the Hub token (kept in memory only, scrubbed from every message).
        revision: branch to push to (``None``: main).
        repo_type: ``"model"`` or ``"space"``.
        max_retries: retries of one push after its first attempt (retryable errors only).
        backoff_seconds: the first retry waits this long (seconds); each next one twice as long, at most
            :data:`MAX_BACKOFF_SECONDS`; a ``Retry-After`` from the Hub replaces it.
        api: the :class:`huggingface_hub.HfApi` to use (default: one on the current endpoint with ``token``).
        on_rate_limited: called with the ``Retry-After`` seconds (or ``None``) each time the Hub answers 429
            (the commit budget of :mod:`hf_tpu_ext.hub.push_session` listens).
    """

    def __init__(self, repo_id: str, token: Optional[str], *, revision: Optional[str] = None, repo_type: str = "model",
                 max_retries: int = 5, backoff_seconds: float = 1.0, api=None,
                 on_rate_limited: Optional[Callable[[Optional[float]], None]] = None):
        self.repo_id, self.revision, self.repo_type = repo_id, revision, repo_type
        self.max_retries, self.backoff_seconds = int(max_retries), float(backoff_seconds)
        self._token = token
        self._api = api
        self.on_rate_limited = on_rate_limited
        # no upload starts before the Hub's Retry-After: the repo's one clock, which the commit budget reads too
        self.retry_after = retry_after_for(repo_id, repo_type)
        self._cond = threading.Condition()
        self._stop = threading.Event()  # set by close(): ends retry waits at once
        self._pending: List[_Job] = []  # at most one per key, in line order
        self._in_flight: Optional[_Job] = None
        self._pushed: Deque[Tuple[str, str]] = collections.deque(maxlen=REPORT_LIMIT)
        self._failed: Deque[Tuple[str, str]] = collections.deque(maxlen=REPORT_LIMIT)
        self._superseded: Deque[str] = collections.deque(maxlen=REPORT_LIMIT)
        self._outcomes: Deque[PushOutcome] = collections.deque(maxlen=REPORT_LIMIT)
        self._counts = {"pushed": 0, "failed": 0, "superseded": 0, "dropped": 0}
        self._final_pushed = False
        self._dropped: Deque[_Job] = collections.deque(maxlen=REPORT_LIMIT)  # pending when the queue closed
        self._closed = False
        self._seq = 0
        remove_stale_staging()
        self._staging_root = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-")
        self._thread = threading.Thread(target=self._run, name=f"hf-tpu-push-{repo_id}", daemon=True)
        self._thread.start()

    def __repr__(self):  # no token
        return f"PushQueue(repo_id={self.repo_id!r}, revision={self.revision!r}, repo_type={self.repo_type!r})"

    @property
    def staging_root(self) -> str:
        """The ``hf-tpu-push-*`` temp folder holding the snapshots (removed by :meth:`close`)."""
        return self._staging_root

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- public API ------------------------------------------------------------------------------
    def submit(self, folder: Optional[Union[str, os.PathLike]], *, path_in_repo: Optional[str] = None,
               commit_message: str, allow_patterns: Patterns = None, ignore_patterns: Patterns = None,
               delete_patterns: Patterns = None, key: str = "model",
               before_upload: Optional[Callable[[str], None]] = None,
               also: Sequence[Tuple[Union[str, os.PathLike], str]] = (), step: Optional[int] = None,
               final: bool = False, inherit: Sequence[str] = (),
               linked: Sequence[Tuple[Mapping[str, Union[str, bytes]], str]] = (),
               link_patterns: Patterns = None) -> None:
        """Snapshot ``folder`` (and ``also``, ``linked``) now and upload it in the background, in one commit.

        Only the local snapshot (copies and hard links) is made in the caller's thread.

        Args:
            folder: the local folder to upload (``None``: only the ``also`` folders).
            path_in_repo: where in the repo the snapshot goes (``None``: the root).
            commit_message: the commit summary.
            allow_patterns / ignore_patterns: fnmatch patterns on paths relative to ``folder`` (as in
                ``upload_folder``); a pattern ending in ``/`` matches a whole folder.
            delete_patterns: remote files (relative to ``path_in_repo``) to delete in the same commit unless
                re-uploaded, e.g. ``"last-checkpoint/*"`` to drop files of an older checkpoint.
            key: pushes with the same key coalesce: a pending one is replaced by this one (in its place).
            before_upload: called in the background thread with the snapshot folder before its first upload
                attempt (e.g. to validate the model card with the Hub off the training thread); it may edit
                the snapshot. If it raises, the push is recorded as failed and nothing is uploaded.
            also: ``(folder, prefix)`` pairs copied whole under ``prefix/`` of the snapshot (same commit).
            step: the global step of this save (for the report).
            final: the push of the final state (``report.final_pushed`` says whether it landed).
            inherit: snapshot folders (``also`` prefixes, e.g. ``"last-checkpoint"``) that this push takes over
                from the pending push it replaces when it has none of its own, so replacing a push never
                drops a checkpoint that only the replaced one carried.
            linked: ``(files, prefix)`` pairs: a checkpoint's ``{name: local file}`` (a backend's
                ``checkpoint_files``) hard-linked under ``prefix/`` of the snapshot (``""``: the snapshot itself;
                see :func:`hf_tpu_ext.hub.staging.link_files`), so the push carries the files as written now even
                if their folder is deleted or rotated later.
            link_patterns: files of ``folder`` (fnmatch, relative) that their writer replaces rather than rewrites
                (a new file renamed into place): hard-linked into the snapshot instead of copied.

        Raises:
            RuntimeError: the queue is closed.
            FileNotFoundError: ``folder`` or an ``also`` folder does not exist.
        """
        if self._closed:
            raise RuntimeError("PushQueue is closed; create a new one to push again.")
        sources = [(os.fspath(f), p) for f, p in also]
        if folder is not None:
            sources.insert(0, (os.fspath(folder), ""))
        for src, _ in sources:
            if not os.path.isdir(src):
                raise FileNotFoundError(f"Cannot push {src}: it is not a folder.")
        allow, ignore = _as_list(allow_patterns), _as_list(ignore_patterns)
        with self._cond:
            self._seq += 1
            seq = self._seq
        staging = os.path.join(self._staging_root, f"{seq:06d}")
        n_files = _snapshot(staging, sources, linked, allow, ignore, _as_list(link_patterns))
        job = _Job(key, staging, path_in_repo, commit_message, _as_list(delete_patterns), seq, before_upload,
                   None if step is None else int(step), bool(final), inherit=tuple(inherit))
        with self._cond:
            if self._closed:  # closed while copying
                shutil.rmtree(staging, ignore_errors=True)
                raise RuntimeError("PushQueue is closed; create a new one to push again.")
            for i, old in enumerate(self._pending):
                if old.key == key:
                    self._pending[i] = job  # takes the older push's place in the line
                    job.final = job.final or old.final
                    self._take_over(old, job)
                    self._record(old, "superseded")
                    shutil.rmtree(old.staging, ignore_errors=True)
                    logger.info("Push %r superseded by %r before it started.", old.commit_message, commit_message)
                    break
            else:
                self._pending.append(job)
            flight = self._in_flight
            if job.final and flight is not None and flight.key == key and not flight.final:
                # a stale upload waiting out a Retry-After must not hold the final state: the final push
                # replaces it (and still waits for what is left of the Retry-After)
                flight.replaced = True
                flight.wake.set()
            self._cond.notify_all()
        logger.info("Queued push %r (%d files) to %s.", commit_message, n_files, self.repo_id)

    def wait(self, timeout: Optional[float] = None) -> PushReport:
        """Block until every submitted push landed or failed, or ``timeout`` seconds passed.

        The wait is in short slices, so Ctrl-C (KeyboardInterrupt) in the calling thread ends it at once.

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
                self._cond.wait(0.25 if left is None else min(left, 0.25))
            return self._snapshot()

    @property
    def report(self) -> PushReport:
        """The current :class:`PushReport` (a copy)."""
        with self._cond:
            return self._snapshot()

    def close(self, timeout: Optional[float] = 0) -> PushReport:
        """Stop accepting pushes, wait up to ``timeout`` seconds (None: forever) for pending ones, stop the worker.

        Pushes still pending afterwards are dropped (listed in the returned report's ``pending`` and counted
        as ``dropped``); an upload in flight is abandoned at its next retry wait. The staging folder is always
        removed. Idempotent.
        """
        timed_out = self.wait(timeout).timed_out if timeout != 0 else False
        with self._cond:
            self._closed = True
            self._stop.set()
            for job in self._pending:
                self._record(job, "dropped")
                self._dropped.append(job)
            self._pending.clear()
            if self._in_flight is not None:
                self._in_flight.wake.set()
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            # an upload in flight ends at its next retry wait or request; after a signal, never past the grace
            # budget (the process must be gone by then: the upload is reported unfinished, with its push id);
            # after a second signal, half a second: the user asked to stop waiting
            left = interrupts.seconds_left()
            limit = 2.0 if left is None else min(2.0 if interrupts.count() < 2 else 0.5, left / 2)
            self._thread.join(timeout=limit)
        shutil.rmtree(self._staging_root, ignore_errors=True)
        report = self.report
        report.timed_out = timed_out
        return report

    # ---- worker ----------------------------------------------------------------------------------
    @staticmethod
    def _take_over(old: _Job, job: _Job) -> None:
        """Move ``old``'s snapshot folders named in ``job.inherit`` into ``job``'s when ``job`` lacks them."""
        for prefix in job.inherit:
            theirs, ours = os.path.join(old.staging, prefix), os.path.join(job.staging, prefix)
            if os.path.isdir(theirs) and not os.path.exists(ours):
                shutil.move(theirs, ours)
                job.delete_patterns = sorted(set(job.delete_patterns or []) | set(old.delete_patterns or []))

    def _record(self, job: _Job, status: str, oid: Optional[str] = None, url: Optional[str] = None,
                error: Optional[str] = None) -> None:
        """Book an outcome (call with ``self._cond`` held)."""
        self._counts[status] = self._counts.get(status, 0) + 1
        if status == "pushed":
            self._pushed.append((job.commit_message, oid or ""))
            if job.final:
                self._final_pushed = True
        elif status == "failed":
            self._failed.append((job.commit_message, error or ""))
        elif status == "superseded":
            self._superseded.append(job.commit_message)
        self._outcomes.append(PushOutcome(job.commit_message, status, job.step, job.final, oid, url, error,
                                          job.attempts))

    def _snapshot(self) -> PushReport:
        jobs = ([self._in_flight] if self._in_flight else []) + list(self._pending) + list(self._dropped)
        unfinished = [{"commit_message": j.commit_message, "step": j.step, "final": j.final, "push_id": j.push_id}
                      for j in jobs]
        return PushReport(list(self._pushed), list(self._failed), [j.commit_message for j in jobs],
                          list(self._superseded), False, self._final_pushed, list(self._outcomes), dict(self._counts),
                          self.repo_id, self.revision, unfinished)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    job = self._pending.pop(0)
                    self._in_flight = job
                try:
                    self._wait_blocked(job)
                    if job.before_upload is not None:
                        job.before_upload(job.staging)
                    oid, url = self._push_with_retries(job)
                    with self._cond:
                        self._record(job, "pushed", oid, url)
                    logger.info("Pushed %r to %s (commit %s).", job.commit_message, self.repo_id,
                                oid[:8] if oid else "?")
                except _Replaced:
                    with self._cond:
                        self._record(job, "superseded")
                        self._superseded_in_flight(job)
                    logger.info("Push %r replaced by the final push while waiting to retry.", job.commit_message)
                except Exception as err:  # the worker must survive any failure
                    text = scrub(f"{type(err).__name__}: {describe(err)}", self._token)
                    with self._cond:
                        self._record(job, "failed", error=text)
                    logger.error("Push %r to %s failed: %s", job.commit_message, self.repo_id, text)
                finally:
                    shutil.rmtree(job.staging, ignore_errors=True)
                    with self._cond:
                        self._in_flight = None
                        self._cond.notify_all()
        finally:
            _close_thread_session()

    def _superseded_in_flight(self, job: _Job) -> None:
        """The pending push that replaced ``job`` takes over its checkpoint folders (call with the lock held)."""
        for newer in self._pending:
            if newer.key == job.key:
                self._take_over(job, newer)
                break

    def _wait_blocked(self, job: _Job) -> None:
        """Wait out what is left of a ``Retry-After`` before starting ``job`` (ends early when the queue closes)."""
        left = self.retry_after.seconds_left()
        if left > 0:
            logger.info("Push %r waits %.1f s (the Hub's Retry-After).", job.commit_message, left)
            if self._stop.wait(left):
                raise RuntimeError("the queue closed while waiting for the Hub's Retry-After")

    def _hf_api(self):
        if self._api is not None:
            return self._api
        from huggingface_hub import HfApi

        return HfApi(endpoint=endpoint(), token=self._token)

    def _push_with_retries(self, job: _Job) -> Tuple[str, Optional[str]]:
        api = self._hf_api()
        HUB_LINES.start(job.commit_message, self._token)
        while True:
            job.attempts += 1
            try:
                HUB_LINES.seen = False
                info = api.upload_folder(
                    repo_id=self.repo_id, folder_path=job.staging, path_in_repo=job.path_in_repo,
                    commit_message=job.commit_message, commit_description=f"{PUSH_ID_MARKER}: {job.push_id}",
                    revision=self.revision, repo_type=self.repo_type, delete_patterns=job.delete_patterns,
                )
                if HUB_LINES.seen:  # huggingface_hub's own warning is held back: this line says it
                    logger.info("Push %r: the Hub already holds these files (an earlier attempt whose reply was "
                                "lost landed, or nothing changed): no new commit.", job.commit_message)
                return info.oid, getattr(info, "commit_url", None)
            except Exception as err:
                unreadable = is_unreadable_reply(err)
                if unreadable or isinstance(err, transport_errors()):
                    # the commit may have landed with its reply lost: look before sending it again
                    landed = self._find_commit(api, job.push_id)
                    if landed is not None:
                        logger.warning("Push %r: the Hub's reply was unreadable (%s) but the commit landed.",
                                       job.commit_message, type(err).__name__)
                        return landed, self._commit_url(landed)
                retryable = unreadable or is_retryable(err)
                if job.attempts > self.max_retries or not retryable or self._stop.is_set():
                    raise
                asked = retry_after_seconds(err)
                if status_of(err) == 429:
                    self.retry_after.note(asked)
                    if self.on_rate_limited is not None:
                        self.on_rate_limited(asked)
                wait = asked if asked is not None else min(self.backoff_seconds * (2 ** (job.attempts - 1)),
                                                           MAX_BACKOFF_SECONDS)
                logger.warning("Push %r failed (%s); retry %d/%d in %.1f s%s.", job.commit_message,
                               scrub(describe(err), self._token), job.attempts, self.max_retries, wait,
                               " (Retry-After)" if asked is not None else "")
                job.wake.wait(wait)
                if self._stop.is_set():
                    raise
                if job.replaced:
                    raise _Replaced() from None

    def find_push(self, push_id: str) -> Optional[str]:
        """The commit id of the push ``push_id`` (a :attr:`PushReport.unfinished` entry, maybe of an earlier
        process) among the branch's newest :data:`REPORT_LIMIT` commits; ``None``: not there or not known."""
        return self._find_commit(self._hf_api(), push_id)

    def _find_commit(self, api, push_id: str) -> Optional[str]:
        """The id of the commit carrying ``push_id`` among the branch's newest commits, else None."""
        try:
            commits = api.list_repo_commits(self.repo_id, repo_type=self.repo_type, revision=self.revision)
        except Exception as err:  # cannot tell: treat as not landed
            logger.debug("Could not list commits of %s: %s", self.repo_id, scrub(describe(err), self._token))
            return None
        for commit in commits[:REPORT_LIMIT]:
            if push_id in (getattr(commit, "message", "") or "") or push_id in (getattr(commit, "title", "") or ""):
                return commit.commit_id
        return None

    def _commit_url(self, oid: str) -> str:
        prefix = {"model": "", "dataset": "datasets/", "space": "spaces/"}.get(self.repo_type, "")
        return f"{endpoint()}/{prefix}{self.repo_id}/commit/{oid}"


def _close_thread_session() -> None:
    """Close this thread's huggingface_hub HTTP session (its sockets) when the worker ends.

    huggingface_hub < 1.0 keeps one ``requests.Session`` per thread; 1.x shares one client between threads,
    which must stay open.
    """
    try:
        import requests
        from huggingface_hub.utils import get_session

        session = get_session()
        if isinstance(session, requests.Session):
            session.close()
    except Exception:  # best effort: never fail a shutdown over it
        pass
