"""Pools for the benchmark: the default benchmark pool, or a fallback generated with reasoning-gym.

The default is ``envsched.envs.default_pool.benchmark_pool()`` (2,550 tasks over 51 environments, built by the
environments issue). When that module is not available, :func:`reasoning_gym_pool` generates a pool of
the same shape from reasoning-gym datasets (one environment per dataset, its reasoning-gym module as the
task's ``category``): real generated tasks, but no tools and a single verifier check each.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from envsched.pool.pool import TaskPool

__all__ = ["load_bench_pool", "reasoning_gym_pool"]


def _rg_names() -> list[tuple[str, str]]:
    from reasoning_gym.factory import DATASETS

    out = []
    for name, entry in sorted(DATASETS.items()):
        cls = entry[0]
        category = cls.__module__.split(".")[1] if cls.__module__.count(".") >= 1 else "misc"
        if category in ("arc", "composite", "code"):  # need extra files / are mixtures / slow
            continue
        out.append((name, category))
    return out


def reasoning_gym_pool(num_envs: int = 51, per_env: int = 50, seed: int = 0) -> TaskPool:
    """``num_envs`` reasoning-gym datasets x ``per_env`` tasks (deterministic in ``seed``).

    Datasets that fail to generate are skipped (the next ones are used); ``ValueError`` if fewer than
    ``num_envs`` succeed.
    """
    import reasoning_gym

    specs: list[dict[str, Any]] = []
    used = 0
    for name, category in _rg_names():
        if used == num_envs:
            break
        try:
            ds = reasoning_gym.create_dataset(name, size=per_env, seed=seed)
            items = [ds[i] for i in range(per_env)]
        except Exception:
            continue
        for i, item in enumerate(items):
            specs.append({
                "id": f"rg/{name}/{i}", "env": f"rg_{name}", "split": "train", "index": i,
                "category": category, "instruction": str(item["question"]),
                "verifier": {"checks": [f"answer of {name} scored by reasoning_gym score_answer"], "code": ""},
            })
        used += 1
    if used < num_envs:
        raise ValueError(f"only {used} reasoning-gym datasets generated, {num_envs} requested")
    return TaskPool(specs)


def load_bench_pool(pool: str | Path | None = None, *, quick: bool = False) -> tuple[TaskPool, str]:
    """The pool to benchmark on and a description of where it came from.

    ``pool``: a pool file, ``"default"``/``None`` (the benchmark pool, falling back to the generated
    reasoning-gym pool), or ``"reasoning-gym"``.
    """
    if pool not in (None, "default", "reasoning-gym"):
        p = Path(pool)  # type: ignore[arg-type]
        if not p.exists():
            raise FileNotFoundError(f"pool file {p} does not exist")
        return TaskPool.from_file(p), f"file {p}"
    if pool != "reasoning-gym" and importlib.util.find_spec("envsched.envs.default_pool") is not None:
        mod = importlib.import_module("envsched.envs.default_pool")
        if hasattr(mod, "benchmark_pool"):
            return mod.benchmark_pool(), "envsched.envs.default_pool.benchmark_pool()"
    return reasoning_gym_pool(), "reasoning-gym fallback: 51 datasets x 50 tasks (reasoning_gym.create_dataset, seed 0)"

