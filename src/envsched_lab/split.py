"""The benchmark's held-out split: which tasks samplers may draw and which ones only evaluate the learner.

The rule (docs/benchmark-learner.md, section 1) is fixed and seeded by ``split_seed`` alone:

* **held-out environments (b)**: ``heldout_env_share`` of the environments (rounded, at least one),
  stratified by corpus (the environment name's part before ``/``). Each corpus gives a share proportional to
  its number of environments (largest remainders; equal remainders in the seeded order of
  ``sha256(f"{split_seed}:corpus:{corpus}")``) and keeps at least one training environment. Only environments
  that share an abstract pattern (other than their corpus's own name) or a BFCL tool with another environment
  of the pool are eligible; among the eligible ones of a corpus, those with the smallest
  ``sha256(f"{split_seed}:{env}")`` are held out.
* **held-out tasks (a)**: in every training environment, the ``heldout_task_share`` of its tasks with the
  smallest ``sha256(f"{split_seed}:{task id}")`` (at least one task stays in training). When the learner's
  prompts are given, tasks are ranked by their prompt's hash instead and a prompt never straddles the cut, and
  a held-out environment's task whose prompt is a training prompt is neither trained on nor evaluated: no
  held-out prompt is a training prompt.

Samplers are built over :attr:`PoolSplit.train` only, so they cannot draw a held-out task.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from envsched.pool.pool import TaskPool
from envsched.validation import check_int, check_number
from envsched_lab.learner import task_structure

__all__ = ["PoolSplit", "SplitConfig", "split_pool"]


@dataclass(frozen=True)
class SplitConfig:
    """How the benchmark pool is split (see the module docstring)."""

    split_seed: int = 0
    heldout_env_share: float = 0.15
    heldout_task_share: float = 0.2

    def __post_init__(self) -> None:
        object.__setattr__(self, "split_seed", check_int(self.split_seed, "split_seed", low=0))
        for name in ("heldout_env_share", "heldout_task_share"):
            v = getattr(self, name)
            check_number(v, name, low=0, high=1, high_open=True)
            if not isinstance(v, int | float):  # a numpy scalar: stored as the float it is
                object.__setattr__(self, name, float(v))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SplitConfig:
        d = dict(d or {})
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown split option(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)


@dataclass
class PoolSplit:
    """A pool split into the training pool and the two held-out sets (positions index the full pool)."""

    pool: TaskPool
    config: SplitConfig
    train_positions: np.ndarray
    heldout_task_positions: np.ndarray
    """(a): held-out tasks of training environments."""
    heldout_env_positions: np.ndarray
    """(b): every task of the held-out environments."""
    heldout_envs: list[str]
    train: TaskPool = field(repr=False)

    @property
    def heldout_positions(self) -> np.ndarray:
        """(a) and (b) together, sorted."""
        return np.sort(np.concatenate([self.heldout_task_positions, self.heldout_env_positions]))

    def describe(self) -> dict[str, Any]:
        """Counts and the held-out environments (written to ``split.json``)."""
        return {"config": asdict(self.config), "tasks": len(self.pool), "train_tasks": int(self.train_positions.size),
                "train_envs": len(self.train.envs), "heldout_tasks": int(self.heldout_task_positions.size),
                "heldout_env_tasks": int(self.heldout_env_positions.size), "heldout_envs": list(self.heldout_envs)}


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def _corpus(env: str) -> str:
    return env.split("/", 1)[0] if "/" in env else ""


def split_pool(pool: TaskPool, config: SplitConfig | Mapping[str, Any] | None = None, *,
               prompts: Sequence[str] | None = None) -> PoolSplit:
    """Split ``pool`` by the seeded rule of the module docstring. Deterministic in ``config`` (and ``prompts``).

    ``prompts`` (one per task, what a learner reads): tasks with the same prompt always fall on the same side,
    so no held-out task reads like a training task."""
    if prompts is not None and len(prompts) != len(pool):
        raise ValueError(f"{len(prompts)} prompts for a pool of {len(pool)} tasks")
    cfg = config if isinstance(config, SplitConfig) else SplitConfig.from_dict(config)
    tasks = list(pool)
    envs = [str(t["env"]) for t in tasks]
    by_env: dict[str, list[int]] = defaultdict(list)
    env_keys: dict[str, set[str]] = defaultdict(set)
    for i, t in enumerate(tasks):
        by_env[envs[i]].append(i)
        tools, pattern, _, _ = task_structure(t)
        if pattern is not None and pattern.split(":", 1)[-1] != _corpus(envs[i]):
            env_keys[envs[i]].add(f"pattern:{pattern}")  # the corpus's own name is no shared structure
        env_keys[envs[i]].update(f"tool:{x.split('::', 1)[-1]}" for x in tools if envs[i].startswith("bfcl"))
    key_envs: dict[str, set[str]] = defaultdict(set)
    for e, keys in env_keys.items():
        for k in keys:
            key_envs[k].add(e)
    eligible = {e for e, keys in env_keys.items() if any(len(key_envs[k]) > 1 for k in keys)}
    corpora: dict[str, list[str]] = defaultdict(list)
    for e in sorted(by_env):
        corpora[_corpus(e)].append(e)
    n_envs = len(by_env)
    total_out = max(1, round(cfg.heldout_env_share * n_envs)) if cfg.heldout_env_share > 0 and n_envs > 1 else 0
    # Largest-remainder apportionment of the held-out environments over corpora, each keeping one for training.
    quotas = {c: total_out * len(es) / n_envs for c, es in corpora.items()}
    alloc = {c: min(int(q), max(0, len(corpora[c]) - 1)) for c, q in quotas.items()}
    # equal remainders go in a seeded order (by name, one corpus would never be held out when all tie)
    for c in sorted(quotas, key=lambda c: (-(quotas[c] - int(quotas[c])), _rank(cfg.split_seed, f"corpus:{c}"))):
        if sum(alloc.values()) >= total_out:
            break
        if alloc[c] < len(corpora[c]) - 1:
            alloc[c] += 1
    heldout_envs: list[str] = []
    for c, es in corpora.items():
        cand = sorted((e for e in es if e in eligible), key=lambda e: _rank(cfg.split_seed, e))
        heldout_envs += cand[: alloc[c]]
    heldout_envs.sort()
    held_env_set = set(heldout_envs)
    train_pos: list[int] = []
    held_task_pos: list[int] = []
    for e, positions in by_env.items():
        if e in held_env_set:
            continue
        if prompts is None:
            ranked = sorted(positions, key=lambda i: _rank(cfg.split_seed, str(tasks[i]["id"])))
        else:  # tasks with the same prompt side by side, so they fall on one side of the cut
            ranked = sorted(positions, key=lambda i: (_rank(cfg.split_seed, f"prompt:{prompts[i]}"),
                                                      str(tasks[i]["id"])))
        k = min(round(cfg.heldout_task_share * len(ranked)), len(ranked) - 1)
        if prompts is not None:
            while 0 < k < len(ranked) and prompts[ranked[k - 1]] == prompts[ranked[k]]:
                k -= 1  # the cut would split a prompt between training and held-out: keep it in training
        held_task_pos += ranked[:k]
        train_pos += ranked[k:]
    if prompts is not None:  # a held-out environment's task that reads like a training task is not evaluated
        seen = {prompts[i] for i in train_pos}
        env_pos = np.array(sorted(i for e in heldout_envs for i in by_env[e] if prompts[i] not in seen),
                           dtype=np.int64)
    else:
        env_pos = np.array(sorted(i for e in heldout_envs for i in by_env[e]), dtype=np.int64)
    train_positions = np.array(sorted(train_pos), dtype=np.int64)
    train = TaskPool([tasks[i] for i in train_positions], reward_range=getattr(pool, "reward_range", None))
    return PoolSplit(pool=pool, config=cfg, train_positions=train_positions,
                     heldout_task_positions=np.array(sorted(held_task_pos), dtype=np.int64),
                     heldout_env_positions=env_pos, heldout_envs=heldout_envs, train=train)
