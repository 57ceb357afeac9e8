"""Malformed pool files: each is refused with a TaskSpecError naming the file, line and problem; nothing changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envsched.pool import TaskPool, TaskSpecError

GOOD = [{"id": "a", "env": "x", "instruction": "first"}, {"id": "b", "env": "y", "instruction": "second"}]
GOOD_JSONL = "".join(json.dumps(s) + "\n" for s in GOOD).encode()

CASES: dict[str, tuple[str, bytes, str]] = {
    "truncated last line": ("jsonl", GOOD_JSONL[:-10], r"line 2: invalid JSON"),
    "truncated mid-file": ("jsonl", GOOD_JSONL[:15] + b"\n" + GOOD_JSONL, r"line 1: invalid JSON"),
    "truncated json": ("json", json.dumps(GOOD).encode()[:-3], r"invalid JSON"),
    "utf-16": ("jsonl", GOOD_JSONL.decode().encode("utf-16"), r"line 1: not valid UTF-8"),
    "latin-1": ("jsonl", '{"id": "caf\xe9", "env": "x"}\n'.encode("latin-1"), r"line 1: not valid UTF-8 \(byte 11"),
    "latin-1 on line 3": ("jsonl", GOOD_JSONL + '{"id": "\xe9", "env": "x"}\n'.encode("latin-1"), r"line 3: not valid"),
    "utf-16 json": ("json", json.dumps(GOOD).encode("utf-16"), r"not valid UTF-8"),
    "binary": ("jsonl", bytes(range(256)), r"line 1: (not valid UTF-8|invalid JSON)"),
    "huge line": ("jsonl", GOOD_JSONL + b'{"id": "c", "env": "x", "instruction": "' + b"z" * 5000 + b'"}\n',
                  r"line 3: line longer than 4096 bytes"),
    "duplicate ids": ("jsonl", GOOD_JSONL + b'{"id": "a", "env": "z"}\n',
                      r"line 3, field 'id': duplicate task id 'a' \(first at line 1\)"),
    "duplicate key": ("jsonl", b'{"id": "a", "env": "x", "id": "b"}\n', r"line 1: duplicate key 'id'"),
    "deep nesting": ("jsonl", b'{"id": "a", "env": "x", "initial_state": ' + b"[" * 50000 + b"]" * 50000 + b"}\n",
                     r"line 1: JSON nested too deeply"),
    "deep nesting json": ("json", b'[{"id": "a", "env": "x", "initial_state": ' + b"{\"k\":" * 50000 + b"1"
                          + b"}" * 50000 + b"}]", r"JSON nested too deeply"),
    "giant integer": ("jsonl", b'{"id": "a", "env": "x", "initial_state": ' + b"7" * 6000 + b"}\n",
                      r"line 1: invalid JSON \(Exceeds the limit"),
    "lone surrogate": ("jsonl", b'{"id": "a\\ud800", "env": "x"}\n', r"line 1: a string holds an unpaired"),
    "not an object": ("jsonl", GOOD_JSONL + b"[1, 2]\n", r"line 3: each line must be a JSON object, got list"),
    "missing env": ("jsonl", b'{"id": "a"}\n', r"line 1, field 'env': missing required field 'env'"),
    "empty env": ("jsonl", b'{"id": "a", "env": ""}\n', r"line 1, field 'env': must be a non-empty string"),
    "id not a string": ("jsonl", b'{"id": 7, "env": "x"}\n', r"field 'id': must be a string, got int"),
    "nan difficulty": ("jsonl", b'{"id": "a", "env": "x", "difficulty": NaN}\n',
                       r"field 'difficulty': must be a finite"),
    "bad tools": ("jsonl", b'{"id": "a", "env": "x", "tools": [{"description": "no name"}]}\n',
                  r"field 'tools': tools\[0\] needs a non-empty string 'name'"),
    "bad verifier": ("jsonl", b'{"id": "a", "env": "x", "verifier": {"checks": [1]}}\n',
                     r"field 'verifier': verifier.checks must be a list of strings"),
    "json not a pool": ("json", b'{"tasks": 5}', r"must be a list of task specs or an object with a 'tasks' list"),
    "reward range reversed": ("json", json.dumps({"tasks": GOOD, "reward_range": [1, 0]}).encode(),
                              r"field 'reward_range': reward_range must be two finite numbers"),
    "reward range not numbers": ("json", json.dumps({"tasks": GOOD, "reward_range": ["a", "b"]}).encode(),
                                 r"field 'reward_range'"),
    "reward range scalar": ("json", json.dumps({"tasks": GOOD, "reward_range": 5}).encode(), r"field 'reward_range'"),
    "name not a string": ("json", json.dumps({"tasks": GOOD, "name": {"x": 1}}).encode(),
                          r"field 'name': name must be a string"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_pool_file_is_refused(tmp_path: Path, case: str) -> None:
    suffix, data, message = CASES[case]
    path = tmp_path / f"pool.{suffix}"
    path.write_bytes(data)
    with pytest.raises(TaskSpecError, match=message) as info:
        TaskPool.from_file(path, max_line_bytes=4096 if case == "huge line" else 1 << 20)
    assert str(path) in str(info.value)
    assert path.read_bytes() == data  # the loader never writes


def test_bad_specs_do_not_change_an_existing_pool(tmp_path: Path) -> None:
    pool = TaskPool(GOOD)
    fingerprint, ids = pool.fingerprint(), pool.ids
    with pytest.raises(TaskSpecError, match="duplicate task id 'a'"):
        pool.extend([{"id": "a", "env": "q"}])
    with pytest.raises(TaskSpecError, match="item 3, field 'env'"):
        pool.extend([{"id": "c", "env": 3}])
    assert pool.fingerprint() == fingerprint and pool.ids == ids and len(pool) == 2


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="task pool file not found"):
        TaskPool.from_file(tmp_path / "none.jsonl")
    with pytest.raises(TaskSpecError, match="is a directory"):
        TaskPool.from_file(tmp_path)


def test_valid_edge_cases_still_load(tmp_path: Path) -> None:
    path = tmp_path / "pool.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD_JSONL.replace(b"\n", b"\r\n") + b"\n\n"
                     + b'{"id": "\\ud83d\\ude00", "env": "x", "initial_state": ' + b"[" * 200 + b"]" * 200 + b"}\n")
    pool = TaskPool.from_file(path)
    assert pool.ids == ["a", "b", "\U0001f600"]
