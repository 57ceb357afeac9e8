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
drawing the whole array. The pick is the one the whole computation makes on the same prediction
(``tests/method/scheduling/test_incremental_draw.py``).
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

    def __init__(self, engine: IncrementalPrediction, config: SchedulerConfig, flags: Collection[int]) -> None:
        self.engine, self.config = engine, config
        n = engine.n
        self.flags = frozenset(int(p) for p in flags)
        nb = -(-n // self.block)
        self.static = np.full(nb * self.block, -np.inf)
        self.static[:n] = self._static_scores(np.arange(n))
        self.block_max = self.static.reshape(nb, self.block).max(axis=1)

    def _flagged(self, rows: np.ndarray) -> np.ndarray:
        if not (self.flags and self.config.use_identifier_filter):
            return np.zeros(rows.size, dtype=bool)
        return member(rows, np.array(sorted(self.flags), dtype=np.int64))

    def _static_scores(self, rows: np.ndarray) -> np.ndarray:
        """Scores of ``rows`` in the blocks: the informativeness of an unclocked task (its discount is 1) not
        flagged (where the identifier filter applies), or an upper bound on it
        (:meth:`IncrementalPrediction.static_value`); ``-inf`` for the others."""
        e = self.engine
        score = np.where(e.clocked[rows], -np.inf, e.static_value(rows))
        score[self._flagged(rows)] = -np.inf
        return score

    def _refresh_blocks(self, rows: np.ndarray) -> None:
        self.static[rows] = self._static_scores(rows)
        blocks = distinct(rows // self.block)
        self.block_max[blocks] = self.static.reshape(-1, self.block)[blocks].max(axis=1)

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

    def pick(self, history: History, clocked: np.ndarray, info: np.ndarray,
             tiebreak_of: Callable[[np.ndarray], np.ndarray]) -> tuple[int, float, float, float] | None:
        """``(position, base score, exposure, discount)`` of the exploitation pick, or ``None`` when no task is
        eligible (the whole computation then goes on to coverage and fill). ``clocked``, ``info``:
        :meth:`IncrementalPrediction.tick`'s."""
        cfg, e = self.config, self.engine
        rows = clocked
        caps = e.caps[rows]
        discount = np.ones(rows.size)
        capped = rows[caps]
        if capped.size:
            discount[caps] = np.power(1.0 + history.exposure(cfg.long_half_life, capped), -cfg.exposure_power)
        base = info * discount
        ok = ~self._flagged(rows)
        if cfg.use_progress_filter:
            ok &= ~history.progress_filtered(rows)
        ok &= ~((history.last_selected[rows] == history.step - 1)
                & (history.run_length[rows] >= cfg.max_consecutive_selections) & caps)
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
        at = int(np.searchsorted(rows, pos))
        if at < rows.size and rows[at] == pos:
            b, d = float(base[at]), float(discount[at])
        else:
            b, d = float(e.prediction.informativeness[pos]), 1.0
        exposure = float(history.exposure(cfg.long_half_life, np.array([pos]))[0])
        return pos, b, exposure, d
