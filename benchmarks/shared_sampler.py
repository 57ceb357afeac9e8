"""Throughput of the shared sampler: one process against the Ray-hosted sampler with many workers.

Measures, for the same sampler and the same batch size ``k`` (groups per ``sample`` call):
  * one process: ``sample(k)`` then ``k`` updates, in a loop: groups per second;
  * the host: ``--workers`` Ray workers (local cluster on 127.0.0.1), each looping one ``update_many`` of
    its last ``k`` groups then ``sample(k)`` (two round trips per ``k`` groups; with ``--one-call`` one
    ``update_and_sample`` round trip): reported groups per second over all workers, and the p50/p99
    latency of each call as the workers see it;
  * the 1-minute load average before and after each phase (the machine may be shared: compare the ratio
    host / one process rather than the absolute figures).

    nice .venv/bin/python benchmarks/shared_sampler.py --sampler envsched --k 8 32 --workers 16 --seconds 15 \
        --offered 0 2400 [--store sqlite|postgresql://...] [--json out.json]

``--offered 0`` has every worker call back to back (a saturation test: latency is then the queue of 16
callers); ``--offered R`` paces each worker's rounds as its rollouts would, so that all of them together ask
for R groups/s.

``--sampler envsched`` uses the 2,550-task reasoning-gym pool (51 environments x 50) and builds its graph
first; ``--sampler curriculum`` a synthetic pool of ``--tasks`` tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from envsched.pool import TaskPool


def _pool(kind: str, n: int) -> TaskPool:
    if kind == "envsched":
        from envsched_lab.pools import reasoning_gym_pool

        return reasoning_gym_pool(51, 50)
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 20}", "difficulty": i % 5} for i in range(n)])


def _factory(kind: str, pool: TaskPool, graph: Any, store: str | None, group: int) -> Any:
    prefix = f"b_{uuid.uuid4().hex[:10]}"  # a fresh store per measurement (dropped afterwards)

    def make() -> Any:
        if kind == "envsched":
            from envsched.method.sampler import EnvSchedSampler

            sampler: Any = EnvSchedSampler(pool, graph, seed=0)
        else:
            from envsched.samplers import CurriculumSampler

            sampler = CurriculumSampler(pool, group_size=group, seed=0)
        if store is None:
            return sampler
        from envsched.store import DurableSampler, HistoryStore

        return DurableSampler(sampler, HistoryStore(store, table_prefix=prefix), group_size=group,
                              snapshot_every=5000)

    make.target = (store, prefix)  # type: ignore[attr-defined]
    return make


def _store_target(spec: str | None, tag: str) -> str | None:
    if spec is None:
        return None
    if spec == "sqlite":
        return str(Path(tempfile.mkdtemp()) / f"{tag}.sqlite")
    return spec


def _drop(make: Any) -> None:
    """Remove a PostgreSQL store the measurement wrote (SQLite files live in a temporary directory)."""
    target, prefix = make.target
    if target is not None and target.startswith("postgres"):
        from envsched.store import HistoryStore

        store = HistoryStore(target, table_prefix=prefix)
        store.drop()
        store.close()


def _load() -> float:
    return os.getloadavg()[0]


def single_process(make: Any, k: int, group: int, seconds: float) -> dict[str, Any]:
    sampler = make()
    rng = random.Random(0)
    groups, lat = 0, []
    load0 = _load()
    t_end = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        for t in sampler.sample(k):
            sampler.update(t, [float(rng.random() < 0.5) for _ in range(group)])
        lat.append(time.perf_counter() - t0)
        groups += k
    wall = time.perf_counter() - start
    if hasattr(sampler, "close"):
        sampler.close()
    _drop(make)
    return {"groups_per_s": groups / wall, "groups": groups, "round_p50_ms": 1e3 * float(np.percentile(lat, 50)),
            "round_p99_ms": 1e3 * float(np.percentile(lat, 99)), "load_before": load0, "load_after": _load()}


def hosted(make: Any, k: int, group: int, seconds: float, workers: int, offered: float = 0.0,
           one_call: bool = False) -> dict[str, Any]:
    import ray

    from envsched.distributed import RemoteSampler, launch_sampler

    remote = launch_sampler(make, lease_timeout_s=600, group_size=group)

    @ray.remote(num_cpus=1)
    class Worker:
        """One rollout worker (a process of its own, started before the clock runs)."""

        def __init__(self, actor: Any, seed: int) -> None:
            self.sampler = RemoteSampler(actor, worker=f"bench{seed}")
            self.rng = random.Random(seed)

        def ready(self) -> bool:
            return True

        def run(self, start_at: float, stop_at: float, interval: float) -> dict[str, Any]:
            while time.time() < start_at:
                time.sleep(0.002)
            s_lat, u_lat, groups = [], [], 0
            next_round = time.time() + self.rng.random() * interval
            tasks: list[Any] = []
            while time.time() < stop_at:
                if interval:  # the rollouts of a round take time: pace the rounds
                    time.sleep(max(0.0, next_round - time.time()))
                    next_round += interval
                reports = [(t, [float(self.rng.random() < 0.5) for _ in range(group)]) for t in tasks]
                t0 = time.perf_counter()
                if one_call:  # report the last round's groups and draw the next in one round trip
                    tasks = self.sampler.update_and_sample(reports, k) if reports else self.sampler.sample(k)
                    s_lat.append(time.perf_counter() - t0)
                else:
                    if reports:
                        self.sampler.update_many(reports)
                    t1 = time.perf_counter()
                    tasks = self.sampler.sample(k)
                    u_lat.append(t1 - t0)
                    s_lat.append(time.perf_counter() - t1)
                groups += len(reports)
            return {"groups": groups, "sample": s_lat, "update_many": u_lat or [0.0]}

    pool_of_workers = [Worker.remote(remote.actor, s) for s in range(workers)]
    ray.get([w.ready.remote() for w in pool_of_workers])  # every worker process is up
    start_at = time.time() + 1.0
    load0 = _load()
    interval = workers * k / offered if offered else 0.0
    out = ray.get([w.run.remote(start_at, start_at + seconds, interval) for w in pool_of_workers])
    load1 = _load()
    for w in pool_of_workers:
        ray.kill(w)
    groups = sum(o["groups"] for o in out)
    s_lat = np.array([x for o in out for x in o["sample"]])
    u_lat = np.array([x for o in out for x in o["update_many"]])
    metrics = remote.metrics()
    ray.kill(remote.actor)
    _drop(make)
    return {"groups_per_s": groups / seconds, "groups": groups, "workers": workers, "offered_groups_per_s": offered,
            "sample_p50_ms": 1e3 * float(np.percentile(s_lat, 50)),
            "sample_p99_ms": 1e3 * float(np.percentile(s_lat, 99)),
            "update_many_p50_ms": 1e3 * float(np.percentile(u_lat, 50)),
            "update_many_p99_ms": 1e3 * float(np.percentile(u_lat, 99)),
            "host_groups": metrics["groups"], "load_before": load0, "load_after": load1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sampler", choices=["envsched", "curriculum"], default="envsched")
    ap.add_argument("--tasks", type=int, default=2550, help="pool size for --sampler curriculum")
    ap.add_argument("--k", type=int, nargs="+", default=[8, 32], help="groups per sample call")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--offered", type=float, nargs="+", default=[0.0],
                    help="groups/s the workers ask for in total, paced as rollouts would (0: back to back)")
    ap.add_argument("--store", default=None, help="none (default), sqlite, or a postgresql:// URL")
    ap.add_argument("--one-call", action="store_true",
                    help="each round is one update_and_sample call (report the last groups, draw the next)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import ray

    pool = _pool(args.sampler, args.tasks)
    graph = None
    if args.sampler == "envsched":
        from envsched.method.graph.build import build_graph

        t0 = time.perf_counter()
        graph = build_graph(pool)
        print(f"graph of {len(pool)} tasks built in {time.perf_counter() - t0:.1f} s", flush=True)
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
    report: dict[str, Any] = {"sampler": args.sampler, "tasks": len(pool), "group_size": args.group_size,
                              "store": args.store or "none", "cores": os.cpu_count(), "runs": []}
    for k in args.k:
        one = single_process(_factory(args.sampler, pool, graph, _store_target(args.store, f"one{k}"),
                                      args.group_size), k, args.group_size, args.seconds)
        print(f"k={k}: one process {one['groups_per_s']:.0f} groups/s, round p99 {one['round_p99_ms']:.1f} ms "
              f"(load {one['load_before']:.1f})", flush=True)
        for offered in args.offered:
            host = hosted(_factory(args.sampler, pool, graph, _store_target(args.store, f"host{k}"),
                                   args.group_size), k, args.group_size, args.seconds, args.workers, offered,
                          args.one_call)
            run = {"k": k, "single_process": one, "host": host, "ratio": host["groups_per_s"] / one["groups_per_s"]}
            report["runs"].append(run)
            label = "update_and_sample" if args.one_call else "sample"
            print(f"  host, {args.workers} workers, offered {offered or 'max'}: {host['groups_per_s']:.0f} groups/s, "
                  f"{label} p50/p99 {host['sample_p50_ms']:.1f}/{host['sample_p99_ms']:.1f} ms, update_many "
                  f"p50/p99 {host['update_many_p50_ms']:.1f}/{host['update_many_p99_ms']:.1f} ms (load "
                  f"{host['load_before']:.1f}->{host['load_after']:.1f}); host/one = {run['ratio']:.2f}", flush=True)
    ray.shutdown()
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
