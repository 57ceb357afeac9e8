"""Stage 3 of EnvSched, kept up to date: the pick of a one-task draw from the maintained prediction
(:class:`~envsched.method.history.incremental.IncrementalPrediction`), without a pass over the pool.

A ``sample(1)`` that the coverage debt gives no coverage slot
(:func:`~envsched.method.scheduling.policy.settle_coverage_debt`; the sampler picks the others from the coverage
order) is exploitation's pick: the eligible task with the highest ``informativeness x exposure discount`` (the
similarity penalty has no batch member to act on yet), exact ties to the higher of the batch's tiebreak draws: the
rule of :func:`~envsched.method.scheduling.batch.build_batch`. The maintained prediction splits the tasks in two:

* the *clocked* tasks, whose score moves with the clock (:meth:`IncrementalPrediction.tick
  <envsched.method.history.incremental.IncrementalPrediction.tick>`): scored every draw, with their exposure
  discount, the progress and identifier filters and the consecutive cap (``O(clocked)``);
* the others, whose score changes only when an update recomputes their prediction (no exposure, no filter, no
  cap applies to them): their scores sit in blocks of :attr:`IncrementalExploitation.block` tasks with each
  block's maximum kept, so the best of them is a pass over ``N / block`` maxima, and an update recomputes the
  blocks it touched.

Only the tasks tied at the best score need their tiebreak draws, which the sampler reads from its generator without
drawing the whole array. The exploitation picks of a small batch (``sample(n)``, each task of another environment)
after its first pick are penalised by their similarity to the picks before them
(:meth:`IncrementalExploitation.pick_penalised`): a penalty only lowers a score, so only the candidates whose score
reaches the best penalised one are scored.

A draw's first coverage pick under the fewest-observed rule (:meth:`IncrementalExploitation.coverage_pick`) reads,
per environment, the fewest observations of its unclocked tasks and the best informativeness (or bound) among them,
kept as updates arrive; only the tasks of the environments at the best are read, not every task of the environments
tied first in the coverage order (on a large pool, the environments never selected: most of it). The picks are the
ones the whole computation makes on the same prediction (``tests/method/scheduling/test_incremental_draw.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

from envsched.method.config import SchedulerConfig
from envsched.method.history.incremental import IncrementalPrediction
from envsched.method.history.sets import distinct, member, union
from envsched.method.history.statistics import History

__all__ = ["IncrementalExploitation"]


class IncrementalExploitation:
    """The exploitation pick of a one-task draw over an :class:`IncrementalPrediction`.

    Args:
        engine: the maintained prediction.
        config: the sampler's configuration.
        flags: positions of the tasks the identifier filter flagged now.
    """

    #: tasks per block of the unclocked scores
    block: int = 16
    #: the sampler takes a draw's first coverage pick from :meth:`coverage_pick` on pools of at least this many tasks
    #: (its index costs every update a little; on a small pool few environments tie and reading their tasks is
    #: cheap: at 2,550 tasks a one-task draw cost about 0.1 ms more with the index)
    coverage_index_min_tasks: int = 5_000

    def __init__(self, engine: IncrementalPrediction, config: SchedulerConfig, flags: Collection[int]) -> None:
        self.engine, self.config = engine, config
        n = engine.n
        self.flags = frozenset(int(p) for p in flags)
        nb = -(-n // self.block)
        self.static = np.full(nb * self.block, -np.inf)
        self.static[:n] = self._static_scores(np.arange(n))
        self.block_max = self.static.reshape(nb, self.block).max(axis=1)
        # the coverage picks' per-environment index (:meth:`coverage_pick`), built on its first use
        self.cov: np.ndarray | None = None  # (N,) an unclocked task's informativeness or bound, -inf for a clocked one
        self.tobs = np.zeros(0, dtype=np.int64)  # (N,) each task's observation count (observed and in flight)
        self.env_fewest = np.zeros(0, dtype=np.int64)  # (E,) the fewest observations of an unclocked task
        self.env_best = np.zeros(0)  # (E,) the best cov of the unclocked tasks with env_fewest observations
        self.env_stale = np.zeros(0, dtype=bool)  # (E,) environments whose two values above are to be recomputed

    def _flagged(self, rows: np.ndarray) -> np.ndarray:
        if not (self.flags and self.config.use_identifier_filter):
            return np.zeros(rows.size, dtype=bool)
        return member(rows, np.array(sorted(self.flags), dtype=np.int64))

    def _values(self, rows: np.ndarray) -> np.ndarray:
        """The informativeness of unclocked ``rows``, or an upper bound on it
        (:meth:`IncrementalPrediction.static_value`); ``-inf`` for a clocked one."""
        e = self.engine
        return np.where(e.clocked[rows], -np.inf, e.static_value(rows))

    def _static_scores(self, rows: np.ndarray, value: np.ndarray | None = None) -> np.ndarray:
        """Scores of ``rows`` in the blocks: :meth:`_values` (``value`` where given), ``-inf`` for a flagged task
        (where the identifier filter applies): an unclocked task's discount is 1."""
        score = self._values(rows) if value is None else value.copy()
        score[self._flagged(rows)] = -np.inf
        return score

    def _refresh_blocks(self, rows: np.ndarray) -> None:
        """``rows`` changed: their scores in the blocks, and the blocks' maxima (a block where a score fell read
        again; where scores only rose, its maximum raised to them)."""
        value = self._values(rows)
        score = self._static_scores(rows, value)
        fell = score < self.static[rows]
        self.static[rows] = score
        if fell.any():
            blocks = distinct(rows[fell] // self.block)
            self.block_max[blocks] = self.static.reshape(-1, self.block)[blocks].max(axis=1)
        rose = ~fell
        np.maximum.at(self.block_max, rows[rose] // self.block, score[rose])
        if self.cov is not None:
            self._refresh_coverage(rows, value)

    def _rows_of(self, blocks: np.ndarray) -> np.ndarray:
        rows = (blocks[:, None] * self.block + np.arange(self.block)[None, :]).ravel()
        return rows[rows < self.engine.n]

    def _best_static(self, floor: float) -> float:
        """The best unclocked score, exact (the dirty rows that could reach it recomputed), or ``-inf`` when none
        reaches ``floor`` (then none is recomputed)."""
        e = self.engine
        while True:
            top = self.block_max.max() if self.block_max.size else -np.inf
            if top < floor or top == -np.inf:
                return -np.inf
            rows = self._rows_of(np.flatnonzero(self.block_max >= top))
            dirty = rows[e.dirty[rows] & (self.static[rows] >= top)]
            if not dirty.size:
                return top  # every row at the top is exact
            self._refresh_blocks(e.clean(dirty))

    def update(self, rows: np.ndarray, flags: Collection[int]) -> None:
        """``rows`` changed (their informativeness, or whether they are clocked); ``flags``: the flagged
        positions now."""
        now = frozenset(int(p) for p in flags)
        moved = self.flags ^ now
        self.flags = now
        if moved:
            rows = union(rows, np.fromiter(moved, dtype=np.int64, count=len(moved)))
        if rows.size:
            self._refresh_blocks(rows)

    def _clocked_scores(self, history: History, rows: np.ndarray,
                        info: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(base, discount, eligible)`` of the clocked ``rows``: the informativeness times the exposure discount
        where the caps apply, and whether the filters and the consecutive cap leave the task a candidate."""
        cfg, e = self.config, self.engine
        caps = e.caps[rows]
        discount = np.ones(rows.size)
        capped = rows[caps]
        if capped.size:
            discount[caps] = np.power(1.0 + history.exposure(cfg.long_half_life, capped), -cfg.exposure_power)
        base = info * discount
        ok = ~self._flagged(rows)
        if cfg.use_progress_filter:
            ok &= ~history.progress_filtered(rows)
        ok &= ~(history.consecutive_blocked(rows) & caps)
        return base, discount, ok

    def _result(self, history: History, rows: np.ndarray, base: np.ndarray, discount: np.ndarray,
                pos: int) -> tuple[float, float, float]:
        """``(base score, exposure, discount)`` of the pick ``pos``."""
        at = int(np.searchsorted(rows, pos))
        if at < rows.size and rows[at] == pos:
            b, d = float(base[at]), float(discount[at])
        else:
            b, d = float(self.engine.prediction.informativeness[pos]), 1.0
        exposure = float(history.exposure(self.config.long_half_life, np.array([pos]))[0])
        return b, exposure, d

    def pick(self, history: History, clocked: np.ndarray, info: np.ndarray,
             tiebreak_of: Callable[[np.ndarray], np.ndarray]) -> tuple[int, float, float, float] | None:
        """``(position, base score, exposure, discount)`` of the exploitation pick, or ``None`` when no task is
        eligible (the whole computation then goes on to coverage and fill). ``clocked``, ``info``:
        :meth:`IncrementalPrediction.tick`'s."""
        rows = clocked
        base, discount, ok = self._clocked_scores(history, rows, info)
        best_clocked = base[ok].max() if ok.any() else -np.inf
        best_static = self._best_static(best_clocked)
        top = max(best_clocked, best_static)
        if top == -np.inf:
            return None
        tied = [rows[ok & (base == top)]]
        if best_static == top:
            cand = self._rows_of(np.flatnonzero(self.block_max == top))
            tied.append(cand[self.static[cand] == top])
        tied_all = np.sort(np.concatenate(tied))
        pos = int(tied_all[0]) if tied_all.size == 1 else int(tied_all[int(np.argmax(tiebreak_of(tied_all)))])
        return (pos, *self._result(history, rows, base, discount, pos))

    def _static_at_least(self, floor: float) -> np.ndarray:
        """The unclocked rows whose score is at least ``floor`` (``> -inf``), ascending, each exact (the dirty rows
        that could reach it recomputed)."""
        e = self.engine
        while True:
            rows = self._rows_of(np.flatnonzero(self.block_max >= floor))
            dirty = rows[e.dirty[rows] & (self.static[rows] >= floor)]
            if not dirty.size:
                return rows[self.static[rows] >= floor]
            self._refresh_blocks(e.clean(dirty))

    def pick_penalised(self, history: History, clocked: np.ndarray, info: np.ndarray,
                       tiebreak_of: Callable[[np.ndarray], np.ndarray], excluded_envs: np.ndarray,
                       max_similarity: Callable[[np.ndarray], np.ndarray],
                       ) -> tuple[int, float, float, float, float, float] | None:
        """The exploitation pick of a batch that already has members, each of another environment than every
        candidate: the eligible task outside ``excluded_envs`` (``(E,)`` bool: the members' environments) with the
        highest ``base x (1 - similarity_penalty x max_similarity)``, exact ties to the higher tiebreak draw, as
        :func:`~envsched.method.scheduling.batch.build_batch`'s exploitation phase. ``max_similarity(cands)``: each
        candidate's largest similarity to the members (the batch builder's :class:`~envsched.method.scheduling.
        batch.BatchSimilarity`). The penalty only lowers a score, so the candidates are those whose base reaches a
        threshold: the best base first, then the best penalised score among them (at most two rounds). Returns
        ``(position, score, base score, max_similarity, exposure, discount)``, or ``None`` when no task is
        eligible."""
        e = self.engine
        lam = self.config.similarity_penalty
        rows = clocked
        base, discount, ok = self._clocked_scores(history, rows, info)
        ok &= ~excluded_envs[e.env_codes[rows]]
        hidden = np.sort(e.members(np.flatnonzero(excluded_envs)))
        self.static[hidden] = -np.inf  # (restored below)
        blocks = distinct(hidden // self.block)
        self.block_max[blocks] = self.static.reshape(-1, self.block)[blocks].max(axis=1)
        try:
            floor = max(base[ok].max() if ok.any() else -np.inf, self._best_static(-np.inf))
            if floor == -np.inf:
                return None
            while True:
                chosen = np.flatnonzero(ok & (base >= floor))
                static = self._static_at_least(floor)
                cands = np.concatenate([rows[chosen], static])
                cand_base = np.concatenate([base[chosen], self.static[static]])
                ms = max_similarity(cands)
                score = cand_base * (1.0 - lam * ms)
                top = score.max()
                if top >= floor:  # no candidate below the floor can reach it
                    break
                floor = top
            tied = np.flatnonzero(score == top)
            if tied.size > 1:
                order = np.argsort(cands[tied])
                tied = tied[order]
                tied = tied[[int(np.argmax(tiebreak_of(cands[tied])))]]
            i = int(tied[0])
            pos = int(cands[i])
        finally:
            if hidden.size:
                self._refresh_blocks(hidden)
        b, exposure, d = self._result(history, rows, base, discount, pos)
        return pos, float(score[i]), b, float(ms[i]), exposure, d

    # ------------------------------------------------------------------ coverage picks, the fewest observed first
    #: ``env_fewest`` of an environment whose every task is clocked
    _NO_UNCLOCKED = np.iinfo(np.int64).max

    def _coverage_start(self, history: History) -> None:
        """Build the per-environment index of the coverage picks (one pass over the pool) and start collecting the
        tasks whose observation count may change (:attr:`IncrementalPrediction.counted`)."""
        e = self.engine
        self.tobs = np.asarray(history.task_observation_counts(), dtype=np.int64).copy()
        self.cov = self._values(np.arange(e.n))
        num_envs = e.env_starts.size - 1
        self.env_fewest = np.zeros(num_envs, dtype=np.int64)
        self.env_best = np.zeros(num_envs)
        self.env_stale = np.zeros(num_envs, dtype=bool)
        self._coverage_envs(np.arange(num_envs))
        e.counted = []

    def _coverage_envs(self, envs: np.ndarray) -> None:
        """Recompute ``env_fewest`` and ``env_best`` of ``envs`` (distinct) from their tasks."""
        if not envs.size:
            return
        e = self.engine
        members = e.members(envs)
        sizes = e.env_starts[envs + 1] - e.env_starts[envs]
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        cov = self.cov[members]
        counts = np.where(e.clocked[members], self._NO_UNCLOCKED, self.tobs[members])
        fewest = np.minimum.reduceat(counts, starts)
        self.env_fewest[envs] = fewest
        self.env_best[envs] = np.maximum.reduceat(np.where(counts == np.repeat(fewest, sizes), cov, -np.inf),
                                                  starts)
        self.env_stale[envs] = False

    def _refresh_coverage(self, rows: np.ndarray, new: np.ndarray) -> None:
        """``rows``' informativeness (or bound), or whether they are clocked, changed (``new``: their values, -inf for
        a clocked one): a value that rose at its environment's fewest observations raises that environment's best;
        any other change of a value at or below them makes the environment stale (recomputed before the next
        coverage pick reads it)."""
        e = self.engine
        old = self.cov[rows]
        self.cov[rows] = new
        envs = e.env_codes[rows]
        count = np.where(np.isneginf(new), self._NO_UNCLOCKED, self.tobs[rows])
        was = np.where(np.isneginf(old), self._NO_UNCLOCKED, self.tobs[rows])
        fewest = self.env_fewest[envs]
        up = new >= old
        self.env_stale[envs[(~up & (was <= fewest)) | (count < fewest)]] = True
        at = up & (count == fewest)
        np.maximum.at(self.env_best, envs[at], new[at])

    def _coverage_counts(self, history: History) -> None:
        """Bring the observation counts of the tasks drawn, observed or discarded since the last pick up to date."""
        e = self.engine
        if e.counted:
            tasks = union(*e.counted)
            e.counted.clear()
            counts = np.array([history.task_observation_count(int(p)) for p in tasks], dtype=np.int64)
            moved = tasks[counts != self.tobs[tasks]]
            self.tobs[tasks] = counts
            self.env_stale[e.env_codes[moved]] = True

    def coverage_pick(self, history: History, key: np.ndarray, live: np.ndarray, clocked: np.ndarray,
                      info: np.ndarray, tiebreak_of: Callable[[np.ndarray], np.ndarray],
                      ) -> tuple[int, float, int] | None:
        """The first coverage pick of a draw under the fewest-observed rule (``adaptive_coverage`` off), by the rule
        of :func:`~envsched.method.scheduling.batch.build_batch`'s coverage phase with no batch member yet: of the
        ``live`` environments first in ``key`` (ties included) with a task the consecutive cap leaves eligible, the
        task with the fewest observations (in flight included) and then the highest informativeness, exact ties to
        the higher tiebreak draw. Reads the environments' kept ``(fewest observations, best informativeness or
        bound)`` and the tasks of the environments at the best only, not every task of the tied environments (the
        environments never selected, most of a large pool). ``clocked``, ``info``: :meth:`IncrementalPrediction.tick
        <envsched.method.history.incremental.IncrementalPrediction.tick>`'s (the caps bind clocked tasks only: a
        task drawn where the caps apply is clocked). Returns ``(position, coverage score, environments with a
        candidate)``, or ``None`` when no task is eligible."""
        e = self.engine
        if self.cov is None:
            self._coverage_start(history)
        self._coverage_counts(history)
        sizes = np.diff(e.env_starts)
        capped = clocked[history.consecutive_blocked(clocked) & e.caps[clocked]]
        full = np.bincount(e.env_codes[capped], minlength=sizes.size) == sizes if capped.size else None
        live = live.copy()
        while True:  # the first environments in the order; one whose every task is capped is skipped
            if not live.any():
                return None
            first = live & (key == key[live].min())
            if full is not None:
                first &= ~full
                if not first.any():
                    live &= ~(live & (key == key[live].min()))
                    continue
            break
        self._coverage_envs(np.flatnonzero(self.env_stale & first))
        # clocked candidates: their score is the tick's
        c_in = first[e.env_codes[clocked]]
        if capped.size:
            c_in &= ~member(clocked, capped)
        c_rows, c_info = clocked[c_in], info[c_in]
        u_fewest = self.env_fewest[first].min() if first.any() else self._NO_UNCLOCKED
        fewest = min(int(u_fewest), int(self.tobs[c_rows].min()) if c_rows.size else self._NO_UNCLOCKED)
        at = self.tobs[c_rows] == fewest
        c_rows, c_info = c_rows[at], c_info[at]
        top_c = c_info.max() if c_rows.size else -np.inf
        envs_u = first & (self.env_fewest == fewest)
        tied_u = np.zeros(0, dtype=np.int64)
        top = top_c
        while envs_u.any():
            top_u = self.env_best[envs_u].max()
            top = max(top_c, top_u)
            if top_u < top:
                break
            rows = e.members(np.flatnonzero(envs_u & (self.env_best == top)))
            rows = rows[(self.cov[rows] >= top) & ~e.clocked[rows] & (self.tobs[rows] == fewest)]
            dirty = rows[e.dirty[rows]]
            if not dirty.size:  # every row at the top is exact
                tied_u = rows
                break
            cleaned = e.clean(dirty)
            self._refresh_blocks(cleaned)
            self._coverage_envs(distinct(e.env_codes[cleaned][self.env_stale[e.env_codes[cleaned]]]))
        tied = np.sort(np.concatenate([c_rows[c_info == top], tied_u]))
        pos = int(tied[0]) if tied.size == 1 else int(tied[int(np.argmax(tiebreak_of(tied)))])
        return pos, float(top), int(np.count_nonzero(first))

