"""Benchmark of the dual-relation graph build: time and memory against pool size.

One command runs every size, each in a fresh child process (so its peak memory is its own):

    nice .venv/bin/python benchmarks/bench_graph.py --json docs/bench_graph.json
    nice .venv/bin/python benchmarks/bench_graph.py --sizes 1000000:10000 --json docs/bench_graph_1m.json

Pools are SYNTHETIC, generated from realistic templates (benchmarks/synthetic_pool.py: business domains,
tool sets with descriptions and JSON-schema parameters, instructions with ids/dates/amounts, verifier
checks and code, initial states), because no real pool here has more than a few hundred tasks.

Per size it reports: wall seconds of ``build_graph`` (pool fingerprint measured separately; ``build_graph``
needs it and ``TaskPool`` caches it), CPU seconds (this process plus worker processes; on a busy shared
machine wall time depends on other people's load, CPU time much less), the step timings, the sparse
feature size, peak RSS of the process (``resource.ru_maxrss``; it includes the pool itself, whose RSS is
reported too), the neighbour search method and, for approximate search, recall@K_cross against exact
search on a sample. The summary fits ``time ~ N^a`` across sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SIZES = "2550:51,10000:200,30000:600,100000:2000,300000:6000"


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_one(n_tasks: int, n_envs: int, recall_sample: int, workers: int) -> dict:
    sys.path.insert(0, str(HERE))
    from synthetic_pool import synthetic_specs

    from envsched.method.config import GraphConfig
    from envsched.method.graph.build import build_graph
    from envsched.pool import TaskPool

    load_start = os.getloadavg()
    t = time.perf_counter()
    pool = TaskPool(synthetic_specs(n_tasks, n_envs, seed=0))
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    pool.fingerprint()
    fingerprint_s = time.perf_counter() - t
    pool_rss = _rss_mib()
    cfg = GraphConfig(recall_sample=recall_sample, workers=workers)
    cpu0, t = _cpu(), time.perf_counter()
    g = build_graph(pool, cfg)
    wall = time.perf_counter() - t
    cpu = _cpu() - cpu0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    feats = g.report["features"]
    cross = g.report["cross"]
    return {
        "tasks": n_tasks, "envs": n_envs, "build_wall_s": round(wall, 2), "build_cpu_s": round(cpu, 2),
        "steps_s": g.report["timings_s"], "fingerprint_s": round(fingerprint_s, 2),
        "generate_pool_s": round(gen_s, 2),
        "sparse_features_mib": round(feats["sparse_bytes"] / 2**20, 2),
        "full_dim": feats["full_dim"], "abstract_dim": feats["abstract_dim"],
        "pool_rss_mib": round(pool_rss, 1), "peak_rss_mib": round(peak, 1),
        "cross_method": cross.get("method"), "recall_at_k": cross.get("recall_at_k"),
        "ann_rounds": cross.get("rounds"), "within": g.report["within"],
        "isolated": g.report["isolated"], "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated TASKS:ENVS (default: %(default)s)")
    ap.add_argument("--recall-sample", type=int, default=500)
    ap.add_argument("--workers", type=int, default=0, help="abstraction processes (0: all cores)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        n, e = (int(x) for x in args.one.split(":"))
        print(json.dumps(run_one(n, e, args.recall_sample, args.workers)))
        return
    results = []
    for size in args.sizes.split(","):
        cmd = [sys.executable, __file__, "--one", size, "--recall-sample", str(args.recall_sample),
               "--workers", str(args.workers)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"size {size} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            results.append({"size": size, "error": proc.stderr[-1000:]})
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(row)
        rec = row["recall_at_k"]["tie_aware"] if row.get("recall_at_k") else None
        print(f"{row['tasks']:>9} tasks {row['envs']:>6} envs: build {row['build_wall_s']:>8.1f} s wall "
              f"{row['build_cpu_s']:>8.1f} s cpu, sparse {row['sparse_features_mib']:>8.1f} MiB, "
              f"peak RSS {row['peak_rss_mib']:>8.0f} MiB (pool {row['pool_rss_mib']:.0f}), "
              f"cross {row['cross_method']}" + (f" recall@K {rec:.3f}" if rec is not None else "")
              + f", load {row['loadavg_start'][0]}", flush=True)
    ok = [r for r in results if "error" not in r and r["tasks"] >= 10_000]
    fit = {}
    if len(ok) >= 2:
        import numpy as np

        x = np.log([r["tasks"] for r in ok])
        for key in ("build_wall_s", "build_cpu_s", "peak_rss_mib"):
            y = np.log([max(r[key], 1e-3) for r in ok])
            fit[key] = round(float(np.polyfit(x, y, 1)[0]), 3)
        print("fitted exponent a in cost ~ N^a (sizes >= 10k): " + ", ".join(f"{k} {v}" for k, v in fit.items()))
    out = {"command": " ".join(["nice", ".venv/bin/python", "benchmarks/bench_graph.py", *sys.argv[1:]]),
           "results": results, "exponent_fit": fit,
           "note": "synthetic pools from realistic templates (benchmarks/synthetic_pool.py)"}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        if args.json.exists():  # keep rows of other sizes from earlier runs
            old = json.loads(args.json.read_text())
            keep = [r for r in old.get("results", []) if r.get("tasks") not in {x.get("tasks") for x in results}]
            out["results"] = sorted(keep + results, key=lambda r: r.get("tasks", math.inf))
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
