"""Error bars for probe-set figures and a paired test between two revisions; numpy and the stdlib only.

* Accuracies (top-1, top-5): Wilson score interval (Wilson, JASA 1927), closed form, good at small n and at
  0 or 1 where the normal interval collapses.
* Means (MRR, log-likelihood): percentile bootstrap (Efron & Tibshirani 1993), :data:`RESAMPLES` resamples
  from a generator seeded with :data:`SEED`, so the same scores always give the same interval. Resampled by
  fact (a probe line with all its templates) when a line has several templates: wordings of one fact are not
  independent draws.
* Two revisions on the same probes: McNemar's exact test (two-sided binomial on the probes only one revision
  gets right; McNemar 1947) for accuracies, and a paired bootstrap of the mean difference for MRR and
  log-likelihood; pairing removes the probe-to-probe variance both revisions share, so it is sharper than
  comparing the two separate intervals. A bootstrap p-value has the resolution of its B resamples: when none
  crosses 0 it is reported as "p < 1/B" (:func:`format_p`), never 0.
* What counts as a real difference (:func:`fill_mask.report.compare`): p < :data:`ALPHA` after a Holm
  correction when several revisions are compared (:func:`holm`), and at least :data:`MIN_PROBES` independent
  probes (facts); below that nothing is called real (the percentile bootstrap is anti-conservative on a handful
  of probes: 12 probes that all move the same tiny way give p < 1/B).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal: a two-sided 95% interval
SEED = 0
RESAMPLES = 2000
ALPHA = 0.05
MIN_PROBES = 30  # fewer independent probes (facts) than this: no difference is called real
_CHUNK = 200  # resamples drawn at once (memory: _CHUNK x clusters int64)


def wilson_interval(successes: int, n: int, z: float = Z95) -> Tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n``.

    ``(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)``.

    Returns:
        ``(low, high)`` in [0, 1]; ``(0.0, 1.0)`` for ``n == 0``.

    Raises:
        ValueError: ``successes`` outside ``[0, n]``.
    """
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n], got {successes} of {n}.")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at 0 or n the bound is exactly 0 or 1 (rounding would leave 1e-18 and put the estimate outside)
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def _cluster_sums(values: np.ndarray, clusters: Optional[Sequence]) -> Tuple[np.ndarray, np.ndarray]:
    if clusters is None:
        return values.astype(np.float64), np.ones(len(values), dtype=np.float64)
    keys, inverse = np.unique(np.asarray(clusters), return_inverse=True)
    sums = np.bincount(inverse, weights=values, minlength=len(keys))
    counts = np.bincount(inverse, minlength=len(keys)).astype(np.float64)
    return sums, counts


def bootstrap_means(values: Sequence[float], clusters: Optional[Sequence] = None, resamples: int = RESAMPLES,
                    seed: int = SEED) -> np.ndarray:
    """Bootstrap replicates of the mean of ``values``.

    Each replicate draws ``C`` clusters with replacement (``C`` = number of clusters; every value is its own
    cluster when ``clusters`` is ``None``) with ``numpy.random.default_rng(seed).integers(0, C, (resamples, C))``
    (drawn in chunks of 200 rows, the same numbers) and takes the mean of the drawn clusters' values.

    Returns:
        float64 ``[resamples]``.
    """
    sums, counts = _cluster_sums(np.asarray(values, dtype=np.float64), clusters)
    rng = np.random.default_rng(seed)
    out = np.empty(resamples, dtype=np.float64)
    for s in range(0, resamples, _CHUNK):
        idx = rng.integers(0, len(sums), size=(min(_CHUNK, resamples - s), len(sums)))
        out[s: s + len(idx)] = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    return out


def bootstrap_interval(values: Sequence[float], clusters: Optional[Sequence] = None, resamples: int = RESAMPLES,
                       seed: int = SEED, level: float = 0.95) -> Tuple[float, float]:
    """Percentile bootstrap interval of the mean (see :func:`bootstrap_means`).

    Returns:
        ``(low, high)``: the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the replicates (numpy's
        linear interpolation); ``(nan, nan)`` for no values.
    """
    if len(values) == 0:
        return float("nan"), float("nan")
    reps = bootstrap_means(values, clusters, resamples, seed)
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def mcnemar_exact(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> Dict[str, float]:
    """McNemar's exact test on paired right/wrong outcomes of the same probes.

    With ``b`` = probes only A gets right and ``c`` = only B, the p-value is
    ``min(1, 2 · P(X <= min(b, c)))`` for ``X ~ Binomial(b + c, 1/2)``.

    Returns:
        ``{"only_a": b, "only_b": c, "p_value": float}`` (``p_value`` 1.0 when ``b + c == 0``).

    Raises:
        ValueError: the two sequences differ in length.
    """
    a, b_ = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    if a.shape != b_.shape:
        raise ValueError(f"paired outcomes need the same probes: {a.shape[0]} vs {b_.shape[0]}.")
    only_a, only_b = int((a & ~b_).sum()), int((~a & b_).sum())
    m = only_a + only_b
    if m == 0:
        return {"only_a": 0, "only_b": 0, "p_value": 1.0}
    tail = sum(math.comb(m, i) for i in range(min(only_a, only_b) + 1)) / 2 ** m
    return {"only_a": only_a, "only_b": only_b, "p_value": min(1.0, 2 * tail)}


def paired_bootstrap(values_a: Sequence[float], values_b: Sequence[float], clusters: Optional[Sequence] = None,
                     resamples: int = RESAMPLES, seed: int = SEED) -> Dict[str, float]:
    """Paired bootstrap of ``mean(b) - mean(a)`` over the same probes (the same resampled probes for both).

    Returns:
        ``{"diff": mean(b - a), "low", "high": 95% percentile interval of the difference, "p_value": see
        :func:`bootstrap_p_value`, "p_below": True when ``p_value`` is the bound 1/B, "resamples": B}``.

    Raises:
        ValueError: the two sequences differ in length.
    """
    a, b = np.asarray(values_a, dtype=np.float64), np.asarray(values_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired values need the same probes: {a.shape[0]} vs {b.shape[0]}.")
    if a.size == 0:
        return {"diff": float("nan"), "low": float("nan"), "high": float("nan"), "p_value": 1.0, "p_below": False,
                "resamples": resamples}
    reps = bootstrap_means(b - a, clusters, resamples, seed)
    lo, hi = np.quantile(reps, [ALPHA / 2, 1 - ALPHA / 2])
    p, below = bootstrap_p_value(reps)
    return {"diff": float((b - a).mean()), "low": float(lo), "high": float(hi), "p_value": p, "p_below": below,
            "resamples": int(reps.size)}


def bootstrap_p_value(replicates: Sequence[float]) -> Tuple[float, bool]:
    """Two-sided p-value of "the mean difference is 0" from bootstrap replicates of it, at their resolution.

    ``p = min(1, 2 · k / B)`` with ``k`` = the fewer of the replicates ``<= 0`` and ``>= 0``. When ``k == 0`` (no
    replicate crosses 0) the B resamples only say ``p < 1/B``: the result is ``(1/B, True)``, never 0.

    Returns:
        ``(p, below)``: ``below`` True when ``p`` is the bound ``1/B``.
    """
    reps = np.asarray(replicates, dtype=np.float64)
    k = min(int((reps <= 0).sum()), int((reps >= 0).sum()))
    if k == 0:
        return 1.0 / reps.size, True
    return min(1.0, 2.0 * k / reps.size), False


def holm(p_values: Sequence[float]) -> List[float]:
    """Holm's step-down adjusted p-values (Holm, Scand. J. Statist. 1979): control the chance of any false
    "real difference" among m tests. Sorted ascending, the i-th smallest (0-based) gets ``(m - i) · p``, made
    non-decreasing, at most 1.

    Returns:
        The adjusted p-values in the order given.
    """
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted


def format_p(p: float, below: bool = False) -> str:
    """``"p=0.031"`` (3 significant digits), or ``"p < 0.0005"`` for a bound (``below``); never ``"p=0"``."""
    if below:
        return f"p < {p:.2g}"
    if p <= 0:  # an exact test underflowing to 0: say how small, not 0
        return "p < 1e-300"
    return f"p={p:.3g}"
