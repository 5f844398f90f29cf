"""Error bars and paired tests of the test bench (hf_tpu_ext.fill_mask.stats / report) against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hf_tpu_ext.fill_mask import report, stats
from hf_tpu_ext.probes import ProbeResult


def test_wilson_interval_hand_computed():
    # 7 of 10, z = 1.96: center (0.7 + 0.19208) / 1.38415 = 0.64455; half 1.96 * sqrt(0.021 + 0.0009604) / 1.38415
    lo, hi = stats.wilson_interval(7, 10)
    z = stats.Z95
    center = (0.7 + z * z / 20) / (1 + z * z / 10)
    half = z * math.sqrt(0.7 * 0.3 / 10 + z * z / 400) / (1 + z * z / 10)
    assert (lo, hi) == pytest.approx((center - half, center + half), abs=1e-12)
    assert (lo, hi) == pytest.approx((0.396778, 0.892209), abs=1e-6)  # 7/10 worked by hand to 6 places
    assert stats.wilson_interval(0, 20) == pytest.approx((0.0, 0.161125), abs=1e-6)  # not the degenerate [0, 0]
    assert stats.wilson_interval(20, 20) == pytest.approx((0.838875, 1.0), abs=1e-6)
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match=r"successes must be in \[0, n\], got 11 of 10."):
        stats.wilson_interval(11, 10)


def test_bootstrap_interval_matches_a_hand_loop_and_is_reproducible():
    values = np.array([1.0, 0.5, 0.25, 1.0, 0.2, 1 / 3, 1.0, 0.1])
    rng = np.random.default_rng(stats.SEED)  # the documented draw: integers(0, n, (resamples, n)), in chunks of 200
    means = []
    for s in range(0, 500, 200):
        idx = rng.integers(0, len(values), size=(min(200, 500 - s), len(values)))
        means.extend(values[row].mean() for row in idx)
    expected = np.quantile(means, [0.025, 0.975])
    assert stats.bootstrap_interval(values, resamples=500) == pytest.approx(tuple(expected), abs=1e-12)
    assert stats.bootstrap_interval(values) == stats.bootstrap_interval(values)  # fixed seed
    assert stats.bootstrap_interval([0.5] * 12) == (0.5, 0.5)
    lo, hi = stats.bootstrap_interval(values)
    assert lo < values.mean() < hi


def test_cluster_bootstrap_resamples_whole_facts():
    # two templates per fact, identical within a fact: resampling facts gives means of fact values only
    values = [1.0, 1.0, 0.0, 0.0, 0.5, 0.5]
    reps = stats.bootstrap_means(values, clusters=[1, 1, 2, 2, 3, 3], resamples=300)
    assert set(np.round(reps * 6).astype(int)) <= {0, 1, 2, 3, 4, 5, 6}  # (sum of 3 fact values in {0, .5, 1}) / 3
    assert np.allclose(reps * 6, np.round(reps * 6))


def test_mcnemar_exact_hand_computed():
    a = [True] * 10 + [False] * 10
    b = [False] + [True] * 9 + [True] * 9 + [False]  # only A right: 1 (probe 0), only B right: 9 (probes 10-18)
    res = stats.mcnemar_exact(a, b)
    assert (res["only_a"], res["only_b"]) == (1, 9)
    assert res["p_value"] == pytest.approx(2 * (1 + 10) / 1024)  # 0.021484375
    assert stats.mcnemar_exact(a, a)["p_value"] == 1.0
    assert stats.mcnemar_exact([True, False], [False, True])["p_value"] == 1.0  # min(1, 2 * 3/4)
    with pytest.raises(ValueError, match="the same probes: 2 vs 1"):
        stats.mcnemar_exact([True, False], [True])


def _result(ranks, logprobs=None, lines=None, templates=None):
    n = len(ranks)
    r = np.asarray(ranks)
    return ProbeResult(n, float((r <= 1).mean()), float((r <= 5).mean()), float((1 / r).mean()), list(ranks),
                       logprobs=list(logprobs if logprobs is not None else -np.log(r)), chars=[5] * n,
                       num_tokens=[1] * n, lines=list(lines or range(1, n + 1)), templates=list(templates or [0] * n))


def test_paired_test_flags_only_differences_outside_the_noise():
    rng = np.random.default_rng(1)
    base = rng.integers(1, 8, size=60)
    same_ish = base.copy()
    same_ish[:3] = np.where(base[:3] == 1, 2, 1)  # 3 of 60 probes change: noise
    better = np.where(rng.random(60) < 0.6, 1, base)  # 60% of probes now right
    noise = report.compare(_result(base), _result(same_ish), "step 10", "step 20")
    real = report.compare(_result(base), _result(better), "step 10", "step 20")
    assert noise["n"] == real["n"] == 60
    assert not any(m["differs"] for m in noise["metrics"].values())
    assert noise["metrics"]["top1"]["p_value"] >= 0.05 and "within noise" in noise["summary"]
    assert real["metrics"]["top1"]["differs"] and real["metrics"]["mrr"]["differs"]
    assert real["metrics"]["top1"]["test"] == "McNemar exact" and real["metrics"]["mrr"]["test"] == "paired bootstrap"
    assert real["metrics"]["top1"]["diff"] == pytest.approx(float((better <= 1).mean() - (base <= 1).mean()))
    m = real["metrics"]["mrr"]
    assert m["low"] > 0 and m["low"] <= m["diff"] <= m["high"]  # flagged: the paired interval excludes 0
    assert real["summary"].startswith("step 20 vs step 10 on 60 paired probes: top-1 +")
    # the flag agrees with the paired interval of the difference, not with overlapping separate intervals
    ia, ib = report.intervals(_result(base)), report.intervals(_result(better))
    assert ib["mrr"][0] > 0 and ia["mrr"][1] > 0


def test_report_intervals_and_template_spread():
    # 4 facts x 2 templates; template 1 always right, template 2 right for 1 of 4
    ranks = [1, 3, 1, 2, 1, 1, 1, 4]
    res = _result(ranks, lines=[1, 1, 2, 2, 3, 3, 4, 4], templates=[0, 1] * 4)
    rep = report.revision_report(res)
    assert rep["intervals"]["top1"] == pytest.approx(list(stats.wilson_interval(5, 8)))
    assert rep["intervals"]["top5"] == pytest.approx(list(stats.wilson_interval(8, 8)))
    recip = 1 / np.asarray(ranks, dtype=float)
    assert rep["intervals"]["mrr"] == pytest.approx(list(stats.bootstrap_interval(recip, clusters=res.lines)))
    spread = rep["templates"]
    assert spread["templates"] == 2
    assert spread["per_template"] == [{"template": 1, "n": 4, "top1": 1.0, "mrr": 1.0},
                                      {"template": 2, "n": 4, "top1": 0.25, "mrr": pytest.approx((1/3 + 1/2 + 1 + 1/4) / 4)}]
    assert spread["spread"]["top1"] == pytest.approx(0.75)
    assert report.template_spread(_result([1, 2])) is None


def test_bootstrap_p_value_has_the_resolution_of_its_resamples():
    reps = np.array([0.5, 0.2, -0.1, 0.3])
    assert stats.bootstrap_p_value(reps) == (0.5, False)  # 1 of 4 at or below 0: 2 * 1/4
    assert stats.bootstrap_p_value(np.full(2000, 0.001)) == (1 / 2000, True)  # none crosses: p < 1/B, not 0
    res = stats.paired_bootstrap([0.0] * 40, [0.001] * 40)
    assert (res["p_value"], res["p_below"], res["resamples"]) == (0.0005, True, 2000)
    assert stats.format_p(res["p_value"], res["p_below"]) == "p < 0.0005"
    assert stats.format_p(0.03125) == "p=0.0312" and stats.format_p(0.0) == "p < 1e-300"


def test_twelve_probes_moving_by_0_001_are_not_called_real():
    # every probe's reciprocal rank rises from 1/100 to 1/91: MRR +0.001 with no resample crossing 0
    few = report.compare(_result([100] * 12), _result([91] * 12), "main", "step 20")
    m = few["metrics"]["mrr"]
    assert (m["p_value"], m["p_below"], m["differs"]) == (0.0005, True, False) and few["enough"] is False
    assert few["summary"] == ("step 20 vs main on 12 paired probes: top-1 +0.000 (McNemar exact p=1); "
                              "MRR +0.001 (paired bootstrap p < 0.0005); log-lik +0.094 (paired bootstrap p < 0.0005): "
                              "too few probes to call any difference real (12 < 30).")
    assert "p=0 " not in few["summary"] and "p=0)" not in few["summary"]
    enough = report.compare(_result([100] * 30), _result([91] * 30))
    assert enough["enough"] and enough["metrics"]["mrr"]["differs"]  # the same shift on 30 facts is called real


def test_many_revisions_are_holm_corrected():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    base = [2] * 40
    better = [1] * 6 + [2] * 34  # 6 probes right only in B: McNemar p = 2 / 2**6 = 0.03125
    alone = report.compare(_result(base), _result(better))
    assert alone["metrics"]["top1"]["p_value"] == pytest.approx(0.03125) and alone["metrics"]["top1"]["differs"]
    first, second = report.compare_all([_result(base), _result(better), _result(better)], ["s10", "s20", "s30"])
    top1 = first["metrics"]["top1"]
    assert top1["p_adjusted"] == pytest.approx(0.0625) and top1["differs"] is False  # 2 comparisons: 2 x 0.03125
    assert second["metrics"]["top1"]["p_adjusted"] == 1.0
    assert first["summary"].startswith("s20 vs s10 on 40 paired probes: top-1 +0.150 (McNemar exact p=0.0312, "
                                       "Holm over 2 comparisons p=0.0625: within noise); ")
