"""Building the dual-relation graph from a :class:`~envsched.pool.TaskPool`, and growing it.

``build_graph(pool)`` runs: abstraction (static extractor, or LLM) -> features (six concrete TF-IDF
views, abstract views) -> within-environment neighbours under ``S_full`` -> cross-environment neighbours
under ``S_abs`` (exact, or approximate above ``exact_max_nodes`` with recall measured on a sample) ->
adaptive-bandwidth weights. ``extend_graph(graph, bigger_pool)`` adds the new tasks without a rebuild.

Complexity (N tasks, E environments, n_e tasks in environment e, K = K_within + K_cross, D features
per task): features O(N D); within neighbours O(sum_e n_e^2 D) (linear in N when environment sizes are
bounded); cross neighbours exact O(N^2 D), approximate O(N log N) (HNSW build and queries); weights O(N K).
Memory is O(N (D + K)).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from envsched.method.config import ABSTRACT_VIEWS, GraphConfig
from envsched.method.graph.abstraction import abstract_tokens, extract_abstraction
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.graph.features import FeatureSpace, build_features
from envsched.method.graph.neighbors import (
    adaptive_weights,
    ann_cross_neighbors,
    exact_cross_neighbors,
    merge_topk,
    recall_at_k,
    within_neighbors,
)
from envsched.pool import TaskPool

__all__ = ["ProgressFn", "build_graph", "compute_abstractions", "extend_graph", "static_abstract_tokens"]

#: ``progress(stage, advance, total)``: ``stage`` names the step, ``advance`` tasks just done, ``total``
#: tasks in the step (a new ``stage`` starts a new step).
ProgressFn = Callable[[str, int, int], None]


def _noop(stage: str, advance: int, total: int) -> None:
    return None


def compute_abstractions(specs: Sequence[Mapping[str, Any]], config: GraphConfig, *,
                         progress: ProgressFn | None = None) -> list[dict[str, Any]]:
    """The abstract representation of each spec: static extractor, or the LLM when configured."""
    progress = progress or _noop
    n = len(specs)
    if config.abstraction == "llm":
        from envsched.method.graph.llm_abstraction import LLMAbstractor

        extractor = LLMAbstractor(config.llm_endpoint or "", config.llm_model or "",
                                  cache_dir=config.llm_cache_dir)
        out = []
        for spec in specs:
            out.append(extractor.extract(spec))
            progress("abstraction (llm)", 1, n)
        return out
    out = []
    step = max(1, n // 100)
    cache: dict[int, dict[str, Any]] = {}
    for i, spec in enumerate(specs):
        out.append(extract_abstraction(spec, max_chars=config.initial_context_max_chars, tool_cache=cache))
        if (i + 1) % step == 0 or i + 1 == n:
            progress("abstraction (static)", step if (i + 1) % step == 0 else (i + 1) % step, n)
    return out


def _tokens(reps: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    intern = _Interner()
    return [intern(_joined_views(r)) for r in reps]


def _joined_views(rep: Mapping[str, Any]) -> tuple[str, ...]:
    toks = abstract_tokens(rep)
    return tuple(" ".join(toks[v]) for v in ABSTRACT_VIEWS)


def _static_tokens_chunk(args: tuple[list[Mapping[str, Any]], int]) -> list[tuple[str, ...]]:
    """Worker: static abstraction of a chunk of specs as joined token views (runs in a child process)."""
    specs, max_chars = args
    cache: dict[int, dict[str, Any]] = {}
    return [_joined_views(extract_abstraction(s, max_chars=max_chars, tool_cache=cache)) for s in specs]


class _Interner:
    """Equal abstract views are stored once (they repeat a lot across a large pool)."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __call__(self, views: tuple[str, ...]) -> dict[str, str]:
        return {v: self.seen.setdefault(d, d) for v, d in zip(ABSTRACT_VIEWS, views, strict=True)}


def static_abstract_tokens(specs: Sequence[Mapping[str, Any]], config: GraphConfig, *,
                           progress: ProgressFn | None = None) -> list[dict[str, str]]:
    """Abstract token views of every spec with the static extractor, in ``config.workers`` processes.

    Specs travel to the workers in chunks (pickled), so the parent's pool is never shared copy-on-write.
    Serial below ``parallel_min_tasks`` tasks (process start-up would cost more than it saves).
    """
    progress = progress or _noop
    n = len(specs)
    workers = config.workers or (os.cpu_count() or 1)
    if workers <= 1 or n < config.parallel_min_tasks:
        cache: dict[int, dict[str, Any]] = {}
        intern = _Interner()
        out = []
        step = max(1, n // 100)
        for i, spec in enumerate(specs):
            out.append(intern(_joined_views(extract_abstraction(
                spec, max_chars=config.initial_context_max_chars, tool_cache=cache))))
            if (i + 1) % step == 0 or i + 1 == n:
                progress("abstraction (static)", step if (i + 1) % step == 0 else (i + 1) % step, n)
        return out
    import gc
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    chunk = 2000
    jobs = ((list(specs[i:i + chunk]), config.initial_context_max_chars) for i in range(0, n, chunk))
    out: list[dict[str, str]] = []
    intern = _Interner()
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else "spawn")
    # fork: workers start at once and need no importable __main__; gc.freeze keeps the children's
    # garbage collector off the parent's objects, so the pool's pages stay shared (no copy-on-write)
    gc.freeze()
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
            for part in ex.map(_static_tokens_chunk, jobs):
                out.extend(intern(views) for views in part)
                progress("abstraction (static)", len(part), n)
    finally:
        gc.unfreeze()
    return out


def _cross(features: sp.csr_matrix, env_codes: np.ndarray, config: GraphConfig, progress: ProgressFn, *,
           rows: np.ndarray | None = None, candidates: np.ndarray | None = None,
           stage: str = "cross neighbours") -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    n_rows = features.shape[0] if rows is None else len(rows)
    n_cand = features.shape[0] if candidates is None else len(candidates)

    def tick(k: int) -> None:
        progress(stage, k, n_rows)

    if n_rows * n_cand <= config.exact_max_nodes ** 2 or min(n_rows, n_cand) <= 64:
        idx, sim = exact_cross_neighbors(features, env_codes, config.k_cross, rows=rows, candidates=candidates,
                                         min_similarity=config.min_similarity,
                                         block_rows=config.exact_block_rows, progress=tick)
        return idx, sim, {"method": "exact"}
    idx, sim, stats = ann_cross_neighbors(
        features, env_codes, config.k_cross, rows=rows, candidates=candidates,
        min_similarity=config.min_similarity, dense_dim=config.ann_dense_dim, backend=config.ann_backend,
        m=config.ann_m, ef_construction=config.ann_ef_construction, ef_search=config.ann_ef_search,
        oversample=config.ann_oversample, threads=config.ann_threads, seed=config.seed,
        block_rows=config.exact_block_rows, progress=tick)
    stats["method"] = "approximate"
    if config.recall_sample:
        rows_all = np.arange(features.shape[0]) if rows is None else np.asarray(rows)
        rng = np.random.default_rng(config.seed)
        pick = np.sort(rng.choice(len(rows_all), min(config.recall_sample, len(rows_all)), replace=False))
        t = time.perf_counter()
        ex_i, ex_s = exact_cross_neighbors(features, env_codes, config.k_cross, rows=rows_all[pick],
                                           candidates=candidates, min_similarity=config.min_similarity,
                                           block_rows=16)
        stats["recall_at_k"] = recall_at_k(idx[pick], ex_i, ex_s, features, rows_all[pick])
        stats["recall_seconds"] = round(time.perf_counter() - t, 3)
    return idx, sim, stats


def _within(features: sp.csr_matrix, env_codes: np.ndarray, config: GraphConfig, progress: ProgressFn, *,
            envs: np.ndarray | None = None, total: int | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    n = total if total is not None else features.shape[0]
    return within_neighbors(
        features, env_codes, config.k_within, min_similarity=config.min_similarity,
        exact_max_nodes=config.exact_max_nodes, block_rows=config.exact_block_rows,
        dense_dim=config.ann_dense_dim, backend=config.ann_backend, m=config.ann_m,
        ef_construction=config.ann_ef_construction, ef_search=config.ann_ef_search, threads=config.ann_threads,
        seed=config.seed, envs=envs, progress=lambda k: progress("within neighbours", k, n))


def _finish(pool: TaskPool, config: GraphConfig, full: sp.csr_matrix, abstract: sp.csr_matrix, space: Any,
            w_idx: np.ndarray, w_sim: np.ndarray, c_idx: np.ndarray, c_sim: np.ndarray,
            report: dict[str, Any]) -> DualRelationGraph:
    w_w, w_bw = adaptive_weights(w_idx, w_sim, config.bandwidth_rank_for(config.k_within), config.min_bandwidth)
    c_w, c_bw = adaptive_weights(c_idx, c_sim, config.bandwidth_rank_for(config.k_cross), config.min_bandwidth)
    within_deg = (w_idx >= 0).sum(axis=1)
    cross_deg = (c_idx >= 0).sum(axis=1)
    report["isolated"] = {"within": int((within_deg == 0).sum()), "cross": int((cross_deg == 0).sum())}
    report["mean_degree"] = {"within": float(within_deg.mean()) if len(w_idx) else 0.0,
                             "cross": float(cross_deg.mean()) if len(c_idx) else 0.0}
    return DualRelationGraph(
        task_ids=pool.ids, envs=pool.envs, env_codes=np.asarray(pool.env_codes, dtype=np.int32),
        within_index=w_idx.astype(np.int32 if len(pool) < 2**31 else np.int64), within_weight=w_w,
        within_similarity=w_sim.astype(np.float32),
        cross_index=c_idx.astype(np.int32 if len(pool) < 2**31 else np.int64), cross_weight=c_w,
        cross_similarity=c_sim.astype(np.float32),
        full_features=full, abstract_features=abstract, pool_fingerprint=pool.fingerprint(),
        config=config.to_dict(), report=report, within_bandwidth=w_bw, cross_bandwidth=c_bw,
        feature_space=space)


def build_graph(pool: TaskPool, config: GraphConfig | None = None, *, progress: ProgressFn | None = None,
                abstractions: Sequence[Mapping[str, Any]] | None = None,
                feature_space: FeatureSpace | None = None) -> DualRelationGraph:
    """Build the dual-relation graph of ``pool`` (see the module doc for the steps and their cost).

    Args:
        pool: the task pool; node ``i`` is ``pool[i]``.
        config: hyperparameters (:class:`GraphConfig`; the paper's defaults when ``None``).
        progress: optional ``progress(stage, advance, total)`` callback (the CLI draws a bar with it).
        abstractions: precomputed abstract representations, one per task (e.g. from an LLM run); by
            default they are computed as ``config.abstraction`` says.
        feature_space: a fitted feature space to map the tasks into (e.g. ``other_graph.feature_space``)
            instead of fitting vocabularies and IDF on this pool.

    Returns:
        The :class:`DualRelationGraph`; ``graph.report`` holds missing fields, timings, the neighbour
        search method, recall@K of approximate search (when used), degrees and isolated nodes.
    """
    config = config or GraphConfig()
    if not isinstance(pool, TaskPool):
        raise TypeError(f"build_graph needs a TaskPool, got {type(pool).__name__}")
    if len(pool) == 0:
        raise ValueError("cannot build a graph of an empty pool")
    progress = progress or _noop
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    specs = list(pool)
    if abstractions is not None:
        if len(abstractions) != len(specs):
            raise ValueError(f"{len(abstractions)} abstractions given for a pool of {len(specs)} tasks")
        toks = _tokens(abstractions)
    elif config.abstraction == "static":
        toks = static_abstract_tokens(specs, config, progress=progress)
    else:
        toks = _tokens(compute_abstractions(specs, config, progress=progress))
    del abstractions
    timings["abstraction"] = time.perf_counter() - t0
    t = time.perf_counter()
    feats = build_features(specs, toks, config, space=feature_space, progress=lambda s: progress(s, 0, 0))
    del toks
    timings["features"] = time.perf_counter() - t
    env_codes = np.asarray(pool.env_codes)
    t = time.perf_counter()
    w_idx, w_sim, w_stats = _within(feats.full, env_codes, config, progress)
    timings["within"] = time.perf_counter() - t
    t = time.perf_counter()
    c_idx, c_sim, c_stats = _cross(feats.abstract, env_codes, config, progress)
    timings["cross"] = time.perf_counter() - t - float(c_stats.get("recall_seconds", 0.0))
    if "recall_seconds" in c_stats:
        timings["recall_check"] = float(c_stats["recall_seconds"])
    report = {"features": feats.report, "within": w_stats, "cross": c_stats}
    t = time.perf_counter()
    graph = _finish(pool, config, feats.full, feats.abstract, feats.space, w_idx, w_sim, c_idx, c_sim, report)
    timings["weights"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    report["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    return graph


def extend_graph(graph: DualRelationGraph, pool: TaskPool, *, progress: ProgressFn | None = None,
                 abstractions: Sequence[Mapping[str, Any]] | None = None) -> DualRelationGraph:
    """Grow ``graph`` to ``pool``, a pool that starts with the graph's tasks (e.g. ``old.extend(new)``).

    New tasks (and new environments) are mapped into the graph's fitted feature space (vocabularies and
    IDF are kept, so existing similarities do not move); within-environment lists are recomputed only for
    environments that received tasks; new tasks search all tasks for cross neighbours; existing tasks
    search only the new tasks and merge them into their lists; weights are recomputed (O(N K)).

    The result equals ``build_graph`` of the grown pool *in the same feature space* when the searches are
    exact. A fresh rebuild refits the vocabularies and IDF on the grown pool, so its similarities differ
    slightly; rebuild when the pool has grown a lot (terms only new tasks use are not in the kept
    vocabulary and do not count).

    ``abstractions``: representations of the *new* tasks only (default: computed per the graph's config).
    Raises ``ValueError`` when ``pool`` does not start with the graph's tasks unchanged.
    """
    progress = progress or _noop
    if graph.feature_space is None:
        raise ValueError("this graph has no feature space (built by an older version?); rebuild it")
    n_old = graph.num_nodes
    if len(pool) < n_old or pool.ids[:n_old] != graph.task_ids:
        raise ValueError("extend_graph needs a pool that starts with the graph's tasks, in the same order "
                         f"(graph: {n_old} tasks, pool: {len(pool)}); build a new graph instead")
    old_part = TaskPool(list(pool)[:n_old], reward_range=pool.reward_range)
    if old_part.fingerprint() != graph.pool_fingerprint:
        raise ValueError("the pool's first tasks differ from the ones the graph was built from (fingerprint "
                         "mismatch); build a new graph instead")
    config = GraphConfig.from_dict(graph.config)
    t0 = time.perf_counter()
    new_specs = list(pool)[n_old:]
    if not new_specs:
        return graph
    if abstractions is None:
        abstractions = compute_abstractions(new_specs, config, progress=progress)
    feats = build_features(new_specs, _tokens(abstractions), config, space=graph.feature_space)
    full = sp.vstack([graph.full_features, feats.full], format="csr", dtype=np.float32)
    abstract = sp.vstack([graph.abstract_features, feats.abstract], format="csr", dtype=np.float32)
    env_codes = np.asarray(pool.env_codes)
    n = len(pool)
    new_rows = np.arange(n_old, n)
    old_rows = np.arange(n_old)

    # within: recompute the environments that received tasks (exactly as a build would)
    touched = np.unique(env_codes[new_rows])
    w_idx = np.full((n, config.k_within), -1, dtype=np.int64)
    w_sim = np.zeros((n, config.k_within), dtype=np.float32)
    w_idx[:n_old] = graph.within_index
    w_sim[:n_old] = graph.within_similarity
    ti, ts, w_stats = _within(full, env_codes, config, progress, envs=touched)
    affected = np.isin(env_codes, touched)
    w_idx[affected], w_sim[affected] = ti[affected], ts[affected]

    # cross: new rows against everything; old rows against the new rows only, merged
    c_idx = np.full((n, config.k_cross), -1, dtype=np.int64)
    c_sim = np.zeros((n, config.k_cross), dtype=np.float32)
    ni, ns, s_new = _cross(abstract, env_codes, config, progress, rows=new_rows, stage="cross (new tasks)")
    c_idx[new_rows], c_sim[new_rows] = ni, ns
    oi, os_, s_old = _cross(abstract, env_codes, config, progress, rows=old_rows, candidates=new_rows,
                            stage="cross (existing tasks)")
    c_idx[:n_old], c_sim[:n_old] = merge_topk(graph.cross_index.astype(np.int64), graph.cross_similarity,
                                              oi, os_, config.k_cross)
    report = dict(graph.report)
    report["extended"] = [*report.get("extended", []), {
        "added_tasks": len(new_specs), "from_tasks": n_old, "touched_envs": len(touched),
        "within": w_stats, "cross_new": s_new, "cross_existing": s_old,
        "missing": feats.report["missing"], "seconds": round(time.perf_counter() - t0, 3)}]
    return _finish(pool, config, full, abstract, graph.feature_space, w_idx, w_sim, c_idx, c_sim, report)
