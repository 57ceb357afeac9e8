"""``envsched_lab.neural.probe``: probing every training task at checkpoints leaves the run as the benchmark's
``run_one`` trains it, and a probe is a real rollout of the current policy that moves nothing."""

import numpy as np
import pytest
import torch

from envsched_lab.families import DEFAULT_FAMILIES_REF, build_family_pool
from envsched_lab.learners import make_learner
from envsched_lab.neural.probe import group_rewards, probe_run
from envsched_lab.runner import bench_split, run_one

# warmed up enough that groups get mixed rewards, so GRPO updates really happen
TINY = {"warmup_steps": 60, "warmup_batch": 16, "warmup_lr": 1e-2, "d_model": 16, "n_heads": 2, "n_layers": 1,
        "eval_every": 2, "train_eval_tasks": 20}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))


def test_probed_run_trains_exactly_as_run_one():
    out = probe_run(seed=1, steps=6, batch_size=8, group_size=4, checkpoints=(0, 3, 6), learner=TINY)
    recs = run_one(build_family_pool(DEFAULT_FAMILIES_REF).pool, "uniform", 1, steps=6, batch_size=8,
                   group_size=4, learner=TINY, learner_kind="neural", families=DEFAULT_FAMILIES_REF)
    assert out["mean_reward"] == [r["mean_reward"] for r in recs]
    assert out["batch_variance"] == [r["batch_variance"] for r in recs]
    assert sum(r["signal_groups"] for r in recs) > 0  # updates happened, so equality says something
    fp = build_family_pool(DEFAULT_FAMILIES_REF)
    train = bench_split(fp.pool, None, fp.prompts).train  # run_one's split: the learner's prompts kept apart
    assert out["task_ids"] == [t["id"] for t in train]
    assert sorted(out["rewards"]) == [0, 3, 6]
    for r in out["rewards"].values():
        assert r.shape == (len(train), 4) and ((r >= 0) & (r <= 1)).all()
    assert not np.array_equal(out["rewards"][0], out["rewards"][6])
    with pytest.raises(ValueError, match="checkpoints"):
        probe_run(seed=1, steps=6, checkpoints=(7,), learner=TINY)


def test_group_rewards_are_the_policys_samples_and_move_nothing():
    fp = build_family_pool(DEFAULT_FAMILIES_REF)
    learner = make_learner("neural", fp.pool, TINY, seed=0, families=DEFAULT_FAMILIES_REF)
    pos = np.arange(0, len(fp.pool), 7)
    before = learner.state_dict()
    a = group_rewards(learner, pos, 8, seed=5)
    b = group_rewards(learner, pos, 8, seed=5)
    after = learner.state_dict()
    assert np.array_equal(a, b) and not np.array_equal(a, group_rewards(learner, pos, 8, seed=6))
    assert torch.equal(before["generator"], after["generator"]) and before["steps_trained"] == after["steps_trained"]
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    # the same draws as a training rollout from a generator in the same state
    learner._gen = torch.Generator().manual_seed(5)
    assert np.array_equal(learner.rollout(pos, 8)[0], a)
    # the policy's own success rate: on exact-match tasks the sampled mean is the exact expected success
    exact = pos[[fp.answers[i] is not None for i in pos.tolist()]]
    r = group_rewards(learner, exact, 64, seed=9)
    p = learner.evaluate(exact)["expected"].mean()
    assert p > 0 and abs(r.mean() - p) < 4 * np.sqrt(p * (1 - p) / r.size)
