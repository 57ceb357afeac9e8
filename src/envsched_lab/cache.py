"""Where the benchmark keeps what it can rebuild (graphs, BFCL checker memos, warmed-up networks)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["bench_cache_dir"]


def bench_cache_dir() -> Path:
    """``$ENVSCHED_CACHE_DIR/bench`` (default ``~/.cache/envsched/bench``): graphs and BFCL checker memos."""
    root = os.environ.get("ENVSCHED_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "envsched") / "bench"
