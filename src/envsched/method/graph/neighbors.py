"""Nearest-neighbour search for the two relations, exact or approximate, and adaptive neighbour weights.

* **within**: for each task, its ``k`` most similar tasks of the *same* environment (cosine of the
  L2-normalised concrete features). Environments are searched one at a time, exactly (blocked sparse
  products), unless an environment alone exceeds ``exact_max_nodes`` tasks.
* **cross**: for each task, its ``k`` most similar tasks of *other* environments (cosine of the abstract
  features). Exact (blocked products with the own environment masked) up to ``exact_max_nodes`` tasks,
  approximate above: an HNSW index (hnswlib, chosen by measurement, see ``docs/graph.md``) over the
  abstract features, densified (truncated SVD when their dimension exceeds ``ann_dense_dim``). A task's
  own environment can fill the candidates the index returns, so each task first asks for
  ``k + |own environment|`` candidates (bounded), and tasks still short are asked again with twice as
  many, then searched exactly. Similarities stored in the graph are always recomputed exactly on the
  sparse features, so approximation can only change *which* neighbours are found, never their values.

Rows are padded with ``-1`` (index) and ``0`` (similarity). Pairs with similarity ``<= min_similarity``
are never neighbours (they share no feature).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = [
    "adaptive_weights",
    "ann_cross_neighbors",
    "exact_cross_neighbors",
    "exact_within_neighbors",
    "merge_topk",
    "pair_similarities",
    "recall_at_k",
    "within_neighbors",
]

_DENSE_EXACT_MAX_DIM = 4096


def _threads(n: int) -> int:
    return n if n > 0 else (os.cpu_count() or 1)


def _topk_rows(scores: np.ndarray, k: int, min_sim: float) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` columns of each row of a dense score block (``-inf`` = excluded), sorted descending."""
    rows, cols = scores.shape
    kk = min(k, cols)
    out_i = np.full((rows, k), -1, dtype=np.int64)
    out_s = np.zeros((rows, k), dtype=np.float32)
    if kk == 0 or rows == 0:
        return out_i, out_s
    if kk < cols:
        part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
    else:
        part = np.broadcast_to(np.arange(cols), (rows, cols)).copy()
    vals = np.take_along_axis(scores, part, axis=1)
    # sort by similarity descending, ties by index ascending (deterministic)
    order = np.lexsort((part, -vals), axis=1)
    part = np.take_along_axis(part, order, axis=1)
    vals = np.take_along_axis(vals, order, axis=1)
    ok = vals > min_sim
    out_i[:, :kk] = np.where(ok, part, -1)
    out_s[:, :kk] = np.where(ok, vals, 0.0)
    return out_i, out_s


def _dense_or_sparse(x: sp.csr_matrix) -> Any:
    if x.shape[1] <= _DENSE_EXACT_MAX_DIM and x.shape[0] * x.shape[1] * 4 <= 512 * 2**20:
        return np.asarray(x.todense(), dtype=np.float32)
    return x


def _scores(a: Any, b: Any) -> np.ndarray:
    s = a @ b.T
    if sp.issparse(s):
        s = s.toarray()
    return np.asarray(s, dtype=np.float32)


def exact_within_neighbors(features: sp.csr_matrix, members: np.ndarray, k: int, *, min_similarity: float = 0.0,
                           block_rows: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` neighbours of each task of one environment among the others of the same environment.

    ``members`` are global row indices; returns global indices ``(len(members), k)`` and similarities.
    """
    members = np.asarray(members, dtype=np.int64)
    x = _dense_or_sparse(features[members])
    idx = np.full((len(members), k), -1, dtype=np.int64)
    sim = np.zeros((len(members), k), dtype=np.float32)
    for start in range(0, len(members), block_rows):
        stop = min(start + block_rows, len(members))
        s = _scores(x[start:stop], x)
        s[np.arange(stop - start), np.arange(start, stop)] = -np.inf
        li, ls = _topk_rows(s, k, min_similarity)
        idx[start:stop] = np.where(li >= 0, members[np.maximum(li, 0)], -1)
        sim[start:stop] = ls
    return idx, sim


def exact_cross_neighbors(features: sp.csr_matrix, env_codes: np.ndarray, k: int, *,
                          rows: np.ndarray | None = None, candidates: np.ndarray | None = None,
                          min_similarity: float = 0.0, block_rows: int = 1024,
                          progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` other-environment neighbours of ``rows`` (default: all) among ``candidates``.

    Cost ``O(|rows| * |candidates| * dim)`` time, ``O(block_rows * |candidates|)`` memory.
    """
    n = features.shape[0]
    rows = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64)
    candidates = np.arange(n) if candidates is None else np.asarray(candidates, dtype=np.int64)
    data = _dense_or_sparse(features[candidates])
    cand_env = env_codes[candidates]
    idx = np.full((len(rows), k), -1, dtype=np.int64)
    sim = np.zeros((len(rows), k), dtype=np.float32)
    for start in range(0, len(rows), block_rows):
        stop = min(start + block_rows, len(rows))
        q = features[rows[start:stop]]
        q = q.toarray() if not sp.issparse(data) else q
        s = _scores(q, data)
        s[env_codes[rows[start:stop]][:, None] == cand_env[None, :]] = -np.inf
        li, ls = _topk_rows(s, k, min_similarity)
        idx[start:stop] = np.where(li >= 0, candidates[np.maximum(li, 0)], -1)
        sim[start:stop] = ls
        if progress:
            progress(stop - start)
    return idx, sim


def pair_similarities(features: sp.csr_matrix, rows: np.ndarray, cols: np.ndarray, *,
                      chunk: int = 100_000) -> np.ndarray:
    """Exact ``features[rows[i]] . features[cols[i]]`` for each pair (``cols < 0`` gives 0)."""
    rows = np.asarray(rows, dtype=np.int64).ravel()
    cols = np.asarray(cols, dtype=np.int64).ravel()
    out = np.zeros(len(rows), dtype=np.float32)
    valid = np.flatnonzero(cols >= 0)
    for start in range(0, len(valid), chunk):
        sel = valid[start:start + chunk]
        prod = features[rows[sel]].multiply(features[cols[sel]])
        out[sel] = np.asarray(prod.sum(axis=1)).ravel()
    return out


class _Projector:
    """Dense, L2-normalised rows for the index, computed on demand (the whole dense matrix is never held).

    The features themselves when they have at most ``dim`` columns (cosine preserved exactly), else a
    truncated SVD to ``dim`` dimensions (fitted on at most 200,000 rows) re-normalised.
    """

    def __init__(self, features: sp.csr_matrix, dim: int, seed: int) -> None:
        self.features = features
        self.components: np.ndarray | None = None
        if features.shape[1] > dim:
            from sklearn.decomposition import TruncatedSVD

            dim = max(1, min(dim, features.shape[0] - 1, features.shape[1] - 1))
            svd = TruncatedSVD(n_components=dim, algorithm="randomized", n_iter=4, random_state=seed)
            fit_rows = features
            if features.shape[0] > 200_000:
                rng = np.random.default_rng(seed)
                fit_rows = features[np.sort(rng.choice(features.shape[0], 200_000, replace=False))]
            svd.fit(fit_rows)
            self.components = np.ascontiguousarray(svd.components_.T, dtype=np.float32)
        self.dim = int(features.shape[1] if self.components is None else dim)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        x = self.features[rows]
        if self.components is None:
            return np.asarray(x.toarray(), dtype=np.float32)
        from sklearn.preprocessing import normalize

        dense = np.asarray(x @ self.components, dtype=np.float32)
        return normalize(dense, copy=False)


class _Index:
    """A thin wrapper over the approximate index backends (``hnswlib`` or ``pynndescent``)."""

    def __init__(self, project: _Projector, labels: np.ndarray, *, backend: str, m: int, ef_construction: int,
                 ef_search: int, threads: int, seed: int, chunk: int = 100_000) -> None:
        self.backend = backend
        self.size = len(labels)
        self.ef_search = ef_search
        self.threads = threads
        if backend == "hnswlib":
            try:
                import hnswlib
            except ImportError:
                raise ImportError("approximate neighbour search (pools above GraphConfig.exact_max_nodes tasks) "
                                  "needs hnswlib: pip install 'envsched[graph]'") from None

            self.index = hnswlib.Index(space="ip", dim=project.dim)
            self.index.init_index(max_elements=max(1, len(labels)), M=m, ef_construction=ef_construction,
                                  random_seed=seed)
            for start in range(0, len(labels), chunk):
                part = labels[start:start + chunk]
                self.index.add_items(project(part), part, num_threads=threads)
        elif backend == "pynndescent":
            try:
                import pynndescent
            except ImportError:
                raise ImportError("ann_backend='pynndescent' needs pynndescent: "
                                  "pip install 'envsched[graph-pynndescent]'") from None

            self.labels = labels
            self.index = pynndescent.NNDescent(project(labels), metric="dot", n_neighbors=max(2 * m, 15),
                                               random_state=seed, n_jobs=threads, low_memory=True)
            self.index.prepare()
        else:
            raise ValueError(f"unknown approximate-neighbour backend {backend!r} (hnswlib or pynndescent)")

    def query(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(labels, similarity)`` of the ``k`` best items for each query (approximate)."""
        k = min(k, self.size)
        if self.backend == "hnswlib":
            self.index.set_ef(max(self.ef_search, k + 8))
            lab, dist = self.index.knn_query(queries, k=k, num_threads=self.threads)
            return lab.astype(np.int64), (1.0 - dist).astype(np.float32)
        pos, dist = self.index.query(queries, k=k, epsilon=0.1)
        return self.labels[pos].astype(np.int64), (1.0 - dist).astype(np.float32)


def ann_cross_neighbors(features: sp.csr_matrix, env_codes: np.ndarray, k: int, *, rows: np.ndarray | None = None,
                        candidates: np.ndarray | None = None, min_similarity: float = 0.0, dense_dim: int = 256,
                        backend: str = "hnswlib", m: int = 12, ef_construction: int = 64, ef_search: int = 64,
                        oversample: int = 4, max_query_k: int = 512, threads: int = 0, seed: int = 0,
                        block_rows: int = 1024, progress: Callable[[int], None] | None = None,
                        ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Approximate top-``k`` other-environment neighbours of ``rows`` among ``candidates`` (see module doc).

    Returns global indices, exact similarities and statistics (queries per round, exact fallbacks).
    """
    n = features.shape[0]
    rows = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64)
    candidates = np.arange(n) if candidates is None else np.asarray(candidates, dtype=np.int64)
    threads = _threads(threads)
    idx = np.full((len(rows), k), -1, dtype=np.int64)
    sim = np.zeros((len(rows), k), dtype=np.float32)
    stats: dict[str, Any] = {"backend": backend, "rounds": [], "exact_fallback": 0}
    nnz = np.diff(features.indptr)
    cand = candidates[nnz[candidates] > 0]  # tasks with no abstract feature share nothing with anyone
    live = np.flatnonzero(nnz[rows] > 0)
    if len(cand) == 0 or len(live) == 0:
        return idx, sim, stats
    import time

    t0 = time.perf_counter()
    project = _Projector(features, dense_dim, seed)
    stats["dense_dim"] = project.dim
    stats["svd"] = project.components is not None
    t1 = time.perf_counter()
    index = _Index(project, cand, backend=backend, m=m, ef_construction=ef_construction,
                   ef_search=ef_search, threads=threads, seed=seed)
    t2 = time.perf_counter()
    stats["seconds"] = {"projection": round(t1 - t0, 3), "index_build": round(t2 - t1, 3)}
    cand_env_size = np.bincount(env_codes[cand], minlength=int(env_codes.max()) + 1)
    own = cand_env_size[env_codes[rows[live]]]
    want = np.clip(k + own + 1, k * oversample, max_query_k)
    want = (2 ** np.ceil(np.log2(np.maximum(want, 1)))).astype(np.int64)
    pending = live
    pending_want = want
    while len(pending):
        short_all: list[np.ndarray] = []
        next_want: list[np.ndarray] = []
        for kq in np.unique(pending_want):
            group = pending[pending_want == kq]
            for start in range(0, len(group), 8192):
                sel = group[start:start + 8192]
                glob = rows[sel]
                lab, _s = index.query(project(glob), int(kq))
                keep = (env_codes[lab] != env_codes[glob][:, None]) & (lab != glob[:, None])
                # first k kept labels per row, in returned (approximate similarity) order
                rank = np.cumsum(keep, axis=1)
                take = keep & (rank <= k)
                counts = take.sum(axis=1)
                enough = (counts >= k) | (kq >= index.size)
                r, c = np.nonzero(take)
                slot = rank[r, c] - 1
                block = np.full((len(sel), k), -1, dtype=np.int64)
                block[r, slot] = lab[r, c]
                idx[sel[enough]] = block[enough]
                if progress:
                    progress(int(enough.sum()))
                if (~enough).any():
                    short_all.append(sel[~enough])
                    next_want.append(np.full(int((~enough).sum()), kq * 2))
        stats["rounds"].append({"queries": len(pending), "k_max": int(pending_want.max())})
        if not short_all:
            break
        pending = np.concatenate(short_all)
        pending_want = np.concatenate(next_want)
        too_big = pending_want > max_query_k * 4
        if too_big.any():
            hard = pending[too_big]
            stats["exact_fallback"] += len(hard)
            hi, hs = exact_cross_neighbors(features, env_codes, k, rows=rows[hard], candidates=cand,
                                           min_similarity=min_similarity, block_rows=block_rows)
            idx[hard], sim[hard] = hi, hs
            if progress:
                progress(len(hard))
            pending, pending_want = pending[~too_big], pending_want[~too_big]
    del index
    t3 = time.perf_counter()
    stats["seconds"]["queries"] = round(t3 - t2, 3)
    # exact similarities of what was found; re-sort; drop pairs sharing nothing
    found = idx[live]
    s = pair_similarities(features, np.repeat(rows[live], k), found.ravel()).reshape(found.shape)
    s = np.where(found >= 0, s, -np.inf)
    order = np.lexsort((np.where(found >= 0, found, np.iinfo(np.int64).max), -s), axis=1)
    found = np.take_along_axis(found, order, axis=1)
    s = np.take_along_axis(s, order, axis=1)
    ok = s > min_similarity
    idx[live] = np.where(ok, found, -1)
    sim[live] = np.where(ok, s, 0.0)
    stats["seconds"]["exact_rescoring"] = round(time.perf_counter() - t3, 3)
    return idx, sim, stats


def within_neighbors(features: sp.csr_matrix, env_codes: np.ndarray, k: int, *, min_similarity: float = 0.0,
                     exact_max_nodes: int = 20_000, block_rows: int = 1024, dense_dim: int = 256,
                     backend: str = "hnswlib", m: int = 12, ef_construction: int = 64, ef_search: int = 64,
                     threads: int = 0, seed: int = 0, envs: np.ndarray | None = None,
                     progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Same-environment neighbours of every task (exact per environment; approximate for huge ones).

    ``envs`` restricts the work to those environment codes (rows of other environments stay empty).
    """
    n = features.shape[0]
    idx = np.full((n, k), -1, dtype=np.int64)
    sim = np.zeros((n, k), dtype=np.float32)
    order = np.argsort(env_codes, kind="stable")
    bounds = np.flatnonzero(np.diff(env_codes[order])) + 1
    stats: dict[str, Any] = {"exact_envs": 0, "approximate_envs": 0}
    wanted = None if envs is None else set(int(e) for e in envs)
    for members in np.split(order, bounds):
        if len(members) == 0 or (wanted is not None and int(env_codes[members[0]]) not in wanted):
            continue
        if len(members) <= exact_max_nodes:
            mi, ms = exact_within_neighbors(features, members, k, min_similarity=min_similarity,
                                            block_rows=block_rows)
            stats["exact_envs"] += 1
        else:
            project = _Projector(features[members], dense_dim, seed)
            index = _Index(project, np.arange(len(members)), backend=backend, m=m,
                           ef_construction=ef_construction, ef_search=ef_search, threads=_threads(threads),
                           seed=seed)
            lab = np.concatenate([index.query(project(np.arange(s0, min(s0 + 65_536, len(members)))), k + 1)[0]
                                  for s0 in range(0, len(members), 65_536)])
            lab = np.where(lab == np.arange(len(members))[:, None], -1, lab)
            cand = np.full((len(members), k), -1, dtype=np.int64)
            for r in range(len(members)):
                row = lab[r][lab[r] >= 0][:k]
                cand[r, : len(row)] = members[row]
            s = pair_similarities(features, np.repeat(members, k), cand.ravel()).reshape(cand.shape)
            s = np.where(cand >= 0, s, -np.inf)
            o = np.argsort(-s, axis=1, kind="stable")
            cand, s = np.take_along_axis(cand, o, axis=1), np.take_along_axis(s, o, axis=1)
            ok = s > min_similarity
            mi, ms = np.where(ok, cand, -1), np.where(ok, s, 0.0).astype(np.float32)
            stats["approximate_envs"] += 1
        idx[members], sim[members] = mi, ms
        if progress:
            progress(len(members))
    return idx, sim, stats


def merge_topk(idx_a: np.ndarray, sim_a: np.ndarray, idx_b: np.ndarray, sim_b: np.ndarray,
               k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise union of two candidate lists, keeping the ``k`` most similar distinct entries."""
    idx = np.concatenate([idx_a, idx_b], axis=1)
    sim = np.concatenate([sim_a, sim_b], axis=1).astype(np.float32)
    key = np.where(idx >= 0, sim, -np.inf)
    # de-duplicate: sort by (index, -sim) and blank repeats
    o = np.lexsort((-key, idx), axis=1)
    idx_s, key_s = np.take_along_axis(idx, o, axis=1), np.take_along_axis(key, o, axis=1)
    dup = np.zeros_like(idx_s, dtype=bool)
    dup[:, 1:] = (idx_s[:, 1:] == idx_s[:, :-1]) & (idx_s[:, 1:] >= 0)
    key_s = np.where(dup, -np.inf, key_s)
    o2 = np.lexsort((np.where(np.isfinite(key_s), idx_s, np.iinfo(np.int64).max), -key_s), axis=1)[:, :k]
    out_i = np.take_along_axis(idx_s, o2, axis=1)
    out_k = np.take_along_axis(key_s, o2, axis=1)
    valid = np.isfinite(out_k)
    pad = k - out_i.shape[1]
    out_i = np.where(valid, out_i, -1)
    out_s = np.where(valid, out_k, 0.0).astype(np.float32)
    if pad > 0:
        out_i = np.pad(out_i, ((0, 0), (0, pad)), constant_values=-1)
        out_s = np.pad(out_s, ((0, 0), (0, pad)))
    return out_i, out_s


def adaptive_weights(idx: np.ndarray, sim: np.ndarray, rank: int, min_bandwidth: float) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """Neighbour weights with adaptive (per-node) bandwidths; returns ``(weights, bandwidths)``.

    Distance ``d = 1 - S``. Node ``i``'s bandwidth ``sigma_i`` is its distance to its ``rank``-th
    neighbour (its last one if it has fewer), floored at ``min_bandwidth``; the weight of neighbour ``j``
    is ``exp(-d_ij^2 / (2 sigma_i^2))`` normalised over the row. A node in a dense region (close
    neighbours) thus weighs its neighbours sharply; a node whose neighbours are all far spreads its weight
    evenly instead of giving them all ~0. Neighbours at equal distance get equal weight. Rows without
    neighbours get weight 0 everywhere.
    """
    n, k = idx.shape
    valid = idx >= 0
    dist = np.where(valid, 1.0 - sim.astype(np.float64), 0.0)
    count = valid.sum(axis=1)
    if k == 0:
        return np.zeros((n, 0), dtype=np.float32), np.ones(n, dtype=np.float32)
    pick = np.clip(np.minimum(rank, count) - 1, 0, k - 1)
    sigma = np.where(count > 0, dist[np.arange(n), pick], 1.0)
    sigma = np.maximum(sigma, min_bandwidth)
    w = np.where(valid, np.exp(-(dist ** 2) / (2.0 * sigma[:, None] ** 2)), 0.0)
    total = w.sum(axis=1, keepdims=True)
    w = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    return w.astype(np.float32), sigma.astype(np.float32)


def recall_at_k(approx_idx: np.ndarray, exact_idx: np.ndarray, exact_sim: np.ndarray, features: sp.csr_matrix,
                rows: np.ndarray) -> dict[str, float]:
    """Recall@K of approximate neighbour lists against exact ones, on ``rows``.

    ``strict``: share of the exact neighbour ids found. ``tie_aware``: share of exact slots matched by a
    found neighbour at least as similar as the exact K-th one (abstract features often tie; two different
    tasks with the same similarity are equally correct).
    """
    strict, tie = [], []
    for r, row in enumerate(rows):
        ex = exact_idx[r][exact_idx[r] >= 0]
        if len(ex) == 0:
            continue
        ap = approx_idx[r][approx_idx[r] >= 0]
        strict.append(len(np.intersect1d(ex, ap)) / len(ex))
        kth = float(exact_sim[r][len(ex) - 1])
        s = pair_similarities(features, np.full(len(ap), row), ap)
        tie.append(min(len(ex), int((s >= kth - 1e-5).sum())) / len(ex))
    return {"strict": float(np.mean(strict)) if strict else 1.0,
            "tie_aware": float(np.mean(tie)) if tie else 1.0, "sampled": len(strict)}
