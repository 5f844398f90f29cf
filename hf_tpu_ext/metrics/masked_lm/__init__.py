"""The ``masked_lm`` evaluate metric shipped inside the package (loads offline)."""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_cached = None

METRIC_DIR = os.path.dirname(os.path.abspath(__file__))


def load_masked_lm_metric(cached: bool = True):
    """Load the package's ``masked_lm`` metric with ``evaluate.load`` from its local path (no network).

    Args:
        cached: reuse one loaded module per process (``compute`` resets it, so it can be reused).

    Returns:
        An ``evaluate.EvaluationModule`` with features ``loss_sum`` (float64), ``num_correct`` (int64),
        ``num_tokens`` (int64) and ``compute() -> {eval_loss, perplexity, eval_accuracy, eval_tokens}``.
    """
    global _cached
    import evaluate

    with _lock:
        if cached and _cached is not None:
            return _cached
        metric = evaluate.load(METRIC_DIR, keep_in_memory=True)
        if cached:
            _cached = metric
        return metric


__all__ = ["METRIC_DIR", "load_masked_lm_metric"]
