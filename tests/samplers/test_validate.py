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


def test_pack_writes_long_arrays_packed_and_both_forms_read_back_exactly():
    import json

    from envsched.samplers import _validate

    with pytest.raises(TypeError, match="integers or floats, got dtype bool"):
        _validate.pack(np.ones(5000, dtype=bool))  # a bool array would read back as numbers
    short = np.array([0.1, -0.0, 5e-324])
    assert _validate.pack(short) == [0.1, -0.0, 5e-324]  # below PACK_MIN_ENTRIES: a readable list
    floats = np.random.default_rng(0).random(_validate.PACK_MIN_ENTRIES) / 3
    floats[:3] = (0.1, 1 / 3, 5e-324)
    packed = json.loads(json.dumps(_validate.pack(floats)))
    assert packed["packed"] == "<f8" and set(packed) == {"packed", "base64"}
    back = _validate.float_array(packed, "x", length=floats.size, low=0.0, high=0.5)
    assert back.tobytes() == floats.tobytes() and back.flags.writeable
    ints = np.arange(_validate.PACK_MIN_ENTRIES) * 3
    got = _validate.int_array(json.loads(json.dumps(_validate.pack(ints))), "y", high=int(ints[-1]), dtype=np.int32)
    assert got.dtype == np.int32 and np.array_equal(got, ints)
    with pytest.raises(_validate.StateError, match=r"^y\[4\] must be a whole number in \[0, 10\], got 12$"):
        _validate.int_array(_validate.pack(ints), "y", high=10)
    with pytest.raises(_validate.StateError, match=r"^x must have at most 10 entries, got 1024$"):
        _validate.float_array(packed, "x", max_length=10)
    with pytest.raises(_validate.StateError, match=r"^y must be a packed array of dtype '<i8', got '<f8'$"):
        _validate.int_array(packed, "y")
    odd = {"packed": "<f8", "base64": __import__("base64").b64encode(b"\0" * 12).decode()}
    with pytest.raises(_validate.StateError, match=r"^x\.base64 holds 12 bytes, not a whole number of <f8 entries$"):
        _validate.float_array(odd, "x")
    nan = floats.copy()
    nan[7] = np.nan
    with pytest.raises(_validate.StateError, match=r"^x\[7\] must be a finite number in \[0\.0, 0\.5\], got nan$"):
        _validate.float_array(_validate.pack(nan), "x", low=0.0, high=0.5)
    allowed = np.zeros(nan.size, dtype=bool)
    allowed[7] = True
    assert np.isnan(_validate.float_array(_validate.pack(nan), "x", allow_nan=allowed)[7])
