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
    :mod:`hf_tpu_ext.fill_mask.stats`). ``differs`` is ``p_value < 0.05`` on at least
    :data:`~hf_tpu_ext.fill_mask.stats.MIN_PROBES` facts (lines); :func:`compare_all` corrects it for the number of
    comparisons.

    Returns:
        ``{"a": label_a, "b": label_b, "n": paired probes, "facts": distinct lines among them, "enough": facts >=
        MIN_PROBES, "metrics": {name: {"a", "b", "diff" (b - a), "p_value", "p_below" (p_value is the bound
        1/B), "p_text" ("p=0.031", "p < 0.0005"), "test", "differs"}}, "summary": one line}``.
    """
    key_a = {(ln, t): i for i, (ln, t) in enumerate(zip(result_a.lines, result_a.templates))}
    pairs = [(key_a[(ln, t)], j) for j, (ln, t) in enumerate(zip(result_b.lines, result_b.templates)) if (ln, t) in key_a]
    ia = np.asarray([p[0] for p in pairs], dtype=np.int64)
    ib = np.asarray([p[1] for p in pairs], dtype=np.int64)
    clusters = [result_b.lines[j] for j in ib] if len(set(result_b.templates or [0])) > 1 else None
    facts = len({result_b.lines[j] for j in ib})
    metrics: Dict[str, Dict[str, Any]] = {}
    for name in ("top1", "top5", "mrr", "loglik"):
        va, vb = _per_probe(result_a, name)[ia], _per_probe(result_b, name)[ib]
        if name in ("top1", "top5"):
            test = stats.mcnemar_exact(va > 0.5, vb > 0.5)
            entry = {"test": "McNemar exact", "p_value": test["p_value"], "p_below": False,
                     "only_a": test["only_a"], "only_b": test["only_b"]}
        else:
            test = stats.paired_bootstrap(va, vb, clusters)
            entry = {"test": "paired bootstrap", "p_value": test["p_value"], "p_below": test["p_below"],
                     "low": test["low"], "high": test["high"]}
        a_mean = float(va.mean()) if va.size else float("nan")
        b_mean = float(vb.mean()) if vb.size else float("nan")
        metrics[name] = {"a": a_mean, "b": b_mean, "diff": b_mean - a_mean, **entry,
                         "p_text": stats.format_p(entry["p_value"], entry["p_below"]),
                         "differs": bool(facts >= stats.MIN_PROBES and entry["p_value"] < stats.ALPHA)}
    out = {"a": label_a, "b": label_b, "n": len(pairs), "facts": facts, "enough": facts >= stats.MIN_PROBES,
           "metrics": metrics}
    out["summary"] = _summary(out)
    return out


def _summary(c: Dict[str, Any]) -> str:
    """One line: each difference with its test, p-value (and Holm-adjusted p) and verdict."""
    parts = []
    for name, shown in (("top1", "top-1"), ("mrr", "MRR"), ("loglik", "log-lik")):
        m = c["metrics"][name]
        held = f", Holm over {c['corrected_over']} comparisons {m['p_adjusted_text']}" if "p_adjusted" in m else ""
        verdict = (": a real difference" if m["differs"] else ": within noise") if c["enough"] else ""
        parts.append(f"{shown} {m['diff']:+.3f} ({m['test']} {m['p_text']}{held}{verdict})")
    facts = f" ({c['facts']} facts)" if c["facts"] != c["n"] else ""
    line = f"{c['b']} vs {c['a']} on {c['n']} paired probes{facts}: " + "; ".join(parts)
    if not c["enough"]:
        return line + f": too few probes to call any difference real ({c['facts']} < {stats.MIN_PROBES})."
    return line + "."


def compare_all(results: Sequence, labels: Sequence[str]) -> List[Dict[str, Any]]:
    """:func:`compare` of each revision with the one before it (the order given), Holm-corrected.

    With two or more comparisons each metric's p-values are adjusted over the comparisons (:func:`stats.holm`:
    the chance of calling any of them real by luck stays under 5%); every metric entry then has
    ``"p_adjusted"``, ``"p_adjusted_text"``, and ``differs`` follows the adjusted p-value.
    """
    comparisons = [compare(results[i - 1], results[i], labels[i - 1], labels[i]) for i in range(1, len(results))]
    if len(comparisons) < 2:
        return comparisons
    for name in ("top1", "top5", "mrr", "loglik"):
        entries = [c["metrics"][name] for c in comparisons]
        adjusted = stats.holm([e["p_value"] for e in entries])
        order = sorted(range(len(entries)), key=lambda i: entries[i]["p_value"])
        source = {}  # which p-value's term the running maximum of Holm's step-down came from (a bound stays one)
        best = -1.0
        for rank, i in enumerate(order):
            term = min(1.0, (len(entries) - rank) * entries[i]["p_value"])
            if term >= best:
                best, src = term, i
            source[i] = src
        for i, (e, p) in enumerate(zip(entries, adjusted)):
            below = bool(entries[source[i]]["p_below"]) and p < 1.0
            e.update(p_adjusted=p, p_adjusted_text=stats.format_p(p, below),
                     differs=bool(comparisons[i]["enough"] and p < stats.ALPHA))
    for c in comparisons:
        c["corrected_over"] = len(comparisons)
        c["summary"] = _summary(c)
    return comparisons
