"""The v2 benchmark's gate on chosen development seeds (docs/evaluation-protocol.md, "The v2 pool: design and gate").

Runs uniform, ``oracle-variance`` and ``oracle-coverage`` on the v2 pool (``envsched bench --learner neural --pool
v2`` with its defaults: 120 steps, batches of 64 x 8) on the given seeds, into a resumable run directory, and
prints the gate (``envsched_lab.gate.gate``; also in the folder's ``summary.json`` and ``summary.md``)::

    python benchmarks/v2_gate.py --seeds 10-19 --out results/v2-gate-2 --workers 2
"""

from __future__ import annotations

import argparse
import json
import time

from envsched_lab.cli import V2
from envsched_lab.families.v2 import V2_LEARNER, V2_POOL, build_v2_pool
from envsched_lab.report import gate_lines
from envsched_lab.runner import BenchConfig, run_benchmark


def seed_list(text: str) -> list[int]:
    """``"10-19"`` or ``"3,5,8"`` as a list of seeds."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", required=True, help="development seeds, e.g. 10-19")
    ap.add_argument("--out", required=True, help="run directory (resumed when it exists)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()
    seeds = seed_list(args.seeds)
    cfg = BenchConfig(samplers=list(V2["samplers"]), seeds=seeds, steps=V2["steps"], batch_size=V2["batch_size"],
                      group_size=8, learner=dict(V2_LEARNER), learner_kind="neural", families=V2_POOL,
                      coldstart_runs=0, pool=V2_POOL, score_steps=[40, 120], target_step=120)
    started = time.time()
    summary = run_benchmark(cfg, args.out, pool=build_v2_pool(seeds[0]).pool, pool_source="v2",
                            workers=args.workers, plots=not args.no_plots)
    print("\n".join(gate_lines(summary["gate"])))
    print(json.dumps({k: v for k, v in summary["gate"].items() if isinstance(v, dict)}, indent=1, default=float))
    print(f"wall {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
