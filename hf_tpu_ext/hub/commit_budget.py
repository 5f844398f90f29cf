"""The commit budget of a repo: the Hub's commit and API quotas, planned so a run never meets them.

The Hub allows 128 commits per hour per repo (:data:`HUB_COMMITS_PER_HOUR`) and 1,000 API requests per 300 s
per token. :class:`CommitBudget` spreads ``commits`` per ``period`` over the window (a token bucket with a
small burst), keeps one commit of the window for the final push, and learns from a 429 (its ``Retry-After``
and an empty bucket). :func:`budget_for` shares one budget per repo among the sessions of a process. The push
session (:mod:`hf_tpu_ext.hub.push_session`) asks it before a save is written.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Callable, Deque, Dict, Optional

from hf_tpu_ext.hub.retry_policy import RetryAfter, reset_retry_after, retry_after_for

#: the Hub's limit: "exceeded the rate limit for repository commits (128 per hour)"
HUB_COMMITS_PER_HOUR = 128
#: the session's default: below the Hub's limit, with room for a second writer (``hf-tpu push``, a resume)
DEFAULT_COMMIT_BUDGET = 100
DEFAULT_BUDGET_PERIOD = 3600.0
#: the Hub's API limit: 1,000 requests per 300 s per token
HUB_API_CALLS, HUB_API_PERIOD = 1000, 300.0
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
                "commits_started": self.started, "rate_limited": self.rate_limited}


_BUDGETS: Dict[tuple, CommitBudget] = {}
_BUDGETS_LOCK = threading.Lock()


def budget_for(repo_id: str, commits: int, period: float) -> CommitBudget:
    """The process-wide :class:`CommitBudget` of ``repo_id`` on the current endpoint (made on first use).

    Every session and ``hf-tpu push`` of this process that pushes to the repo counts against one budget; the
    Hub counts per repo, whatever the branch. A later call with other numbers makes the budget stricter only.
    """
    endpoint = os.environ.get("HF_ENDPOINT", "")
    key = (endpoint, repo_id)
    with _BUDGETS_LOCK:
        budget = _BUDGETS.get(key)
        if budget is None or commits / period < budget.commits / budget.period:
            stricter = CommitBudget(commits, period, retry_after=retry_after_for(repo_id))
            if budget is not None:  # what the repo already spent stays spent
                stricter._starts, stricter._calls = budget._starts, budget._calls
                stricter.rate_limited = budget.rate_limited
                stricter.started = budget.started
                stricter._tokens = min(stricter._tokens, budget._tokens)
            budget = _BUDGETS[key] = stricter
        return budget


def reset_budgets() -> None:
    """Forget every repo's budget (a test's fresh Hub; never needed in a run)."""
    with _BUDGETS_LOCK:
        _BUDGETS.clear()
    reset_retry_after()
