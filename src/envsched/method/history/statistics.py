# Over 700 lines: History and the loaders of its own state_dict, which must agree field by field.
"""Stage 2 of EnvSched, history and prediction: what the scheduler remembers of its rollouts (paper B, B.1).

Every scheduled group becomes one *observation*: the reward mean ``m``, the population variance ``v`` and
the mean-corrected dispersion ``d = v / (m (1 - m))`` of its **scored** rollouts (``None`` rewards never
enter), on the pool's reward scale mapped to [0, 1]. ``d`` is the variance as a share of the largest
variance a reward in [0, 1] with mean ``m`` can have, so ``v`` can be rebuilt as ``d m (1 - m)`` -- the
"second variance estimate" of B.1 (the case studies' numbers satisfy it: F.3 predicts ``m = 0.505``,
``d = 0.387``, so ``d m (1 - m) = 0.097`` against a fused prediction of 0.09).

:class:`History` keeps two append-only logs -- dispatches (what was selected, when, in which phase) and
observations (the statistics of each reported group and the step it was dispatched in) -- and derives
from them, with ``numpy.bincount`` over the logs, everything the prediction needs:

* the **global reference**: the mean ``(m, v, d)`` over the groups of the latest step whose own
  step-level reference exists (at least ``reference_min_fraction`` of its groups observed); before any
  step has one, the first observed batch;
* **centering**: an observation from step ``s`` is shifted by ``reference_now - reference_s``, so that old
  observations made under another global level (the policy improves) are compared at today's level, then
  clipped to ``[0, 0.25]`` for ``v`` and ``[0, 1]`` for ``m`` and ``d``;
* **task histories** for a half-life ``h``: recency-weighted means of a task's centered observations,
  weights ``0.5 ** (age / h)`` with ``age`` in scheduler steps, and their total weight ``W`` (the
  effective number of observed groups); a task without history gets the reference with ``W = 0``;
* counts for coverage (environment selections, task observations), exposure, consecutive selections and
  the progress filter's residuals.

Asynchronous trainers: an update is matched to the oldest outstanding dispatch of its task (FIFO), so a
late group is dated by the step it was drawn in, whatever order the updates arrive in.

**Storage: a live window and decayed statistics** (ours, not in the paper). Every preset stores the history in
one form. The logs hold the observations of a live window of the last ``W`` to ``W + W // 4`` steps; every
``W // 4`` steps the history is *folded*:

* each step older than the window has its step-level reference frozen into its observations (and into its
  dispatches still outstanding), so centring no longer needs the step tables of old steps; a step's reference no
  longer moves once it is folded (a group arriving later than that is centred with the frozen reference);
* the observations of the folded steps that the preset does not keep in the log (below; late groups of earlier
  folded steps included) and the resolved dispatches of those steps are *absorbed* into :class:`DecayedStatistics`
  and exact counters, and leave the logs. Per task and
  half-life (long, short, yield): the recency weight ``W`` of its scored observations, their weighted mean
  relative to the reference and the share of ``W`` whose step had a reference, the signal sums
  :mod:`~envsched.method.history.signal` reads (signal and scorable groups, reward sums and complements, per phase
  for the yields) and the exposure -- O(1) per task and half-life, updated in place at each fold and aged lazily
  by one factor ``0.5 ** (dt / h)`` on read. Per task and environment, exact counts: observations, scored and
  scorable groups, environment selections, exploitation hits;
* the progress filter keeps only the points it reads (the last ``progress_min_transitions + 1``) and a count.

Everything linear in the weights (``W``, signal sums, yields, exposure, the counters) is exact up to rounding.
Centring is exact by design: an observation of step ``s`` is stored as ``x - ref_s`` (its step's frozen
reference), so at the reference ``r`` the absorbed block's centred mean is ``mean + F r`` exactly. The one
estimator change is the clip: the log clips each centred observation, the absorbed block's mean is clipped as
one. A task mean then differs from the full log's by at most ``sum_absorbed w dist(x - ref_s + r, [lo, hi]) / W``
(the absorbed observations' weighted distance to the clip range, relative to the task's whole weight; clipping
is 1-Lipschitz and the exact mean lies in the range), and not at all where no absorbed observation is clipped.
(Clipping each observation when absorbed, on the latest or the window's mean reference, was measured too: a
smaller worst task-mean change, but fewer identical batches; see ``docs/method.md``.)

What a preset chooses is how much stays in the log (:func:`history_window`, :func:`task_horizon`):

* the default (every configuration whose rules are not the paper's): a window of :data:`DECAYED_WINDOW` (16)
  steps, and every observation of a folded step is absorbed. Step time and checkpoints then depend on ``N`` and
  ``B``, not on the length of the run.
* the paper preset: a window of ``H = SchedulerConfig.history_horizon`` steps (from ``history_tolerance``, 1e-9
  by default: 268 steps), and of the folded steps each task keeps in the log, centred and clipped one by one, its
  observations within ``H`` steps of its newest scored one; only older ones are absorbed. With one observation
  per task and step those weigh together less than ``tolerance`` times the task's newest (``H`` is the smallest
  horizon whose tail ``sum_{k >= H} 0.5 ** (k / h)`` is below the tolerance for the longest half-life in use), so
  the block clip moves a task mean by at most the tolerance times the clip distance, and the paper's estimates
  stay within the tolerance of the full log's. The log then holds the last ``H`` steps plus, for a task no
  longer drawn, its observations within ``H`` of its newest (at most ``H + 1``): bounded by the pool, not the
  run. A task whose newest weight underflows to 0.0 (about 1,075 half-lives: 8,600 steps at the default long
  half-life), which has no history in the full log either, has all its rows absorbed.
* ``history_tolerance=0``: nothing is absorbed (the full log, in either preset).

Measured against the full log on the benchmark pool (``benchmarks/decayed_history_deviation.py``, both presets):
see ``docs/method.md``. A state of the logs alone (an older version, or before the first fold) converts on load:
the observations the form would have absorbed by now are absorbed, centred and clipped on the reference at load
(then stored relative to it), which gives the full log's estimates exactly at that step; later they differ from
the log's by at most ``|r - r_load|`` each. A state of the paper preset's earlier form (the same window, its
folds dropping into the counters what they removed from the log) converts the same way: the observations it
kept stay in the log, so its estimates at load are its own.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import envsched.validation as _check
from envsched.errors import StateError
from envsched.method.config import SchedulerConfig
from envsched.method.history.sets import member, union
from envsched.samplers.base import MIN_SIGNAL_ROLLOUTS, group_mean_variance, is_signal_group

__all__ = ["PHASES", "History", "LoggedGroups", "observation_statistics"]

#: Phase codes stored in the dispatch log (index = code).
PHASES: tuple[str, ...] = ("cold_start", "coverage", "exploitation", "fill", "external")
_PHASE_CODE = {p: i for i, p in enumerate(PHASES)}
_OUTSTANDING, _OBSERVED, _DISCARDED = 0, 1, 2


def observation_statistics(scored: np.ndarray,
                           mean_variance: tuple[float, float] | None = None) -> tuple[float, float, float] | None:
    """``(mean, population variance, mean-corrected dispersion)`` of rewards already scaled to [0, 1].

    ``None`` when no reward is scored. Dispersion is ``v / (m (1 - m))`` (0 when ``m`` is 0 or 1, where
    the variance is 0 too), clipped to [0, 1]. ``mean_variance``: the group's mean and variance when the caller
    has them already (:attr:`~envsched.samplers.base.GroupResult.mean_variance01`, the same computation).
    """
    x = np.asarray(scored, dtype=float)
    if x.size == 0:
        return None
    # groups are small: plain floats beat numpy's per-call overhead
    m, v = mean_variance if mean_variance is not None else group_mean_variance(x.tolist())
    denom = m * (1.0 - m)
    d = min(1.0, v / denom) if denom > 1e-12 else 0.0
    return m, v, d


class _Log:
    """A growable table of equal-length numpy columns (amortised O(1) append, O(1) column views)."""

    def __init__(self, columns: dict[str, Any]) -> None:
        self._dtypes = dict(columns)
        self._cap = 256
        self._n = 0
        self._data = {k: np.zeros(self._cap, dtype=t) for k, t in columns.items()}

    def __len__(self) -> int:
        return self._n

    def append(self, **values: Any) -> int:
        if self._n == self._cap:
            self._cap *= 2
            for k, arr in self._data.items():
                new = np.zeros(self._cap, dtype=arr.dtype)
                new[: self._n] = arr[: self._n]
                self._data[k] = new
        for k, v in values.items():
            self._data[k][self._n] = v
        self._n += 1
        return self._n - 1

    def col(self, name: str) -> np.ndarray:
        return self._data[name][: self._n]

    def set(self, name: str, row: int, value: Any) -> None:
        self._data[name][row] = value

    def keep(self, mask: np.ndarray) -> None:
        """Drop the rows where ``mask`` is False (order kept); the capacity shrinks with the table."""
        n = int(mask.sum())
        cap = max(256, 2 * n)
        for k, arr in self._data.items():
            new = np.zeros(cap, dtype=arr.dtype)
            new[:n] = arr[: self._n][mask]
            self._data[k] = new
        self._n, self._cap = n, cap

    def to_lists(self) -> dict[str, list]:
        return {k: self.col(k).tolist() for k in self._data}

    @classmethod
    def from_arrays(cls, columns: dict[str, Any], data: dict[str, np.ndarray]) -> _Log:
        """A log holding ``data`` (one already-checked array per column, equal lengths)."""
        log = cls(columns)
        n = len(data[next(iter(columns))])
        log._cap = max(256, n)
        log._n = n
        for k, t in columns.items():
            arr = np.zeros(log._cap, dtype=t)
            arr[:n] = data[k]
            log._data[k] = arr
        return log


#: ``frozen``: 0 while the row's step is inside the horizon (its reference comes from the step table), 1 once
#: the step's reference is frozen into ``ref_m/ref_v/ref_d``, 2 when the step had no step-level reference
#: (such rows are never shifted).
_LIVE, _FROZEN, _FROZEN_NO_REFERENCE = 0, 1, 2
_REF_COLUMNS = {"ref_m": np.float64, "ref_v": np.float64, "ref_d": np.float64, "frozen": np.int8}
_DISPATCH_COLUMNS = {"pos": np.int64, "step": np.int64, "phase": np.int8, "status": np.int8, **_REF_COLUMNS}
_OBS_COLUMNS = {"pos": np.int64, "step": np.int64, "phase": np.int8, "n_scored": np.int32, "n_rollouts": np.int32,
                "m": np.float64, "v": np.float64, "d": np.float64, "raw_var": np.float64,
                **_REF_COLUMNS}
_REF_DEFAULTS = {"ref_m": 0.0, "ref_v": 0.0, "ref_d": 0.0, "frozen": _LIVE}

#: Live window of the default preset (every configuration whose rules are not the paper's), in steps: the
#: observations of the last ``DECAYED_WINDOW`` to ``DECAYED_WINDOW + DECAYED_WINDOW // 4`` steps stay in the log
#: (centred and clipped one by one, their steps' references still moving with late groups); older ones are absorbed
#: into :class:`DecayedStatistics`.
DECAYED_WINDOW = 16


def history_window(config: SchedulerConfig) -> int | None:
    """The live window of a :class:`History` under ``config``, in steps: ``None`` with ``history_tolerance=0``
    (nothing is absorbed: the full log); the paper preset's (:attr:`SchedulerConfig.is_paper`) the history horizon
    :attr:`SchedulerConfig.history_horizon`; every other configuration's :data:`DECAYED_WINDOW`. The one thing
    a preset changes in how the history is stored (see the module docstring)."""
    if config.history_tolerance == 0:
        return None
    return config.history_horizon if config.is_paper else DECAYED_WINDOW


def task_horizon(config: SchedulerConfig) -> int | None:
    """How far a folded observation may be older than its task's newest scored one and still stay in the log
    (centred and clipped one by one), in steps: the paper preset's history horizon (so its task means stay within
    ``history_tolerance`` of the full log's), ``None`` for every other configuration (a fold absorbs every
    observation of the folded steps) and with the full log."""
    return config.history_horizon if config.is_paper and config.history_tolerance > 0 else None


def decayed_half_lives(config: SchedulerConfig) -> tuple[float, ...]:
    """The half-lives the decayed statistics are kept for: every one the scheduler reads (long, short,
    yield), each once, ascending."""
    return tuple(sorted({float(config.long_half_life), float(config.short_half_life),
                         float(config.yield_half_life)}))


@dataclass
class DecayedSignal:
    """Recency-weighted signal sums of the absorbed observations, aged to the current step (one half-life)."""

    signal: np.ndarray  # (N,): signal groups
    scorable: np.ndarray  # (N,): groups with >= 2 scored rewards
    successes: np.ndarray  # (N,): reward sums of the scored rollouts (rewards in [0, 1])
    failures: np.ndarray  # (N,): complements
    phase_signal: np.ndarray  # (len(PHASES),)
    phase_scorable: np.ndarray  # (len(PHASES),)


@dataclass(frozen=True)
class LoggedGroups:
    """The observed groups still in the log, one row each in log order, as the signal rates read them
    (:meth:`History.logged_groups`; the groups absorbed out of the log are in :meth:`History.decayed_signal`).
    Read-only arrays."""

    task: np.ndarray  # the task's position
    phase: np.ndarray  # the phase code it was dispatched in (PHASES)
    step: np.ndarray  # the step it was dispatched in
    scored: np.ndarray  # its scored rollouts
    successes: np.ndarray  # the reward sum of its scored rollouts (rewards mapped to [0, 1]; 0 when none is scored)
    scorable: np.ndarray  # bool: at least MIN_SIGNAL_ROLLOUTS scored rewards (it can show signal)
    signal: np.ndarray  # bool: a signal group (is_signal_group)


#: ``|x - reference|`` of ``m``, ``v``, ``d`` is at most this (both in the statistic's range)
_MEAN_BOUND = (1.0, 0.25, 1.0)


class DecayedStatistics:
    """O(1) state per task and half-life: exponentially decayed sufficient statistics of the observations
    absorbed out of the log (and of the dispatches, for exposure).

    All weights are valued at step :attr:`at` (a weight is ``0.5 ** ((at - s) / h)`` for an observation of
    step ``s``, above 1 for a step after ``at``) and aged on read by the scalar ``0.5 ** ((now - at) / h)``.
    :meth:`absorb` leaves the stored weights as they are and values the new ones at ``at``; only when ``at`` is
    :attr:`REBASE_HALF_LIVES` of the shortest half-life behind does it age everything to ``now`` first (a
    rebase), so the weights of the tasks a fold does not touch keep their bits (the incremental prediction,
    :mod:`~envsched.method.history.incremental`, relies on it). Per task and half-life: the weight ``W`` of the
    scored observations, their weighted mean of the *reference-relative* statistics ``y = x - ref_s``
    (:meth:`absorb`; ``y = x`` where step ``s`` had no step-level reference, as the log never shifts those) and
    the share ``F`` of ``W`` with a reference, so the centred mean at the reference ``r`` is ``mean + F r`` exactly
    before clipping (then clipped as a block); the signal sums; the exposure. Means and shares do not age (a ratio
    of equally aged sums), so a weight near underflow never makes them imprecise.
    """

    FIELDS = ("weight", "signal", "scorable", "successes", "failures", "exposure")
    #: :meth:`absorb` ages the stored weights to its step (a rebase) once :attr:`at` is this many of the shortest
    #: half-life behind it: new weights stay below ``2 ** REBASE_HALF_LIVES``, far from overflow
    REBASE_HALF_LIVES = 256

    def __init__(self, num_tasks: int, half_lives: tuple[float, ...]) -> None:
        self.half_lives = tuple(half_lives)
        self.at = 0
        n = int(num_tasks)
        self.arrays = {h: {k: np.zeros(n) for k in self.FIELDS} for h in self.half_lives}
        self.mean = {h: np.zeros((n, 3)) for h in self.half_lives}
        self.share = {h: np.zeros(n) for h in self.half_lives}
        self.phase = {h: np.zeros((2, len(PHASES))) for h in self.half_lives}  # signal, scorable per phase
        self.absorbed = False  # whether anything was ever absorbed (until then every read is the log's)

    def _half_life(self, half_life: float) -> float:
        h = float(half_life)
        if h not in self.arrays:
            raise ValueError(f"the decayed history keeps half-lives {list(self.half_lives)}, not {h}")
        return h

    def factor(self, half_life: float, now: int) -> float:
        """The ageing factor from :attr:`at` to ``now``."""
        return 0.5 ** (max(0, now - self.at) / half_life)

    def factor_at(self, half_life: float, anchor: int | None, now: int) -> float:
        """The factor that values the stored weights at ``anchor`` (``None``: at ``now``, :meth:`factor`); an anchor
        before :attr:`at` gives a factor above 1."""
        return self.factor(half_life, now) if anchor is None else 0.5 ** ((anchor - self.at) / half_life)

    def age_to(self, now: int) -> None:
        if now <= self.at:
            return
        for h in self.half_lives:
            f = self.factor(h, now)
            for arr in self.arrays[h].values():
                arr *= f
            self.phase[h] *= f
        self.at = now

    def absorb(self, now: int, obs: dict[str, np.ndarray], dispatch_pos: np.ndarray, dispatch_step: np.ndarray,
               reference: np.ndarray | None, clip: tuple[np.ndarray, np.ndarray]) -> None:
        """Add observation rows (columns ``pos, step, phase, n_scored, m, v, d, ref_m, ref_v, ref_d, frozen``
        with ``frozen != _LIVE``) and dispatch rows, weighted as of ``now``.

        A row of a step with a reference is stored relative to it, ``x - ref_s``, unclipped (``reference`` None:
        every fold of a run); read at the reference ``r`` it counts ``x - ref_s + r`` and the block's mean is
        clipped, which differs from the log's mean of ``clip(x - ref_s + r)`` by at most the mean distance of
        the unclipped values to the clip range. With a ``reference`` (a state converted on load) it is centred
        and clipped there, ``clip(x - ref_s + reference) - reference``: read at ``r`` it differs from the log's
        by at most ``|r - reference|``, and not at all at ``r = reference``."""
        if now - self.at > self.REBASE_HALF_LIVES * min(self.half_lives):
            self.age_to(now)
        pos, n_sc = obs["pos"], obs["n_scored"]
        scored = n_sc > 0
        has = (obs["frozen"] == _FROZEN)[scored]
        p_sc = pos[scored]
        cols = []
        for j, c in enumerate(("m", "v", "d")):
            x = obs[c][scored]
            if reference is None:  # (no scored observation anywhere yet: nothing is shifted)
                cols.append(x - np.where(has, obs[f"ref_{c}"][scored], 0.0))
                continue
            centred = np.clip(x - obs[f"ref_{c}"][scored] + reference[j], clip[0][j], clip[1][j]) - reference[j]
            cols.append(np.where(has, centred, x))
        y = np.stack(cols, axis=1)
        ok = n_sc >= MIN_SIGNAL_ROLLOUTS
        sig = is_signal_group(n_sc, obs["v"])
        succ = np.where(scored, np.nan_to_num(obs["m"]) * n_sc, 0.0)
        # only the tasks with absorbed rows change (every other one would add 0.0): O(rows), not O(N)
        tasks = union(pos, dispatch_pos)
        k = tasks.size
        at_obs, at_sc, at_disp = (np.searchsorted(tasks, pos), np.searchsorted(tasks, p_sc),
                                  np.searchsorted(tasks, dispatch_pos))
        for h in self.half_lives:
            w = np.power(0.5, (self.at - obs["step"]) / h)  # valued at `at`
            a = self.arrays[h]
            ws = w[scored]
            add_w = np.bincount(at_sc, weights=ws, minlength=k)
            total = a["weight"][tasks] + add_w
            upd = np.flatnonzero(add_w > 0)
            if upd.size:
                rows = tasks[upd]
                old = a["weight"][rows]
                t = total[upd]
                t_safe = np.where(t > 0, t, 1.0)
                add_has = np.bincount(at_sc, weights=ws * has, minlength=k)[upd]
                share = np.where(t > 0, (self.share[h][rows] * old + add_has) / t_safe, self.share[h][rows])
                self.share[h][rows] = np.clip(share, 0.0, 1.0)  # (rounding)
                for j, bound in enumerate(_MEAN_BOUND):
                    add = np.bincount(at_sc, weights=ws * y[:, j], minlength=k)[upd]
                    col = self.mean[h][:, j]
                    col[rows] = np.clip(np.where(t > 0, (col[rows] * old + add) / t_safe, col[rows]), -bound, bound)
            a["weight"][tasks] = total
            a["signal"][tasks] += np.bincount(at_obs[sig], weights=w[sig], minlength=k)
            a["scorable"][tasks] += np.bincount(at_obs[ok], weights=w[ok], minlength=k)
            a["successes"][tasks] += np.bincount(at_obs, weights=w * succ, minlength=k)
            a["failures"][tasks] += np.bincount(at_obs, weights=w * (n_sc - succ), minlength=k)
            self.phase[h][0] += np.bincount(obs["phase"][sig], weights=w[sig], minlength=len(PHASES))
            self.phase[h][1] += np.bincount(obs["phase"][ok], weights=w[ok], minlength=len(PHASES))
            a["exposure"][tasks] += np.bincount(at_disp, weights=np.power(0.5, (self.at - dispatch_step) / h),
                                                minlength=k)
        if pos.size or dispatch_pos.size:
            self.absorbed = True

    def task_history(self, half_life: float, now: int, anchor: int | None = None,
                     rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(W (N,), reference-relative mean (N, 3), share with a reference (N,))`` aged to ``now`` (valued at
        ``anchor`` when given, :meth:`factor_at`); of the tasks ``rows`` only when given."""
        h = self._half_life(half_life)
        f = self.factor_at(h, anchor, now)
        if rows is None:
            return self.arrays[h]["weight"] * f, self.mean[h], self.share[h]
        return self.arrays[h]["weight"][rows] * f, self.mean[h][rows], self.share[h][rows]

    def exposure(self, half_life: float, now: int, rows: np.ndarray | None = None) -> np.ndarray:
        h = self._half_life(half_life)
        e = self.arrays[h]["exposure"]
        return (e if rows is None else e[rows]) * self.factor(h, now)

    def signal(self, half_life: float, now: int, anchor: int | None = None) -> DecayedSignal:
        h = self._half_life(half_life)
        f = self.factor_at(h, anchor, now)
        a = self.arrays[h]
        return DecayedSignal(signal=a["signal"] * f, scorable=a["scorable"] * f, successes=a["successes"] * f,
                             failures=a["failures"] * f, phase_signal=self.phase[h][0] * f,
                             phase_scorable=self.phase[h][1] * f)

    # state
    def state(self) -> dict[str, Any]:
        any_ = np.zeros(self.share[self.half_lives[0]].size, dtype=bool)
        for h in self.half_lives:
            for arr in self.arrays[h].values():
                any_ |= arr != 0
        pos = np.flatnonzero(any_)
        per = []
        for h in self.half_lives:
            a = self.arrays[h]
            per.append({"half_life": h, **{k: _check.pack(a[k][pos]) for k in self.FIELDS},
                        "mean": [_check.pack(self.mean[h][pos, j]) for j in range(3)],
                        "share": _check.pack(self.share[h][pos]),
                        "phase_signal": self.phase[h][0].tolist(), "phase_scorable": self.phase[h][1].tolist()})
        return {"at": self.at, "absorbed": self.absorbed, "pos": _check.pack(pos), "half_lives": per}

    @classmethod
    def from_state(cls, raw: Any, num_tasks: int, half_lives: tuple[float, ...], step: int, scored: np.ndarray,
                   scorable: np.ndarray) -> DecayedStatistics:
        """Checked: the half-lives the configuration reads, finite non-negative weights and sums, means in the
        range of a statistic minus a reference, shares in [0, 1], and what the counters allow (every weight is
        at most 1: a task's weight is at most its absorbed scored groups ``scored``, its scorable weight at
        most ``scorable``, signal at most scorable, exposure at most the steps, reward sums at most the groups
        times the largest group)."""
        st = _check.mapping(raw, "decayed", keys=("at", "pos", "half_lives"))
        n = int(num_tasks)
        out = cls(n, half_lives)
        out.at = _check.whole(st["at"], "decayed.at", high=max(step - 1, 0))
        absorbed = st.get("absorbed", True)
        if not isinstance(absorbed, bool):
            raise StateError("decayed.absorbed", f"must be true or false, got {str(absorbed)[:40]!r}")
        out.absorbed = absorbed
        pos = _check.int_array(st["pos"], "decayed.pos", high=n - 1)
        if np.unique(pos).size != pos.size:
            raise StateError("decayed.pos", "names a task twice")
        per = _check.sequence(st["half_lives"], "decayed.half_lives", length=len(half_lives))
        for i, (h, raw_h) in enumerate(zip(out.half_lives, per, strict=True)):
            field = f"decayed.half_lives[{i}]"
            r = _check.mapping(raw_h, field, keys=("half_life", *cls.FIELDS, "mean", "share", "phase_signal",
                                                   "phase_scorable"))
            if _check.finite(r["half_life"], f"{field}.half_life") != h:
                raise StateError(f"{field}.half_life", f"is not the configuration's half-life {h}")
            for k in cls.FIELDS:
                out.arrays[h][k][pos] = _check.float_array(r[k], f"{field}.{k}", length=pos.size, low=0.0)
            a = out.arrays[h]
            slack = 1.0 + 1e-9
            # a weight valued at `at` is at most 2 ** ((step - 1 - at) / h), a group of the latest step's
            grown = slack * 2.0 ** (max(0, step - 1 - out.at) / h)
            caps = {"weight": (scored, grown), "scorable": (scorable, grown), "signal": (a["scorable"], slack),
                    "exposure": (np.full(n, step), grown), "successes": (scored * float(_INT32_MAX), grown),
                    "failures": (scored * float(_INT32_MAX), grown)}
            for k, (cap, allow) in caps.items():
                bad = np.flatnonzero(a[k] > cap * allow + 1e-12)
                if bad.size:
                    i_ = int(np.searchsorted(pos, bad[0]))
                    raise StateError(f"{field}.{k}[{i_}]", f"is more than the absorbed groups allow "
                                                                  f"({float(a[k][bad[0]])!r} > {float(cap[bad[0]])!r})")
            mean = _check.sequence(r["mean"], f"{field}.mean", length=3)
            for j, hi in enumerate(_MEAN_BOUND):
                out.mean[h][pos, j] = _check.float_array(mean[j], f"{field}.mean[{j}]", length=pos.size, low=-hi,
                                                         high=hi)
            out.share[h][pos] = _check.float_array(r["share"], f"{field}.share", length=pos.size, low=0.0, high=1.0)
            for j, k in enumerate(("phase_signal", "phase_scorable")):
                out.phase[h][j] = _check.float_array(r[k], f"{field}.{k}", length=len(PHASES), low=0.0)
            if out.phase[h][1].sum() > float(scorable.sum()) * grown + 1e-12:
                raise StateError(f"{field}.phase_scorable", "is more than the absorbed scorable groups allow")
            if np.any(out.phase[h][0] > out.phase[h][1] * slack + 1e-12):
                raise StateError(f"{field}.phase_signal", "exceeds the scorable groups' weight")
        return out


@dataclass
class TaskHistory:
    """Recency-weighted task histories for one half-life (arrays over all N tasks)."""

    half_life: float
    values: np.ndarray  # (N, 3): centered, weighted mean (m, v, d); the reference where weight == 0
    weight: np.ndarray  # (N,): sum of recency weights of the task's scored observations
    groups: np.ndarray  # (N,): number of scored observations
    #: (N,): the weights valued at the anchor of :meth:`History.task_history` (``weight`` without an anchor)
    anchored_weight: np.ndarray | None = None

    @property
    def observed(self) -> np.ndarray:
        return self.weight > 0


class History:
    """Dispatch and observation logs of one sampler, and the statistics derived from them.

    Args:
        num_tasks: ``N``.
        env_codes: environment index of each task (``int (N,)``).
        num_envs: number of environments.
        config: the scheduler configuration (clip ranges, reference rule, progress filter, the history
            horizon :attr:`SchedulerConfig.history_horizon`).

    Attributes:
        step: batches dispatched so far.
        live_start: the first step whose reference is still computed from its observations (steps before
            it are folded, see the module docstring); 0 until the first fold.
        horizon: the live window in steps (:func:`history_window`), or ``None`` when nothing is ever folded
            (``history_tolerance=0``).
        task_horizon: how far a folded observation may be older than its task's newest scored one and stay in the
            log (:func:`task_horizon`: the paper preset's ``H``); ``None``: every folded observation is absorbed.
        decayed: the absorbed observations' :class:`DecayedStatistics`; ``None`` with the full log.
    """

    def __init__(self, num_tasks: int, env_codes: np.ndarray, num_envs: int, config: SchedulerConfig) -> None:
        self.n = int(num_tasks)
        self.env_codes = np.asarray(env_codes, dtype=np.int64)
        self.num_envs = int(num_envs)
        self.config = config
        self.horizon: int | None = history_window(config)
        self.task_horizon: int | None = task_horizon(config)
        self.decayed: DecayedStatistics | None = (DecayedStatistics(self.n, decayed_half_lives(config))
                                                   if self.horizon is not None else None)
        self.step = 0  # number of batches dispatched so far
        self.live_start = 0
        self.dispatch = _Log(_DISPATCH_COLUMNS)
        self.obs = _Log(_OBS_COLUMNS)
        self._fifo: dict[int, list[int]] = {}
        self.last_selected = np.full(self.n, -10, dtype=np.int64)
        self.run_length = np.zeros(self.n, dtype=np.int64)
        # progress filter: per task its last progress_min_transitions + 1 points (step, v), oldest first, how
        # many of them are stored, and the count of all its points; flat arrays, written once here so that
        # the process's memory does not grow as tasks get observed
        keep = config.progress_min_transitions + 1
        self._progress_step = np.full((self.n, keep), -1, dtype=np.int64)
        self._progress_v = np.full((self.n, keep), 0.0)
        self._progress_len = np.full(self.n, 0, dtype=np.int64)
        self._progress_points = np.full(self.n, 0, dtype=np.int64)
        self.transitions = np.zeros(self.n, dtype=np.int64)
        self.residual = np.full(self.n, np.inf)
        self._batch_sizes: list[int] = []  # sizes of the steps from live_start on
        self._num_observations = 0
        self._latest_observed_step = -1
        # what folding removed from the logs, kept as exact counters
        self._folded_obs = np.zeros(self.n, dtype=np.int64)
        self._folded_scored = np.zeros(self.n, dtype=np.int64)
        self._folded_scorable = np.zeros(self.n, dtype=np.int64)
        self._folded_env_selections = np.zeros(self.num_envs, dtype=np.int64)
        self._folded_exploitation = np.zeros(2, dtype=np.int64)  # scored exploitation groups, hits among them
        self._folded_reference: np.ndarray | None = None  # the latest step-level reference of a folded step
        self._first_reference: np.ndarray | None = None  # the first observed step's reference, once folded
        self._cache: dict[Any, Any] = {}
        #: positions whose logged or absorbed observations, or whose dispatches in flight, changed since the list was
        #: last taken (an observation, a fold, a discard); kept only while a reader set it to a list (the
        #: incremental prediction)
        self.journal: list[Any] | None = None

    # ------------------------------------------------------------------ recording
    def record_batch(self, positions: list[int], phases: list[str]) -> int:
        """Log one dispatched batch (all positions distinct); returns its step index. Folds the history
        every ``horizon // 4`` steps once it is ``horizon`` steps long."""
        s = self.step
        for p, ph in zip(positions, phases, strict=True):
            row = self.dispatch.append(pos=p, step=s, phase=_PHASE_CODE[ph], status=_OUTSTANDING)
            self._fifo.setdefault(p, []).append(row)
            if self.last_selected[p] == s - 1:
                self.run_length[p] += 1
            else:
                self.run_length[p] = 1
            self.last_selected[p] = s
        self._batch_sizes.append(len(positions))
        self.step += 1
        self._cache.clear()
        if self.horizon is not None and self.step - self.live_start >= self.horizon + max(1, self.horizon // 4):
            self.fold(self.step - self.horizon)
        return s

    def _pop_dispatch(self, pos: int, status: int) -> int | None:
        rows = self._fifo.get(pos)
        if not rows:
            return None
        row = rows.pop(0)
        if not rows:
            del self._fifo[pos]
        self.dispatch.set("status", row, status)
        self._cache.clear()
        return row

    def record_discard(self, pos: int) -> None:
        """A dispatched group was dropped: release its oldest dispatch (it never becomes an observation)."""
        if self._pop_dispatch(pos, _DISCARDED) is not None and self.journal is not None:
            self.journal.append(pos)  # (its observation count changed)

    def record_observation(self, pos: int, scored01: np.ndarray, n_rollouts: int, raw_var: float,
                           mean_variance: tuple[float, float] | None = None) -> dict[str, Any]:
        """Log one reported group. ``scored01``: its scored rewards mapped to [0, 1]; ``mean_variance``: their mean
        and variance when known (:func:`observation_statistics`). Returns what was logged."""
        row = self._pop_dispatch(pos, _OBSERVED)
        ref = dict(_REF_DEFAULTS)
        if row is None:  # an update without a dispatch (require_dispatch=False): dated by the last batch
            step, phase = max(self.step - 1, 0), _PHASE_CODE["external"]
        else:
            d = self.dispatch
            step, phase = int(d.col("step")[row]), int(d.col("phase")[row])
            ref = {k: d.col(k)[row] for k in _REF_COLUMNS}  # a dispatch of a folded step: its frozen reference
        stats = observation_statistics(scored01, mean_variance)
        m, v, d = stats if stats is not None else (math.nan, math.nan, math.nan)
        self.obs.append(pos=pos, step=step, phase=phase, n_scored=int(scored01.size), n_rollouts=n_rollouts,
                        m=m, v=v, d=d, raw_var=raw_var, **ref)
        self._num_observations += 1
        self._latest_observed_step = max(self._latest_observed_step, step)
        self._cache.clear()
        if self.journal is not None:
            self.journal.append(pos)
        if stats is not None and scored01.size >= self.config.min_scored_rollouts:
            self._add_progress_point(pos, step, v)
        return {"step": step, "phase": PHASES[phase], "m": m, "v": v, "d": d, "n_scored": int(scored01.size)}

    def _add_progress_point(self, pos: int, step: int, v: float) -> None:
        """Insert a point in the task's points in dispatch order: after every point of its step or earlier
        (those arrived before it), before any of a later step (a late group). Only the last
        ``progress_min_transitions + 1`` are kept (all the filter reads); older points only count."""
        stored = int(self._progress_len[pos])
        steps, values = self._progress_step[pos], self._progress_v[pos]
        at = stored if stored == 0 or steps[stored - 1] <= step else \
            int(np.searchsorted(steps[:stored], step, side="right"))
        if stored < steps.size:  # room left: shift the later points right
            steps[at + 1:stored + 1], values[at + 1:stored + 1] = steps[at:stored], values[at:stored]
            steps[at], values[at] = step, v
            self._progress_len[pos] = stored + 1
        elif at > 0:  # full: the oldest point goes (a point older than all kept ones is dropped at once)
            steps[:at - 1], values[:at - 1] = steps[1:at], values[1:at]
            steps[at - 1], values[at - 1] = step, v
        self._progress_points[pos] += 1
        self._update_residual(pos)

    def _update_residual(self, pos: int) -> None:
        """Progress filter state of one task (appendix C).

        Scorable transitions are consecutive pairs of scorable observations in dispatch order. The estimated
        residual is the one-step linear extrapolation of the task's observed variance over its last
        ``progress_min_transitions`` transitions: ``v_last + (v_last - v_first) / transitions``. It is
        ``<= 0`` when the task has stopped producing reward differences (all-pass or all-fail groups) or
        its variance is falling to zero; a new observation with variance brings it back above 0.
        """
        t = max(0, int(self._progress_points[pos]) - 1)
        self.transitions[pos] = t
        if t == 0:
            self.residual[pos] = np.inf
            return
        k = min(t, self.config.progress_min_transitions)
        stored = int(self._progress_len[pos])
        first, last = self._progress_v[pos, max(stored - k - 1, 0)], self._progress_v[pos, stored - 1]
        self.residual[pos] = last + (last - first) / k

    def _update_residuals(self, pos: np.ndarray) -> None:
        """:meth:`_update_residual` of the tasks ``pos`` at once (the same arithmetic, on arrays)."""
        t = np.maximum(0, self._progress_points[pos] - 1)
        self.transitions[pos] = t
        k = np.minimum(t, self.config.progress_min_transitions)
        stored = self._progress_len[pos]
        first = self._progress_v[pos, np.maximum(stored - k - 1, 0)]
        last = self._progress_v[pos, np.maximum(stored - 1, 0)]
        with np.errstate(divide="ignore", invalid="ignore"):
            self.residual[pos] = np.where(t == 0, np.inf, last + (last - first) / np.maximum(k, 1))

    # ------------------------------------------------------------------ folding
    def fold(self, new_live_start: int, *, centre: np.ndarray | None = None) -> None:
        """Freeze the references of the steps before ``new_live_start`` and absorb what the log no longer keeps
        (see the module docstring). Called by :meth:`record_batch`; idempotent. ``centre``: centre and clip the
        absorbed observations on this reference (a state converted on load: today's); ``None`` (every fold of a
        run) absorbs them unclipped, relative to their step's reference. Refused with the full log."""
        if self.decayed is None:
            raise ValueError("the full history (history_tolerance=0) absorbs nothing: it has no fold")
        ls = self.live_start
        new_ls = min(int(new_live_start), self.step)
        if new_ls <= ls:
            return
        k = new_ls - ls
        refs, has = self.step_references()
        old_has = np.flatnonzero(has[:k])
        if old_has.size:
            self._folded_reference = refs[old_has[-1]].copy()
        if self._first_reference is None and self._folded_reference is None:
            seen = np.flatnonzero(~np.isnan(refs[:k, 0]))
            if seen.size:
                self._first_reference = refs[seen[0]].copy()
        for log in (self.obs, self.dispatch):
            st = log.col("step")
            rows = np.flatnonzero((log.col("frozen") == _LIVE) & (st < new_ls))
            idx = st[rows] - ls
            for j, name in enumerate(("ref_m", "ref_v", "ref_d")):
                log.col(name)[rows] = np.nan_to_num(refs[idx, j])
            log.col("frozen")[rows] = np.where(has[idx], _FROZEN, _FROZEN_NO_REFERENCE)
        self._absorb(new_ls, centre)
        self._batch_sizes = self._batch_sizes[k:]
        self.live_start = new_ls
        self._cache.clear()

    def _rebuild_fifo(self) -> None:
        """Index the outstanding dispatches by task, oldest first (after the dispatch log's rows moved)."""
        d = self.dispatch
        self._fifo = {}
        for row in np.flatnonzero(d.col("status") == _OUTSTANDING):
            self._fifo.setdefault(int(d.col("pos")[row]), []).append(int(row))

    def _drop_observations(self, drop: np.ndarray) -> None:
        """Count the observation rows ``drop`` into the exact per-task counters (observations, scored and
        scorable groups, exploitation hits), then remove them from the log (a fold's absorption)."""
        o = self.obs
        pos, n_scored = o.col("pos"), o.col("n_scored")
        scored = n_scored > 0
        if self.journal is not None:
            self.journal.append(pos[drop].copy())
        # (counted in place, O(rows): a fold every few steps must not cost O(N))
        np.add.at(self._folded_obs, pos[drop], 1)
        np.add.at(self._folded_scored, pos[drop & scored], 1)
        np.add.at(self._folded_scorable, pos[drop & (n_scored >= MIN_SIGNAL_ROLLOUTS)], 1)
        expl = drop & scored & (o.col("phase") == _PHASE_CODE["exploitation"])
        self._folded_exploitation += (int(expl.sum()), int(is_signal_group(n_scored[expl], o.col("v")[expl]).sum()))
        o.keep(~drop)

    def _absorb(self, new_ls: int, centre: np.ndarray | None) -> None:
        """A fold's absorption: every observation of a step before ``new_ls`` (late groups of earlier folded steps
        included) that the log does not keep -- with :attr:`task_horizon`, a scored one within that many steps of its
        task's newest scored one stays -- and every resolved dispatch of such a step goes into :attr:`decayed` and
        the exact counters, and leaves the logs."""
        d = self.dispatch
        status = d.col("status")
        drop_d = (d.col("step") < new_ls) & (status != _OUTSTANDING)
        sel = drop_d & (status == _OBSERVED)
        self._folded_env_selections += np.bincount(self.env_codes[d.col("pos")[sel]], minlength=self.num_envs)
        o = self.obs
        st, n_scored = o.col("step"), o.col("n_scored")
        drop = st < new_ls
        scored = n_scored > 0
        if self.task_horizon is not None:  # a folded row stays while its task's newer rows do not outweigh it
            pos = o.col("pos")
            newest = np.full(self.n, -1, dtype=np.int64)
            np.maximum.at(newest, pos[scored], st[scored])
            # a task whose newest weight has underflowed to 0.0 has no history at all (W = 0, the reference), in
            # the full log too: all its rows go
            age = np.maximum(0, (self.step - 1) - newest).astype(float)
            gone = (newest >= 0) & (np.power(0.5, age / self.config.long_half_life) == 0.0) & \
                (np.power(0.5, age / self.config.short_half_life) == 0.0)
            drop &= ~scored | (st < newest[pos] - self.task_horizon) | gone[pos]
        if self._first_reference is None and self._folded_reference is None and (drop & scored).any():
            # the global reference's last fallback reads the log: keep what it would read
            rows = drop & scored & (st == st[drop & scored].min())
            self._first_reference = np.array([o.col(c)[rows].mean() for c in ("m", "v", "d")])
        self.decayed.absorb(self.step - 1, {c: o.col(c)[drop] for c in _OBS_COLUMNS},
                            d.col("pos")[drop_d], d.col("step")[drop_d], centre, self._clip_bounds())
        self._drop_observations(drop)
        d.keep(~drop_d)
        self._rebuild_fifo()

    def decayed_live_start(self, step: int) -> int:
        """The :attr:`live_start` a run has after ``step`` batches (its folds run at fixed steps: every
        ``horizon // 4`` once ``horizon + horizon // 4`` steps are live); 0 with the full log."""
        if self.horizon is None:
            return 0
        w, q = self.horizon, max(1, self.horizon // 4)
        return 0 if step < w + q else q * ((step - w) // q)

    # ------------------------------------------------------------------ derived statistics
    def has_observations(self) -> bool:
        return bool(self._scored_mask().any() or self._folded_scored.any())

    @property
    def num_observations(self) -> int:
        """Groups reported so far (folded ones included)."""
        return self._num_observations

    def _scored_mask(self) -> np.ndarray:
        if "scored" not in self._cache:
            self._cache["scored"] = self.obs.col("n_scored") > 0
        return self._cache["scored"]

    def obs_weights(self, half_life: float, anchor: int | None = None) -> np.ndarray:
        """Recency weight ``0.5 ** (age / half_life)`` of every logged observation (late groups of folded steps and
        observations the paper preset keeps of folded steps included: the absorbed ones are in
        :meth:`decayed_signal`); cached until the history changes. The absolute recency-weighted sums (signal
        counts, yields) use it. ``anchor``: the ages are counted from that step instead of the latest
        (:meth:`task_history`)."""
        key = ("weights", float(half_life), anchor)
        if key not in self._cache:
            steps = self.obs.col("step")
            w = np.power(0.5, self._ages(steps, anchor) / half_life)
            self._cache[key] = w
        return self._cache[key]

    def _ages(self, steps: np.ndarray, anchor: int | None) -> np.ndarray:
        """Ages of rows of ``steps`` in steps: from the latest step, at least 0 (``anchor`` None), or from
        ``anchor`` (negative for a later step)."""
        if anchor is None:
            return np.maximum(0, (self.step - 1) - steps).astype(float)
        return (int(anchor) - steps).astype(float)

    def step_references(self) -> tuple[np.ndarray, np.ndarray]:
        """Per live dispatch step (index ``step - live_start``): mean ``(m, v, d)`` of its observed scored
        groups ``(S, 3)``, and whether the step has a step-level reference (enough of its groups observed)
        ``(S,)``.

        Exploitation groups are chosen *for* high predicted variance, so they would bias a reference meant to
        track the policy's overall level: a step's reference uses its other groups (cold start, coverage,
        fill, external). In the exploitation-only ablation (``mode="exploitation_only"``), whose steps have no
        other groups, and in the paper preset, a step without other groups uses its exploitation groups. The
        default's other steps without other groups, and its steps whose reference would rest on one group
        (``sample(1)``, whose one slot is exploitation's or, where the coverage debt gives it, coverage's; a
        ``sample(2)`` of one coverage and one exploitation group), have no step-level reference: their observations
        are not shifted. One group as the reference would centre itself onto the reference exactly (with one such
        group per step, every draw of an asynchronous trainer drawing one task at a time), and make every such group
        move the global reference.
        """
        if "refs" in self._cache:
            return self._cache["refs"]
        ls = self.live_start
        steps = max(self.step, 1) - ls
        expl = _PHASE_CODE["exploitation"]
        o = self.obs
        mask = self._scored_mask() & (o.col("step") >= ls)
        st_all = o.col("step")[mask] - ls
        not_expl = o.col("phase")[mask] != expl
        d_live = self.dispatch.col("step") >= ls
        d_step, d_phase = self.dispatch.col("step")[d_live] - ls, self.dispatch.col("phase")[d_live]
        disp_other = np.bincount(d_step[d_phase != expl], minlength=steps)[:steps]
        disp_all = np.zeros(steps)
        disp_all[: len(self._batch_sizes)] = self._batch_sizes
        cnt_other = np.bincount(st_all[not_expl], minlength=steps).astype(float)
        use_other = (disp_other > 0) | (cnt_other > 0)  # per step: reference from non-exploitation groups
        if self.config.mode != "exploitation_only" and not self.config.is_paper:
            use_other[:] = True  # exploitation groups never make a reference (a step of them only has none)
        sel = np.where(use_other[st_all], not_expl, True)
        st = st_all[sel]
        cnt = np.bincount(st, minlength=steps).astype(float)
        refs = np.zeros((steps, 3))
        for j, name in enumerate(("m", "v", "d")):
            sums = np.bincount(st, weights=o.col(name)[mask][sel], minlength=steps)
            refs[:, j] = np.divide(sums, cnt, out=np.full(steps, np.nan), where=cnt > 0)
        dispatched = np.where(use_other, disp_other, disp_all)
        need = np.maximum(1.0, np.ceil(self.config.reference_min_fraction * dispatched))
        has = (cnt >= need) & (cnt > 0)
        if self.config.mode != "exploitation_only" and not self.config.is_paper:
            has &= cnt >= 2  # one group alone would be its own reference
        self._cache["refs"] = (refs, has)
        return refs, has

    def global_reference(self) -> np.ndarray | None:
        """The current global reference ``(m, v, d)`` (B): the latest step with a step-level reference, else
        the first observed batch; ``None`` before any scored observation."""
        if not self.has_observations():
            return None
        refs, has = self.step_references()
        if has.any():
            return refs[np.flatnonzero(has)[-1]].copy()
        for frozen in (self._folded_reference, self._first_reference):
            if frozen is not None:
                return frozen.copy()
        seen = np.flatnonzero(~np.isnan(refs[:, 0]))
        if seen.size:
            return refs[seen[0]].copy()
        # only groups of folded steps that arrived after their step was folded: their earliest step
        o, mask = self.obs, self._scored_mask()
        st = o.col("step")[mask]
        first = st == st.min()
        return np.array([o.col(c)[mask][first].mean() for c in ("m", "v", "d")])

    def centered_observations(self, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Scored observations centered against ``reference`` and clipped: ``(pos, step, values (L, 3))``."""
        o = self.obs
        mask = self._scored_mask()
        pos, step = o.col("pos")[mask], o.col("step")[mask]
        vals = np.stack([o.col("m")[mask], o.col("v")[mask], o.col("d")[mask]], axis=1)
        refs, has = self.step_references()
        frozen = o.col("frozen")[mask]
        live = frozen == _LIVE
        if live.all():
            shift = np.where(has[:, None], reference[None, :] - refs, 0.0)[step - self.live_start]
        else:
            shift = np.zeros_like(vals)
            idx = step[live] - self.live_start
            shift[live] = np.where(has[idx][:, None], reference[None, :] - refs[idx], 0.0)
            fz = frozen == _FROZEN
            shift[fz] = reference[None, :] - np.stack([o.col(c)[mask][fz] for c in ("ref_m", "ref_v", "ref_d")],
                                                      axis=1)
        vals = vals + shift
        c = self.config
        lo = np.array([c.mean_clip[0], c.variance_clip[0], c.dispersion_clip[0]])
        hi = np.array([c.mean_clip[1], c.variance_clip[1], c.dispersion_clip[1]])
        return pos, step, np.clip(vals, lo, hi)

    def task_history(self, half_life: float, reference: np.ndarray,
                     centered: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                     anchor: int | None = None) -> TaskHistory:
        """Recency-weighted task histories for ``half_life`` (all N tasks, vectorised over the log).

        ``anchor``: a step at or before the latest (``self.step - 1``) from which the ages are counted: the means
        are then ratios of weights valued at ``anchor`` (the same means, up to rounding, and the same bits for as
        long as the anchor and the task's observations stay), and ``W`` is their sum times ``0.5 ** ((now -
        anchor) / half_life)``; ``TaskHistory.anchored_weight`` keeps the sum. ``None``: the ages from the latest
        step (an anchor there gives the same bits)."""
        return self._task_history(half_life, reference, centered, anchor, None)

    def task_history_of(self, positions: np.ndarray, half_life: float, reference: np.ndarray,
                        centered: tuple[np.ndarray, np.ndarray, np.ndarray], anchor: int | None) -> TaskHistory:
        """:meth:`task_history` of the tasks ``positions`` only (distinct, ascending): arrays over them, the same
        bits as the rows of the whole computation, in ``O(L + len(positions))``."""
        return self._task_history(half_life, reference, centered, anchor, np.asarray(positions, dtype=np.int64))

    def _task_history(self, half_life: float, reference: np.ndarray,
                      centered: tuple[np.ndarray, np.ndarray, np.ndarray] | None, anchor: int | None,
                      only: np.ndarray | None) -> TaskHistory:
        pos, step, vals = centered if centered is not None else self.centered_observations(reference)
        n = self.n
        folded_scored = self._folded_scored
        if only is not None:  # the log rows of those tasks, in log order (each task's sums keep their order)
            rows = np.flatnonzero(member(pos, only))
            pos, step, vals = np.searchsorted(only, pos[rows]), step[rows], vals[rows]
            n, folded_scored = only.size, folded_scored[only]
        w = np.power(0.5, self._ages(step, anchor) / half_life)
        weight = np.bincount(pos, weights=w, minlength=n).astype(float, copy=False)  # (no row: int zeros)
        groups = np.bincount(pos, minlength=n) + folded_scored
        values = np.empty((n, 3))
        clock = None if anchor is None else 0.5 ** ((self.step - 1 - int(anchor)) / half_life)
        if self.decayed is not None and self.decayed.absorbed:
            # the absorbed observations: their centred mean (exact) clipped as one block, then fused with the log's
            w_old, rel_mean, share = self.decayed.task_history(half_life, self.step - 1, anchor, only)
            lo, hi = self._clip_bounds()
            total = weight + w_old
            for j in range(3):
                old = np.clip(rel_mean[:, j] + share * reference[j], lo[j], hi[j])
                sums = np.bincount(pos, weights=w * vals[:, j], minlength=n).astype(float, copy=False) + w_old * old
                values[:, j] = np.divide(sums, total, out=np.full(n, reference[j]), where=total > 0)
            return TaskHistory(half_life=half_life, values=values, weight=total if clock is None else total * clock,
                               groups=groups, anchored_weight=total)
        for j in range(3):
            sums = np.bincount(pos, weights=w * vals[:, j], minlength=n).astype(float, copy=False)
            values[:, j] = np.divide(sums, weight, out=np.full(n, reference[j]), where=weight > 0)
        return TaskHistory(half_life=half_life, values=values, weight=weight if clock is None else weight * clock,
                           groups=groups, anchored_weight=weight)

    def _clip_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        c = self.config
        return (np.array([c.mean_clip[0], c.variance_clip[0], c.dispersion_clip[0]]),
                np.array([c.mean_clip[1], c.variance_clip[1], c.dispersion_clip[1]]))

    def logged_groups(self) -> LoggedGroups:
        """The groups in the observation log (:class:`LoggedGroups`): what the signal rates read instead of the
        log's columns. Cached until the history changes."""
        if "groups" not in self._cache:
            o = self.obs
            n_scored = o.col("n_scored")
            scored = n_scored > 0
            successes = np.zeros(n_scored.size)
            successes[scored] = o.col("m")[scored] * n_scored[scored]
            # the log's own columns go out as read-only views: a reader cannot write into the history
            groups = LoggedGroups(task=o.col("pos").view(), phase=o.col("phase").view(), step=o.col("step").view(),
                                  scored=n_scored.view(), successes=successes,
                                  scorable=n_scored >= MIN_SIGNAL_ROLLOUTS,
                                  signal=is_signal_group(n_scored, o.col("v")))
            for f in dataclasses.fields(groups):
                getattr(groups, f.name).setflags(write=False)
            self._cache["groups"] = groups
        return self._cache["groups"]

    def decayed_signal(self, half_life: float, anchor: int | None = None) -> DecayedSignal | None:
        """The absorbed observations' signal sums for ``half_life``, aged to now (valued at ``anchor`` when given);
        ``None`` with the full log and before anything is absorbed (everything is still in the log). Cached until the
        history changes (a step reads it five times: the posterior, the declining tasks' two rates, the
        environments' and the phases' yields); its arrays are read-only."""
        if self.decayed is None or not self.decayed.absorbed:
            return None
        key = ("decayed_signal", float(half_life), anchor)
        if key not in self._cache:
            sig = self.decayed.signal(half_life, self.step - 1, anchor)
            for arr in (sig.signal, sig.scorable, sig.successes, sig.failures, sig.phase_signal, sig.phase_scorable):
                arr.setflags(write=False)
            self._cache[key] = sig
        return self._cache[key]

    def decayed_signal_of(self, half_life: float, positions: np.ndarray,
                          anchor: int | None = None) -> DecayedSignal | None:
        """:meth:`decayed_signal` with the per-task sums of ``positions`` only (the same values), in
        ``O(len(positions))``; the phases' sums whole."""
        if self.decayed is None or not self.decayed.absorbed:
            return None
        d = self.decayed
        h = d._half_life(half_life)
        f = d.factor_at(h, anchor, self.step - 1)
        a = d.arrays[h]
        return DecayedSignal(signal=a["signal"][positions] * f, scorable=a["scorable"][positions] * f,
                             successes=a["successes"][positions] * f, failures=a["failures"][positions] * f,
                             phase_signal=d.phase[h][0] * f, phase_scorable=d.phase[h][1] * f)

    # ------------------------------------------------------------------ counts for scheduling
    def outstanding_counts(self) -> np.ndarray:
        st = self.dispatch.col("status")
        return np.bincount(self.dispatch.col("pos")[st == _OUTSTANDING], minlength=self.n)

    def task_observation_counts(self) -> np.ndarray:
        """Observed groups plus outstanding dispatches per task (a group in flight counts as observed, so an
        asynchronous trainer does not get the same under-observed task twice)."""
        return np.bincount(self.obs.col("pos"), minlength=self.n) + self._folded_obs + self.outstanding_counts()

    def task_observation_count(self, pos: int) -> int:
        """:meth:`task_observation_counts` of one task, in ``O(L)``."""
        d = self.dispatch
        outstanding = np.count_nonzero((d.col("pos") == pos) & (d.col("status") == _OUTSTANDING))
        return int(np.count_nonzero(self.obs.col("pos") == pos) + self._folded_obs[pos] + outstanding)

    def scorable_counts(self, positions: np.ndarray | None = None) -> np.ndarray:
        """Groups with at least two scored rewards per task (the groups that can show signal); of the tasks
        ``positions`` only (distinct, ascending) when given, in ``O(L + len(positions))``."""
        g = self.logged_groups()
        pos = g.task[g.scorable]
        if positions is None:
            return np.bincount(pos, minlength=self.n) + self._folded_scorable
        only = np.asarray(positions, dtype=np.int64)
        pos = pos[member(pos, only)]
        return np.bincount(np.searchsorted(only, pos), minlength=only.size) + self._folded_scorable[only]

    def env_selection_counts(self) -> np.ndarray:
        """Cumulative selections per environment (dispatches not discarded)."""
        st = self.dispatch.col("status")
        pos = self.dispatch.col("pos")[st != _DISCARDED]
        return np.bincount(self.env_codes[pos], minlength=self.num_envs) + self._folded_env_selections

    def exposure(self, half_life: float, positions: np.ndarray | None = None) -> np.ndarray:
        """Recency-weighted number of past selections of each task (exposure discounting); of the tasks
        ``positions`` only (distinct, ascending) when given, in ``O(L + len(positions))``, the same bits."""
        step, pos, n = self.dispatch.col("step"), self.dispatch.col("pos"), self.n
        if positions is not None:
            only = np.asarray(positions, dtype=np.int64)
            rows = member(pos, only)
            step, pos, n = step[rows], np.searchsorted(only, pos[rows]), only.size
        age = np.maximum(0, (self.step - 1) - step).astype(float)
        # (as float: numpy counts an empty index in int64 whatever the weights)
        out = np.bincount(pos, weights=np.power(0.5, age / half_life), minlength=n).astype(float, copy=False)
        if self.decayed is not None and self.decayed.absorbed:
            out += self.decayed.exposure(half_life, self.step - 1, None if positions is None else only)
        return out

    def consecutive_blocked(self, positions: np.ndarray | None = None) -> np.ndarray:
        """Tasks selected in the last ``max_consecutive_selections`` batches in a row (not eligible now): all N, or
        only ``positions`` (in their order; ``O(len(positions))``)."""
        last = self.last_selected if positions is None else self.last_selected[positions]
        run = self.run_length if positions is None else self.run_length[positions]
        return (last == self.step - 1) & (run >= self.config.max_consecutive_selections)

    def progress_filtered(self, positions: np.ndarray | None = None) -> np.ndarray:
        """Tasks the progress filter keeps out of exploitation now: all N, or only ``positions`` (in their
        order; ``O(len(positions))``)."""
        transitions = self.transitions if positions is None else self.transitions[positions]
        residual = self.residual if positions is None else self.residual[positions]
        return (transitions >= self.config.progress_min_transitions) & \
            (residual <= self.config.progress_residual_threshold)

    def batch_sizes(self) -> list[int]:
        """Sizes of the batches from :attr:`live_start` on (earlier ones are folded)."""
        return list(self._batch_sizes)

    # ------------------------------------------------------------------ per-step statistics (metrics)
    def step_summary(self, step: int) -> dict[str, float]:
        """Observed groups of one dispatch step: count, mean raw variance, exploitation hits (a step inside
        the horizon; a folded step's groups are partly counters only)."""
        o = self.obs
        sel = o.col("step") == step
        scored = sel & (o.col("n_scored") > 0)
        expl = scored & (o.col("phase") == _PHASE_CODE["exploitation"])
        hits = expl & is_signal_group(o.col("n_scored"), o.col("v"))
        return {
            "groups": float(sel.sum()),
            "mean_variance": float(o.col("raw_var")[scored].mean()) if scored.any() else math.nan,
            "exploitation_groups": float(expl.sum()),
            "exploitation_hits": float(hits.sum()),
        }

    def latest_observed_step(self) -> int | None:
        return None if self._num_observations == 0 else self._latest_observed_step

    def cumulative_hit_rate(self) -> float:
        o = self.obs
        expl = (o.col("n_scored") > 0) & (o.col("phase") == _PHASE_CODE["exploitation"])
        groups = int(expl.sum()) + int(self._folded_exploitation[0])
        hits = int(is_signal_group(o.col("n_scored")[expl], o.col("v")[expl]).sum()) + int(self._folded_exploitation[1])
        return hits / groups if groups else math.nan

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        """The history as JSON data; per-task arrays over the tasks they concern, long ones packed
        (:func:`~envsched.validation.pack`), so that writing and reading it costs O(N) numpy work."""
        pack = _check.pack
        sel = np.flatnonzero(self.last_selected >= 0)
        folded = np.flatnonzero(self._folded_obs | self._folded_scored | self._folded_scorable)
        has_points = np.flatnonzero(self._progress_len)
        lengths = self._progress_len[has_points]
        stored = np.arange(self._progress_step.shape[1]) < lengths[:, None]

        def ref(x: np.ndarray | None) -> list[float] | None:
            return None if x is None else [float(v) for v in x]

        out = {
            "step": self.step,
            "live_start": self.live_start,
            "batch_sizes": list(self._batch_sizes),
            "dispatch": self.dispatch.to_lists(),
            "obs": self.obs.to_lists(),
            "last_selected": {"pos": pack(sel), "step": pack(self.last_selected[sel]),
                              "run": pack(self.run_length[sel])},
            "progress": {"pos": pack(has_points), "count": pack(self._progress_points[has_points]),
                         "length": pack(lengths), "step": pack(self._progress_step[has_points][stored]),
                         "v": pack(self._progress_v[has_points][stored])},
            "observations": self._num_observations,
            "latest_observed_step": self._latest_observed_step,
            "folded": {"pos": pack(folded), "observations": pack(self._folded_obs[folded]),
                       "scored": pack(self._folded_scored[folded]),
                       "scorable": pack(self._folded_scorable[folded]),
                       "env_selections": pack(self._folded_env_selections),
                       "exploitation": self._folded_exploitation.tolist(),
                       "reference": ref(self._folded_reference), "first_reference": ref(self._first_reference)},
        }
        if self.decayed is not None and self.decayed.absorbed:  # before the first fold: the logs' format alone
            out["decayed"] = self.decayed.state()
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any], num_tasks: int, env_codes: np.ndarray, num_envs: int,
                   config: SchedulerConfig, *, raw_var_high: float | None = None) -> History:
        """Rebuild a :class:`History` from :meth:`state`. States written before folding existed (no
        ``live_start``) load as an unfolded history.

        The state is untrusted: every field is checked against what a history can reach (types, NaN only
        where a group had no scored reward, the clip ranges of ``m``, ``v``, ``d``, ``v <= m (1 - m)``,
        steps inside the run, dispatch rows matching the batch sizes, counts that add up) before the
        history is built. Raises :class:`~envsched.errors.StateError` (a ``ValueError``) naming
        the field. ``raw_var_high``: the largest raw reward variance the pool's reward range allows.
        """
        n = int(num_tasks)
        st = _check.mapping(state, "", keys=("step", "batch_sizes", "dispatch", "obs", "last_selected"))
        step = _check.whole(st["step"], "step")
        live_start = _check.whole(st.get("live_start", 0), "live_start", high=step)
        last_step = max(step - 1, 0)  # an update without a dispatch before the first batch is dated step 0
        batch_sizes = _check.int_array(st["batch_sizes"], "batch_sizes", length=step - live_start, low=1,
                                       high=n).tolist()
        dispatch = _load_log("dispatch", st["dispatch"], _DISPATCH_COLUMNS, n=n, last_step=last_step,
                             live_start=live_start, phase_high=_PHASE_CODE["fill"])
        obs = _load_log("obs", st["obs"], _OBS_COLUMNS, n=n, last_step=last_step, live_start=live_start,
                        phase_high=_PHASE_CODE["external"], raw_var_high=raw_var_high)
        # every batch of a live step is still in the dispatch log, once per task
        d_step, d_pos = dispatch["step"], dispatch["pos"]
        live = d_step >= live_start
        per_step = np.bincount(d_step[live] - live_start, minlength=step - live_start)
        if per_step.size != len(batch_sizes) or np.any(per_step != np.asarray(batch_sizes, dtype=np.int64)):
            raise StateError("dispatch.step", "rows of the live steps do not match batch_sizes")
        keys = d_step[live] * n + d_pos[live]
        if np.unique(keys).size != keys.size:
            raise StateError("dispatch.pos", "repeats a task within one batch")
        ls = _check.mapping(st["last_selected"], "last_selected", keys=("pos", "step", "run"))
        sel_pos = _check.int_array(ls["pos"], "last_selected.pos", high=n - 1)
        if np.unique(sel_pos).size != sel_pos.size:
            raise StateError("last_selected.pos", "names a task twice")
        sel_step = _check.int_array(ls["step"], "last_selected.step", length=sel_pos.size, high=step - 1)
        sel_run = _check.int_array(ls["run"], "last_selected.run", length=sel_pos.size, low=1, high=max(step, 1))
        if np.any(sel_run > sel_step + 1):
            raise StateError("last_selected.run", "is longer than the steps before the selection")
        num_obs = len(obs["pos"])
        observations = _check.whole(st.get("observations", num_obs), "observations", low=num_obs)
        logged_latest = int(obs["step"].max()) if num_obs else -1
        if observations == 0:
            latest = _check.whole(st.get("latest_observed_step", -1), "latest_observed_step", low=-1, high=-1)
        else:
            latest = _check.whole(st.get("latest_observed_step", logged_latest), "latest_observed_step",
                                  low=max(logged_latest, 0), high=last_step)
        folded = _load_folded(st["folded"], n, num_envs) if "folded" in st else None
        if folded is not None and int(folded["observations"].sum()) + num_obs > observations:
            raise StateError("folded.observations", "and the logged groups exceed 'observations'")
        progress = st.get("progress")
        if progress is not None:
            progress = _load_progress(progress, n, last_step, observations, config.progress_min_transitions + 1)
        decayed = None
        if history_window(config) is None and (live_start > 0 or "decayed" in st):
            raise StateError("live_start" if live_start > 0 else "decayed",
                             "is a folded history's, and this configuration keeps every observation "
                             "(history_tolerance=0)")
        if "decayed" in st:
            f_scored, f_scorable = np.zeros(n), np.zeros(n)
            if folded is not None:
                f_scored[folded["pos"]], f_scorable[folded["pos"]] = folded["scored"], folded["scorable"]
            decayed = DecayedStatistics.from_state(st["decayed"], n, decayed_half_lives(config), step, f_scored,
                                                   f_scorable)

        h = cls(num_tasks, env_codes, num_envs, config)
        h.step, h.live_start, h._batch_sizes = step, live_start, batch_sizes
        h.dispatch = _Log.from_arrays(_DISPATCH_COLUMNS, dispatch)
        h.obs = _Log.from_arrays(_OBS_COLUMNS, obs)
        h.last_selected[sel_pos] = sel_step
        h.run_length[sel_pos] = sel_run
        h._num_observations, h._latest_observed_step = observations, latest
        if folded is not None:
            pos = folded["pos"]
            h._folded_obs[pos] = folded["observations"]
            h._folded_scored[pos] = folded["scored"]
            h._folded_scorable[pos] = folded["scorable"]
            h._folded_env_selections[:] = folded["env_selections"]
            h._folded_exploitation[:] = folded["exploitation"]
            h._folded_reference, h._first_reference = folded["reference"], folded["first_reference"]
        h._rebuild_fifo()
        if progress is None:  # a state from before folding: the progress points are the log's
            o = h.obs
            for seq in np.flatnonzero(o.col("n_scored") >= config.min_scored_rollouts):
                h._add_progress_point(int(o.col("pos")[seq]), int(o.col("step")[seq]), float(o.col("v")[seq]))
        else:
            pos, count, lengths, steps, values = progress
            rows = np.repeat(pos, lengths)
            cols = np.arange(steps.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            h._progress_step[rows, cols], h._progress_v[rows, cols] = steps, values
            h._progress_len[pos], h._progress_points[pos] = lengths, count
            h._update_residuals(pos)
        if decayed is not None:
            h.decayed = decayed
        elif h.decayed is not None:
            # a state of the logs alone (written before the decayed statistics, or by the paper preset's earlier form,
            # which dropped what it folded): absorb what this form would have absorbed by now, centred and clipped
            # on today's reference (the full log's estimates, exactly, now)
            target, ref = h.decayed_live_start(step), h.global_reference()
            if target > h.live_start:
                h.fold(target, centre=ref)
            else:  # already folded as far (the paper preset's earlier form) or further (a window below this one)
                h._absorb(h.live_start, ref)
                h._cache.clear()
        return h

    def outstanding_fifo(self) -> dict[int, list[int]]:
        """Outstanding dispatch rows per task, oldest first (for tests and explanations)."""
        return {p: list(r) for p, r in self._fifo.items()}


# ---------------------------------------------------------------------- loading a saved history
#: Inclusive range of each statistic of a scored group on the [0, 1] reward scale (and of the references,
#: which are means of them).
_STAT_RANGE = {"m": 1.0, "v": 0.25, "d": 1.0, "ref_m": 1.0, "ref_v": 0.25, "ref_d": 1.0}
_INT32_MAX = 2**31 - 1


def _load_log(name: str, raw: Any, columns: dict[str, Any], *, n: int, last_step: int, live_start: int,
              phase_high: int, raw_var_high: float | None = None) -> dict[str, np.ndarray]:
    """The columns of a saved dispatch or observation log, checked and converted (states written before
    folding have no reference columns: they get the defaults)."""
    data = _check.mapping(raw, name, keys=tuple(k for k in columns if k not in _REF_COLUMNS))
    unknown = sorted(map(str, set(data) - set(columns)))
    if unknown:
        raise StateError(name, f"has unknown columns {unknown[:5]}")
    length = len(_check.sequence(data["pos"], f"{name}.pos"))
    out: dict[str, np.ndarray] = {}
    ints = {"pos": (0, n - 1), "step": (0, last_step), "phase": (0, phase_high), "status": (0, _DISCARDED),
            "n_rollouts": (1, _INT32_MAX), "frozen": (_LIVE, _FROZEN_NO_REFERENCE)}
    for col, (lo, hi) in ints.items():
        if col in columns:
            if col in data:
                out[col] = _check.int_array(data[col], f"{name}.{col}", length=length, low=lo, high=hi,
                                            dtype=columns[col])
            else:
                out[col] = np.full(length, _REF_DEFAULTS[col], dtype=columns[col])
    if "n_scored" in columns:
        out["n_scored"] = _check.int_array(data["n_scored"], f"{name}.n_scored", length=length,
                                           high=_INT32_MAX, dtype=columns["n_scored"])
        bad = np.flatnonzero(out["n_scored"] > out["n_rollouts"])
        if bad.size:
            raise StateError(f"{name}.n_scored[{int(bad[0])}]", "exceeds the group's n_rollouts")
        unscored = out["n_scored"] == 0  # such a group has no statistics: NaN, and only there
        for col in ("m", "v", "d"):
            out[col] = _check.float_array(data[col], f"{name}.{col}", length=length, low=0.0,
                                          high=_STAT_RANGE[col], allow_nan=unscored)
        scored = ~unscored
        over = scored & (out["v"] > out["m"] * (1.0 - out["m"]) + 1e-9)
        if over.any():
            raise StateError(f"{name}.v[{int(np.flatnonzero(over)[0])}]",
                                    "is more than m (1 - m), the largest variance of rewards in [0, 1] with mean m")
        out["raw_var"] = _check.float_array(data["raw_var"], f"{name}.raw_var", length=length, low=0.0,
                                            high=raw_var_high, allow_nan=unscored)
    for col in ("ref_m", "ref_v", "ref_d"):
        out[col] = (_check.float_array(data[col], f"{name}.{col}", length=length, low=0.0, high=_STAT_RANGE[col])
                    if col in data else np.zeros(length))
    # a row of a step before live_start has its step's reference frozen in; a row inside is never frozen
    frozen, steps = out["frozen"], out["step"]
    wrong = np.flatnonzero((frozen == _LIVE) != (steps >= live_start))
    if wrong.size:
        raise StateError(f"{name}.frozen[{int(wrong[0])}]", "disagrees with live_start (a row's frozen "
                                                                   "reference is set exactly when its step is folded)")
    return out


def _load_folded(raw: Any, n: int, num_envs: int) -> dict[str, Any]:
    f = _check.mapping(raw, "folded", keys=("pos", "observations", "scored", "scorable", "env_selections",
                                            "exploitation"))
    pos = _check.int_array(f["pos"], "folded.pos", high=n - 1)
    if np.unique(pos).size != pos.size:
        raise StateError("folded.pos", "names a task twice")
    out: dict[str, Any] = {"pos": pos}
    for name in ("observations", "scored", "scorable"):
        out[name] = _check.int_array(f[name], f"folded.{name}", length=pos.size)
    if np.any(out["scored"] > out["observations"]) or np.any(out["scorable"] > out["scored"]):
        raise StateError("folded.scored", "counts must satisfy scorable <= scored <= observations")
    out["env_selections"] = _check.int_array(f["env_selections"], "folded.env_selections", length=num_envs)
    expl = _check.int_array(f["exploitation"], "folded.exploitation", length=2)
    if expl[1] > expl[0]:
        raise StateError("folded.exploitation", f"counts more hits than groups: {expl.tolist()}")
    out["exploitation"] = expl
    for name in ("reference", "first_reference"):
        r = f.get(name)
        if r is None:
            out[name] = None
            continue
        ref = _check.float_array(r, f"folded.{name}", length=3, low=0.0, high=1.0)
        if ref[1] > _STAT_RANGE["v"]:
            raise StateError(f"folded.{name}[1]", f"must be a finite number in [0.0, 0.25], got {ref[1]!r}")
        out[name] = ref
    return out


def _load_progress(raw: Any, n: int, last_step: int, observations: int,
                   keep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The progress filter's saved points: ``(pos, count, length, step, v)``, each task's ``length`` points
    (step, variance) in dispatch order, flattened. Reads the flat form :meth:`History.state` writes and the
    earlier one (a list of ``[step, sequence, v]`` points per task)."""
    p = _check.mapping(raw, "progress", keys=("pos", "count"))
    pos = _check.int_array(p["pos"], "progress.pos", high=n - 1)
    if np.unique(pos).size != pos.size:
        raise StateError("progress.pos", "names a task twice")
    count = _check.int_array(p["count"], "progress.count", length=pos.size, low=1, high=max(observations, 1))
    if "points" in p:
        return (pos, count, *_load_progress_points(p["points"], pos.size, count, last_step, observations, keep))
    p = _check.mapping(raw, "progress", keys=("length", "step", "v"))
    lengths = _check.int_array(p["length"], "progress.length", length=pos.size, low=1, high=keep)
    over = np.flatnonzero(lengths > count)
    if over.size:
        raise StateError(f"progress.length[{int(over[0])}]", "is more than the task's count of points")
    total = int(lengths.sum())
    steps = _check.int_array(p["step"], "progress.step", length=total, high=last_step)
    values = _check.float_array(p["v"], "progress.v", length=total, low=0.0, high=0.25)
    task = np.repeat(np.arange(pos.size), lengths)
    back = np.flatnonzero((steps[1:] < steps[:-1]) & (task[1:] == task[:-1]))
    if back.size:
        raise StateError(f"progress.step[{int(back[0]) + 1}]",
                                "is before the task's previous point (each task's points are in dispatch order)")
    return pos, count, lengths, steps, values


def _load_progress_points(raw: Any, size: int, count: np.ndarray, last_step: int, observations: int,
                          keep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(length, step, v)`` of the earlier form's points, each task's sorted by (step, sequence)."""
    raw_points = _check.sequence(raw, "progress.points", length=size)
    points = _progress_points_fast(raw_points, count, last_step, observations, keep)
    if points is None:  # a point the fast path does not take: checked one by one (the refusal names it)
        points = []
        for i, pts in enumerate(raw_points):
            field = f"progress.points[{i}]"
            pts = _check.sequence(pts, field, max_length=min(keep, int(count[i])))
            if not pts:
                raise StateError(field, "is empty (a task enters the progress filter with its first point)")
            checked = []
            for j, pt in enumerate(pts):
                s_, q, v = _check.sequence(pt, f"{field}[{j}]", length=3)
                checked.append((_check.whole(s_, f"{field}[{j}][0]", high=last_step),
                                _check.whole(q, f"{field}[{j}][1]", high=max(observations - 1, 0)),
                                _check.finite(v, f"{field}[{j}][2]", low=0.0, high=0.25)))
            points.append(sorted(checked))
    lengths = np.fromiter(map(len, points), dtype=np.int64, count=len(points))
    flat = [pt for pts in points for pt in pts]
    steps = np.fromiter((pt[0] for pt in flat), dtype=np.int64, count=len(flat))
    values = np.fromiter((pt[2] for pt in flat), dtype=np.float64, count=len(flat))
    return lengths, steps, values


def _progress_points_fast(raw_points: list[Any], count: np.ndarray, last_step: int, observations: int,
                          keep: int) -> list[list[tuple[int, int, float]]] | None:
    """The earlier form's points when every one is what :meth:`History.state` wrote then -- a list of a Python
    ``int`` step and sequence number and a ``float`` variance, inside the ranges the checks allow, at most
    ``min(keep, count)`` and at least one per task -- checked in a few passes over all points, then each task's
    points sorted (a task whose points are in order, as written, is not sorted again). ``None`` when anything
    else is found: the per-point checks then run and name the offending field. The result is the same."""
    if not all(type(pts) is list for pts in raw_points):
        return None
    lengths = np.fromiter((len(pts) for pts in raw_points), dtype=np.int64, count=len(raw_points))
    if lengths.size and (lengths.min() < 1 or np.any(lengths > np.minimum(keep, count))):
        return None
    flat = [pt for pts in raw_points for pt in pts]
    if not all(type(pt) is list and len(pt) == 3 and type(pt[0]) is int and type(pt[1]) is int
               and type(pt[2]) is float for pt in flat):
        return None
    try:
        step = np.fromiter((pt[0] for pt in flat), dtype=np.int64, count=len(flat))
        seq = np.fromiter((pt[1] for pt in flat), dtype=np.int64, count=len(flat))
    except OverflowError:
        return None
    v = np.fromiter((pt[2] for pt in flat), dtype=np.float64, count=len(flat))
    if flat and (step.min() < 0 or step.max() > last_step or seq.min() < 0 or seq.max() > max(observations - 1, 0)
                 or not np.all((v >= 0.0) & (v <= 0.25))):  # (NaN fails the comparison)
        return None
    points = [tuple(pt) for pt in flat]
    # which tasks' points are out of (step, sequence, variance) order: only those are sorted
    ends = np.cumsum(lengths)
    follows = np.ones(len(flat), dtype=bool)  # point i+1 of the same task does not come before point i
    if len(flat) > 1:
        a, b = slice(None, -1), slice(1, None)
        follows[:-1] = (step[a] < step[b]) | ((step[a] == step[b]) & ((seq[a] < seq[b])
                                                                        | ((seq[a] == seq[b]) & (v[a] <= v[b]))))
    follows[ends - 1] = True  # a task's last point has no successor in it
    unsorted = set(np.unique(np.searchsorted(ends, np.flatnonzero(~follows), side="right")).tolist())
    out, start = [], 0
    for i, end in enumerate(ends.tolist()):
        out.append(sorted(points[start:end]) if i in unsorted else points[start:end])
        start = end
    return out
