"""Which Hub errors a push retries, and for how long (the policy of :class:`~hf_tpu_ext.hub.push_queue.PushQueue`).

Retried: connection errors, timeouts, HTTP 5xx and 429, with exponential backoff (at most
:data:`MAX_BACKOFF_SECONDS`) unless the Hub sent ``Retry-After`` (seconds or an HTTP date, honoured up to
:data:`MAX_RETRY_AFTER_SECONDS`); a 2xx whose body cannot be read is a lost reply (the commit may have landed).

A ``Retry-After`` holds for the repo, not for one upload: :class:`RetryAfter` is its one clock, one per repo in a
process (:func:`retry_after_for`), read by the push queue (an upload waits it out) and the commit budget (no save
is admitted before it).

huggingface_hub's own retry lines in a push worker are held back (:class:`HubLinesFilter`): the push says its
retries once, in its own words.
"""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import time
from typing import Callable, Dict, Optional

from hf_tpu_ext.console import HUB_RETRY_LOGGER, is_hub_retry_line
from hf_tpu_ext.hub.preflight import endpoint, scrub, transport_errors

logger = logging.getLogger("hf_tpu_ext.hub")

MAX_BACKOFF_SECONDS = 60.0
# a Retry-After above this is cut to it: a run must not sleep for hours on one header
MAX_RETRY_AFTER_SECONDS = 300.0


def status_of(err: BaseException) -> Optional[int]:
    """The HTTP status of a Hub error's response (``None``: no response, e.g. a connection error)."""
    return getattr(getattr(err, "response", None), "status_code", None)


def is_retryable(err: BaseException) -> bool:
    """True for errors worth retrying: connection errors, timeouts, HTTP 5xx and 429."""
    if isinstance(err, transport_errors()):
        return True
    status = status_of(err)
    return status is not None and (status >= 500 or status == 429)


def retry_after_seconds(err: BaseException, now: Optional[float] = None) -> Optional[float]:
    """The wait the Hub asked for in ``Retry-After`` (seconds or HTTP date), capped; ``None`` when absent.

    Args:
        err: an HTTP error with a ``response`` (requests or httpx).
        now: the current time (seconds since the epoch) for an HTTP-date value (default: ``time.time()``).

    Returns:
        Seconds in ``[0, MAX_RETRY_AFTER_SECONDS]``, or ``None`` (no header, or a value that is neither).
    """
    headers = getattr(getattr(err, "response", None), "headers", None)
    value = headers.get("Retry-After") if headers is not None else None
    if not value:
        return None
    value = str(value).strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def is_unreadable_reply(err: BaseException) -> bool:
    """An ``upload_folder`` that got a 2xx it could not read (empty body, no ``commitUrl``)."""
    if isinstance(err, (KeyError, json.JSONDecodeError)):
        return True
    return type(err).__name__ == "JSONDecodeError"  # requests' own (may derive from simplejson's)


def describe(err: BaseException) -> str:
    """One line about a failed Hub call for a log or report: its status and the first line of its message (the
    caller scrubs the token)."""
    status = status_of(err)
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"HTTP {status}: {first}" if status is not None else first


class RetryAfter:
    """The Hub's ``Retry-After`` of one repo: no commit starts before it ends. Thread-safe.

    Args:
        clock: seconds, monotonic (tests pass a fake).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._until = 0.0

    def note(self, seconds: Optional[float]) -> None:
        """The Hub asked for ``seconds`` (``None``/0: nothing asked): no commit before then (a later, shorter
        ``Retry-After`` never shortens a running one)."""
        if seconds:
            with self._lock:
                self._until = max(self._until, self._clock() + float(seconds))

    def seconds_left(self) -> float:
        """Seconds until commits may start again (0: now)."""
        with self._lock:
            return max(0.0, self._until - self._clock())


_CLOCKS: Dict[tuple, RetryAfter] = {}
_CLOCKS_LOCK = threading.Lock()


def retry_after_for(repo_id: str, repo_type: str = "model") -> RetryAfter:
    """The process-wide :class:`RetryAfter` of ``repo_id`` on the current endpoint (made on first use)."""
    key = (endpoint(), repo_type, repo_id)
    with _CLOCKS_LOCK:
        return _CLOCKS.setdefault(key, RetryAfter())


def reset_retry_after() -> None:
    """Forget every repo's ``Retry-After`` (a test's fresh Hub; never needed in a run)."""
    with _CLOCKS_LOCK:
        _CLOCKS.clear()


class HubLinesFilter(logging.Filter):
    """huggingface_hub's own lines in a push worker (a ``hf-tpu-push-*`` thread of
    :class:`~hf_tpu_ext.hub.push_queue.PushQueue`), held back: the queue says them in its words.

    - "No files have been modified since last commit": :attr:`seen` tells the queue, which logs its own line.
    - its retry loop's lines (``Retrying in 1s [Retry 1/5].``, ``HTTP Error 503 thrown while requesting ...``,
      :func:`hf_tpu_ext.console.is_hub_retry_line`): the first of a push is said once as
      ``Push 'msg': the Hub did not answer (HTTP Error 503); retrying.``, the others not at all.

    Every other record, and every record of another thread, passes.
    """

    def __init__(self):
        super().__init__()
        self._local = threading.local()

    @property
    def seen(self) -> bool:
        return getattr(self._local, "seen", False)

    @seen.setter
    def seen(self, value: bool) -> None:
        self._local.seen = value

    def start(self, commit_message: str, token: Optional[str]) -> None:
        """A push of ``commit_message`` starts in this thread: its first retry line is said (``token`` scrubbed)."""
        self._local.push, self._local.token, self._local.said = commit_message, token, False

    def filter(self, record: logging.LogRecord) -> bool:
        if not threading.current_thread().name.startswith("hf-tpu-push-"):
            return True
        if str(record.msg).startswith("No files have been modified"):
            self.seen = True
            return False
        if not is_hub_retry_line(record):
            return True
        if not getattr(self._local, "said", True):
            self._local.said = True
            text = record.getMessage()
            cause = (text.split(" thrown while requesting ")[0].strip("'") if " thrown while requesting " in text
                     else "rate limited" if text.startswith("Rate limited") else "no answer")
            logger.warning("Push %r: the Hub did not answer (%s); retrying.", self._local.push,
                           scrub(cause, self._local.token))
        return False


HUB_LINES = HubLinesFilter()
# < 1.0 / >= 1.0 (the no-changes warning), and the retry loop of both
for _name in ("huggingface_hub.hf_api", "huggingface_hub._upload_pipeline", HUB_RETRY_LOGGER):
    logging.getLogger(_name).addFilter(HUB_LINES)
