"""Diagnostic: how well do EnvSched's exploitation picks follow its own variance predictions?

Drives ``EnvSchedSampler`` (paper defaults) against the benchmark's learner model (defaults, seed 0) on the
benchmark pool for ``--steps`` steps and, over the second half, reports the learner's true expected
within-task variance of (a) the exploitation picks, (b) the coverage picks, (c) the 32 tasks EnvSched
predicts to have the highest variance, plus the Spearman correlation between predicted and true variance
at the end (and the same correlation for MoPPS's posterior variance, run alongside on its own learner).

    python benchmarks/bench_envsched_picks.py --steps 80
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.stats import spearmanr

from envsched_lab.learner import LearnerModel
from envsched_lab.pools import load_bench_pool
from envsched_lab.runner import make_bench_sampler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sharing", type=float, default=0.5)
    args = ap.parse_args()
    pool, source = load_bench_pool("default")
    learner = LearnerModel(pool, {"sharing": args.sharing}, seed=args.seed)
    learner_m = LearnerModel(pool, {"sharing": args.sharing}, seed=args.seed)
    es = make_bench_sampler("envsched", pool, seed=args.seed)
    mo = make_bench_sampler("mopps", pool, seed=args.seed)
    ex, cv, top = [], [], []
    for step in range(args.steps):
        pred = es.predict() if step > 0 else None
        tv = learner.expected_variance()
        tasks = es.sample(64)
        pos = np.array([es.position_of(t) for t in tasks])
        phases = np.array(es.last_phases())
        if step >= args.steps // 2 and pred is not None:
            ex.append(tv[pos[phases == "exploitation"]].mean())
            cv.append(tv[pos[phases != "exploitation"]].mean())
            top.append(tv[np.argsort(-np.asarray(pred.variance))[:32]].mean())
        r, c = learner.rollout(pos, 8)
        for t, row, cc in zip(tasks, r, c, strict=True):
            es.update(t, row.tolist(), cc.tolist())
        learner.train(pos, r)
        mt = mo.sample(64)
        mpos = np.array([mo.position_of(t) for t in mt])
        r, c = learner_m.rollout(mpos, 8)
        for t, row, cc in zip(mt, r, c, strict=True):
            mo.update(t, row.tolist(), cc.tolist())
        learner_m.train(mpos, r)
    pv = np.asarray(es.predict().variance)
    a, b = mo.alpha, mo.beta
    mv = a * b / ((a + b) ** 2 * (a + b + 1))
    print(f"pool: {source}; {args.steps} steps, learner sharing={args.sharing}, seed={args.seed}")
    tv = learner.expected_variance()
    print(f"true expected variance, steps {args.steps // 2 + 1}-{args.steps}: exploitation picks "
          f"{np.mean(ex):.4f}, coverage picks {np.mean(cv):.4f}, EnvSched's top-32 predicted {np.mean(top):.4f}, "
          f"pool mean {tv.mean():.4f}, best 32 {np.sort(tv)[-32:].mean():.4f}")
    rho_e = spearmanr(pv, tv)[0]
    rho_m = spearmanr(mv, learner_m.expected_variance())[0]
    print(f"Spearman(predicted, true variance) at the end: EnvSched {rho_e:.3f}, MoPPS posterior {rho_m:.3f}")


if __name__ == "__main__":
    main()
