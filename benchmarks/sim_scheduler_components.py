"""Direction check of EnvSched's components on the bundled 2,550-task pool with the *simulated* reward source.

Runs EnvSched's paper preset (``SchedulerConfig.paper()``), its four ablations (coverage only, exploitation
only, without within- / cross-environment edges), the adaptive default (``SchedulerConfig()``) and uniform
selection for ``--steps`` batches of 64 groups of 8 rollouts against
:class:`envsched.simulation.rewards.StochasticRewardSource`, and prints per sampler the mean within-task reward
variance per batch (after the first), environments and tool names covered per batch, and the exploitation
hit rate. The reward source is a seeded simulation, not a model: this shows directions, not the paper's
figures (those belong to the benchmark, ``envsched bench``)::

    nice .venv/bin/python benchmarks/sim_scheduler_components.py --steps 60 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from envsched.envs.default_pool import benchmark_pool
from envsched.method.config import SchedulerConfig
from envsched.method.graph.build import build_graph
from envsched.method.sampler import EnvSchedSampler
from envsched.samplers.simple import UniformSampler
from envsched.simulation.rewards import StochasticRewardSource

VARIANTS = {
    "envsched-paper": SchedulerConfig.paper(),
    "coverage-only": SchedulerConfig.paper(mode="coverage_only"),
    "exploitation-only": SchedulerConfig.paper(mode="exploitation_only"),
    "no-within-edges": SchedulerConfig.paper(use_within_edges=False),
    "no-cross-edges": SchedulerConfig.paper(use_cross_edges=False),
    "envsched (adaptive)": SchedulerConfig(),
}


def run(sampler, pool, seed: int, steps: int) -> tuple[float, float, float, float]:
    source = StochasticRewardSource(pool, seed=seed)
    var, envs, tools, hits = [], [], [], []
    for _ in range(steps):
        batch = sampler.sample(64)
        envs.append(len({t["env"] for t in batch}))
        tools.append(len({x["name"] for t in batch for x in t.get("tools") or []}))
        v = []
        for t in batch:
            rewards, costs = source.rollout(t, 8)
            sampler.update(t, rewards, costs)
            v.append(np.var([r for r in rewards if r is not None]))
        var.append(float(np.mean(v)))
        hits.append(sampler.metrics().get("exploitation_hit_rate", math.nan))
    h = [x for x in hits[1:] if not math.isnan(x)]
    return float(np.mean(var[1:])), float(np.mean(envs)), float(np.mean(tools)), float(np.mean(h)) if h else math.nan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="EnvSched components against uniform on the simulated reward source")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args(argv)
    pool = benchmark_pool()
    graph = build_graph(pool)
    print(f"{len(pool)} tasks, {len(pool.envs)} environments; {args.steps} steps x 64 groups x 8 rollouts; "
          f"seeds {args.seeds}")
    print(f"{'sampler':20s} {'variance':>9s} {'envs':>6s} {'tools':>6s} {'hit rate':>8s}")
    samplers = {name: (lambda seed, c=cfg: EnvSchedSampler(pool, graph, c, seed=seed))
                for name, cfg in VARIANTS.items()}
    samplers["uniform"] = lambda seed: UniformSampler(pool, seed=seed)
    for name, make in samplers.items():
        res = np.array([run(make(seed), pool, seed, args.steps) for seed in args.seeds])
        m = np.nanmean(res, axis=0) if not np.isnan(res[:, 3]).all() else np.r_[res[:, :3].mean(axis=0), np.nan]
        print(f"{name:20s} {m[0]:9.4f} {m[1]:6.2f} {m[2]:6.1f} {m[3]:8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
