"""Stage 3 of EnvSched: turning predictions into a batch (2.4, C).

A batch of ``n`` pairs is built pick by pick, in phases:

**cold start** (no scored history yet; no pilot rollouts): one representative per environment -- the
task most similar to its environment's other tasks (highest mean within-environment neighbour
similarity), environments least selected first -- then the remaining slots by novelty: a mix of global
novelty (``1 -`` largest similarity to any picked task, ``S_full`` within an environment and ``S_abs``
across) and within-environment novelty (``1 -`` largest ``S_full`` to picked tasks of the same
environment), at most ``cold_start_max_per_env`` (2) tasks per environment.

**coverage** (``coverage_slots`` of ``batch_size``, 32 of 64): candidates are ordered by lower
current-step coverage of their environment (tasks of it already in this batch), then fewer cumulative
selections of the environment, then fewer observations of the task, and finally by informativeness with
the batch-similarity penalty. Caps: ``max_per_env_coverage`` (``C1`` = 4) tasks of one environment in
the coverage phase, ``env_quota_per_batch`` (``C3`` = 11) in the batch, and no task selected in more than
``max_consecutive_selections`` (``C_task`` = 2) consecutive batches. The progress filter does not apply.

**exploitation** (the rest): candidates by informativeness times exposure discount
``(1 + exposure) ** -exposure_power``, times the similarity penalty ``1 - lambda * max_sim``, under the
environment quota and the consecutive cap; tasks the progress filter or the identifier filter flags are
not candidates.

**fill**: only if the phases above cannot fill ``n`` (a tiny pool, or caps that bind everywhere): the
remaining slots go to the best remaining tasks by penalised informativeness, ignoring caps and filters;
each such pick says which caps it relaxed.

The penalised argmax is exact and lazy: candidates are walked in order of their unpenalised score (a
penalty only lowers a score), similarities are computed in small blocks against the batch so far
(:class:`BatchSimilarity`, the same definition as :meth:`DualRelationGraph.pair_similarity`), and the walk
stops as soon as no remaining candidate can beat the best penalised one. One batch costs ``O(N B)`` numpy
work plus ``O(N log N)`` for the orderings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from envsched.method.config import SchedulerConfig
from envsched.method.graph import DualRelationGraph
from envsched.method.history import History
from envsched.method.prediction import Prediction

__all__ = ["BatchSimilarity", "Pick", "SchedulingContext", "SimilarityIndex", "build_batch", "representative_scores"]


class SimilarityIndex:
    """Static structures for fast batch-similarity updates (built once per sampler).

    The similarity of two tasks is ``S_full`` when they share an environment and ``S_abs`` otherwise, exactly
    as :meth:`DualRelationGraph.pair_similarity`. Rows of each environment are stored contiguously so the
    ``S_full`` of a task to its environment is one sparse mat-vec over that environment's rows.
    """

    def __init__(self, graph: DualRelationGraph) -> None:
        codes = np.asarray(graph.env_codes, dtype=np.int64)
        self.env = codes
        num_envs = int(codes.max()) + 1 if codes.size else 0
        self.order = np.argsort(codes, kind="stable")
        self.starts = np.searchsorted(codes[self.order], np.arange(num_envs + 1))
        self.full = graph.full_features.tocsr()
        self.abstract = graph.abstract_features.tocsr()
        by_env = self.full[self.order]
        self._fe_indptr, self._fe_indices, self._fe_data = by_env.indptr, by_env.indices, by_env.data
        self.n = graph.num_nodes

    @staticmethod
    def _dense_row(m: sp.csr_matrix, i: int) -> np.ndarray:
        x = np.zeros(m.shape[1])
        lo, hi = m.indptr[i], m.indptr[i + 1]
        x[m.indices[lo:hi]] = m.data[lo:hi]
        return x

    def to_all(self, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Similarity of task ``s`` to every task ``(N,)``, plus its environment's rows and their ``S_full``."""
        e = int(self.env[s])
        lo, hi = self.starts[e], self.starts[e + 1]
        rows = self.order[lo:hi]
        x = self._dense_row(self.full, s)
        a, z = self._fe_indptr[lo], self._fe_indptr[hi]
        csum = np.concatenate(([0.0], np.cumsum(self._fe_data[a:z] * x[self._fe_indices[a:z]])))
        ptr = self._fe_indptr[lo:hi + 1] - a
        within = csum[ptr[1:]] - csum[ptr[:-1]]
        sims = self.abstract @ self._dense_row(self.abstract, s)
        sims[rows] = within
        return sims, rows, within


class BatchSimilarity:
    """Largest similarity of every task to the tasks already in the batch, updated eagerly per pick.

    ``max_sim[c]`` is ``max over batch members m of pair_similarity(c, m)``; ``max_within[c]`` the same over
    members of ``c``'s environment under ``S_full`` (cold start's within-environment novelty). One pick costs
    a mat-vec over the abstract features and one over its environment's concrete rows.
    """

    def __init__(self, index: SimilarityIndex) -> None:
        self.index = index
        self.members: list[int] = []
        self.max_sim = np.zeros(index.n)
        self.max_within = np.zeros(index.n)

    def add(self, pos: int) -> None:
        self.members.append(int(pos))
        sims, rows, within = self.index.to_all(int(pos))
        np.maximum(self.max_sim, sims, out=self.max_sim)
        self.max_within[rows] = np.maximum(self.max_within[rows], within)


@dataclass
class Pick:
    """One selected task and why (the scheduling half of an explanation record)."""

    pos: int
    phase: str
    rank: int
    score: float
    base_score: float
    max_similarity: float
    exposure: float = 0.0
    exposure_discount: float = 1.0
    novelty: float | None = None
    env_batch_count: int = 0
    env_coverage_count: int = 0
    env_selections_before: int = 0
    task_observations_before: int = 0
    relaxed: list[str] = field(default_factory=list)
    tied_envs: int = 0


@dataclass
class SchedulingContext:
    """Everything one batch is built from."""

    graph: DualRelationGraph
    history: History
    prediction: Prediction | None
    config: SchedulerConfig
    env_codes: np.ndarray
    num_envs: int
    tiebreak: np.ndarray  # (N,) fresh uniform draws for this batch: breaks exact ties
    env_tiebreak: np.ndarray  # (E,)
    identifier_flagged: np.ndarray  # (N,) bool
    centrality: np.ndarray  # (N,) representative scores for cold start
    similarity: SimilarityIndex  # static similarity structures of the graph


def representative_scores(graph: DualRelationGraph) -> np.ndarray:
    """Mean similarity of each task to its within-environment neighbours (cold start representatives)."""
    valid = graph.within_index >= 0
    cnt = valid.sum(axis=1)
    tot = np.where(valid, graph.within_similarity, 0.0).sum(axis=1)
    return np.divide(tot, cnt, out=np.zeros(graph.num_nodes), where=cnt > 0)


def _best(cands: np.ndarray, base: np.ndarray, b: _Batch) -> tuple[int, float, float] | None:
    """Argmax of ``base * (1 - lambda * max_sim)`` over ``cands``; exact ties go to the higher tiebreak draw.
    Returns ``(pos, penalised score, max_sim)``."""
    if cands.size == 0:
        return None
    ms = b.sim.max_sim[cands]
    adj = base[cands] * (1.0 - b.ctx.config.similarity_penalty * ms)
    top = adj.max()
    tied = np.flatnonzero(adj == top)
    j = tied[int(np.argmax(b.ctx.tiebreak[cands[tied]]))] if tied.size > 1 else int(tied[0])
    return int(cands[j]), float(adj[j]), float(ms[j])


class _Batch:
    """Mutable state of the batch being built."""

    def __init__(self, ctx: SchedulingContext, n: int) -> None:
        self.ctx = ctx
        self.n = n
        n = ctx.env_codes.size
        self.in_batch = np.zeros(n, dtype=bool)
        self.env_batch = np.zeros(ctx.num_envs, dtype=np.int64)
        self.env_cov = np.zeros(ctx.num_envs, dtype=np.int64)
        self.picks: list[Pick] = []
        self.sim = BatchSimilarity(ctx.similarity)
        self.blocked = ctx.history.consecutive_blocked()
        self.env_cum = ctx.history.env_selection_counts()
        self.task_obs = ctx.history.task_observation_counts()

    def add(self, pick: Pick) -> None:
        e = int(self.ctx.env_codes[pick.pos])
        self.in_batch[pick.pos] = True
        self.env_batch[e] += 1
        if pick.phase == "coverage":
            self.env_cov[e] += 1
        pick.rank = len(self.picks) + 1
        pick.env_batch_count = int(self.env_batch[e])
        pick.env_coverage_count = int(self.env_cov[e])
        pick.env_selections_before = int(self.env_cum[e])
        pick.task_observations_before = int(self.task_obs[pick.pos])
        self.picks.append(pick)
        if len(self.picks) < self.n:  # the last pick penalises nobody
            self.sim.add(pick.pos)


def _cold_start(b: _Batch, n: int) -> None:
    ctx, cfg = b.ctx, b.ctx.config
    env = ctx.env_codes
    E = ctx.num_envs
    base_ok = ~b.blocked
    cap = cfg.cold_start_max_per_env
    relaxed: list[str] = []
    # 1) one representative per environment, least-selected environments first
    env_order = np.lexsort((-ctx.env_tiebreak, b.env_cum))
    rep_order = np.lexsort((-ctx.tiebreak, -ctx.centrality, b.task_obs))  # fewest observations, most central
    first_of_env = np.full(E, -1, dtype=np.int64)
    ok_sorted = rep_order[base_ok[rep_order]]
    if ok_sorted.size < n:  # consecutive cap would starve the batch: relax it
        ok_sorted = rep_order
        relaxed.append("max_consecutive_selections")
    envs_sorted = env[ok_sorted]
    uniq, idx = np.unique(envs_sorted, return_index=True)
    first_of_env[uniq] = ok_sorted[idx]
    for e in env_order:
        if len(b.picks) >= n:
            break
        p = int(first_of_env[e])
        if p < 0:
            continue
        b.add(Pick(pos=p, phase="cold_start", rank=0, score=float(ctx.centrality[p]),
                   base_score=float(ctx.centrality[p]), max_similarity=0.0, relaxed=list(relaxed)))
    if len(b.picks) >= n:
        return
    # 2) fill by global and within-environment novelty, at most `cap` per environment
    w = cfg.cold_start_within_novelty_weight
    allow_blocked = "max_consecutive_selections" in relaxed
    while len(b.picks) < n:
        elig = ~b.in_batch & (b.env_batch[env] < cap)
        if not allow_blocked:
            elig &= ~b.blocked
        if not elig.any():
            if not allow_blocked and (~b.in_batch & (b.env_batch[env] < cap)).any():
                allow_blocked = True
                relaxed.append("max_consecutive_selections")
            else:
                cap += 1
                relaxed.append(f"cold_start_max_per_env->{cap}")
            continue
        cand = np.flatnonzero(elig)
        fewest = b.task_obs[cand].min()
        cand = cand[b.task_obs[cand] == fewest]
        novelty = (1.0 - w) * (1.0 - b.sim.max_sim[cand]) + w * (1.0 - b.sim.max_within[cand])
        top = novelty.max()
        tied = cand[novelty == top]
        best = int(tied[int(np.argmax(ctx.tiebreak[tied]))])
        b.add(Pick(pos=best, phase="cold_start", rank=0, score=float(top), base_score=float(top),
                   max_similarity=float(b.sim.max_sim[best]), novelty=float(top), relaxed=list(relaxed)))


def _coverage(b: _Batch, n_slots: int, info: np.ndarray) -> None:
    ctx, cfg = b.ctx, b.ctx.config
    env = ctx.env_codes
    target = len(b.picks) + n_slots
    while len(b.picks) < target:
        ok = ~b.in_batch & ~b.blocked
        env_avail = np.bincount(env[ok], minlength=ctx.num_envs) > 0
        env_ok = env_avail & (b.env_cov < cfg.max_per_env_coverage) & (b.env_batch < cfg.env_quota_per_batch)
        if not env_ok.any():
            return
        e_idx = np.flatnonzero(env_ok)
        lvl = b.env_batch[e_idx]  # lower current-step coverage first
        e_idx = e_idx[lvl == lvl.min()]
        cum = b.env_cum[e_idx]  # then fewer cumulative selections of the environment
        e_idx = e_idx[cum == cum.min()]
        env_sel = np.zeros(ctx.num_envs, dtype=bool)
        env_sel[e_idx] = True
        cands = np.flatnonzero(ok & env_sel[env])
        obs = b.task_obs[cands]  # then fewer observations of the task
        cands = cands[obs == obs.min()]
        p, score, ms = _best(cands, info, b)  # then penalised informativeness
        b.add(Pick(pos=p, phase="coverage", rank=0, score=score, base_score=float(info[p]), max_similarity=ms,
                   tied_envs=int(e_idx.size)))


def _exploitation(b: _Batch, n_slots: int, base: np.ndarray, exposure: np.ndarray, discount: np.ndarray) -> None:
    ctx, cfg = b.ctx, b.ctx.config
    env = ctx.env_codes
    excluded = b.blocked.copy()
    if cfg.use_progress_filter:
        excluded |= ctx.history.progress_filtered()
    if cfg.use_identifier_filter:
        excluded |= ctx.identifier_flagged
    target = len(b.picks) + n_slots
    while len(b.picks) < target:
        ok = ~b.in_batch & ~excluded & (b.env_batch[env] < cfg.env_quota_per_batch)
        best = _best(np.flatnonzero(ok), base, b)
        if best is None:
            return
        p, score, ms = best
        b.add(Pick(pos=p, phase="exploitation", rank=0, score=score, base_score=float(base[p]), max_similarity=ms,
                   exposure=float(exposure[p]), exposure_discount=float(discount[p])))


def _fill(b: _Batch, n: int, info: np.ndarray) -> None:
    ctx, cfg = b.ctx, b.ctx.config
    filtered = ctx.history.progress_filtered()
    while len(b.picks) < n:
        best = _best(np.flatnonzero(~b.in_batch), info, b)
        if best is None:
            return
        p, score, ms = best
        e = int(ctx.env_codes[p])
        relaxed = []
        if b.blocked[p]:
            relaxed.append("max_consecutive_selections")
        if b.env_batch[e] >= cfg.env_quota_per_batch:
            relaxed.append("env_quota_per_batch")
        if cfg.use_progress_filter and filtered[p]:
            relaxed.append("progress_filter")
        if cfg.use_identifier_filter and ctx.identifier_flagged[p]:
            relaxed.append("identifier_filter")
        b.add(Pick(pos=p, phase="fill", rank=0, score=score, base_score=float(info[p]), max_similarity=ms,
                   relaxed=relaxed))


def build_batch(ctx: SchedulingContext, n: int) -> list[Pick]:
    """Select ``n`` distinct tasks (``n`` <= N). Deterministic given the context (tiebreaks included)."""
    b = _Batch(ctx, n)
    cfg = ctx.config
    if ctx.prediction is None:
        _cold_start(b, n)
        return b.picks
    info = ctx.prediction.informativeness
    n_cov = cfg.coverage_share(n)
    if n_cov:
        _coverage(b, n_cov, info)
    n_exp = n - len(b.picks)
    if n_exp and cfg.mode != "coverage_only":
        exposure = ctx.history.exposure(cfg.long_half_life)
        discount = np.power(1.0 + exposure, -cfg.exposure_power)
        _exploitation(b, n_exp, info * discount, exposure, discount)
    if len(b.picks) < n:
        # exploitation ran out of candidates (filters, quotas): the rest goes to the coverage rules
        _coverage(b, n - len(b.picks), info)
    if len(b.picks) < n:
        _fill(b, n, info)
    return b.picks
