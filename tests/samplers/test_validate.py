"""samplers/_validate: the shared readers of saved sampler states (the nested-list grids DPS keeps)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envsched.errors import InvalidValueError
from envsched.pool import TaskPool
from envsched.samplers import _validate as check
from envsched.samplers.baselines import DynamicSamplingSampler, GRESOSampler, MoPPSSampler, PLRSampler
from envsched.samplers.dps import DPSSampler
from envsched.samplers.sec import SECSampler
from envsched.samplers.simple import CurriculumSampler, SequentialSampler


def test_float_grid_reads_a_nested_list_of_its_shape() -> None:
    arr = check.float_grid([[[1, 2.5], [0, 3]], [[4, 5], [6, 7]]], "alpha", (2, 2, 2), low=0.0)
    assert arr.shape == (2, 2, 2) and arr.dtype == np.float64 and arr[0, 0, 1] == 2.5 and arr[1, 1, 0] == 6.0
    assert check.float_grid([], "alpha", (0, 3, 3)).shape == (0, 3, 3)


@pytest.mark.parametrize(("value", "message"), [
    ([[1.0, 2.0], [3.0]], r"^alpha\[1\] must have 2 entries, got 1$"),
    ([[1.0, 2.0], 3.0], r"^alpha\[1\] must be a list, got float$"),
    ([[1.0, 2.0], [3.0, math.nan]], r"^alpha\[1\]\[1\] must be a finite number in \[0\.0, 9\.0\], got nan$"),
    ([[1.0, True], [3.0, 4.0]], r"^alpha\[0\]\[1\] must be a finite number in \[0\.0, 9\.0\], got True$"),
    ([[1.0, 2.0], [3.0, 9.5]], r"^alpha\[1\]\[1\] must be a finite number in \[0\.0, 9\.0\], got 9\.5$"),
    ([[1.0, 2.0]], r"^alpha must have 2 entries, got 1$"),
])
def test_float_grid_names_the_offending_entry(value: object, message: str) -> None:
    with pytest.raises(check.StateError, match=message):
        check.float_grid(value, "alpha", (2, 2), low=0.0, high=9.0)


def test_int_and_bool_grids() -> None:
    assert check.int_grid([[1, 2], [3, 4]], "n", (2, 2)).tolist() == [[1, 2], [3, 4]]
    with pytest.raises(check.StateError, match=r"^n\[1\]\[0\] must be a whole number in \[0, 5\], got 3\.0$"):
        check.int_grid([[1, 2], [3.0, 4]], "n", (2, 2), high=5)
    assert check.bool_grid([[True], [False]], "b", (2, 1)).tolist() == [[True], [False]]
    with pytest.raises(check.StateError, match=r"^b\[1\]\[0\] must be true or false, got 0$"):
        check.bool_grid([[True], [0]], "b", (2, 1))


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
