"""envsched.validation: the checks of options and arguments, the readers of saved states (the nested-list
grids DPS keeps, packed arrays) and the check of arrays read from files, in one module."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest

import envsched
import envsched.validation as check
from envsched import errors
from envsched.errors import EnvSchedError, InvalidValueError, StateError
from envsched.validation import check_bool, check_int, check_number, interval_text, is_int, is_number

# ---------------------------------------------------------------------------------------------- option checks


@pytest.mark.parametrize("value, expected", [(3, True), (np.int64(3), True), (True, False), (np.bool_(True), False),
                                             (3.0, False), ("3", False), (None, False)])
def test_is_int(value: object, expected: bool) -> None:
    assert is_int(value) is expected


@pytest.mark.parametrize("value, expected", [(3, True), (2.5, True), (np.float32(1.5), True), (math.nan, True),
                                             (False, False), ("1", False), (None, False)])
def test_is_number(value: object, expected: bool) -> None:
    assert is_number(value) is expected


def test_python_only_checks_refuse_numpy_scalars_that_json_cannot_write() -> None:
    assert is_int(3, numpy=False) and not is_int(np.int64(3), numpy=False) and not is_int(True, numpy=False)
    assert is_number(2.5, numpy=False) and is_number(np.float64(2.5), numpy=False)  # a float subclass
    assert not is_number(np.float32(2.5), numpy=False) and not is_number(np.int64(1), numpy=False)
    assert not is_number(False, numpy=False)


def test_check_int_bounds_and_message() -> None:
    assert check_int(np.int32(4), "k", low=1) == 4 and type(check_int(np.int32(4), "k", low=1)) is int
    with pytest.raises(InvalidValueError, match=r"^k_within must be an integer >= 1, got '6'$"):
        check_int("6", "k_within", low=1)
    with pytest.raises(InvalidValueError, match=r"in \[1, 3\], got 4"):
        check_int(4, "n", low=1, high=3)
    with pytest.raises(InvalidValueError, match="got True"):
        check_int(True, "n")
    with pytest.raises(InvalidValueError, match=r"got 2\.5"):
        check_int(2.5, "n")


def test_check_number_open_bounds_and_finiteness() -> None:
    assert check_number(1, "lr", low=0, low_open=True) == 1.0
    with pytest.raises(InvalidValueError, match=r"lr must be a finite number > 0, got 0"):
        check_number(0, "lr", low=0, low_open=True)
    with pytest.raises(InvalidValueError, match=r"in \[0, 1\)"):
        check_number(1.0, "share", low=0, high=1, high_open=True)
    with pytest.raises(InvalidValueError, match="got nan"):
        check_number(math.nan, "x")
    with pytest.raises(InvalidValueError, match="got inf"):
        check_number(math.inf, "x")
    assert check_number(math.inf, "x", finite=False) == math.inf
    with pytest.raises(InvalidValueError, match="must be a number, got nan"):
        check_number(math.nan, "x", finite=False)
    with pytest.raises(InvalidValueError, match="got False"):
        check_number(False, "x")


def test_check_number_refuses_an_integer_beyond_the_float_range() -> None:
    # float(10**400) raises OverflowError: the check names the value instead
    for finite in (True, False):
        with pytest.raises(InvalidValueError, match=r"^x must be a (finite )?number >= 0, got 1000"):
            check_number(10**400, "x", low=0, finite=finite)
    assert check_number(2**1000, "x", finite=False) == float(2**1000)


def test_check_bool_refuses_truthy_values() -> None:
    assert check_bool(np.bool_(False), "flag") is False
    for bad in (1, 0, "true", None):
        with pytest.raises(InvalidValueError, match="flag must be True or False"):
            check_bool(bad, "flag")


def test_interval_text_is_shared_by_the_checks_and_the_state_readers() -> None:
    assert interval_text(0, 1) == "[0, 1]"
    assert interval_text(0, None, low_open=True) == "(0, inf)"
    assert interval_text(None, 0.5, high_open=True) == "(-inf, 0.5)"
    with pytest.raises(InvalidValueError, match=r"x must be a finite number in \(0, 1\], got 0"):
        check_number(0, "x", low=0, high=1, low_open=True)
    with pytest.raises(StateError, match=r"must be a finite number in \[0, inf\), got -1"):
        check.finite(-1, "y", low=0)


def test_refusals_are_envsched_errors() -> None:
    with pytest.raises(EnvSchedError):
        check_int("1", "n")
    with pytest.raises(EnvSchedError):
        check.whole(-1, "count")


# ---------------------------------------------------------------------------------------------- arrays in files


def test_array_problem_names_non_finite_values_and_the_smallest_below_the_bound() -> None:
    assert check.array_problem(np.array([0.0, 0.5, 1.0]), low=0.0) is None
    assert check.array_problem(np.empty(0), low=0.0) is None
    assert check.array_problem(np.array([0.5, np.nan])) == "holds NaN or infinite values"
    assert check.array_problem(np.array([-np.inf, 1.0]), low=0.0) == "holds NaN or infinite values"
    assert check.array_problem(np.array([0.5, -0.25, -0.5]), low=0.0) == "holds -0.5, below 0.0"
    assert check.array_problem(np.array([-0.5])) is None  # no bound: any finite value


# ---------------------------------------------------------------------------------------------- one home

#: the module-level functions of envsched.validation that no other module of the package may define again
_CHECKS = {name for name in check.__all__ if callable(getattr(check, name))}


@pytest.mark.slow
def test_no_other_module_defines_a_check_of_its_own() -> None:
    """The checks have one home: no other module of the package defines a function of the same name (a
    module that needs one imports it), and the former homes are gone."""
    package = Path(envsched.__file__).parent
    again = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "validation.py" and path.parent == package:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        again += [f"{path.relative_to(package)}:{node.lineno} {node.name}" for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef) and node.name in _CHECKS]
    assert again == []
    assert not (package / "samplers" / "_validate.py").exists()
    assert not {"check_int", "check_number", "check_bool", "is_int", "is_number"} & set(vars(errors))


# ---------------------------------------------------------------------------------------------- saved states


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
    with pytest.raises(StateError, match=message):
        check.float_grid(value, "alpha", (2, 2), low=0.0, high=9.0)


def test_int_and_bool_grids() -> None:
    assert check.int_grid([[1, 2], [3, 4]], "n", (2, 2)).tolist() == [[1, 2], [3, 4]]
    with pytest.raises(StateError, match=r"^n\[1\]\[0\] must be a whole number in \[0, 5\], got 3\.0$"):
        check.int_grid([[1, 2], [3.0, 4]], "n", (2, 2), high=5)
    assert check.bool_grid([[True], [False]], "b", (2, 1)).tolist() == [[True], [False]]
    with pytest.raises(StateError, match=r"^b\[1\]\[0\] must be true or false, got 0$"):
        check.bool_grid([[True], [0]], "b", (2, 1))


def test_pack_writes_long_arrays_packed_and_both_forms_read_back_exactly():
    with pytest.raises(TypeError, match="integers or floats, got dtype bool"):
        check.pack(np.ones(5000, dtype=bool))  # a bool array would read back as numbers
    short = np.array([0.1, -0.0, 5e-324])
    assert check.pack(short) == [0.1, -0.0, 5e-324]  # below PACK_MIN_ENTRIES: a readable list
    floats = np.random.default_rng(0).random(check.PACK_MIN_ENTRIES) / 3
    floats[:3] = (0.1, 1 / 3, 5e-324)
    packed = json.loads(json.dumps(check.pack(floats)))
    assert packed["packed"] == "<f8" and set(packed) == {"packed", "base64"}
    back = check.float_array(packed, "x", length=floats.size, low=0.0, high=0.5)
    assert back.tobytes() == floats.tobytes() and back.flags.writeable
    ints = np.arange(check.PACK_MIN_ENTRIES) * 3
    got = check.int_array(json.loads(json.dumps(check.pack(ints))), "y", high=int(ints[-1]), dtype=np.int32)
    assert got.dtype == np.int32 and np.array_equal(got, ints)
    with pytest.raises(StateError, match=r"^y\[4\] must be a whole number in \[0, 10\], got 12$"):
        check.int_array(check.pack(ints), "y", high=10)
    with pytest.raises(StateError, match=r"^x must have at most 10 entries, got 1024$"):
        check.float_array(packed, "x", max_length=10)
    with pytest.raises(StateError, match=r"^y must be a packed array of dtype '<i8', got '<f8'$"):
        check.int_array(packed, "y")
    odd = {"packed": "<f8", "base64": __import__("base64").b64encode(b"\0" * 12).decode()}
    with pytest.raises(StateError, match=r"^x\.base64 holds 12 bytes, not a whole number of <f8 entries$"):
        check.float_array(odd, "x")
    nan = floats.copy()
    nan[7] = np.nan
    with pytest.raises(StateError, match=r"^x\[7\] must be a finite number in \[0\.0, 0\.5\], got nan$"):
        check.float_array(check.pack(nan), "x", low=0.0, high=0.5)
    allowed = np.zeros(nan.size, dtype=bool)
    allowed[7] = True
    assert np.isnan(check.float_array(check.pack(nan), "x", allow_nan=allowed)[7])
