"""Stage 2 of EnvSched: predicting every task's informativeness from rollout history (2.3, B, B.1).

For each of the two half-lives (long and short) the complete score is computed separately:

1. **task histories** (:meth:`History.task_history`): centered, clipped, recency-weighted ``(m, v, d)``
   per task and their weight ``W``;
2. **propagation** along each relation: the estimate of task ``i`` in relation ``r`` is the average of its
   neighbours' histories with the graph's neighbour weights, where a neighbour without history counts with
   the global reference (B.1: "the current reference substituted when no history is available"); a task
   with no observed neighbour in ``r`` therefore gets the global reference, and one observed neighbour
   out of six moves the estimate only by its weight's share;
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

Everything is vectorised over N: ``O(N K)`` for propagation, ``O(N log N)`` for the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.stats import rankdata

from envsched.method.config import SchedulerConfig
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.history.statistics import History, TaskHistory

__all__ = ["HalfLifePrediction", "Prediction", "percentile_ranks", "predict", "propagate", "quantile_map",
           "relation_operator", "relation_operators"]


def relation_operator(index: np.ndarray, weight: np.ndarray, n: int) -> sp.csc_matrix:
    """The neighbour weights of one relation as a sparse ``(N, N)`` matrix (``-1`` padding dropped)."""
    rows = np.repeat(np.arange(index.shape[0]), index.shape[1])
    cols = index.ravel()
    keep = cols >= 0
    # column-major: a step only reads the columns of observed tasks
    return sp.csc_matrix((weight.ravel()[keep].astype(float), (rows[keep], cols[keep])), shape=(n, n))


def propagate(values: np.ndarray, observed: np.ndarray, operator: sp.spmatrix,
              reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Neighbour aggregation along one relation.

    Args:
        values: ``(N, C)`` per-task statistics (histories).
        observed: ``(N,)`` which tasks have history.
        operator: the relation's neighbour weights (:func:`relation_operator`).
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
    op = sp.csc_matrix(operator)
    row_total = np.asarray(op.sum(axis=1)).ravel()
    # only observed tasks contribute: O(K * observed + N) instead of O(K * N) random reads
    agg = np.asarray(op[:, seen] @ np.column_stack([np.ones(seen.size), values[seen]]))
    total = agg[:, 0]
    has = total > 0
    missing = np.maximum(row_total - total, 0.0)
    denom = np.where(has, row_total, 1.0)
    est = np.where(has[:, None], (agg[:, 1:] + missing[:, None] * reference[None, :]) / denom[:, None],
                   reference[None, :])
    return est, has


def percentile_ranks(x: np.ndarray) -> np.ndarray:
    """Percentile ranks over all N with average ties: ``rankdata(x, 'average') / N`` in ``(0, 1]``."""
    return rankdata(x, method="average") / x.size


def quantile_map(values: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The empirical quantile function of ``values`` with linear interpolation, evaluated at ``q``.

    Identical to ``numpy.quantile(values, q, method="linear")`` (tested), computed with one sort for all
    N probabilities instead of a selection per probability.
    """
    x = np.sort(values)
    h = (x.size - 1) * np.clip(q, 0.0, 1.0)
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, x.size - 1)
    frac = h - lo
    # numpy's _lerp form, so results match numpy.quantile bit for bit where possible
    diff = x[hi] - x[lo]
    out = x[lo] + diff * frac
    return np.where(frac >= 0.5, x[hi] - diff * (1 - frac), out)


@dataclass
class HalfLifePrediction:
    """The complete score for one half-life (arrays over all N tasks; stats columns are ``m, v, d``)."""

    history: TaskHistory
    within: np.ndarray
    within_has: np.ndarray
    cross: np.ndarray
    cross_has: np.ndarray
    prior: np.ndarray
    posterior: np.ndarray
    v_direct: np.ndarray
    v_reconstructed: np.ndarray
    q: np.ndarray
    score: np.ndarray


@dataclass
class Prediction:
    """Both half-lives, the combined priority and the reference they were computed against."""

    reference: np.ndarray
    long: HalfLifePrediction
    short: HalfLifePrediction
    decline: np.ndarray
    informativeness: np.ndarray
    q: np.ndarray

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


def _one_half_life(hist: TaskHistory, relations: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
                   reference: np.ndarray, config: SchedulerConfig) -> HalfLifePrediction:
    (within, within_has), (cross, cross_has) = relations
    if config.use_within_edges and config.use_cross_edges:
        w = config.within_fusion_weight
        prior = w * within + (1.0 - w) * cross
    elif config.use_within_edges:
        prior = within
    elif config.use_cross_edges:
        prior = cross
    else:
        prior = np.broadcast_to(reference, within.shape).copy()
    n0 = config.prior_strength
    W = hist.weight[:, None]
    posterior = (n0 * prior + W * hist.values) / (n0 + W)
    m, v, d = posterior[:, 0], posterior[:, 1], posterior[:, 2]
    v_rec = d * m * (1.0 - m)
    a = config.reconstruction_weight
    q = (1.0 - a) * percentile_ranks(v) + a * percentile_ranks(v_rec)
    score = quantile_map(v, q)
    return HalfLifePrediction(history=hist, within=within, within_has=within_has, cross=cross, cross_has=cross_has,
                              prior=prior, posterior=posterior, v_direct=v, v_reconstructed=v_rec, q=q,
                              score=score)


def relation_operators(graph: DualRelationGraph) -> tuple[sp.csc_matrix, sp.csc_matrix]:
    """``(within, cross)`` operators of a graph (build once, reuse every step)."""
    n = graph.num_nodes
    return (relation_operator(graph.within_index, graph.within_weight, n),
            relation_operator(graph.cross_index, graph.cross_weight, n))


def predict(history: History, graph: DualRelationGraph, config: SchedulerConfig,
            operators: tuple[sp.csc_matrix, sp.csc_matrix] | None = None) -> Prediction | None:
    """Informativeness of every task from the history so far; ``None`` before any scored observation.

    ``operators`` (from :func:`relation_operators`) saves rebuilding the neighbour matrices every step.
    """
    reference = history.global_reference()
    if reference is None:
        return None
    ops = operators if operators is not None else relation_operators(graph)
    centered = history.centered_observations(reference)
    h_long = history.task_history(config.long_half_life, reference, centered)
    h_short = history.task_history(config.short_half_life, reference, centered)
    # both half-lives propagate in one sparse product per relation (the observed set is the same)
    both = np.concatenate([h_long.values, h_short.values], axis=1)
    rel = []
    for op in ops:
        est, has = propagate(both, h_long.observed, op, np.concatenate([reference, reference]))
        rel.append(((est[:, :3], has), (est[:, 3:], has)))
    long = _one_half_life(h_long, (rel[0][0], rel[1][0]), reference, config)
    short = _one_half_life(h_short, (rel[0][1], rel[1][1]), reference, config)
    decline = np.maximum(0.0, long.score - short.score)
    info = 0.5 * (long.score + short.score) - config.decline_penalty * decline
    info = np.maximum(info, 0.0)
    return Prediction(reference=reference, long=long, short=short, decline=decline, informativeness=info,
                      q=percentile_ranks(info))
