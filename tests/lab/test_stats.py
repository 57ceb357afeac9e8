"""The protocol's statistics: Holm, TOST, the minimum detectable effect and the verdicts, against values
computed here by other means (hand arithmetic, scipy's one-sample tests, the noncentral t distribution)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from envsched_lab.stats import compare, holm, minimum_detectable_effect, paired, tost


def test_holm_matches_the_step_down_by_hand() -> None:
    # sorted 0.01, 0.03, 0.04 -> x3, x2, x1 = 0.03, 0.06, 0.04 -> monotone 0.03, 0.06, 0.06
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})


def test_holm_equals_statsmodels_on_random_families_with_ties(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from statsmodels.stats.multitest import multipletests

    # statsmodels runs gc.collect() on every call (about 0.9 s each late in a full test session); it changes no value
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    rng = np.random.default_rng(0)
    for trial in range(200):
        m = int(rng.integers(1, 12))
        p = rng.uniform(0, 0.2 if trial % 2 else 1.0, size=m)
        if m > 2:
            p[1] = p[0]  # a tie
            p[2] = 1.0 if trial % 3 == 0 else p[2]
        names = [f"t{i}" for i in range(m)]
        ours = holm(dict(zip(names, p, strict=True)))
        theirs = multipletests(p, method="holm")[1]
        assert [ours[k] for k in names] == pytest.approx(theirs.tolist(), abs=1e-15)


def test_holm_leaves_nan_out_of_the_family() -> None:
    adjusted = holm({"a": 0.01, "b": math.nan, "c": 0.04})
    assert math.isnan(adjusted["b"])
    assert adjusted["a"] == pytest.approx(0.02) and adjusted["c"] == pytest.approx(0.04)


def test_paired_keeps_common_finite_seeds_in_order() -> None:
    x, y, seeds = paired({3: 1.0, 1: 2.0, 2: math.nan, 7: 4.0}, {1: 0.5, 2: 1.0, 3: 0.0})
    assert seeds == [1, 3] and x.tolist() == [2.0, 1.0] and y.tolist() == [0.5, 0.0]


def test_tost_equals_the_larger_of_two_one_sided_tests() -> None:
    rng = np.random.default_rng(7)
    b = rng.normal(50, 3, size=12)
    d = rng.normal(0.3, 0.8, size=12)
    a = b + d
    margin = 1.0
    lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
    got = tost(dict(enumerate(a)), dict(enumerate(b)), margin)
    assert got == pytest.approx(max(lower, upper), rel=1e-9)


def test_tost_refuses_a_margin_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="margin"):
        tost({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}, 0.0)


@pytest.mark.parametrize("n", [5, 20, 40])
def test_minimum_detectable_effect_has_the_stated_power(n: int) -> None:
    sd = 2.5
    mde = minimum_detectable_effect(sd, n, alpha=0.05, power=0.8)
    # power of a two-sided paired t-test at that effect, from the noncentral t distribution
    nc = mde / sd * math.sqrt(n)
    crit = stats.t.ppf(0.975, n - 1)
    power = stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc)
    assert power == pytest.approx(0.8, abs=1e-4)
    # and the rule of thumb of the reference: (t_{1-a/2} + t_{1-b}) sd / sqrt(n), close for these n
    rough = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
    assert mde == pytest.approx(rough, rel=0.06)


def test_minimum_detectable_effect_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="n must be"):
        minimum_detectable_effect(1.0, 1)
    with pytest.raises(ValueError, match="sd must be"):
        minimum_detectable_effect(math.nan, 10)


@pytest.mark.slow
def test_verdicts_better_worse_equivalent_not_detected() -> None:
    rng = np.random.default_rng(3)
    seeds = range(20)
    method = {s: 50.0 + rng.normal(0, 1) for s in seeds}
    noise = {s: rng.normal(0, 0.3) for s in seeds}
    baselines = {
        "much_worse": {s: method[s] - 5.0 + noise[s] for s in seeds},   # method better
        "much_better": {s: method[s] + 5.0 + noise[s] for s in seeds},  # method worse
        "same": {s: method[s] + noise[s] for s in seeds},               # equivalent within 1
        "noisy": {s: method[s] + 0.5 + rng.normal(0, 6) for s in seeds},  # undecided
    }
    out = compare(method, baselines, margin=1.0)
    assert out["much_worse"].verdict == "better" and out["much_worse"].mean == pytest.approx(5.0, abs=0.3)
    assert out["much_better"].verdict == "worse"
    assert out["same"].verdict == "equivalent"
    assert out["noisy"].verdict == "not detected"
    # Holm: the adjusted p-values are never below the raw ones, and the interval brackets the mean
    for c in out.values():
        assert c.p_holm >= c.p and c.low <= c.mean <= c.high and c.n == 20


@pytest.mark.slow
def test_an_interval_crossing_zero_is_not_called_a_tie() -> None:
    # 5 seeds, differences around 0 with spread 2: crosses zero, far too wide for a margin of 0.5
    method = {s: 10.0 + d for s, d in enumerate([1.5, -2.0, 0.5, 2.5, -1.8])}
    base = {s: 10.0 for s in range(5)}
    c = compare(method, {"b": base}, margin=0.5)["b"]
    assert c.low < 0 < c.high
    assert c.verdict == "not detected"
