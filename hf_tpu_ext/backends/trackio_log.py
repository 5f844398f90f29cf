"""``--report_to trackio`` for the backends that run their own loop (TensorFlow, Keras): one owner of how a run
starts a trackio project and what a log entry sends.

Example:
    >>> tracker = init_trackio(training_args, model_args)   # on the chief only
    >>> log_entry(tracker, {"step": 10, "loss": 6.2, "learning_rate": 1e-3})
    >>> tracker.finish()
"""

from __future__ import annotations

import os
from typing import Any, Dict


def init_trackio(args, model_args):
    """``trackio.init`` with a local project named after ``output_dir`` and the run's sanitized arguments as the
    config (no token: :meth:`TrainingArguments.to_sanitized_dict`); returns the ``trackio`` module.

    Raises:
        ImportError: trackio is not installed (``--report_to`` checks that before anything runs).
    """
    import trackio

    trackio.init(project=os.path.basename(os.path.abspath(args.output_dir)),
                 config={**args.to_sanitized_dict(), "model_name_or_path": model_args.model_name_or_path})
    return trackio


def log_entry(tracker, entry: Dict[str, Any]) -> None:
    """Send one log-history entry's numbers (``step`` as trackio's step; strings and None left out)."""
    if tracker is None:
        return
    tracker.log({k: v for k, v in entry.items() if k != "step" and isinstance(v, (int, float))
                 and not isinstance(v, bool)}, step=int(entry["step"]))
