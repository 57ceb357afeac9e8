import json

import numpy as np
import pytest

from envsched import TaskPool, UniformSampler
from envsched.simulation.loop import run_schedule
from envsched.simulation.rewards import StochasticRewardSource


@pytest.fixture
def pool():
    specs = []
    for i in range(60):
        env = f"env{i % 6}"
        specs.append({"id": f"t{i}", "env": env, "tools": [{"name": f"{env}.op{i % 3}", "description": "d"}],
                      "verifier": {"checks": ["a", "b", "c", "d"][: 1 + i % 4]}})
    return TaskPool(specs)


def test_reward_source_is_seeded_and_in_range(pool):
    a, b = StochasticRewardSource(pool, seed=3), StochasticRewardSource(pool, seed=3)
    ra = [a.rollout(t, 8) for t in pool]
    rb = [b.rollout(t, 8) for t in pool]
    assert ra == rb
    flat = [r for rewards, _ in ra for r in rewards]
    assert all(0.0 <= r <= 1.0 for r in flat)
    # graded rewards: a task with 4 checks yields multiples of 1/4
    four = next(t for t in pool if len(t["verifier"]["checks"]) == 4)
    assert all(abs(r * 4 - round(r * 4)) < 1e-12 for r in a.rollout(four, 16)[0])


def test_reward_source_learns_only_from_signal(pool):
    src = StochasticRewardSource(pool, seed=0, learning_rate=0.5)
    task = pool[0]
    before = dict(src.tool_skill)
    src._rng = np.random.default_rng(0)
    src.rollout(task, 1)  # one rollout: no signal possible
    assert src.tool_skill == before
    p0 = src.success_probability(task)
    for _ in range(20):
        src.rollout(task, 8)
    assert src.success_probability(task) >= p0


def test_unscored_rate(pool):
    src = StochasticRewardSource(pool, seed=1, unscored_rate=0.5)
    rewards = [r for t in pool for r in src.rollout(t, 8)[0]]
    share = sum(r is None for r in rewards) / len(rewards)
    assert 0.4 < share < 0.6
    with pytest.raises(ValueError, match="unscored_rate"):
        StochasticRewardSource(pool, unscored_rate=1.0)


def test_run_schedule_statistics(pool):
    stats = run_schedule(UniformSampler(pool, seed=0), StochasticRewardSource(pool, seed=0), steps=3,
                         batch_size=12, group_size=4)
    assert [s.step for s in stats] == [1, 2, 3]
    assert all(s.groups == 12 and 1 <= s.envs_covered <= 6 for s in stats)
    assert all(0 <= s.mean_within_task_variance <= 0.25 for s in stats)


def test_run_resume_equals_uninterrupted(pool, tmp_path):
    full = run_schedule(UniformSampler(pool, seed=5), StochasticRewardSource(pool, seed=5), steps=6,
                        batch_size=10, group_size=4, run_dir=tmp_path / "a")
    run_schedule(UniformSampler(pool, seed=5), StochasticRewardSource(pool, seed=5), steps=3,
                 batch_size=10, group_size=4, run_dir=tmp_path / "b")
    resumed = run_schedule(UniformSampler(pool, seed=99), StochasticRewardSource(pool, seed=5), steps=6,
                           batch_size=10, group_size=4, run_dir=tmp_path / "b", resume=True)
    assert [s.as_dict() for s in resumed] == [s.as_dict() for s in full[3:]]
    lines = [json.loads(x) for x in (tmp_path / "b" / "steps.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(FileExistsError, match="already holds a run"):
        run_schedule(UniformSampler(pool), StochasticRewardSource(pool), steps=2, batch_size=4,
                     run_dir=tmp_path / "b")
    with pytest.raises(ValueError, match="another configuration"):
        run_schedule(UniformSampler(pool, seed=5), StochasticRewardSource(pool, seed=5), steps=8,
                     batch_size=10, group_size=4, run_dir=tmp_path / "b", resume=True, config={"x": 1})


def test_batch_statistics_count_signal_groups_as_every_sampler_does():
    from envsched.samplers.base import GroupResult
    from envsched.simulation.loop import batch_statistics

    tasks = [{"id": str(i), "env": "e"} for i in range(4)]
    # [0, 1e-7, 0, 0]: unequal floats, but no signal group for a sampler (variance below EQUAL_VARIANCE)
    groups = [[0.0, 1e-7, 0.0, 0.0], [0.0, 1e-5, 0.0, 0.0], [1.0, 1.0, None, 0.0], [None, 1.0, None, None]]
    stats = batch_statistics(1, tasks, groups, [[1.0] * 4] * 4, {})
    assert stats.signal_groups == sum(GroupResult(0, g, None).has_signal for g in groups) == 2
    # on a reward range of [0, 10] the same rewards are ten times closer on the [0, 1] scale
    wide = [[0.0, 1e-5, 0.0, 0.0], [0.0, 1e-4, 0.0, 0.0]]
    assert batch_statistics(1, tasks[:2], wide, [[1.0] * 4] * 2, {}, (0.0, 10.0)).signal_groups == 1
