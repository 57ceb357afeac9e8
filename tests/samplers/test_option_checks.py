"""Every sampler's options go through the shared checks of envsched.validation: a refusal is an
InvalidValueError naming the option."""

from __future__ import annotations

import math

import pytest

from envsched.errors import InvalidValueError
from envsched.pool import TaskPool
from envsched.samplers.baselines import DynamicSamplingSampler, GRESOSampler, MoPPSSampler, PLRSampler
from envsched.samplers.dps import DPSSampler
from envsched.samplers.sec import SECSampler
from envsched.samplers.simple import CurriculumSampler, SequentialSampler


def _pool() -> TaskPool:
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 2}"} for i in range(4)])


@pytest.mark.parametrize(("make", "name", "bad"), [
    (lambda v: DPSSampler(_pool(), candidate_ratio=v), "candidate_ratio", "8"),
    (lambda v: DPSSampler(_pool(), candidate_ratio=v), "candidate_ratio", True),
    (lambda v: DPSSampler(_pool(), transition_decay=v), "transition_decay", 1.5),
    (lambda v: DPSSampler(_pool(), transition_prior=v), "transition_prior", 0),
    (lambda v: SECSampler(_pool(), learning_rate=v), "learning_rate", 0.0),
    (lambda v: SECSampler(_pool(), temperature=v), "temperature", math.inf),
    (lambda v: SECSampler(_pool(), zero_fill_unplayed=v), "zero_fill_unplayed", 1),
    (lambda v: CurriculumSampler(_pool(), group_size=v), "group_size", "6"),
    (lambda v: CurriculumSampler(_pool(), group_size=v), "group_size", True),
    (lambda v: CurriculumSampler(_pool(), group_size=v), "group_size", 2.5),
    (lambda v: CurriculumSampler(_pool(), group_size=4, decay=v), "decay", "0.9"),
    (lambda v: CurriculumSampler(_pool(), group_size=4, epsilon=v), "epsilon", 0),
    (lambda v: SequentialSampler(_pool(), seeds=v), "seeds", [1, True]),
    (lambda v: DynamicSamplingSampler(_pool(), max_gen_rounds=v), "max_gen_rounds", 0),
    (lambda v: MoPPSSampler(_pool(), prior=v), "prior", ("1", 1.0)),
    (lambda v: MoPPSSampler(_pool(), target=v), "target", math.nan),
    (lambda v: GRESOSampler(_pool(), rate_step=v), "rate_step", "0.01"),
    (lambda v: GRESOSampler(_pool(), target_zero_variance=v), "target_zero_variance", 1.0),
    (lambda v: PLRSampler(_pool(), temperature=v), "temperature", -1.0),
])
def test_sampler_options_are_checked_by_the_shared_checks(make, name: str, bad: object) -> None:
    with pytest.raises(InvalidValueError, match=f"^{name} must be ") as info:
        make(bad)
    assert info.value.name == name
