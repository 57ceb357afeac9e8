"""Group outcomes of every training task at checkpoints of a neural-learner run, for held-out variance prediction
(``benchmarks/variance_auc_neural.py``).

:func:`group_rewards` rolls out a group per task with the current policy from a generator of its own: no weight,
optimiser state or training generator moves, so the run continues exactly as if nothing had been probed.
:func:`probe_run` trains as the benchmark's :func:`~envsched_lab.runner.run_one` does (same learner, same
held-out split, same sampler construction, one GRPO update per step on every group of the batch; samplers that
post-filter are refused) and calls :func:`group_rewards` on every task of the training pool after the steps named
in ``checkpoints``. Scores are not computed (they read the learner only and move no random stream, so the
training is the same; ``tests/bench/test_neural_probe.py`` checks it against ``run_one``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from envsched_lab.neural.learner import NeuralLearner

__all__ = ["group_rewards", "probe_run"]


def group_rewards(learner: NeuralLearner, positions: Sequence[int] | np.ndarray, n: int, *, seed: int) -> np.ndarray:
    """Rewards ``(len(positions), n)`` of ``n`` completions sampled per task by the current policy, exactly as
    :meth:`NeuralLearner.rollout` samples them but from a generator seeded by ``seed``; the learner is left as it
    was (weights, optimiser and training generator)."""
    saved = learner._gen
    learner._gen = torch.Generator().manual_seed(int(seed))
    try:
        rewards, _, _ = learner.rollout(positions, n)
    finally:
        learner._gen = saved
    return rewards


def probe_run(families: str | None = None, *, seed: int, steps: int = 200, batch_size: int = 32,
              group_size: int = 8, checkpoints: Sequence[int] = (50, 100, 150), sampler: str = "uniform",
              learner: Mapping[str, Any] | None = None, split: Mapping[str, Any] | None = None,
              family_seed: int = 0) -> dict[str, Any]:
    """Train the neural learner with ``sampler`` for ``steps`` steps of ``batch_size`` groups of ``group_size``
    and, after each step in ``checkpoints``, roll out a group for every task of the training pool.

    Returns ``task_ids`` and ``positions`` (full-pool positions) of the training pool in its order, ``rewards``
    (checkpoint step -> ``(tasks, group_size)`` array), and per step ``mean_reward`` and ``batch_variance`` of
    the training batch (as :func:`~envsched_lab.runner.run_one` records them).
    """
    from envsched_lab.families import DEFAULT_FAMILIES_REF, build_family_pool
    from envsched_lab.learners import make_learner
    from envsched_lab.runner import _fill_nan, bench_split, learner_prompts, make_bench_sampler

    ref = families or DEFAULT_FAMILIES_REF
    wanted = sorted({int(c) for c in checkpoints})
    if not wanted or wanted[0] < 0 or wanted[-1] > steps:
        raise ValueError(f"checkpoints must be steps in [0, {steps}], got {list(checkpoints)}")
    pool = build_family_pool(ref, seed=family_seed).pool
    psplit = bench_split(pool, split, learner_prompts("neural", ref, family_seed))  # run_one's split
    model = make_learner("neural", pool, learner, seed=seed, families=ref, family_seed=family_seed)
    assert isinstance(model, NeuralLearner)
    smp = make_bench_sampler(sampler, psplit.train, seed=seed, batch_size=batch_size, group_size=group_size)
    if getattr(smp, "post_filter", False):
        raise ValueError(f"sampler {sampler!r} post-filters its groups; probe_run trains on every group")
    to_full = psplit.train_positions
    out: dict[str, Any] = {"task_ids": [t["id"] for t in psplit.train], "positions": to_full.tolist(),
                           "rewards": {}, "mean_reward": [], "batch_variance": []}

    def probe(step: int) -> None:
        if step in wanted:
            out["rewards"][step] = group_rewards(model, to_full, group_size, seed=seed * 1_000_003 + 7_919 + step)

    probe(0)
    for step in range(1, steps + 1):
        tasks = smp.sample(batch_size)
        pos = to_full[np.array([smp.position_of(t) for t in tasks], dtype=np.int64)]
        rewards, costs, handles = model.rollout(pos, group_size)
        for b, task in enumerate(tasks):
            smp.update(task, [None if np.isnan(x) else float(x) for x in rewards[b]], costs[b].tolist())
        with np.errstate(invalid="ignore"):
            out["batch_variance"].append(float(np.nanmean(np.nanvar(rewards, axis=1))))
        out["mean_reward"].append(float(np.nanmean(rewards)))
        model.train(pos, _fill_nan(rewards), handles)
        probe(step)
    return out
