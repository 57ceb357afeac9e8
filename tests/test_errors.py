"""envsched.errors: the exception base and the exceptions of refused values (the checks that raise them:
tests/test_validation.py)."""

from __future__ import annotations

from envsched.errors import EnvSchedError, InvalidValueError, StateError


def test_invalid_value_error_is_value_type_and_envsched_error() -> None:
    err = InvalidValueError("x must be an integer, got 'a'", name="x", value="a")
    assert isinstance(err, EnvSchedError) and isinstance(err, ValueError) and isinstance(err, TypeError)
    assert (err.name, err.value) == ("x", "a")


def test_state_error_names_the_field_and_its_owner_from_an_enclosing_state() -> None:
    err = StateError("alpha[3]", "must be a finite number in [0, 1], got nan")
    assert isinstance(err, EnvSchedError) and isinstance(err, ValueError)
    assert str(err) == "alpha[3] must be a finite number in [0, 1], got nan"
    outer = err.within("extra.", "DPSSampler")
    assert (outer.field, outer.problem, outer.owner) == ("extra.alpha[3]", err.problem, "DPSSampler")
    assert str(outer) == "malformed DPSSampler state: extra.alpha[3] must be a finite number in [0, 1], got nan"
    assert str(outer.within("x.")) == "malformed DPSSampler state: x.extra.alpha[3] " + err.problem
