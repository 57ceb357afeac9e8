"""EnvSched's ablations and variants on the v2 benchmark, on development seeds (docs/results.md, "v2: the default's
components on development seeds").

Runs the given samplers, untuned (each at its defaults), on the v2 pool with the configuration its gate passed
with (``benchmarks/v2_gate.py``: the neural learner's ``V2_LEARNER``, 120 steps, batches of 64 x 8, held-out
scores at steps 40 and 120) into a resumable run directory; ``benchmarks/ablation_table.py`` then pairs
``envsched`` with each row. Evaluation and tuning seeds (``envsched_lab.protocol``) are refused::

    python benchmarks/v2_ablation.py --seeds 20-29 --out results/v2-ablation-dev-2026-12-06 --workers 2 --no-plots
    python benchmarks/ablation_table.py results/v2-ablation-dev-2026-12-06 --steps 40,120 --margin 2 \\
        --name ablations_v2_dev
"""

from __future__ import annotations

import argparse
import time

from envsched_lab.cli import V2
from envsched_lab.families.v2 import V2_LEARNER, V2_POOL, build_v2_pool
from envsched_lab.protocol import DEV_SEEDS, EVALUATION_ROUNDS, TUNING_SEEDS
from envsched_lab.runner import BenchConfig, run_benchmark

#: The default, uniform, and the lab variants that isolate one component of the default (the graph prior, each
#: relation, coverage, exploitation, each of our rules) or add one of the paper's back (``envsched bench
#: --list-samplers``).
SAMPLERS = ("uniform", "envsched", "envsched-paper", "envsched-no-graph", "envsched-no-within", "envsched-no-cross",
            "envsched-reference-neighbours", "envsched-with-calibration", "envsched-with-decline",
            "envsched-coverage-only", "envsched-exploitation-only", "envsched-fixed-share", "envsched-paper-coverage",
            "envsched-caps-always", "envsched-adaptive")


def seed_list(text: str) -> list[int]:
    """``"20-29"`` or ``"3,5,8"`` as a list of development seeds; ``SystemExit`` naming any other seed."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.partition("-")
            out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise SystemExit(f"--seeds {text!r}: give a range like 20-29 or a list like 3,5,8") from None
    reserved = {s for seeds in EVALUATION_ROUNDS.values() for s in seeds} | set(TUNING_SEEDS)
    bad = sorted(s for s in out if s in reserved or s not in DEV_SEEDS)
    if bad or not out:
        raise SystemExit(f"--seeds {text!r}: {bad or 'no seed'} not development seeds "
                         f"({DEV_SEEDS.start}-{DEV_SEEDS.stop - 1}); evaluation and tuning seeds are never run here")
    return out


def v2_config(samplers: list[str], seeds: list[int]) -> BenchConfig:
    """The gate's v2 configuration (``benchmarks/v2_gate.py``) with other samplers and seeds, untuned."""
    return BenchConfig(samplers=list(samplers), seeds=list(seeds), steps=V2["steps"], batch_size=V2["batch_size"],
                       group_size=8, learner=dict(V2_LEARNER), learner_kind="neural", families=V2_POOL,
                       coldstart_runs=0, pool=V2_POOL, score_steps=[40, 120], target_step=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", required=True, help="development seeds, e.g. 20-29")
    ap.add_argument("--samplers", default=",".join(SAMPLERS), help="comma-separated (default: %(default)s)")
    ap.add_argument("--out", required=True, help="run directory (resumed when it exists)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    seeds = seed_list(args.seeds)
    cfg = v2_config([s.strip() for s in args.samplers.split(",") if s.strip()], seeds)
    try:
        cfg.validate()  # an unknown sampler, named before anything runs
    except ValueError as exc:
        raise SystemExit(f"--samplers: {exc}") from None
    started = time.time()
    try:
        run_benchmark(cfg, args.out, pool=build_v2_pool(seeds[0]).pool, pool_source="v2", workers=args.workers,
                      plots=not args.no_plots)
    except FileExistsError as exc:  # the folder holds a run of another configuration
        raise SystemExit(str(exc)) from None
    print(f"wrote {args.out}/summary.md; wall {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
