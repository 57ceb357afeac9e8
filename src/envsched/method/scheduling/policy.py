"""Stage 3 of EnvSched, batch scheduling: what each preset hands the batch builder, and what it reports about the batch.

A policy turns the prediction and the history into one complete :class:`BatchInputs` -- the coverage slots, the
environment order and the task score of the coverage phase, the exploitation score, where the concentration
caps apply -- so that :func:`~envsched.method.scheduling.batch.build_batch` applies one set of rules to whatever
the preset chose, and returns a :class:`PolicyTrace` of the values it computed (the explanation records'
``adaptive`` part and the ``adaptive_*`` metrics).

- :class:`PaperPolicy` (``SchedulerConfig.paper()``): the paper's rules (2.4, C): ``round(coverage_share * n)``
  coverage slots (a batch too small for one carries a coverage debt, below); coverage orders environments by
  fewer cumulative selections and tasks by fewest observations, then informativeness; exploitation by
  informativeness; the caps apply to every task.
- :class:`AdaptivePolicy` (``SchedulerConfig()``, ours): each of the default's rules replaces the paper's part
  it is switched on for (:mod:`envsched.method.history.signal`), the paper's part stays where it is off (the
  ablations of one rule): the online coverage share (``adaptive_share``), the UCB environment order and the
  optimistic task score of coverage (``adaptive_coverage``), the caps only on declining tasks
  (``caps_on_decline_only``); and, where ``exploitation_score="signal_probability"`` (off in the default, whose
  exploitation ranks by the paper's informativeness), the group-signal probability in exploitation instead.

**Coverage debt.** A batch too small to hold a coverage slot -- ``round(share * n) = 0`` with a positive share, as
every ``sample(1)`` of an asynchronous trainer drawing one group at a time is -- would never get a coverage pick.
Both policies carry the unrounded share of such batches across draws as a debt (:func:`settle_coverage_debt`):
the batch adds ``share * n`` to it, and once it reaches 0.5 (where ``round`` gives a slot) the batch gets one
coverage slot and the debt drops by 1. A run of ``sample(1)`` then spends on coverage the share of its draws that
a batch of 64 spends of its slots. A batch whose own rounded slots are one or more leaves the debt as it is, so
batches of 64 draw what they drew without it. The sampler keeps the debt in its state (``extra.coverage_debt``).

:func:`make_policy` chooses the policy of a configuration. A new rule is a new field of :class:`BatchInputs`
(with the paper's value supplied by :class:`PaperPolicy`) or a new policy; the batch builder never asks which
preset it runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from envsched.method.config import SchedulerConfig
from envsched.method.history import signal
from envsched.method.history.prediction import Prediction
from envsched.method.history.statistics import History

__all__ = ["AdaptivePolicy", "BatchInputs", "LazyScores", "PaperPolicy", "PolicyTrace", "SchedulingPolicy",
           "make_policy", "settle_coverage_debt"]

#: A coverage debt stays in ``[-DEBT_BOUND, DEBT_BOUND)`` (:func:`settle_coverage_debt`); a saved state's is checked
#: against it.
DEBT_BOUND = 0.5


def settle_coverage_debt(slots: int, share: float, n: int, debt: float) -> tuple[int, float]:
    """The coverage slots of a batch of ``n`` whose policy gave it ``slots`` at coverage share ``share``, and the
    coverage debt after it, ``debt`` before.

    A batch with ``slots >= 1``, or with no share, leaves the debt as it is. A batch with no slot adds its unrounded
    share ``share * n`` to the debt; when the debt then reaches 0.5 (the point where ``round`` gives a slot), the
    batch gets one coverage slot -- for ``n = 1`` its only task, though a batch of one leaves no exploitation slot --
    and the debt drops by 1. The debt so stays in ``[-0.5, 0.5)``, and over a long run of such batches the coverage
    picks come to ``share * n`` per batch, as in a batch large enough to round it."""
    if slots > 0 or share <= 0.0:
        return slots, debt
    debt += share * n
    if debt >= DEBT_BOUND:
        return 1, debt - 1.0
    return 0, debt


class LazyScores:
    """An ``(N,)`` float score computed task by task when first read, then kept.

    ``compute(positions)`` returns the scores of ``positions`` (distinct, ascending ``int64``); it must be
    elementwise -- a task's value may not depend on which other tasks are computed with it -- so every read gives
    the value the whole array would hold. Reads: ``scores[i]`` (a float), ``scores[positions]`` (an array),
    ``numpy.asarray(scores)`` (all N, computing the rest). The batch builder reads a score only for the
    candidates it ranks: coverage looks at a few environments' tasks per batch, so a score over the whole pool
    that only coverage reads (the adaptive coverage score: three log-beta and two square roots per task) costs
    ``O(tasks read)`` instead of ``O(N)``. Once a read would bring the computed share to ``1 / eager_fraction``
    of the pool, every remaining task is computed at once (a small pool, whose batch reads most of it, then pays
    one computation, not one per read).
    """

    dtype = np.dtype(np.float64)
    ndim = 1
    #: a read that would bring the computed tasks to ``N / eager_fraction`` computes all of them
    eager_fraction = 8

    def __init__(self, n: int, compute: Callable[[np.ndarray], np.ndarray]) -> None:
        self._values = np.empty(int(n))
        self._known = np.zeros(int(n), dtype=bool)
        self._count = 0
        self._compute = compute

    @property
    def shape(self) -> tuple[int]:
        return self._values.shape

    @property
    def size(self) -> int:
        return self._values.size

    def __len__(self) -> int:
        return self._values.size

    def _fill(self, missing: np.ndarray) -> None:
        """Compute ``missing`` (positions not computed yet, maybe repeated), or every task left."""
        if (self._count + missing.size) * self.eager_fraction >= self._values.size:
            todo = np.flatnonzero(~self._known)
        else:
            todo = np.unique(missing)
        self._values[todo] = self._compute(todo)
        self._known[todo] = True
        self._count += todo.size

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, np.ndarray) and index.dtype.kind in "iu" and index.ndim == 1:  # the batch builder's
            known = self._known[index]
            if not known.all():
                self._fill(np.where(index < 0, index + self.size, index)[~known].astype(np.int64))
            return self._values[index]
        if isinstance(index, int | np.integer):
            i = int(index)
            if not self._known[i]:
                self._fill(np.array([i if i >= 0 else i + self.size], dtype=np.int64))
            return self._values[i]
        positions = np.asarray(np.arange(self.size)[index], dtype=np.int64).reshape(-1)  # slices, masks, lists
        if not self._known[positions].all():
            self._fill(positions[~self._known[positions]])
        return self._values[index]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self._count < self.size:
            self._fill(np.flatnonzero(~self._known))
        return self._values.astype(dtype) if dtype is not None else self._values.copy()

    def computed(self) -> int:
        """How many tasks' scores were computed so far."""
        return self._count


@dataclass(frozen=True, eq=False)
class BatchInputs:
    """Everything a policy decides for one batch (after cold start); no field is optional.

    Attributes:
        coverage_slots: slots of the coverage phase (the rest goes to exploitation).
        env_order: ``(E,)`` coverage order of the environments after their current-step coverage level, the
            smaller first (the paper: cumulative selections).
        coverage_score: ``(N,)`` the task score inside the chosen environments (the paper: informativeness); an
            array or a :class:`LazyScores` (the default's, computed for the tasks coverage ranks).
        coverage_fewest_observed_first: whether coverage takes the fewest-observed tasks of the environments
            first and ranks them by ``coverage_score`` after that (the paper), or ranks by the score alone.
        exploitation_score: ``(N,)`` the base score of exploitation and fill (before the exposure discount and
            the similarity penalty; the paper: informativeness).
        caps_active: ``(N,)`` bool, where the consecutive cap and the exposure discount apply (the paper:
            everywhere).
    """

    coverage_slots: int
    env_order: np.ndarray
    coverage_score: np.ndarray | LazyScores
    coverage_fewest_observed_first: bool
    exploitation_score: np.ndarray
    caps_active: np.ndarray


#: The batch-level values of a trace, in the order the explanation records and ``state_dict`` write them.
TRACE_SUMMARY_KEYS: tuple[str, ...] = ("share", "coverage_yield", "exploitation_yield", "coverage_slots")


@dataclass(frozen=True, eq=False)
class PolicyTrace:
    """What a policy computed for one batch: the explanation records' ``adaptive`` part and the ``adaptive_*``
    metrics. A ``None`` value is a rule that did not run for this batch (switched off, or the paper's rules).

    Attributes:
        explained: whether the explanation records carry an ``adaptive`` part (``False``: the paper's rules,
            whose records say ``"adaptive": null``).
        share, coverage_yield, exploitation_yield: the online coverage share and the two phases' signal
            yields it came from.
        coverage_slots: the coverage slots the policy chose.
        coverage_debt: the coverage debt after this batch (:func:`settle_coverage_debt`; ``None``: no policy ran).
        signal_alpha, signal_beta: ``(N,)`` the per-task Beta posterior on the mean reward.
        exploitation_score, coverage_score: ``(N,)`` the default's exploitation and coverage scores.
        caps_active: ``(N,)`` bool, where the caps applied.
    """

    explained: bool = False
    share: float | None = None
    coverage_yield: float | None = None
    exploitation_yield: float | None = None
    coverage_slots: int | None = None
    coverage_debt: float | None = None
    signal_alpha: np.ndarray | None = None
    signal_beta: np.ndarray | None = None
    exploitation_score: np.ndarray | None = None
    coverage_score: np.ndarray | LazyScores | None = None
    caps_active: np.ndarray | None = None

    def summary(self) -> dict[str, float]:
        """The batch-level values that ran, as floats (the ``last_adaptive`` entry of ``state_dict``)."""
        return {k: float(getattr(self, k)) for k in TRACE_SUMMARY_KEYS if getattr(self, k) is not None}

    @classmethod
    def from_summary(cls, summary: Mapping[str, float]) -> PolicyTrace:
        """A trace with the batch-level values of :meth:`summary` (a loaded state: no per-task values)."""
        values = {k: (int(v) if k == "coverage_slots" else float(v)) for k, v in summary.items()}
        return cls(explained=False, **values)

    def metrics(self) -> dict[str, float]:
        """``adaptive_share``, ``adaptive_coverage_yield``, ``adaptive_exploitation_yield`` (NaN: not run)."""
        return {f"adaptive_{k}": math.nan if getattr(self, k) is None else float(getattr(self, k))
                for k in ("share", "coverage_yield", "exploitation_yield")}

    def explain(self, positions: Sequence[int]) -> tuple[dict[str, float], dict[int, dict[str, Any]]] | None:
        """The batch-level values and each picked position's values for the explanation records (``None``: the
        records carry no ``adaptive`` part)."""
        if not self.explained:
            return None

        def val(arr: np.ndarray | None, p: int) -> Any:
            if arr is None:
                return None
            v = arr[p]
            return bool(v) if arr.dtype == bool else float(v)

        per_pos = {p: {"signal_alpha": val(self.signal_alpha, p), "signal_beta": val(self.signal_beta, p),
                       "exploitation_score": val(self.exploitation_score, p),
                       "coverage_score": val(self.coverage_score, p), "caps_active": val(self.caps_active, p)}
                   for p in positions}
        return self.summary(), per_pos


class SchedulingPolicy(Protocol):
    """How a preset turns the prediction into a batch's inputs."""

    #: ``"paper"`` or ``"adaptive"``.
    name: str

    def inputs(self, n: int, history: History, prediction: Prediction, tiebreak: np.ndarray,
               rng: np.random.Generator, coverage_debt: float = 0.0) -> tuple[BatchInputs, PolicyTrace]:
        """The inputs of a batch of ``n`` and their trace. ``tiebreak``: the batch's ``(N,)`` uniform draws;
        ``rng``: the sampler's generator (a policy that draws from it must draw the same way for the same
        state, so that batches are deterministic given the seed); ``coverage_debt``: the debt before this batch
        (:func:`settle_coverage_debt`), the trace's ``coverage_debt`` the debt after it."""
        ...


class PaperPolicy:
    """The paper's rules (2.4, C); its trace records nothing (the explanation records' ``adaptive`` is null)."""

    name = "paper"

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config

    def inputs(self, n: int, history: History, prediction: Prediction, tiebreak: np.ndarray,
               rng: np.random.Generator, coverage_debt: float = 0.0) -> tuple[BatchInputs, PolicyTrace]:
        info = prediction.informativeness
        slots, debt = self.config.coverage_slots_for(n), coverage_debt
        if self.config.mode == "full":
            slots, debt = settle_coverage_debt(slots, self.config.coverage_share, n, debt)
        inputs = BatchInputs(coverage_slots=slots,
                             env_order=history.env_selection_counts(), coverage_score=info,
                             coverage_fewest_observed_first=True, exploitation_score=info,
                             caps_active=np.ones(info.shape[0], dtype=bool))
        return inputs, PolicyTrace(coverage_debt=debt)


class AdaptivePolicy:
    """The default's rules (ours), each where its switch is on; the paper's part of the batch where it is off.

    Scores get ``1e-12 * tiebreak`` added: tasks with the same posterior (every unobserved task of an environment
    without history) would otherwise tie exactly, and an exact tie at the shortlist's edge forces exploitation
    to rescan the whole pool for every pick (the tie goes to the same draw either way).
    """

    name = "adaptive"

    def __init__(self, config: SchedulerConfig, env_codes: np.ndarray, num_envs: int) -> None:
        self.config = config
        sizes = np.bincount(env_codes, minlength=num_envs).astype(float)
        #: ``(E,)`` environment size relative to the mean, to the power ``env_size_power`` (the UCB's weight)
        self.env_size_weight = np.power(sizes / sizes.mean(), config.env_size_power)
        self._n = int(np.asarray(env_codes).size)
        #: each task's coverage score before its tiebreak term and the posterior it is of (:meth:`coverage_score` of
        #: many tasks at once; allocated on the first such call)
        self._coverage_kept: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    #: :meth:`coverage_score` of at least this many positions keeps each task's score before its tiebreak term for
    #: the next call whose posterior of the task is the same (the tasks of environments never selected, whose
    #: posterior moves only with their prior, are most of a large pool and tie first in the coverage order)
    coverage_keep_min: int = 4_096

    def inputs(self, n: int, history: History, prediction: Prediction, tiebreak: np.ndarray,
               rng: np.random.Generator, coverage_debt: float = 0.0) -> tuple[BatchInputs, PolicyTrace]:
        c, h = self.config, history
        info = prediction.informativeness
        trace: dict[str, Any] = {}
        env_counts = h.env_selection_counts()
        need_posterior = c.exploitation_score == "signal_probability" or c.adaptive_coverage
        if need_posterior:
            alpha, beta = signal.signal_posterior(h, prediction.long.prior[:, 0], c.signal_prior_ess, c.long_half_life)
            g = c.rollouts_per_task
            trace.update(signal_alpha=alpha, signal_beta=beta)
        mixed = None
        if c.exploitation_score == "signal_probability" and c.exploitation_rule == "mean":
            mixed = signal.mixed_probability(alpha, beta, g)  # ~1.3 ms at 2,550 tasks: computed once
        exploitation = info
        if c.exploitation_score == "signal_probability":
            if c.exploitation_rule == "mean":
                score = mixed
            elif c.exploitation_rule == "thompson":
                score = signal.group_signal(rng.beta(alpha, beta), g)
            else:
                score = signal.optimistic_signal(alpha, beta, g, c.ucb_quantile)
            exploitation = trace["exploitation_score"] = score + 1e-12 * tiebreak
        coverage, env_order = info, env_counts
        if c.adaptive_coverage:
            # elementwise, so in a large pool computed only for the tasks coverage ranks (LazyScores): coverage
            # reads about one environment per slot, a small share of the pool where n environments are
            if n * LazyScores.eager_fraction <= self.env_size_weight.size:
                coverage = LazyScores(info.shape[0], lambda p, a=alpha, b=beta, m=mixed: self.coverage_score(
                    a[p], b[p], None if m is None else m[p], tiebreak[p], p))
            else:
                coverage = self.coverage_score(alpha, beta, mixed, tiebreak)
            trace["coverage_score"] = coverage
            env_order = self.env_order(h, env_counts)
        caps_active = np.ones(info.shape[0], dtype=bool)
        if c.caps_on_decline_only:
            caps_active = trace["caps_active"] = signal.declining(h, c.long_half_life, c.short_half_life)
        slots, debt, adaptive = self.coverage_slots(n, h, env_counts, coverage_debt)
        trace.update(adaptive)
        inputs = BatchInputs(coverage_slots=slots, env_order=env_order, coverage_score=coverage,
                             coverage_fewest_observed_first=not c.adaptive_coverage,
                             exploitation_score=exploitation, caps_active=caps_active)
        return inputs, PolicyTrace(explained=True, coverage_slots=slots, coverage_debt=debt, **trace)

    def coverage_score(self, alpha: np.ndarray, beta: np.ndarray, mixed: np.ndarray | None,
                       tiebreak: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
        """The coverage task score (``adaptive_coverage``) of tasks with posterior ``alpha``, ``beta``: the optimistic
        signal probability, the predictive mean ``mixed`` (computed here when ``None``; when given, it must be
        ``mixed_probability(alpha, beta)``) breaking the ties of wide posteriors, ``1e-12 * tiebreak`` the exact
        ones. Elementwise. ``positions``: the tasks' positions (distinct); of at least :attr:`coverage_keep_min` of
        them, the score before the tiebreak term is kept per task with its posterior and reused while the
        posterior is the same bit for bit (the same values: each is an elementwise function of it)."""
        if positions is None or positions.size < self.coverage_keep_min:
            return self._coverage_base(alpha, beta, mixed) + 1e-12 * tiebreak
        if self._coverage_kept is None:
            self._coverage_kept = (np.full(self._n, np.nan), np.full(self._n, np.nan), np.zeros(self._n))
        kept_alpha, kept_beta, kept = self._coverage_kept
        new = np.flatnonzero((kept_alpha[positions] != alpha) | (kept_beta[positions] != beta))
        if new.size:
            at = positions[new]
            kept[at] = self._coverage_base(alpha[new], beta[new], None if mixed is None else mixed[new])
            kept_alpha[at], kept_beta[at] = alpha[new], beta[new]
        return kept[positions] + 1e-12 * tiebreak

    def _coverage_base(self, alpha: np.ndarray, beta: np.ndarray, mixed: np.ndarray | None) -> np.ndarray:
        """:meth:`coverage_score` without its tiebreak term (the score is this plus ``1e-12 * tiebreak``)."""
        c = self.config
        g = c.rollouts_per_task
        m = signal.mixed_probability(alpha, beta, g) if mixed is None else mixed
        return signal.optimistic_signal(alpha, beta, g, c.ucb_quantile) + 1e-3 * m

    def env_order(self, history: History, env_counts: np.ndarray) -> np.ndarray:
        """``(E,)`` coverage order of the environments (``adaptive_coverage``), the smaller first: environments
        never selected (``env_counts == 0``), then the higher upper confidence bound of the signal rate times the
        size weight."""
        c = self.config
        s_e, k_e = signal.env_signal(history, c.long_half_life)
        ucb = signal.beta_quantile(1.0 + s_e, 1.0 + k_e - s_e, c.ucb_quantile)
        return -np.where(env_counts == 0, np.inf, ucb * self.env_size_weight)  # the higher priority first

    def coverage_slots(self, n: int, history: History, env_counts: np.ndarray,
                       coverage_debt: float) -> tuple[int, float, dict[str, float]]:
        """The coverage slots of a batch of ``n``, the coverage debt after it (``coverage_debt`` before) and, with
        ``adaptive_share``, the trace's ``share``, ``coverage_yield`` and ``exploitation_yield``. The slots are
        ``coverage_slots_for(n)``, with the online share at most that and at least one per environment never
        selected (``env_counts == 0``), then settled with the debt (:func:`settle_coverage_debt`); outside
        ``mode="full"`` the configuration's slots as they are."""
        c = self.config
        slots = c.coverage_slots_for(n)
        if c.mode != "full":
            return slots, coverage_debt, {}
        share, adaptive = c.coverage_share, {}
        if c.adaptive_share:
            share, y_cov, y_exp = self.share(history)
            never_selected = int(np.count_nonzero(env_counts == 0))
            slots = min(slots, max(round(share * n), never_selected))
            adaptive = {"share": share, "coverage_yield": y_cov, "exploitation_yield": y_exp}
        slots, debt = settle_coverage_debt(slots, share, n, coverage_debt)
        return slots, debt, adaptive

    def share(self, history: History) -> tuple[float, float, float]:
        """The online coverage share (``adaptive_share``) and the two phases' yields it comes from: ``(share,
        coverage yield, exploitation yield)``."""
        c = self.config
        y = signal.phase_yields(history, c.yield_half_life)
        y_cov = (1.0 + y["coverage"][0]) / (2.0 + y["coverage"][1])
        y_exp = (1.0 + y["exploitation"][0]) / (2.0 + y["exploitation"][1])
        share = min(max(y_cov / (y_cov + y_exp), c.coverage_share_floor), c.coverage_share)  # the cap wins
        return share, y_cov, y_exp


def make_policy(config: SchedulerConfig, env_codes: np.ndarray, num_envs: int) -> SchedulingPolicy:
    """The policy of ``config``: :class:`PaperPolicy` when every adaptive rule is off
    (:attr:`SchedulerConfig.is_paper`), else :class:`AdaptivePolicy`."""
    if config.is_paper:
        return PaperPolicy(config)
    return AdaptivePolicy(config, env_codes, num_envs)
