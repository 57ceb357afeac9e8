"""RewardScale: the rule every trainer integration uses to pass rewards of any scale to a sampler."""

from __future__ import annotations

import math

import pytest

from envsched.integrations._rewards import RewardScale


def test_learned_range_is_identity_inside_the_declared_range_and_widens_outside():
    s = RewardScale((0.0, 1.0))
    assert s.map([0.0, 0.25, 1.0, None]) == [0.0, 0.25, 1.0, None]
    assert s.metrics()["rewards_rescaled"] == 0
    assert s.map([2.0, 1.0]) == [1.0, 0.5]  # range [0, 2] from this group on
    assert s.map([-2.0, 0.0]) == [0.0, 0.5]  # range [-2, 2]
    assert s.metrics() == {"rewards_nonfinite": 0.0, "rewards_clipped": 0.0, "rewards_rescaled": 2.0,
                           "reward_range_low": -2.0, "reward_range_high": 2.0}


def test_nonfinite_rewards_become_none_and_are_counted():
    s = RewardScale((0.0, 1.0))
    assert s.map([math.nan, math.inf, -math.inf, 0.5]) == [None, None, None, 0.5]
    assert s.metrics()["rewards_nonfinite"] == 3 and s.metrics()["reward_range_high"] == 1.0
    with pytest.raises(ValueError, match="number or None"):
        s.map(["high"])


def test_given_range_maps_onto_the_sampler_range_and_clips():
    s = RewardScale((-1.0, 1.0), reward_range=(0.0, 10.0))
    assert s.map([0.0, 5.0, 10.0, 12.0, -3.0]) == [-1.0, 0.0, 1.0, 1.0, -1.0]
    assert s.metrics()["rewards_clipped"] == 2
    with pytest.raises(ValueError, match="low < high"):
        RewardScale((0.0, 1.0), reward_range=(2.0, 2.0))
    with pytest.raises(ValueError, match="pair"):
        RewardScale((0.0, 1.0), reward_range=5.0)


def test_state_round_trip_and_mismatch_refused():
    s = RewardScale((0.0, 1.0))
    s.map([3.0, 0.0, math.nan])
    t = RewardScale((0.0, 1.0))
    t.load_state_dict(s.state_dict())
    assert t.map([1.5]) == s.map([1.5]) == [0.5]
    fixed = RewardScale((0.0, 1.0), reward_range=(0.0, 5.0))
    with pytest.raises(ValueError, match="does not match"):
        fixed.load_state_dict(t.state_dict())
    with pytest.raises(ValueError, match="not a RewardScale state"):
        t.load_state_dict({"format": "x"})
    assert fixed.source == (0.0, 5.0)  # unchanged after the refusals
