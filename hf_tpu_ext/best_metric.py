"""The best evaluation of a run: which metric, which direction, which entry wins -- the one definition.

transformers' ``metric_for_best_model`` / ``greater_is_better``: the metric named is mapped to the evaluation key
compared (:data:`hf_tpu_ext.args.BEST_METRICS`; ``eval_loss`` when unset); a loss (and perplexity, its
exponential) is always minimised, any other metric maximised when ``greater_is_better``. Step 0
(``eval_on_start``) is the untrained baseline and never the best; a non-finite value never wins; of equal values
the first wins. Read by both training loops, the run's trainer state, the run files and the push session.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Iterable, Optional, Tuple

from hf_tpu_ext.args import BEST_METRICS


@dataclasses.dataclass(frozen=True)
class BestMetric:
    """The comparison of one run.

    Attributes:
        key: the log-entry key compared (``eval_loss``, ``eval_accuracy``).
        greater: whether a larger value is better (never for ``eval_loss``).
    """

    key: str = "eval_loss"
    greater: bool = False

    @classmethod
    def from_args(cls, training_args) -> "BestMetric":
        """From ``metric_for_best_model`` (default ``loss``) and ``greater_is_better`` of the training arguments."""
        key = BEST_METRICS[getattr(training_args, "metric_for_best_model", None) or "loss"]
        return cls(key, bool(getattr(training_args, "greater_is_better", None)) and key != "eval_loss")

    def better(self, value: Any, than: Optional[float]) -> bool:
        """Whether ``value`` (a number or None) beats ``than`` (None: nothing yet); non-finite values never do."""
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        return than is None or (value > than if self.greater else value < than)

    def best_of(self, log_history: Iterable[Dict[str, Any]]) -> Tuple[Optional[float], Optional[int]]:
        """``(best value, its global step)`` in a log history; ``(None, None)`` without an evaluation past step 0."""
        entry = self.best_entry(log_history)
        return (None, None) if entry is None else (float(entry[self.key]), entry.get("step"))

    def best_entry(self, log_history: Iterable[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        """The log entry holding the best value (the first of equals), or None."""
        best = None
        for entry in log_history:
            if entry.get("step") and self.better(entry.get(self.key), None if best is None else best[self.key]):
                best = entry
        return best


class BestTracker:
    """The best so far of one training loop: :meth:`offer` each evaluation.

    Args:
        metric: the run's :class:`BestMetric`.
        value, step: the best already known (restored history), or None.
    """

    def __init__(self, metric: BestMetric, value: Optional[float] = None, step: Optional[int] = None):
        self.metric, self.value, self.step = metric, value, step

    @property
    def key(self) -> str:
        return self.metric.key

    def offer(self, metrics: Dict[str, float], step: int) -> bool:
        """True (and kept) when ``metrics[key]`` at global ``step`` (> 0) is the best so far."""
        value = metrics.get(self.metric.key)
        if step <= 0 or not self.metric.better(value, self.value):
            return False
        self.value, self.step = float(value), int(step)
        return True
