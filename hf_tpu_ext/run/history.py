"""Log history arithmetic of a run (no I/O): the whole-run training loss, the best metric and its step, and the
final results (``all_results.json``) from the history, the plan and the runtime.

A log history is transformers' ``TrainerState.log_history``: a list of dicts, each with an int ``step`` and
float metrics (``loss``: the mean over the steps since the previous loss entry; ``eval_loss``, ``eval_accuracy``...).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from hf_tpu_ext.backends.base import run_progress, tokens_seen
from hf_tpu_ext.best_metric import BestMetric
from hf_tpu_ext.outputs import last_eval_results


def whole_run_train_loss(log_history: List[Dict[str, Any]], start: int = 0) -> Optional[float]:
    """Mean training loss over all steps of the run, from the log history's window means.

    Each ``{"step": s, "loss": l}`` entry is the mean over the steps since the previous loss entry, so
    ``sum(l_i * (s_i - s_{i-1})) / s_last`` is the mean over every step. Exact across resumes at any step: a
    checkpoint keeps the partial logging window (TensorFlow: ``loss_window`` in its sidecar), so the entry after
    a resume between two logging steps is the mean over the same steps as in an uninterrupted run.
    """
    prev, total, n = start, 0.0, 0
    for e in log_history:
        if "loss" in e and isinstance(e.get("step"), int) and e["step"] > prev:
            total += float(e["loss"]) * (e["step"] - prev)
            n += e["step"] - prev
            prev = e["step"]
    return total / n if n else None


def best_of(log_history: List[Dict[str, Any]], metric: str = "eval_loss", greater_is_better: bool = False):
    """``(best value, its global step)`` of ``metric`` in a log history (``(None, None)`` without one).

    Step 0 (``eval_on_start``) is the untrained baseline and never the best (:mod:`hf_tpu_ext.best_metric`).
    """
    return BestMetric(metric, greater_is_better).best_of(log_history)


def best_metric_of(training_args) -> Tuple[str, bool]:
    """``(log history key, greater_is_better)`` of ``--metric_for_best_model`` (transformers' names;
    ``eval_loss``, lower is better, when unset)."""
    best = BestMetric.from_args(training_args)
    return best.key, best.greater


def run_results(log_history: List[Dict[str, Any]], step: int, plan, runtime: float,
                fit_metrics: Optional[Dict[str, Any]], training_args, passes: Optional[int] = None) -> Dict[str, Any]:
    """The run's final metrics (``all_results.json``; ``None`` values left out).

    Args:
        log_history: the whole run's log history.
        step: the global step reached. plan: the :class:`~hf_tpu_ext.backends.base.RunPlan` (batch, length, epoch).
        runtime: the whole run's training seconds (every process of a resumed run).
        fit_metrics: this process's segment from ``Backend.fit`` (throughput of the steps it ran, trace counts), or
            ``None``.
        training_args: for the evaluation results (the best one with ``load_best_model_at_end``).
        passes: with ``--streaming`` (``plan.streaming``), the passes over the stream completed
            (``Backend.data_passes``): reported as ``stream_passes`` instead of an ``epoch`` (a stream has no length:
            ``step / max_steps`` would be no epoch).

    Returns:
        ``train_loss`` (mean over all steps), ``train_runtime`` (s), ``train_{steps,samples,tokens}_per_second``,
        ``global_step``, ``epoch``, ``tokens_seen``, ``fit_metrics``' other keys, ``segment_train_runtime`` (s),
        ``segment_train_tokens_per_second`` and the last (or best) evaluation's ``eval_*``.
    """
    tokens_per_step = plan.global_batch_size * plan.seq_length
    place = run_progress(plan, step, passes, digits=None)  # epoch, or a stream's passes
    results: Dict[str, Any] = {
        "train_loss": whole_run_train_loss(log_history),
        "train_runtime": runtime,
        "train_steps_per_second": step / runtime if runtime > 0 else None,
        "train_samples_per_second": step * plan.global_batch_size / runtime if runtime > 0 else None,
        "train_tokens_per_second": step * tokens_per_step / runtime if runtime > 0 else None,
        "global_step": step,
        "epoch": place.get("epoch"),
        "tokens_seen": tokens_seen(plan, step),  # every phase's length (a context extension's too)
        "stream_passes": place.get("stream_passes"),
    }
    if fit_metrics:  # this process's segment: throughput of the steps it ran, trace counts
        for k, v in fit_metrics.items():
            if k not in results or (results[k] is None and k not in ("epoch", "stream_passes")):
                results[k] = v
        results["segment_train_runtime"] = fit_metrics.get("train_runtime")
        results["segment_train_tokens_per_second"] = fit_metrics.get("train_tokens_per_second")

    results.update(last_eval_results(log_history, training_args))  # the best one with load_best_model_at_end
    return {k: v for k, v in results.items() if v is not None}
