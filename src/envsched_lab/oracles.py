"""Positive controls: samplers that are better by construction, so that a benchmark shows it can see.

``envsched bench`` must let an oracle beat uniform before any method is judged on it
(``shared/reference/evaluation-statistics.md``, "Can the benchmark see at all?"). Two oracles:

* ``oracle-variance`` knows each training task's current success probability under the current policy,
  exactly as the learner computes it (:meth:`LearnerView.success_probabilities`), re-measured every
  ``refresh`` steps, and draws the tasks nearest 0.5 (a GRPO group's reward variance, ``p (1 - p)``, is
  largest there), ties broken at random, with no task drawn twice within a refresh window;
* ``oracle-coverage`` spreads each batch over as many environments as it can (every environment before any
  gets a second task), the least-drawn environments first, and within an environment takes its least-drawn
  tasks (ties at random).

**The learner hook.** A lab sampler that needs the learner has a method ``bind_learner(view)``; the
benchmark runner (:func:`envsched_lab.runner.run_one`) calls it once, after building the sampler and the
learner, with a :class:`LearnerView` of the training pool. Through it the sampler reads the learner's exact
success probabilities of its own tasks (the sampler's positions); it never reads the held-out tasks and it
never moves the learner's random streams. These samplers live in the lab: a user cannot build them, since no
trainer knows its policy's exact success probabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from envsched.pool.pool import TaskPool
from envsched.samplers.base import BaseSampler
from envsched.validation import check_int

__all__ = ["LAB_SAMPLERS", "LearnerView", "OracleCoverageSampler", "OracleVarianceSampler", "TrainingView",
           "make_lab_sampler"]


@runtime_checkable
class LearnerView(Protocol):
    """What a lab sampler may read of the learner: the success probability of each of its tasks."""

    def success_probabilities(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """Current success probability of each task (positions index the sampler's own pool)."""
        ...


class TrainingView:
    """A :class:`LearnerView` of the training pool: maps the sampler's positions to the learner's (the full
    pool's) and asks the learner's ``success_probabilities``."""

    def __init__(self, learner: Any, to_full: np.ndarray) -> None:
        probe = getattr(learner, "success_probabilities", None)
        if not callable(probe):
            raise TypeError(f"{type(learner).__name__} does not compute success probabilities "
                            f"(success_probabilities), which the oracle samplers read")
        self._probe: Callable[[np.ndarray], np.ndarray] = probe
        self._to_full = np.asarray(to_full, dtype=np.int64)
        self.calls = 0

    def success_probabilities(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        pos = np.asarray(positions, dtype=np.int64)
        self.calls += 1
        return np.asarray(self._probe(self._to_full[pos]), dtype=float)


class OracleVarianceSampler(BaseSampler):
    """Draws the tasks whose current success probability is nearest 0.5 (see the module docstring).

    ``refresh``: steps (``sample`` calls) between two measurements of every training task's probability; no
    task is drawn twice between two measurements (when fewer undrawn tasks remain than a batch needs, the
    window restarts early with a fresh measurement)."""

    def __init__(self, tasks: TaskPool | Sequence[Any], *, seed: int | None = 0, refresh: int = 5) -> None:
        super().__init__(tasks, seed=seed)
        self.refresh = check_int(refresh, "refresh", low=1)
        self._view: LearnerView | None = None
        self._p = np.full(len(self.tasks), np.nan)
        self._drawn = np.zeros(len(self.tasks), dtype=bool)
        self._since = 0
        self.measurements = 0

    def bind_learner(self, view: LearnerView) -> None:
        """The runner's hook: the learner whose success probabilities this sampler reads."""
        self._view = view

    @property
    def probabilities(self) -> np.ndarray:
        """The last measured success probability of each task (NaN before the first measurement)."""
        return self._p.copy()

    def _measure(self) -> None:
        if self._view is None:
            raise RuntimeError("oracle-variance needs the learner: the runner binds it with bind_learner(view) "
                               "before the first sample")
        p = np.asarray(self._view.success_probabilities(np.arange(len(self.tasks))), dtype=float)
        if p.shape != (len(self.tasks),) or not np.all(np.isfinite(p)):
            raise ValueError(f"the learner returned {p.shape} success probabilities for {len(self.tasks)} tasks "
                             f"(finite values expected)")
        self._p = p
        self._drawn = np.zeros(len(self.tasks), dtype=bool)
        self._since = 0
        self.measurements += 1

    def _select(self, n: int) -> list[int]:
        if self.measurements == 0 or self._since >= self.refresh or int((~self._drawn).sum()) < n:
            self._measure()
        free = np.flatnonzero(~self._drawn)
        dist = np.abs(self._p[free] - 0.5)
        order = np.lexsort((self._rng.random(free.size), dist))  # nearest 0.5 first, ties at random
        picks = free[order[:n]]
        self._drawn[picks] = True
        self._since += 1
        return [int(p) for p in picks]

    def _extra_metrics(self) -> dict[str, float]:
        return {"measurements": float(self.measurements)}


class OracleCoverageSampler(BaseSampler):
    """Spreads each batch over the most environments, then the least-drawn tasks (see the module docstring).

    A batch of ``n`` tasks over ``E`` environments takes ``min(n, E)`` distinct environments; the remaining
    slots go round the environments again. Environments are taken in order of fewest draws so far, tasks within
    an environment in order of fewest draws, ties at random; a batch never holds a task twice."""

    def __init__(self, tasks: TaskPool | Sequence[Any], *, seed: int | None = 0) -> None:
        super().__init__(tasks, seed=seed)
        envs = [str(t.get("env", "")) if isinstance(t, dict) else "" for t in self.tasks]
        names = sorted(set(envs))
        self._env_index = {e: i for i, e in enumerate(names)}
        self._env_of = np.array([self._env_index[e] for e in envs], dtype=np.int64)
        self._members = [np.flatnonzero(self._env_of == k) for k in range(len(names))]
        self._task_draws = np.zeros(len(self.tasks), dtype=np.int64)
        self._env_draws = np.zeros(len(names), dtype=np.int64)

    def _select(self, n: int) -> list[int]:
        task_draws = self._task_draws.copy()
        env_draws = self._env_draws.copy()
        taken = np.zeros(len(self.tasks), dtype=bool)
        out: list[int] = []
        while len(out) < n:
            avail = [k for k in range(len(self._members)) if not taken[self._members[k]].all()]
            if not avail:  # pragma: no cover - n is at most the pool's size
                break
            avail_arr = np.array(avail, dtype=np.int64)
            order = np.lexsort((self._rng.random(avail_arr.size), env_draws[avail_arr]))
            for k in avail_arr[order]:
                if len(out) == n:
                    break
                members = self._members[int(k)]
                free = members[~taken[members]]
                pick = int(free[np.lexsort((self._rng.random(free.size), task_draws[free]))[0]])
                out.append(pick)
                taken[pick] = True
                task_draws[pick] += 1
                env_draws[int(k)] += 1
        self._task_draws, self._env_draws = task_draws, env_draws
        return out


def _oracle_variance(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    return OracleVarianceSampler(pool, seed=seed, **options)


def _oracle_coverage(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    return OracleCoverageSampler(pool, seed=seed, **options)


#: The lab's own samplers (name -> (description, factory)); the runner builds them beside the registry's.
LAB_SAMPLERS: dict[str, tuple[str, Callable[..., BaseSampler]]] = {
    "oracle-variance": ("positive control: the training tasks whose current exact success probability is "
                        "nearest 0.5 (re-measured every 5 steps, no repeats in between)", _oracle_variance),
    "oracle-coverage": ("positive control: each batch over the most environments, then the least-drawn tasks",
                        _oracle_coverage),
}


def make_lab_sampler(name: str, pool: TaskPool, *, seed: int, group_size: int = 8,
                     options: dict[str, Any] | None = None) -> BaseSampler:
    """Build the lab sampler ``name`` (``KeyError`` when it is not one)."""
    _, factory = LAB_SAMPLERS[name]
    return factory(pool, seed=seed, group_size=group_size, **dict(options or {}))
