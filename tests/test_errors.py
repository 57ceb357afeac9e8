"""envsched.errors: the exception base and the shared value checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envsched.errors import (
    EnvSchedError,
    InvalidValueError,
    check_bool,
    check_int,
    check_number,
    interval_text,
    is_int,
    is_number,
)


def test_invalid_value_error_is_value_type_and_envsched_error() -> None:
    err = InvalidValueError("x must be an integer, got 'a'", name="x", value="a")
    assert isinstance(err, EnvSchedError) and isinstance(err, ValueError) and isinstance(err, TypeError)
    assert (err.name, err.value) == ("x", "a")


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


def test_check_bool_refuses_truthy_values() -> None:
    assert check_bool(np.bool_(False), "flag") is False
    for bad in (1, 0, "true", None):
        with pytest.raises(InvalidValueError, match="flag must be True or False"):
            check_bool(bad, "flag")


def test_interval_text_is_shared_by_the_checks_and_the_state_loaders() -> None:
    from envsched.samplers._validate import StateError, finite

    assert interval_text(0, 1) == "[0, 1]"
    assert interval_text(0, None, low_open=True) == "(0, inf)"
    assert interval_text(None, 0.5, high_open=True) == "(-inf, 0.5)"
    with pytest.raises(InvalidValueError, match=r"x must be a finite number in \(0, 1\], got 0"):
        check_number(0, "x", low=0, high=1, low_open=True)
    with pytest.raises(StateError, match=r"must be a finite number in \[0, inf\), got -1"):
        finite(-1, "y", low=0)
