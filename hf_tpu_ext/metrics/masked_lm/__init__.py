"""The ``masked_lm`` evaluate metric shipped inside the package (loads offline)."""

from __future__ import annotations

import os
import threading
from typing import Dict

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


def metric_keys(prefix: str = "eval_") -> Dict[str, str]:
    """Log key per result of the ``masked_lm`` metric for a prefix.

    With the default ``"eval_"`` the keys are transformers' ``run_mlm`` names: ``eval_loss``,
    ``perplexity``, ``eval_accuracy``, ``eval_tokens``; another prefix ``p`` gives ``p + "loss"``,
    ``p + "perplexity"``, ``p + "accuracy"``, ``p + "tokens"``.
    """
    return {
        "eval_loss": prefix + "loss",
        "perplexity": "perplexity" if prefix == "eval_" else prefix + "perplexity",
        "eval_accuracy": prefix + "accuracy",
        "eval_tokens": prefix + "tokens",
    }


__all__ = ["METRIC_DIR", "load_masked_lm_metric", "metric_keys"]
