"""Strict readers for the arrays and numbers of a sampler's saved state (``state_dict()["extra"]``).

Each reader converts one field and checks its type, shape, finiteness and range, raising ``ValueError`` that
names the sampler and the field; nothing is assigned, so a loader that reads every field first and assigns
after changes nothing when any field is refused. JSON gives lists of numbers; a list holding ``None``, a
string, a bool where a number belongs (or a number where a bool belongs), NaN or an infinity is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["bool_array", "field", "float_array", "int_array", "whole_number"]

#: Largest integer a loaded counter may hold (exactly representable as a float).
MAX_COUNT = 2**53


def field(extra: Mapping[str, Any], name: str, owner: str) -> Any:
    """``extra[name]``, or ``ValueError`` naming the missing field."""
    if name not in extra:
        raise ValueError(f"malformed {owner} state: field {name!r} is missing")
    return extra[name]


def _holds_bool(value: Any) -> bool:
    """Whether a nested list holds a bool anywhere (numpy would silently turn it into 0 or 1)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool | np.bool_):
            return True
        if isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _array(value: Any, name: str, owner: str, shape: tuple[int, ...], kinds: str, what: str) -> np.ndarray:
    if not isinstance(value, list | tuple):
        raise ValueError(f"malformed {owner} state: {name!r} must be a list of {what}, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"malformed {owner} state: {name!r} is not a regular array of {what}") from None
    if arr.shape != shape:
        raise ValueError(f"malformed {owner} state: {name!r} has shape {arr.shape}, expected {shape}")
    if kinds != "b" and arr.dtype.kind in "fiu" and _holds_bool(value):
        raise ValueError(f"malformed {owner} state: {name!r} must hold only {what}, found a bool")
    if arr.size and arr.dtype.kind not in kinds:
        raise ValueError(f"malformed {owner} state: {name!r} must hold only {what} (found {arr.dtype.kind!r} "
                         "values: None, strings, bools or out-of-range integers are refused)")
    return arr


def float_array(value: Any, name: str, owner: str, shape: tuple[int, ...], *, low: float | None = None,
                high: float | None = None) -> np.ndarray:
    """A float array of exactly ``shape``, every entry finite and within ``[low, high]`` where given."""
    arr = _array(value, name, owner, shape, "iuf", "numbers").astype(float)
    if not np.isfinite(arr).all():
        raise ValueError(f"malformed {owner} state: {name!r} holds NaN or an infinity")
    if low is not None and (arr < low).any():
        raise ValueError(f"malformed {owner} state: {name!r} has a value below {low} (min {arr.min()!r})")
    if high is not None and (arr > high).any():
        raise ValueError(f"malformed {owner} state: {name!r} has a value above {high} (max {arr.max()!r})")
    return arr


def int_array(value: Any, name: str, owner: str, shape: tuple[int, ...], *, low: int = 0,
              high: int = MAX_COUNT) -> np.ndarray:
    """An integer array of exactly ``shape`` with every entry in ``[low, high]``."""
    arr = _array(value, name, owner, shape, "iu", "integers")
    if arr.size and (arr.min() < low or arr.max() > high):
        raise ValueError(f"malformed {owner} state: {name!r} has a value outside [{low}, {high}]")
    return arr.astype(np.int64)


def bool_array(value: Any, name: str, owner: str, shape: tuple[int, ...]) -> np.ndarray:
    """A boolean array of exactly ``shape`` (JSON ``true``/``false`` only)."""
    return _array(value, name, owner, shape, "b", "booleans").astype(bool)


def whole_number(value: Any, name: str, owner: str, *, low: int = 0, high: int = MAX_COUNT) -> int:
    """An ``int`` (not a bool, not a float) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not low <= value <= high:
        raise ValueError(f"malformed {owner} state: {name!r} must be an integer in [{low}, {high}], "
                         f"got {value!r:.40}")
    return int(value)
