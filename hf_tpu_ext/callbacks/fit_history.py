"""The log history of a plain Keras ``fit`` (framework-free), for a drop-in push callback's files.

A ``fit`` keeps no ``log_history``: :class:`FitHistory` builds one in transformers' shape (``{"loss", "step",
"epoch"}`` entries and ``{"eval_loss", "perplexity", ...}`` ones) for the checkpoint's ``trainer_state.json``
and the card's ``loss_curve.png``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional

from hf_tpu_ext.hub.model_card import eval_results_from_logs
from hf_tpu_ext.outputs import plot_loss_curve


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
        self._every: Optional[int] = None
        self._batches: List[Dict[str, Any]] = []
        self._epochs: List[tuple] = []

    def on_batch(self, logs: Optional[dict], step: int, steps_per_epoch: Optional[int]) -> None:
        """Sample the batch ``loss`` at global ``step`` (every ``steps_per_epoch / points_per_epoch`` steps; the
        loss is read, a device sync on an asynchronous backend, only at a sampled step)."""
        every = self._every = max(1, int(steps_per_epoch or 0) // self.points_per_epoch) * self._stride
        if step % every:
            return
        loss = _number((logs or {}).get("loss"))
        if loss is not None:
            epoch = step / steps_per_epoch if steps_per_epoch else 0.0
            self._batches.append({"loss": round(loss, 6), "epoch": round(epoch, 4), "step": int(step)})
            if len(self._batches) > self.max_points:
                self._batches, self._stride = self._batches[1::2], self._stride * 2

    def on_epoch(self, logs: Optional[dict], step: int, epoch: float) -> None:
        """Keep the epoch's logs dict itself: callbacks after the push callback (an evaluation) add to it later."""
        self._epochs.append((logs if logs is not None else {}, int(step), float(epoch)))

    @property
    def logging_steps(self) -> Optional[int]:
        """Global steps between the loss samples now (None before the first batch; it doubles when the samples
        are thinned, see ``max_points``)."""
        return self._every

    def entries(self, epoch_numbers: bool = False) -> List[Dict[str, Any]]:
        """The ``log_history``: batch-loss samples, then at each epoch end its evaluation (``val_loss`` or
        ``eval_loss`` as ``eval_loss``, ``perplexity``, ``eval_accuracy``), in step order.

        Args:
            epoch_numbers: the epoch entries also carry every other number of the epoch logs under its Keras
                name (the epoch's mean ``loss``, metrics, throughput), one entry per epoch even without an
                evaluation.
        """
        out = list(self._batches)
        for logs, step, epoch in self._epochs:
            found = {k: round(v, 6) for k, v in eval_results_from_logs(logs).items()}
            if epoch_numbers:
                found = dict({k: round(v, 6) for k, v in ((k, _number(v)) for k, v in logs.items())
                              if v is not None}, **found)
            if found:
                out.append(dict(found, epoch=round(epoch, 4), step=step))
        return sorted(out, key=lambda e: (e["step"], len(e) > 3))

    def eval_steps(self, start_step: int = 0) -> Optional[int]:
        """Global steps between the fit's last two evaluations (from ``start_step``, the fit's first step, to the
        one evaluation when there is one); None without an evaluation."""
        steps = [int(start_step)] + [step for logs, step, _ in self._epochs if eval_results_from_logs(logs)]
        return steps[-1] - steps[-2] if len(steps) > 1 and steps[-1] > steps[-2] else None

    def write_curve(self, folder: str) -> Optional[str]:
        """``folder/loss_curve.png`` (:func:`hf_tpu_ext.outputs.plot_loss_curve`), or None without a loss sample."""
        entries = self.entries()
        if not any("loss" in e for e in entries):
            return None
        try:
            return plot_loss_curve(entries, os.path.join(folder, "loss_curve.png"))
        except ImportError:  # no matplotlib: the card goes without the curve
            return None


def fit_trainer_state(history: FitHistory, *, start_step: int, epochs: Optional[int] = None,
                      save_steps: Optional[int] = None, facts: Optional[Dict[str, Any]] = None,
                      train_runtime: Optional[float] = None, epoch_numbers: bool = False) -> Dict[str, Any]:
    """The ``trainer_state.json`` fields a drop-in push callback knows of a Keras ``fit``, none as a placeholder.

    Args:
        history: the fit's :class:`FitHistory`.
        start_step: the global step the fit began at (a resumed run's optimizer iterations).
        epochs: ``fit``'s ``epochs`` (``num_train_epochs``).
        save_steps: global steps between the push callback's saves (``save_steps``, or steps per epoch).
        facts: the throughput meter's (:func:`hf_tpu_ext.callbacks.throughput_meter.card_facts_of`):
            ``global_batch_size`` (sequences), ``tokens_seen``, ``flops_per_token`` (training FLOPs per token).
        train_runtime: seconds since the fit began.
        epoch_numbers: see :meth:`FitHistory.entries`.

    Returns:
        ``log_history`` and those of ``logging_steps``, ``eval_steps``, ``save_steps``, ``num_train_epochs``,
        ``train_batch_size``, ``num_input_tokens_seen``, ``total_flos`` (``tokens_seen x flops_per_token``) and
        ``train_runtime`` (s) that are known; an unknown one is left out.
    """
    facts = facts or {}
    tokens, fpt = facts.get("tokens_seen"), facts.get("flops_per_token")
    known = {"logging_steps": history.logging_steps, "eval_steps": history.eval_steps(start_step),
             "save_steps": save_steps, "num_train_epochs": epochs, "train_batch_size": facts.get("global_batch_size"),
             "num_input_tokens_seen": int(tokens) if tokens else None,
             "total_flos": float(tokens * fpt) if tokens and fpt else None,
             "train_runtime": round(float(train_runtime), 3) if train_runtime else None}
    return dict({k: v for k, v in known.items() if v}, log_history=history.entries(epoch_numbers=epoch_numbers))


def session_trainer_state(history: FitHistory, session, params: Optional[Dict[str, Any]], start_step: int,
                          facts: Optional[Dict[str, Any]], epoch_numbers: bool = False) -> Dict[str, Any]:
    """:func:`fit_trainer_state` of a drop-in push callback's fit: ``epochs`` and steps per epoch from Keras'
    ``params``, the save interval (:meth:`hf_tpu_ext.callbacks.push_cadence.CallbackSession.save_interval`) and the wall
    time so far (``CallbackSession.measured``) from its ``session``; ``facts``: the throughput meter's, or empty."""
    params = params or {}
    return fit_trainer_state(history, start_step=start_step, epochs=params.get("epochs"), facts=facts,
                             save_steps=session.save_interval(params.get("steps")), epoch_numbers=epoch_numbers,
                             train_runtime=session.measured().get("train_runtime"))
