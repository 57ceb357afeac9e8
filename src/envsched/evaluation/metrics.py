"""Scores of an evaluation, computed from its episode records.

Outcome classes are kept apart (RFC 013, latest revision):

* **scored** episodes -- ``success``, ``failure``, ``limit`` (turn limit hit: the environment's score,
  else 0) and ``policy_error`` (malformed answer: reward 0, not solved) -- are the only ones in
  ``success_rate``, ``mean_reward`` and ``pass@k``;
* ``unscored`` (the environment returned ``None``) is reported as ``unscored_rate``;
* ``infra_error`` (connection lost, capacity reached, timeouts, after all retries) as ``infra_error_rate``;
* ``error_rate`` = (``policy_error`` + ``error``) / episodes: harness and parse failures, to be read with
  ``mean_reward`` (a drop in reward that comes with a rise in ``error_rate`` is a format problem).

Rates of outcome classes are over all episodes; ``success_rate`` and ``mean_reward`` over scored ones.
Standard errors: ``success_rate_se = sqrt(p (1 - p) / n)`` (binomial, ``n`` scored episodes);
``mean_*_se`` = sample standard deviation / sqrt(n). Beside the RFC's standard error, ``success_rate_ci``
is the 95% Wilson score interval (:func:`wilson_interval`, from ``scipy.stats.binomtest``), which keeps a
non-zero width at a success rate of 0 or 1, where the binomial standard error is 0. Episodes of the same task are not
independent when ``samples_per_task > 1``; the binomial error then understates the uncertainty across tasks.

``pass@k`` is the unbiased estimator ``1 - C(n - c, k) / C(n, k)`` per problem (a task and seed with
``n`` scored samples, ``c`` of them successes), averaged over the problems with ``n >= k``.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from envsched.evaluation.records import OUTCOMES, EpisodeRecord
from envsched.validation import check_int, check_number

__all__ = ["binomial_se", "breakdown", "mean_and_se", "pass_at_k", "per_task", "report", "reproducibility_check",
           "score_records", "wilson_interval"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: ``1 - C(n - c, k) / C(n, k)`` (``n`` samples, ``c`` correct)."""
    n, c, k = check_int(n, "n"), check_int(c, "c"), check_int(k, "k")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def binomial_se(p: float, n: int) -> float:
    """Standard error of a proportion ``p`` estimated from ``n`` trials (``nan`` when ``n`` is 0)."""
    return math.sqrt(p * (1.0 - p) / n) if n > 0 else math.nan


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion (``scipy.stats.binomtest(...).proportion_ci``).

    Unlike ``p +- z * se`` it is never of zero width for ``0 < n``: with 0 successes in 10 trials it is
    about ``(0, 0.28)``. ``(nan, nan)`` when ``n`` is 0."""
    successes, n = check_int(successes, "successes"), check_int(n, "n")
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    check_number(confidence, "confidence", low=0, high=1, low_open=True, high_open=True)
    if n == 0:
        return math.nan, math.nan
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample std with ddof=1 / sqrt(n)); ``nan`` where undefined."""
    if not values:
        return math.nan, math.nan
    arr = np.asarray(values, dtype=float)
    se = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else math.nan
    return float(arr.mean()), se


def score_records(records: Iterable[EpisodeRecord], *, success_threshold: float = 1.0,
                  max_k: int | None = None) -> dict[str, Any]:
    """The scores of a set of episodes (see the module docstring)."""
    recs = list(records)
    total = len(recs)
    counts = dict.fromkeys(OUTCOMES, 0)
    for r in recs:
        counts[r.outcome] += 1
    scored = [r for r in recs if r.scored]
    rewards = [float(r.reward) for r in scored if r.reward is not None]
    successes = sum(r >= success_threshold for r in rewards)
    p = successes / len(scored) if scored else math.nan
    mean_reward, mean_reward_se = mean_and_se(rewards)
    ran = [r for r in recs if r.outcome not in ("infra_error",)]
    mean_turns, mean_turns_se = mean_and_se([r.turns for r in ran])
    tokens = [r.completion_tokens for r in ran if r.completion_tokens is not None]
    mean_tokens, mean_tokens_se = mean_and_se(tokens)
    out: dict[str, Any] = {
        "episodes": total,
        "scored": len(scored),
        "successes": int(successes),
        "success_rate": p,
        "success_rate_se": binomial_se(p, len(scored)) if scored else math.nan,
        "success_rate_ci": list(wilson_interval(int(successes), len(scored))),
        "mean_reward": mean_reward,
        "mean_reward_se": mean_reward_se,
        "mean_turns": mean_turns,
        "mean_turns_se": mean_turns_se,
        "mean_completion_tokens": mean_tokens,
        "mean_completion_tokens_se": mean_tokens_se,
        "total_completion_tokens": int(sum(tokens)),
        "total_prompt_tokens": int(sum(r.prompt_tokens for r in ran if r.prompt_tokens is not None)),
        "unscored_rate": counts["unscored"] / total if total else math.nan,
        "infra_error_rate": counts["infra_error"] / total if total else math.nan,
        "error_rate": (counts["policy_error"] + counts["error"]) / total if total else math.nan,
        "outcomes": counts,
    }
    for name in ("unscored_rate", "infra_error_rate", "error_rate"):
        out[name + "_se"] = binomial_se(out[name], total) if total else math.nan
    if max_k:
        problems: dict[tuple[str, Any], list[bool]] = defaultdict(list)
        for r in scored:
            problems[(r.task_id, r.seed)].append(float(r.reward) >= success_threshold)
        for k in range(1, max_k + 1):
            vals = [pass_at_k(len(v), sum(v), k) for v in problems.values() if len(v) >= k]
            out[f"pass@{k}"] = float(np.mean(vals)) if vals else math.nan
            out[f"pass@{k}_problems"] = len(vals)
    return out


def breakdown(records: Iterable[EpisodeRecord], key: Callable[[EpisodeRecord], Any], *,
              success_threshold: float = 1.0) -> dict[str, dict[str, Any]]:
    """:func:`score_records` per value of ``key(record)`` (records whose key is ``None`` are left out)."""
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for r in records:
        k = key(r)
        if k is not None:
            groups[str(k)].append(r)
    return {k: score_records(v, success_threshold=success_threshold) for k, v in sorted(groups.items())}


def per_task(records: Iterable[EpisodeRecord], *, success_threshold: float = 1.0) -> dict[str, dict[str, Any]]:
    """Per task id: counts, success rate and an ``outcome``: ``pass`` when at least half of its scored
    episodes succeed, ``fail`` otherwise, ``unscored`` / ``infra_error`` / ``error`` when none is scored
    (the most frequent of those)."""
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for r in records:
        groups[r.task_id].append(r)
    out = {}
    for tid, recs in sorted(groups.items()):
        scored = [r for r in recs if r.scored]
        succ = sum(float(r.reward) >= success_threshold for r in scored)
        if scored:
            rate = succ / len(scored)
            outcome = "pass" if rate >= 0.5 else "fail"
        else:
            rate = math.nan
            kinds = [r.outcome for r in recs]
            outcome = max(("unscored", "infra_error", "error"), key=kinds.count)
        first = recs[0]
        out[tid] = {"outcome": outcome, "episodes": len(recs), "scored": len(scored), "successes": int(succ),
                    "success_rate": rate,
                    "mean_reward": float(np.mean([r.reward for r in scored])) if scored else math.nan,
                    "env": first.env, "group": first.group, "difficulty": first.difficulty}
    return out


def report(records: Iterable[EpisodeRecord], *, success_threshold: float = 1.0,
           max_k: int | None = None) -> dict[str, Any]:
    """Every score of an evaluation from its episode records: ``scores`` (:func:`score_records`),
    ``per_task``, ``by_env``, ``by_group`` and ``by_difficulty``. Both envsched's ``EvalHarness`` and the
    RFC's ``EnvEvalHarness`` score through this one function."""
    recs = list(records)
    thr = success_threshold
    return {
        "scores": score_records(recs, success_threshold=thr, max_k=max_k),
        "per_task": per_task(recs, success_threshold=thr),
        "by_env": breakdown(recs, lambda r: r.env, success_threshold=thr),
        "by_group": breakdown(recs, lambda r: r.group, success_threshold=thr),
        "by_difficulty": breakdown(recs, lambda r: r.difficulty, success_threshold=thr),
    }


def reproducibility_check(first_observation: Callable[[], Any], task: Mapping[str, Any], seed: int | None, *,
                          what: str = "resets") -> dict[str, Any]:
    """RFC 013 D4: call ``first_observation()`` twice (each time on a fresh environment or session for
    ``task`` and ``seed``) and compare SHA-256 hashes of the two. A mismatch warns and records
    ``reproducible: false``; a failure records ``reproducible: None`` and the error. It covers the first
    observation only. Both harnesses run it before an evaluation."""
    hashes: list[str] = []
    try:
        for _ in range(2):
            blob = json.dumps(first_observation(), sort_keys=True, default=repr, separators=(",", ":"))
            hashes.append(hashlib.sha256(blob.encode()).hexdigest())
    except Exception as exc:
        return {"reproducible": None, "task_id": task.get("id"), "seed": seed,
                "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    ok = hashes[0] == hashes[1]
    if not ok:
        warnings.warn(f"two fresh {what} of task {task.get('id')!r} with seed {seed} gave different first "
                      "observations: the environment is not reproducible", RuntimeWarning, stacklevel=3)
    return {"reproducible": ok, "task_id": task.get("id"), "split": task.get("split"), "index": task.get("index"),
            "seed": seed, "hashes": hashes}
