"""Measure: how far the history's storage (a live log window and the decayed statistics of what it absorbed) moves
EnvSched's estimates and batches from the full history's, on the benchmark pool.

Teacher-forced: the full-history sampler (the preset's rules with ``history_tolerance=0``) drives ``--steps`` steps
of the benchmark's learner model (``envsched_lab.learner.LearnerModel``, sharing 0.5, the pool of
``load_bench_pool("default")``, batches of 64 groups of 8). A :class:`History` of the preset's configuration (its
window: 16 steps in the default, the history horizon, 268 steps, in the paper preset) is fed the same dispatches
and reports as the full one, folding as a run of the preset folds. Before each draw, a sampler of the preset loads
the full sampler's state (the generator and everything else) and takes a copy of that history; both predict and
draw from the same generator state. Reported per step, from the first fold that absorbs something (the draw of
step 20 in the default, 335 in the paper preset) on: the Spearman correlation and the largest absolute difference
of the informativeness, the largest difference of the long-half-life task means, and the overlap of the two
batches (shared tasks / 64). ``--preset paper``: the paper preset (``envsched-paper``) instead of the default.

``--pool tau-bench``: the real-outcome check instead. The 50 tasks of the recorded GPT-4o tau-bench airline
episodes (``benchmarks/variance_auc.py``'s data and task specs, one environment; ``--data`` or
``$ENVSCHED_TAU_BENCH``), batches of 8 groups of 4 rollouts, each group's rewards drawn with replacement from the
task's 4 recorded trials (a bootstrap replay: the agent does not learn, so every difference comes from the
history's form), the graph of ``build_graph``.

    python benchmarks/decayed_history_deviation.py --steps 200 --json out.json
    python benchmarks/decayed_history_deviation.py --pool tau-bench --steps 200 --json out-tau.json
    python benchmarks/decayed_history_deviation.py --preset paper --steps 700 --json out-paper.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from envsched.method.config import SchedulerConfig
from envsched.method.history.statistics import History
from envsched_lab.learner import LearnerModel
from envsched_lab.pools import load_bench_pool
from envsched_lab.runner import make_bench_sampler

BATCH, GROUP = 64, 8
TAU_BATCH, TAU_GROUP = 8, 4


def _mirrored(original, mirror):
    def call(*args, **kwargs):
        mirror(*args, **kwargs)
        return original(*args, **kwargs)
    return call


def _bench_setup(seed: int, preset: str):
    pool, source = load_bench_pool("default")
    learner = LearnerModel(pool, {"sharing": 0.5}, seed=seed)
    name = "envsched-paper" if preset == "paper" else "envsched"
    full = make_bench_sampler(name, pool, seed=seed, options={"history_tolerance": 0.0})
    decayed = make_bench_sampler(name, pool, seed=seed)

    def rollout(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        r, c = learner.rollout(pos, GROUP)
        learner.train(pos, r)
        return r, c

    return source, full, decayed, rollout, BATCH


def _tau_setup(seed: int, data: Path | None, preset: str):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import variance_auc

    from envsched.method.graph.build import build_graph
    from envsched.method.sampler import EnvSchedSampler
    from envsched.pool.pool import TaskPool

    path = data or variance_auc.DEFAULT_DATA
    tasks, recorded = variance_auc.load_outcomes(path)
    pool = TaskPool(variance_auc.task_specs(tasks))
    graph = build_graph(pool)
    rng = np.random.default_rng(seed + 1)

    def make(**options):
        make_config = SchedulerConfig.paper if preset == "paper" else SchedulerConfig
        config = make_config(batch_size=TAU_BATCH, rollouts_per_task=TAU_GROUP, **options)
        return EnvSchedSampler(pool, graph, config, seed=seed)

    def rollout(pos: np.ndarray) -> tuple[np.ndarray, None]:
        picks = rng.integers(0, recorded.shape[1], size=(pos.size, TAU_GROUP))
        return recorded[pos[:, None], picks], None

    return f"tau-bench GPT-4o airline ({path.name}, {len(tasks)} tasks)", make(history_tolerance=0.0), make(), \
        rollout, TAU_BATCH


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pool", choices=["bench", "tau-bench"], default="bench")
    ap.add_argument("--data", type=Path, help="tau-bench episodes (with --pool tau-bench)")
    ap.add_argument("--preset", choices=["default", "paper"], default="default")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    source, full, decayed, rollout, batch = (_tau_setup(args.seed, args.data, args.preset)
                                             if args.pool == "tau-bench" else _bench_setup(args.seed, args.preset))
    default_tolerance = decayed.config.history_tolerance
    fh = full.history
    shadow = History(fh.n, fh.env_codes, fh.num_envs, decayed.config)
    for name in ("record_batch", "record_observation", "record_discard"):  # mirror every change of the history
        setattr(fh, name, _mirrored(getattr(fh, name), getattr(shadow, name)))
    rows = []
    for step in range(args.steps):
        state = json.loads(json.dumps(full.state_dict()))
        state["extra"]["config"]["history_tolerance"] = default_tolerance
        decayed.load_state_dict(state)
        decayed._history = h = copy.deepcopy(shadow)
        pf, pd = full.predict(), decayed.predict()
        absorbed = h.decayed is not None and h.decayed.absorbed  # (before the draw, which may fold)
        tasks = full.sample(batch)
        other = decayed.sample(batch)
        if pf is not None and absorbed:
            a, b = pf.informativeness, pd.informativeness
            rows.append({"step": step, "spearman": float(spearmanr(a, b)[0]), "max_abs_informativeness":
                         float(np.abs(a - b).max()), "max_informativeness": float(a.max()),
                         "max_abs_long_values": float(np.abs(pf.long.history.values - pd.long.history.values).max()),
                         "overlap": len({t["id"] for t in tasks} & {t["id"] for t in other}) / batch,
                         "live_rows": len(h.obs)})
        pos = np.array([full.position_of(t) for t in tasks])
        r, c = rollout(pos)
        for i, (t, row) in enumerate(zip(tasks, r, strict=True)):
            full.update(t, row.tolist(), None if c is None else c[i].tolist())
        if step % 20 == 19 and rows:
            x = rows[-1]
            print(f"step {step + 1}: spearman {x['spearman']:.5f}, max |d info| {x['max_abs_informativeness']:.2e} "
                  f"(max info {x['max_informativeness']:.3f}), overlap {x['overlap']:.3f}", file=sys.stderr, flush=True)
    if not rows:
        raise SystemExit(f"nothing absorbed in {args.steps} steps: no step to compare (the first fold of the "
                         f"{args.preset} preset absorbs after {shadow.horizon + shadow.horizon // 4} steps)")
    summary = {"pool": source, "preset": args.preset, "steps": args.steps, "seed": args.seed,
               "compared_steps": len(rows),
               "spearman_min": min(x["spearman"] for x in rows),
               "spearman_median": statistics.median(x["spearman"] for x in rows),
               "max_abs_informativeness": max(x["max_abs_informativeness"] for x in rows),
               "max_abs_long_values": max(x["max_abs_long_values"] for x in rows),
               "overlap_mean": statistics.fmean(x["overlap"] for x in rows),
               "overlap_min": min(x["overlap"] for x in rows),
               "identical_batches": sum(x["overlap"] == 1.0 for x in rows)}
    print(json.dumps(summary, indent=1))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"summary": summary, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
