"""The log history of a plain Keras ``fit`` (framework-free), for a drop-in push callback's files.

A ``fit`` keeps no ``log_history``: :class:`FitHistory` builds one in transformers' shape (``{"loss", "step",
"epoch"}`` entries and ``{"eval_loss", "perplexity", ...}`` ones) for the checkpoint's ``trainer_state.json``
and the card's ``loss_curve.png``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional


def _number(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:  # a 0-d tensor/array
            value = float(value)
        except (TypeError, ValueError):
            return None
    value = float(value)
    return value if math.isfinite(value) else None


class FitHistory:
    """Training loss samples and per-epoch logs of a ``fit``.

    Args:
        points_per_epoch: about how many batch-loss samples per epoch (Keras' batch ``loss`` is the mean over the
            epoch's batches so far, so the curve is that running mean).
        max_points: the samples kept over the whole fit (beyond it every other one is dropped and the sampling
            interval doubles: memory stays flat however long the fit is).
    """

    def __init__(self, points_per_epoch: int = 50, max_points: int = 4096):
        self.points_per_epoch = max(1, int(points_per_epoch))
        self.max_points = max(2, int(max_points))
        self._stride = 1
        self._batches: List[Dict[str, Any]] = []
        self._epochs: List[tuple] = []

    def on_batch(self, logs: Optional[dict], step: int, steps_per_epoch: Optional[int]) -> None:
        """Sample the batch ``loss`` at global ``step`` (every ``steps_per_epoch / points_per_epoch`` steps)."""
        every = max(1, int(steps_per_epoch or 0) // self.points_per_epoch) * self._stride
        loss = _number((logs or {}).get("loss"))
        if loss is not None and step % every == 0:
            epoch = step / steps_per_epoch if steps_per_epoch else 0.0
            self._batches.append({"loss": round(loss, 6), "epoch": round(epoch, 4), "step": int(step)})
            if len(self._batches) > self.max_points:
                self._batches, self._stride = self._batches[1::2], self._stride * 2

    def on_epoch(self, logs: Optional[dict], step: int, epoch: float) -> None:
        """Keep the epoch's logs dict itself: callbacks after the push callback (an evaluation) add to it later."""
        self._epochs.append((logs if logs is not None else {}, int(step), float(epoch)))

    def entries(self) -> List[Dict[str, Any]]:
        """The ``log_history``: batch-loss samples, then at each epoch end its evaluation (``val_loss`` or
        ``eval_loss`` as ``eval_loss``, ``perplexity``, ``eval_accuracy``), in step order."""
        from hf_tpu_ext.hub.model_card import eval_results_from_logs

        out = list(self._batches)
        for logs, step, epoch in self._epochs:
            found = eval_results_from_logs(logs)
            if found:
                out.append(dict({k: round(v, 6) for k, v in found.items()}, epoch=round(epoch, 4), step=step))
        return sorted(out, key=lambda e: (e["step"], "loss" not in e))

    def write_curve(self, folder: str) -> Optional[str]:
        """``folder/loss_curve.png`` (:func:`hf_tpu_ext.outputs.plot_loss_curve`), or None without a loss sample."""
        from hf_tpu_ext.outputs import plot_loss_curve

        entries = self.entries()
        if not any("loss" in e for e in entries):
            return None
        try:
            return plot_loss_curve(entries, os.path.join(folder, "loss_curve.png"))
        except ImportError:  # no matplotlib: the card goes without the curve
            return None
