"""The v2 benchmark's gate: can it see? (docs/evaluation-protocol.md, "The v2 pool: design and gate").

Before any sampler other than uniform and the two oracles runs on the v2 pool, the benchmark must show, on
development seeds, that

1. **RL moves the learner**: uniform's held-out score at step 120 is at least 5 points above the initial
   policy's (mean over seeds);
2. **the variance oracle wins**: ``oracle-variance`` minus uniform at the primary horizon (step 40) is at least
   3 points, with its 95 % paired Student-t interval above 0;
3. **a constant is far behind**: the best constant answer scores at least 10 points below uniform at the
   primary horizon (mean over seeds);
4. **coverage has headroom**: uniform covers at most 75 % of the training environments per batch, and
   ``oracle-coverage`` covers at least 26 % more environments per batch than uniform.

:func:`gate` computes every condition from a run's per-step records (``envsched_lab.report.load_records``),
with the per-seed figures behind each.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envsched_lab.stats import paired_difference

__all__ = ["GATE", "gate"]

#: The gate's thresholds and horizons (fixed before the gate ran).
GATE: dict[str, Any] = {"primary_step": 40, "final_step": 120, "rl_gain": 5.0, "oracle_margin": 3.0,
                        "constant_gap": 10.0, "uniform_coverage_max": 0.75, "coverage_gain": 0.26}


def _by_run(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, list[Mapping[str, Any]]]]:
    out: dict[str, dict[int, list[Mapping[str, Any]]]] = defaultdict(dict)
    for r in records:
        out[str(r["sampler"])].setdefault(int(r["seed"]), []).append(r)
    for runs in out.values():
        for recs in runs.values():
            recs.sort(key=lambda r: int(r["step"]))
    return out


def _at(recs: Sequence[Mapping[str, Any]], step: int, key: str = "heldout") -> float:
    return float(recs[step - 1].get(key, math.nan)) if len(recs) >= step else math.nan


def _mean(values: Sequence[float]) -> float:
    arr = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    return float(arr.mean()) if arr.size else math.nan


def gate(records: Sequence[Mapping[str, Any]], *, learner: str = "neural (pool v2)") -> dict[str, Any]:
    """The gate's conditions from per-step records of ``uniform``, ``oracle-variance`` and ``oracle-coverage``
    runs. Each condition: ``value``, ``threshold``, ``met`` (``None`` when the runs cannot decide it: a sampler
    or a horizon is missing), ``per_seed`` and a ``sentence`` naming ``learner``; ``passed`` is true when every
    condition is met."""
    g = GATE
    runs = _by_run(records)
    uni = runs.get("uniform", {})
    ov = runs.get("oracle-variance", {})
    oc = runs.get("oracle-coverage", {})
    t1, t2 = g["primary_step"], g["final_step"]
    out: dict[str, Any] = {"learner": learner, "thresholds": dict(g), "seeds": sorted(uni)}

    def undecided(what: str) -> dict[str, Any]:
        return {"value": math.nan, "met": None, "per_seed": {}, "sentence": f"{what} ({learner})."}

    # 1. RL moves the learner
    gains = {s: _at(r, t2) - float(r[0].get("heldout_initial", math.nan)) for s, r in uni.items()}
    if uni and all(math.isfinite(v) for v in gains.values()):
        v = _mean(list(gains.values()))
        out["rl_moves"] = {"value": v, "threshold": g["rl_gain"], "met": bool(v >= g["rl_gain"]), "per_seed": gains,
                           "sentence": f"uniform's held-out score at step {t2} is {v:+.2f} points above the initial "
                                       f"policy (goal: at least +{g['rl_gain']:g}; {len(gains)} seeds; {learner})."}
    else:
        out["rl_moves"] = undecided(f"uniform runs of {t2} steps are needed")
    # 2. the variance oracle beats uniform at the primary horizon
    a = {s: _at(r, t1) for s, r in ov.items()}
    b = {s: _at(r, t1) for s, r in uni.items()}
    p = paired_difference(a, b)
    if p["n"] >= 2 and math.isfinite(p["low"]):
        met = bool(p["mean"] >= g["oracle_margin"] and p["low"] > 0)
        out["oracle_variance"] = {
            "value": p["mean"], "low": p["low"], "high": p["high"], "n": p["n"], "threshold": g["oracle_margin"],
            "met": met, "per_seed": {s: a[s] - b[s] for s in sorted(set(a) & set(b))},
            "sentence": f"oracle-variance minus uniform at step {t1}: {p['mean']:+.2f} [{p['low']:+.2f}, "
                        f"{p['high']:+.2f}] ({p['n']} paired seeds; goal: at least +{g['oracle_margin']:g} with the "
                        f"95% interval above 0; {learner})."}
    else:
        out["oracle_variance"] = undecided(f"oracle-variance and uniform runs of {t1} steps on 2 or more seeds are "
                                           f"needed")
    # 3. the best constant answer is far behind uniform
    gaps = {s: _at(r, t1) - float(r[0].get("baseline_constant", math.nan)) for s, r in uni.items()}
    if uni and all(math.isfinite(v) for v in gaps.values()):
        v = _mean(list(gaps.values()))
        const = _mean([float(r[0]["baseline_constant"]) for r in uni.values()])
        out["constant"] = {"value": v, "threshold": g["constant_gap"], "met": bool(v >= g["constant_gap"]),
                           "constant": const, "per_seed": gaps,
                           "sentence": f"the best constant answer ({const:.2f}) scores {v:.2f} points below uniform "
                                       f"at step {t1} (goal: at least {g['constant_gap']:g}; {learner})."}
    else:
        out["constant"] = undecided(f"uniform runs of {t1} steps with the constant baselines are needed")
    # 4. coverage headroom
    share = {s: _mean([float(x["envs_covered"]) for x in r]) / float(r[0].get("train_envs", math.nan))
             for s, r in uni.items()}
    if uni and all(math.isfinite(v) for v in share.values()):
        v = _mean(list(share.values()))
        out["uniform_coverage"] = {"value": v, "threshold": g["uniform_coverage_max"],
                                   "met": bool(v <= g["uniform_coverage_max"]), "per_seed": share,
                                   "sentence": f"uniform covers {v:.1%} of the training environments per batch "
                                               f"(goal: at most {g['uniform_coverage_max']:.0%}; {learner})."}
    else:
        out["uniform_coverage"] = undecided("uniform runs are needed")
    cov_u = {s: _mean([float(x["envs_covered"]) for x in r]) for s, r in uni.items()}
    cov_o = {s: _mean([float(x["envs_covered"]) for x in r]) for s, r in oc.items()}
    common = sorted(set(cov_u) & set(cov_o))
    if common:
        rel = {s: cov_o[s] / cov_u[s] - 1 for s in common}
        v = _mean([cov_o[s] for s in common]) / _mean([cov_u[s] for s in common]) - 1
        out["coverage_oracle"] = {"value": v, "threshold": g["coverage_gain"], "met": bool(v >= g["coverage_gain"]),
                                  "per_seed": rel,
                                  "sentence": f"oracle-coverage covers {v:+.1%} environments per batch over uniform "
                                              f"(goal: at least {g['coverage_gain']:+.0%}; {learner})."}
    else:
        out["coverage_oracle"] = undecided("oracle-coverage and uniform runs are needed")
    keys = ("rl_moves", "oracle_variance", "constant", "uniform_coverage", "coverage_oracle")
    mets = [out[k]["met"] for k in keys]
    out["passed"] = None if any(m is None for m in mets) else all(mets)
    return out
