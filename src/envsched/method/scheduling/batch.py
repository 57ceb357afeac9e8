"""Stage 3 of EnvSched: turning predictions into a batch (2.4, C).

A batch of ``n`` pairs is built pick by pick, in phases:

**cold start** (no scored history yet; no pilot rollouts): one representative per environment -- the
task most similar to its environment's other tasks (highest mean within-environment neighbour
similarity), environments least selected first -- then the remaining slots by novelty: a mix of global
novelty (``1 -`` largest similarity to any picked task, ``S_full`` within an environment and ``S_abs``
across) and within-environment novelty (``1 -`` largest ``S_full`` to picked tasks of the same
environment), at most ``cold_start_max_per_env`` (2) tasks per environment.

**coverage** (``round(coverage_share * n)`` slots, 32 of 64): candidates are ordered by lower
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

**Adaptive mode** (ours; :class:`AdaptiveInputs`, computed by the sampler from
:mod:`envsched.method.history.signal`): the coverage slots come from the adaptive share; coverage orders
environments by lower current-step coverage, then never-selected first, then an upper confidence bound on the
environment's signal rate weighted by its size, and picks the task with the highest optimistic signal
probability; exploitation ranks by the probability that a group has signal; the consecutive cap and the
exposure discount apply only to tasks whose signal declines. Caps ``C1`` / ``C3`` are stated for
``batch_size`` and scaled by ``n / batch_size`` (:meth:`SchedulerConfig.caps_for`), in both modes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from envsched.method.config import SchedulerConfig
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.history.prediction import Prediction
from envsched.method.history.statistics import History

__all__ = ["AdaptiveInputs", "BatchSimilarity", "Pick", "SchedulingContext", "SimilarityIndex", "build_batch",
           "representative_scores"]


class SimilarityIndex:
    """Static structures for fast batch-similarity updates (built once per sampler).

    The similarity of two tasks is ``S_full`` when they share an environment and ``S_abs`` otherwise, exactly
    as :meth:`DualRelationGraph.pair_similarity`. Rows of each environment are stored contiguously so the
    ``S_full`` of a task to its environment is one sparse mat-vec over that environment's rows.
    """

    def __init__(self, graph: DualRelationGraph, env_codes: np.ndarray | None = None) -> None:
        # ``env_codes``: the sampler's numbering of the same environment partition (default: the graph's)
        codes = np.asarray(graph.env_codes if env_codes is None else env_codes, dtype=np.int64)
        self.env = codes
        num_envs = int(codes.max()) + 1 if codes.size else 0
        self.order = np.argsort(codes, kind="stable")
        self.starts = np.searchsorted(codes[self.order], np.arange(num_envs + 1))
        self.full = graph.full_features.tocsr()
        self.abstract = graph.abstract_features.tocsr()
        self._dense_abs: np.ndarray | None = None
        if graph.num_nodes <= self.dense_abstract_max_nodes:  # small pools: all S_abs rows at once
            self._dense_abs = (self.abstract @ self.abstract.T).toarray().astype(np.float32)
        abstract_csc = self.abstract.tocsc()  # column access: the tasks sharing an abstract feature
        self._ac_indptr, self._ac_indices, self._ac_data = (abstract_csc.indptr, abstract_csc.indices,
                                                            abstract_csc.data)
        by_env = self.full[self.order]
        self._fe_indptr, self._fe_indices, self._fe_data = by_env.indptr, by_env.indices, by_env.data
        self.n = graph.num_nodes
        self._slot = np.empty(self.n, dtype=np.int64)  # position of a task inside its environment block
        self._slot[self.order] = np.arange(self.n) - self.starts[codes[self.order]]
        self._blocks: dict[int, np.ndarray] = {}
        self._cached = 0

    @staticmethod
    def _dense_row(m: sp.csr_matrix, i: int) -> np.ndarray:
        x = np.zeros(m.shape[1])
        lo, hi = m.indptr[i], m.indptr[i + 1]
        x[m.indices[lo:hi]] = m.data[lo:hi]
        return x

    #: Dense per-environment ``S_full`` blocks are cached up to this many entries in all (64 MiB).
    block_cache_entries: int = 8_000_000
    #: Pools up to this size keep ``S_abs`` as a dense float32 matrix (at most 36 MB).
    dense_abstract_max_nodes: int = 3_000

    def within(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """``S_full`` of task ``s`` to every task of its environment: ``(rows, similarities)``."""
        e = int(self.env[s])
        lo, hi = self.starts[e], self.starts[e + 1]
        block = self._blocks.get(e)
        if block is None and (hi - lo) ** 2 + self._cached <= self.block_cache_entries:
            sub = self.full[self.order[lo:hi]]
            block = (sub @ sub.T).toarray()
            self._blocks[e] = block
            self._cached += block.size
        if block is not None:
            return self.order[lo:hi], block[self._slot[s]]
        x = self._dense_row(self.full, s)
        a, z = self._fe_indptr[lo], self._fe_indptr[hi]
        csum = np.concatenate(([0.0], np.cumsum(self._fe_data[a:z] * x[self._fe_indices[a:z]])))
        ptr = self._fe_indptr[lo:hi + 1] - a
        return self.order[lo:hi], csum[ptr[1:]] - csum[ptr[:-1]]

    def cross(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """``S_abs`` of task ``s`` to every task of *other* environments that shares an abstract feature with
        it (the others have similarity 0): ``(rows, similarities)``. Cost: the sum of the document
        frequencies of ``s``'s abstract features, not ``N``."""
        if self._dense_abs is not None:
            sims = self._dense_abs[s]
            rows = np.flatnonzero((sims != 0) & (self.env != self.env[s]))
            return rows, sims[rows].astype(np.float64)
        m = self.abstract
        cols = m.indices[m.indptr[s]:m.indptr[s + 1]]
        vals = m.data[m.indptr[s]:m.indptr[s + 1]]
        starts, ends = self._ac_indptr[cols], self._ac_indptr[cols + 1]
        lengths = ends - starts
        total = int(lengths.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        if total * 8 > m.nnz:  # common features: one mat-vec over all rows is cheaper than the gather
            sims = m @ self._dense_row(m, s)
            rows = np.flatnonzero((sims != 0) & (self.env != self.env[s]))
            return rows, sims[rows]
        offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        flat = offsets + np.arange(total)
        rows = self._ac_indices[flat]
        contrib = self._ac_data[flat] * np.repeat(vals, lengths)
        if total * 16 < self.n:  # few rows: sort them
            uniq, inv = np.unique(rows, return_inverse=True)
            sims = np.bincount(inv, weights=contrib, minlength=uniq.size)
        else:  # many rows: one scatter over N beats the sort
            dense = np.bincount(rows, weights=contrib, minlength=self.n)
            uniq = np.flatnonzero(dense)
            sims = dense[uniq]
        other = self.env[uniq] != self.env[s]
        return uniq[other].astype(np.int64), sims[other]

    def to_all(self, s: int) -> np.ndarray:
        """Similarity of task ``s`` to every task ``(N,)`` (dense; for tests and small pools)."""
        out = np.zeros(self.n)
        rows, sims = self.cross(s)
        out[rows] = sims
        rows, sims = self.within(s)
        out[rows] = sims
        return out


class BatchSimilarity:
    """Largest similarity of every task to the tasks already in the batch, updated eagerly per pick.

    ``max_sim[c]`` is ``max over batch members m of pair_similarity(c, m)``; ``max_within[c]`` the same over
    members of ``c``'s environment under ``S_full`` (cold start's within-environment novelty). One pick costs
    a gather over the tasks sharing its abstract features and a mat-vec over its environment's concrete rows.
    """

    def __init__(self, index: SimilarityIndex) -> None:
        self.index = index
        self.members: list[int] = []
        self.max_sim = np.zeros(index.n)
        self.max_within = np.zeros(index.n)

    def add(self, pos: int) -> None:
        self.members.append(int(pos))
        rows, sims = self.index.cross(int(pos))
        self.max_sim[rows] = np.maximum(self.max_sim[rows], sims)
        rows, sims = self.index.within(int(pos))
        self.max_sim[rows] = np.maximum(self.max_sim[rows], sims)
        self.max_within[rows] = np.maximum(self.max_within[rows], sims)


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
class AdaptiveInputs:
    """What the adaptive rules add to a batch (``None`` fields: the paper's rule for that part).

    Attributes:
        coverage_slots: coverage slots of this batch (the adaptive share), else ``round(coverage_share * n)``.
        env_priority: ``(E,)`` coverage order of environments after the current-step coverage level
            (``inf`` for never-selected ones); replaces "fewer cumulative selections".
        coverage_score: ``(N,)`` task score inside the chosen environment; replaces "fewer observations, then
            informativeness".
        exploitation_score: ``(N,)`` replaces informativeness in exploitation and fill.
        caps_active: ``(N,)`` bool, where the consecutive cap and the exposure discount apply.
    """

    coverage_slots: int | None = None
    env_priority: np.ndarray | None = None
    coverage_score: np.ndarray | None = None
    exploitation_score: np.ndarray | None = None
    caps_active: np.ndarray | None = None


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
    adaptive: AdaptiveInputs | None = None  # the adaptive mode's inputs (None: the paper's rules)


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
        self.c1, self.c3 = ctx.config.caps_for(self.n)
        self.blocked = ctx.history.consecutive_blocked()
        ad = ctx.adaptive
        if ad is not None and ad.caps_active is not None:
            self.blocked &= ad.caps_active
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
    ctx = b.ctx
    env = ctx.env_codes
    target = len(b.picks) + n_slots
    ok = ~b.in_batch & ~b.blocked  # maintained per pick below
    avail = np.bincount(env[ok], minlength=ctx.num_envs)
    env_sel = np.zeros(ctx.num_envs, dtype=bool)
    ad = ctx.adaptive
    env_priority = ad.env_priority if ad is not None else None
    task_score = ad.coverage_score if ad is not None and ad.coverage_score is not None else None
    while len(b.picks) < target:
        env_ok = (avail > 0) & (b.env_cov < b.c1) & (b.env_batch < b.c3)
        if not env_ok.any():
            return
        e_idx = np.flatnonzero(env_ok)
        lvl = b.env_batch[e_idx]  # lower current-step coverage first
        e_idx = e_idx[lvl == lvl.min()]
        if env_priority is None:
            cum = b.env_cum[e_idx]  # then fewer cumulative selections of the environment
            e_idx = e_idx[cum == cum.min()]
        else:  # adaptive: never-selected first, then the size-weighted upper bound on the signal rate
            pr = env_priority[e_idx]
            e_idx = e_idx[pr == pr.max()]
        idx = ctx.similarity
        sizes = idx.starts[e_idx + 1] - idx.starts[e_idx]
        total = int(sizes.sum())
        if total * 4 < env.size:  # few tied environments: gather their members
            offs = np.repeat(idx.starts[e_idx] - np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes)
            members = idx.order[offs + np.arange(total)]
            cands = members[ok[members]]
        else:
            env_sel[:] = False
            env_sel[e_idx] = True
            cands = np.flatnonzero(ok & env_sel[env])
        if task_score is None:
            obs = b.task_obs[cands]  # then fewer observations of the task
            cands = cands[obs == obs.min()]
            p, score, ms = _best(cands, info, b)  # then penalised informativeness
            base = float(info[p])
        else:  # adaptive: penalised optimistic signal probability
            p, score, ms = _best(cands, task_score, b)
            base = float(task_score[p])
        b.add(Pick(pos=p, phase="coverage", rank=0, score=score, base_score=base, max_similarity=ms,
                   tied_envs=int(e_idx.size)))
        ok[p] = False
        avail[env[p]] -= 1


#: Exploitation evaluates a shortlist of the ``factor * slots + extra`` best unpenalised candidates first;
#: a pick from it is provably the exact argmax (penalties only lower scores), else the full pool is scanned.
SHORTLIST_FACTOR, SHORTLIST_EXTRA = 8, 256


def _exploitation(b: _Batch, n_slots: int, base: np.ndarray, exposure: np.ndarray, discount: np.ndarray) -> None:
    ctx, cfg = b.ctx, b.ctx.config
    env = ctx.env_codes
    excluded = b.blocked | b.in_batch
    if cfg.use_progress_filter:
        excluded |= ctx.history.progress_filtered()
    if cfg.use_identifier_filter:
        excluded |= ctx.identifier_flagged
    pool = np.flatnonzero(~excluded)
    m = min(pool.size, SHORTLIST_FACTOR * n_slots + SHORTLIST_EXTRA)
    if m < pool.size:
        part = np.argpartition(-base[pool], m - 1)
        top, rest = pool[part[:m]], pool[part[m:]]
        rest_max = float(base[rest].max())
    else:
        top, rest_max = pool, -np.inf
    target = len(b.picks) + n_slots
    while len(b.picks) < target:
        v = top[~b.in_batch[top] & (b.env_batch[env[top]] < b.c3)]
        best = _best(v, base, b)
        if best is None or not best[1] > rest_max:  # not provably the best of the pool: scan it all
            ok = ~b.in_batch & ~excluded & (b.env_batch[env] < b.c3)
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
        if b.env_batch[e] >= b.c3:
            relaxed.append("env_quota_per_batch")
        if cfg.mode == "coverage_only" and b.env_cov[e] >= b.c1:
            relaxed.append("max_per_env_coverage")
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
    ad = ctx.adaptive
    n_cov = ad.coverage_slots if ad is not None and ad.coverage_slots is not None else cfg.coverage_slots_for(n)
    if n_cov:
        _coverage(b, n_cov, info)
    n_exp = n - len(b.picks)
    score = ad.exploitation_score if ad is not None and ad.exploitation_score is not None else info
    if n_exp and cfg.mode != "coverage_only":
        exposure = ctx.history.exposure(cfg.long_half_life)
        discount = np.power(1.0 + exposure, -cfg.exposure_power)
        if ad is not None and ad.caps_active is not None:
            discount = np.where(ad.caps_active, discount, 1.0)
        _exploitation(b, n_exp, score * discount, exposure, discount)
    if len(b.picks) < n:
        # exploitation ran out of candidates (filters, quotas): the rest goes to the coverage rules
        _coverage(b, n - len(b.picks), info)
    if len(b.picks) < n:
        _fill(b, n, score)
    return b.picks
