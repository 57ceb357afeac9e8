"""SharesSampler: fixed per-source shares are respected batch by batch, feedback reaches the right source."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envsched.samplers.shares import SharesSampler, allocate_quotas
from envsched.samplers.simple import CurriculumSampler, UniformSampler


def _pool(sizes: dict[str, int]) -> list[dict]:
    return [{"id": f"{env}-{i}", "env": env, "difficulty": i % 3} for env, n in sizes.items() for i in range(n)]


def _uniform(tasks, source):
    return UniformSampler(tasks, seed=7)


def test_fixed_quota_per_batch_when_shares_divide_the_batch():
    s = SharesSampler.from_pool(_pool({"a": 10, "b": 6, "c": 6}), {"a": 2, "b": 1, "c": 1}, _uniform)
    for _ in range(9):
        batch = s.sample(4)
        envs = [t["env"] for t in batch]
        assert envs.count("a") == 2 and envs.count("b") == 1 and envs.count("c") == 1
    assert s.drawn == {"a": 18, "b": 9, "c": 9}


def test_rounding_carries_so_cumulative_counts_track_the_shares():
    shares = {"a": 0.5, "b": 0.3, "c": 0.2}
    s = SharesSampler.from_pool(_pool({"a": 20, "b": 20, "c": 20}), shares, _uniform)
    total = 0
    for n in [3, 5, 7, 1, 2, 6, 4, 3, 5, 5]:
        batch = s.sample(n)
        assert len(batch) == n
        total += n
        for env, p in shares.items():
            assert abs(s.drawn[env] - p * total) < 1.0
    m = s.metrics()
    assert m["a/share/target"] == pytest.approx(0.5)
    assert m["b/share/drawn"] == pytest.approx(s.drawn["b"] / total)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 5.0), min_size=1, max_size=5).filter(lambda w: sum(w) > 0.01),
       st.lists(st.integers(1, 9), min_size=1, max_size=30))
def test_allocate_quotas_properties(weights, ns):
    shares = {f"s{i}": w for i, w in enumerate(weights)}
    carry = None
    total = 0
    drawn = dict.fromkeys(shares, 0)
    for n in ns:
        q, carry = allocate_quotas(n, shares, carry)
        assert sum(q.values()) == n and all(v >= 0 for v in q.values())
        assert abs(sum(carry.values())) < 1e-6
        total += n
        for k, v in q.items():
            drawn[k] += v
            if shares[k] == 0:
                assert v == 0
        for k, w in shares.items():
            assert abs(drawn[k] - total * w / sum(weights)) < 1.0 + 1e-6


def test_feedback_is_routed_to_the_source_sampler_and_learns_there():
    def make(tasks, source):
        return CurriculumSampler(tasks, group_size=4, key="difficulty", seed=1)

    s = SharesSampler.from_pool(_pool({"a": 9, "b": 9}), {"a": 1, "b": 1}, make)
    batch = s.sample(4)
    for t in batch:
        s.update(t, [1.0, 0.0, None, 1.0] if t["env"] == "a" else [0.0] * 4, costs=[3, 3, 3, 3])
    a, b = s.samplers["a"], s.samplers["b"]
    assert a.groups == 2 and b.groups == 2
    assert a.signal_groups == 2 and b.signal_groups == 0
    assert a.unscored_episodes == 2 and b.unscored_episodes == 0
    assert s.groups == 4 and s.signal_groups == 2 and s.episodes == 16 and s.cost == 48.0
    assert s.signal_groups_per_episode == pytest.approx(2 / 16)
    m = s.metrics()
    assert m["groups"] == 4 and m["a/signal_groups"] == 2 and m["b/signal_groups"] == 0
    # an update for a task never drawn is refused by the source sampler, nothing counted
    undrawn = next(t for t in a.tasks if t["id"] not in {x["id"] for x in batch})
    with pytest.raises(ValueError, match="outstanding"):
        s.update(undrawn, [1.0])
    assert s.groups == 4


def test_state_round_trip_continues_the_same_draws():
    def make(tasks, source):
        return CurriculumSampler(tasks, group_size=2, key="difficulty", seed=5)

    pool = _pool({"a": 7, "b": 5, "c": 4})
    shares = {"a": 0.6, "b": 0.25, "c": 0.15}
    s1 = SharesSampler.from_pool(pool, shares, make)
    rng = np.random.default_rng(0)
    for _ in range(3):
        for t in s1.sample(3):
            s1.update(t, [float(x) for x in rng.integers(0, 2, 2)])
    state = json.loads(json.dumps(s1.state_dict()))
    s2 = SharesSampler.from_pool(pool, shares, make)
    s2.load_state_dict(state)
    for _ in range(5):
        b1, b2 = s1.sample(3), s2.sample(3)
        assert [t["id"] for t in b1] == [t["id"] for t in b2]
        for t1, t2 in zip(b1, b2, strict=True):
            r = [float(x) for x in rng.integers(0, 2, 2)]
            s1.update(t1, r)
            s2.update(t2, r)
    assert s1.state_dict() == s2.state_dict()


def test_bad_input_is_refused_and_changes_nothing():
    pool = _pool({"a": 3, "b": 3})
    with pytest.raises(ValueError, match="without a share"):
        SharesSampler.from_pool(pool, {"a": 1}, _uniform)
    with pytest.raises(ValueError, match="without tasks"):
        SharesSampler.from_pool(pool, {"a": 1, "b": 1, "z": 1}, _uniform)
    with pytest.raises(ValueError, match=">= 0"):
        SharesSampler.from_pool(pool, {"a": 1, "b": -1}, _uniform)
    with pytest.raises(ValueError, match="positive sum"):
        SharesSampler.from_pool(pool, {"a": 0, "b": 0}, _uniform)
    with pytest.raises(TypeError, match="TaskSampler"):
        SharesSampler({"a": object()}, {"a": 1})
    s = SharesSampler.from_pool(pool, {"a": 3, "b": 1}, _uniform)
    before = s.state_dict()
    with pytest.raises(ValueError, match="positive integer"):
        s.sample(0)
    # a quota of 6 for 'a' exceeds its 3 distinct tasks: refused before anything is drawn
    with pytest.raises(ValueError, match="n=8 exceeds what source 'a' can draw: it owes 6"):
        s.sample(8)
    assert s.state_dict() == before
    with pytest.raises(KeyError, match="no share"):
        s.update({"id": "x", "env": "zzz"}, [1.0])
    other = SharesSampler.from_pool(pool, {"a": 1, "b": 1}, _uniform)
    with pytest.raises(ValueError, match="shares"):
        s.load_state_dict(other.state_dict())
    broken = s.state_dict()
    broken["samplers"]["b"]["tasks_sha256"] = "0" * 64
    with pytest.raises(ValueError, match="another task list"):
        s.load_state_dict(broken)
    assert s.state_dict() == before


def test_zero_share_source_is_never_drawn_and_tasks_concatenate():
    s = SharesSampler.from_pool(_pool({"a": 4, "b": 4}), {"a": 1, "b": 0}, _uniform)
    for _ in range(5):
        assert {t["env"] for t in s.sample(3)} == {"a"}
    assert len(s.tasks) == 8 and s.quotas(2) == {"a": 2, "b": 0}
