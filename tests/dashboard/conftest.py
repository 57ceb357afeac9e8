"""Runs for the dashboard tests: a real sampler on a real SQLite history store (DurableSampler), rewards drawn
from each task's own success rate with a seeded generator, and -- for EnvSched -- the explanation run file
that `envsched run --explain` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envsched.pool import TaskPool

HOSTILE_ID = "web/xss-task"
HOSTILE_ENV = 'web <i>markup</i> <a href="javascript:window.__pwned=3">link</a>'
HOSTILE_INSTRUCTION = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> & "quotes"'


def make_pool(n_envs: int = 6, per_env: int = 8, *, hostile_env: bool = True) -> TaskPool:
    """A small pool over ``n_envs`` environments and one more task whose instruction carries markup (hostile
    content), in an environment whose name carries markup too (``hostile_env``) or in ``web``."""
    verbs = ["book", "refund", "cancel", "search", "update", "compare", "schedule", "reset"]
    tasks = []
    for e in range(n_envs):
        for i in range(per_env):
            tasks.append({"id": f"env{e}/task-{i}", "env": f"env{e}", "difficulty": (i * 7 + e) % 10,
                          "instruction": f"{verbs[i % len(verbs)]} item {i} in environment {e}"})
    tasks.append({"id": HOSTILE_ID, "env": HOSTILE_ENV if hostile_env else "web", "difficulty": 5,
                  "instruction": HOSTILE_INSTRUCTION})
    return TaskPool(tasks)


class RunWriter:
    """Writes a run step by step: draw a batch, roll it out (seeded Bernoulli rewards), report it."""

    def __init__(self, store: Path, run_file: Path | None, *, sampler: str = "envsched", batch_size: int = 12,
                 group_size: int = 4, seed: int = 0, pool: TaskPool | None = None) -> None:
        from envsched.store import DurableSampler, HistoryStore

        self.pool = pool if pool is not None else make_pool()
        if sampler == "envsched":
            from envsched.method.sampler import EnvSchedSampler

            inner: Any = EnvSchedSampler(self.pool, seed=seed)
        else:
            from envsched.samplers.registry import make_sampler

            inner = make_sampler(sampler, self.pool, seed=seed, group_size=group_size)
        self.inner = inner
        self.durable = DurableSampler(inner, HistoryStore(store), group_size=group_size)
        self.run_file = run_file
        self.batch_size, self.group_size = batch_size, group_size
        self.rng = np.random.default_rng(seed)
        self.success = {t["id"]: 0.1 + 0.8 * (1 - t.get("difficulty", 5) / 10) for t in self.pool}
        self.steps = 0

    def step(self) -> list[Any]:
        from envsched.method.explain import write_records

        tasks = self.durable.sample(self.batch_size)
        if self.run_file is not None:
            inner = self.inner
            write_records(self.run_file, inner.explanations(),
                          {"sampler": type(inner).__name__, "seed": 0, "num_tasks": len(inner.tasks)})
        items = []
        for t in tasks:
            p = self.success[t["id"]]
            items.append((t, [float(x) for x in (self.rng.random(self.group_size) < p)], None, None))
        assert all(r == "applied" for r in self.durable.update_many(items))
        self.steps += 1
        return tasks

    def run(self, steps: int) -> RunWriter:
        for _ in range(steps):
            self.step()
        return self

    def close(self) -> None:
        self.durable.close()


@pytest.fixture
def run_writer() -> Any:
    """``run_writer(store, run_file, **options)`` -> a :class:`RunWriter` (closed after the test)."""
    made: list[RunWriter] = []

    def make(store: Path, run_file: Path | None = None, **options: Any) -> RunWriter:
        w = RunWriter(store, run_file, **options)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()
