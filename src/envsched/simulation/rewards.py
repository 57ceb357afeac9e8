"""Reward sources: where a scheduling run without a trainer gets its rewards from.

:class:`StochasticRewardSource` is a documented, seeded *simulation* of a policy's rollouts, good enough to
exercise a sampler end to end (``envsched run``). It is **not a benchmark**: its outcomes do not come from a
model or from the environments' verifiers. The benchmark (``envsched bench``) uses the learner model
instead.

The simulated policy has a latent skill per environment and per tool name. The success probability of a
task is ``sigmoid(skill[env] + mean(skill[tool] for its tools) - difficulty_offset[task])``, where the
offset is a per-task draw (so tasks in one environment differ, and tasks sharing tools are correlated).
A rollout passes each of the task's verifier checks (at least one) independently with that probability;
its reward is the share of checks passed, so tasks with several checks give graded rewards.
After a group whose rewards differ (a GRPO signal), the skills the task uses grow by ``learning_rate``
times the group's reward standard deviation: no signal, no learning.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from envsched.pool.pool import TaskPool
from envsched.samplers.base import GroupResult
from envsched.validation import check_number

__all__ = ["RewardSource", "StochasticRewardSource"]


@runtime_checkable
class RewardSource(Protocol):
    """Produces the rewards (and costs) of a group of rollouts of one task."""

    def rollout(self, task: Mapping[str, Any], n: int) -> tuple[list[float | None], list[float]]:
        """Run ``n`` rollouts of ``task``; return one reward (``None`` = unscored) and one cost per rollout."""
        ...


def _stable_unit(text: str) -> float:
    """A deterministic number in [0, 1) from a string (independent of Python's hash seed)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / 2**64


class StochasticRewardSource:
    """Seeded simulation of rollouts (see the module docstring). Not a benchmark.

    Args:
        pool: the task pool whose tasks are rolled out.
        seed: seed for the latent skills and the rollout noise.
        difficulty_spread: standard deviation of the per-task difficulty offsets.
        unscored_rate: probability that a rollout comes back unscored (reward ``None``).
        learning_rate: skill growth per unit of group reward standard deviation.
    """

    def __init__(self, pool: TaskPool, seed: int = 0, *, difficulty_spread: float = 3.5,
                 unscored_rate: float = 0.0, learning_rate: float = 0.05) -> None:
        check_number(unscored_rate, "unscored_rate", low=0, high=1, high_open=True)
        self.pool = pool
        self.seed = seed
        self.difficulty_spread = difficulty_spread
        self.unscored_rate = unscored_rate
        self.learning_rate = learning_rate
        self._rng = np.random.default_rng(seed)
        self.env_skill = {e: 3.0 * (_stable_unit(f"{seed}/env/{e}") - 0.5) for e in pool.envs}
        self.tool_skill: dict[str, float] = {}
        self._offset: dict[str, float] = {}
        self._checks: dict[str, int] = {}
        self._tools: dict[str, list[str]] = {}
        base_rng = np.random.default_rng(seed + 1)
        offsets = base_rng.normal(0.0, difficulty_spread, size=len(pool))
        for i, task in enumerate(pool):
            tools = sorted({t["name"] for t in task.get("tools") or []})
            self._tools[task["id"]] = tools
            for name in tools:
                self.tool_skill.setdefault(name, 1.0 * (_stable_unit(f"{seed}/tool/{name}") - 0.5))
            difficulty = task.get("difficulty")
            self._offset[task["id"]] = float(offsets[i]) + (0.5 * float(difficulty) if difficulty is not None else 0.0)
            checks = (task.get("verifier") or {}).get("checks") or []
            self._checks[task["id"]] = max(1, min(len(checks), 16))

    def state_dict(self) -> dict[str, Any]:
        """Skills and RNG state, so that a resumed run continues with the same rollouts."""
        return {"seed": self.seed, "pool": self.pool.fingerprint(), "env_skill": dict(self.env_skill),
                "tool_skill": dict(self.tool_skill), "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("pool") != self.pool.fingerprint():
            raise ValueError("reward-source state was saved for another pool")
        if set(state["env_skill"]) != set(self.env_skill) or set(state["tool_skill"]) != set(self.tool_skill):
            raise ValueError("reward-source state does not match this pool's environments and tools")
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
        self.env_skill = {k: float(v) for k, v in state["env_skill"].items()}
        self.tool_skill = {k: float(v) for k, v in state["tool_skill"].items()}
        self._rng = rng

    def success_probability(self, task: Mapping[str, Any]) -> float:
        """Current per-check success probability of ``task``."""
        tid = task["id"]
        tools = self._tools[tid]
        tool_term = float(np.mean([self.tool_skill[t] for t in tools])) if tools else 0.0
        logit = self.env_skill[task["env"]] + tool_term - self._offset[tid]
        return float(1.0 / (1.0 + np.exp(-logit)))

    def rollout(self, task: Mapping[str, Any], n: int) -> tuple[list[float | None], list[float]]:
        p = self.success_probability(task)
        checks = self._checks[task["id"]]
        passed = self._rng.binomial(checks, p, size=n)
        rewards: list[float | None] = [float(x) / checks for x in passed]
        if self.unscored_rate > 0:
            for j in np.flatnonzero(self._rng.random(n) < self.unscored_rate):
                rewards[int(j)] = None
        costs = [float(c) for c in self._rng.integers(50, 400, size=n)]
        group = GroupResult(0, rewards, None)  # rewards in [0, 1]
        if group.has_signal:  # a group GRPO learns from
            scored = group.scored
            step = self.learning_rate * float(np.std(scored))
            self.env_skill[task["env"]] += step
            for name in self._tools[task["id"]]:
                self.tool_skill[name] += step
        return rewards, costs
