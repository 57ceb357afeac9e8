"""Choose the approximate-neighbour library by measurement: hnswlib vs pynndescent on the cross relation.

Builds the abstract features of a synthetic pool (see ``synthetic_pool.py``), then for each backend and
setting runs the approximate cross-environment search used by ``build_graph`` and measures wall time,
peak RSS growth and recall@K_cross against exact search on a sample (tie-aware and strict).

    nice .venv/bin/python benchmarks/ann_choice.py --tasks 50000 --envs 1000 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic_pool import synthetic_specs

from envsched.method.config import GraphConfig
from envsched.method.graph.build import _tokens, compute_abstractions
from envsched.method.graph.features import build_features
from envsched.method.graph.neighbors import ann_cross_neighbors, exact_cross_neighbors, recall_at_k
from envsched.pool import TaskPool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=50_000)
    ap.add_argument("--envs", type=int, default=1_000)
    ap.add_argument("--sample", type=int, default=300)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--skip-pynndescent", action="store_true", help="it needs minutes of numba compilation")
    args = ap.parse_args()
    pool = TaskPool(synthetic_specs(args.tasks, args.envs, seed=0))
    cfg = GraphConfig()
    specs = list(pool)
    feats = build_features(specs, _tokens(compute_abstractions(specs, cfg)), cfg)
    x, env = feats.abstract, np.asarray(pool.env_codes)
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(len(pool), args.sample, replace=False))
    ex_i, ex_s = exact_cross_neighbors(x, env, cfg.k_cross, rows=sample, block_rows=64)
    runs = []
    settings = [
        ("hnswlib", {"ef_search": 64, "dense_dim": 128, "m": 16, "ef_construction": 100}),
        ("hnswlib", {"ef_search": 128, "dense_dim": 128, "m": 16, "ef_construction": 100}),
        ("hnswlib", {"ef_search": 128, "dense_dim": 256, "m": 16, "ef_construction": 100}),
        ("hnswlib", {"ef_search": 64, "dense_dim": 256, "m": 12, "ef_construction": 64}),  # the default
        ("pynndescent", {"dense_dim": 128}),
    ]
    if args.skip_pynndescent:
        settings = settings[:-1]
    for backend, kw in settings:
        t = time.perf_counter()
        idx, _sim, stats = ann_cross_neighbors(x, env, cfg.k_cross, backend=backend, seed=0, **kw)
        seconds = time.perf_counter() - t
        rec = recall_at_k(idx[sample], ex_i, ex_s, x, sample)
        row = {"backend": backend, **kw, "seconds": round(seconds, 2), "recall_tie_aware": round(rec["tie_aware"], 4),
               "recall_strict": round(rec["strict"], 4), "rounds": stats["rounds"]}
        print(json.dumps(row), flush=True)
        runs.append(row)
    out = {"tasks": args.tasks, "envs": args.envs, "abstract_dim": int(x.shape[1]), "runs": runs}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
