"""Does EnvSched's graph read the v2 pool's structure? (docs/benchmark.md, "The v2 pool", "What the graph sees")

For each seed, builds the dual-relation graph (``envsched.method.graph``, the library's defaults) of the v2
training pool, exactly as ``envsched bench`` gives it to EnvSched, and measures:

* **within-environment neighbours**: the share that have the same difficulty tier (record length) as the task,
  against the share of same-tier tasks among the other tasks of its environment (chance);
* **cross-environment neighbours**: the share that have the task's skill (the same skill on another surface),
  the share that have its surface, and the share that have its stage, each against its chance (the share of
  such tasks among the tasks of the other training environments).

Shares are weighted by the graph's edge weights and averaged over tasks::

    python benchmarks/v2_graph.py --seeds 0 1 2 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from envsched.method.graph.build import build_graph
from envsched_lab.families.v2 import SKILLS, build_v2_pool


def measure(seed: int) -> dict[str, float]:
    v2 = build_v2_pool(seed)
    split = v2.split(seed)
    pos = split.train_positions
    t = time.process_time()
    graph = build_graph(split.train)
    build_s = time.process_time() - t
    skill, surface, tier = v2.skill_of[pos], v2.surface_of[pos], v2.tier_of[pos]
    stage = np.array([SKILLS[int(k)].stage for k in skill])
    env = np.asarray(split.train.env_codes)
    out: dict[str, float] = {"seed": seed, "tasks": int(pos.size), "graph_cpu_s": round(build_s, 2)}

    def share(relation: str, same: np.ndarray, pool_mask: callable) -> tuple[float, float]:
        got, chance = [], []
        for i in range(pos.size):
            idx, w = graph.neighbors(i, relation)
            keep = idx >= 0
            idx, w = idx[keep], w[keep]
            if idx.size == 0 or w.sum() <= 0:
                continue
            got.append(float((w * (same[idx] == same[i])).sum() / w.sum()))
            cand = pool_mask(i)
            chance.append(float((same[cand] == same[i]).mean()))
        return float(np.mean(got)), float(np.mean(chance))

    def same_env(i: int) -> np.ndarray:
        m = env == env[i]
        m[i] = False
        return m

    def other_env(i: int) -> np.ndarray:
        return env != env[i]

    out["within_same_tier"], out["within_same_tier_chance"] = share("within", tier, same_env)
    for name, values in (("skill", skill), ("surface", surface), ("stage", stage)):
        out[f"cross_same_{name}"], out[f"cross_same_{name}_chance"] = share("cross", values, other_env)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()
    rows = [measure(s) for s in args.seeds]
    keys = [k for k in rows[0] if k not in ("seed", "tasks", "graph_cpu_s")]
    for r in rows:
        print(f"seed {r['seed']} ({r['tasks']} training tasks, graph {r['graph_cpu_s']} CPU s): "
              + ", ".join(f"{k} {r[k]:.3f}" for k in keys))
    print("mean: " + ", ".join(f"{k} {np.mean([r[k] for r in rows]):.3f}" for k in keys))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
