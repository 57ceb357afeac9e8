"""The base of every exception envsched raises, and the shared checks of user-supplied values.

Every exception class the package defines derives from :class:`EnvSchedError`, so a caller can catch
anything envsched raised on purpose with one ``except EnvSchedError``; each class also keeps the built-in
base it had before (``ValueError``, ``RuntimeError``, ...), so existing ``except ValueError`` code is
unaffected.

The checks below are the one place where "an integer" means "an ``int`` (or numpy integer) that is not a
``bool``" and "a number" means "an ``int`` or ``float`` that is not a ``bool``": configs, CLI parsers and
loaders use them instead of repeating ``isinstance(x, bool) or not isinstance(x, int)``. A failed check
raises :class:`InvalidValueError`, which is both a ``ValueError`` and a ``TypeError`` (a wrong type and a
wrong range are both "this value is not admissible"), with a message that starts with the value's name:
``k_within must be an integer >= 1, got '6'``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "EnvSchedError",
    "InvalidValueError",
    "check_bool",
    "check_int",
    "check_number",
    "interval_text",
    "is_int",
    "is_number",
]


class EnvSchedError(Exception):
    """Base of every exception raised by envsched on purpose."""


class InvalidValueError(EnvSchedError, ValueError, TypeError):
    """A user-supplied value of the wrong type or outside its admissible range.

    Attributes:
        name: what the value is (a parameter, a field, an option).
        value: the value that was refused.
    """

    def __init__(self, message: str, *, name: str = "", value: Any = None) -> None:
        super().__init__(message)
        self.name = name
        self.value = value


def is_int(value: Any, *, numpy: bool = True) -> bool:
    """Whether ``value`` is an integer: a Python or numpy integer, never a ``bool``. With ``numpy=False`` only
    a Python ``int`` counts (a value that goes into JSON as it is, e.g. a task spec's field)."""
    if not numpy:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def is_number(value: Any, *, numpy: bool = True) -> bool:
    """Whether ``value`` is a real number: a Python or numpy integer or float, never a ``bool``. NaN and the
    infinities are numbers here; :func:`check_number` refuses them unless asked not to. With ``numpy=False``
    only a Python ``int`` or ``float`` (or a subclass, such as ``numpy.float64``) counts, as JSON writes it."""
    if not numpy:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool | np.bool_)


def interval_text(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    """The admissible interval in interval notation, ``[0, 1)`` or ``(0, inf)`` (a missing bound is an open
    infinity); the messages of these checks and of the state loaders (``envsched.samplers._validate``) use it."""
    lo = "(" if low_open or low is None else "["
    hi = ")" if high_open or high is None else "]"
    return f"{lo}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi}"


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """The bounds for a message: ``in [low, high]`` with both, ``>= low`` or ``<= high`` with one."""
    if low is not None and high is not None:
        return f"in {interval_text(low, high, low_open, high_open)}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high}"
    return ""


def check_int(value: Any, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an ``int`` if it is an integer in ``[low, high]`` (each bound optional); otherwise
    :class:`InvalidValueError` naming ``name``."""
    if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        where = _bounds(low, high, False, False)
        raise InvalidValueError(f"{name} must be an integer{' ' + where if where else ''}, got {value!r}",
                                name=name, value=value)
    return int(value)


def check_number(value: Any, name: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, finite: bool = True) -> float:
    """``value`` as a ``float`` if it is a number within the bounds (``low_open``/``high_open`` exclude the
    bound itself) and, unless ``finite=False``, neither NaN nor infinite; otherwise
    :class:`InvalidValueError` naming ``name``."""
    ok = is_number(value)
    if ok:
        v = float(value)
        below = low is not None and (v <= low if low_open else v < low)
        above = high is not None and (v >= high if high_open else v > high)
        ok = not (math.isnan(v) or (finite and math.isinf(v)) or below or above)
    if not ok:
        where = _bounds(low, high, low_open, high_open)
        kind = "a finite number" if finite else "a number"
        raise InvalidValueError(f"{name} must be {kind}{' ' + where if where else ''}, got {value!r}",
                                name=name, value=value)
    return float(value)


def check_bool(value: Any, name: str) -> bool:
    """``value`` if it is a ``bool`` (or numpy bool); otherwise :class:`InvalidValueError` naming ``name``
    (``1`` and ``"true"`` are refused: a switch is ``True`` or ``False``)."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidValueError(f"{name} must be True or False, got {value!r}", name=name, value=value)
    return bool(value)
