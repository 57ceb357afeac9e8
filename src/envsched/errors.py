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

:func:`redact_url` is the one place where a URL is made fit for a message: every message, page title or
summary that shows a store URL shows it through this function (the password and credential-bearing query
parameters become ``***``); :func:`redact_secrets` takes the same secrets out of any other text, such as a
database driver's error message.
"""

from __future__ import annotations

import math
import re
from typing import Any
from urllib.parse import unquote_plus

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
    "redact_secrets",
    "redact_url",
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


# ---------------------------------------------------------------------------------------------- secrets in URLs
#: query parameter names that carry a credential (matched anywhere in the decoded, case-folded name):
#: ``password``, ``sslpassword``, ``passwd``, ``pwd``, ``secret``, ``token``, ``api_key``, ``auth``, ...
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|key|auth|cred|sig", re.IGNORECASE)
#: a ``name=value`` pair with a secret name inside a parameter's value (libpq's ``dbname`` may hold a whole
#: connection string)
_SECRET_PAIR = re.compile(r"(?:pass|pwd|secret|token|key|auth|cred|sig)\w*\s*=", re.IGNORECASE)
REDACTED = "***"


def _secret_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every secret in the URL ``text``: the password of the userinfo (as SQLAlchemy reads it,
    up to the first ``@``, and as RFC 3986 reads it, up to the last ``@`` of the authority: both are hidden)
    and the value of each query parameter whose name, or whose value's own ``name=value`` pairs, name a
    credential."""
    start = text.find("://")
    if start < 0:
        return []
    start += 3
    spans: list[tuple[int, int]] = []
    colon = start
    while colon < len(text) and text[colon] not in ":/@?#":
        colon += 1
    if colon < len(text) and text[colon] == ":":
        first_at = text.find("@", colon)
        end = min([i for i in (text.find(c, colon) for c in "/?#") if i >= 0], default=len(text))
        last_at = text.rfind("@", colon, end)
        for at in (first_at, last_at):
            if at > colon:
                spans.append((colon + 1, at))
    # the query: after the authority (and after any password span, which may itself hold '?')
    after = max([start] + [e for _, e in spans])
    q = text.find("?", after)
    if q >= 0:
        end_q = text.find("#", q)
        end_q = len(text) if end_q < 0 else end_q
        pos = q + 1
        for part in re.split(r"[&;]", text[q + 1:end_q]):
            name, eq, value = part.partition("=")
            if eq and value:
                try:
                    decoded_name, decoded_value = unquote_plus(name), unquote_plus(value)
                except (UnicodeError, ValueError):  # pragma: no cover - unquote_plus replaces bad bytes
                    decoded_name, decoded_value = name, value
                if _SECRET_NAME.search(decoded_name) or _SECRET_PAIR.search(decoded_value):
                    vstart = pos + len(name) + 1
                    spans.append((vstart, vstart + len(value)))
            pos += len(part) + 1
    return spans


def redact_url(target: object) -> str:
    """``target`` as text fit for a message: in a URL (``scheme://...``), the userinfo's password and the values
    of query parameters that carry a credential (``password``, ``sslpassword``, ``passwd``, ``token``,
    ``api_key``, ...; or a parameter whose value holds such a ``name=value`` pair) become ``***``. Anything else
    (a file path) is returned as it is."""
    text = str(target)
    spans = sorted(_secret_spans(text))
    if not spans:
        return text
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    out, pos = [], 0
    for s, e in merged:
        out += [text[pos:s], REDACTED]
        pos = e
    out.append(text[pos:])
    return "".join(out)


def redact_secrets(message: object, url: object) -> str:
    """``message`` with every secret of ``url`` (see :func:`redact_url`) replaced by ``***``, as written in the
    URL and percent-decoded: for text that may repeat them, such as a database driver's error message."""
    text, source = str(message), str(url)
    secrets: set[str] = set()
    for s, e in _secret_spans(source):
        raw = source[s:e]
        secrets.update(x for x in (raw, unquote_plus(raw)) if x)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return redact_url(text)
