"""Protocol semantics every sampler shares (RFC 013, latest revision)."""

import json
import math

import numpy as np
import pytest

from envsched import CurriculumSampler, SequentialSampler, TaskPool, TaskSampler, UniformSampler
from envsched.samplers.dps import DPSSampler
from envsched.samplers.sec import SECSampler


@pytest.fixture
def pool():
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 3}", "difficulty": i % 3} for i in range(12)])


def make(kind, pool, seed=0):
    if kind == "uniform":
        return UniformSampler(pool, seed=seed)
    if kind == "curriculum":
        return CurriculumSampler(pool, group_size=4, seed=seed)
    if kind == "dps":
        return DPSSampler(pool, seed=seed)
    if kind == "sec":
        return SECSampler(pool, seed=seed)
    return SequentialSampler(pool, seeds=[0, 1], require_dispatch=True)  # RFC default: off


KINDS = ["uniform", "curriculum", "sequential", "dps", "sec"]


@pytest.mark.parametrize("kind", KINDS)
def test_implements_protocol(kind, pool):
    assert isinstance(make(kind, pool), TaskSampler)


@pytest.mark.parametrize("kind", KINDS)
def test_counters_and_none_rewards(kind, pool):
    s = make(kind, pool)
    a, b, c = s.sample(3)
    s.update(a, [0.0, 1.0, None, 1.0], costs=[10, 20, 30, 40])  # signal, one unscored
    s.update(b, [1.0, None, None, 1.0], costs=[1, 1, 1, 1])  # no signal
    s.update(c, [None, 0.5, None, None])  # one scored rollout: cannot be a signal group
    m = s.metrics()
    assert m["groups"] == 3
    assert m["signal_groups"] == 1
    assert m["episodes"] == 12
    assert m["unscored_episodes"] == 6
    assert m["cost"] == 104
    assert m["signal_groups_per_episode"] == pytest.approx(1 / 12)
    assert m["signal_groups_per_cost"] == pytest.approx(1 / 104)
    assert m["zero_signal_fraction"] == pytest.approx(2 / 3)
    assert m["outstanding_groups"] == 0
    assert (s.groups, s.signal_groups, s.episodes, s.cost) == (3, 1, 12, 104.0)
    json.dumps(m)


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


BAD_UPDATES = [
    ([float("nan"), 1.0], None, ValueError, "must be finite"),
    ([float("inf"), 1.0], None, ValueError, "must be finite"),
    ([1.5, 0.0], None, ValueError, "outside the declared reward range [0.0, 1.0]"),
    ([-0.1, 0.0], None, ValueError, "outside the declared reward range"),
    ([], None, ValueError, "are empty"),
    ("11", None, ValueError, "must be a sequence"),
    ([True, 0.0], None, ValueError, "must be a number or None"),
    ([0.0, "1"], None, ValueError, "must be a number or None"),
    ([0.0, 1.0], [1.0], ValueError, "costs for task 't0' have 1 entries for 2 rewards"),
    ([0.0, 1.0], [1.0, -2.0], ValueError, "costs must be finite and >= 0"),
    ([0.0, 1.0], [1.0, None], ValueError, "costs[1] for task 't0' must be a number"),
    ([0.0, 1.0], [1.0, float("nan")], ValueError, "costs must be finite"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("rewards", "costs", "exc", "fragment"), BAD_UPDATES)
def test_bad_updates_raise_and_change_nothing(kind, pool, rewards, costs, exc, fragment):
    s = make(kind, pool)
    tasks = s.sample({"uniform": 12, "curriculum": 40, "sequential": 4, "dps": 12, "sec": 12}[kind])
    first = pool.get("t0")
    assert first["id"] in [t["id"] for t in tasks]
    s.update(next(t for t in tasks if t["id"] != "t0"), [0.0, 1.0])
    before = json.dumps(s.state_dict(), sort_keys=True)
    with pytest.raises(exc) as info:
        s.update(first, rewards, costs)
    assert fragment in str(info.value)
    assert json.dumps(s.state_dict(), sort_keys=True) == before


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_and_undispatched_tasks(kind, pool):
    s = make(kind, pool)
    (t,) = s.sample(1)
    before = json.dumps(s.state_dict(), sort_keys=True)
    with pytest.raises(KeyError, match="unknown task 'nope'"):
        s.update({"id": "nope", "env": "e0"}, [1.0])
    other = next(x for x in pool if x["id"] != t["id"])
    with pytest.raises(ValueError, match="without an outstanding dispatch"):
        s.update(other, [1.0])
    assert json.dumps(s.state_dict(), sort_keys=True) == before
    s.update(t, [1.0, 0.0])
    with pytest.raises(ValueError, match="already reported"):
        s.update(t, [1.0, 0.0])  # a second update for the same dispatch
    assert s.groups == 1


def test_dispatch_bookkeeping_late_and_dropped_groups(pool):
    s = UniformSampler(pool, seed=3)
    first = s.sample(4)
    second = s.sample(4)
    assert s.outstanding_groups == 8
    for t in reversed(second):  # late and out of order
        s.update(t, [0.0, 1.0])
    s.discard(first[0])  # a dropped group
    assert s.metrics()["discarded_groups"] == 1
    assert s.outstanding_groups == 3
    assert s.metrics()["outstanding_groups"] == 3
    with pytest.raises(ValueError, match="no outstanding dispatch to discard"):
        s.discard(first[0])


@pytest.mark.parametrize("kind", ["uniform", "curriculum", "dps", "sec"])
@pytest.mark.parametrize("n", [0, -1, 1.5, True, "3"])
def test_bad_n(kind, pool, n):
    s = make(kind, pool)
    before = json.dumps(s.state_dict(), sort_keys=True)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        s.sample(n)
    assert json.dumps(s.state_dict(), sort_keys=True) == before


def test_n_larger_than_pool(pool):
    s = UniformSampler(pool)
    with pytest.raises(ValueError, match="n=13 exceeds what UniformSampler can draw in one batch"):
        s.sample(13)
    assert len(s.sample(12)) == 12


def sequence_of_draws(sampler, steps, n, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    out = []
    for _ in range(steps):
        batch = sampler.sample(n)
        out.append([t["id"] for t in batch])
        for t in batch:
            sampler.update(t, rng.integers(0, 2, size=4).astype(float).tolist())
    return out


@pytest.mark.parametrize("kind", ["uniform", "curriculum", "dps", "sec"])
def test_deterministic_given_seed(kind, pool):
    assert sequence_of_draws(make(kind, pool, seed=7), 6, 5) == sequence_of_draws(make(kind, pool, seed=7), 6, 5)
    assert sequence_of_draws(make(kind, pool, seed=7), 6, 5) != sequence_of_draws(make(kind, pool, seed=8), 6, 5)


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_roundtrip_continues_same_draws(kind, pool):
    a = make(kind, pool, seed=11)
    sequence_of_draws(a, 3, 5)
    pending = a.sample(2)  # outstanding across the checkpoint
    state = json.loads(json.dumps(a.state_dict()))  # survives JSON
    b = make(kind, pool, seed=99)
    b.load_state_dict(state)
    assert b.metrics() == a.metrics()
    for t in pending:
        a.update(t, [0.0, 1.0])
        b.update(t, [0.0, 1.0])
    if kind == "sequential":
        assert [t["id"] for t in a.sample(3)] == [t["id"] for t in b.sample(3)]
    else:
        assert sequence_of_draws(a, 4, 5, rng_seed=1) == sequence_of_draws(b, 4, 5, rng_seed=1)


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
