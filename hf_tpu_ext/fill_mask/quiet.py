"""A quiet server terminal: library progress bars, deprecation notices and per-request warnings off.

A request to the demo used to print Starlette's ``HTTP_422_UNPROCESSABLE_ENTITY`` deprecation warning (raised
inside Gradio's routes, nothing a user can change), a Hub model printed ``Fetching N files`` bars, and
transformers printed its TensorFlow deprecation notice; :func:`quiet_libraries` turns these off unless a
``--log_level`` of ``debug`` or ``info`` asks for them.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Optional

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
