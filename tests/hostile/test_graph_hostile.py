"""Hostile graph files: every array is checked (shape, dtype, index range, finiteness, declared size)
before anything uses it; the error is a GraphFileError naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envsched.method.graph.build import build_graph
from envsched.method.graph.io import GraphFileError, load_graph, save_graph
from envsched.pool import TaskPool


def _pool() -> TaskPool:
    specs = []
    for e in range(3):
        for t in range(5):
            specs.append({"id": f"e{e}/t{t}", "env": f"env{e}", "instruction": f"do thing {t} in {e}",
                          "tools": [{"name": f"tool_{e}_{t % 2}", "description": "a tool"}],
                          "verifier": {"checks": [f"thing {t} done"]}})
    return TaskPool(specs)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> tuple[TaskPool, dict[str, np.ndarray]]:
    pool = _pool()
    path = save_graph(build_graph(pool), tmp_path_factory.mktemp("g") / "good.graph.npz")
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return pool, arrays


def _header(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    return json.loads(bytes(arrays["__header__"]).decode())


def _set_header(arrays: dict[str, np.ndarray], **changes: Any) -> None:
    h = _header(arrays)
    h.update(changes)
    arrays["__header__"] = np.frombuffer(json.dumps(h).encode(), dtype=np.uint8)


def _put(name: str, fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict[str, np.ndarray]], None]:
    def mutate(arrays: dict[str, np.ndarray]) -> None:
        arrays[name] = fn(arrays[name].copy())
    return mutate


def _at(value: Any, where: tuple[int, ...] = (0, 0)) -> Callable[[np.ndarray], np.ndarray]:
    def fn(a: np.ndarray) -> np.ndarray:
        a[where] = value
        return a
    return fn


def _drop(name: str) -> Callable[[dict[str, np.ndarray]], None]:
    def mutate(arrays: dict[str, np.ndarray]) -> None:
        del arrays[name]
    return mutate


CASES: dict[str, tuple[Callable[[dict[str, np.ndarray]], None], str]] = {
    "feature column index out of range": (_put("full_features/indices", _at(10**6, (0,))), "full_features/indices"),
    "negative feature column index": (_put("abstract_features/indices", _at(-5, (0,))), "abstract_features/indices"),
    "indptr decreasing": (_put("full_features/indptr", _at(10**4, (1,))), "full_features/indptr"),
    "indptr not starting at 0": (_put("full_features/indptr", _at(1, (0,))), "full_features/indptr"),
    "feature value NaN": (_put("full_features/data", _at(np.nan, (0,))), "full_features/data"),
    "feature value inf": (_put("abstract_features/data", _at(np.inf, (0,))), "abstract_features/data"),
    "feature shape too few rows": (_put("full_features/shape", _at(3, (0,))), "full_features/shape"),
    "feature shape negative columns": (_put("full_features/shape", _at(-1, (1,))), "full_features/shape"),
    "neighbour index out of range": (_put("within_index", _at(999)), "within_index"),
    "neighbour index below -1": (_put("cross_index", _at(-7)), "cross_index"),
    "float neighbour indices": (_put("within_index", lambda a: a.astype(np.float64)), "within_index"),
    "NaN weight": (_put("within_weight", _at(np.nan)), "within_weight"),
    "-1e300 weight": (_put("cross_weight", lambda a: _at(-1e300)(a.astype(np.float64))), "cross_weight"),
    "weight above one": (_put("within_weight", _at(7.0)), "within_weight"),
    "inf similarity": (_put("within_similarity", _at(np.inf)), "within_similarity"),
    "weight shape differs": (_put("within_weight", lambda a: a[:, :1]), "within_weight"),
    "index rows differ": (_put("within_index", lambda a: a[:-1]), "within_index"),
    "index one-dimensional": (_put("cross_index", lambda a: a.ravel()), "cross_index"),
    "env code out of range": (_put("env_codes", _at(9, (0,))), "env_codes"),
    "env codes as floats": (_put("env_codes", lambda a: a.astype(np.float32)), "env_codes"),
    "task ids as numbers": (_put("task_ids", lambda a: np.arange(len(a))), "task_ids"),
    "duplicate task ids": (_put("task_ids", lambda a: np.array([a[0]] * len(a))), "task_ids"),
    "NaN bandwidth": (_put("within_bandwidth", _at(np.nan, (0,))), "within_bandwidth"),
    "negative bandwidth": (_put("cross_bandwidth", _at(-1.0, (0,))), "cross_bandwidth"),
    "missing array": (_drop("cross_similarity"), "cross_similarity"),
    "missing indptr": (_drop("full_features/indptr"), "full_features/indptr"),
    "num_nodes negative": (lambda a: _set_header(a, num_nodes=-1), "num_nodes"),
    "num_nodes huge": (lambda a: _set_header(a, num_nodes=10**12), "num_nodes"),
    "num_nodes a string": (lambda a: _set_header(a, num_nodes="15"), "num_nodes"),
    "num_nodes disagrees": (lambda a: _set_header(a, num_nodes=14), "env_codes"),
    "config not an object": (lambda a: _set_header(a, config=[1]), "config"),
    "feature space not a list": (lambda a: _set_header(a, feature_space={"a": 1}), "feature_space"),
    "feature space view weight NaN": (
        lambda a: _set_header(a, feature_space=[{"kind": "full", "name": "x", "weight": float("nan"),
                                                  "fitted": False}]), "feature_space"),
}


def _both(*mutations: Callable[[dict[str, np.ndarray]], None]) -> Callable[[dict[str, np.ndarray]], None]:
    def mutate(arrays: dict[str, np.ndarray]) -> None:
        for m in mutations:
            m(arrays)
    return mutate


def _add(name: str, value: np.ndarray) -> Callable[[dict[str, np.ndarray]], None]:
    def mutate(arrays: dict[str, np.ndarray]) -> None:
        arrays[name] = value
    return mutate


def _swap_rows(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """Row 0 of an index array pointing at the row's own second entry twice."""
    def fn(a: np.ndarray) -> np.ndarray:
        a[0, 1] = a[0, 0]
        return a
    return fn


# Graph files that break the format's own rules (docs/graph.md, dual_graph.py); the pool has three
# environments of five tasks: nodes 0-4 are env0, 5-9 env1, 10-14 env2; within rows hold 4 neighbours
# and 2 pads, cross rows 10 neighbours and 2 pads.
RULES: dict[str, tuple[Callable[[dict[str, np.ndarray]], None], str, str]] = {
    "within self-loop": (_put("within_index", _at(0)), "within_index", "own neighbour"),
    "cross self-loop": (_put("cross_index", _at(0)), "cross_index", "own neighbour"),
    "within edge into another environment": (_put("within_index", _at(5)), "within_index", "another environment"),
    "within edge into the last environment": (_put("within_index", _at(14, (4, 0))), "within_index",
                                              "another environment"),
    "cross edge inside the own environment": (_put("cross_index", _at(1)), "cross_index", "own environment"),
    "cross edge inside env2": (_put("cross_index", _at(11, (10, 0))), "cross_index", "own environment"),
    "within neighbour named twice": (_put("within_index", _swap_rows("within_index")), "within_index", "twice"),
    "cross neighbour named twice": (_put("cross_index", _swap_rows("cross_index")), "cross_index", "twice"),
    "padding with a weight": (_put("within_weight", _at(0.25, (0, 5))), "within_weight", "padding"),
    "padding with a similarity": (_put("cross_similarity", _at(0.5, (0, 11))), "cross_similarity", "padding"),
    "row weights summing to one half": (_put("within_weight", lambda a: _at(a[0, 0] - 0.5)(a) if a[0, 0] > 0.5
                                             else _at(0.0, (0, 0))(a)), "within_weight", "sum to"),
    "row weights summing to two": (_put("cross_weight", lambda a: np.where(a > 0, a * 2, a) / 1.0000001),
                                   "cross_weight", "sum to|weights must lie"),
    "edge with similarity 0": (_put("within_similarity", _at(0.0)), "within_similarity", r"\(0, 1\]"),
    "edge with negative similarity": (_put("cross_similarity", _at(-0.5)), "cross_similarity", r"\(0, 1\]"),
    "edge with similarity 1.5": (_put("within_similarity", _at(1.5)), "within_similarity", r"\(0, 1\]"),
    "vocabulary shorter than the feature columns": (
        _both(_put("vocab/full/task_text", lambda a: a[:-1]), _put("idf/full/task_text", lambda a: a[:-1])),
        "full_features/shape", "vocabularies name"),
    "abstract vocabulary shorter than its columns": (
        _both(_put("vocab/abstract/literals", lambda a: a[:-1]), _put("idf/abstract/literals", lambda a: a[:-1])),
        "abstract_features/shape", "vocabularies name"),
    "vocabulary longer than the feature columns": (
        _both(_put("vocab/full/operation_names", lambda a: np.append(a, "zzz")),
              _put("idf/full/operation_names", lambda a: np.append(a, 1.0))), "full_features/shape",
        "vocabularies name"),
    "a term twice in one vocabulary": (_put("vocab/full/operation_names", lambda a: np.array([a[0]] * len(a))),
                                       "vocab/full/operation_names", "twice"),
    "vocabulary of no fitted view": (_add("vocab/full/bogus", np.array(["x"])), "vocab/full/bogus", "no fitted view"),
    "fitted view without its vocabulary": (_drop("vocab/full/task_text"), "vocab/full/task_text", "missing"),
    "an array the format does not have": (_add("payload", np.zeros(4)), "payload", "not an array of the graph"),
    "feature rows not normalised": (_put("full_features/data", lambda a: a * 2), "full_features/data",
                                    "L2-normalised"),
    "abstract rows not normalised": (_put("abstract_features/data", lambda a: a * 0.5), "abstract_features/data",
                                     "L2-normalised"),
    "environment names repeated": (_put("envs", lambda a: np.array([a[0]] * len(a))), "envs", "not unique"),
}


@pytest.mark.parametrize("case", sorted(RULES))
def test_a_file_breaking_the_format_rules_is_refused(tmp_path: Path, good: Any, case: str) -> None:
    pool, arrays = good
    arrays = {k: v.copy() for k, v in arrays.items()}
    mutate, field, words = RULES[case]
    mutate(arrays)
    path = tmp_path / "rule.graph.npz"
    np.savez(path, **arrays)
    with pytest.raises(GraphFileError, match=f"field '{field}'") as info:
        load_graph(path, pool)
    assert info.value.field == field
    assert re.search(words, str(info.value)), str(info.value)


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_graph_file_is_refused_naming_the_field(tmp_path: Path, good: Any, case: str) -> None:
    pool, arrays = good
    arrays = {k: v.copy() for k, v in arrays.items()}
    mutate, field = CASES[case]
    mutate(arrays)
    path = tmp_path / "bad.graph.npz"
    np.savez(path, **arrays)
    with pytest.raises(GraphFileError, match=f"field '{field}'") as info:
        load_graph(path, pool)
    assert info.value.field == field


def test_declared_size_beyond_the_limit_is_refused_before_reading(tmp_path: Path, good: Any) -> None:
    """A member whose .npy header declares a huge array: refused from the header, nothing allocated."""
    import zipfile

    pool, arrays = good
    path = tmp_path / "huge.graph.npz"
    np.savez(path, **arrays)
    huge = tmp_path / "huge2.graph.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(huge, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "within_weight.npy":
                header = "{'descr': '<f8', 'fortran_order': False, 'shape': (15, 10000000000), }"
                header = header + " " * (117 - len(header)) + "\n"
                data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data[128:]
            dst.writestr(item, data)
    with pytest.raises(GraphFileError, match=r"field 'within_weight'.*declares \(15, 10000000000\)"):
        load_graph(huge, pool)


def test_object_arrays_and_garbage_are_graph_file_errors(tmp_path: Path, good: Any) -> None:
    pool, arrays = good
    path = tmp_path / "obj.graph.npz"
    arrays = dict(arrays)
    arrays["task_ids"] = np.array([object()] * 15, dtype=object)
    np.savez(path, **arrays)
    with pytest.raises(GraphFileError):
        load_graph(path, pool)
    junk = tmp_path / "junk.graph.npz"
    junk.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    with pytest.raises(GraphFileError):
        load_graph(junk, pool)


def test_a_good_file_still_loads(tmp_path: Path, good: Any) -> None:
    pool, arrays = good
    path = tmp_path / "ok.graph.npz"
    np.savez(path, **arrays)
    g = load_graph(path, pool)
    assert g.num_nodes == len(pool)


def test_a_planted_benchmark_graph_cache_file_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted graph cache file (a pickle) runs no code: the cache is the validated graph file format."""
    import pickle

    from envsched.method.graph import cache

    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_MEMORY", {})
    pool = _pool()
    first = cache.cached_graph(pool)
    (cached,) = (tmp_path / "cache" / "graphs").glob("graph-*")
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple:
            return (open, (str(marker), "w"))

    cached.write_bytes(pickle.dumps(Payload()))
    monkeypatch.setattr(cache, "_MEMORY", {})
    again = cache.cached_graph(pool)
    assert not marker.exists(), "loading the cache ran code"
    assert again.task_ids == first.task_ids


@pytest.mark.parametrize("header", [b"[" * 100000 + b"]" * 100000, b"\xff\xfe", b"[1, 2]", b"{"])
def test_a_malformed_header_is_a_graph_file_error(tmp_path: Path, good: Any, header: bytes) -> None:
    pool, arrays = good
    arrays = dict(arrays)
    arrays["__header__"] = np.frombuffer(header, dtype=np.uint8)
    path = tmp_path / "h.graph.npz"
    np.savez(path, **arrays)
    with pytest.raises(GraphFileError, match="header"):
        load_graph(path, pool)
