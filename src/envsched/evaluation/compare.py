"""Compare two evaluations of checkpoints: which tasks were fixed, which regressed, which were left out,
and how much each metric moved relative to its standard error."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from envsched.evaluation.harness import EvalResult, read_result_json
from envsched.validation import is_number

__all__ = ["COMPARED_METRICS", "EvalComparison", "as_eval_result", "compare_eval_results"]

#: Metrics whose change is reported, each with the key of its standard error.
COMPARED_METRICS = ("success_rate", "mean_reward", "mean_turns", "mean_completion_tokens", "unscored_rate",
                    "infra_error_rate", "error_rate")
Z_SIGNIFICANT = 1.96


@dataclass
class EvalComparison:
    """``fixed``: tasks that failed before and pass after; ``regressed``: the reverse; ``left_out``: task
    id -> why it is not compared (missing on a side, or no scored episode on a side); ``deltas``: per
    metric ``{before, after, delta, se, z, note}`` (``se`` combines both standard errors)."""

    fixed: list[str]
    regressed: list[str]
    unchanged_pass: list[str]
    unchanged_fail: list[str]
    left_out: dict[str, str]
    deltas: dict[str, dict[str, Any]] = field(default_factory=dict)
    pass_at_k: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"fixed": self.fixed, "regressed": self.regressed, "unchanged_pass": self.unchanged_pass,
                "unchanged_fail": self.unchanged_fail, "left_out": self.left_out,
                "deltas": {k: {kk: (vv if not isinstance(vv, float) or math.isfinite(vv) else None)
                               for kk, vv in v.items()} for k, v in self.deltas.items()},
                "pass_at_k": self.pass_at_k}


def as_eval_result(obj: Any) -> EvalResult:
    """envsched's ``EvalResult``, OpenEnv's ``EvalResult`` (from ``EnvEvalHarness.run_from_config``), the
    scores dict ``EnvEvalHarness.run`` returns, either's dict, or a path to either's ``result.json``."""
    if isinstance(obj, EvalResult):
        return obj
    if hasattr(obj, "scores") and hasattr(obj, "config") and isinstance(obj.scores, Mapping):
        return _from_scores(obj.scores)  # openenv.core.evals.EvalResult
    if isinstance(obj, Mapping):
        if obj.get("format") is None and isinstance(obj.get("scores"), Mapping) and "config" in obj:
            return _from_scores(obj["scores"])  # an OpenEnv EvalResult as a dict
        if obj.get("format") is None and "per_task" in obj:
            return _from_scores(obj)  # EnvEvalHarness.run's scores
        return EvalResult.from_dict(obj)
    if isinstance(obj, str | os.PathLike):
        return as_eval_result(read_result_json(obj))
    raise TypeError(f"expected an EvalResult (envsched's or OpenEnv's), its dict, EnvEvalHarness.run's scores "
                    f"or a path to result.json, got {type(obj).__name__}")


def _from_scores(scores: Mapping[str, Any]) -> EvalResult:
    if not isinstance(scores.get("per_task"), Mapping):
        raise ValueError("these scores have no per_task outcomes: not an RFC 013 evaluation result")
    return EvalResult(scores=dict(scores), per_task=dict(scores["per_task"]), by_env=dict(scores.get("by_env") or {}),
                      by_group=dict(scores.get("by_group") or {}),
                      by_difficulty=dict(scores.get("by_difficulty") or {}),
                      reproducible=scores.get("reproducible"),
                      reproducibility=dict(scores.get("reproducibility") or {}), config={})


def _num(x: Any) -> float:
    return float(x) if is_number(x, numpy=False) else math.nan


def compare_eval_results(before: Any, after: Any) -> EvalComparison:
    """Compare ``before`` and ``after``: envsched or OpenEnv ``EvalResult``s, ``EnvEvalHarness.run``'s
    scores, their dicts, or paths to a ``result.json`` (or its folder) written by either harness.

    A task is compared only when both sides scored it (per-task outcome ``pass`` or ``fail``); every other
    task is listed in ``left_out`` with the reason. A metric's change is ``significant`` when
    ``|delta| >= 1.96 * sqrt(se_before**2 + se_after**2)``; without standard errors the note says so.
    """
    b, a = as_eval_result(before), as_eval_result(after)
    fixed, regressed, same_pass, same_fail = [], [], [], []
    left_out: dict[str, str] = {}
    for tid in sorted(set(b.per_task) | set(a.per_task)):
        pb, pa = b.per_task.get(tid), a.per_task.get(tid)
        if pb is None or pa is None:
            left_out[tid] = "missing before" if pb is None else "missing after"
            continue
        ob, oa = pb.get("outcome"), pa.get("outcome")
        if ob not in ("pass", "fail") or oa not in ("pass", "fail"):
            side = [f"{name}: {o}" for name, o in (("before", ob), ("after", oa)) if o not in ("pass", "fail")]
            left_out[tid] = "not scored (" + ", ".join(side) + ")"
            continue
        {("fail", "pass"): fixed, ("pass", "fail"): regressed, ("pass", "pass"): same_pass,
         ("fail", "fail"): same_fail}[(ob, oa)].append(tid)
    deltas = {}
    for m in COMPARED_METRICS:
        vb, va = _num(b.scores.get(m)), _num(a.scores.get(m))
        sb, sa = _num(b.scores.get(m + "_se")), _num(a.scores.get(m + "_se"))
        delta = va - vb
        se = math.sqrt(sb**2 + sa**2) if math.isfinite(sb) and math.isfinite(sa) else math.nan
        if not math.isfinite(delta):
            note = "not comparable (missing on a side)"
            z = math.nan
        elif not math.isfinite(se) or se == 0:
            z = math.nan
            note = "no change" if delta == 0 else "no standard error: significance unknown"
        else:
            z = delta / se
            note = (f"significant ({'up' if delta > 0 else 'down'}, |z|={abs(z):.2f} >= {Z_SIGNIFICANT})"
                    if abs(z) >= Z_SIGNIFICANT else f"within noise (|z|={abs(z):.2f} < {Z_SIGNIFICANT})")
        deltas[m] = {"before": vb, "after": va, "delta": delta, "se": se, "z": z,
                     "significant": bool(math.isfinite(z) and abs(z) >= Z_SIGNIFICANT), "note": note}
    pak = {}
    for key in sorted(set(b.scores) & set(a.scores)):
        if key.startswith("pass@") and not key.endswith("_problems"):
            pak[key] = {"before": _num(b.scores[key]), "after": _num(a.scores[key]),
                        "delta": _num(a.scores[key]) - _num(b.scores[key])}
    return EvalComparison(fixed, regressed, same_pass, same_fail, left_out, deltas, pak)
