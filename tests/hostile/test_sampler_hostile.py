"""Hostile updates, sample sizes and saved states: refused with an error naming the problem, state unchanged
(``state_dict()`` before == after), and a refused state never half-applied."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest

from envsched.samplers import CurriculumSampler, UniformSampler
from envsched.samplers.base import MAX_BATCH
from envsched.testing import BAD_UPDATES, bad_updates  # the one table of bad updates (check_sampler runs it too)


def _drawn(sampler: Any) -> str:
    (task,) = sampler.sample(1)
    return task["id"]


# ------------------------------------------------------------------ updates
@pytest.mark.parametrize("case", sorted(BAD_UPDATES))
def test_bad_update_is_refused_and_changes_nothing(pool: Any, refuses: Any, case: str) -> None:
    rewards, costs, match = bad_updates()[case]
    s = UniformSampler(pool, seed=0)
    key = _drawn(s)
    refuses(s, lambda: s.update(key, rewards, costs), ValueError, match)


def test_cost_counter_stays_finite_across_updates(pool: Any, refuses: Any) -> None:
    s = UniformSampler(pool, seed=0)
    a, b = s.sample(2)
    s.update(a, [1.0, 0.0], [1e308, 5e307])
    refuses(s, lambda: s.update(b, [1.0, 0.0], [1e308, 0.0]), ValueError, "infinite")
    assert math.isfinite(s.cost)


@pytest.mark.parametrize("task", ["nope", {"id": "nope", "env": "x"}, {"env": "x"}])
def test_update_for_an_unknown_task(pool: Any, refuses: Any, task: Any) -> None:
    s = UniformSampler(pool, seed=0)
    _drawn(s)
    refuses(s, lambda: s.update(task, [1.0]), KeyError, "unknown task|no 'id'")


def test_update_without_dispatch(pool: Any, refuses: Any) -> None:
    s = UniformSampler(pool, seed=0)
    refuses(s, lambda: s.update("t03", [1.0]), ValueError, "without an outstanding dispatch")


# ------------------------------------------------------------------ sample sizes
@pytest.mark.parametrize("n", [0, -1, 1.5, True, "3", None, np.float64(2.0), 13, 10**12])
def test_bad_sample_size_on_a_distinct_sampler(pool: Any, refuses: Any, n: Any) -> None:
    s = UniformSampler(pool, seed=0)
    refuses(s, lambda: s.sample(n), ValueError, "n must be a positive integer|exceeds")


@pytest.mark.parametrize("n", [10**12, MAX_BATCH + 1, 2**63])
def test_huge_sample_size_is_refused_before_allocating(pool: Any, refuses: Any, n: int) -> None:
    s = CurriculumSampler(pool, group_size=4, seed=0)
    e = refuses(s, lambda: s.sample(n), ValueError, f"n={n} exceeds")
    assert "MAX_BATCH" in str(e)


# ------------------------------------------------------------------ states
def _state(sampler: Any) -> dict[str, Any]:
    return copy.deepcopy(sampler.state_dict())


def _with(state: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(state)
    node = out
    for p in path[:-1]:
        node = node[p]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


_DELETE = object()
_OUT_COUNT = r"outstanding\[.t01.\] must be an? (integer count|whole number)"
BAD_STATES: dict[str, tuple[tuple[str, ...], Any, str]] = {
    "groups infinite": (("counters", "groups"), math.inf, "counters.groups must be a whole number"),
    "groups -infinite": (("counters", "groups"), -math.inf, "counters.groups must be a whole number"),
    "episodes nan": (("counters", "episodes"), math.nan, "counters.episodes must be a whole number"),
    "cost nan": (("counters", "cost"), math.nan, "counters.cost must be a finite number"),
    "cost infinite": (("counters", "cost"), math.inf, "counters.cost must be a finite number"),
    "cost negative": (("counters", "cost"), -1.0, "counters.cost must be a finite number"),
    "cost a string": (("counters", "cost"), "1", "counters.cost must be a finite number"),
    "groups True": (("counters", "groups"), True, "counters.groups must be a whole number"),
    "groups 2.7": (("counters", "groups"), 2.7, "counters.groups must be a whole number"),
    "groups negative": (("counters", "groups"), -3, "counters.groups must be a whole number"),
    "groups 2**60": (("counters", "groups"), 2**60, "counters.groups must be a whole number"),
    "groups a string": (("counters", "groups"), "4", "counters.groups must be a whole number"),
    "counter missing": (("counters", "signal_groups"), _DELETE, "counters.signal_groups is missing"),
    "counters a list": (("counters",), [1, 2], "counters must be an object"),
    "outstanding a string count": (("outstanding",), {"t01": "3"}, _OUT_COUNT),
    "outstanding a float count": (("outstanding",), {"t01": 2.0}, _OUT_COUNT),
    "outstanding negative": (("outstanding",), {"t01": -1}, _OUT_COUNT),
    "outstanding unknown task": (("outstanding",), {"zzz": 1}, "outstanding names task 'zzz'"),
    "outstanding a list": (("outstanding",), ["t01"], "outstanding must be an object"),
    "last batch unknown": (("last_batch",), ["zzz"], "last_batch"),
    "last batch a string": (("last_batch",), "t01", "last_batch"),
    "rng huge state": (("rng", "state", "state"), 2**200, "rng.*random generator state"),
    "rng a string": (("rng",), "PCG64", "rng.*random generator state"),
    "rng wrong generator": (("rng", "bit_generator"), "MT19937", "rng.*random generator state"),
    "rng missing": (("rng",), _DELETE, "rng.*random generator state"),
    "format": (("format",), "envsched.sampler/0", "unsupported sampler state format"),
    "another sampler": (("sampler",), "PLRSampler", "saved by 'PLRSampler'"),
    "another task list": (("tasks_sha256",), "0" * 64, "another task list"),
    "extra a list": (("extra",), [1], "extra must be an object"),
    "extra epoch infinite": (("extra", "epoch"), math.inf, "malformed UniformSampler state"),
    "extra order not a permutation": (("extra", "order"), [0] * 12, "not a permutation"),
}


@pytest.mark.parametrize("case", sorted(BAD_STATES))
def test_bad_state_is_refused_whole(pool: Any, refuses: Any, case: str) -> None:
    path, value, match = BAD_STATES[case]
    donor = UniformSampler(pool, seed=5)
    for _ in range(3):
        (t,) = donor.sample(1)
        donor.update(t, [1.0, 0.0], [1.0, 1.0])
    donor.sample(2)
    bad = _with(_state(donor), path, value)
    s = UniformSampler(pool, seed=0)
    _drawn(s)
    next_draws = _state(s)
    refuses(s, lambda: s.load_state_dict(bad), ValueError, match)
    # the sampler keeps drawing exactly as before: nothing of the refused state was applied
    twin = UniformSampler(pool, seed=0)
    twin.load_state_dict(next_draws)
    assert [t["id"] for t in s.sample(5)] == [t["id"] for t in twin.sample(5)]


@pytest.mark.parametrize("state", [None, [], "state", 3, {"format": "envsched.sampler/1"}])
def test_state_that_is_not_a_state(pool: Any, refuses: Any, state: Any) -> None:
    s = CurriculumSampler(pool, group_size=2, seed=0)
    refuses(s, lambda: s.load_state_dict(state), ValueError, "state")


def test_infinite_counter_does_not_half_apply(pool: Any) -> None:
    """The audit's case: counters of Infinity once applied order/cursor/epoch, then raised OverflowError."""
    donor = UniformSampler(pool, seed=9)
    donor.sample(5)
    bad = _with(_state(donor), ("counters", "groups"), math.inf)
    s = UniformSampler(pool, seed=0)
    before = _state(s)
    with pytest.raises(ValueError, match="groups"):
        s.load_state_dict(bad)
    assert _state(s) == before
