"""Stage 3 of EnvSched, batch scheduling: what each preset hands the batch builder, and what it reports about the batch.

A policy turns the prediction and the history into one complete :class:`BatchInputs` -- the coverage slots, the
environment order and the task score of the coverage phase, the exploitation score, where the concentration
caps apply -- so that :func:`~envsched.method.scheduling.batch.build_batch` applies one set of rules to whatever
the preset chose, and returns a :class:`PolicyTrace` of the values it computed (the explanation records'
``adaptive`` part and the ``adaptive_*`` metrics).

- :class:`PaperPolicy` (``SchedulerConfig.paper()``): the paper's rules (2.4, C): ``round(coverage_share * n)``
  coverage slots; coverage orders environments by fewer cumulative selections and tasks by fewest observations,
  then informativeness; exploitation by informativeness; the caps apply to every task.
- :class:`AdaptivePolicy` (``SchedulerConfig()``, ours): each of the default's rules replaces the paper's part
  it is switched on for (:mod:`envsched.method.history.signal`), the paper's part stays where it is off (the
  ablations of one rule): the online coverage share (``adaptive_share``), the UCB environment order and the
  optimistic task score of coverage (``adaptive_coverage``), the caps only on declining tasks
  (``caps_on_decline_only``); and, where ``exploitation_score="signal_probability"`` (off in the default, whose
  exploitation ranks by the paper's informativeness), the group-signal probability in exploitation instead.

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
           "make_policy"]


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
        signal_alpha, signal_beta: ``(N,)`` the per-task Beta posterior on the mean reward.
        exploitation_score, coverage_score: ``(N,)`` the default's exploitation and coverage scores.
        caps_active: ``(N,)`` bool, where the caps applied.
    """

    explained: bool = False
    share: float | None = None
    coverage_yield: float | None = None
    exploitation_yield: float | None = None
    coverage_slots: int | None = None
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
               rng: np.random.Generator) -> tuple[BatchInputs, PolicyTrace]:
        """The inputs of a batch of ``n`` and their trace. ``tiebreak``: the batch's ``(N,)`` uniform draws;
        ``rng``: the sampler's generator (a policy that draws from it must draw the same way for the same
        state, so that batches are deterministic given the seed)."""
        ...


class PaperPolicy:
    """The paper's rules (2.4, C); its trace records nothing (the explanation records' ``adaptive`` is null)."""

    name = "paper"

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config

    def inputs(self, n: int, history: History, prediction: Prediction, tiebreak: np.ndarray,
               rng: np.random.Generator) -> tuple[BatchInputs, PolicyTrace]:
        info = prediction.informativeness
        inputs = BatchInputs(coverage_slots=self.config.coverage_slots_for(n),
                             env_order=history.env_selection_counts(), coverage_score=info,
                             coverage_fewest_observed_first=True, exploitation_score=info,
                             caps_active=np.ones(info.shape[0], dtype=bool))
        return inputs, PolicyTrace()


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

    def inputs(self, n: int, history: History, prediction: Prediction, tiebreak: np.ndarray,
               rng: np.random.Generator) -> tuple[BatchInputs, PolicyTrace]:
        c, h = self.config, history
        info = prediction.informativeness
        cap = c.coverage_slots_for(n)
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
            # optimistic signal probability; the predictive mean breaks the ties of wide posteriors. Elementwise,
            # so in a large pool computed only for the tasks coverage ranks (LazyScores): coverage reads about one
            # environment per slot, a small share of the pool where n environments are
            def coverage_of(a: np.ndarray, b: np.ndarray, m: np.ndarray | None, tb: np.ndarray) -> np.ndarray:
                m = signal.mixed_probability(a, b, g) if m is None else m
                return signal.optimistic_signal(a, b, g, c.ucb_quantile) + 1e-3 * m + 1e-12 * tb

            if n * LazyScores.eager_fraction <= self.env_size_weight.size:
                coverage = LazyScores(info.shape[0], lambda p, a=alpha, b=beta, m=mixed: coverage_of(
                    a[p], b[p], None if m is None else m[p], tiebreak[p]))
            else:
                coverage = coverage_of(alpha, beta, mixed, tiebreak)
            trace["coverage_score"] = coverage
            s_e, k_e = signal.env_signal(h, c.long_half_life)
            ucb = signal.beta_quantile(1.0 + s_e, 1.0 + k_e - s_e, c.ucb_quantile)
            never = env_counts == 0
            env_order = -np.where(never, np.inf, ucb * self.env_size_weight)  # the higher priority first
        caps_active = np.ones(info.shape[0], dtype=bool)
        if c.caps_on_decline_only:
            caps_active = trace["caps_active"] = signal.declining(h, c.long_half_life, c.short_half_life)
        slots = cap
        if c.adaptive_share and c.mode == "full":
            y = signal.phase_yields(h, c.yield_half_life)
            y_cov = (1.0 + y["coverage"][0]) / (2.0 + y["coverage"][1])
            y_exp = (1.0 + y["exploitation"][0]) / (2.0 + y["exploitation"][1])
            share = min(max(y_cov / (y_cov + y_exp), c.coverage_share_floor), c.coverage_share)  # cap wins
            k = round(share * n)
            never_selected = int((env_counts == 0).sum())
            slots = min(cap, max(k, never_selected))
            trace.update(share=share, coverage_yield=y_cov, exploitation_yield=y_exp)
        inputs = BatchInputs(coverage_slots=slots, env_order=env_order, coverage_score=coverage,
                             coverage_fewest_observed_first=not c.adaptive_coverage,
                             exploitation_score=exploitation, caps_active=caps_active)
        return inputs, PolicyTrace(explained=True, coverage_slots=slots, **trace)


def make_policy(config: SchedulerConfig, env_codes: np.ndarray, num_envs: int) -> SchedulingPolicy:
    """The policy of ``config``: :class:`PaperPolicy` when every adaptive rule is off
    (:attr:`SchedulerConfig.is_paper`), else :class:`AdaptivePolicy`."""
    if config.is_paper:
        return PaperPolicy(config)
    return AdaptivePolicy(config, env_codes, num_envs)
