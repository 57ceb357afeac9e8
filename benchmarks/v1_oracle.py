"""Can the v1 neural benchmark (rounds 1-3 of the protocol) see? ``oracle-variance`` against uniform on it.

Runs uniform and ``oracle-variance`` on the 15 shipped families with the neural learner's defaults (200 steps x
32 groups x 8 rollouts), each seed with its own pool instance and split (split seed = the seed), as the
evaluation protocol's runs do, and prints the held-out score (greedy success x100, the protocol's primary
endpoint) at steps 40, 120 and 200, the paired differences with their 95 % intervals, the share of groups with
signal and the trivial baselines::

    python benchmarks/v1_oracle.py --seeds 0-9 --workers 2 --json v1_oracle.json
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from envsched_lab.report import paired_difference

STEPS = (40, 120, 200)


def one(job: tuple[str, int]) -> dict[str, Any]:
    from envsched_lab.families import DEFAULT_FAMILIES_REF, build_family_pool
    from envsched_lab.runner import run_one

    sampler, seed = job
    started = time.process_time()
    pool = build_family_pool(DEFAULT_FAMILIES_REF, seed=seed).pool
    recs = run_one(pool, sampler, seed, steps=max(STEPS), batch_size=32, group_size=8,
                   split={"split_seed": seed}, learner_kind="neural", families=DEFAULT_FAMILIES_REF, family_seed=seed)
    return {"sampler": sampler, "seed": seed, "initial": recs[0]["heldout_initial"],
            **{f"heldout@{t}": recs[t - 1]["heldout"] for t in STEPS},
            "signal_share": float(np.mean([r["signal_groups"] / 32 for r in recs])),
            "constant": recs[0].get("baseline_constant"), "env_mode": recs[0].get("baseline_env_mode"),
            "cpu_s": round(time.process_time() - started, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    jobs = [(s, seed) for seed in seeds for s in ("uniform", "oracle-variance")]
    with ProcessPoolExecutor(args.workers) as ex:
        rows = list(ex.map(one, jobs))
    by = {(r["sampler"], r["seed"]): r for r in rows}
    out: dict[str, Any] = {"seeds": seeds, "rows": rows}
    for t in STEPS:
        u = {s: by[("uniform", s)][f"heldout@{t}"] for s in seeds}
        o = {s: by[("oracle-variance", s)][f"heldout@{t}"] for s in seeds}
        p = paired_difference(o, u)
        out[f"oracle_minus_uniform@{t}"] = p
        sd = float(np.std([o[s] - u[s] for s in seeds], ddof=1))
        print(f"step {t}: uniform {np.mean(list(u.values())):.2f}, oracle-variance {np.mean(list(o.values())):.2f}, "
              f"difference {p['mean']:+.2f} [{p['low']:+.2f}, {p['high']:+.2f}] (sd {sd:.2f}; "
              f"per seed {', '.join(f'{o[s] - u[s]:+.2f}' for s in seeds)})")
    for s in ("uniform", "oracle-variance"):
        sig = np.mean([by[(s, k)]["signal_share"] for k in seeds])
        print(f"{s}: groups with signal {sig:.3f}, CPU {np.mean([by[(s, k)]['cpu_s'] for k in seeds]):.1f} s per run")
    print(f"initial {np.mean([by[('uniform', k)]['initial'] for k in seeds]):.2f}, best constant "
          f"{np.mean([by[('uniform', k)]['constant'] for k in seeds]):.2f}, environment mode "
          f"{np.mean([by[('uniform', k)]['env_mode'] for k in seeds]):.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1, default=float)


if __name__ == "__main__":
    main()
