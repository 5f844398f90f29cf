"""The commit budget of a repo: the Hub's commit and API quotas, planned so a run never meets them.

The Hub allows 128 commits per hour per repo (:data:`HUB_COMMITS_PER_HOUR`) and 1,000 API requests per 300 s
per token. :class:`CommitBudget` spreads ``commits`` per ``period`` over the window (a token bucket with a
small burst), keeps one commit of the window for the final push, and learns from a 429 (its ``Retry-After``
and an empty bucket). :func:`budget_for` shares one budget per repo among the sessions of a process. The push
session (:mod:`hf_tpu_ext.hub.push_session`) asks it before a save is written, and seeds it once from the repo's
own recent commits (:func:`seed_from_hub`), so a resume within the hour counts what the earlier process spent.
"""

from __future__ import annotations

import collections
import datetime
import logging
import threading
import time
from typing import Callable, Deque, Dict, Iterable, Optional

from hf_tpu_ext.hub.preflight import endpoint, scrub
from hf_tpu_ext.hub.retry_policy import RetryAfter, reset_retry_after, retry_after_for

logger = logging.getLogger("hf_tpu_ext.hub")

#: the Hub's limit: "exceeded the rate limit for repository commits (128 per hour)"
HUB_COMMITS_PER_HOUR = 128
#: the session's default: below the Hub's limit, with room for a second writer (``hf-tpu push``, a resume)
DEFAULT_COMMIT_BUDGET = 100
DEFAULT_BUDGET_PERIOD = 3600.0
#: the Hub's API limit: 1,000 requests per 300 s per token
HUB_API_CALLS, HUB_API_PERIOD = 1000, 300.0
#: the title of the commit the Hub makes when a repo is created (the branch's root; not a commit of the commit API)
CREATION_COMMIT_TITLE = "initial commit"
#: requests one commit of a push costs (preupload, LFS batch, commit, card validation)
API_CALLS_PER_COMMIT = 4


class CommitBudget:
    """A per-repo plan of commits: at most ``commits`` per ``period`` seconds, one of them kept for the final push.

    A token bucket paces the commits: it holds up to ``burst`` commits (default a twentieth of the budget, at
    least 1) and refills at ``(commits - reserve - burst) / period`` per second, so a run pushes its first saves
    at once and then one commit per :attr:`seconds_per_commit` (38.3 s at 100 per hour): a full bucket plus a
    window's refill is what the window allows, so the paced commits never run into the window's cap (2) and
    stall (with the refill at ``commits / period`` a burst of 10 then spent the window's last 11 commits early
    and the Hub copy aged 396 s). A non-final commit may start when
    (1) the bucket holds a commit, (2) fewer than ``commits - reserve`` commits started in the last ``period``
    seconds, (3) the API requests of the last :data:`HUB_API_PERIOD` seconds leave room for one more commit
    (:data:`HUB_API_CALLS`), and (4) no ``Retry-After`` from the Hub is running. A final commit only waits for
    (4). A 429 empties the bucket as well (the Hub's own count is ahead of the plan: the next paced commit
    waits for the ``Retry-After`` and at least one interval). Thread-safe; :func:`budget_for` shares one instance per repo among
    the sessions of a process.

    Args:
        commits: commits per ``period``.
        period: the window in seconds.
        burst: commits the bucket holds (``None``: ``max(1, commits // 20)``).
        reserve: commits of the window kept for the final push (1; 0 when ``commits`` is 1).
        clock: seconds, monotonic (tests pass a fake).
        retry_after: the repo's ``Retry-After`` clock, shared with its push queue (default: a new one on ``clock``;
            :func:`budget_for` passes the repo's, :func:`~hf_tpu_ext.hub.retry_policy.retry_after_for`).
    """

    def __init__(self, commits: int = DEFAULT_COMMIT_BUDGET, period: float = DEFAULT_BUDGET_PERIOD,
                 burst: Optional[int] = None, reserve: int = 1, clock: Callable[[], float] = time.monotonic,
                 retry_after: Optional[RetryAfter] = None):
        self.commits, self.period = int(commits), float(period)
        self.reserve = min(int(reserve), self.commits - 1)
        self.burst = max(1, min(self.commits - self.reserve, int(burst) if burst else self.commits // 20))
        #: seconds between paced commits once the burst is spent
        self.seconds_per_commit = self.period / max(1, self.commits - self.reserve - self.burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens, self._filled_at = float(self.burst), clock()
        # commit starts and their API requests within the windows; only the newest ``commits`` / ``HUB_API_CALLS``
        # are ever looked at, so the deques are bounded (memory stays flat however long a run pushes)
        self._starts: Deque[float] = collections.deque(maxlen=self.commits)
        self._calls: Deque[float] = collections.deque(maxlen=HUB_API_CALLS)
        self.retry_after = retry_after if retry_after is not None else RetryAfter(clock)
        self.rate_limited = 0  # 429 answers seen
        self.started = 0  # commits started (all of them: paced, a signal's, the final one)
        #: commits of the window found on the Hub at start (:meth:`seed`; ``None``: not asked, or the Hub failed)
        self.seeded: Optional[int] = None
        self._hub_asked = False  # seed_from_hub asks the Hub once per budget, whatever the answer

    def _update(self, now: float) -> None:
        self._tokens = min(float(self.burst), self._tokens + (now - self._filled_at) / self.seconds_per_commit)
        self._filled_at = now
        while self._starts and self._starts[0] <= now - self.period:
            self._starts.popleft()
        while self._calls and self._calls[0] <= now - HUB_API_PERIOD:
            self._calls.popleft()

    def wait_seconds(self, final: bool = False) -> float:
        """Seconds until a commit may start (0: now); ``final``: only a running ``Retry-After`` counts."""
        with self._lock:
            now = self._clock()
            self._update(now)
            waits = [self.retry_after.seconds_left()]
            if not final:
                waits.append((1.0 - self._tokens) * self.seconds_per_commit)
                allowed = self.commits - self.reserve
                if len(self._starts) >= allowed:
                    waits.append(self._starts[-allowed] + self.period - now)
                over = len(self._calls) + API_CALLS_PER_COMMIT - HUB_API_CALLS
                if over > 0:
                    waits.append(self._calls[over - 1] + HUB_API_PERIOD - now)
            return max(0.0, *waits)

    def note_commit(self, final: bool = False) -> None:
        """A commit starts now (``final``: the final push, one of the window's ``reserve``: it takes nothing of
        the bucket)."""
        with self._lock:
            now = self._clock()
            self._update(now)
            if not final:
                self._tokens -= 1.0
            self.started += 1
            self._starts.append(now)
            self._calls.extend([now] * API_CALLS_PER_COMMIT)

    def room(self) -> int:
        """Commits the window has left now: ``commits`` less those started (or found on the Hub, :meth:`seed`)
        in the last ``period`` seconds (the final push's ``reserve`` included; 0 when spent)."""
        with self._lock:
            self._update(self._clock())
            return max(0, self.commits - len(self._starts))

    def seed(self, commit_times: Iterable[datetime.datetime], now: Optional[float] = None) -> int:
        """Count the repo's commits of the last ``period`` seconds, made before this process (a run resumed
        within the hour): they fill the window as this process's own would, and the bucket is what it would
        hold after them (replayed from full at the oldest one), so the resume neither bursts nor exceeds the Hub's
        :data:`HUB_COMMITS_PER_HOUR`.

        Args:
            commit_times: the commits' creation times (timezone-aware ``datetime``, e.g.
                ``GitCommitInfo.created_at``), any order; older ones are ignored.
            now: seconds since the epoch that ``commit_times`` are measured against (default: ``time.time()``).

        Returns:
            The commits counted (also :attr:`seeded`).
        """
        wall = time.time() if now is None else float(now)
        # a commit's age on the wall clock, placed on this budget's (monotonic) clock; a Hub clock ahead of
        # this host's gives a negative age: taken as now
        ages = sorted((max(0.0, wall - t.timestamp()) for t in commit_times), reverse=True)
        ages = [a for a in ages if a < self.period]
        with self._lock:
            mono = self._clock()
            tokens, last = float(self.burst), None
            for age in ages:  # oldest first
                at = mono - age
                if last is not None:
                    tokens = min(float(self.burst), tokens + (at - last) / self.seconds_per_commit)
                tokens, last = max(0.0, tokens - 1.0), at
                self._starts.append(at)
                if age < HUB_API_PERIOD:
                    self._calls.extend([at] * API_CALLS_PER_COMMIT)
            if last is not None:
                self._tokens = min(float(self.burst), tokens + (mono - last) / self.seconds_per_commit)
                self._filled_at = mono
            self.seeded = len(ages)
        return len(ages)

    def note_rate_limited(self, retry_after: Optional[float]) -> None:
        """The Hub answered 429: no commit starts before ``retry_after`` seconds from now, and the bucket is empty
        (no paced commit before one interval :attr:`seconds_per_commit` either)."""
        with self._lock:
            self._update(self._clock())
            self.rate_limited += 1
            self._tokens = min(self._tokens, 0.0)
        self.retry_after.note(retry_after)  # the queue noted the same clock; a max, so once or twice is one

    def to_dict(self) -> dict:
        """The push report's ``commit_budget``: ``commits`` per ``period_seconds``, the pacing (``burst`` commits at
        once, then one per ``seconds_per_commit``; ``reserved_for_final`` commits of a window), ``commits_started``
        (this process, every session on the repo) and ``rate_limited`` (429 answers)."""
        return {"commits": self.commits, "period_seconds": self.period, "burst": self.burst,
                "seconds_per_commit": round(self.seconds_per_commit, 3), "reserved_for_final": self.reserve,
                "commits_started": self.started, "rate_limited": self.rate_limited,
                "hub_commits_at_start": self.seeded}


_BUDGETS: Dict[tuple, CommitBudget] = {}
_BUDGETS_LOCK = threading.Lock()


def budget_for(repo_id: str, commits: int, period: float) -> CommitBudget:
    """The process-wide :class:`CommitBudget` of ``repo_id`` on the current endpoint (made on first use).

    Every session and ``hf-tpu push`` of this process that pushes to the repo counts against one budget; the
    Hub counts per repo, whatever the branch. A later call with other numbers makes the budget stricter only.
    """
    key = (endpoint(), repo_id)
    with _BUDGETS_LOCK:
        budget = _BUDGETS.get(key)
        if budget is None or commits / period < budget.commits / budget.period:
            stricter = CommitBudget(commits, period, retry_after=retry_after_for(repo_id))
            if budget is not None:  # what the repo already spent stays spent
                stricter._starts, stricter._calls = budget._starts, budget._calls
                stricter.rate_limited = budget.rate_limited
                stricter.started, stricter.seeded = budget.started, budget.seeded
                stricter._hub_asked = budget._hub_asked
                stricter._tokens = min(stricter._tokens, budget._tokens)
            budget = _BUDGETS[key] = stricter
        return budget


def seed_from_hub(budget: CommitBudget, api, repo_id: str, revision: Optional[str] = None,
                  token: Optional[str] = None) -> Optional[int]:
    """Seed ``budget`` (:meth:`CommitBudget.seed`) from the commits of the last window on the repo's branch.

    One ``HfApi.list_repo_commits`` (huggingface_hub pages through the branch's history itself), once per budget;
    the root commit the Hub made at the repo's creation (:data:`CREATION_COMMIT_TITLE`) is not counted:
    a budget already seeded, or with commits of this process, is left as it is. A Hub fault is not an error: the
    budget starts full and a debug line says why (the Hub's own 429 still paces the run).

    Args:
        budget: the repo's budget (:func:`budget_for`).
        api: a ``huggingface_hub.HfApi`` (or anything with its ``list_repo_commits``).
        repo_id: the full repo id; ``revision``: the branch (default ``main``).
        token: kept out of the debug line.

    Returns:
        The commits counted, or ``None`` (not asked, or the Hub could not tell).
    """
    if budget._hub_asked or budget.started:
        return budget.seeded
    budget._hub_asked = True
    try:
        commits = list(api.list_repo_commits(repo_id, revision=revision))  # newest first, down to the root
        if commits and commits[-1].title == CREATION_COMMIT_TITLE:  # made by create_repo, not a commit call
            commits.pop()
        times = [c.created_at for c in commits]
    except Exception as err:  # any fault of the Hub or the client: plan from a full bucket
        logger.debug("Commit budget of %s starts full: could not list its recent commits (%s).", repo_id,
                     scrub(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", token))
        return None
    return budget.seed(times)


def reset_budgets() -> None:
    """Forget every repo's budget (a test's fresh Hub; never needed in a run)."""
    with _BUDGETS_LOCK:
        _BUDGETS.clear()
    reset_retry_after()
