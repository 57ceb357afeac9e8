"""Stage 1 of EnvSched: what the scheduler remembers of its rollouts (paper B, B.1).

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from envsched.method.config import SchedulerConfig

__all__ = ["PHASES", "History", "observation_statistics"]

#: Phase codes stored in the dispatch log (index = code).
PHASES: tuple[str, ...] = ("cold_start", "coverage", "exploitation", "fill", "external")
_PHASE_CODE = {p: i for i, p in enumerate(PHASES)}
_OUTSTANDING, _OBSERVED, _DISCARDED = 0, 1, 2


def observation_statistics(scored: np.ndarray) -> tuple[float, float, float] | None:
    """``(mean, population variance, mean-corrected dispersion)`` of rewards already scaled to [0, 1].

    ``None`` when no reward is scored. Dispersion is ``v / (m (1 - m))`` (0 when ``m`` is 0 or 1, where
    the variance is 0 too), clipped to [0, 1].
    """
    x = np.asarray(scored, dtype=float)
    if x.size == 0:
        return None
    vals = x.tolist()  # groups are small: plain floats beat numpy's per-call overhead
    m = math.fsum(vals) / len(vals)
    v = max(0.0, math.fsum((r - m) ** 2 for r in vals) / len(vals))
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

    def to_lists(self) -> dict[str, list]:
        return {k: self.col(k).tolist() for k in self._data}

    @classmethod
    def from_lists(cls, columns: dict[str, Any], data: dict[str, list]) -> _Log:
        log = cls(columns)
        n = len(next(iter(data.values()))) if data else 0
        if any(len(v) != n for v in data.values()) or set(data) != set(columns):
            raise ValueError(f"log columns must be {sorted(columns)} of equal length")
        log._cap = max(256, n)
        log._n = n
        for k, t in columns.items():
            arr = np.zeros(log._cap, dtype=t)
            arr[:n] = np.asarray(data[k], dtype=t)
            log._data[k] = arr
        return log


_DISPATCH_COLUMNS = {"pos": np.int64, "step": np.int64, "phase": np.int8, "status": np.int8}
_OBS_COLUMNS = {"pos": np.int64, "step": np.int64, "phase": np.int8, "n_scored": np.int32, "n_rollouts": np.int32,
                "m": np.float64, "v": np.float64, "d": np.float64, "raw_var": np.float64}


@dataclass
class TaskHistory:
    """Recency-weighted task histories for one half-life (arrays over all N tasks)."""

    half_life: float
    values: np.ndarray  # (N, 3): centered, weighted mean (m, v, d); the reference where weight == 0
    weight: np.ndarray  # (N,): sum of recency weights of the task's scored observations
    groups: np.ndarray  # (N,): number of scored observations

    @property
    def observed(self) -> np.ndarray:
        return self.weight > 0


class History:
    """Dispatch and observation logs of one sampler, and the statistics derived from them.

    Args:
        num_tasks: ``N``.
        env_codes: environment index of each task (``int (N,)``).
        num_envs: number of environments.
        config: the scheduler configuration (clip ranges, reference rule, progress filter).
    """

    def __init__(self, num_tasks: int, env_codes: np.ndarray, num_envs: int, config: SchedulerConfig) -> None:
        self.n = int(num_tasks)
        self.env_codes = np.asarray(env_codes, dtype=np.int64)
        self.num_envs = int(num_envs)
        self.config = config
        self.step = 0  # number of batches dispatched so far
        self.dispatch = _Log(_DISPATCH_COLUMNS)
        self.obs = _Log(_OBS_COLUMNS)
        self._fifo: dict[int, list[int]] = {}
        self.last_selected = np.full(self.n, -10, dtype=np.int64)
        self.run_length = np.zeros(self.n, dtype=np.int64)
        self._progress: dict[int, list[tuple[int, int, float]]] = {}
        self.transitions = np.zeros(self.n, dtype=np.int64)
        self.residual = np.full(self.n, np.inf)
        self._batch_sizes: list[int] = []

    # ------------------------------------------------------------------ recording
    def record_batch(self, positions: list[int], phases: list[str]) -> int:
        """Log one dispatched batch (all positions distinct); returns its step index."""
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
        return s

    def _pop_dispatch(self, pos: int, status: int) -> int | None:
        rows = self._fifo.get(pos)
        if not rows:
            return None
        row = rows.pop(0)
        if not rows:
            del self._fifo[pos]
        self.dispatch.set("status", row, status)
        return row

    def record_discard(self, pos: int) -> None:
        """A dispatched group was dropped: release its oldest dispatch (it never becomes an observation)."""
        self._pop_dispatch(pos, _DISCARDED)

    def record_observation(self, pos: int, scored01: np.ndarray, n_rollouts: int, raw_var: float) -> dict[str, Any]:
        """Log one reported group. ``scored01``: its scored rewards mapped to [0, 1]. Returns what was logged."""
        row = self._pop_dispatch(pos, _OBSERVED)
        if row is None:  # an update without a dispatch (require_dispatch=False): dated by the last batch
            step, phase = max(self.step - 1, 0), _PHASE_CODE["external"]
        else:
            step, phase = int(self.dispatch.col("step")[row]), int(self.dispatch.col("phase")[row])
        stats = observation_statistics(scored01)
        m, v, d = stats if stats is not None else (math.nan, math.nan, math.nan)
        seq = self.obs.append(pos=pos, step=step, phase=phase, n_scored=int(scored01.size), n_rollouts=n_rollouts,
                              m=m, v=v, d=d, raw_var=raw_var)
        if stats is not None and scored01.size >= self.config.min_scored_rollouts:
            self._add_progress_point(pos, step, seq, v)
        return {"step": step, "phase": PHASES[phase], "m": m, "v": v, "d": d, "n_scored": int(scored01.size)}

    def _add_progress_point(self, pos: int, step: int, seq: int, v: float) -> None:
        pts = self._progress.setdefault(pos, [])
        pts.append((step, seq, v))
        pts.sort()
        self._update_residual(pos)

    def _update_residual(self, pos: int) -> None:
        """Progress filter state of one task (appendix C).

        Scorable transitions are consecutive pairs of scorable observations in dispatch order. The estimated
        residual is the one-step linear extrapolation of the task's observed variance over its last
        ``progress_min_transitions`` transitions: ``v_last + (v_last - v_first) / transitions``. It is
        ``<= 0`` when the task has stopped producing reward differences (all-pass or all-fail groups) or
        its variance is falling to zero; a new observation with variance brings it back above 0.
        """
        pts = self._progress.get(pos, [])
        t = max(0, len(pts) - 1)
        self.transitions[pos] = t
        if t == 0:
            self.residual[pos] = np.inf
            return
        k = min(t, self.config.progress_min_transitions)
        window = [p[2] for p in pts[-(k + 1):]]
        self.residual[pos] = window[-1] + (window[-1] - window[0]) / k

    # ------------------------------------------------------------------ derived statistics
    def has_observations(self) -> bool:
        return bool(np.any(self.obs.col("n_scored") > 0))

    def _scored_mask(self) -> np.ndarray:
        return self.obs.col("n_scored") > 0

    def step_references(self) -> tuple[np.ndarray, np.ndarray]:
        """Per dispatch step: mean ``(m, v, d)`` of its observed scored groups ``(S, 3)``, and whether the step
        has a step-level reference (enough of its groups observed) ``(S,)``.

        Exploitation groups are chosen *for* high predicted variance, so they would bias a reference meant to
        track the policy's overall level: a step's reference uses its other groups (cold start, coverage,
        fill, external), and only a step that has none of those (the exploitation-only ablation) uses its
        exploitation groups.
        """
        steps = max(self.step, 1)
        expl = _PHASE_CODE["exploitation"]
        mask = self._scored_mask()
        st_all = self.obs.col("step")[mask]
        not_expl = self.obs.col("phase")[mask] != expl
        d_step, d_phase = self.dispatch.col("step"), self.dispatch.col("phase")
        disp_other = np.bincount(d_step[d_phase != expl], minlength=steps)[:steps]
        disp_all = np.zeros(steps)
        disp_all[: len(self._batch_sizes)] = self._batch_sizes
        cnt_other = np.bincount(st_all[not_expl], minlength=steps).astype(float)
        use_other = (disp_other > 0) | (cnt_other > 0)  # per step: reference from non-exploitation groups
        sel = np.where(use_other[st_all], not_expl, True)
        st = st_all[sel]
        cnt = np.bincount(st, minlength=steps).astype(float)
        refs = np.zeros((steps, 3))
        for j, name in enumerate(("m", "v", "d")):
            sums = np.bincount(st, weights=self.obs.col(name)[mask][sel], minlength=steps)
            refs[:, j] = np.divide(sums, cnt, out=np.full(steps, np.nan), where=cnt > 0)
        dispatched = np.where(use_other, disp_other, disp_all)
        need = np.maximum(1.0, np.ceil(self.config.reference_min_fraction * dispatched))
        has = (cnt >= need) & (cnt > 0)
        return refs, has

    def global_reference(self) -> np.ndarray | None:
        """The current global reference ``(m, v, d)`` (B): the latest step with a step-level reference, else
        the first observed batch; ``None`` before any scored observation."""
        if not self.has_observations():
            return None
        refs, has = self.step_references()
        if has.any():
            return refs[np.flatnonzero(has)[-1]].copy()
        first = int(np.flatnonzero(~np.isnan(refs[:, 0]))[0])
        return refs[first].copy()

    def centered_observations(self, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Scored observations centered against ``reference`` and clipped: ``(pos, step, values (L, 3))``."""
        mask = self._scored_mask()
        pos, step = self.obs.col("pos")[mask], self.obs.col("step")[mask]
        vals = np.stack([self.obs.col("m")[mask], self.obs.col("v")[mask], self.obs.col("d")[mask]], axis=1)
        refs, has = self.step_references()
        shift = np.where(has[:, None], reference[None, :] - refs, 0.0)
        vals = vals + shift[step]
        c = self.config
        lo = np.array([c.mean_clip[0], c.variance_clip[0], c.dispersion_clip[0]])
        hi = np.array([c.mean_clip[1], c.variance_clip[1], c.dispersion_clip[1]])
        return pos, step, np.clip(vals, lo, hi)

    def task_history(self, half_life: float, reference: np.ndarray,
                     centered: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> TaskHistory:
        """Recency-weighted task histories for ``half_life`` (all N tasks, vectorised over the log)."""
        pos, step, vals = centered if centered is not None else self.centered_observations(reference)
        age = np.maximum(0, (self.step - 1) - step).astype(float)
        w = np.power(0.5, age / half_life)
        weight = np.bincount(pos, weights=w, minlength=self.n)
        groups = np.bincount(pos, minlength=self.n)
        values = np.empty((self.n, 3))
        for j in range(3):
            sums = np.bincount(pos, weights=w * vals[:, j], minlength=self.n)
            values[:, j] = np.divide(sums, weight, out=np.full(self.n, reference[j]), where=weight > 0)
        return TaskHistory(half_life=half_life, values=values, weight=weight, groups=groups)

    # ------------------------------------------------------------------ counts for scheduling
    def outstanding_counts(self) -> np.ndarray:
        st = self.dispatch.col("status")
        return np.bincount(self.dispatch.col("pos")[st == _OUTSTANDING], minlength=self.n)

    def task_observation_counts(self) -> np.ndarray:
        """Observed groups plus outstanding dispatches per task (a group in flight counts as observed, so an
        asynchronous trainer does not get the same under-observed task twice)."""
        return np.bincount(self.obs.col("pos"), minlength=self.n) + self.outstanding_counts()

    def env_selection_counts(self) -> np.ndarray:
        """Cumulative selections per environment (dispatches not discarded)."""
        st = self.dispatch.col("status")
        pos = self.dispatch.col("pos")[st != _DISCARDED]
        return np.bincount(self.env_codes[pos], minlength=self.num_envs)

    def exposure(self, half_life: float) -> np.ndarray:
        """Recency-weighted number of past selections of each task (exposure discounting)."""
        age = np.maximum(0, (self.step - 1) - self.dispatch.col("step")).astype(float)
        return np.bincount(self.dispatch.col("pos"), weights=np.power(0.5, age / half_life), minlength=self.n)

    def consecutive_blocked(self) -> np.ndarray:
        """Tasks selected in the last ``max_consecutive_selections`` batches in a row (not eligible now)."""
        return (self.last_selected == self.step - 1) & (self.run_length >= self.config.max_consecutive_selections)

    def progress_filtered(self) -> np.ndarray:
        """Tasks the progress filter keeps out of exploitation now."""
        return (self.transitions >= self.config.progress_min_transitions) & \
            (self.residual <= self.config.progress_residual_threshold)

    def batch_sizes(self) -> list[int]:
        return list(self._batch_sizes)

    # ------------------------------------------------------------------ per-step statistics (metrics)
    def step_summary(self, step: int) -> dict[str, float]:
        """Observed groups of one dispatch step: count, mean raw variance, exploitation hits."""
        o = self.obs
        sel = o.col("step") == step
        scored = sel & (o.col("n_scored") > 0)
        expl = scored & (o.col("phase") == _PHASE_CODE["exploitation"])
        hits = expl & (o.col("v") > 0)
        return {
            "groups": float(sel.sum()),
            "mean_variance": float(o.col("raw_var")[scored].mean()) if scored.any() else math.nan,
            "exploitation_groups": float(expl.sum()),
            "exploitation_hits": float(hits.sum()),
        }

    def latest_observed_step(self) -> int | None:
        if len(self.obs) == 0:
            return None
        return int(self.obs.col("step").max())

    def cumulative_hit_rate(self) -> float:
        o = self.obs
        expl = (o.col("n_scored") > 0) & (o.col("phase") == _PHASE_CODE["exploitation"])
        return float((o.col("v")[expl] > 0).mean()) if expl.any() else math.nan

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        sel = np.flatnonzero(self.last_selected >= 0)
        return {
            "step": self.step,
            "batch_sizes": list(self._batch_sizes),
            "dispatch": self.dispatch.to_lists(),
            "obs": self.obs.to_lists(),
            "last_selected": {"pos": sel.tolist(), "step": self.last_selected[sel].tolist(),
                              "run": self.run_length[sel].tolist()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], num_tasks: int, env_codes: np.ndarray, num_envs: int,
                   config: SchedulerConfig) -> History:
        """Rebuild a :class:`History` from :meth:`state` (validated; raises ``ValueError``)."""
        h = cls(num_tasks, env_codes, num_envs, config)
        try:
            h.step = int(state["step"])
            h._batch_sizes = [int(x) for x in state["batch_sizes"]]
            h.dispatch = _Log.from_lists(_DISPATCH_COLUMNS, state["dispatch"])
            h.obs = _Log.from_lists(_OBS_COLUMNS, state["obs"])
            ls = state["last_selected"]
            p = np.asarray(ls["pos"], dtype=np.int64)
            if p.size and (p.min() < 0 or p.max() >= num_tasks):
                raise ValueError("last_selected position out of range")
            h.last_selected[p] = np.asarray(ls["step"], dtype=np.int64)
            h.run_length[p] = np.asarray(ls["run"], dtype=np.int64)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed history state: {exc!r}") from None
        for log in (h.dispatch, h.obs):
            pos = log.col("pos")
            if pos.size and (pos.min() < 0 or pos.max() >= num_tasks):
                raise ValueError("malformed history state: a logged task position is out of range")
        if h.step < 0 or len(h._batch_sizes) != h.step:
            raise ValueError("malformed history state: step and batch sizes disagree")
        dsteps = h.dispatch.col("step")
        if dsteps.size and (dsteps.min() < 0 or dsteps.max() >= max(h.step, 1)):
            raise ValueError("malformed history state: a dispatch step is out of range")
        osteps = h.obs.col("step")
        if osteps.size and (osteps.min() < 0 or osteps.max() >= max(h.step, 1)):
            raise ValueError("malformed history state: an observation step is out of range")
        status = h.dispatch.col("status")
        for row in np.flatnonzero(status == _OUTSTANDING):
            h._fifo.setdefault(int(h.dispatch.col("pos")[row]), []).append(int(row))
        o = h.obs
        ok = (o.col("n_scored") >= config.min_scored_rollouts)
        for seq in np.flatnonzero(ok):
            pos = int(o.col("pos")[seq])
            h._progress.setdefault(pos, []).append((int(o.col("step")[seq]), int(seq), float(o.col("v")[seq])))
        for pos in h._progress:
            h._progress[pos].sort()
            h._update_residual(pos)
        return h

    def outstanding_fifo(self) -> dict[int, list[int]]:
        """Outstanding dispatch rows per task, oldest first (for tests and explanations)."""
        return {p: list(r) for p, r in self._fifo.items()}
