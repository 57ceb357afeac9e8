"""EnvSched's construction from a store's record: the ``restore`` hook of its registry record.

``EnvSchedSampler``'s constructor takes a graph, which a record holds only as a fingerprint and a build
configuration: restoring it needs the caller's graph (or a checked rebuild) and must never let the record
choose a file, an address or a process count. The logic reads a store's record (its graph fingerprint,
:mod:`envsched.store.records`), so it lives with the store, above ``envsched.method``, which cannot import the
store; the sampler registry (a lower layer still) points at it by name (``restore`` of the ``envsched``
record).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from envsched.store.errors import StoreError, StoreMismatchError
from envsched.store.records import graph_fingerprint
from envsched.validation import is_int

__all__ = ["envsched_from_record"]

#: Upper bounds on the recorded GraphConfig numbers a rebuild accepts (a crafted store could otherwise ask for
#: a graph that exhausts memory before its fingerprint is checked).
_GRAPH_REBUILD_CAPS = {"k_within": 10_000, "k_cross": 10_000, "ann_m": 1_000, "ann_ef_construction": 100_000,
                       "ann_ef_search": 100_000, "ann_oversample": 1_000, "ann_dense_dim": 100_000,
                       "exact_block_rows": 1_000_000, "exact_max_nodes": 10_000_000,
                       "initial_context_max_chars": 10_000_000, "recall_sample": 1_000_000,
                       "max_features_per_view": 10_000_000, "min_df": 1_000_000, "bandwidth_rank": 10_000}


def envsched_from_record(cls: Any, tasks: Any, record: Mapping[str, Any], *, graph: Any = None,
                         graph_path: str | os.PathLike[str] | None = None,
                         run_file: str | os.PathLike[str] | None = None, workers: int = 1,
                         notes: list[str] | None = None, where: str = "", **_: Any) -> Any:
    """Construct an ``EnvSchedSampler`` from its construction record (a store's header): its
    ``SchedulerConfig`` from the recorded plain data, its graph from the caller (``graph`` or ``graph_path``)
    or a rebuild with the recorded ``GraphConfig`` -- refused unless the graph's fingerprint equals the
    recorded one. The recorded graph file, run file, worker and thread counts, LLM endpoint and cache folder
    are never used (a record is data: it chooses no path, address or process count); one line per recorded
    field left unused is appended to ``notes``. ``where`` names the store in messages."""
    from envsched.method.config import GraphConfig
    from envsched.method.migrations import read_config
    from envsched.pool import TaskPool

    notes = notes if notes is not None else []
    header = record
    params = dict(record["sampler_params"])
    caller = {"graph": graph, "graph_path": graph_path, "run_file": run_file, "workers": workers}
    recorded = header.get("graph")
    if not isinstance(recorded, Mapping) or "fingerprint" not in recorded:
        raise StoreError(f"store {where} does not record the EnvSchedSampler's graph (written by an older "
                         "envsched): construct the sampler with its graph and wrap it: DurableSampler(sampler, "
                         "store)")
    config = read_config(params.pop("config"))
    stored_run_file = params.pop("run_file", "") or None
    run_file = caller.get("run_file")
    if stored_run_file and run_file is None:
        notes.append(f"sampler_params.run_file ({str(stored_run_file)[:120]}) is not written: a store never "
                     "chooses a file to write; pass resume(..., run_file=PATH) to append explanations")
    reward_range = tuple(params.pop("reward_range", header.get("reward_range") or (0.0, 1.0)))
    pool = TaskPool(list(tasks), reward_range=reward_range)
    graph, graph_path = caller.get("graph"), caller.get("graph_path")
    source = "the graph passed in"
    if graph is None and graph_path is not None:
        from envsched.method.graph.io import load_graph

        graph = load_graph(graph_path, expected_fingerprint=header["pool_fingerprint"])
        source = f"graph file {os.fspath(graph_path)}"
    if graph is None:
        if recorded.get("path"):
            notes.append(f"graph.path ({str(recorded['path'])[:120]}) is not opened: a store never chooses a file "
                         "to read; the graph is rebuilt from the recorded GraphConfig (pass resume(..., "
                         "graph_path=PATH) or `envsched store verify --graph PATH` to load it)")
        graph_config = _safe_graph_config(dict(recorded.get("config") or {}), where, caller, notes)
        from envsched.method.graph.build import build_graph

        graph = build_graph(pool, GraphConfig.from_dict(graph_config))
        source = "the graph rebuilt from the recorded GraphConfig"
    got = graph_fingerprint(graph)
    if got != recorded["fingerprint"]:
        raise StoreMismatchError(f"store {where} was written with a graph of fingerprint "
                                 f"{str(recorded['fingerprint'])[:12]}..., but {source} has {got[:12]}...: pass "
                                 "the run's graph (resume(store, graph_path=PATH)) or use a new store")
    return cls(pool, graph, config, run_file=run_file, reward_range=reward_range, **params)


def _safe_graph_config(config: dict[str, Any], where: str, caller: Mapping[str, Any], notes: list[str]
                       ) -> dict[str, Any]:
    """The recorded ``GraphConfig`` with what a store must not choose taken from the caller: an LLM
    abstraction (it would send the pool to the recorded endpoint) is refused; the worker and thread counts
    are the caller's ``workers``; the LLM endpoint, model and cache folder are dropped. Numbers beyond
    :data:`_GRAPH_REBUILD_CAPS` are refused."""
    if config.get("abstraction", "static") != "static":
        raise StoreError(f"store {where}: graph.config.abstraction is {str(config.get('abstraction'))[:40]!r} "
                         f"(endpoint {str(config.get('llm_endpoint'))[:80]!r}): a store never chooses an address "
                         "to call, so its graph is not rebuilt; pass the run's graph: resume(store, "
                         "graph_path=PATH) (`envsched store verify --graph PATH`)")
    for name, cap in _GRAPH_REBUILD_CAPS.items():
        value = config.get(name)
        if value is not None and not (is_int(value) and value <= cap):
            raise StoreError(f"store {where}: graph.config.{name} is {str(value)[:40]} (at most {cap} for a "
                             "rebuild from the store): pass the run's graph: resume(store, graph_path=PATH)")
    workers = int(caller.get("workers", 1))
    for name in ("workers", "ann_threads"):
        if name in config and config[name] not in (0, 1, workers):
            notes.append(f"graph.config.{name} ({str(config[name])[:20]}) is not used: a store never chooses a "
                         f"process or thread count; the rebuild uses {workers} (pass resume(..., workers=N))")
        config[name] = workers
    for name in ("llm_endpoint", "llm_model", "llm_cache_dir"):
        if config.get(name) is not None:
            notes.append(f"graph.config.{name} is not used: a store never chooses an address or folder")
        config[name] = None
    return config
