"""Probe-set figures with 95% intervals, the spread across templates, and paired comparisons of revisions.

Builds on :class:`hf_tpu_ext.probes.ProbeResult` (per-probe ranks and log-probabilities) and
:mod:`hf_tpu_ext.fill_mask.stats`; the page, ``/probe`` and ``hf-tpu probe --json`` show these dicts.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from hf_tpu_ext.fill_mask import stats

ACCURACIES = (("top1", 1), ("top5", 5))
MEANS = ("mrr", "loglik", "loglik_per_char")


def _per_probe(result, metric: str) -> np.ndarray:
    ranks = np.asarray(result.ranks, dtype=np.float64)
    if metric == "mrr":
        return 1.0 / ranks
    if metric == "loglik":
        return np.asarray(result.logprobs, dtype=np.float64)
    if metric == "loglik_per_char":
        return np.asarray(result.logprobs, dtype=np.float64) / np.asarray(result.chars, dtype=np.float64)
    k = dict(ACCURACIES)[metric]
    return (ranks <= k).astype(np.float64)


def intervals(result) -> Dict[str, List[float]]:
    """95% intervals of a result's figures: ``{"top1": [lo, hi], "top5": ..., "mrr": ..., "loglik": ...,
    "loglik_per_char": ...}`` (Wilson for accuracies; bootstrap, resampling facts = lines, for the means)."""
    ranks = np.asarray(result.ranks)
    out: Dict[str, List[float]] = {}
    for name, k in ACCURACIES:
        out[name] = list(stats.wilson_interval(int((ranks <= k).sum()), len(ranks)))
    clusters = result.lines if len(set(result.templates or [0])) > 1 else None
    for name in MEANS:
        out[name] = list(stats.bootstrap_interval(_per_probe(result, name), clusters))
    return out


def template_spread(result) -> Optional[Dict[str, Any]]:
    """Figures per template and their spread, or ``None`` with one template.

    Returns:
        ``{"templates": T, "per_template": [{"template": 1-based index, "n", "top1", "mrr"}], "spread":
        {"top1": max - min, "mrr": max - min}}``; template t counts the lines that have a t-th wording.
    """
    templates = np.asarray(result.templates or [0] * result.n)
    if templates.size == 0 or templates.max() == 0:
        return None
    rows = []
    for t in range(int(templates.max()) + 1):
        sel = templates == t
        rows.append({"template": t + 1, "n": int(sel.sum()),
                     "top1": float(_per_probe(result, "top1")[sel].mean()),
                     "mrr": float(_per_probe(result, "mrr")[sel].mean())})
    spread = {m: max(r[m] for r in rows) - min(r[m] for r in rows) for m in ("top1", "mrr")}
    return {"templates": len(rows), "per_template": rows, "spread": spread}


def revision_report(result) -> Dict[str, Any]:
    """``result.as_dict()`` plus ``"intervals"`` (:func:`intervals`) and ``"templates"`` (:func:`template_spread`)."""
    return {**result.as_dict(), "intervals": intervals(result), "templates": template_spread(result)}


def compare(result_a, result_b, label_a: str = "A", label_b: str = "B") -> Dict[str, Any]:
    """Paired comparison of two revisions on the probes both scored (matched by line and template).

    top-1/top-5: McNemar's exact test; MRR and log-likelihood: paired bootstrap of the mean difference (both in
    :mod:`hf_tpu_ext.fill_mask.stats`). ``differs`` is ``p_value < 0.05``.

    Returns:
        ``{"a": label_a, "b": label_b, "n": paired probes, "metrics": {name: {"a", "b", "diff" (b - a),
        "p_value", "test", "differs"}}, "summary": one line}``.
    """
    key_a = {(ln, t): i for i, (ln, t) in enumerate(zip(result_a.lines, result_a.templates))}
    pairs = [(key_a[(ln, t)], j) for j, (ln, t) in enumerate(zip(result_b.lines, result_b.templates)) if (ln, t) in key_a]
    ia = np.asarray([p[0] for p in pairs], dtype=np.int64)
    ib = np.asarray([p[1] for p in pairs], dtype=np.int64)
    clusters = [result_b.lines[j] for j in ib] if len(set(result_b.templates or [0])) > 1 else None
    metrics: Dict[str, Dict[str, Any]] = {}
    for name in ("top1", "top5", "mrr", "loglik"):
        va, vb = _per_probe(result_a, name)[ia], _per_probe(result_b, name)[ib]
        if name in ("top1", "top5"):
            test = stats.mcnemar_exact(va > 0.5, vb > 0.5)
            entry = {"test": "McNemar exact", "p_value": test["p_value"], "only_a": test["only_a"],
                     "only_b": test["only_b"]}
        else:
            test = stats.paired_bootstrap(va, vb, clusters)
            entry = {"test": "paired bootstrap", "p_value": test["p_value"], "low": test["low"], "high": test["high"]}
        a_mean = float(va.mean()) if va.size else float("nan")
        b_mean = float(vb.mean()) if vb.size else float("nan")
        metrics[name] = {"a": a_mean, "b": b_mean, "diff": b_mean - a_mean, **entry,
                         "differs": bool(va.size and entry["p_value"] < stats.ALPHA)}
    parts = []
    for name, shown in (("top1", "top-1"), ("mrr", "MRR"), ("loglik", "log-lik")):
        m = metrics[name]
        verdict = "a real difference" if m["differs"] else "within noise"
        parts.append(f"{shown} {m['diff']:+.3f} ({m['test']} p={m['p_value']:.3g}: {verdict})")
    summary = f"{label_b} vs {label_a} on {len(pairs)} paired probes: " + "; ".join(parts) + "."
    return {"a": label_a, "b": label_b, "n": len(pairs), "metrics": metrics, "summary": summary}


def compare_all(results: Sequence, labels: Sequence[str]) -> List[Dict[str, Any]]:
    """:func:`compare` of each revision with the one before it (the order given)."""
    return [compare(results[i - 1], results[i], labels[i - 1], labels[i]) for i in range(1, len(results))]
