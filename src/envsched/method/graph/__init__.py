"""Stage 1 of EnvSched, features and graph: the dual-relation graph over environment-task pairs.

- ``features``: the six weighted TF-IDF views of a task (``S_full``);
- ``abstraction`` / ``llm_abstraction``: the abstract representation behind ``S_abs`` (static or from an LLM);
- ``neighbors``: exact and approximate nearest neighbours with adaptive bandwidths;
- ``dual_graph``: :class:`DualRelationGraph`, the within-environment and cross-environment relations;
- ``build``: :func:`build_graph` / :func:`extend_graph` from a pool;
- ``io``: the versioned graph file (:func:`save_graph`, :func:`load_graph`);
- ``synthetic``: graphs from plain arrays (tests) and of any size (benchmarks).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envsched.method.graph.build import build_graph, extend_graph
    from envsched.method.graph.dual_graph import DualRelationGraph
    from envsched.method.graph.io import GraphFileError, load_graph, save_graph

__all__ = ["DualRelationGraph", "GraphFileError", "build_graph", "extend_graph", "load_graph", "save_graph"]

#: where each name of ``__all__`` lives, imported on first use: building a graph needs scikit-learn (the TF-IDF
#: views), which reading one (``envsched explain``, a sampler over a saved graph) does not
_HOMES = {"build_graph": "build", "extend_graph": "build", "DualRelationGraph": "dual_graph",
          "GraphFileError": "io", "load_graph": "io", "save_graph": "io"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
