"""Benchmark: one incremental EnvSched scheduling step at growing pool sizes.

One step = ingest 64 groups of 8 rewards (``update``) + select the next 64 tasks (``sample``), the unit the
paper times at 34.93 s per step for 2,550 tasks (section 3.3.2). Targets (issue 4): median <= 50 ms at
2,550 tasks, <= 1 s at 100,000, <= 10 s at 1,000,000, linear growth.

Graphs: the real dual-relation graph of the bundled 2,550-task pool when ``--real`` is given (built with
``envsched.method.graph.build``; needs the pool's packages), and for every size a *synthetic* graph
(:func:`envsched.method.graph.synthetic.synthetic_graph`: the same arrays and sparsity as a real graph -- 6 within
and 12 cross neighbours, L2-normalised sparse features -- without building features from task text), 50
tasks per environment. Rewards: Bernoulli(p) per rollout with a fixed per-task p.

Each size: ``--warmup`` steps first (so the history holds ``warmup * 64`` groups), then ``--steps`` timed
steps; the median is reported. ``--preset`` times the default (``SchedulerConfig()``), the paper
preset (``SchedulerConfig.paper()``) or both. Run with nice on a shared machine::

    nice .venv/bin/python benchmarks/bench_scheduler_step.py --real --json bench-scheduler.json
    nice .venv/bin/python benchmarks/bench_scheduler_step.py --sizes 2550 --preset both
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time

import numpy as np

from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.sampler import EnvSchedSampler

DEFAULT_SIZES = (2_550, 10_000, 30_000, 100_000, 300_000, 1_000_000)


def _time_steps(sampler: EnvSchedSampler, n_tasks: int, warmup: int, steps: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    p = rng.beta(0.6, 0.6, size=n_tasks)
    pending = sampler.sample(64)
    times = []
    for k in range(warmup + steps):
        rewards = [(rng.random(8) < p[sampler.position_of(t)]).astype(float).tolist() for t in pending]
        t0 = time.perf_counter()
        for t, r in zip(pending, rewards, strict=True):
            sampler.update(t, r)
        pending = sampler.sample(64)
        dt = time.perf_counter() - t0
        if k >= warmup:
            times.append(dt)
    return times


def _one(label: str, tasks, graph, warmup: int, steps: int, seed: int, preset: str = "default") -> dict:
    t0 = time.perf_counter()
    config = SchedulerConfig.paper() if preset == "paper" else SchedulerConfig()
    sampler = EnvSchedSampler(tasks, graph, config, seed=seed)
    init = time.perf_counter() - t0
    times = _time_steps(sampler, len(tasks), warmup, steps, seed)
    row = {"graph": label, "preset": preset, "tasks": len(tasks), "environments": len(sampler.envs),
           "init_s": round(init, 3),
           "median_step_s": statistics.median(times), "min_step_s": min(times), "max_step_s": max(times),
           "steps_timed": len(times), "history_groups": int(sampler.metrics()["observed_groups"]),
           "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    print(f"{label:>9} {preset:>8} {row['tasks']:>9,} tasks {row['environments']:>6,} envs: "
          f"median {row['median_step_s'] * 1e3:9.1f} ms"
          f"  (min {row['min_step_s'] * 1e3:.1f}, max {row['max_step_s'] * 1e3:.1f}; init {init:.2f} s; "
          f"peak RSS {row['peak_rss_mib']:.0f} MiB)", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps before timing (history size)")
    ap.add_argument("--steps", type=int, default=15, help="timed steps per size")
    ap.add_argument("--real", action="store_true", help="also time the real graph of the bundled 2,550-task pool")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", dest="json_out", default=None, help="write the rows to this JSON file")
    ap.add_argument("--preset", choices=("default", "paper", "both"), default="default",
                    help="EnvSched preset to time: default (SchedulerConfig()), paper, or both")
    args = ap.parse_args(argv)
    presets = ("default", "paper") if args.preset == "both" else (args.preset,)
    rows = []
    if args.real:
        from envsched.envs.default_pool import benchmark_pool
        from envsched.method.graph.build import build_graph

        pool = benchmark_pool()
        real_graph = build_graph(pool)
        for preset in presets:
            rows.append(_one("real", pool, real_graph, args.warmup, args.steps, args.seed, preset))
        del pool
        gc.collect()
    for n in args.sizes:
        graph = synthetic_graph(n, max(1, n // 50), seed=args.seed)
        for preset in presets:
            rows.append(_one("synthetic", synthetic_tasks(graph), graph, args.warmup, args.steps, args.seed, preset))
        del graph
        gc.collect()
    synth = [r for r in rows if r["graph"] == "synthetic" and r["preset"] == presets[0]]
    if len(synth) >= 2:
        x = np.log([r["tasks"] for r in synth])
        y = np.log([r["median_step_s"] for r in synth])
        slope = float(np.polyfit(x, y, 1)[0])
        big = [r for r in synth if r["tasks"] >= 30_000]
        slope_big = float(np.polyfit(np.log([r["tasks"] for r in big]), np.log([r["median_step_s"] for r in big]),
                                     1)[0]) if len(big) >= 2 else float("nan")
        print(f"log-log slope of median step time vs pool size: {slope:.2f} over all sizes, "
              f"{slope_big:.2f} from 30,000 tasks up (1.0 = linear)")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"rows": rows, "argv": sys.argv[1:]}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
