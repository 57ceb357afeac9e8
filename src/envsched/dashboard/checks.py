"""What the dashboard accepts from a history store's event log: the fields of each event kind it reads and
their types, checked in Python on one event (:func:`check_event`, which names the field that is wrong) and,
for the database's own JSON extraction, as the JSON type names each backend reports (:data:`JSON_TYPES`).

A store's events are written by :mod:`envsched.store.operations`; a store is data that anyone may hand over, so
the dashboard and ``envsched report`` check each field they read and refuse a malformed event with one line
naming the event and the field, instead of failing somewhere in numpy or the views.
"""

from __future__ import annotations

import json
import math
from typing import Any

from envsched.errors import is_number

__all__ = ["EVENT_KINDS", "JSON_TYPES", "check_event", "finite_or_null", "quote", "type_name"]

#: the event kinds a store logs
EVENT_KINDS = ("sample", "update", "discard")
#: how many characters of a refused value a message quotes
QUOTE_CHARS = 60


def quote(value: Any) -> str:
    """``repr(value)``, cut to :data:`QUOTE_CHARS` characters (a message quotes a refused value, never all of it)."""
    text = repr(value)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "..."


def type_name(value: Any) -> str:
    """What ``value`` is, for a message: ``null``, ``a boolean``, ``the number 5``, ``a string ('abc')``, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if is_number(value, numpy=False):
        return f"the number {quote(value)}"
    if isinstance(value, str):
        return f"a string ({quote(value)})"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def finite_or_null(value: Any) -> bool:
    """Whether ``value`` is a finite JSON number or null (a reward or a cost)."""
    return value is None or (is_number(value, numpy=False) and math.isfinite(value))


def check_event(kind: Any, created: Any, payload: Any) -> dict[str, Any]:
    """The decoded payload of one event row, after checking every field the dashboard reads; otherwise
    ``ValueError`` with a one-line reason that names the field (the caller adds the store and the event)."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown kind {quote(kind)} (a store logs {', '.join(EVENT_KINDS)})")
    if not (is_number(created, numpy=False) and math.isfinite(created)):
        raise ValueError(f"its time 'created' is {type_name(created)}, expected seconds since the epoch")
    if isinstance(payload, bytes):
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("its payload is not UTF-8 text") from None
    if not isinstance(payload, str):
        raise ValueError(f"its payload is {type_name(payload)}, expected JSON text")
    try:
        data = json.loads(payload)
    except RecursionError:
        raise ValueError("its payload is nested too deeply to be an event") from None
    except ValueError as exc:
        raise ValueError(f"its payload is not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(data, dict):
        raise ValueError(f"its payload is {type_name(data)}, expected a JSON object")

    def field(name: str, ok: Any, expected: str, *, required: bool = True) -> Any:
        if name not in data:
            if required:
                raise ValueError(f"field {name!r} is missing, expected {expected}")
            return None
        value = data[name]
        if not ok(value):
            raise ValueError(f"field {name!r} is {type_name(value)}, expected {expected}")
        return value

    def items(name: str, values: list[Any], ok: Any, expected: str) -> None:
        for i, v in enumerate(values):
            if not ok(v):
                raise ValueError(f"field {name!r}[{i}] is {type_name(v)}, expected {expected}")

    is_list = lambda v: isinstance(v, list)  # noqa: E731
    is_str = lambda v: isinstance(v, str)  # noqa: E731
    if kind == "sample":
        keys = field("keys", is_list, "a list of task ids")
        items("keys", keys, is_str, "a task id (a string)")
        leases = field("leases", is_list, "a list of lease ids, one per drawn task", required=False)
        if leases is not None:
            items("leases", leases, is_str, "a lease id (a string)")
            if len(leases) != len(keys):
                raise ValueError(f"field 'leases' holds {len(leases)} lease ids for {len(keys)} drawn tasks")
    else:
        field("key", is_str, "a task id (a string)")
        field("lease", lambda v: v is None or isinstance(v, str), "a lease id (a string)", required=False)
    if kind == "update":
        rewards = field("rewards", is_list, "a list of rewards (numbers or null)")
        items("rewards", rewards, finite_or_null, "a finite number or null")
        costs = field("costs", lambda v: v is None or isinstance(v, list), "a list of costs or null",
                      required=False)
        if costs is not None:
            items("costs", costs, finite_or_null, "a finite number or null")
    elif kind == "discard":
        field("reason", lambda v: v is None or isinstance(v, str), "a reason (a string) or null", required=False)
        field("reclaimed", lambda v: v is None or isinstance(v, bool), "true or false", required=False)
    return data


#: the JSON type names each backend reports (SQLite's ``json_type``, PostgreSQL's ``jsonb_typeof``) that a
#: field of that kind may have; SQL ``NULL`` (``None``): the field is absent
JSON_TYPES = {
    "sqlite": {"text": {"text"}, "opt_text": {None, "null", "text"}, "array": {"array"},
               "opt_array": {None, "null", "array"}, "opt_bool": {None, "null", "true", "false"}},
    "postgresql": {"text": {"string"}, "opt_text": {None, "null", "string"}, "array": {"array"},
                   "opt_array": {None, "null", "array"}, "opt_bool": {None, "null", "boolean"}},
}
