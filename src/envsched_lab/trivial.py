"""Trivial baselines shown beside every score: what a policy that reads nothing would get.

A learner that barely beats a constant has learned an output prior, not skills
(``shared/reference/evaluation-statistics.md``, "Trivial baselines"). For a set of evaluated tasks:

* **best constant answer**: the one string that, given to every task, scores highest; chosen with the
  evaluated tasks' answers in view, so it bounds every constant policy from above;
* **per-environment mode**: in each environment, the string that scores highest on its training tasks (its
  most common training answer; a held-out environment, which has none, takes the best string over all its
  tasks), given to every evaluated task of the environment: what a policy that reads only the environment's
  name learns from the training pool.

Scores are mean rewards x 100 under the tasks' own verifiers (:meth:`FamilyPool.reward`). The candidate
strings are every answer of the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["constant_baselines"]


def _reward_matrix(fpool: Any, positions: np.ndarray, candidates: list[str]) -> np.ndarray:
    """Reward of each candidate answer on each task: ``(len(positions), len(candidates))``."""
    col = {c: j for j, c in enumerate(candidates)}
    out = np.zeros((positions.size, len(candidates)))
    for r, p in enumerate(positions.tolist()):
        ans = fpool.answers[p]
        if ans is not None:
            j = col.get(ans)
            if j is not None:
                out[r, j] = 1.0
        else:
            out[r] = [fpool.reward(p, c) for c in candidates]
    return out


def constant_baselines(fpool: Any, positions: Sequence[int] | np.ndarray, train: Sequence[int] | np.ndarray,
                       parts: dict[str, Sequence[int] | np.ndarray] | None = None) -> dict[str, Any]:
    """``constant`` and ``env_mode`` (x100) over ``positions``, ``constant_answer`` (the best constant), and
    the same two figures over each named subset in ``parts`` (``constant_{name}``, ``env_mode_{name}``).

    An environment's mode is the answer that scores best on its training tasks (``train``), ties to the first
    candidate in sorted order; an environment without training tasks (a held-out environment) takes the answer
    that scores best on all its tasks in the pool (an upper bound)."""
    pos = np.asarray(positions, dtype=np.int64)
    candidates = sorted({a for a in fpool.answers if a is not None})
    if not candidates or pos.size == 0:
        return {"constant": float("nan"), "env_mode": float("nan"), "constant_answer": None}
    envs = np.asarray(fpool.pool.env_codes)
    train = np.asarray(train, dtype=np.int64)
    mode_of: dict[int, int] = {}
    for e in np.unique(envs[pos]).tolist():
        members = train[envs[train] == e] if train.size else train
        if members.size == 0:
            members = np.flatnonzero(envs == e)
        mode_of[int(e)] = int(np.argmax(_reward_matrix(fpool, members, candidates).sum(axis=0)))

    def figures(p: np.ndarray) -> tuple[float, float, str | None]:
        if p.size == 0:
            return float("nan"), float("nan"), None
        m = _reward_matrix(fpool, p, candidates)
        means = m.mean(axis=0)
        best = int(np.argmax(means))
        mode = np.array([m[r, mode_of[int(envs[q])]] for r, q in enumerate(p.tolist())])
        return float(means[best] * 100.0), float(mode.mean() * 100.0), candidates[best]

    const, mode, answer = figures(pos)
    out: dict[str, Any] = {"constant": const, "env_mode": mode, "constant_answer": answer}
    for name, sub in (parts or {}).items():
        c, e, _ = figures(np.asarray(sub, dtype=np.int64))
        out[f"constant_{name}"] = c
        out[f"env_mode_{name}"] = e
    return out
