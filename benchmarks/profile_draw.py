"""Profile: where the time of one EnvSched draw goes, by function (cProfile).

On the synthetic pool of ``benchmarks/bench_draw.py`` (``--tasks`` tasks, 50 per environment, Bernoulli rewards with
a fixed ``p ~ Beta(0.6, 0.6)`` per task, 8 rollouts per group): ``--warmup`` steps of ``sample(64)`` and their
updates, untimed; then ``--draws`` calls of ``sample(--size)``, each followed by the updates of its groups (not
profiled). Prints the median CPU time of the draws without the profiler (a second set of ``--draws`` calls), the
profiled functions by cumulative and by own time, per draw, and the share of the draw spent in scipy's sparse
products (``csr_matvecs`` / ``csc_matvecs``, the propagation of the graph prior along the relations), which bounds
what a whole computation of the prediction can cost at that size. Commands (``docs/performance.md``)::

    python benchmarks/profile_draw.py --tasks 2550
    python benchmarks/profile_draw.py --tasks 1000000 --warmup 30 --draws 5
    python benchmarks/profile_draw.py --tasks 100000 --size 1 --draws 200
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time

import numpy as np

TASKS_PER_ENV = 50
GROUP = 8


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=2_550)
    ap.add_argument("--size", type=int, default=64, help="the draw profiled: sample(SIZE)")
    ap.add_argument("--warmup", type=int, default=100, help="untimed steps of sample(64) and their updates")
    ap.add_argument("--draws", type=int, default=40, help="profiled draws (and as many unprofiled, timed)")
    ap.add_argument("--config", choices=["default", "adaptive", "paper"], default="default",
                    help="SchedulerConfig(): default; adaptive: the online share and UCB coverage order; paper")
    ap.add_argument("--top", type=int, default=25, help="functions printed per listing")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.tasks < TASKS_PER_ENV or args.size < 1 or args.draws < 1 or args.warmup < 0:
        ap.error("--tasks must be at least 50, --size and --draws at least 1, --warmup at least 0")

    from envsched.method.config import SchedulerConfig
    from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
    from envsched.method.sampler import EnvSchedSampler

    n = args.tasks
    graph = synthetic_graph(n, max(1, n // TASKS_PER_ENV), seed=args.seed)
    config = {"default": SchedulerConfig(), "paper": SchedulerConfig.paper(),
              "adaptive": SchedulerConfig(adaptive_share=True, adaptive_coverage=True)}[args.config]
    sampler = EnvSchedSampler(synthetic_tasks(graph), graph, config, seed=args.seed)
    if args.size > n:
        ap.error(f"--size {args.size} is larger than the pool ({n} tasks)")
    rng = np.random.default_rng(args.seed + 1)
    p = rng.beta(0.6, 0.6, size=n)

    def step(k: int, profile: cProfile.Profile | None = None) -> float:
        c0 = time.process_time()
        if profile is not None:
            profile.enable()
        batch = sampler.sample(k)
        if profile is not None:
            profile.disable()
        cpu = time.process_time() - c0
        pos = np.fromiter((sampler.position_of(t) for t in batch), dtype=np.int64, count=len(batch))
        for task, r in zip(batch, (rng.random((pos.size, GROUP)) < p[pos, None]).astype(float).tolist(),
                           strict=True):
            sampler.update(task, r)
        return cpu

    for _ in range(args.warmup):
        step(64)
    profile = cProfile.Profile()
    for _ in range(args.draws):
        step(args.size, profile)
    plain = [step(args.size) for _ in range(args.draws)]
    stats = pstats.Stats(profile, stream=(out := io.StringIO()))
    total = stats.total_tt
    products = sum(tt for (_, _, name), (_, _, tt, _, _) in stats.stats.items()
                   if name in ("<built-in method scipy.sparse._sparsetools.csc_matvecs>",
                               "<built-in method scipy.sparse._sparsetools.csr_matvecs>",
                               "<built-in method scipy.sparse._sparsetools.csc_matvec>",
                               "<built-in method scipy.sparse._sparsetools.csr_matvec>"))
    print(f"{n:,} tasks, {args.config} configuration, sample({args.size}) after {args.warmup} steps of sample(64)")
    print(f"median CPU per draw, unprofiled: {statistics.median(plain) * 1e3:.2f} ms ({args.draws} draws)")
    print(f"profiled: {total / args.draws * 1e3:.2f} ms per draw, of which scipy's sparse products "
          f"{products / args.draws * 1e3:.2f} ms ({products / total:.0%})")
    for key in ("cumulative", "tottime"):
        stats.sort_stats(key).print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
