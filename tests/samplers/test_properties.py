"""Property-based tests of the sampler invariants over random pools and random update streams.

For every sampler: the counters add up to what was reported, the caps hold (batch size, distinct tasks,
outstanding dispatches), ``None`` never enters an estimate (a twin fed the same groups with the ``None``s
removed makes the same decisions and holds the same statistics), and the state round-trips through JSON
(a sampler restored mid-stream continues identically).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envsched.method.sampler import EnvSchedSampler
from envsched.pool import TaskPool
from envsched.samplers import CurriculumSampler, SequentialSampler, UniformSampler
from envsched.samplers.base import group_mean_variance, is_signal_group
from envsched.samplers.dps import DPSSampler
from envsched.samplers.sec import SECSampler

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)


FACTORIES = {
    "uniform": lambda: (lambda pool: UniformSampler(pool, seed=3)),
    "curriculum-difficulty": lambda: (lambda pool: CurriculumSampler(pool, group_size=4, key="difficulty", seed=3)),
    "curriculum-id": lambda: (lambda pool: CurriculumSampler(pool, group_size=4, key="id", decay=1.0, seed=3)),
    "sequential": lambda: (lambda pool: SequentialSampler(pool, seeds=[0, 1], wrap=True, require_dispatch=True)),
    "envsched": lambda: (lambda pool: EnvSchedSampler(pool, seed=3)),
    "dps": lambda: (lambda pool: DPSSampler(pool, seed=3)),
    "dps-progress-entropy": lambda: (lambda pool: DPSSampler(pool, seed=3, candidate_ratio=2.0,
                                                             transition_prior="progress", entropy_weight=0.1)),
    "sec": lambda: (lambda pool: SECSampler(pool, seed=3)),
    "sec-zero-fill": lambda: (lambda pool: SECSampler(pool, seed=3, temperature=0.2, zero_fill_unplayed=True)),
}

REWARD = st.one_of(st.none(), st.sampled_from([0.0, 1.0, 0.5]), st.floats(0.0, 1.0, allow_nan=False))


@st.composite
def pools(draw: Any) -> TaskPool:
    n = draw(st.integers(2, 14))
    envs = draw(st.integers(1, 4))
    specs = []
    for i in range(n):
        spec: dict[str, Any] = {"id": f"t{i}", "env": f"env{draw(st.integers(0, envs - 1))}",
                                "instruction": f"do {draw(st.sampled_from(['book', 'cancel', 'list', 'sum']))} {i}",
                                "tools": [{"name": draw(st.sampled_from(["a", "b", "c"])), "description": "t"}]}
        if draw(st.booleans()):
            spec["difficulty"] = draw(st.integers(0, 3))
        specs.append(spec)
    return TaskPool(specs)


@st.composite
def streams(draw: Any) -> list[tuple[Any, ...]]:
    ops = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["sample", "update", "update", "update", "discard", "roundtrip"]))
        if kind == "sample":
            ops.append(("sample", draw(st.integers(1, 4))))
        elif kind == "update":
            size = draw(st.integers(1, 6))
            rewards = draw(st.lists(REWARD, min_size=size, max_size=size))
            costs = draw(st.one_of(st.none(), st.lists(st.floats(0, 10, allow_nan=False), min_size=size,
                                                        max_size=size)))
            ops.append(("update", draw(st.integers(0, 100)), rewards, costs))
        elif kind == "discard":
            ops.append(("discard", draw(st.integers(0, 100))))
        else:
            ops.append(("roundtrip",))
    return ops


def _same(a: Any, b: Any) -> bool:
    """Equal, counting NaN equal to NaN (a state may hold NaN, e.g. the mean of a group with no scored reward)."""
    return json.dumps(a, sort_keys=True, default=lambda o: np.asarray(o).tolist()) == json.dumps(
        b, sort_keys=True, default=lambda o: np.asarray(o).tolist())


def _key(t: Any) -> str:
    return t["id"]


def _estimates(sampler: Any) -> Any:
    """What the sampler estimated from rewards (its learned statistics), without the reward-free counters."""
    extra = json.loads(json.dumps(sampler.state_dict()["extra"], default=lambda o: np.asarray(o).tolist()))
    if isinstance(sampler, CurriculumSampler):
        return {k: extra[k] for k in ("successes", "failures")}
    return extra if isinstance(sampler, UniformSampler | SequentialSampler | DPSSampler | SECSampler) else None


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_invariants_hold_over_random_streams(kind: str) -> None:
    make = FACTORIES[kind]()
    # EnvSchedSampler builds its graph per pool: fewer, still random, examples
    examples = 6 if kind == "envsched" else 30
    settings(SETTINGS, max_examples=examples)(given(pool=pools(), ops=streams())(_check_stream))(make)


def _check_stream(make: Any, pool: TaskPool, ops: list[tuple[Any, ...]]) -> None:
    sampler = make(pool)
    twin = make(pool)  # gets the same groups with every None removed, until a group is all None
    outstanding: Counter[str] = Counter()
    groups = episodes = unscored = signal = dispatched = discarded = 0
    cost = 0.0
    limit = sampler.max_sample_size()
    for op in ops:
        if op[0] == "sample":
            n = op[1] if limit is None else min(op[1], limit)
            batch = sampler.sample(n)
            if twin is not None:  # the Nones changed no decision
                assert [_key(t) for t in twin.sample(n)] == [_key(t) for t in batch]
            assert len(batch) == n if not isinstance(sampler, SequentialSampler) else len(batch) <= n
            if sampler.distinct_per_batch:
                assert len({_key(t) for t in batch}) == len(batch)
            assert all(_key(t) in pool for t in batch)
            outstanding.update(_key(t) for t in batch)
            dispatched += len(batch)
        elif op[0] == "update":
            if not outstanding:
                with pytest.raises(ValueError, match="without an outstanding dispatch"):
                    sampler.update(pool[0]["id"], op[2], op[3])
                continue
            key = sorted(outstanding)[op[1] % len(outstanding)]
            rewards, costs = op[2], op[3]
            sampler.update(key, rewards, costs)
            scored = [r for r in rewards if r is not None]
            if not scored:
                # an all-None group is an observation for the sampler (it counts for coverage) but the twin
                # could only discard it: from here on the twin may draw other tasks, so it stops
                twin = None
            elif twin is not None:
                twin.update(key, scored, None if costs is None else
                            [c for c, r in zip(costs, rewards, strict=True) if r is not None])
            outstanding[key] -= 1
            outstanding += Counter()
            groups += 1
            episodes += len(rewards)
            unscored += len(rewards) - len(scored)
            # a signal group by the one definition (rewards already on [0, 1], the pools' range)
            signal += int(len(scored) >= 2 and bool(is_signal_group(len(scored), group_mean_variance(scored)[1])))
            cost += sum(costs or [])
        elif op[0] == "discard":
            if not outstanding:
                continue
            key = sorted(outstanding)[op[1] % len(outstanding)]
            sampler.discard(key)
            if twin is not None:
                twin.discard(key)
            outstanding[key] -= 1
            outstanding += Counter()
            discarded += 1
        else:  # round-trip through JSON into a fresh sampler, and continue with the restored one
            restored = make(pool)
            restored.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
            assert _same(restored.state_dict(), sampler.state_dict())
            sampler = restored

        # counters add up
        m = sampler.metrics()
        assert (m["groups"], m["episodes"], m["unscored_episodes"], m["signal_groups"]) == (
            groups, episodes, unscored, signal)
        assert m["dispatched_groups"] == dispatched and m["discarded_groups"] == discarded
        assert math.isclose(m["cost"], cost, rel_tol=1e-9, abs_tol=1e-9)
        # caps: outstanding dispatches are exactly those drawn and neither reported nor discarded
        assert sampler.outstanding() == dict(outstanding)
        assert m["outstanding_groups"] == dispatched - groups - discarded >= 0
        assert 0.0 <= m["zero_signal_fraction"] <= 1.0
        if isinstance(sampler, CurriculumSampler):
            w = np.asarray(list(sampler.weights().values()))
            assert np.all(w >= sampler.epsilon - 1e-12) and np.all(w <= 1 + sampler.epsilon + 1e-12)
            assert all(0.0 < p < 1.0 for p in sampler.success_probabilities().values())
        # None never enters an estimate (until a group is all None)
        if twin is not None:
            assert _same(_estimates(sampler), _estimates(twin))

    # the final state round-trips, and the restored sampler makes the same next draws
    restored = make(pool)
    restored.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    n = 3 if limit is None else min(3, limit)
    assert [_key(t) for t in restored.sample(n)] == [_key(t) for t in sampler.sample(n)]
