"""A quiet server terminal: library progress bars, deprecation notices and per-request warnings off.

A request to the demo used to print Starlette's ``HTTP_422_UNPROCESSABLE_ENTITY`` deprecation warning (raised
inside Gradio's routes, nothing a user can change), a Hub model printed ``Fetching N files`` bars, and
transformers printed its TensorFlow deprecation notice; :func:`quiet_libraries` turns these off unless a
``--log_level`` of ``debug`` or ``info`` asks for them. :func:`quieted` does the same for a ``with`` block and
restores the libraries' settings afterwards (``hf-tpu demo`` runs in the caller's process).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Iterator, Optional

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
ANALYTICS_ENV = "GRADIO_ANALYTICS_ENABLED"


def ignore_request_warnings() -> None:
    """Ignore Starlette's deprecation warning about ``HTTP_422_UNPROCESSABLE_ENTITY``, which Gradio's routes
    trigger on every queued request (two lines each; nothing a user of the demo can change)."""
    warnings.filterwarnings("ignore", message=r".*HTTP_422_UNPROCESSABLE_ENTITY.*")


def quiet_libraries(log_level: Optional[str] = None) -> None:
    """Set library verbosity for a demo server.

    Always: Gradio analytics off unless ``GRADIO_ANALYTICS_ENABLED`` is set (its requests would go to the
    analytics host from a Space or an offline machine), and the per-request Starlette deprecation warning
    ignored. Unless ``log_level`` is ``"debug"``/``"info"``: huggingface_hub's download bars and transformers'
    progress bars off, transformers' logging at ``error`` (its TensorFlow deprecation notice), Python
    ``FutureWarning``/``DeprecationWarning`` from transformers and huggingface_hub ignored.

    Args:
        log_level: one of :data:`LOG_LEVELS` or ``None`` (= ``warning``); also sets the ``hf_tpu_ext`` logger.

    Raises:
        ValueError: an unknown level.
    """
    level = (log_level or "warning").lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"Unknown log level {log_level!r}; use one of: {', '.join(LOG_LEVELS)}.")
    os.environ.setdefault(ANALYTICS_ENV, "False")
    ignore_request_warnings()
    logging.getLogger("hf_tpu_ext").setLevel(level.upper())
    if level in ("debug", "info"):
        return
    for module in ("transformers", "huggingface_hub"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # an old huggingface_hub: bars stay
        pass
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


@contextlib.contextmanager
def quieted(log_level: Optional[str] = None) -> Iterator[None]:
    """:func:`quiet_libraries` for the duration of a ``with`` block, then every setting it changed restored.

    Restored on exit (also when the block raises): huggingface_hub's and transformers' progress bars,
    transformers' verbosity, the ``warnings`` filters, ``GRADIO_ANALYTICS_ENABLED`` and the ``hf_tpu_ext``
    logger's level. ``hf-tpu demo`` runs in the caller's process (a notebook, a test, ``cli.main``): quieting it
    must not leave the bars of a later ``hf-tpu push`` or download off.

    Raises:
        ValueError: an unknown level (nothing changed).
    """
    hub_bars_were_off = tf_verbosity = tf_bars_were_on = None
    try:
        from huggingface_hub.utils import are_progress_bars_disabled

        hub_bars_were_off = are_progress_bars_disabled()
    except ImportError:
        pass
    try:
        from transformers.utils import logging as hf_logging

        tf_verbosity, tf_bars_were_on = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    except ImportError:
        pass
    analytics = os.environ.get(ANALYTICS_ENV)
    own_level = logging.getLogger("hf_tpu_ext").level
    try:
        with warnings.catch_warnings():
            quiet_libraries(log_level)
            yield
    finally:
        logging.getLogger("hf_tpu_ext").setLevel(own_level)
        if analytics is None:
            os.environ.pop(ANALYTICS_ENV, None)
        if hub_bars_were_off is False:
            from huggingface_hub.utils import enable_progress_bars

            enable_progress_bars()
        if tf_verbosity is not None:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity(tf_verbosity)
            if tf_bars_were_on:
                hf_logging.enable_progress_bar()
