"""Which Hub errors a push retries, and for how long (the policy of :class:`~hf_tpu_ext.hub.push_queue.PushQueue`).

Retried: connection errors, timeouts, HTTP 5xx and 429, with exponential backoff (at most
:data:`MAX_BACKOFF_SECONDS`) unless the Hub sent ``Retry-After`` (seconds or an HTTP date, honoured up to
:data:`MAX_RETRY_AFTER_SECONDS`); a 2xx whose body cannot be read is a lost reply (the commit may have landed).
"""

from __future__ import annotations

import email.utils
import json
import time
from typing import Optional

from hf_tpu_ext.hub.preflight import transport_errors

MAX_BACKOFF_SECONDS = 60.0
# a Retry-After above this is cut to it: a run must not sleep for hours on one header
MAX_RETRY_AFTER_SECONDS = 300.0


def _status(err: BaseException) -> Optional[int]:
    return getattr(getattr(err, "response", None), "status_code", None)


def is_retryable(err: BaseException) -> bool:
    """True for errors worth retrying: connection errors, timeouts, HTTP 5xx and 429."""
    if isinstance(err, transport_errors()):
        return True
    status = _status(err)
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


def _is_unreadable_reply(err: BaseException) -> bool:
    """An ``upload_folder`` that got a 2xx it could not read (empty body, no ``commitUrl``)."""
    if isinstance(err, (KeyError, json.JSONDecodeError)):
        return True
    return type(err).__name__ == "JSONDecodeError"  # requests' own (may derive from simplejson's)


def _describe(err: BaseException) -> str:
    status = _status(err)
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"HTTP {status}: {first}" if status is not None else first
