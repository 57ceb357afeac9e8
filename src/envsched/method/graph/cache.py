"""EnvSched's graph for a pool with the default :class:`~envsched.method.config.GraphConfig`, built once and
cached: in memory for the process (inherited by forked workers) and on disk as a validated graph file.

``envsched run`` and the benchmark lab read the graph of a pool through :func:`cached_graph`, so a pool's graph
is built once per pool, configuration and graph code, whichever of them asks first.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

from envsched.pool.pool import TaskPool

__all__ = ["cache_dir", "cached_graph", "clear_memory_cache"]

_MEMORY: dict[str, Any] = {}


def cache_dir() -> Path:
    """``$ENVSCHED_CACHE_DIR/graphs`` (default ``~/.cache/envsched/graphs``): graph files of the pools seen."""
    root = os.environ.get("ENVSCHED_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "envsched") / "graphs"


def clear_memory_cache() -> None:
    """Forget the graphs kept in memory (the files stay)."""
    _MEMORY.clear()


def cached_graph(pool: TaskPool) -> Any:
    """EnvSched's dual-relation graph for ``pool`` with the default GraphConfig.

    The disk cache is keyed by the pool's fingerprint, the graph configuration and the source of the graph
    code (a changed builder invalidates it); it is the validated graph file format, never pickle, so a cache
    file is data and cannot run code. An unreadable or invalid file is rebuilt over."""
    fp = pool.fingerprint()
    if fp in _MEMORY:
        return _MEMORY[fp]
    from envsched.method.config import GraphConfig
    from envsched.method.graph.build import build_graph
    from envsched.method.graph.io import GraphFileError, load_graph, save_graph

    h = hashlib.sha256((fp + repr(GraphConfig())).encode())
    for src in sorted(Path(__file__).parent.glob("*.py")):
        h.update(src.read_bytes())
    path = cache_dir() / f"graph-{h.hexdigest()[:20]}.graph.npz"
    graph = None
    if path.exists():
        try:
            graph = load_graph(path, pool)
        except (GraphFileError, OSError):
            graph = None
    if graph is None:
        graph = build_graph(pool, GraphConfig())
        with contextlib.suppress(OSError):
            save_graph(graph, path)
    _MEMORY[fp] = graph
    return graph
