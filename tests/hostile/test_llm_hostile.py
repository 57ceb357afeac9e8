"""Hostile LLM replies and cache files: parsing is linear and bounded; a bad cache file is a miss."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envsched.method.graph.llm_abstraction import MAX_REPLY_CHARS, LLMAbstractor, _content_key

SPEC = {"id": "airline-7", "env": "airline", "instruction": "Cancel reservation ABC123."}
VALID = {
    "operations": [{"family": "lookup", "effect": "read", "inputs": ["identifier"], "required": True}],
    "gates": [], "dependencies": [], "check_groups": [], "conflicts": [], "literals": {"identifier": 1},
}


def _llm(tmp_path: Path) -> LLMAbstractor:
    return LLMAbstractor("http://127.0.0.1:9/v1", "m", cache_dir=tmp_path / "cache", max_retries=0)


def test_open_fence_with_thousands_of_newlines_parses_in_linear_time(tmp_path: Path) -> None:
    """The audit's reply took 122 s through the old fence regex; parsed in a child so a hang cannot stall CI."""
    code = textwrap.dedent("""
        from envsched.method.graph.llm_abstraction import LLMAbstractor
        llm = LLMAbstractor("http://127.0.0.1:9/v1", "m", cache_dir=%r, max_retries=0)
        for reply in ["```json\\n" + "\\n" * 5000 + "x", "```" + " " * 20000 + "x```y", "```json" + "\\n" * 40000]:
            answer, errors = llm._parse(reply)
            assert answer is None and errors, errors
        print("parsed")
    """) % str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "parsed" in proc.stdout, proc.stderr[-2000:]


HOSTILE_REPLIES = {
    "longer than the limit": ("x" * (MAX_REPLY_CHARS + 1), "more than the limit"),
    "valid JSON padded past the limit": (json.dumps(VALID) + " " * MAX_REPLY_CHARS, "more than the limit"),
    "integer past the digit limit": ('{"literals": {"identifier": ' + "9" * 5000 + "}}", "not valid JSON"),
    "fence without JSON": ("```json\n```", "not valid JSON"),
    "nested object inside the schema": (json.dumps({**VALID, "literals": {"a": {"b": {"c": 1}}}}), "literals"),
    "deeply nested arrays in a value": (json.dumps({**VALID, "gates": [[[[[[[[[[]]]]]]]]]]}), "gates"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_REPLIES))
def test_hostile_reply_is_a_malformed_answer(tmp_path: Path, case: str) -> None:
    reply, problem = HOSTILE_REPLIES[case]
    _, errors = _llm(tmp_path)._parse(reply)
    assert errors and any(problem in e for e in errors), errors


def test_fenced_valid_answer_still_parses(tmp_path: Path) -> None:
    llm = _llm(tmp_path)
    for reply in ("```json\n" + json.dumps(VALID) + "\n```", "  ```" + json.dumps(VALID) + "```  ", json.dumps(VALID)):
        assert llm._parse(reply) == (VALID, [])


BAD_CACHE_FILES = {
    "bad UTF-8": b"\xff\xfe\x00{",
    "deep nesting": b"[" * 100000 + b"]" * 100000,
    "not JSON": b"{operations: 1",
    "a JSON array": b"[]",
    "schema-invalid object": json.dumps({"operations": "x"}).encode(),
    "too large": b" " * (MAX_REPLY_CHARS + 1) + json.dumps(VALID).encode(),
    "NaN literal": json.dumps({**VALID, "literals": {"identifier": float("nan")}}).encode(),
}


@pytest.mark.parametrize("case", sorted(BAD_CACHE_FILES))
def test_bad_cache_file_is_a_miss(tmp_path: Path, case: str) -> None:
    llm = _llm(tmp_path)
    key = _content_key(SPEC, "m")
    path = llm._cache_path(key)
    path.parent.mkdir(parents=True)
    path.write_bytes(BAD_CACHE_FILES[case])
    assert llm.cached(SPEC) is None
    path.write_text(json.dumps(VALID))
    assert llm.cached(SPEC) == VALID


def test_a_directory_in_place_of_a_cache_file_is_a_miss(tmp_path: Path) -> None:
    llm = _llm(tmp_path)
    llm._cache_path(_content_key(SPEC, "m")).mkdir(parents=True)
    assert llm.cached(SPEC) is None
