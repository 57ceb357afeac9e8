"""Published task-selection baselines as :class:`~envsched.samplers.base.BaseSampler` subclasses.

Each follows its paper and public code as summarised in ``shared/reference/task-selection-methods.md``:

* :class:`DynamicSamplingSampler` -- uniform selection plus DAPO's dynamic sampling (Yu et al., 2025):
  all-pass/all-fail groups are dropped after their rollouts and the training batch is refilled from
  further generation rounds. Selection is the trainer's business in DAPO, so the sampler only declares
  the filter (:attr:`post_filter`, :meth:`keep_group`); the benchmark runner does the refilling and counts
  every dropped rollout as spent (``update`` is called on every group, before filtering).
* :class:`MoPPSSampler` -- Model Predictive Prompt Selection (Qu et al., 2025): a Beta posterior per task,
  one Thompson draw per candidate of a random pool of ``candidate_ratio * n`` tasks, keep the ``n`` whose
  draw is closest to ``target`` (0.5).
* :class:`GRESOSampler` -- GRESO selective rollout (Zheng et al., 2025): skip a task whose last ``k``
  groups were all zero-variance with probability ``1 - max(p**k, floor)``, ``p`` self-tuned per step toward
  the zero-variance targets; residual zero-variance groups are filtered DS-style (:attr:`post_filter`).
* :class:`PLRSampler` -- Prioritized Level Replay (Jiang et al., 2021): rank prioritisation of a per-task
  score (mean absolute advantage of its last group) mixed with staleness, and unseen tasks drawn with
  probability ``1 - |seen| / |all|``.

Graded rewards (shares of checks passed) are used as fractional successes wherever a method assumes
binary rewards; each class says how.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from envsched.errors import InvalidValueError, check_int, check_number, is_number
from envsched.pool.pool import TaskPool
from envsched.samplers import _validate as _check
from envsched.samplers.base import BaseSampler, GroupResult
from envsched.samplers.simple import UniformSampler

__all__ = ["DynamicSamplingSampler", "GRESOSampler", "MoPPSSampler", "PLRSampler", "is_mixed"]


def is_mixed(rewards: Sequence[float | None]) -> bool:
    """DAPO's keep rule: a group is kept iff its scored rewards are not all equal (``0 < acc < 1`` for
    binary rewards). Unscored rollouts (``None``) are ignored; a group with < 2 scored rollouts is dropped."""
    scored = [float(r) for r in rewards if r is not None]
    return len(scored) >= 2 and max(scored) - min(scored) > 0


class DynamicSamplingSampler(UniformSampler):
    """Uniform selection with DAPO dynamic sampling (see the module docstring).

    Args:
        max_gen_rounds: DAPO's ``max_num_gen_batches`` (10): after this many generation rounds without a
            full batch of kept groups, the trainer trains on what it has.

    The runner reads :attr:`post_filter` and calls :meth:`keep_group` on every group after reporting it
    with ``update``.
    """

    post_filter: ClassVar[bool] = True

    def __init__(self, tasks: TaskPool | Sequence[Any], seed: int | None = 0, *, max_gen_rounds: int = 10,
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True) -> None:
        super().__init__(tasks, seed=seed, reward_range=reward_range, require_dispatch=require_dispatch)
        max_gen_rounds = check_int(max_gen_rounds, "max_gen_rounds", low=1)
        self.max_gen_rounds = max_gen_rounds

    @staticmethod
    def keep_group(rewards: Sequence[float | None]) -> bool:
        """DAPO's filter: keep mixed groups only."""
        return is_mixed(rewards)


class MoPPSSampler(BaseSampler):
    """MoPPS: per-task ``Beta(alpha, beta)`` and Thompson sampling toward ``target``.

    After a group of ``k`` scored rollouts with (fractional) successes ``s = sum(rewards)``:
    ``alpha <- lam * alpha + (1 - lam) * alpha0 + s`` and ``beta <- lam * beta + (1 - lam) * beta0 + (k - s)``
    (the paper's formula, not the public code's rescaled line). Each ``sample(n)`` draws a candidate pool
    of ``min(N, candidate_ratio * n)`` distinct tasks uniformly, one ``gamma ~ Beta(alpha, beta)`` each, and
    returns the ``n`` with the smallest ``(gamma - target)**2``. Rewards are mapped to [0, 1] through the
    declared reward range.

    Args:
        candidate_ratio: ``B_hat / B`` (public scripts: 8 for Countdown/Geometry3k, 16 for MATH).
        forgetting: ``lam`` (1.0 = plain accumulation; 0.5 in the Countdown/Geometry3k scripts).
        target: ``gamma*`` (0.5).
        prior: ``(alpha0, beta0)``.
    """

    def __init__(self, tasks: TaskPool | Sequence[Any], seed: int | None = 0, *, candidate_ratio: float = 8.0,
                 forgetting: float = 0.5, target: float = 0.5, prior: tuple[float, float] = (1.0, 1.0),
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True) -> None:
        super().__init__(tasks, seed=seed, reward_range=reward_range, require_dispatch=require_dispatch)
        check_number(candidate_ratio, "candidate_ratio", low=1, finite=False)
        check_number(forgetting, "forgetting", low=0, high=1)
        check_number(target, "target", low=0, high=1)
        if not isinstance(prior, Sequence) or len(prior) != 2 or not all(is_number(p) and p > 0 for p in prior):
            raise InvalidValueError(f"prior must be two positive numbers (alpha0, beta0), got {prior!r}", name="prior",
                                    value=prior)
        self.candidate_ratio = float(candidate_ratio)
        self.forgetting = float(forgetting)
        self.target = float(target)
        self.prior = (float(prior[0]), float(prior[1]))
        self.alpha = np.full(len(self.tasks), self.prior[0])
        self.beta = np.full(len(self.tasks), self.prior[1])

    def _select(self, n: int) -> list[int]:
        size = min(len(self.tasks), max(n, round(self.candidate_ratio * n)))
        cand = self._rng.choice(len(self.tasks), size=size, replace=False)
        gamma = self._rng.beta(self.alpha[cand], self.beta[cand])
        order = np.argsort((gamma - self.target) ** 2, kind="stable")
        return cand[order[:n]].tolist()

    def _observe(self, group: GroupResult) -> None:
        if group.scored.size == 0:
            return
        low, high = self.reward_range
        x = (group.scored - low) / (high - low)
        s, k = float(x.sum()), float(x.size)
        i, lam = group.position, self.forgetting
        self.alpha[i] = lam * self.alpha[i] + (1 - lam) * self.prior[0] + s
        self.beta[i] = lam * self.beta[i] + (1 - lam) * self.prior[1] + (k - s)

    def posterior_mean(self) -> np.ndarray:
        """``alpha / (alpha + beta)`` per task."""
        return self.alpha / (self.alpha + self.beta)

    def _extra_metrics(self) -> dict[str, float]:
        return {"mean_posterior_p": float(self.posterior_mean().mean())}

    def _extra_state(self) -> dict[str, Any]:
        return {"alpha": self.alpha.tolist(), "beta": self.beta.tolist()}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        # alpha <- lam alpha + (1 - lam) alpha0 + s never falls below alpha0 (nor beta below beta0), and grows
        # by at most one per rollout
        extra = _check.mapping(extra, "", keys=("alpha", "beta"))
        n = len(self.tasks)
        params = []
        for name, p0 in (("alpha", self.prior[0]), ("beta", self.prior[1])):
            params.append(_check.float_array(extra[name], name, length=n, low=p0 * (1 - 1e-9),
                                             high=p0 + _check.MAX_COUNT))
        self.alpha, self.beta = params


class GRESOSampler(BaseSampler):
    """GRESO: probabilistic skipping of tasks with a run of zero-variance groups.

    Per task: ``k`` = number of consecutive most recent zero-variance groups and whether that run is
    *easy* (rewards at the top: mean >= ``easy_threshold``) or *hard*. (GRESO tracks easy = all correct,
    hard = all wrong for binary rewards; with graded rewards a zero-variance group counts as easy when its
    mean is at least ``easy_threshold`` = 0.5 of the reward range.) ``sample(n)`` walks a random
    permutation and keeps a task with probability ``max(p_e**k, floor)`` (easy) or ``max(p_h**k, floor)``
    (hard), 1 when ``k = 0``, until ``n`` are kept (if the walk ends short, skipped tasks fill in, in walk
    order). Self-tuning at each ``sample``: over the groups reported since the previous one, if the easy
    (hard) zero-variance share exceeds ``target_zero_variance / 3`` (``2 * target_zero_variance / 3``),
    ``p_e`` (``p_h``) decreases by ``rate_step``, else increases, clipped to ``[0.05, 0.95]``.
    Residual zero-variance groups are filtered DS-style (:attr:`post_filter`, :meth:`keep_group`).
    """

    post_filter: ClassVar[bool] = True

    def __init__(self, tasks: TaskPool | Sequence[Any], seed: int | None = 0, *, floor: float = 0.01,
                 target_zero_variance: float = 0.25, initial_rate: float = 0.5, rate_step: float = 0.01,
                 rate_bounds: tuple[float, float] = (0.05, 0.95), easy_threshold: float = 0.5,
                 max_gen_rounds: int = 10, reward_range: tuple[float, float] | None = None,
                 require_dispatch: bool = True) -> None:
        super().__init__(tasks, seed=seed, reward_range=reward_range, require_dispatch=require_dispatch)
        check_number(floor, "floor", low=0, high=1, low_open=True)
        check_number(target_zero_variance, "target_zero_variance", low=0, high=1, low_open=True, high_open=True)
        check_number(initial_rate, "initial_rate")
        check_number(rate_step, "rate_step")
        check_number(easy_threshold, "easy_threshold")
        if not isinstance(rate_bounds, Sequence) or len(rate_bounds) != 2 or not all(map(is_number, rate_bounds)):
            raise InvalidValueError(f"rate_bounds must be two numbers (low, high), got {rate_bounds!r}",
                                    name="rate_bounds", value=rate_bounds)
        lo, hi = rate_bounds
        if not 0.0 < lo <= initial_rate <= hi <= 1.0:
            raise ValueError(f"need 0 < rate_bounds[0] <= initial_rate <= rate_bounds[1] <= 1, got "
                             f"{initial_rate!r}, {rate_bounds!r}")
        max_gen_rounds = check_int(max_gen_rounds, "max_gen_rounds", low=1)
        self.floor = float(floor)
        self.target_zero_variance = float(target_zero_variance)
        self.initial_rate = float(initial_rate)
        self.rate_step = float(rate_step)
        self.rate_bounds = (float(lo), float(hi))
        self.easy_threshold = float(easy_threshold)
        self.max_gen_rounds = max_gen_rounds
        self.p_easy = self.initial_rate
        self.p_hard = self.initial_rate
        n = len(self.tasks)
        self.run_length = np.zeros(n, dtype=np.int64)
        self.run_easy = np.zeros(n, dtype=bool)
        self._window = [0, 0, 0]  # groups, easy zero-variance, hard zero-variance since the last sample

    keep_group = staticmethod(is_mixed)

    def keep_probability(self) -> np.ndarray:
        """Current keep probability of every task."""
        k = self.run_length
        p = np.where(self.run_easy, self.p_easy, self.p_hard)
        return np.where(k > 0, np.maximum(p ** k, self.floor), 1.0)

    def _tune(self) -> None:
        groups, easy, hard = self._window
        if groups == 0:
            return
        lo, hi = self.rate_bounds
        t = self.target_zero_variance
        self.p_easy = float(np.clip(self.p_easy + (-self.rate_step if easy / groups > t / 3 else self.rate_step),
                                    lo, hi))
        self.p_hard = float(np.clip(self.p_hard + (-self.rate_step if hard / groups > 2 * t / 3 else self.rate_step),
                                    lo, hi))
        self._window = [0, 0, 0]

    def _select(self, n: int) -> list[int]:
        self._tune()
        order = self._rng.permutation(len(self.tasks))
        keep = self._rng.random(order.size) < self.keep_probability()[order]
        kept = order[keep]
        if kept.size >= n:
            return kept[:n].tolist()
        return np.concatenate([kept, order[~keep][: n - kept.size]]).tolist()

    def _observe(self, group: GroupResult) -> None:
        i = group.position
        self._window[0] += 1
        if group.scored.size == 0:
            return
        if group.has_signal:
            self.run_length[i] = 0
            return
        low, high = self.reward_range
        easy = (float(group.scored.mean()) - low) / (high - low) >= self.easy_threshold
        if self.run_length[i] > 0 and self.run_easy[i] != easy:
            self.run_length[i] = 0
        self.run_length[i] += 1
        self.run_easy[i] = easy
        self._window[1 if easy else 2] += 1

    def _extra_metrics(self) -> dict[str, float]:
        return {"p_easy": self.p_easy, "p_hard": self.p_hard,
                "tasks_in_zero_variance_run": float((self.run_length > 0).sum())}

    def _extra_state(self) -> dict[str, Any]:
        return {"p_easy": self.p_easy, "p_hard": self.p_hard, "run_length": self.run_length.tolist(),
                "run_easy": self.run_easy.tolist(), "window": list(self._window)}

    def _select_checkpoint(self) -> Any:
        return self.p_easy, self.p_hard, list(self._window)  # _tune moves these before the draw

    def _select_rollback(self, checkpoint: Any) -> None:
        self.p_easy, self.p_hard, self._window = checkpoint

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        extra = _check.mapping(extra, "", keys=("p_easy", "p_hard", "run_length", "run_easy", "window"))
        n = len(self.tasks)
        lo, hi = self.rate_bounds  # _tune clips both rates to these
        pe = _check.finite(extra["p_easy"], "p_easy", low=lo, high=hi)
        ph = _check.finite(extra["p_hard"], "p_hard", low=lo, high=hi)
        rl = _check.int_array(extra["run_length"], "run_length", length=n)
        re_ = _check.bool_array(extra["run_easy"], "run_easy", length=n)
        window = _check.int_array(extra["window"], "window", length=3).tolist()
        if window[1] + window[2] > window[0]:
            raise _check.StateError("window", f"counts more zero-variance groups than groups: {window}")
        self.run_length, self.run_easy, self.p_easy, self.p_hard, self._window = rl, re_, pe, ph, window


class PLRSampler(BaseSampler):
    """Prioritized Level Replay over tasks (levels).

    Score ``S_i``: mean absolute advantage ``mean |r - mean(r)|`` of the task's last scored group (the
    bandit form of PLR's mean ``|GAE|``), smoothed ``S <- (1 - score_ema) S + score_ema * new``
    (``score_ema = 1``: the last group, the code default). Replay distribution over *seen* tasks:
    ``P = (1 - rho) P_S + rho P_C`` with ``P_S ∝ (1 / rank(S))**(1 / beta)`` and staleness
    ``P_C ∝ c - C_i`` (``c`` = tasks drawn so far, ``C_i`` = draw count at the task's last draw). Each
    draw takes an unseen task (uniformly) with probability ``1 - |seen| / |all|``, else replays from
    ``P``. Tasks already in the batch are excluded from later draws of the same batch.

    Args:
        temperature: ``beta`` (0.1).
        staleness_coef: ``rho`` (0.1).
        score_ema: weight of the newest score (1.0).
    """

    def __init__(self, tasks: TaskPool | Sequence[Any], seed: int | None = 0, *, temperature: float = 0.1,
                 staleness_coef: float = 0.1, score_ema: float = 1.0,
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True) -> None:
        super().__init__(tasks, seed=seed, reward_range=reward_range, require_dispatch=require_dispatch)
        check_number(temperature, "temperature", low=0, low_open=True, finite=False)
        check_number(staleness_coef, "staleness_coef", low=0, high=1)
        check_number(score_ema, "score_ema", low=0, high=1, low_open=True)
        self.temperature = float(temperature)
        self.staleness_coef = float(staleness_coef)
        self.score_ema = float(score_ema)
        n = len(self.tasks)
        self.scores = np.zeros(n)
        self.seen = np.zeros(n, dtype=bool)
        self.last_draw = np.zeros(n, dtype=np.int64)
        self.draws = 0

    def replay_distribution(self, exclude: np.ndarray | None = None) -> np.ndarray:
        """``P_replay`` over all tasks (0 for unseen and excluded ones); all zeros if none is eligible."""
        eligible = self.seen.copy()
        if exclude is not None:
            eligible &= ~exclude
        out = np.zeros(len(self.tasks))
        if not eligible.any():
            return out
        idx = np.flatnonzero(eligible)
        s = self.scores[idx]
        order = np.argsort(-s, kind="stable")
        ranks = np.empty(idx.size)
        ranks[order] = np.arange(1, idx.size + 1)
        ps = (1.0 / ranks) ** (1.0 / self.temperature)
        ps /= ps.sum()
        stale = (self.draws - self.last_draw[idx]).astype(float)
        pc = stale / stale.sum() if stale.sum() > 0 else np.full(idx.size, 1.0 / idx.size)
        out[idx] = (1 - self.staleness_coef) * ps + self.staleness_coef * pc
        return out

    def _select(self, n: int) -> list[int]:
        # Scores do not change while a batch is drawn, so the seen tasks are ordered by score once per batch;
        # each draw then ranks the eligible ones by a cumulative count over that order, O(N) instead of a
        # sort per draw. The distribution is the one replay_distribution() builds, value for value.
        # computed on locals and committed at the end, so a draw that fails leaves the sampler as it was
        chosen: list[int] = []
        draws = self.draws
        taken = np.zeros(len(self.tasks), dtype=bool)
        n_tasks = len(self.tasks)
        seen_idx = np.flatnonzero(self.seen)
        by_score = seen_idx[np.argsort(-self.scores[seen_idx], kind="stable")]
        n_seen = int(seen_idx.size)
        for _ in range(n):
            unseen = ~self.seen & ~taken
            p_unseen = 1.0 - n_seen / n_tasks
            replay = self._replay_from_order(by_score, taken, draws)
            if unseen.any() and (self._rng.random() < p_unseen or replay.sum() == 0):
                cand = np.flatnonzero(unseen)
                i = int(cand[self._rng.integers(cand.size)])
            elif replay.sum() > 0:
                i = int(self._rng.choice(n_tasks, p=replay / replay.sum()))
            else:  # every task is in the batch already; cannot happen for n <= N
                raise RuntimeError("no task left to draw")
            chosen.append(i)
            taken[i] = True
            draws += 1
        # a task drawn in this batch is excluded from its later draws, so its new last_draw was never read
        self.last_draw[chosen] = np.arange(self.draws + 1, draws + 1)
        self.draws = draws
        return chosen

    def _replay_from_order(self, by_score: np.ndarray, taken: np.ndarray, draws: int) -> np.ndarray:
        """:meth:`replay_distribution` (``exclude=taken``) from the seen tasks already ordered by score, with
        ``draws`` tasks drawn so far."""
        out = np.zeros(len(self.tasks))
        order = by_score[~taken[by_score]]
        if order.size == 0:
            return out
        idx = np.flatnonzero(self.seen & ~taken)
        slot = np.empty(len(self.tasks), dtype=np.int64)
        slot[idx] = np.arange(idx.size)
        ranks = np.empty(idx.size)
        ranks[slot[order]] = np.arange(1, idx.size + 1)
        ps = (1.0 / ranks) ** (1.0 / self.temperature)
        ps /= ps.sum()
        stale = (draws - self.last_draw[idx]).astype(float)
        pc = stale / stale.sum() if stale.sum() > 0 else np.full(idx.size, 1.0 / idx.size)
        out[idx] = (1 - self.staleness_coef) * ps + self.staleness_coef * pc
        return out

    def _observe(self, group: GroupResult) -> None:
        if group.scored.size == 0:
            return
        low, high = self.reward_range
        x = (group.scored - low) / (high - low)
        s = float(np.abs(x - x.mean()).mean())
        i = group.position
        self.scores[i] = s if not self.seen[i] else (1 - self.score_ema) * self.scores[i] + self.score_ema * s
        self.seen[i] = True

    def _extra_metrics(self) -> dict[str, float]:
        return {"seen_fraction": float(self.seen.mean())}

    def _extra_state(self) -> dict[str, Any]:
        return {"scores": self.scores.tolist(), "seen": self.seen.tolist(), "last_draw": self.last_draw.tolist(),
                "draws": self.draws}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        extra = _check.mapping(extra, "", keys=("scores", "seen", "last_draw", "draws"))
        n = len(self.tasks)
        draws = _check.whole(extra["draws"], "draws")
        seen = _check.bool_array(extra["seen"], "seen", length=n)
        # a score is a mean absolute deviation of rewards mapped to [0, 1] (at most 0.5), or its average; an
        # unseen task has none yet
        sc = _check.float_array(extra["scores"], "scores", length=n, low=0.0, high=0.5 + 1e-9)
        if (sc[~seen] != 0).any():
            i = int(np.flatnonzero(~seen & (sc != 0))[0])
            raise _check.StateError(f"scores[{i}]", f"must be 0 for a task not seen yet, got {sc[i]!r}")
        ld = _check.int_array(extra["last_draw"], "last_draw", length=n, high=draws)
        self.scores, self.seen, self.last_draw, self.draws = sc, seen, ld, draws
