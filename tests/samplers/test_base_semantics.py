"""Protocol semantics every sampler shares (RFC 013, latest revision), beyond what
``envsched.testing.check_sampler`` checks on every registered sampler (tests/samplers/test_check_sampler.py):
rates without cost, curriculum's use of None, state files of another sampler or pool, constructor errors."""

import json
import math
from typing import ClassVar

import pytest

from envsched import CurriculumSampler, TaskPool, UniformSampler


@pytest.fixture
def pool():
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 3}", "difficulty": i % 3} for i in range(12)])


def test_signal_rates_without_cost_are_zero(pool):
    s = UniformSampler(pool)
    (t,) = s.sample(1)
    s.update(t, [0, 1])
    assert s.metrics()["signal_groups_per_cost"] == 0.0
    assert s.metrics()["signal_groups_per_episode"] == 0.5


def test_none_never_counts_as_zero_in_curriculum(pool):
    s = CurriculumSampler(pool, group_size=4, key="id")
    (t,) = s.sample(1)
    s.update(t, [1.0, None, None, None])
    # one success, no failure: p = (1 + 1) / (1 + 0 + 2); counting None as 0 would give 2/6
    assert s.success_probabilities()[t["id"]] == pytest.approx(2 / 3)


def test_n_larger_than_pool(pool):
    s = UniformSampler(pool)
    with pytest.raises(ValueError, match="n=13 exceeds what UniformSampler can draw in one batch"):
        s.sample(13)
    assert len(s.sample(12)) == 12


def test_load_state_dict_rejects_other_sampler_or_pool(pool):
    u = UniformSampler(pool)
    u.sample(3)
    c = CurriculumSampler(pool, group_size=4)
    before = json.dumps(c.state_dict(), sort_keys=True)
    with pytest.raises(ValueError, match="saved by 'UniformSampler', cannot load into CurriculumSampler"):
        c.load_state_dict(u.state_dict())
    other = UniformSampler(TaskPool([{"id": "x", "env": "e"}]))
    with pytest.raises(ValueError, match="saved for another task list"):
        other.load_state_dict(u.state_dict())
    broken = u.state_dict()
    broken["extra"]["order"] = [0, 0, 1]
    fresh = UniformSampler(pool)
    fresh_before = json.dumps(fresh.state_dict(), sort_keys=True)
    with pytest.raises(ValueError, match="malformed UniformSampler state"):
        fresh.load_state_dict(broken)
    assert json.dumps(fresh.state_dict(), sort_keys=True) == fresh_before
    assert json.dumps(c.state_dict(), sort_keys=True) == before
    with pytest.raises(ValueError, match="unsupported sampler state format"):
        fresh.load_state_dict({"format": "x"})


def test_constructor_errors():
    with pytest.raises(ValueError, match="at least one task"):
        UniformSampler([])
    with pytest.raises(ValueError, match="duplicate task key 'a'"):
        UniformSampler([{"id": "a"}, {"id": "a"}])
    with pytest.raises(TypeError, match="TaskPool or a sequence"):
        UniformSampler("abc")
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        UniformSampler([{"id": "a"}], seed=-1)


def test_reward_range_follows_pool():
    pool = TaskPool([{"id": "a", "env": "e"}], reward_range=(-1.0, 1.0))
    s = UniformSampler(pool)
    (t,) = s.sample(1)
    s.update(t, [-1.0, 1.0])
    assert s.signal_groups == 1
    assert math.isclose(s.metrics()["signal_groups_per_episode"], 0.5)


def test_get_params():
    s = CurriculumSampler([{"id": "a"}], group_size=8, key="group", decay=0.8, seed=4)
    params = s.get_params()
    assert params["group_size"] == 8 and params["key"] == "group" and params["decay"] == 0.8
    assert params["seed"] == 4 and "tasks" not in params


def test_a_select_that_returns_a_bad_position_is_refused_with_nothing_changed() -> None:
    """``sample`` checks what ``_select`` returns before handing anything over: a position outside the pool
    (which ``tasks[-1]`` would silently accept) or more positions than asked raises, and the sampler is as
    before."""
    from envsched.samplers.base import BaseSampler

    class Buggy(BaseSampler):
        answer: ClassVar[list[int]] = []

        def _select(self, n: int) -> list[int]:
            self._rng.random()  # the generator moves: the refusal must put it back
            return list(self.answer)

    s = Buggy([{"id": f"t{i}"} for i in range(4)], seed=0)
    before = json.dumps(s.state_dict(), sort_keys=True)
    for answer, n in (([0, -1], 2), ([0, 4], 2), ([1, 2, 3], 2)):
        Buggy.answer = answer
        with pytest.raises(RuntimeError, match=r"returned \d positions for n=2 \(at most n, each in \[0, 4\)\)"):
            s.sample(n)
        assert json.dumps(s.state_dict(), sort_keys=True) == before and s.outstanding() == {}
    Buggy.answer = [3, 0]
    assert [t["id"] for t in s.sample(2)] == ["t3", "t0"]


@pytest.mark.parametrize(("rewards", "reward_range", "signal"), [
    ([0.0, 1e-7, 0.0, 0.0], (0.0, 1.0), False),  # variance 1.9e-15 on [0, 1]: rewards equal up to noise
    ([0.0, 1e-5, 0.0, 0.0], (0.0, 1.0), True),  # variance 1.9e-11
    ([0.0, 1e-5, 0.0, 0.0], (0.0, 100.0), False),  # the same spread is 1e-7 of a range of 100
    ([0.1 + 0.2, 0.3, 0.3], (0.0, 1.0), False),  # unequal in the last bit only
    ([1.0, None, None], (0.0, 1.0), False),  # one scored reward
    ([1.0, None, 0.0], (0.0, 1.0), True),
])
def test_a_group_with_signal_is_one_definition_for_the_counters_and_envsched(rewards, reward_range, signal):
    """``metrics()["signal_groups"]`` (every sampler) and EnvSched's history (its environments' signal counts, the
    exploitation hit rate) call a group a signal group by the same rule, ``is_signal_group``."""
    from envsched.method.config import SchedulerConfig
    from envsched.method.history import signal as history_signal
    from envsched.method.sampler import EnvSchedSampler
    from envsched.samplers.base import group_mean_variance, is_signal_group

    tasks = TaskPool([{"id": f"t{i}", "env": f"e{i % 2}"} for i in range(4)], reward_range=reward_range)
    low, high = reward_range
    scored = [(r - low) / (high - low) for r in rewards if r is not None]
    assert bool(is_signal_group(len(scored), group_mean_variance(scored)[1] if scored else math.nan)) is signal
    for sampler in (UniformSampler(tasks, seed=0), EnvSchedSampler(tasks, config=SchedulerConfig(), seed=0)):
        (t,) = sampler.sample(1)
        sampler.update(t, rewards)
        assert sampler.metrics()["signal_groups"] == float(signal), type(sampler).__name__
    history = sampler.history
    s_e, k_e = history_signal.env_signal(history, 8.0)
    assert s_e.sum() == float(signal) and k_e.sum() == float(len(scored) >= 2)
    assert history_signal.phase_yields(history, 8.0)["coverage"][0] == 0.0  # a cold-start pick, not coverage
    # had the group been an exploitation pick, it would count as a hit by the same rule
    from envsched.method.history.statistics import PHASES

    history.obs.col("phase")[:] = PHASES.index("exploitation")
    history._cache.clear()  # (the log was edited in place)
    assert history.step_summary(0)["exploitation_hits"] == float(signal)
    assert history.cumulative_hit_rate() == float(signal)
