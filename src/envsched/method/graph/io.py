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


class GraphFileError(ValueError):
    """A graph file cannot be used: not a graph file, another format version, or built from another pool."""


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
    from envsched import __version__

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
    try:
        header = json.loads(bytes(data["__header__"]).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise GraphFileError(f"{path}: corrupt graph header ({exc})") from None
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
                shape = tuple(int(x) for x in data[f"{name}/shape"])
                mats[name] = sp.csr_matrix((data[f"{name}/data"], data[f"{name}/indices"], data[f"{name}/indptr"]),
                                           shape=shape)
            arrays = {name: data[name] for name in _ARRAYS}
            bandwidths = {name: (data[name] if name in data.files else None)
                          for name in ("within_bandwidth", "cross_bandwidth")}
            space = None
            if header.get("feature_space") is not None:
                space = FeatureSpace.from_state(header["feature_space"],
                                                {k: data[k] for k in data.files if k.startswith(("vocab/", "idf/"))})
            task_ids = [str(t) for t in data["task_ids"].tolist()]
            envs = [str(e) for e in data["envs"].tolist()]
        except KeyError as exc:
            raise GraphFileError(f"{path}: incomplete graph file (missing {exc})") from None
    if len(task_ids) != header.get("num_nodes") or arrays["within_index"].shape[0] != len(task_ids):
        raise GraphFileError(f"{path}: inconsistent graph file (node counts differ)")
    if pool is not None and pool.ids != task_ids:
        raise GraphFileError(f"{path}: task ids differ from the pool's")
    return DualRelationGraph(task_ids=task_ids, envs=envs, **arrays, full_features=mats["full_features"],
                             abstract_features=mats["abstract_features"],
                             pool_fingerprint=str(header.get("pool_fingerprint", "")),
                             config=header.get("config") or {}, report=header.get("report") or {},
                             feature_space=space, **bandwidths)
