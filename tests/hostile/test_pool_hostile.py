"""Hostile pool files and task ids: refused with TaskSpecError naming the field, no pool created.

The id rule (README, Reliability): 1 to 256 printable characters, no leading or trailing whitespace, unique
after NFKC normalisation and folding of Unicode confusables (Latin a / Cyrillic a, 0 / O, 1 / l)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envsched.pool import TaskPool, TaskSpecError
from envsched.pool.spec import MAX_ID_CHARS

BAD_IDS = {
    "newline": "a\nb",
    "carriage return": "a\rb",
    "NUL": "a\x00b",
    "ANSI escape": "\x1b[31mred",
    "tab": "a\tb",
    "DEL": "a\x7fb",
    "zero-width space": "a\u200bb",
    "bidi override": "\u202eabc",
    "no-break space": "a\u00a0b",
    "line separator": "a\u2028b",
    "trailing space": "a ",
    "leading space": " a",
    "8 MiB id": "x" * (8 * 2**20),
    "one over the limit": "y" * (MAX_ID_CHARS + 1),
    "lone surrogate": "a\ud800",
}


@pytest.mark.parametrize("case", sorted(BAD_IDS))
def test_bad_id_is_refused(case: str) -> None:
    with pytest.raises(TaskSpecError, match="field 'id'") as info:
        TaskPool([{"id": "fine", "env": "e"}, {"id": BAD_IDS[case], "env": "e"}])
    assert "item 2" in str(info.value)
    assert len(str(info.value)) < 500  # the message never echoes an 8 MiB id


LOOKALIKES = {
    "fullwidth a": ("a", "\uff41"),
    "ligature fi": ("fi", "\ufb01"),
    "composed e-acute": ("caf\u00e9", "cafe\u0301"),
    "superscript two": ("x2", "x\u00b2"),
    "Cyrillic dze for s": ("steps", "\u0455teps"),
    "Greek capital epsilon for E": ("E-1", "\u0395-1"),
    "Cyrillic je for j": ("job", "\u0458ob"),
}


@pytest.mark.parametrize("case", sorted(LOOKALIKES))
def test_lookalike_ids_are_refused(case: str) -> None:
    first, second = LOOKALIKES[case]
    with pytest.raises(TaskSpecError, match="NFKC"):
        TaskPool([{"id": first, "env": "e"}, {"id": second, "env": "e"}])


def test_an_id_at_the_limit_and_unicode_ids_load() -> None:
    pool = TaskPool([{"id": "z" * MAX_ID_CHARS, "env": "e"}, {"id": "t\u00e2che-\u4e00", "env": "e"},
                     {"id": "a b", "env": "e"}])
    assert len(pool) == 3


BAD_FILES = {
    "Infinity literal": b'{"id": "a", "env": "e", "initial_state": {"x": Infinity}}\n',
    "-Infinity literal": b'{"id": "a", "env": "e", "difficulty": -Infinity}\n',
    "NaN literal": b'{"id": "a", "env": "e", "initial_state": [NaN]}\n',
    "id with an escaped newline": b'{"id": "a\\nb", "env": "e"}\n',
    "id with an escaped NUL": b'{"id": "a\\u0000", "env": "e"}\n',
    "id with an escaped ANSI escape": b'{"id": "\\u001b[2J", "env": "e"}\n',
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_pool_file_is_refused(tmp_path: Path, case: str) -> None:
    path = tmp_path / "pool.jsonl"
    path.write_bytes(b'{"id": "ok", "env": "e"}\n' + BAD_FILES[case])
    with pytest.raises(TaskSpecError, match="line 2") as info:
        TaskPool.from_file(path)
    assert re.search(r"field '(id|initial_state|difficulty)'.*(NaN|finite|printable|character)", str(info.value))


def test_non_finite_numbers_in_an_iterable_are_refused() -> None:
    with pytest.raises(TaskSpecError, match=r"NaN or infinite number at initial_state.a\[1\]"):
        TaskPool([{"id": "a", "env": "e", "initial_state": {"a": [0.0, float("inf")]}}])
