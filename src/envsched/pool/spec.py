"""Task specs: the JSON objects a :class:`~envsched.pool.TaskPool` holds.

A task spec is a plain JSON object (``dict``). RFC 013 reserves ``id``, ``split``, ``index``,
``difficulty`` and ``group``; envsched adds ``env`` (the environment the task runs in) and the static
fields the EnvSched graph reads. Any other key is kept untouched and passed back to the trainer.

========================  =================  ==================================================
key                       type               meaning
========================  =================  ==================================================
``id``                    str (required)     stable task id, unique within a pool
``env``                   str (required)     environment the task runs in
``split``                 str                split name (``train``, ``test``, ...)
``index``                 int                position in the split (OpenEnv ``reset(index=)``)
``difficulty``            int or float       higher is harder (tiers ``0..K`` or a score)
``group``                 str                task family (e.g. a reasoning-gym dataset)
``instruction``           str                task text shown to the agent
``tools``                 list of objects    operations the environment offers the task:
                                             ``{"name": str, "description": str, ...}``
``initial_state``         any JSON           initial configuration / context of the episode
``verifier``              object             ``{"checks": [str, ...], "code": str}``
========================  =================  ==================================================
"""

from __future__ import annotations

import functools
import json
import math
import unicodedata
from collections.abc import Mapping
from importlib import resources
from typing import Any

from envsched.errors import EnvSchedError
from envsched.validation import is_int, is_number

__all__ = [
    "MAX_ID_CHARS",
    "MAX_NESTING",
    "OPTIONAL_STATIC_FIELDS",
    "REQUIRED_FIELDS",
    "TaskSpecError",
    "id_problem",
    "normalized_id",
    "task_key",
    "validate_task_spec",
]

REQUIRED_FIELDS: tuple[str, ...] = ("id", "env")
#: Static fields EnvSched's graph reads; a task without one of them still works (the view is empty).
OPTIONAL_STATIC_FIELDS: tuple[str, ...] = ("instruction", "tools", "initial_state", "verifier")


#: Longest task id, in characters.
MAX_ID_CHARS = 256
#: Deepest nesting of lists and objects inside one task spec (the spec itself is level 1). Deeper data is
#: refused: it is no real task's content, and serialising it later (fingerprint, store) would overflow
#: Python's recursion limit.
MAX_NESTING = 256


def id_problem(value: str) -> str | None:
    """Why ``value`` is not an acceptable task id, or ``None``.

    The rule (README, "Reliability"): an id is 1 to :data:`MAX_ID_CHARS` printable characters
    (``str.isprintable``: no control characters such as newline, NUL or ANSI escapes, no format or
    separator characters other than the ASCII space) without leading or trailing whitespace. Two ids of
    one pool may not have the same look-alike key (:func:`normalized_id`: NFKC, then Unicode confusables
    folded), so look-alikes cannot both appear.
    """
    if len(value) > MAX_ID_CHARS:
        return f"is {len(value)} characters long, more than the limit of {MAX_ID_CHARS}"
    if value != value.strip():
        return "has leading or trailing whitespace"
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        return f"holds the unprintable character U+{ord(bad):04X} ({unicodedata.name(bad, 'control')})"
    return None


@functools.cache
def _confusable_map() -> dict[str, str]:
    """Each character listed in Unicode's confusables table (UTS #39, as shipped by the
    ``confusable-homoglyphs`` package) mapped to one representative of its look-alike class.

    Classes are the connected groups of single-character confusable pairs (Latin ``a`` with Cyrillic
    ``а`` and Greek ``α``; ``O`` with ``0``; ``l`` with ``1``, ``I`` and ``|``), the representative the
    smallest code point of the group, so the key of a string does not depend on which member it uses.
    Multi-character look-alikes (``rn`` / ``m``) are not folded."""
    import confusable_homoglyphs

    table = json.loads(resources.files(confusable_homoglyphs).joinpath("confusables.json").read_text("utf-8"))
    parent: dict[str, str] = {}

    def find(c: str) -> str:
        root = c
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(c, c) != root:  # path compression
            parent[c], c = root, parent[c]
        return root

    for char, glyphs in table.items():
        if len(char) != 1:
            continue
        for glyph in glyphs:
            other = glyph.get("c", "")
            if len(other) == 1:
                a, b = find(char), find(other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return {c: find(c) for c in parent}


def normalized_id(value: str) -> str:
    """The look-alike key under which task ids are compared for duplicates.

    NFKC normalisation (fullwidth forms, ligatures, composed accents), then every character replaced by
    the representative of its Unicode confusable class (:func:`_confusable_map`), so ids that differ only
    by homoglyphs (Latin ``a`` / Cyrillic ``а`` / Greek ``α``, ``0`` / ``O``, ``l`` / ``1`` / ``I``) share a
    key and cannot both be in one pool. Case is kept: ``Task`` and ``task`` are different ids."""
    table = _confusable_map()
    folded = unicodedata.normalize("NFKC", value)
    return "".join(table.get(c, c) for c in folded)


def _first_problem(obj: Any) -> tuple[str, str] | None:
    """``(path, what)`` of the first NaN or infinite number inside a spec (JSON cannot hold them) or of
    the first value nested deeper than :data:`MAX_NESTING`, else ``None``. Iterative (no recursion)."""
    stack: list[tuple[Any, str, int]] = [(obj, "", 1)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where or "(root)", "nan"
        if isinstance(value, Mapping | list | tuple):
            if depth > MAX_NESTING:
                return where or "(root)", "deep"
            if isinstance(value, Mapping):
                stack.extend((v, f"{where}.{k}" if where else str(k), depth + 1) for k, v in value.items())
            else:
                stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
    return None


class TaskSpecError(EnvSchedError, ValueError):
    """A task spec (or a file of them) is malformed.

    ``source`` names the file (or ``"<iterable>"``), ``line`` the 1-based line of a JSONL file (or the
    1-based position of the task in a JSON list / iterable, then called "item" in the message), ``field``
    the offending key, when known.
    """

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None,
                 field: str | None = None, unit: str = "line") -> None:
        self.source = source
        self.line = line
        self.field = field
        where = []
        if source is not None:
            where.append(str(source))
        if line is not None:
            where.append(f"{unit} {line}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


def _type_name(value: Any) -> str:
    return type(value).__name__


def validate_task_spec(obj: Any, *, source: str | None = None, line: int | None = None,
                       unit: str = "line") -> dict[str, Any]:
    """Check one task spec and return it as a ``dict`` (a shallow copy; the input is not modified).

    Raises :class:`TaskSpecError` naming ``source``, ``line`` (or item, per ``unit``) and the wrong field.
    """

    def _check(cond: bool, message: str, field: str | None, source: str | None, line: int | None) -> None:
        if not cond:
            raise TaskSpecError(message, source=source, line=line, field=field, unit=unit)
    _check(isinstance(obj, Mapping), f"a task spec must be a JSON object, got {_type_name(obj)}",
           None, source, line)
    spec = dict(obj)
    for key in REQUIRED_FIELDS:
        _check(key in spec, f"missing required field {key!r}", key, source, line)
        value = spec[key]
        _check(isinstance(value, str), f"must be a string, got {_type_name(value)}", key, source, line)
        _check(value.strip() != "", "must be a non-empty string", key, source, line)
    problem = id_problem(spec["id"])
    _check(problem is None, f"task id {spec['id'][:60]!r} {problem}", "id", source, line)
    for key in ("split", "group", "instruction"):
        if key in spec and spec[key] is not None:
            _check(isinstance(spec[key], str), f"must be a string, got {_type_name(spec[key])}",
                   key, source, line)
    if "index" in spec and spec["index"] is not None:
        value = spec["index"]
        _check(is_int(value, numpy=False) and value >= 0,
               f"must be a non-negative integer, got {value!r}", "index", source, line)
    if "difficulty" in spec and spec["difficulty"] is not None:
        value = spec["difficulty"]
        _check(is_number(value, numpy=False) and (isinstance(value, int) or math.isfinite(value)),
               f"must be a finite number, got {value!r}", "difficulty", source, line)
    if "tools" in spec and spec["tools"] is not None:
        tools = spec["tools"]
        _check(isinstance(tools, list), f"must be a list of objects, got {_type_name(tools)}",
               "tools", source, line)
        for i, tool in enumerate(tools):
            _check(isinstance(tool, Mapping), f"tools[{i}] must be an object, got {_type_name(tool)}",
                   "tools", source, line)
            _check(isinstance(tool.get("name"), str) and tool["name"] != "",
                   f"tools[{i}] needs a non-empty string 'name'", "tools", source, line)
            if tool.get("description") is not None:
                _check(isinstance(tool["description"], str),
                       f"tools[{i}].description must be a string", "tools", source, line)
    if "verifier" in spec and spec["verifier"] is not None:
        verifier = spec["verifier"]
        _check(isinstance(verifier, Mapping),
               f"must be an object with 'checks' and/or 'code', got {_type_name(verifier)}",
               "verifier", source, line)
        checks = verifier.get("checks")
        if checks is not None:
            _check(isinstance(checks, list) and all(isinstance(c, str) for c in checks),
                   "verifier.checks must be a list of strings", "verifier", source, line)
        code = verifier.get("code")
        if code is not None:
            _check(isinstance(code, str), "verifier.code must be a string", "verifier", source, line)
    problem_at = _first_problem(spec)
    if problem_at is not None:
        bad, what = problem_at
        message = (f"holds a NaN or infinite number at {bad} (JSON has no such numbers)" if what == "nan" else
                   f"JSON nested too deeply: more than {MAX_NESTING} levels at {bad[:200]}")
        _check(False, message, bad.split(".")[0].split("[")[0], source, line)
    return spec


def task_key(task: Any) -> str:
    """The key a sampler identifies a task by: its ``id``, else ``"{split}/{index}"``.

    Accepts a mapping or an object with an ``id`` attribute (e.g. a typed spec).
    Raises ``KeyError`` when the task carries neither.
    """
    if isinstance(task, Mapping):
        if isinstance(task.get("id"), str):
            return task["id"]
        if "split" in task and "index" in task:
            return f"{task['split']}/{task['index']}"
    else:
        ident = getattr(task, "id", None)
        if isinstance(ident, str):
            return ident
    raise KeyError(f"task has no 'id' (nor 'split' and 'index') to identify it: {task!r:.200}")
