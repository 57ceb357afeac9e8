"""Saving and loading a built :class:`~envsched.method.graph.DualRelationGraph` (versioned format).

One ``.npz`` file (numpy's zip of arrays, written uncompressed, read with ``allow_pickle=False``): the
neighbour arrays, the two sparse feature matrices, the fitted feature space (vocabularies and IDF, so the
graph can still be extended after loading) and a JSON header with the format name and version, the pool
fingerprint, the configuration and the build report.

Loading checks the format name and version and, when a pool is given, that the file was built from that
very pool (same :meth:`TaskPool.fingerprint`); otherwise it raises :class:`GraphFileError` saying what
differs and how to rebuild. The write is atomic (temporary file renamed into place).
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.graph.features import FeatureSpace
from envsched.pool import TaskPool

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "GraphFileError", "load_graph", "read_graph_header", "save_graph"]

FORMAT_NAME = "envsched-dual-relation-graph"
FORMAT_VERSION = 1

_ARRAYS = ("env_codes", "within_index", "within_weight", "within_similarity", "cross_index", "cross_weight",
           "cross_similarity")


#: Largest graph a file may declare: nodes, neighbours per node, feature columns, stored feature entries.
#: Declared sizes are checked against these before any array is read (a hostile file cannot make the
#: loader allocate without bound).
MAX_NODES = 50_000_000
MAX_NEIGHBORS = 4096
MAX_FEATURES = 2**31 - 1
MAX_NNZ = 2**31 - 1
MAX_BYTES = 64 * 2**30
MAX_HEADER_BYTES = 64 * 2**20


class GraphFileError(ValueError):
    """A graph file cannot be used: not a graph file, another format version, built from another pool, or
    malformed. ``field`` names the offending array or header entry when there is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def save_graph(graph: DualRelationGraph, path: str | os.PathLike[str]) -> Path:
    """Write ``graph`` to ``path`` (conventionally ``*.graph.npz``) atomically; returns the path."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {name: np.asarray(getattr(graph, name)) for name in _ARRAYS}
    for name in ("within_bandwidth", "cross_bandwidth"):
        value = getattr(graph, name)
        if value is not None:
            arrays[name] = np.asarray(value)
    for name in ("full_features", "abstract_features"):
        mat = sp.csr_matrix(getattr(graph, name))
        arrays[f"{name}/data"] = mat.data
        arrays[f"{name}/indices"] = mat.indices
        arrays[f"{name}/indptr"] = mat.indptr
        arrays[f"{name}/shape"] = np.asarray(mat.shape, dtype=np.int64)
    arrays["task_ids"] = np.asarray(graph.task_ids, dtype=np.str_)
    arrays["envs"] = np.asarray(graph.envs, dtype=np.str_)
    space_meta = None
    if graph.feature_space is not None:
        state = graph.feature_space.to_state()
        space_meta = state["meta"]
        arrays.update(state["arrays"])
    from envsched._version import __version__

    header = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "envsched_version": __version__,
        "pool_fingerprint": graph.pool_fingerprint, "num_nodes": graph.num_nodes,
        "num_envs": len(graph.envs), "config": graph.config, "report": graph.report,
        "feature_space": space_meta,
    }
    arrays["__header__"] = np.frombuffer(json.dumps(header, default=str).encode("utf-8"), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _open(path: Path) -> Any:
    if not path.exists():
        raise FileNotFoundError(f"graph file not found: {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise GraphFileError(f"{path}: not an envsched graph file ({exc})") from None
    if not hasattr(data, "files") or "__header__" not in data.files:
        raise GraphFileError(f"{path}: not an envsched graph file (no header)")
    return data


def _header(data: Any, path: Path) -> dict[str, Any]:
    shape, dtype = _member_header(data, "__header__", path)
    if dtype != np.uint8 or len(shape) != 1 or shape[0] > MAX_HEADER_BYTES:
        raise _bad(path, "__header__", f"must be at most {MAX_HEADER_BYTES} bytes of JSON (uint8), got {dtype} "
                                       f"{shape}")
    try:
        header = json.loads(bytes(data["__header__"]).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise GraphFileError(f"{path}: corrupt graph header ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise _bad(path, "__header__", "the header is not a JSON object")
    if header.get("format") != FORMAT_NAME:
        raise GraphFileError(f"{path}: format {header.get('format')!r}, expected {FORMAT_NAME!r}")
    if header.get("version") != FORMAT_VERSION:
        raise GraphFileError(
            f"{path}: graph format version {header.get('version')!r} (written by envsched "
            f"{header.get('envsched_version', '?')}), this envsched reads version {FORMAT_VERSION}; "
            "rebuild the graph with `envsched pool graph POOL_FILE`")
    return header


def read_graph_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of a graph file (format, version, pool fingerprint, config, report), checked."""
    path = Path(path)
    with _open(path) as data:
        return _header(data, path)


def load_graph(path: str | os.PathLike[str], pool: TaskPool | None = None, *,
               expected_fingerprint: str | None = None) -> DualRelationGraph:
    """Read a graph written by :func:`save_graph`.

    Args:
        path: the file.
        pool: when given, the graph must have been built from this pool (same fingerprint).
        expected_fingerprint: alternatively, the pool fingerprint the graph must carry.

    Raises:
        FileNotFoundError: no such file.
        GraphFileError: not a graph file, another format version, or built from another pool.
    """
    path = Path(path)
    with _open(path) as data:
        header = _header(data, path)
        _check_header_fields(header, path)
        declared = _check_declared(data, header, path)
        want = pool.fingerprint() if pool is not None else expected_fingerprint
        if want is not None and header.get("pool_fingerprint") != want:
            size = f" ({len(pool)} tasks)" if pool is not None else ""
            raise GraphFileError(
                f"{path}: built from another pool (fingerprint {str(header.get('pool_fingerprint'))[:12]}..., "
                f"{header.get('num_nodes')} tasks) than the one given (fingerprint {want[:12]}...{size}); "
                "rebuild the graph with `envsched pool graph POOL_FILE`")
        try:
            mats = {}
            for name in ("full_features", "abstract_features"):
                mats[name] = _csr(data, name, header["num_nodes"], path)
            arrays = {name: data[name] for name in _ARRAYS}
            bandwidths = {name: (data[name] if name in data.files else None)
                          for name in ("within_bandwidth", "cross_bandwidth")}
            space = None
            if header.get("feature_space") is not None:
                space = FeatureSpace.from_state(header["feature_space"],
                                                {k: data[k] for k in data.files if k.startswith(("vocab/", "idf/"))})
            task_ids = [str(t) for t in data["task_ids"].tolist()]
            envs = [str(e) for e in data["envs"].tolist()]
        except GraphFileError:
            raise
        except KeyError as exc:
            raise GraphFileError(f"{path}: incomplete graph file (missing {exc})") from None
        except (ValueError, TypeError, OSError, zipfile.BadZipFile, EOFError) as exc:
            raise GraphFileError(f"{path}: damaged graph file ({type(exc).__name__}: {exc})") from None
    _check_values(arrays, bandwidths, mats, task_ids, envs, space, header, declared, path)
    if pool is not None and pool.ids != task_ids:
        raise GraphFileError(f"{path}: task ids differ from the pool's")
    return DualRelationGraph(task_ids=task_ids, envs=envs, **arrays, full_features=mats["full_features"],
                             abstract_features=mats["abstract_features"],
                             pool_fingerprint=str(header.get("pool_fingerprint", "")),
                             config=header.get("config") or {}, report=header.get("report") or {},
                             feature_space=space, **bandwidths)


# ---------------------------------------------------------------------------------------------- validation
def _bad(path: Path, field: str, message: str) -> GraphFileError:
    return GraphFileError(f"{path}: field {field!r}: {message}", field=field)


def _member_header(data: Any, name: str, path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype an array member declares, read from its ``.npy`` header without reading the data."""
    fmt = np.lib.format
    try:
        with data.zip.open(f"{name}.npy") as fh:
            version = fmt.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _, dtype = fmt.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unsupported .npy version {version}")
    except KeyError:
        raise _bad(path, name, "missing from the file") from None
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, SyntaxError) as exc:
        raise _bad(path, name, f"unreadable array header ({exc})") from None
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _bad(path, name, f"bad declared shape {shape!r}")
    return shape, np.dtype(dtype)


def _check_header_fields(header: Any, path: Path) -> None:
    if not isinstance(header, dict):
        raise _bad(path, "__header__", "the header is not a JSON object")
    n = header.get("num_nodes")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_NODES:
        raise _bad(path, "num_nodes", f"must be an integer in [0, {MAX_NODES}], got {str(n)[:40]}")
    for key in ("config", "report"):
        if header.get(key) is not None and not isinstance(header[key], dict):
            raise _bad(path, key, f"must be an object, got {type(header[key]).__name__}")
    if not isinstance(header.get("pool_fingerprint", ""), str):
        raise _bad(path, "pool_fingerprint", "must be a string")
    space = header.get("feature_space")
    if space is not None:
        if not isinstance(space, list):
            raise _bad(path, "feature_space", "must be a list of views")
        for i, m in enumerate(space):
            ok = (isinstance(m, dict) and m.get("kind") in ("full", "abstract") and isinstance(m.get("name"), str)
                  and isinstance(m.get("fitted"), bool) and isinstance(m.get("weight"), int | float)
                  and not isinstance(m.get("weight"), bool) and np.isfinite(m["weight"]))
            if not ok:
                raise _bad(path, "feature_space", f"view {i} is malformed (needs kind full/abstract, a name, a "
                                                  "finite weight and a boolean 'fitted')")


def _check_declared(data: Any, header: dict[str, Any], path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Every member's declared shape and dtype, checked against the header and the size limits."""
    n = header["num_nodes"]
    declared = {name: _member_header(data, name, path) for name in data.files if name != "__header__"}
    total = 0
    for name, (shape, dtype) in declared.items():
        if dtype.hasobject or dtype.fields is not None:
            raise _bad(path, name, f"dtype {dtype} is not allowed (plain numbers and strings only)")
        size = int(np.prod(shape, dtype=object)) * dtype.itemsize
        total += size
        if total > MAX_BYTES:
            raise _bad(path, name, f"declared arrays exceed the {MAX_BYTES} byte limit of a graph file")

    def need(name: str, shape: tuple[int | None, ...], kind: str) -> None:
        if name not in declared:
            raise _bad(path, name, "missing from the file")
        got, dtype = declared[name]
        if len(got) != len(shape) or any(w is not None and g != w for g, w in zip(got, shape, strict=False)):
            want = "(" + ", ".join("K" if w is None else str(w) for w in shape) + ")"
            raise _bad(path, name, f"shape {got}, expected {want}")
        if dtype.kind not in kind:
            expected = {"iu": "an integer", "f": "a float", "U": "a string"}[kind]
            raise _bad(path, name, f"dtype {dtype}, expected {expected} array")

    need("env_codes", (n,), "iu")
    need("task_ids", (n,), "U")
    need("envs", (None,), "U")
    for rel in ("within", "cross"):
        need(f"{rel}_index", (n, None), "iu")
        k = declared[f"{rel}_index"][0][1]
        if k > MAX_NEIGHBORS:
            raise _bad(path, f"{rel}_index", f"{k} neighbours per node, more than the limit {MAX_NEIGHBORS}")
        need(f"{rel}_weight", (n, k), "f")
        need(f"{rel}_similarity", (n, k), "f")
        if f"{rel}_bandwidth" in declared:
            need(f"{rel}_bandwidth", (n,), "f")
    for mat in ("full_features", "abstract_features"):
        need(f"{mat}/shape", (2,), "iu")
        need(f"{mat}/indptr", (n + 1,), "iu")
        need(f"{mat}/indices", (None,), "iu")
        nnz = declared[f"{mat}/indices"][0][0]
        if nnz > MAX_NNZ:
            raise _bad(path, f"{mat}/indices", f"{nnz} stored entries, more than the limit {MAX_NNZ}")
        need(f"{mat}/data", (nnz,), "f")
    for name in declared:
        if name.startswith(("vocab/", "idf/")):
            need(name, (None,), "U" if name.startswith("vocab/") else "f")
    return declared


def _finite(arr: np.ndarray, name: str, path: Path, *, low: float | None = None) -> None:
    if arr.size and not np.isfinite(arr).all():
        raise _bad(path, name, "holds NaN or infinite values")
    if low is not None and arr.size and float(arr.min()) < low:
        raise _bad(path, name, f"holds {float(arr.min())!r}, below {low}")


def _check_values(arrays: dict[str, np.ndarray], bandwidths: dict[str, Any], mats: dict[str, Any],
                  task_ids: list[str], envs: list[str], space: Any, header: dict[str, Any],
                  declared: dict[str, Any], path: Path) -> None:
    """Index ranges, finiteness and consistency of the arrays just read (their shapes were checked)."""
    n = header["num_nodes"]
    if len(set(task_ids)) != n:
        raise _bad(path, "task_ids", "task ids are not unique")
    if header.get("num_envs") is not None and header["num_envs"] != len(envs):
        raise _bad(path, "envs", f"{len(envs)} environments, the header declares {header['num_envs']}")
    codes = arrays["env_codes"]
    if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= len(envs)):
        raise _bad(path, "env_codes", f"environment codes must lie in [0, {len(envs)})")
    for rel in ("within", "cross"):
        idx = arrays[f"{rel}_index"]
        if idx.size and (int(idx.min()) < -1 or int(idx.max()) >= n):
            raise _bad(path, f"{rel}_index", f"neighbour indices must lie in [-1, {n}) (-1 pads a row); got "
                                             f"{int(idx.min())}..{int(idx.max())}")
        _finite(arrays[f"{rel}_weight"], f"{rel}_weight", path, low=0.0)
        if arrays[f"{rel}_weight"].size and float(arrays[f"{rel}_weight"].max()) > 1.0 + 1e-6:
            raise _bad(path, f"{rel}_weight", "neighbour weights must lie in [0, 1]")
        _finite(arrays[f"{rel}_similarity"], f"{rel}_similarity", path)
        if bandwidths.get(f"{rel}_bandwidth") is not None:
            _finite(bandwidths[f"{rel}_bandwidth"], f"{rel}_bandwidth", path, low=0.0)
    for mat_name, mat in mats.items():
        if mat.shape[0] != n or not 0 <= mat.shape[1] <= MAX_FEATURES:
            raise _bad(path, f"{mat_name}/shape", f"shape {mat.shape}, expected ({n}, <= {MAX_FEATURES})")
        _finite(mat.data, f"{mat_name}/data", path)
    if space is not None:
        for kind, views in (("full", space.full_views), ("abstract", space.abstract_views)):
            for v in views:
                if v.vocabulary is not None:
                    if len(v.idf) != len(v.vocabulary):
                        raise _bad(path, f"idf/{kind}/{v.name}", "length differs from its vocabulary")
                    _finite(v.idf, f"idf/{kind}/{v.name}", path)


def _csr(data: Any, name: str, n: int, path: Path) -> sp.csr_matrix:
    """A sparse feature matrix, its raw arrays checked (monotone ``indptr``, column indices in range)
    before scipy sees them: scipy trusts them and can crash on out-of-range indices."""
    shape = data[f"{name}/shape"]
    rows, cols = int(shape[0]), int(shape[1])
    if rows != n or not 0 <= cols <= MAX_FEATURES:
        raise _bad(path, f"{name}/shape", f"shape ({rows}, {cols}), expected ({n}, <= {MAX_FEATURES})")
    indptr, indices, values = data[f"{name}/indptr"], data[f"{name}/indices"], data[f"{name}/data"]
    if indptr[0] != 0 or indptr[-1] != len(indices) or (np.diff(indptr.astype(np.int64)) < 0).any():
        raise _bad(path, f"{name}/indptr", f"must rise from 0 to {len(indices)} without decreasing")
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= cols):
        raise _bad(path, f"{name}/indices", f"column indices must lie in [0, {cols}); got "
                                          f"{int(indices.min())}..{int(indices.max())}")
    _finite(values, f"{name}/data", path)
    return sp.csr_matrix((values, indices, indptr), shape=(rows, cols))
