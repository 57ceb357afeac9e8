"""Stage 2 of EnvSched: predicting every task's informativeness from rollout history (2.3, B, B.1).

For each of the two half-lives (long and short) the complete score is computed separately:

1. **task histories** (:meth:`History.task_history`): centered, clipped, recency-weighted ``(m, v, d)``
   per task and their weight ``W``;
2. **propagation** along each relation: the estimate of task ``i`` in relation ``r`` is the average of its
   neighbours' histories with the graph's neighbour weights, where a neighbour without history counts with
   a substitute (B.1: "the current reference substituted when no history is available"); a task with no
   observed neighbour in ``r`` therefore gets the substitute, and one observed neighbour out of six moves the
   estimate only by its weight's share. The substitute (``SchedulerConfig.unobserved_neighbours``) is the
   global reference (the paper) or, in the default, the neighbour's **environment estimate**: the same
   propagation one level up, over every other task of the environment with equal weight, the environment's
   unobserved tasks counting with the global reference (:class:`EnvironmentOperator`). So a task's prediction
   goes from the global reference to its environment's observed level as the environment is observed, and to
   its neighbours' as they are. Within a task's own environment the estimate leaves the task out (its own
   history enters once, in step 4); a cross neighbour counts with the estimate of the neighbour's environment;
3. **relation fusion**: ``prior = w * within + (1 - w) * cross`` (``w = 0.5``, equal weight); the
   ablations drop one relation (or both: the prior is the global reference);
4. **fusion with the task's own history**: ``post = (n0 * prior + W * own) / (n0 + W)``;
5. **two variance estimates**: the direct ``v`` and the reconstruction ``d m (1 - m)`` from predicted
   mean and dispersion;
6. **calibration**: the percentile ranks of both estimates over all N pairs (``scipy.stats.rankdata``,
   average ties, ``rank / N``) are combined, ``q = (1 - a) * pct(v) + a * pct(d m (1 - m))``, and ``q`` is
   mapped through the empirical quantile function of the direct predicted variances (``numpy.quantile``,
   linear interpolation): the score is on the variance scale, so half-lives and phases compare.

The two half-life scores are then combined, and a **recent decline** (short score below long) lowers the
priority: ``priority = (s_long + s_short) / 2 - decline_penalty * max(0, s_long - s_short)``.

Everything is vectorised over N: ``O(N K)`` for propagation, ``O(N log N)`` for the ranks. Costs a step pays
once, not per half-life: each relation operator keeps its row totals (:class:`RelationOperator`, built once
per graph); one sort order of ``v`` serves both its percentile ranks and the quantile mapping; tasks that
share the reference prediction (no own history, no observed neighbour and, with the environment substitute,
no observed task in the environments it reads: most of a large pool at the start of a run) are sorted as one
block; the percentile ranks of the priority (``Prediction.q``), which only explanations
read, are computed when first read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, cached_property

import numpy as np
import scipy.sparse as sp

from envsched.method.config import SchedulerConfig
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.history.statistics import History, TaskHistory

__all__ = ["HalfLifePrediction", "Prediction", "RelationOperator", "percentile_ranks", "predict", "propagate",
           "quantile_map", "relation_operator", "relation_operators", "sort_order", "substitutes_environment"]


def relation_operator(index: np.ndarray, weight: np.ndarray, n: int) -> sp.csc_matrix:
    """The neighbour weights of one relation as a sparse ``(N, N)`` matrix (``-1`` padding dropped)."""
    rows = np.repeat(np.arange(index.shape[0]), index.shape[1])
    cols = index.ravel()
    keep = cols >= 0
    # column-major: a step only reads the columns of observed tasks
    return sp.csc_matrix((weight.ravel()[keep].astype(float), (rows[keep], cols[keep])), shape=(n, n))


@dataclass(frozen=True)
class RelationOperator:
    """A relation's neighbour weights with their row totals, which never change for a graph: built once per
    sampler, not on every step."""

    matrix: sp.csc_matrix
    row_total: np.ndarray  # (N,): sum of each task's neighbour weights

    @classmethod
    def of(cls, operator: sp.spmatrix | RelationOperator) -> RelationOperator:
        """Wrap a sparse ``(N, N)`` weight matrix (row totals computed once here); an operator is returned as is."""
        if isinstance(operator, RelationOperator):
            return operator
        if not sp.issparse(operator):
            raise TypeError(f"operator must be a scipy sparse matrix or a RelationOperator, got "
                            f"{type(operator).__name__}")
        op = sp.csc_matrix(operator)
        return cls(matrix=op, row_total=np.asarray(op.sum(axis=1)).ravel())

    def aggregate(self, seen: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``(N, C)``: each task's neighbour-weighted sum of ``x`` (the rows of the observed tasks ``seen``,
        ascending). Where they are a large share of the pool, the product with ``x`` spread to all N rows (zeros
        elsewhere) instead of the matrix's columns ``seen`` copied out: the same sums bit for bit (a column-major
        product adds each column's entries column after column; an unobserved column adds ``+-0.0``, which
        changes no sum, and a sum from ``0.0`` is never ``-0.0``)."""
        n = self.matrix.shape[1]
        if seen.size * self.spread_fraction >= n:
            full = np.zeros((n, x.shape[1]))
            full[seen] = x
            return np.asarray(self.matrix @ full)
        return np.asarray(self.matrix[:, seen] @ x)

    #: :meth:`aggregate` spreads ``x`` over the pool when the observed tasks are at least ``1 / spread_fraction``
    #: of it
    spread_fraction = 8


@dataclass(frozen=True)
class EnvironmentOperator:
    """The within relation as the whole environment (``within_relation="environment"``): every other task of a
    task's environment is a neighbour of weight 1. Aggregated from per-environment sums, ``O(N)`` whatever the
    environments' sizes (a sparse matrix would hold ``sum n_e^2`` entries)."""

    env_codes: np.ndarray  # (N,)
    num_envs: int
    row_total: np.ndarray  # (N,): n_e - 1

    @classmethod
    def of_codes(cls, env_codes: np.ndarray) -> EnvironmentOperator:
        """The operator of the environments ``env_codes`` (``(N,)`` integer codes from 0)."""
        codes = np.asarray(env_codes, dtype=np.int64)
        sizes = np.bincount(codes).astype(float)
        return cls(env_codes=codes, num_envs=sizes.size, row_total=sizes[codes] - 1.0)

    def aggregate(self, seen: np.ndarray, x: np.ndarray) -> np.ndarray:
        codes = self.env_codes[seen]
        sums = np.column_stack([np.bincount(codes, weights=x[:, j], minlength=self.num_envs)
                                for j in range(x.shape[1])])
        agg = sums[self.env_codes]
        agg[seen] -= x  # a task is not its own neighbour
        return agg


def _as_operator(operator: sp.spmatrix | RelationOperator | EnvironmentOperator,
                 ) -> RelationOperator | EnvironmentOperator:
    """An operator as :func:`_propagate_seen` takes it: a sparse matrix wrapped (:meth:`RelationOperator.of`),
    an operator as is."""
    return operator if isinstance(operator, EnvironmentOperator) else RelationOperator.of(operator)


def propagate(values: np.ndarray, observed: np.ndarray, operator: sp.spmatrix | RelationOperator | EnvironmentOperator,
              reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Neighbour aggregation along one relation.

    Args:
        values: ``(N, C)`` per-task statistics (histories).
        observed: ``(N,)`` which tasks have history.
        operator: the relation's neighbour weights (:func:`relation_operator`), best as a
            :class:`RelationOperator` (:func:`relation_operators`) so the row totals are not recomputed.
        reference: ``(C,)`` used where a task has no observed neighbour.

    Returns:
        ``(estimate (N, C), has_observed_neighbour (N,))``: the neighbour-weighted mean of the neighbours'
        histories, a neighbour without history counting with ``reference`` (B.1's substitution), so
        ``(sum_obs w_j h_j + (sum_all w_j - sum_obs w_j) reference) / sum_all w_j``; the reference for a
        task without neighbours or without an observed one.

    Why not re-normalise over the observed neighbours only: then a task with one observed neighbour out
    of 18 copies that neighbour's statistics with full confidence, and early in a run every unobserved
    neighbour of a high-variance task ties with the task itself, so exploitation spread over dozens of
    barely-evidenced guesses instead of the tasks whose own rollouts showed reward differences
    (measured in ``docs/envsched-sampler.md``).
    """
    seen = np.flatnonzero(observed)
    if seen.size == 0:
        return np.broadcast_to(reference, values.shape).copy(), np.zeros(values.shape[0], dtype=bool)
    return _propagate_seen(seen, np.column_stack([np.ones(seen.size), values[seen]]), _as_operator(operator),
                           reference)


def _propagate_seen(seen: np.ndarray, x: np.ndarray, rel: RelationOperator | EnvironmentOperator,
                    reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`propagate` from the observed positions ``seen`` (non-empty) and ``x = [1, values[seen]]``, which
    both relations share."""
    # only observed tasks contribute: O(K * observed + N) instead of O(K * N) random reads
    agg = rel.aggregate(seen, x)
    total = agg[:, 0]
    has = total > 0
    missing = np.maximum(rel.row_total - total, 0.0)
    # (agg + missing * reference) / row_total where a neighbour is observed, else the reference. Column by
    # column into a (C, N) buffer returned transposed (Fortran order): numpy broadcasting over a trailing
    # axis of 3-6 runs several times slower than 1-D loops, and column slices of the result stay contiguous
    est = np.empty((reference.size, agg.shape[0]))
    rows = np.flatnonzero(has)
    if 4 * rows.size < has.size:  # early in a run: compute only the rows with an observed neighbour
        agg_rows, missing_rows, total_rows = agg[rows], missing[rows], rel.row_total[rows]
        for j, col in enumerate(est):
            col.fill(reference[j])
            col[rows] = (agg_rows[:, 1 + j] + missing_rows * reference[j]) / total_rows
        return est.T, has
    denom = np.where(has, rel.row_total, 1.0)
    unseen = ~has
    for j, col in enumerate(est):
        np.multiply(missing, reference[j], out=col)
        col += agg[:, 1 + j]
        col /= denom
        np.copyto(col, reference[j], where=unseen)
    return est.T, has


def _propagate_substituted(seen: np.ndarray, x: np.ndarray, rel: RelationOperator | EnvironmentOperator,
                           substitute: np.ndarray, per_neighbour: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_propagate_seen` where a neighbour without history counts with a per-task ``substitute`` (``(N, C)``)
    instead of one reference: the row's own (``per_neighbour=False``: every unobserved neighbour of task ``i``
    counts with ``substitute[i]``; the within relation, whose neighbours share the task's environment) or each
    neighbour's (``per_neighbour=True``: neighbour ``j`` counts with ``substitute[j]``; the cross relation, whose
    neighbours are in other environments, a :class:`RelationOperator`). A task without neighbours gets
    ``substitute[i]``. Returns ``(estimate (N, C), has_observed_neighbour (N,))``."""
    if per_neighbour:
        # sum_obs w (h - s_j) + sum_all w s_j = sum_obs w h + sum_unobserved w s_j
        y = x.copy()
        y[:, 1:] -= substitute[seen]
        agg = rel.aggregate(seen, y)
        spread = np.asarray(rel.matrix @ substitute)
    else:
        agg = rel.aggregate(seen, x)
        missing = np.maximum(rel.row_total - agg[:, 0], 0.0)
    has = agg[:, 0] > 0
    total = rel.row_total
    with_neighbours = total > 0
    denom = np.where(with_neighbours, total, 1.0)
    alone = ~with_neighbours
    # (agg + spread) / total, or (agg + missing * substitute) / total, where a task has neighbours, else its
    # substitute: column by column into a (C, N) buffer returned transposed (Fortran order, as _propagate_seen)
    est = np.empty((substitute.shape[1], substitute.shape[0]))
    for j, col in enumerate(est):
        if per_neighbour:
            np.add(agg[:, 1 + j], spread[:, j], out=col)
        else:
            np.multiply(missing, substitute[:, j], out=col)
            col += agg[:, 1 + j]
        col /= denom
        np.copyto(col, substitute[:, j], where=alone)
    return est.T, has


def _argsort(x: np.ndarray) -> np.ndarray:
    """``numpy.argsort`` with the faster kind for ``x``: the default (SIMD quicksort) on mostly distinct values,
    the stable sort when one value fills a large share (the quicksort then runs several times slower). A strided
    sample of about 1,000 values tells which; the order of equal values, the only thing the kind changes, is
    never used."""
    if x.size > 4096:
        sample = np.sort(x[:: x.size // 1024])
        if np.count_nonzero(sample[1:] == sample[:-1]) * 8 < sample.size:
            return np.argsort(x)
    return np.argsort(x, kind="stable")


def sort_order(x: np.ndarray, block: np.ndarray | None = None) -> np.ndarray:
    """Indices that sort ``x`` ascending (equal values in any order, NaN last).

    ``block``: an optional ``(N,)`` mask of positions expected to hold one common value (the tasks that share
    the reference prediction). When they do, only the other positions are sorted and the block is inserted
    where its value belongs: ``O(k log k + N)`` for ``k`` positions outside the block instead of ``O(N log N)``.
    When they do not (checked), ``x`` is sorted whole.
    """
    if block is not None and x.size:
        inside = np.flatnonzero(block)
        if inside.size > 1 and (x[inside] == x[inside[0]]).all():  # (false for NaN)
            rest = np.flatnonzero(~block)
            xr = x[rest]
            o = _argsort(xr)
            cut = int(np.searchsorted(xr[o], x[inside[0]], side="left"))
            rest = rest[o]
            return np.concatenate([rest[:cut], inside, rest[cut:]])
    return _argsort(x)


def percentile_ranks(x: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Percentile ranks over all N with average ties: ``rankdata(x, 'average') / N`` in ``(0, 1]``.

    ``order``: indices that sort ``x`` (:func:`sort_order`), when the caller already has them. Equal to
    ``scipy.stats.rankdata`` bit for bit (average ranks are half-integers, exact in floating point), NaN
    included (any NaN: all NaN, scipy's default ``nan_policy="propagate"``).
    """
    x = np.asarray(x, dtype=float)
    if order is None:
        order = sort_order(x)
    return _ranks_of_sorted(x[order], order)


def _ranks_of_sorted(xs: np.ndarray, order: np.ndarray) -> np.ndarray:
    """:func:`percentile_ranks` from the sorted values ``xs = x[order]``."""
    n = xs.size
    if n == 0:
        return np.empty(0)
    if np.isnan(xs[-1]):
        return np.full(n, np.nan)
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(xs[1:], xs[:-1], out=first[1:])
    start = np.flatnonzero(first)
    end = np.append(start[1:], n)
    ranks = np.empty(n)
    # ties share the mean of the 1-based ranks start+1 .. end
    ranks[order] = np.repeat((start + end + 1) / 2.0, end - start)
    return ranks / n


def quantile_map(values: np.ndarray, q: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """The empirical quantile function of ``values`` with linear interpolation, evaluated at ``q``.

    Identical to ``numpy.quantile(values, q, method="linear")`` (tested), computed with one sort for all
    N probabilities instead of a selection per probability; ``order`` (indices that sort ``values``, e.g.
    the ones :func:`percentile_ranks` used) saves that sort too.
    """
    q = np.asarray(q, dtype=float)
    x = values[order] if order is not None else np.sort(values)
    return _quantiles_of_sorted(x, q.reshape(-1)).reshape(q.shape)


def _quantiles_of_sorted(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """:func:`quantile_map` from the sorted values ``x`` at the probabilities ``q`` (1-D)."""
    # numpy's _lerp form, so results match numpy.quantile bit for bit where possible:
    # h = (n - 1) q, lo = floor(h), hi = min(lo + 1, n - 1), t = h - lo, diff = x[hi] - x[lo],
    # x[lo] + diff t where t < 0.5, else x[hi] - diff (1 - t); in place (few N-sized temporaries)
    h = np.clip(q, 0.0, 1.0)
    h *= x.size - 1
    lo = np.floor(h)
    frac = np.subtract(h, lo, out=h)
    lo_i = lo.astype(np.int64)
    hi_i = lo_i + 1
    np.minimum(hi_i, x.size - 1, out=hi_i)
    x_lo, x_hi = x[lo_i], x[hi_i]
    diff = np.subtract(x_hi, x_lo, out=lo)
    out = diff * frac
    out += x_lo
    upper = np.subtract(1.0, frac, out=x_lo)
    upper *= diff
    np.subtract(x_hi, upper, out=upper)
    np.copyto(out, upper, where=frac >= 0.5)
    return out


class RelationEstimates:
    """The within (0) and cross (1) relations' estimates of one half-life: ``(estimates (N, 3), has (N,))``, the
    propagated ``m, v, d`` and which tasks have an observed neighbour. Each is computed on first read: the
    prediction reads only the relations the configuration uses, explanations read both (the same values, as
    the history they are computed from does not change while the prediction is in use)."""

    def __init__(self, compute: Callable[[int], tuple[np.ndarray, np.ndarray]]) -> None:
        self._compute = compute
        self._done: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        #: ``(N, 3)``: each task's environment estimate, the substitute of a neighbour without history
        #: (``unobserved_neighbours="environment"``, once some task has history); ``None``: the global reference
        self.environment: np.ndarray | None = None

    @classmethod
    def of(cls, within: np.ndarray, within_has: np.ndarray, cross: np.ndarray,
           cross_has: np.ndarray) -> RelationEstimates:
        """Estimates already computed."""
        return cls(lambda i: ((within, within_has), (cross, cross_has))[i])

    def get(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
        if relation not in self._done:
            self._done[relation] = self._compute(relation)
        return self._done[relation]


@dataclass
class HalfLifePrediction:
    """The complete score for one half-life (arrays over all N tasks; stats columns are ``m, v, d``)."""

    history: TaskHistory
    relations: RelationEstimates = field(repr=False)
    prior: np.ndarray
    posterior: np.ndarray
    v_direct: np.ndarray
    v_reconstructed: np.ndarray
    ranks: np.ndarray | Callable[[], np.ndarray] = field(repr=False)
    score: np.ndarray

    @cached_property
    def q(self) -> np.ndarray:
        """Percentile ranks behind the score: the blend of ranks the calibration maps to a quantile, or without
        calibration the ranks of the score itself, which only explanations read (computed on first read)."""
        return self.ranks if isinstance(self.ranks, np.ndarray) else self.ranks()

    @property
    def within(self) -> np.ndarray:
        """The within relation's propagated estimates (``(N, 3)``)."""
        return self.relations.get(0)[0]

    @property
    def within_has(self) -> np.ndarray:
        return self.relations.get(0)[1]

    @property
    def cross(self) -> np.ndarray:
        """The cross relation's propagated estimates (``(N, 3)``)."""
        return self.relations.get(1)[0]

    @property
    def cross_has(self) -> np.ndarray:
        return self.relations.get(1)[1]


@dataclass
class Prediction:
    """Both half-lives, the combined priority and the reference they were computed against."""

    reference: np.ndarray
    long: HalfLifePrediction
    short: HalfLifePrediction
    decline: np.ndarray
    informativeness: np.ndarray
    #: computes the tasks that share the reference prediction (:attr:`shared`)
    shared_mask: Callable[[], np.ndarray] | None = field(default=None, repr=False)
    #: both half-lives' estimates of each relation computed so far, ``{relation: ((N, 6) long then short m, v, d,
    #: has an observed neighbour (N,))}`` (the arrays the half-lives' relation estimates are views of), and the
    #: environment estimates ``((N, 6), has (N,))`` (``None``: the global reference is the substitute)
    propagated: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    environment: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    #: the step the recency weights are valued at (:meth:`History.task_history`); ``None``: the latest
    anchor: int | None = None

    @cached_property
    def shared(self) -> np.ndarray | None:
        """``(N,)`` bool: the tasks that share the reference prediction (their values are one block for the sorts;
        computed on first read, as only sorts read it)."""
        return None if self.shared_mask is None else self.shared_mask()

    @cached_property
    def q(self) -> np.ndarray:
        """Percentile ranks of the priority (``informativeness``) over all N; only explanations read them, so
        they are computed on first use."""
        return percentile_ranks(self.informativeness, sort_order(self.informativeness, self.shared))

    @property
    def mean(self) -> np.ndarray:
        """Predicted mean reward (long half-life posterior)."""
        return self.long.posterior[:, 0]

    @property
    def dispersion(self) -> np.ndarray:
        return self.long.posterior[:, 2]

    @property
    def variance(self) -> np.ndarray:
        """Predicted within-task variance (long half-life, direct)."""
        return self.long.v_direct


def _one_half_life(hist: TaskHistory, relations: RelationEstimates, reference: np.ndarray, config: SchedulerConfig,
                   shared: Callable[[], np.ndarray]) -> HalfLifePrediction:
    """``shared()``: tasks without own history and without an observed neighbour in a relation in use, whose
    predictions are all the same (sorted as one block, see :func:`sort_order`); read only where a sort is."""
    if config.use_within_edges and config.use_cross_edges:
        w = config.within_fusion_weight
        prior = w * relations.get(0)[0] + (1.0 - w) * relations.get(1)[0]
    elif config.use_within_edges:
        prior = relations.get(0)[0]
    elif config.use_cross_edges:
        prior = relations.get(1)[0]
    else:
        prior = np.broadcast_to(reference, hist.values.shape).copy(order="F")
    n0 = config.prior_strength
    W = hist.weight
    posterior = np.empty((prior.shape[1], prior.shape[0])).T  # Fortran order, as propagate's estimates
    for j in range(prior.shape[1]):  # (n0 * prior + W * own) / (n0 + W), column by column (see propagate)
        posterior[:, j] = (n0 * prior[:, j] + W * hist.values[:, j]) / (n0 + W)
    m, v, d = posterior[:, 0], posterior[:, 1], posterior[:, 2]
    v_rec = d * m * (1.0 - m)
    a = config.reconstruction_weight
    if config.use_calibration:
        block = shared()
        order = sort_order(v, block)
        v_sorted = v[order]  # one gather shared by the ranks and the quantile mapping
        q = (1.0 - a) * _ranks_of_sorted(v_sorted, order) + a * percentile_ranks(v_rec, sort_order(v_rec, block))
        score = _quantiles_of_sorted(v_sorted, q)
    else:  # without calibration: the blend of the two estimates on their own scales (ranks only for explanations)
        score = (1.0 - a) * v + a * v_rec
        q = lambda: percentile_ranks(score, sort_order(score, shared()))  # noqa: E731
    return HalfLifePrediction(history=hist, relations=relations, prior=prior, posterior=posterior, v_direct=v,
                              v_reconstructed=v_rec, ranks=q, score=score)


def substitutes_environment(config: SchedulerConfig) -> bool:
    """Whether a neighbour without history counts with its environment's estimate under ``config``: the knob
    ``unobserved_neighbours="environment"``, read when a relation is on (with both off, estimates computed for an
    explanation count it with the global reference)."""
    return config.unobserved_neighbours == "environment" and (config.use_within_edges or config.use_cross_edges)


def relation_operators(graph: DualRelationGraph, within: str = "neighbours",
                       ) -> tuple[RelationOperator | EnvironmentOperator, RelationOperator]:
    """``(within, cross)`` operators of a graph with their row totals (build once, reuse every step);
    ``within``: :data:`~envsched.method.config.WITHIN_RELATIONS`."""
    n = graph.num_nodes
    if within == "environment":
        within_op: RelationOperator | EnvironmentOperator = EnvironmentOperator.of_codes(graph.env_codes)
    else:
        within_op = RelationOperator.of(relation_operator(graph.within_index, graph.within_weight, n))
    return (within_op,
            RelationOperator.of(relation_operator(graph.cross_index, graph.cross_weight, n)))


def predict(history: History, graph: DualRelationGraph, config: SchedulerConfig,
            operators: tuple[RelationOperator | EnvironmentOperator | sp.spmatrix, RelationOperator | sp.spmatrix]
            | None = None, *, anchor: int | None = None, reference: np.ndarray | None = None,
            ) -> Prediction | None:
    """Informativeness of every task from the history so far; ``None`` before any scored observation.

    ``operators`` (from :func:`relation_operators`) saves rebuilding the neighbour matrices and their row
    totals every step. ``anchor``: the step the task histories' recency weights are valued at
    (:meth:`History.task_history`: the same prediction up to rounding; what
    :class:`~envsched.method.history.incremental.IncrementalPrediction` keeps up to date). ``reference``: the global
    reference to centre on (default: the history's, :meth:`History.global_reference`).
    """
    if reference is None:
        reference = history.global_reference()
    if reference is None:
        return None
    ops = (tuple(_as_operator(op) for op in operators) if operators is not None
           else relation_operators(graph, config.within_relation))
    centered = history.centered_observations(reference)
    h_long = history.task_history(config.long_half_life, reference, centered, anchor)
    h_short = history.task_history(config.short_half_life, reference, centered, anchor)
    # both half-lives propagate in one sparse product per relation (the observed set is the same), a relation
    # the configuration leaves out only when an explanation reads it
    seen = np.flatnonzero(h_long.observed)
    both_reference = np.concatenate([reference, reference])
    both: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    x = np.column_stack([np.ones(seen.size), h_long.values[seen], h_short.values[seen]]) if seen.size else None
    environment = None  # (estimates (N, 6), has an observed task in the environment (N,)), the substitute
    if substitutes_environment(config) and seen.size:
        est, has = _propagate_seen(seen, x, EnvironmentOperator.of_codes(graph.env_codes), both_reference)
        environment = (np.ascontiguousarray(est), has)

    def propagated(relation: int) -> tuple[np.ndarray, np.ndarray]:
        if relation not in both:
            if environment is not None:
                both[relation] = _propagate_substituted(seen, x, ops[relation], environment[0],
                                                        per_neighbour=relation == 1)
            elif seen.size:
                both[relation] = _propagate_seen(seen, x, ops[relation], both_reference)
            else:  # no task with history weight: every estimate is the reference
                n = graph.num_nodes
                both[relation] = (np.broadcast_to(both_reference, (n, 6)).copy(), np.zeros(n, dtype=bool))
        return both[relation]

    long_rel = RelationEstimates(lambda i: (propagated(i)[0][:, :3], propagated(i)[1]))
    short_rel = RelationEstimates(lambda i: (propagated(i)[0][:, 3:], propagated(i)[1]))
    if environment is not None:
        long_rel.environment, short_rel.environment = environment[0][:, :3], environment[0][:, 3:]
    @cache
    def shared() -> np.ndarray:  # (computed once, where a sort reads it: the calibration or explanations)
        mask = ~h_long.observed
        if config.use_within_edges:
            mask &= ~long_rel.get(0)[1]
        if config.use_cross_edges:
            mask &= ~long_rel.get(1)[1]
        if environment is not None:
            # the substitute differs from the reference where the task's environment has an observed task
            # (within) or one of its cross neighbours' environments has (cross)
            touched = np.zeros(graph.num_nodes, dtype=bool)
            if config.use_within_edges:
                touched |= environment[1]
            if config.use_cross_edges:
                touched |= np.asarray(ops[1].matrix @ environment[1].astype(float)) > 0
            mask &= ~touched
        return mask

    long = _one_half_life(h_long, long_rel, reference, config, shared)
    short = _one_half_life(h_short, short_rel, reference, config, shared)
    decline = np.maximum(0.0, long.score - short.score)
    info = 0.5 * (long.score + short.score) - config.decline_penalty * decline
    info = np.maximum(info, 0.0)
    return Prediction(reference=reference, long=long, short=short, decline=decline, informativeness=info,
                      shared_mask=shared, propagated=both, environment=environment, anchor=anchor)
