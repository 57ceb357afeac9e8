# Over 700 lines: every phase of a batch (cold start, coverage, exploitation, fill) works on one _Batch state.
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

**Cost.** Every phase's choice is "the fewest observations first (where the rule says so), then the
highest penalised score, exact ties to the higher tiebreak draw", and a penalty only lowers a score. So each
phase keeps a shortlist of its candidates ordered by an upper bound on their penalised score
(:class:`_Ranked`: one ``O(N)`` selection, then a sort of the shortlist), walks it computing the exact score
only where the bound -- the score with the similarities known so far -- can still win, and certifies the
pick against the best bound outside the shortlist (else the shortlist doubles). Within-environment
similarity (``S_full``) is updated per pick over the pick's environment; cross-environment similarity
(``S_abs``) is computed only for the candidates a walk reaches, each (candidate, member) pair once
(:class:`BatchSimilarity`), with the same arithmetic as the eager per-pick update it replaces; when a walk
needs more than ``N / BatchSimilarity.eager_fraction`` candidates brought up to date, the pending members'
whole rows are applied instead (the eager update, ``O(N)`` per member). Coverage picks its environment
from the environments not yet in the batch, ordered once per batch, and rescans only the (at most ``n``)
environments already in it. On pools small enough that every member's whole row is applied at its pick
(:attr:`BatchSimilarity.eager`, up to about 260,000 tasks), every similarity is known at a pick, and a phase's
shortlist is a heap of plain floats instead (lazy greedy: only the candidates that reach its top are scored again,
each with the same three operations as the whole-array score). When scores separate (the paper preset; most
steps) a batch costs ``O(N)`` numpy work plus ``O(K B)`` similarity pairs for shortlists of ``K``; when almost
every candidate scores the same (the adaptive scores of a pool that is mostly unobserved), the exact argmax
needs every candidate's similarity and a pick costs one whole row, as before. The choices are exactly those of the
plain ``O(N B)`` rules (``tests/method/scheduling/test_batch_reference.py`` compares both).

**Policies.** After cold start, what the rules above rank by comes from the preset's scheduling policy
(:mod:`envsched.method.scheduling.policy`) as one complete :class:`~envsched.method.scheduling.policy.BatchInputs`:
the coverage slots, the environment order after the coverage level ("fewer cumulative selections" above), the
coverage task score and whether fewest observations come first ("then informativeness" above), the exploitation
score ("informativeness" above), and where the consecutive cap and the exposure discount apply. The paper's
policy supplies the values described above; the default's (ours) the online share, the UCB environment order,
the optimistic signal probability, the group-signal probability and the caps on declining tasks only. The
builder applies the same rules to either. Caps ``C1`` / ``C3`` are stated for ``batch_size`` and scaled by
``n / batch_size`` (:meth:`SchedulerConfig.caps_for`), in both presets.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from envsched.method.config import SchedulerConfig
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.history.prediction import Prediction
from envsched.method.history.statistics import History
from envsched.method.scheduling.policy import BatchInputs, LazyScores

__all__ = ["BatchSimilarity", "Pick", "SchedulingContext", "SimilarityIndex", "build_batch",
           "representative_scores"]


class SimilarityIndex:
    """Static structures for batch similarity (built once per sampler).

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
            # 0 for the pairs in one environment (those use S_full), as cross and max_row_into write them
            self._dense_abs[codes[:, None] == codes[None, :]] = 0.0
        # document frequency of each abstract feature: which summation order a pick's S_abs row uses, decided once
        # per task (candidate_order): the sum of its features' frequencies against the matrix's entries
        self._abs_df = np.bincount(self.abstract.indices, minlength=self.abstract.shape[1])
        a = self.abstract
        df_sum = np.concatenate(([0], np.cumsum(self._abs_df[a.indices], dtype=np.int64)))
        self._candidate_order = (df_sum[a.indptr[1:]] - df_sum[a.indptr[:-1]]) * 8 > a.nnz
        self._ac_indptr: np.ndarray | None = None  # column access (built on first use): who shares a feature
        self._ac_indices = self._ac_data = np.zeros(0)
        by_env = self.full[self.order]
        self._fe_indptr, self._fe_indices, self._fe_data = by_env.indptr, by_env.indices, by_env.data
        self.n = graph.num_nodes
        self._slot = np.empty(self.n, dtype=np.int64)  # position of a task inside its environment block
        self._slot[self.order] = np.arange(self.n) - self.starts[codes[self.order]]
        self._blocks: dict[int, np.ndarray] = {}
        self._cached = 0
        self._requests: dict[int, int] = {}  # rows asked of an environment with no block yet
        # when every environment's block fits in the cache together, the block of an environment with few feature
        # entries (early_block_entries) is computed on its first request: it costs about what one row does (the
        # rows it replaces are its rows bit for bit, and no environment is ever left without one)
        sizes = np.diff(self.starts)
        self._every_block_fits = int((sizes * sizes).sum()) <= self.block_cache_entries
        # the feature rows of those environments (_environment_rows), kept for their next rows up to
        # pending_rows_entries stored entries in all
        self._pending_rows: dict[int, tuple[sp.csr_matrix, sp.csr_matrix]] = {}
        self._pending_entries = 0

    @staticmethod
    def _dense_row(m: sp.csr_matrix, i: int) -> np.ndarray:
        x = np.zeros(m.shape[1])
        lo, hi = m.indptr[i], m.indptr[i + 1]
        x[m.indices[lo:hi]] = m.data[lo:hi]
        return x

    #: Dense per-environment ``S_full`` blocks are cached up to this many entries in all (64 MiB).
    block_cache_entries: int = 8_000_000
    #: An environment's first rows are computed one at a time (a sparse row times its transposed rows); its whole
    #: block, which costs about as much as that many rows of a large environment, from the request after these.
    rows_before_block: int = 8
    #: The feature rows of environments with rows asked but no block yet are kept (for their next rows) up to this
    #: many stored entries in all (about 48 MiB).
    pending_rows_entries: int = 4_000_000
    #: An environment whose feature rows hold at most this many entries has its block computed on its first request
    #: (where every block fits in the cache).
    early_block_entries: int = 4_096
    #: Pools up to this size keep ``S_abs`` as a dense float32 matrix (at most 36 MB).
    dense_abstract_max_nodes: int = 3_000

    def members(self, envs: np.ndarray) -> np.ndarray:
        """Every task of the environments ``envs``, environment by environment (ascending positions in each)."""
        envs = np.asarray(envs, dtype=np.int64)
        if envs.size == 1:
            e = int(envs[0])
            return self.order[self.starts[e]:self.starts[e + 1]]
        lo, hi = self.starts[envs], self.starts[envs + 1]
        sizes = hi - lo
        offs = np.repeat(lo - np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes)
        return self.order[offs + np.arange(int(sizes.sum()))]

    def within(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """``S_full`` of task ``s`` to every task of its environment: ``(rows, similarities)``."""
        e = int(self.env[s])
        lo, hi = self.starts[e], self.starts[e + 1]
        block = self._blocks.get(e)
        if block is None and (hi - lo) ** 2 + self._cached <= self.block_cache_entries:
            self._requests[e] = self._requests.get(e, 0) + 1
            pair = self._pending_rows.pop(e, None)
            if pair is not None:
                self._pending_entries -= 2 * pair[0].nnz
            rows, transposed = pair if pair is not None else self._environment_rows(lo, hi)
            early = self._every_block_fits and rows.nnz <= self.early_block_entries
            if self._requests[e] <= self.rows_before_block and not early:
                if self._pending_entries + 2 * rows.nnz <= self.pending_rows_entries:  # kept for its next rows
                    self._pending_rows[e] = (rows, transposed)
                    self._pending_entries += 2 * rows.nnz
                return self.order[lo:hi], (rows[int(self._slot[s])] @ transposed).toarray().ravel()
            block = (rows @ transposed).toarray()
            self._blocks[e] = block
            self._cached += block.size
            del self._requests[e]
        if block is not None:
            return self.order[lo:hi], block[self._slot[s]]
        x = self._dense_row(self.full, s)
        a, z = self._fe_indptr[lo], self._fe_indptr[hi]
        csum = np.concatenate(([0.0], np.cumsum(self._fe_data[a:z] * x[self._fe_indices[a:z]])))
        ptr = self._fe_indptr[lo:hi + 1] - a
        return self.order[lo:hi], csum[ptr[1:]] - csum[ptr[:-1]]

    def _environment_rows(self, lo: int, hi: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
        """The ``S_full`` feature rows of one environment block and their transpose, over the features the
        environment uses (renumbered in order, so each row keeps its entries in their order). ``rows[i] @
        transposed`` is its block's row ``i`` bit for bit: scipy multiplies each row of the left operand on its
        own, adding the products for each column in the order of that row's entries, with or without the
        features no row uses, whose column indices alone the renumbering drops (and with them an index array
        as long as the vocabulary)."""
        a, z = self._fe_indptr[lo], self._fe_indptr[hi]
        features = self._fe_indices[a:z]
        vocabulary = self.full.shape[1]
        if features.size * 8 >= vocabulary:  # many entries: a lookup table over the vocabulary beats sorting them
            present = np.bincount(features, minlength=vocabulary) > 0
            used = np.flatnonzero(present)
            columns = (np.cumsum(present) - 1)[features]
        else:
            used, columns = np.unique(features, return_inverse=True)
        rows = sp.csr_matrix((self._fe_data[a:z], columns.astype(np.int32), self._fe_indptr[lo:hi + 1] - a),
                             shape=(hi - lo, used.size))
        return rows, rows.T.tocsr()

    def candidate_order(self, s: int) -> bool:
        """Which arithmetic the ``S_abs`` row of task ``s`` used in the eager per-pick update this lazy one
        replaced, so that both give the same values bit for bit. ``True`` (``s`` has common features): one
        mat-vec over the pool, products in float64 summed in each candidate's feature order; ``False``: a gather
        over the tasks sharing its features, products in the features' dtype summed (in float64) in ``s``'s
        feature order."""
        return bool(self._candidate_order[s])

    def cross(self, cands: np.ndarray, members: np.ndarray, candidate_order: np.ndarray) -> np.ndarray:
        """``S_abs`` of each candidate to each batch member, ``(len(cands), len(members))``, 0 for pairs in the
        same environment (those use ``S_full``). ``candidate_order``: :meth:`candidate_order` of each member.
        Cost: the (candidate, member, shared feature) triples."""
        if self._dense_abs is not None:
            sims = self._dense_abs[np.ix_(cands, members)].astype(np.float64)
        else:
            m = self.abstract
            cand, feat, val = _entries(m, cands)  # every stored feature of the candidates, in storage order
            sims = np.zeros((cands.size, members.size))
            for j in np.flatnonzero(candidate_order):  # the eager mat-vec: float64 products, candidate order
                x = self._dense_row(m, int(members[j]))
                sims[:, j] = np.bincount(cand, weights=val.astype(np.float64) * x[feat], minlength=cands.size)
            if not candidate_order.all():  # the eager gather: products in the features' dtype, member order
                own = np.flatnonzero(~candidate_order)
                by_feat = np.argsort(feat, kind="stable")
                sorted_feat = feat[by_feat]
                who, mfeat, mval = _entries(m, members[own])
                lo = np.searchsorted(sorted_feat, mfeat, side="left")
                f_n = np.searchsorted(sorted_feat, mfeat, side="right") - lo
                flat = by_feat[np.repeat(lo - np.concatenate(([0], np.cumsum(f_n)[:-1])), f_n)
                               + np.arange(int(f_n.sum()))]
                prod = val[flat] * np.repeat(mval, f_n)
                acc = np.bincount(np.repeat(who, f_n) * cands.size + cand[flat], weights=prod,
                                  minlength=own.size * cands.size)
                sims[:, own] = acc.reshape(own.size, cands.size).T
        sims[self.env[cands][:, None] == self.env[members][None, :]] = 0.0
        return sims

    def max_row_into(self, s: int, out: np.ndarray) -> None:
        """``out = max(out, S_abs(s, .))`` over the tasks of *other* environments (``out`` >= 0): the eager
        update of one member, with the same values as :meth:`cross`. Cost: the sum of the document
        frequencies of ``s``'s features, plus one pass over ``N`` when they are common."""
        if self._dense_abs is not None:  # (its pairs in one environment are 0 already; float32 to float64 exactly)
            np.maximum(out, self._dense_abs[s], out=out)
            return
        e = int(self.env[s])
        same = self.order[self.starts[e]:self.starts[e + 1]]
        m = self.abstract
        if self._ac_indptr is None:
            csc = m.tocsc()
            self._ac_indptr, self._ac_indices, self._ac_data = csc.indptr, csc.indices, csc.data
        cols = m.indices[m.indptr[s]:m.indptr[s + 1]]
        vals = m.data[m.indptr[s]:m.indptr[s + 1]]
        starts, lengths = self._ac_indptr[cols], self._ac_indptr[cols + 1] - self._ac_indptr[cols]
        total = int(lengths.sum())
        if total == 0:
            return
        if total * 8 > m.nnz:  # common features: one mat-vec over all rows is cheaper than the gather
            sims = m @ self._dense_row(m, s)
        else:
            flat = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths) + np.arange(total)
            rows = self._ac_indices[flat]
            contrib = self._ac_data[flat] * np.repeat(vals, lengths)
            if total * 16 < self.n:  # few rows: sort them, touch only them
                uniq, inv = np.unique(rows, return_inverse=True)
                sims = np.bincount(inv, weights=contrib, minlength=uniq.size)
                sims[self.env[uniq] == e] = 0.0
                out[uniq] = np.maximum(out[uniq], sims)
                return
            sims = np.bincount(rows, weights=contrib, minlength=self.n)
        sims[same] = 0.0
        np.maximum(out, sims, out=out)


def _entries(m: sp.csr_matrix, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row, column, value)`` of every stored entry of ``m[rows]``, row by row in storage order (``row``
    numbers the requested rows ``0..len(rows)-1``)."""
    lo, sizes = m.indptr[rows], m.indptr[rows + 1] - m.indptr[rows]
    flat = np.repeat(lo - np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes) + np.arange(int(sizes.sum()))
    return np.repeat(np.arange(rows.size), sizes), m.indices[flat], m.data[flat]


class BatchSimilarity:
    """Largest similarity of tasks to the tasks already in the batch (the members).

    ``max_within[c]``: largest ``S_full`` of ``c`` to members of its environment, updated eagerly per pick
    over the pick's environment (cold start's within-environment novelty). :meth:`max_sim`: largest
    similarity to any member (``S_full`` within the environment, ``S_abs`` across, as
    :meth:`DualRelationGraph.pair_similarity`), computed lazily for the candidates asked about -- each
    (candidate, member) pair at most once per batch -- or, when a call asks about more than
    ``N / eager_fraction`` stale candidates, by applying the pending members' whole rows to every task.
    """

    def __init__(self, index: SimilarityIndex) -> None:
        self.index = index
        self.members: list[int] = []
        self._order: list[bool] = []
        self.max_within = np.zeros(index.n)
        self._cross = np.zeros(index.n)  # largest S_abs to the first _upto[c] members
        self._upto = np.zeros(index.n, dtype=np.int64)
        self._all = 0  # members applied to every task (whole rows)

    def add(self, pos: int) -> None:
        pos = int(pos)
        self.members.append(pos)
        self._order.append(self.index.candidate_order(pos))
        rows, sims = self.index.within(pos)
        self.max_within[rows] = np.maximum(self.max_within[rows], sims)

    @property
    def eager(self) -> bool:
        """Whether :meth:`max_sim` applies a pending member's whole row to every task (a small pool: a row costs
        less than the candidates' pairs); a pick then sees every task's largest similarity up to date."""
        return self.index.n <= self.whole_rows_entries

    def pending(self) -> bool:
        """Whether some member's whole row is not applied to every task yet."""
        return self._all < len(self.members)

    def apply_whole_rows(self) -> None:
        """Bring every task up to date: the whole rows of the members not applied to all tasks yet."""
        if self._all < len(self.members):
            for s in self.members[self._all:]:
                self.index.max_row_into(s, self._cross)
            self._all = len(self.members)

    def partial(self, cands: np.ndarray) -> np.ndarray:
        """A lower bound on :meth:`max_sim` (the members computed so far for each candidate), at no cost."""
        return np.maximum(self.max_within[cands], self._cross[cands])

    def max_sim(self, cands: np.ndarray) -> np.ndarray:
        """Largest similarity of each of ``cands`` to the members so far (0 with no member)."""
        cands = np.asarray(cands, dtype=np.int64)
        nb = len(self.members)
        upto = np.maximum(self._upto[cands], self._all)
        stale = upto < nb
        if stale.any():
            todo, since = cands[stale], upto[stale]
            if (todo.size * self.eager_fraction >= self.index.n  # most of the pool: whole rows are cheaper
                    or (nb - self._all) * self.index.n <= self.whole_rows_entries):  # or a small pool
                self.apply_whole_rows()
            else:
                members, order = np.asarray(self.members, dtype=np.int64), np.asarray(self._order, dtype=bool)
                for first in np.unique(since):
                    grp = todo[since == first]
                    sims = self.index.cross(grp, members[first:], order[first:])
                    self._cross[grp] = np.maximum(self._cross[grp], sims.max(axis=1))
                self._upto[todo] = nb
        return np.maximum(self.max_within[cands], self._cross[cands])

    #: Candidates to bring up to date beyond ``N / eager_fraction`` get every pending member's whole row.
    eager_fraction: int = 256
    #: Pending members' whole rows are applied at once, whatever the candidates, while they are at most this many
    #: entries (members times N): a row over a pool of up to about 100,000 tasks costs less than the per-call
    #: work of the candidates' pairs.
    whole_rows_entries: int = 262_144


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
    inputs: BatchInputs | None = None  # the policy's inputs; needed whenever there is a prediction


def representative_scores(graph: DualRelationGraph) -> np.ndarray:
    """Mean similarity of each task to its within-environment neighbours (cold start representatives)."""
    valid = graph.within_index >= 0
    cnt = valid.sum(axis=1)
    tot = np.where(valid, graph.within_similarity, 0.0).sum(axis=1)
    return np.divide(tot, cnt, out=np.zeros(graph.num_nodes), where=cnt > 0)


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
        if ctx.prediction is not None:  # after cold start the policy says where the caps apply
            self.blocked &= ctx.inputs.caps_active
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

    def penalised(self, base: np.ndarray | LazyScores) -> Penalised:
        """``(exact, bound)`` for the penalised score ``base * (1 - lambda * max_sim)``: ``exact(cands)`` is
        ``(scores, max_sim)``; ``bound(cands)`` an upper bound from the similarities computed so far, free.
        ``base`` is read only at the candidates asked about (a :class:`LazyScores` computes no other task)."""
        lam = self.ctx.config.similarity_penalty
        # a penalty would raise a negative score: such a candidate has no bound. An array is checked once; a lazy
        # score at each read (the same bounds: where no candidate read is negative, np.where changes nothing)
        negative = None if isinstance(base, LazyScores) else bool(base.size) and base.min() < 0

        def exact(cands: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            ms = self.sim.max_sim(cands)
            return base[cands] * (1.0 - lam * ms), ms

        def bounds(cands: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            ms = self.sim.partial(cands)
            bc = base[cands]
            ub = bc * (1.0 - lam * ms)
            below = negative if negative is not None else bool((bc < 0).any())
            return (np.where(bc < 0, np.inf, ub) if below else ub), bc, ms

        def bound(cands: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            ub, _, ms = bounds(cands)
            return ub, ms

        def applied(cands: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            ms = self.sim.partial(cands)  # (max_sim's values where no member is pending)
            return base[cands] * (1.0 - lam * ms), ms
        return Penalised(exact, bound, bounds, applied, lam)


Scorer = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


class Penalised(NamedTuple):
    """A phase's penalised score ``base * (1 - lam * max_sim)`` (:meth:`_Batch.penalised`): the exact scores and
    their upper bound, each ``(scores, max_sim)`` of an array of candidates; ``bounds(cands)``, the upper bound
    with its two terms, ``(bound, base, max_sim so far)``; ``applied``, the exact scores where every member's row
    is applied (no call of :meth:`BatchSimilarity.max_sim` needed); and ``lam``, with which a pick on a pool whose
    similarities are applied eagerly scores one candidate in plain floats."""

    exact: Scorer
    bound: Scorer
    bounds: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
    applied: Scorer
    lam: float


def _kth_highest(u: np.ndarray, k: int) -> float:
    """The ``k``-th highest of ``u`` (``1 <= k <= len(u)``) in ``O(len(u))`` for ``k`` much smaller: a strided
    sample gives a threshold with about ``2 k`` values above it, and only those are sorted. (``np.partition``
    degrades badly on scores with many equal values, such as the many exact zeros of informativeness.)"""
    n = u.size
    if n > 8192 and k * 64 < n:
        step = n // (32 * k)
        sample = np.sort(u[::step])
        v = sample[max(0, sample.size - 2 * k // step - 2)]
        top = u[u >= v]
        if top.size >= k:
            return float(np.sort(top)[top.size - k])
    return float(np.sort(u)[n - k])


def _best_key(rest: np.ndarray, obs: np.ndarray | None, bound: np.ndarray,
              tiebreak: np.ndarray) -> tuple[int, float, float]:
    """The first of ``rest`` (non-empty; ``bound`` aligned with it) in the order (fewest observations, highest
    bound, highest draw)."""
    o = 0
    if obs is not None:
        o = int(obs[rest].min())
        at = obs[rest] == o
        rest, bound = rest[at], bound[at]
    u = bound.max()
    return o, float(u), float(tiebreak[rest[bound == u]].max())


class _Ranked:
    """Exact lazy argmax over one phase's candidates, which only leave (picked, or their environment capped).

    The rule: fewest observations first (``obs``; ``None``: no such rule), then the highest exact score,
    exact ties to the higher tiebreak draw. ``scorer``: ``(exact, bound)`` (a :class:`Penalised` score, or a pair
    of scorers), the exact score and an upper bound on it that only falls as the batch grows (the score with the
    similarities known so far). A shortlist of ``k`` candidates is kept in the order (obs, -bound, -tiebreak) of
    the bounds at build time; a walk stops where no later candidate can beat the best found, and the result is
    certified against the first candidate outside the shortlist (else the shortlist is rebuilt from ``pool()``,
    the candidates now, large enough to hold every candidate whose bound reached the best found). With
    ``valid_one`` (``valid`` of one candidate), a :class:`Penalised` score on a pool whose similarities are
    applied eagerly is picked in plain floats instead (:meth:`_pick_eager`).
    """

    def __init__(self, b: _Batch, pool: Callable[[], np.ndarray], scorer: tuple[Scorer, Scorer] | Penalised,
                 obs: np.ndarray | None, k: int, valid_one: Callable[[int], bool] | None = None) -> None:
        self.tiebreak, self.sim = b.ctx.tiebreak, b.sim
        self.valid_one = valid_one
        self._eager = valid_one is not None and isinstance(scorer, Penalised) and b.sim.eager
        if self._eager:  # (a heap entry costs more than an array element; a pick rarely looks past a few)
            k = -(-k // self.eager_divisor)
        self.pool, self.scorer, self.obs, self.k0 = pool, scorer, obs, max(1, k)
        self.k = self.k0
        self._heap: list[tuple] | None = None  # the shortlist as a heap (_pick_eager), built on its first pick
        self._build()

    #: A shortlist picked in plain floats starts at this fraction of the walk's.
    eager_divisor: int = 4

    def _build(self) -> None:
        pool = self.pool()
        scorer = self.scorer
        if self._eager:  # every row applied first: the bounds are the exact scores of now
            self.sim.apply_whole_rows()
        self._built_at = len(self.sim.members)
        # bounds now, kept until the next build: bounds only fall, so a stale one still holds
        if isinstance(scorer, Penalised):
            pb, pbase, pms = scorer.bounds(pool)
        else:
            pb, pbase, pms = scorer[1](pool)[0], None, None
        self.pool_bound = pb
        tb = self.tiebreak
        o = self.obs[pool] if self.obs is not None else None
        k = self.k
        if pool.size <= k:
            self.items, self.item_bound, self.item_base, self.item_ms = pool, pb, pbase, pms
            self.rest = None
        else:
            sel = np.zeros(pool.size, dtype=bool)
            if o is not None:  # all of the fewest-observed, then the best of the boundary level
                o_k = o.min()
                if np.count_nonzero(o == o_k) < k:
                    o_k = -_kth_highest(-o, k)
                sel = o < o_k
                tied = np.flatnonzero(o == o_k)
            else:
                tied = np.arange(pool.size)
            need = k - int(sel.sum())
            u = pb[tied]
            u_k = _kth_highest(u, need)
            sel[tied[u > u_k]] = True
            eq = tied[u == u_k]
            need = k - int(sel.sum())
            t = tb[pool[eq]]
            sel[eq[np.argpartition(-t, need - 1)[:need]] if need < eq.size else eq] = True
            self.items, self.item_bound = pool[sel], pb[sel]
            self.item_base = pbase[sel] if pbase is not None else None
            self.item_ms = pms[sel] if pms is not None else None
            self.rest = _best_key(pool[~sel], self.obs, pb[~sel], tb)
        self._sorted = False
        self._heap = None

    def _sort(self) -> None:
        """The shortlist in its order (obs, -bound, -tiebreak), which the walk reads."""
        if not self._sorted:
            items, ib = self.items, self.item_bound
            keys = (-self.tiebreak[items], -ib) + ((self.obs[items],) if self.obs is not None else ())
            order = np.lexsort(keys)
            self.items, self.item_bound = items[order], ib[order]
            self.item_base = self.item_base[order] if self.item_base is not None else None
            self.item_ms = self.item_ms[order] if self.item_ms is not None else None
            self._sorted = True

    def pick(self, valid: Callable[[np.ndarray], np.ndarray]) -> tuple[int, float, float] | None:
        """``(pos, exact score, max_sim)`` of the best valid candidate, or ``None`` when there is none; the walk
        computes the exact score only where the bound can still win."""
        if self._eager and (self._heap is not None or self._bounded()):
            return self._pick_eager(valid)
        return self._pick_walk(valid)

    def _pick_walk(self, valid: Callable[[np.ndarray], np.ndarray]) -> tuple[int, float, float] | None:
        exact, bound = self.scorer[0], self.scorer[1]
        while True:
            self._sort()
            ok = valid(self.items)
            items, ib = self.items[ok], self.item_bound[ok]
            if items.size:
                o_min = int(self.obs[items[0]]) if self.obs is not None else 0
                if self.obs is not None:
                    run = self.obs[items] == o_min
                    items, ib = items[run], ib[run]
                pos, top, ms, top_tb = self._walk(items, ib, exact, bound)
                if self._certified(o_min, top, top_tb):
                    return pos, top, ms
            elif self.rest is None:
                return None
            # not certified: the shortlist must hold every candidate whose bound reaches the best found
            if not items.size or self.rest[0] < o_min:  # fewer-observed candidates outside: double
                self.k *= 2
                self._build()
                continue
            reach = int(np.count_nonzero(self.pool_bound >= top))  # (of the pool at build: a superset)
            if reach * self.sim.eager_fraction >= self.tiebreak.size and self.sim.pending():
                self.sim.apply_whole_rows()  # most of the pool: whole rows tighten every bound at once
                self.k = self.k0
            else:
                self.k = max(2 * self.k, reach + self.k0)
            self._build()

    def _bounded(self) -> bool:
        """Whether every bound of the shortlist is finite (a negative base score has none: its penalty raises it)."""
        return not self.item_bound.size or bool(self.item_bound.max() < np.inf)

    def _pick_eager(self, valid: Callable[[np.ndarray], np.ndarray]) -> tuple[int, float, float] | None:
        """:meth:`pick` where every member's whole row is applied before the pick (:attr:`BatchSimilarity.eager`),
        so that a candidate's exact score is two reads and three float operations (those of
        :meth:`_Batch.penalised`'s arrays, in the same order, hence the same bits). The shortlist is a heap keyed
        by (observations, -score, -tiebreak), its score the one computed with the members of some earlier moment
        (the build, or a pick that scored it); scores only fall as the batch grows (a non-negative base score;
        the shortlist has no other, :meth:`_bounded`), so every key is at most the candidate's present one, and a
        top whose key was scored with every member of now is the best of the shortlist (lazy greedy). It is
        certified against the best bound outside the shortlist as the walk is."""
        sim, valid_one, lam = self.sim, self.valid_one, self.scorer.lam
        sim.apply_whole_rows()
        now = len(sim.members)
        within, cross = sim.max_within, sim._cross
        heappop, heapreplace = heapq.heappop, heapq.heapreplace
        while True:
            heap = self._heap
            if heap is None:
                if not self._bounded():  # (a rebuilt shortlist)
                    return self._pick_walk(valid)
                if self._built_at == now and self.items.size:  # built at this pick: every bound is exact, every
                    got = self._best_built()                    # candidate valid (pool() holds valid ones only)
                    if got is not None:
                        return got
                    continue
                heap = self._heap = self._heap_of()
            while heap:
                o, key, ntb, c, bc, at, ms = heap[0]
                if not valid_one(c):
                    heappop(heap)
                elif at == now:
                    break
                else:
                    a, x = within.item(c), cross.item(c)
                    ms = x if x > a else a  # (np.maximum(within, cross): the first where equal)
                    heapreplace(heap, (o, -(bc * (1.0 - lam * ms)), ntb, c, bc, now, ms))
            if not heap:
                if self.rest is None:
                    return None
                self.k *= 2
                self._build()
                continue
            o, key, ntb, c, bc, at, ms = heap[0]
            top, top_tb = -key, -ntb
            if self._certified(o, top, top_tb):
                return c, top, ms
            self._grow_applied(o, top)

    def _best_built(self) -> tuple[int, float, float] | None:
        """:meth:`_pick_eager` at the pick that built the shortlist, in a few whole-array steps: the best by
        (observations, exact score, tiebreak), certified against the rest (else the shortlist grows: ``None``)."""
        items = self.items
        i = _best_index(items, self.item_bound, self.obs, self.tiebreak)
        c = int(items[i])
        o = int(self.obs[c]) if self.obs is not None else 0
        top, top_tb = float(self.item_bound[i]), float(self.tiebreak[c])
        if self._certified(o, top, top_tb):
            return c, top, float(self.item_ms[i])
        self._grow_applied(o, top)
        return None

    def _certified(self, o: int, top: float, top_tb: float) -> bool:
        """Whether no candidate outside the shortlist can beat the best found, ``o`` observations, exact score
        ``top``, tiebreak ``top_tb``: the best key outside (``rest``: observations, bound, tiebreak) is behind it."""
        r = self.rest
        return r is None or r[0] > o or (r[0] == o and (r[1] < top or (r[1] == top and r[2] < top_tb)))

    def _grow_applied(self, o: int, top: float) -> None:
        """Rebuild a larger shortlist where the best found (``o`` observations, exact score ``top``) is not certified
        and every member's row is applied: doubled where fewer-observed candidates are outside, else large enough to
        hold every candidate whose bound at the build reached ``top`` (only a larger shortlist can certify)."""
        if self.rest[0] < o:
            self.k *= 2
        else:
            self.k = max(2 * self.k, int(np.count_nonzero(self.pool_bound >= top)) + self.k0)
        self._build()

    def _heap_of(self) -> list[tuple]:
        """The shortlist's heap entries ``(observations, -bound, -tiebreak, candidate, base score, members the
        bound was computed with, max_sim)``."""
        items = self.items
        obs = self.obs[items].tolist() if self.obs is not None else itertools.repeat(0)
        heap = list(zip(obs, (-self.item_bound).tolist(), (-self.tiebreak[items]).tolist(), items.tolist(),
                        self.item_base.tolist(), itertools.repeat(self._built_at), self.item_ms.tolist()))
        heapq.heapify(heap)
        return heap

    def _walk(self, run: np.ndarray, u_all: np.ndarray, exact: Scorer,
              bound: Scorer) -> tuple[int, float, float, float]:
        t_all = self.tiebreak[run]
        top = top_tb = -np.inf
        best = (-1, 0.0)
        i, size = 0, 16
        while i < run.size:
            j = min(i + size, run.size)
            u, t = u_all[i:j], t_all[i:j]
            can = (u > top) | ((u == top) & (t > top_tb))  # a prefix: the order is (-bound, -tiebreak)
            cut = i + (can.size if can.all() else int(np.argmin(can)))
            if cut > i:
                t = t[:cut - i]
                if top == -np.inf:  # (nothing found yet: every bound beats it, so every candidate is scored)
                    hit = np.arange(cut - i)
                else:
                    now, _ = bound(run[i:cut])  # tighter than the build-time bound: skip hopeless candidates
                    hit = np.flatnonzero((now > top) | ((now == top) & (t > top_tb)))
                if hit.size:
                    vals, ms = exact(run[i + hit])
                    v = vals.max()
                    tied = np.flatnonzero(vals == v)
                    a = int(tied[int(np.argmax(t[hit[tied]]))]) if tied.size > 1 else int(tied[0])
                    if v > top or (v == top and t[hit[a]] > top_tb):
                        top, top_tb, best = float(v), float(t[hit[a]]), (int(run[i + hit[a]]), float(ms[a]))
            if cut < j:
                break
            i, size = j, size * 2
        return best[0], top, best[1], top_tb


def _shortlist(n_slots: int) -> int:
    return SHORTLIST_FACTOR * n_slots + SHORTLIST_EXTRA


#: A phase's shortlist starts with the ``factor * slots + extra`` best candidates by unpenalised score and
#: doubles whenever its bound cannot certify a pick (penalties only lower scores).
SHORTLIST_FACTOR, SHORTLIST_EXTRA = 8, 256


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
    # 2) fill by global and within-environment novelty, at most `cap` per environment; novelty is at most
    # its value with the global similarity at its lower bound, the within-environment one
    w = cfg.cold_start_within_novelty_weight
    allow_blocked = "max_consecutive_selections" in relaxed

    def valid(c: np.ndarray) -> np.ndarray:
        ok = ~b.in_batch[c] & (b.env_batch[env[c]] < cap)
        return ok if allow_blocked else ok & ~b.blocked[c]

    def pool() -> np.ndarray:
        return np.flatnonzero(valid(np.arange(env.size)))

    def novelty(ms: np.ndarray, c: np.ndarray) -> np.ndarray:
        return (1.0 - w) * (1.0 - ms) + w * (1.0 - b.sim.max_within[c])

    def exact(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ms = b.sim.max_sim(c)
        return novelty(ms, c), ms

    def bound(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ms = b.sim.partial(c)
        return novelty(ms, c), ms

    scorer = (exact, bound)
    ranked = _Ranked(b, pool, scorer, b.task_obs, _shortlist(n - len(b.picks)))
    while len(b.picks) < n:
        got = ranked.pick(valid)
        if got is None:  # nothing eligible: relax the consecutive cap first, then the per-environment cap
            if not allow_blocked and (~b.in_batch & (b.env_batch[env] < cap)).any():
                allow_blocked = True
                relaxed.append("max_consecutive_selections")
            else:
                cap += 1
                relaxed.append(f"cold_start_max_per_env->{cap}")
            ranked = _Ranked(b, pool, scorer, b.task_obs, _shortlist(n - len(b.picks)))
            continue
        best, top, ms = got
        b.add(Pick(pos=best, phase="cold_start", rank=0, score=top, base_score=top, max_similarity=ms,
                   novelty=top, relaxed=list(relaxed)))


def _coverage(b: _Batch, n_slots: int) -> None:
    """Coverage picks: the environment by (current-step coverage, then the policy's environment order), the task
    in it by (fewest observations if the policy says so, then) the policy's penalised coverage score.

    Environments not yet in the batch (coverage level 0) are sorted once by their order key; the tied group of
    environments is then a run of that order, and only environments already in the batch (at most ``n``) are
    rescanned per pick. The group's tasks are ranked once per group (:class:`_Ranked`)."""
    ctx = b.ctx
    env, idx = ctx.env_codes, ctx.similarity
    target = len(b.picks) + n_slots
    ok = ~b.in_batch & ~b.blocked  # maintained per pick below
    avail = np.bincount(env[ok], minlength=ctx.num_envs)
    inputs = ctx.inputs
    key = inputs.env_order  # environment order after the coverage level, smallest first
    score = inputs.coverage_score
    obs = b.task_obs if inputs.coverage_fewest_observed_first else None
    scorer = b.penalised(score)
    eager = b.sim.eager
    fresh = np.flatnonzero((b.env_batch == 0) & (avail > 0)) if min(b.c1, b.c3) > 0 else np.zeros(0, np.int64)
    fresh = fresh[np.argsort(key[fresh], kind="stable")]
    fresh_key = key[fresh]
    at = 0
    touched = set(np.flatnonzero(b.env_batch > 0).tolist())
    in_group = np.zeros(ctx.num_envs, dtype=bool)
    group_envs = np.zeros(0, dtype=np.int64)
    group: tuple | None = None
    ranked: _Ranked | None = None
    tied = 0

    def valid(c: np.ndarray) -> np.ndarray:
        return in_group[env[c]] & ok[c]

    def valid_one(c: int) -> bool:
        return bool(in_group[env[c]] and ok[c])

    def pool() -> np.ndarray:
        members = idx.members(group_envs)
        return members[valid(members)]

    while len(b.picks) < target:
        while at < fresh.size and b.env_batch[fresh[at]] > 0:
            at += 1
        if at < fresh.size:  # some environment is not in the batch yet: coverage level 0, a run of `fresh`
            level, k = 0, fresh_key[at]
            envs = fresh[at:int(np.searchsorted(fresh_key, k, side="right"))]
        else:  # every environment left is in the batch already: at most n of them
            envs = np.fromiter(touched, dtype=np.int64, count=len(touched))
            envs = envs[(avail[envs] > 0) & (b.env_cov[envs] < b.c1) & (b.env_batch[envs] < b.c3)]
            if not envs.size:
                return
            level = int(b.env_batch[envs].min())
            envs = envs[b.env_batch[envs] == level]
            k = key[envs].min()
            envs = envs[key[envs] == k]
        got = None
        if group != (level, k):  # a group only loses environments until the next one
            in_group[group_envs] = False
            group, group_envs = (level, k), np.sort(envs[b.env_batch[envs] == level])
            in_group[group_envs] = True
            tied = group_envs.size
            ranked = None
            if eager:  # its first pick: every candidate's exact score at once, where they are few
                cands = idx.members(group_envs)
                cands = cands[ok[cands]]
                if cands.size <= _shortlist(target - len(b.picks)):
                    got = _best_applied(b, cands, scorer, obs)
        if got is None:
            if ranked is None:
                ranked = _Ranked(b, pool, scorer, obs, _shortlist(target - len(b.picks)), valid_one)
            got = ranked.pick(valid)
        if got is None:  # cannot happen: every environment of the group has an available task
            return
        p, s, ms = got
        e = int(env[p])
        b.add(Pick(pos=p, phase="coverage", rank=0, score=s, base_score=float(score[p]), max_similarity=ms,
                   tied_envs=tied))
        ok[p] = False
        avail[e] -= 1
        touched.add(e)
        in_group[e] = False  # its coverage level went up
        tied -= 1


def _best_applied(b: _Batch, cands: np.ndarray, scorer: Penalised,
                  obs: np.ndarray | None) -> tuple[int, float, float] | None:
    """``(pos, exact score, max_sim)`` of the best of ``cands`` (valid candidates, ascending) by (fewest observations
    if ``obs``, highest exact score, highest tiebreak), every member's row applied first (a pool whose similarities
    are applied eagerly); ``None`` when ``cands`` is empty."""
    if not cands.size:
        return None
    b.sim.apply_whole_rows()
    vals, ms = scorer.applied(cands)
    i = _best_index(cands, vals, obs, b.ctx.tiebreak)
    return int(cands[i]), float(vals[i]), float(ms[i])


def _best_index(items: np.ndarray, scores: np.ndarray, obs: np.ndarray | None, tiebreak: np.ndarray) -> int:
    """The index in ``items`` (non-empty) of the best by fewest observations (``obs``; ``None``: no such rule), then
    the highest of ``scores`` (aligned with ``items``), then the highest tiebreak draw (the first where equal)."""
    at = None
    if obs is not None:
        o = obs[items]
        at = np.flatnonzero(o == o.min())
        scores = scores[at]
    tied = np.flatnonzero(scores == scores.max())
    i = int(tied[0])
    if tied.size > 1:
        i = int(tied[int(np.argmax(tiebreak[items[tied if at is None else at[tied]]]))])
    return int(at[i]) if at is not None else i


def _exploitation(b: _Batch, n_slots: int, base: np.ndarray, exposure: np.ndarray, discount: np.ndarray) -> None:
    ctx, cfg = b.ctx, b.ctx.config
    env = ctx.env_codes
    excluded = b.blocked | b.in_batch
    if cfg.use_progress_filter:
        excluded |= ctx.history.progress_filtered()
    if cfg.use_identifier_filter:
        excluded |= ctx.identifier_flagged

    def valid(c: np.ndarray) -> np.ndarray:
        return ~b.in_batch[c] & (b.env_batch[env[c]] < b.c3)

    def valid_one(c: int) -> bool:
        return not b.in_batch[c] and b.env_batch[env[c]] < b.c3

    def pool() -> np.ndarray:
        return np.flatnonzero(~excluded & ~b.in_batch & (b.env_batch[env] < b.c3))

    scorer = b.penalised(base)
    ranked = _Ranked(b, pool, scorer, None, _shortlist(n_slots), valid_one)
    target = len(b.picks) + n_slots
    while len(b.picks) < target:
        best = ranked.pick(valid)
        if best is None:
            return
        p, score, ms = best
        b.add(Pick(pos=p, phase="exploitation", rank=0, score=score, base_score=float(base[p]), max_similarity=ms,
                   exposure=float(exposure[p]), exposure_discount=float(discount[p])))


def _fill(b: _Batch, n: int, base: np.ndarray) -> None:
    ctx, cfg = b.ctx, b.ctx.config
    filtered = ctx.history.progress_filtered()

    def valid(c: np.ndarray) -> np.ndarray:
        return ~b.in_batch[c]

    def valid_one(c: int) -> bool:
        return not b.in_batch[c]

    scorer = b.penalised(base)
    ranked = _Ranked(b, lambda: np.flatnonzero(~b.in_batch), scorer, None, _shortlist(n - len(b.picks)), valid_one)
    while len(b.picks) < n:
        best = ranked.pick(valid)
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
        b.add(Pick(pos=p, phase="fill", rank=0, score=score, base_score=float(base[p]), max_similarity=ms,
                   relaxed=relaxed))


def build_batch(ctx: SchedulingContext, n: int) -> list[Pick]:
    """Select ``n`` distinct tasks (``n`` <= N). Deterministic given the context (tiebreaks included).
    Cold start when there is no prediction; otherwise ``ctx.inputs`` (the policy's) is required."""
    if ctx.prediction is not None and ctx.inputs is None:
        raise ValueError("a SchedulingContext with a prediction needs the policy's inputs (ctx.inputs)")
    b = _Batch(ctx, n)
    cfg = ctx.config
    if ctx.prediction is None:
        _cold_start(b, n)
        return b.picks
    inputs = ctx.inputs
    if inputs.coverage_slots:
        _coverage(b, inputs.coverage_slots)
    n_exp = n - len(b.picks)
    score = inputs.exploitation_score
    if n_exp and cfg.mode != "coverage_only":
        exposure = ctx.history.exposure(cfg.long_half_life)
        discount = np.where(inputs.caps_active, np.power(1.0 + exposure, -cfg.exposure_power), 1.0)
        _exploitation(b, n_exp, score * discount, exposure, discount)
    if len(b.picks) < n:
        # exploitation ran out of candidates (filters, quotas): the rest goes to the coverage rules
        _coverage(b, n - len(b.picks))
    if len(b.picks) < n:
        _fill(b, n, score)
    return b.picks
