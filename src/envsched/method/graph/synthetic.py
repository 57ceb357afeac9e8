"""Dual-relation graphs from plain arrays: for tests, examples and scheduler benchmarks at any size.

:func:`graph_from_arrays` wraps hand-written neighbour lists into a :class:`DualRelationGraph` (uniform
weights and one-hot features unless given). :func:`synthetic_graph` makes a random but structured graph
of any size in ``O(N K)`` -- environments of equal size, each task drawing concrete tokens from its
environment's vocabulary and abstract "pattern" tokens from a global one, neighbours drawn at random in
the right relation and weighted by their actual feature similarity. It exercises the scheduler exactly
like a real graph (same arrays, same sparsity pattern) without building features from task text; the
scheduler benchmark uses it for the large pool sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from envsched.method.graph.dual_graph import DualRelationGraph

__all__ = ["graph_from_arrays", "synthetic_graph", "synthetic_tasks"]


def _normalise_rows(m: sp.csr_matrix) -> sp.csr_matrix:
    m = sp.csr_matrix(m, dtype=np.float64)
    norms = np.sqrt(np.asarray(m.multiply(m).sum(axis=1)).ravel())
    inv = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return sp.csr_matrix(sp.diags(inv) @ m)


def _pad(rows: Sequence[Sequence[int]] | np.ndarray, n: int) -> np.ndarray:
    if isinstance(rows, np.ndarray):
        return rows.astype(np.int64)
    k = max((len(r) for r in rows), default=0)
    out = np.full((n, k), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _uniform(index: np.ndarray) -> np.ndarray:
    valid = index >= 0
    cnt = valid.sum(axis=1, keepdims=True)
    return np.where(valid, 1.0 / np.maximum(cnt, 1), 0.0)


def graph_from_arrays(task_ids: Sequence[str], env_names: Sequence[str],
                      within: Sequence[Sequence[int]] | np.ndarray, cross: Sequence[Sequence[int]] | np.ndarray, *,
                      within_weight: np.ndarray | None = None, cross_weight: np.ndarray | None = None,
                      full_features: sp.spmatrix | np.ndarray | None = None,
                      abstract_features: sp.spmatrix | np.ndarray | None = None) -> DualRelationGraph:
    """A :class:`DualRelationGraph` from neighbour lists (ragged lists or ``-1``-padded arrays).

    Weights default to uniform over each row's neighbours; features default to one-hot rows (every pair of
    distinct tasks has similarity 0). Similarities of the neighbour lists are computed from the features.
    """
    n = len(task_ids)
    envs = sorted(set(env_names))
    pos = {e: i for i, e in enumerate(envs)}
    codes = np.asarray([pos[e] for e in env_names], dtype=np.int32)
    wi, ci = _pad(within, n), _pad(cross, n)
    ww = _uniform(wi) if within_weight is None else np.asarray(within_weight, dtype=float)
    cw = _uniform(ci) if cross_weight is None else np.asarray(cross_weight, dtype=float)
    full = _normalise_rows(sp.identity(n, format="csr") if full_features is None else sp.csr_matrix(full_features))
    abstract = _normalise_rows(sp.identity(n, format="csr") if abstract_features is None
                               else sp.csr_matrix(abstract_features))
    return DualRelationGraph(task_ids=list(task_ids), envs=envs, env_codes=codes, within_index=wi, within_weight=ww,
                             within_similarity=_row_similarity(full, wi), cross_index=ci, cross_weight=cw,
                             cross_similarity=_row_similarity(abstract, ci), full_features=full,
                             abstract_features=abstract, config={"synthetic": True})


def _row_similarity(features: sp.csr_matrix, index: np.ndarray) -> np.ndarray:
    """``sim[i, j] = <f_i, f_index[i, j]>`` for every listed neighbour, in ``O(N K nnz_row)``."""
    n, k = index.shape
    out = np.zeros((n, k))
    if k == 0:
        return out
    block = max(1, 200_000 // k)  # bounds the temporary row copies on huge pools
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        idx = index[lo:hi]
        safe = np.where(idx >= 0, idx, 0)
        rows = np.repeat(np.arange(lo, hi), k)
        sims = np.asarray(features[rows].multiply(features[safe.ravel()]).sum(axis=1)).ravel()
        out[lo:hi] = np.where(idx >= 0, sims.reshape(hi - lo, k), 0.0)
    return out


def synthetic_graph(n: int, n_envs: int, *, k_within: int = 6, k_cross: int = 12, env_vocab: int = 40,
                    patterns: int = 200, tokens_per_task: int = 6, seed: int = 0,
                    prefix: str = "t") -> DualRelationGraph:
    """A random structured graph over ``n`` tasks in ``n_envs`` environments (task ``i`` is in environment
    ``i % n_envs``; ids ``f"{prefix}{i}"``, environments ``f"env{e}"``). ``O(N K)`` time and memory."""
    if n < 2 or n_envs < 1 or n_envs > n:
        raise ValueError(f"need n >= 2 and 1 <= n_envs <= n, got n={n}, n_envs={n_envs}")
    rng = np.random.default_rng(seed)
    codes = (np.arange(n) % n_envs).astype(np.int64)
    # concrete features: tokens of the task's environment vocabulary
    ftok = codes[:, None] * env_vocab + rng.integers(0, env_vocab, size=(n, tokens_per_task))
    full = sp.csr_matrix((np.ones(ftok.size), ftok.ravel(), np.arange(0, ftok.size + 1, tokens_per_task)),
                         shape=(n, n_envs * env_vocab))
    full.sum_duplicates()
    # abstract features: execution-pattern tokens shared across environments (a task mixes 2 pattern groups)
    group = rng.integers(0, max(1, patterns // 10), size=(n, 1))
    atok = (group * 10 + rng.integers(0, 10, size=(n, tokens_per_task))) % patterns
    abstract = sp.csr_matrix((np.ones(atok.size), atok.ravel(), np.arange(0, atok.size + 1, tokens_per_task)),
                             shape=(n, patterns))
    abstract.sum_duplicates()
    full, abstract = _normalise_rows(full), _normalise_rows(abstract)
    per_env = np.bincount(codes, minlength=n_envs)
    # within: random members of the same environment (not self)
    kw = int(min(k_within, per_env.min() - 1))
    if kw > 0:
        slot = np.arange(n) // n_envs  # index of the task inside its environment
        m = per_env[codes][:, None]
        base = rng.integers(0, m - 1, size=(n, 1))
        offs = 1 + (base + np.arange(kw)[None, :]) % (m - 1)  # kw distinct offsets in [1, m)
        other_slot = (slot[:, None] + offs) % m
        wi = other_slot * n_envs + codes[:, None]
    else:
        wi = np.full((n, 0), -1, dtype=np.int64)
    # cross: random tasks of other environments
    if n_envs > 1:
        ci = rng.integers(0, n, size=(n, k_cross))
        same = codes[ci] == codes[:, None]
        ci = np.where(same, (ci + 1) % n, ci)
        ci = np.where(codes[ci] == codes[:, None], -1, ci)
    else:
        ci = np.full((n, 0), -1, dtype=np.int64)
    ws, cs = _row_similarity(full, wi), _row_similarity(abstract, ci)

    def weights(sim: np.ndarray, idx: np.ndarray) -> np.ndarray:
        w = np.where(idx >= 0, np.exp(sim), 0.0)
        tot = w.sum(axis=1, keepdims=True)
        return np.divide(w, tot, out=np.zeros_like(w), where=tot > 0)

    return DualRelationGraph(task_ids=[f"{prefix}{i}" for i in range(n)], envs=[f"env{e}" for e in range(n_envs)],
                             env_codes=codes.astype(np.int32), within_index=wi, within_weight=weights(ws, wi),
                             within_similarity=ws, cross_index=ci, cross_weight=weights(cs, ci), cross_similarity=cs,
                             full_features=full, abstract_features=abstract,
                             config={"synthetic": True, "n_envs": n_envs, "seed": seed})


def synthetic_tasks(graph: DualRelationGraph) -> list[dict]:
    """Minimal task specs (``id``, ``env``) matching a synthetic graph's nodes."""
    return [{"id": t, "env": graph.envs[int(c)]} for t, c in zip(graph.task_ids, graph.env_codes, strict=True)]
