"""Statistics of the evaluation protocol: paired differences, Holm correction, equivalence tests, power.

Every comparison of the benchmark is *paired*: two samplers run on the same seeds (same learner
initialisation, same split, same reward noise stream), and the unit of analysis is the per-seed difference.
The protocol (``docs/evaluation-protocol.md``) fixes, before the numbers are seen:

* one primary endpoint, tested for EnvSched against each baseline; the family of those p-values is corrected
  with Holm's step-down method (:func:`holm`);
* "equivalent" only from two one-sided tests within a margin stated in advance (:func:`tost`), never from an
  interval that crosses zero, which is "not detected";
* the minimum detectable effect at the number of seeds used, from a pilot's standard deviation of paired
  differences (:func:`minimum_detectable_effect`).

The maths is scipy's and statsmodels' (``scipy.stats.ttest_rel``, ``statsmodels.stats.multitest``,
``statsmodels.stats.weightstats.ttost_paired``, ``statsmodels.stats.power.TTestPower``); this module only
pairs the runs by seed and names the verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats

from envsched.validation import check_int, check_number

__all__ = ["Comparison", "compare", "describe", "holm", "minimum_detectable_effect", "paired", "paired_difference",
           "tost"]

Verdict = Literal["better", "worse", "equivalent", "not detected"]


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The values of ``a`` and ``b`` on the seeds both have (finite in both), in seed order."""
    seeds = sorted(s for s in set(a) & set(b) if math.isfinite(a[s]) and math.isfinite(b[s]))
    return (np.array([a[s] for s in seeds], dtype=float), np.array([b[s] for s in seeds], dtype=float), seeds)


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values of a family of tests: the ``i``-th smallest of ``m`` times ``m - i``, made monotone
    by a running maximum and capped at 1 (what statsmodels' ``multipletests(method="holm")`` returns; a test
    compares the two on random families with ties). Computed here because that function runs a full
    ``gc.collect()`` on every call, 0.2-1 s in a process holding a trained model, and a report makes dozens.

    NaN p-values (a comparison with too few seeds) stay NaN and do not count in the family.
    """
    names = [k for k, p in p_values.items() if math.isfinite(p)]
    out = {k: math.nan for k in p_values}
    if names:
        p = np.array([p_values[k] for k in names], dtype=float)
        order = np.argsort(p, kind="stable")
        steps = np.arange(p.size, 0, -1, dtype=float)
        adjusted = np.empty_like(p)
        adjusted[order] = np.minimum(np.maximum.accumulate(p[order] * steps), 1.0)
        out.update({k: float(a) for k, a in zip(names, adjusted, strict=True)})
    return out


def tost(a: Mapping[int, float], b: Mapping[int, float], margin: float) -> float:
    """p-value of two one-sided paired t-tests that ``a - b`` lies within ``(-margin, +margin)``.

    Small means equivalent within the margin (statsmodels' ``ttost_paired``). NaN with fewer than 2 pairs.
    """
    if not (isinstance(margin, int | float) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"the equivalence margin must be a finite number > 0, got {margin!r}")
    from statsmodels.stats.weightstats import ttost_paired

    x, y, _ = paired(a, b)
    if x.size < 2:
        return math.nan
    if np.ptp(x - y) == 0.0:  # no spread: the difference is known exactly
        return 0.0 if abs(float((x - y)[0])) < margin else 1.0
    p, _, _ = ttost_paired(x, y, -margin, margin)
    return float(p)


def minimum_detectable_effect(sd: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest true mean paired difference a two-sided paired t-test at level ``alpha`` detects with
    probability ``power`` over ``n`` seeds, given the standard deviation ``sd`` of per-seed differences."""
    sd = check_number(sd, "sd", low=0)
    n = check_int(n, "n", low=2)
    if sd == 0:
        return 0.0
    from statsmodels.stats.power import TTestPower

    d = TTestPower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided")
    return float(d) * sd


@dataclass(frozen=True)
class Comparison:
    """One paired comparison ``method - baseline`` on the primary endpoint."""

    baseline: str
    n: int
    mean: float
    sd: float
    low: float
    high: float
    p: float
    p_holm: float
    p_equivalence: float
    p_equivalence_holm: float
    margin: float
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(method: Mapping[int, float], baselines: Mapping[str, Mapping[int, float]], *, margin: float,
            alpha: float = 0.05, level: float = 0.95) -> dict[str, Comparison]:
    """Compare ``method`` with each baseline (per-seed values): paired t-test, Holm over the baselines,
    TOST within ``margin`` (also Holm-corrected over the baselines), and a verdict.

    The verdict is "better" or "worse" when the Holm-adjusted p-value is below ``alpha`` (the sign of the mean
    difference decides which), else "equivalent" when the Holm-adjusted TOST p-value is below ``alpha``, else
    "not detected". ``low``/``high`` are the unadjusted ``level`` Student-t interval of the mean difference.
    """
    raw: dict[str, dict[str, float]] = {}
    for name, values in baselines.items():
        x, y, _ = paired(method, values)
        d = x - y
        n = int(d.size)
        mean = float(d.mean()) if n else math.nan
        sd = float(d.std(ddof=1)) if n > 1 else math.nan
        if n > 1 and sd > 0:
            p = float(stats.ttest_rel(x, y).pvalue)
            half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
        elif n > 1:  # identical differences on every seed
            p = 0.0 if mean != 0 else 1.0
            half = 0.0
        else:
            p, half = math.nan, math.nan
        raw[name] = {"n": n, "mean": mean, "sd": sd, "low": mean - half, "high": mean + half, "p": p,
                     "p_eq": tost(method, values, margin) if n > 1 else math.nan}
    p_holm = holm({k: v["p"] for k, v in raw.items()})
    eq_holm = holm({k: v["p_eq"] for k, v in raw.items()})
    out: dict[str, Comparison] = {}
    for name, r in raw.items():
        verdict: Verdict
        if math.isfinite(p_holm[name]) and p_holm[name] < alpha and r["mean"] != 0:
            verdict = "better" if r["mean"] > 0 else "worse"
        elif math.isfinite(eq_holm[name]) and eq_holm[name] < alpha:
            verdict = "equivalent"
        else:
            verdict = "not detected"
        out[name] = Comparison(baseline=name, n=int(r["n"]), mean=r["mean"], sd=r["sd"], low=r["low"],
                               high=r["high"], p=r["p"], p_holm=p_holm[name], p_equivalence=r["p_eq"],
                               p_equivalence_holm=eq_holm[name], margin=float(margin), verdict=verdict)
    return out


def describe(comparisons: Sequence[Comparison], endpoint: str = "held-out score") -> list[str]:
    """One sentence per comparison, for reports."""
    lines = []
    for c in comparisons:
        lines.append(f"{endpoint}: EnvSched - {c.baseline} = {c.mean:+.2f} [{c.low:+.2f}, {c.high:+.2f}] over "
                     f"{c.n} seeds, Holm p = {c.p_holm:.3g}, TOST(+-{c.margin:g}) Holm p = "
                     f"{c.p_equivalence_holm:.3g}: {c.verdict}")
    return lines


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95) -> dict[str, Any]:
    """Paired difference ``a - b`` over the seeds both have: mean, Student-t interval at ``level``, n.

    ``significant`` is true when the interval excludes 0. With one seed the interval is unbounded (NaN)."""
    seeds = sorted(set(a) & set(b))
    diffs = np.array([a[k] - b[k] for k in seeds], dtype=float)
    diffs = diffs[~np.isnan(diffs)]
    n = int(diffs.size)
    if n == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "n": 0, "significant": False}
    mean = float(diffs.mean())
    if n < 2:
        return {"mean": mean, "low": math.nan, "high": math.nan, "n": n, "significant": False}
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * diffs.std(ddof=1) / math.sqrt(n))
    low, high = mean - half, mean + half
    return {"mean": mean, "low": low, "high": high, "n": n, "significant": bool(low > 0 or high < 0)}
