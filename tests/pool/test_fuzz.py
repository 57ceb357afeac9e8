"""Fuzzing the pool loader (hypothesis): whatever the bytes, ``TaskPool.from_file`` either loads a valid pool
or raises ``TaskSpecError`` naming the file -- never another exception, never a half-built pool.

A coverage-guided harness for the same target lives in ``fuzz/fuzz_pool_loader.py`` (atheris).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envsched.pool import TaskPool, TaskSpecError

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                       st.text(st.characters(exclude_categories=()), max_size=4))  # lone surrogates too
_json = st.recursive(_json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=12)
_field = st.sampled_from(["id", "env", "split", "index", "difficulty", "group", "instruction", "tools",
                          "initial_state", "verifier", "extra"])


@st.composite
def specs(draw: Any) -> Any:
    """Mostly spec-shaped objects with hostile values in random fields."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_json)
    spec: dict[str, Any] = {"id": draw(st.one_of(st.text(max_size=6), _json_leaf)),
                            "env": draw(st.one_of(st.sampled_from(["a", "b"]), _json_leaf))}
    for key in draw(st.lists(_field, max_size=4)):
        spec[key] = draw(_json)
    if draw(st.booleans()):
        spec["tools"] = draw(st.lists(st.one_of(st.fixed_dictionaries({"name": st.text(max_size=5)}), _json),
                                      max_size=3))
    return spec


def _encode(objs: list[Any], mutations: list[tuple[int, bytes]], ascii_only: bool) -> bytes:
    lines = []
    for o in objs:
        try:
            lines.append(json.dumps(o, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))
        except (ValueError, TypeError):
            lines.append(b"{}")
    data = bytearray(b"\n".join(lines) + b"\n")
    for pos, chunk in mutations:  # splice raw bytes: truncations, stray bytes, broken encodings
        if data:
            p = pos % len(data)
            data[p:p + len(chunk)] = chunk
    return bytes(data)


def _check(path: Path) -> None:
    try:
        pool = TaskPool.from_file(path, max_line_bytes=1 << 16)
    except TaskSpecError as exc:
        assert str(path) in str(exc)  # the message names the file
        return
    # loaded: it is a valid pool that survives a round trip
    assert len(set(pool.ids)) == len(pool)
    assert all(isinstance(s["id"], str) and isinstance(s["env"], str) and s["env"].strip() for s in pool)
    out = path.with_suffix(".roundtrip.jsonl")
    pool.to_jsonl(out)
    again = TaskPool.from_file(out, reward_range=pool.reward_range)
    assert again.ids == pool.ids and again.fingerprint() == pool.fingerprint()


@pytest.mark.slow
@FUZZ
@given(objs=st.lists(specs(), max_size=6), mutations=st.lists(st.tuples(st.integers(0, 10**6),
                                                                        st.binary(min_size=1, max_size=4)),
                                                              max_size=3), ascii_only=st.booleans())
def test_jsonl_loader_never_fails_unexpectedly(objs: list[Any], mutations: list[tuple[int, bytes]],
                                               ascii_only: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pool.jsonl"
        path.write_bytes(_encode(objs, mutations, ascii_only))
        _check(path)


@FUZZ
@given(data=st.binary(max_size=400), suffix=st.sampled_from([".jsonl", ".json"]))
def test_loader_on_raw_bytes(data: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"pool{suffix}"
        path.write_bytes(data)
        _check(path)


@FUZZ
@given(doc=st.one_of(_json, st.fixed_dictionaries({"tasks": st.lists(specs(), max_size=4)},
                                                  optional={"reward_range": _json, "name": _json})))
def test_json_document_loader_never_fails_unexpectedly(doc: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pool.json"
        try:
            path.write_bytes(json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        except (ValueError, TypeError):
            return
        _check(path)
