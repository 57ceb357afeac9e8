"""Numeric settings read from environment variables (server limits, scorer budgets): one parser, so every
such variable is refused the same way, naming itself, when it is not a number in its range."""

from __future__ import annotations

import math
import os

__all__ = ["env_number"]


def env_number(name: str, default: float, *, integer: bool = False, high: float | None = None,
               unit: str = "") -> float:
    """The value of environment variable ``name`` (``default`` when unset or blank): a number above 0 (an
    integer with ``integer``), at most ``high`` when given. ``ValueError`` naming the variable otherwise."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    what = "a positive integer" if integer else f"a number of {unit}" if unit else "a positive number"
    try:
        value: float = int(raw) if integer else float(raw)
    except ValueError:
        raise ValueError(f"{name} must be {what}, got {raw!r}") from None
    if not (math.isfinite(value) and value > 0 and (high is None or value <= high)):
        allowed = what if high is None else f"in (0, {high:g}]" + (f" {unit}" if unit else "")
        raise ValueError(f"{name} must be {allowed}, got {raw!r}")
    return value
