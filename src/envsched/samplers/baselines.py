"""Published task-selection baselines as :class:`~envsched.samplers.base.BaseSampler` subclasses.

Each follows its paper and its authors' public code as summarised in
``shared/reference/task-selection-methods.md``, including how the authors' trainer feeds it candidates (its
data loader) and when it runs each rule (its training loop):

* :class:`DynamicSamplingSampler` -- uniform selection plus DAPO's dynamic sampling (Yu et al., 2025):
  all-pass/all-fail groups are dropped after their rollouts and the training batch is refilled from
  further generation rounds. Selection is the trainer's business in DAPO, so the sampler only declares
  the filter (:attr:`post_filter`, :meth:`keep_group`); the benchmark runner does the refilling and counts
  every dropped rollout as spent (``update`` is called on every group, before filtering).
* :class:`MoPPSSampler` -- Model Predictive Prompt Selection (Qu et al., 2025): a Beta posterior per task;
  the trainer's data loader gives ``candidate_ratio * n`` candidates per step (consecutive slices of a fresh
  random order of the pool each epoch), one Thompson draw each, keep the ``n`` closest to ``target`` (0.5).
* :class:`GRESOSampler` -- GRESO selective rollout (Zheng et al., 2025): the trainer walks its data loader
  (a fresh random order of the pool each epoch) and skips a task whose last ``k`` groups were all
  zero-variance with probability ``1 - max(p**k, floor)``; ``p`` is self-tuned toward the zero-variance
  targets once per training step, from the second epoch; residual zero-variance groups are filtered
  DS-style (:attr:`post_filter`).
* :class:`PLRSampler` -- Prioritized Level Replay (Jiang et al., 2021): rank prioritisation of a per-task
  score (mean absolute advantage of its last group) mixed with staleness; with the code's default
  ``min_seen_fraction`` (its ``rho``) 1.0 every task is played once before any replay.

Graded rewards (shares of checks passed) are used as fractional successes wherever a method assumes
binary rewards; each class says how.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

import envsched.validation as _check
from envsched.errors import InvalidValueError, StateError
from envsched.pool.pool import TaskPool
from envsched.samplers.base import BaseSampler, GroupResult
from envsched.samplers.simple import UniformSampler
from envsched.validation import check_int, check_number, is_number

__all__ = ["DynamicSamplingSampler", "GRESOSampler", "MoPPSSampler", "PLRSampler", "is_mixed", "load_loader_state",
           "loader_batch"]


def is_mixed(rewards: Sequence[float | None]) -> bool:
    """DAPO's keep rule: a group is kept iff its scored rewards are not all equal (``0 < acc < 1`` for
    binary rewards). Unscored rollouts (``None``) are ignored; a group with < 2 scored rollouts is dropped."""
    scored = [float(r) for r in rewards if r is not None]
    return len(scored) >= 2 and max(scored) - min(scored) > 0


def loader_batch(rng: np.random.Generator, order: np.ndarray, cursor: int,
                 size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The next batch of ``size`` candidates from a trainer's data loader, as the authors' trainers of MoPPS
    and DPS read it (a ``StatefulDataLoader`` over a ``RandomSampler`` with ``drop_last=True``): the pool in
    a fresh random order every epoch, taken in consecutive slices of ``size``, the epoch's last short slice
    dropped. ``order`` and ``cursor`` are the stream so far (``cursor == len(order)``: used up, the next
    batch starts an epoch). Returns the candidates and the stream's new ``order`` and ``cursor``; nothing is
    assigned, so a caller commits them only once its whole draw succeeded."""
    if order.size - cursor < size:
        order, cursor = rng.permutation(order.size).astype(np.int64), 0
    return order[cursor:cursor + size], order, cursor + size


def load_loader_state(extra: Mapping[str, Any], n: int) -> tuple[np.ndarray, int]:
    """A saved loader stream (``extra["order"]``, ``extra["cursor"]``) over ``n`` tasks, checked: the order a
    permutation of the tasks, the cursor within it."""
    order = _check.int_array(extra["order"], "order", length=n, high=max(n - 1, 0))
    if not np.array_equal(np.sort(order), np.arange(n)):
        raise StateError("order", "is not a permutation of the tasks")
    cursor = _check.whole(extra["cursor"], "cursor", high=n)
    return order, cursor


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
    (the paper's formula; the public ``PosteriorSampler.train`` writes the successes as the success rate times
    ``n``, the same update, except that with ``n = 1`` its conditional expression sets both counts to 8).
    Each ``sample(n)`` takes the next ``m = min(N, candidate_ratio * n)`` candidates from the trainer's data
    loader as the authors' trainer builds it (``our_ray_trainer.py``: a loader batch of ``ts_ratio *
    gen_batch_size`` prompts, a fresh random order of the pool each epoch, the last short slice dropped; see
    :func:`loader_batch`), draws one ``gamma ~ Beta(alpha, beta)`` per candidate and returns the ``n`` with the
    smallest ``(gamma - target)**2`` (``sample_batch``, strategy ``topk``). Only the returned tasks are
    rolled out and updated. Rewards are mapped to [0, 1] through the declared reward range.

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
        n = len(self.tasks)
        self.alpha = np.full(n, self.prior[0])
        self.beta = np.full(n, self.prior[1])
        self._order = np.arange(n, dtype=np.int64)  # the loader's stream: one random order per epoch
        self._cursor = n  # used up: the first sample() starts an epoch

    def _select(self, n: int) -> list[int]:
        pool = len(self.tasks)  # an infinite ratio (accepted) takes the whole pool
        size = min(pool, max(n, round(min(self.candidate_ratio, pool) * n)))
        cand, order, cursor = loader_batch(self._rng, self._order, self._cursor, size)
        gamma = self._rng.beta(self.alpha[cand], self.beta[cand])
        chosen = cand[np.argsort((gamma - self.target) ** 2, kind="stable")[:n]]
        self._order, self._cursor = order, cursor  # commit
        return chosen.tolist()

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
        return {"alpha": self.alpha.tolist(), "beta": self.beta.tolist(), "order": self._order.tolist(),
                "cursor": self._cursor}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        # alpha <- lam alpha + (1 - lam) alpha0 + s never falls below alpha0 (nor beta below beta0), and grows
        # by at most one per rollout
        extra = _check.mapping(extra, "", keys=("alpha", "beta", "order", "cursor"))
        n = len(self.tasks)
        params = []
        for name, p0 in (("alpha", self.prior[0]), ("beta", self.prior[1])):
            params.append(_check.float_array(extra[name], name, length=n, low=p0 * (1 - 1e-9),
                                             high=p0 + _check.MAX_COUNT))
        order, cursor = load_loader_state(extra, n)
        (self.alpha, self.beta), self._order, self._cursor = params, order, cursor


class GRESOSampler(BaseSampler):
    """GRESO: probabilistic skipping of tasks with a run of zero-variance groups, on the trainer's data loader.

    Per task: ``k`` = number of consecutive most recent zero-variance groups and whether that run is
    *easy* (rewards at the top: mean >= ``easy_threshold``) or *hard* (``DataProfiler``'s
    ``easy_probabilistic_skip`` and ``hard_probabilistic_skip``). (GRESO tracks easy = all correct, hard =
    all wrong for binary rewards; with graded rewards a zero-variance group counts as easy when its mean is
    at least ``easy_threshold`` = 0.5 of the reward range.) A task's keep probability is
    ``max(p_e**k, floor)`` (easy run) or ``max(p_h**k, floor)`` (hard run), 1 when ``k = 0``.

    **Candidate stream** (``ray_trainer.py``, ``filter_examples_all_probabilistic``): the trainer walks its data
    loader, a fresh random order of the whole pool each epoch, and draws keep-or-skip for each task it
    meets; a skipped task is passed over for the rest of that epoch. ``sample(n)`` walks on from where the
    previous call stopped until ``n`` tasks are kept, starting a new epoch when the order is used up (the
    tasks already in the batch then go to the end of the new order, so that a batch never holds a task
    twice). With nothing skipped this is uniform sampling without replacement per epoch. If a call has met
    every task of the pool without keeping ``n``, the tasks it skipped fill the batch, in the order it first
    skipped them (the authors' trainer would read on through further epochs; this bounds a call's work).

    **Self-tuning, once per training step from the second epoch** (``ray_trainer.py``): over all groups
    generated in the step (every generation round), if the easy (hard) zero-variance share is at least
    ``target_zero_variance / 3`` (``2 * target_zero_variance / 3``), ``p_e`` (``p_h``) decreases by
    ``rate_step``, else increases, clipped to ``rate_bounds``; the shares are then reset. The rates stay at
    ``initial_rate`` while the loader is in its first epoch.

    **Training steps.** Residual zero-variance groups are filtered DS-style (:attr:`post_filter`,
    :meth:`keep_group`): a trainer that honours the filter, as the benchmark does, generates rounds of
    ``sample()`` until the kept (mixed) groups fill its training batch or ``max_gen_rounds`` rounds have run,
    then trains. The sampler counts the same to know where a step ends: at a ``sample()`` call, the step
    under way has ended if the groups reported since it began hold at least ``train_batch_size`` kept groups
    (``None``: the size of the step's first round, the benchmark's rule) or ``max_gen_rounds`` rounds were
    drawn. A trainer that trains on every batch (no filter) passes ``max_gen_rounds=1``: each ``sample()``
    then begins a step.
    """

    post_filter: ClassVar[bool] = True

    def __init__(self, tasks: TaskPool | Sequence[Any], seed: int | None = 0, *, floor: float = 0.01,
                 target_zero_variance: float = 0.25, initial_rate: float = 0.5, rate_step: float = 0.01,
                 rate_bounds: tuple[float, float] = (0.05, 0.95), easy_threshold: float = 0.5,
                 max_gen_rounds: int = 10, train_batch_size: int | None = None,
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True) -> None:
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
        if train_batch_size is not None:
            train_batch_size = check_int(train_batch_size, "train_batch_size", low=1)
        self.floor = float(floor)
        self.target_zero_variance = float(target_zero_variance)
        self.initial_rate = float(initial_rate)
        self.rate_step = float(rate_step)
        self.rate_bounds = (float(lo), float(hi))
        self.easy_threshold = float(easy_threshold)
        self.max_gen_rounds = max_gen_rounds
        self.train_batch_size = train_batch_size
        self.p_easy = self.initial_rate
        self.p_hard = self.initial_rate
        n = len(self.tasks)
        self.run_length = np.zeros(n, dtype=np.int64)
        self.run_easy = np.zeros(n, dtype=bool)
        # the loader: one random order per epoch; ``epoch`` counts the orders drawn (1 = the first epoch)
        self.epoch = 0
        self._order = np.arange(n, dtype=np.int64)
        self._cursor = n
        # the training step under way: groups, easy and hard zero-variance groups reported in it; kept (mixed)
        # groups; generation rounds (sample calls) drawn; the training batch size it fills
        self._window = [0, 0, 0]
        self._kept = 0
        self._rounds = 0
        self._step_batch = 0

    keep_group = staticmethod(is_mixed)

    def keep_probability(self) -> np.ndarray:
        """Current keep probability of every task."""
        return self._keep_probability(np.arange(len(self.tasks)), self.p_easy, self.p_hard)

    def _keep_probability(self, idx: np.ndarray, p_easy: float, p_hard: float) -> np.ndarray:
        k = self.run_length[idx]
        p = np.where(self.run_easy[idx], p_easy, p_hard)
        return np.where(k > 0, np.maximum(p ** k, self.floor), 1.0)

    def _tuned(self) -> tuple[float, float]:
        """The rates after the self-tuning of the step that ends now (not assigned)."""
        groups, easy, hard = self._window
        if groups == 0 or self.epoch < 2:  # nothing generated, or still the first epoch: frozen
            return self.p_easy, self.p_hard
        lo, hi = self.rate_bounds
        t = self.target_zero_variance
        p_easy = float(np.clip(self.p_easy + (-self.rate_step if easy / groups >= t / 3 else self.rate_step), lo, hi))
        p_hard = float(np.clip(self.p_hard + (-self.rate_step if hard / groups >= 2 * t / 3 else self.rate_step),
                               lo, hi))
        return p_easy, p_hard

    def _select(self, n: int) -> list[int]:
        p_easy, p_hard = self.p_easy, self.p_hard
        window, kept, rounds, step_batch = self._window, self._kept, self._rounds, self._step_batch
        if rounds > 0 and (kept >= step_batch or rounds >= self.max_gen_rounds):  # the training step ended
            p_easy, p_hard = self._tuned()
            window, kept, rounds = [0, 0, 0], 0, 0
        if rounds == 0:
            step_batch = self.train_batch_size if self.train_batch_size is not None else n
        chosen, order, cursor, epoch = self._walk(n, p_easy, p_hard)
        # commit (nothing below can fail)
        self.p_easy, self.p_hard = p_easy, p_hard
        self._window, self._kept, self._rounds, self._step_batch = window, kept, rounds + 1, step_batch
        self._order, self._cursor, self.epoch = order, cursor, epoch
        return chosen

    def _walk(self, n: int, p_easy: float, p_hard: float) -> tuple[list[int], np.ndarray, int, int]:
        """Walk the loader from the cursor until ``n`` tasks are kept (class docstring); returns the kept tasks
        and the loader's new order, cursor and epoch (nothing assigned)."""
        size = len(self.tasks)
        order, cursor, epoch = self._order, self._cursor, self.epoch
        in_batch = np.zeros(size, dtype=bool)
        met = np.zeros(size, dtype=bool)  # met by this call's walk
        kept: list[np.ndarray] = []
        skipped: list[np.ndarray] = []  # first skips, in walk order
        n_kept = n_met = 0
        chunk = max(2 * n, 64)
        while n_kept < n:
            if cursor >= order.size:  # a new epoch; the tasks of this batch go last
                order = self._rng.permutation(size).astype(np.int64)
                if n_kept:
                    mask = in_batch[order]
                    order = np.concatenate([order[~mask], order[mask]])
                cursor, epoch = 0, epoch + 1
            seg = order[cursor:cursor + chunk]
            keep = (self._rng.random(seg.size) < self._keep_probability(seg, p_easy, p_hard)) & ~in_batch[seg]
            new = ~met[seg]
            end = seg.size
            hit = np.flatnonzero(np.cumsum(keep) >= n - n_kept)
            if hit.size:
                end = int(hit[0]) + 1
            hit = np.flatnonzero(n_met + np.cumsum(new) >= size)
            if hit.size:
                end = min(end, int(hit[0]) + 1)
            seg, keep, new = seg[:end], keep[:end], new[:end]
            kept.append(seg[keep])
            skipped.append(seg[~keep & new])
            in_batch[seg[keep]] = True
            met[seg] = True
            n_kept += int(keep.sum())
            n_met += int(new.sum())
            cursor += end
            chunk *= 2
            if n_kept < n and n_met >= size:  # every task met: the skipped ones fill the batch
                rest = np.concatenate(skipped)
                kept.append(rest[~in_batch[rest]][:n - n_kept])
                break
        return np.concatenate(kept).tolist(), order, cursor, epoch

    def _observe(self, group: GroupResult) -> None:
        i = group.position
        self._window[0] += 1
        self._kept += int(group.has_signal)
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
        return {"p_easy": self.p_easy, "p_hard": self.p_hard, "epoch": float(self.epoch),
                "tasks_in_zero_variance_run": float((self.run_length > 0).sum())}

    def _extra_state(self) -> dict[str, Any]:
        return {"p_easy": self.p_easy, "p_hard": self.p_hard, "run_length": self.run_length.tolist(),
                "run_easy": self.run_easy.tolist(), "window": list(self._window), "kept": self._kept,
                "rounds": self._rounds, "step_batch": self._step_batch, "epoch": self.epoch,
                "order": self._order.tolist(), "cursor": self._cursor}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        extra = _check.mapping(extra, "", keys=("p_easy", "p_hard", "run_length", "run_easy", "window", "kept",
                                                "rounds", "step_batch", "epoch", "order", "cursor"))
        n = len(self.tasks)
        lo, hi = self.rate_bounds  # _tuned clips both rates to these
        pe = _check.finite(extra["p_easy"], "p_easy", low=lo, high=hi)
        ph = _check.finite(extra["p_hard"], "p_hard", low=lo, high=hi)
        rl = _check.int_array(extra["run_length"], "run_length", length=n)
        re_ = _check.bool_array(extra["run_easy"], "run_easy", length=n)
        window = _check.int_array(extra["window"], "window", length=3).tolist()
        if window[1] + window[2] > window[0]:
            raise StateError("window", f"counts more zero-variance groups than groups: {window}")
        kept = _check.whole(extra["kept"], "kept", high=window[0] - window[1] - window[2])
        rounds = _check.whole(extra["rounds"], "rounds", high=self.max_gen_rounds)
        step_batch = _check.whole(extra["step_batch"], "step_batch", low=1 if rounds else 0)
        epoch = _check.whole(extra["epoch"], "epoch")
        order, cursor = load_loader_state(extra, n)
        if epoch == 0 and cursor != n:
            raise StateError("cursor", f"must be {n} (nothing walked) before the first epoch, got {cursor}")
        self.run_length, self.run_easy, self.p_easy, self.p_hard, self._window = rl, re_, pe, ph, window
        self._kept, self._rounds, self._step_batch = kept, rounds, step_batch
        self.epoch, self._order, self._cursor = epoch, order, cursor


class PLRSampler(BaseSampler):
    """Prioritized Level Replay over tasks (levels).

    Score ``S_i``: mean absolute advantage ``mean |r - mean(r)|`` of the task's last scored group (the
    bandit form of PLR's mean ``|GAE|``), smoothed ``S <- (1 - score_ema) S + score_ema * new``
    (``score_ema = 1``: the last group, the code default). Replay distribution over *seen* tasks (those
    with a scored group): ``P = (1 - rho) P_S + rho P_C`` with ``P_S ∝ (1 / rank(S))**(1 / beta)`` and
    staleness ``P_C ∝ c - C_i`` (``c`` = tasks drawn so far, ``C_i`` = draw count at the task's last draw).

    Replay schedule (``LevelSampler.sample``, the default ``proportionate`` schedule): a draw replays from
    ``P`` with probability ``|seen| / |all|`` once the seen share reaches ``min_seen_fraction`` (the code's
    ``rho``, "minimum size of replay set relative to total number of levels before sampling replays"),
    else it takes an unseen task uniformly. The code's default 1.0 plays every task once before any replay;
    0.0 is the paper's proportionate rule from the first step. Tasks already in the batch are excluded from
    later draws of the same batch: when every unseen task is in it, the rest of the batch replays.

    Args:
        temperature: ``beta`` (0.1).
        staleness_coef: ``rho`` of the replay distribution (0.1).
        score_ema: weight of the newest score (1.0).
        min_seen_fraction: the seen share from which draws may replay (the code's ``level_replay_rho``, 1.0).
    """

    def __init__(self, tasks: TaskPool | Sequence[Any], seed: int | None = 0, *, temperature: float = 0.1,
                 staleness_coef: float = 0.1, score_ema: float = 1.0, min_seen_fraction: float = 1.0,
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True) -> None:
        super().__init__(tasks, seed=seed, reward_range=reward_range, require_dispatch=require_dispatch)
        check_number(temperature, "temperature", low=0, low_open=True, finite=False)
        check_number(staleness_coef, "staleness_coef", low=0, high=1)
        check_number(score_ema, "score_ema", low=0, high=1, low_open=True)
        check_number(min_seen_fraction, "min_seen_fraction", low=0, high=1)
        self.temperature = float(temperature)
        self.staleness_coef = float(staleness_coef)
        self.score_ema = float(score_ema)
        self.min_seen_fraction = float(min_seen_fraction)
        n = len(self.tasks)
        self.scores = np.zeros(n)
        self.seen = np.zeros(n, dtype=bool)
        self.last_draw = np.zeros(n, dtype=np.int64)
        self.draws = 0

    @classmethod
    def from_record(cls, tasks: TaskPool | Sequence[Any], record: Mapping[str, Any], **resources: Any) -> BaseSampler:
        """As :meth:`BaseSampler.from_record`; a record without ``min_seen_fraction`` was written when PLR
        replayed from its second step, so it is rebuilt with ``min_seen_fraction=0.0`` and resumes the draws it
        recorded."""
        params = dict(record["sampler_params"])
        params.setdefault("min_seen_fraction", 0.0)
        return cls(tasks, **params)

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
        # each replay draw then ranks the eligible ones by a cumulative count over that order, O(N) instead of
        # a sort per draw. The distribution is the one replay_distribution() builds, value for value.
        # computed on locals and committed at the end, so a draw that fails leaves the sampler as it was
        chosen: list[int] = []
        draws = self.draws
        taken = np.zeros(len(self.tasks), dtype=bool)
        n_tasks = len(self.tasks)
        seen_idx = np.flatnonzero(self.seen)
        by_score = seen_idx[np.argsort(-self.scores[seen_idx], kind="stable")]
        n_seen = int(seen_idx.size)
        p_seen = n_seen / n_tasks
        may_replay = n_seen > 0 and p_seen >= self.min_seen_fraction
        unseen = ~self.seen  # unseen and not in the batch
        seen_left = n_seen  # seen and not in the batch
        for k in range(n):
            any_unseen = bool(unseen.any())
            # proportionate schedule: replay with probability |seen| / |all| once the seen share allows it; an
            # unseen task otherwise, or a replay when every unseen task is in the batch already
            replay = not any_unseen or (may_replay and seen_left > 0 and self._rng.random() < p_seen)
            if not replay:
                cand = np.flatnonzero(unseen)
                i = int(cand[self._rng.integers(cand.size)])
                unseen[i] = False
            else:
                seen_left -= 1
                weights = self._replay_from_order(by_score, taken, draws)
                if not weights.sum() > 0:  # every task is in the batch already; cannot happen for n <= N
                    raise RuntimeError(f"no task left to draw at draw {k}")
                i = int(self._rng.choice(n_tasks, p=weights / weights.sum()))
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
            raise StateError(f"scores[{i}]", f"must be 0 for a task not seen yet, got {sc[i]!r}")
        ld = _check.int_array(extra["last_draw"], "last_draw", length=n, high=draws)
        self.scores, self.seen, self.last_draw, self.draws = sc, seen, ld, draws
