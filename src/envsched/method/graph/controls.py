"""Negative controls of the dual-relation graph: graphs that keep its shape and lose its information.

The evaluation protocol (``docs/evaluation-protocol.md``) runs EnvSched on two such graphs. If EnvSched's
advantage really comes from what the graph says about which tasks are alike, both controls should lose it.
If a control keeps it, the advantage comes from somewhere else (coverage quotas, calibration, batch
shape), and the report must say so.

* :func:`shuffled_graph`: every node keeps its degree in each relation and its row of weights and
  similarities. Only the neighbours change: random tasks of the same environment (within) or of other
  environments (cross). Features are unchanged, so the similarity penalty and the representativeness scores
  still see the real tasks, and only propagation loses its meaning.
* :func:`noise_feature_graph`: both feature matrices are replaced by noise with the same shape and the
  same number of non-zeros per row. Neighbours, bandwidths and weights are then recomputed by the same
  code and configuration as the real graph. Everything EnvSched derives from static features becomes
  noise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.preprocessing import normalize

from envsched.method.config import GraphConfig
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.pool.pool import TaskPool

__all__ = ["noise_feature_graph", "shuffled_graph"]


def _random_rows(index: np.ndarray, candidates_of: Any, rng: np.random.Generator) -> np.ndarray:
    out = np.full_like(index, -1)
    degree = (index >= 0).sum(axis=1)
    for node in range(index.shape[0]):
        d = int(degree[node])
        if d == 0:
            continue
        pool = candidates_of(node)
        take = min(d, pool.size)
        # the valid entries of a row are its first `degree` slots (rows are padded at the end with -1)
        out[node, :take] = rng.choice(pool, size=take, replace=False)
    return out


def shuffled_graph(graph: DualRelationGraph, seed: int) -> DualRelationGraph:
    """A copy of ``graph`` with random neighbours and the same degrees, weight rows and similarity rows.

    Within-environment neighbours are drawn without replacement from the node's own environment (itself
    excluded), cross-environment neighbours from all other environments. A node whose environment has fewer
    other tasks than its degree keeps fewer neighbours (the rest padded with ``-1``; weights renormalised).
    """
    rng = np.random.default_rng([int(seed), 0x5EED])
    codes = np.asarray(graph.env_codes)
    order = np.argsort(codes, kind="stable")
    starts = np.searchsorted(codes[order], np.arange(len(graph.envs) + 1))
    members = [order[starts[e]:starts[e + 1]] for e in range(len(graph.envs))]
    everyone = np.arange(graph.num_nodes)

    def same_env(node: int) -> np.ndarray:
        m = members[codes[node]]
        return m[m != node]

    def other_envs(node: int) -> np.ndarray:
        return everyone[codes != codes[node]]

    within = _random_rows(graph.within_index, same_env, rng)
    cross = _random_rows(graph.cross_index, other_envs, rng)

    def weights(index: np.ndarray, weight: np.ndarray) -> np.ndarray:
        w = np.where(index >= 0, weight, 0.0).astype(weight.dtype)
        total = w.sum(axis=1, keepdims=True)
        return np.divide(w, total, out=np.zeros_like(w), where=total > 0)

    report = {**graph.report, "control": {"kind": "shuffled", "seed": int(seed)}}
    return DualRelationGraph(
        task_ids=list(graph.task_ids), envs=list(graph.envs), env_codes=graph.env_codes.copy(),
        within_index=within.astype(graph.within_index.dtype), within_weight=weights(within, graph.within_weight),
        within_similarity=np.where(within >= 0, graph.within_similarity, 0).astype(graph.within_similarity.dtype),
        cross_index=cross.astype(graph.cross_index.dtype), cross_weight=weights(cross, graph.cross_weight),
        cross_similarity=np.where(cross >= 0, graph.cross_similarity, 0).astype(graph.cross_similarity.dtype),
        full_features=graph.full_features, abstract_features=graph.abstract_features,
        pool_fingerprint=graph.pool_fingerprint, config=dict(graph.config), report=report,
        within_bandwidth=graph.within_bandwidth, cross_bandwidth=graph.cross_bandwidth,
        feature_space=graph.feature_space)


def _noise_like(features: sp.csr_matrix, rng: np.random.Generator) -> sp.csr_matrix:
    features = sp.csr_matrix(features)
    n_rows, n_cols = features.shape
    indptr = features.indptr.copy()
    indices = np.empty(features.nnz, dtype=np.int64)
    for row in range(n_rows):
        k = int(indptr[row + 1] - indptr[row])
        if k:
            indices[indptr[row]:indptr[row + 1]] = np.sort(rng.choice(n_cols, size=min(k, n_cols), replace=False))
    data = rng.random(features.nnz) + 1e-3
    return normalize(sp.csr_matrix((data, indices, indptr), shape=(n_rows, n_cols)), norm="l2")


def noise_feature_graph(graph: DualRelationGraph, pool: TaskPool, seed: int) -> DualRelationGraph:
    """The graph the builder makes from noise features of ``graph``'s shape, with ``graph``'s configuration."""
    from envsched.method.graph.build import _cross, _finish, _noop, _within

    if pool.fingerprint() != graph.pool_fingerprint:
        raise ValueError("noise_feature_graph: the pool is not the one the graph was built from")
    rng = np.random.default_rng([int(seed), 0x0015E])
    config = GraphConfig.from_dict(dict(graph.config)) if graph.config else GraphConfig()
    full = _noise_like(graph.full_features, rng)
    abstract = _noise_like(graph.abstract_features, rng)
    codes = np.asarray(pool.env_codes)
    w_idx, w_sim, w_stats = _within(full, codes, config, _noop)
    c_idx, c_sim, c_stats = _cross(abstract, codes, config, _noop)
    report = {"within": w_stats, "cross": c_stats, "control": {"kind": "noise_features", "seed": int(seed)}}
    return _finish(pool, config, full, abstract, None, w_idx, w_sim, c_idx, c_sim, report)
