"""Stage 2 of EnvSched, kept up to date: the prediction of :mod:`~envsched.method.history.prediction` maintained
task by task as groups arrive, so that a draw of one task, or of a few (``sample(2)`` of TRL's trainer), costs what
changed since the last draw, not a pass over the pool (an asynchronous trainer draws one group at a time).

**What is maintained.** :func:`~envsched.method.history.prediction.predict` with the recency weights valued at a
fixed step, the *anchor* ``a`` (``predict(..., anchor=a)``, :meth:`History.task_history
<envsched.method.history.statistics.History.task_history>`): every task's own means are then ratios of weights
valued at ``a``, which keep their bits for as long as the task's observations stay as they are, and only the
weights ``W`` move with the clock, each by the common factor ``0.5 ** ((now - a) / h)``. So between two draws the
prediction changes only

* for a task whose observations changed (a reported group, a fold absorbing it, a late group changing the
  reference of a step it was observed in): its own history, and with it its environment's estimate, the within
  estimates of its environment and of the tasks whose within neighbour it is, and the cross estimates of the tasks
  with a cross neighbour in its environment (``unobserved_neighbours="environment"``; with the global reference
  as the substitute, of the tasks with it as a cross neighbour): :meth:`IncrementalPrediction.sync`, about
  ``tasks per environment x cross neighbours`` tasks (600 at 50 and 12);
* through the clock, for the *clocked* tasks: the observed ones (their ``W``), those the progress filter has
  points of and, where the caps apply, those ever drawn (their exposure): their scores are recomputed every draw
  (:meth:`IncrementalPrediction.tick`), from compact copies of what they read.

Every maintained value is computed with the arithmetic of the whole computation (the same elementwise operations;
each sum over a task's log rows, an environment's observed tasks or a task's neighbours in the order the whole
computation adds them), so the maintained prediction is, bit for bit, ``predict(history, anchor=a)`` of the
history as it is now (:meth:`IncrementalPrediction.materialize` writes it out; ``tests/method/history/
test_incremental.py`` compares them after every draw). With the anchor at the latest step it is the prediction
every other draw makes, bit for bit; with an earlier anchor it differs from it by rounding only.

**What makes it start again** (:meth:`IncrementalPrediction.stale`): a new global reference (every task's centring
and every substitute move with it; in the default neither a step of exploitation groups only nor a step of one
task has one, so a run of ``sample(1)``, coverage picks included, keeps the reference its last batch of several
tasks with a coverage group set), an anchor more than
:data:`ANCHOR_HALF_LIVES` of the shortest half-life old (a weight after the anchor grows as ``2 ** ((s - a) /
h)``), and a rebase of the absorbed statistics (:class:`~envsched.method.history.statistics.DecayedStatistics`).
The sampler then recomputes the whole prediction with the anchor at the latest step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from envsched.method.config import SchedulerConfig
from envsched.method.history import signal
from envsched.method.history.prediction import Prediction, RelationOperator
from envsched.method.history.sets import distinct, member, union
from envsched.method.history.statistics import History

__all__ = ["ANCHOR_HALF_LIVES", "IncrementalPrediction", "RelationRows"]

#: The anchor is moved to the latest step (a whole recomputation) once it is this many of the shortest half-life
#: old: a weight after the anchor is at most ``2 ** ANCHOR_HALF_LIVES``.
ANCHOR_HALF_LIVES = 256


@dataclass(frozen=True)
class RelationRows:
    """A relation's neighbour weights by row, padded to the longest row (each row's columns ascending, as the
    column-major products of :func:`~envsched.method.history.prediction.predict` add them; a missing entry has
    weight 0 and column 0), and by column (the tasks that have a task as a neighbour); built once per sampler."""

    index: np.ndarray  # (N, K) int32
    weight: np.ndarray  # (N, K)
    env: np.ndarray  # (N, K) int32: each neighbour's environment
    valid: np.ndarray  # (N, K) bool: the row's entries (the rest is padding)
    row_total: np.ndarray
    col_indptr: np.ndarray
    col_indices: np.ndarray
    col_data: np.ndarray

    @classmethod
    def of(cls, operator: RelationOperator, env_codes: np.ndarray) -> RelationRows:
        csc = operator.matrix
        csr = sp.csr_matrix(csc)
        csr.sort_indices()
        n = csr.shape[0]
        length = np.diff(csr.indptr)
        k = int(length.max()) if n else 0
        # entry j of row i goes to the flat slot i * k + (j - indptr[i])
        flat = np.arange(csr.indices.size, dtype=np.int64)
        flat += np.repeat(np.arange(n, dtype=np.int64) * k - csr.indptr[:-1], length)
        index = np.zeros((n, k), dtype=np.int32)
        weight = np.zeros((n, k))
        index.ravel()[flat] = csr.indices
        weight.ravel()[flat] = csr.data
        valid = np.zeros((n, k), dtype=bool)
        valid.ravel()[flat] = True
        return cls(index=index, weight=weight, env=np.asarray(env_codes, dtype=np.int32)[index], valid=valid,
                   row_total=operator.row_total, col_indptr=csc.indptr, col_indices=csc.indices,
                   col_data=csc.data)

    def having(self, tasks: np.ndarray, entries: np.ndarray | None = None) -> np.ndarray:
        """The tasks that have one of ``tasks`` as a neighbour (distinct, ascending; ``entries``: ``entries(tasks)``,
        where already at hand)."""
        return distinct(self.col_indices[self.entries(tasks) if entries is None else entries])

    def entries(self, tasks: np.ndarray) -> np.ndarray:
        """The entries of the columns ``tasks`` (column by column, in the order given)."""
        return _ranges(self.col_indptr[tasks], self.col_indptr[tasks + 1])

    def share_of(self, tasks: np.ndarray, rows: np.ndarray, entries: np.ndarray | None = None) -> np.ndarray:
        """For each of ``rows`` (distinct, ascending): the share of its neighbour weight on ``tasks``,
        ``sum_{j in tasks} w_ij / sum_j w_ij`` (``entries``: ``entries(tasks)``, where already at hand)."""
        if entries is None:
            entries = self.entries(tasks)
        having = self.col_indices[entries]
        mine = member(having, rows)
        weight = np.bincount(np.searchsorted(rows, having[mine]), weights=self.col_data[entries][mine],
                             minlength=rows.size)
        total = self.row_total[rows]
        return np.divide(weight, total, out=np.zeros(rows.size), where=total > 0)


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(lo[i], hi[i])``."""
    sizes = hi - lo
    return np.repeat(lo - np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes) + np.arange(int(sizes.sum()))


def _row_sums(weight: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``(k, C)``: each row's ``sum_c weight[c] * values[c]`` (``weight (K, k)``, ``values (K, k, C)``: entry
    ``c`` of every row), added from 0.0 one entry after the other, as a column-major sparse product adds a row's
    entries (a padded or unobserved entry adds ``+0.0``, which changes no sum: a sum from 0.0 is never ``-0.0``)."""
    products = weight[:, :, None] * values
    out = np.zeros(values.shape[1:])
    for c in range(weight.shape[0]):
        out += products[c]
    return out


def _column_sums(index: np.ndarray, values: np.ndarray, length: int) -> np.ndarray:
    """``(length, C)``: per column of ``values`` (``(len(index), C)``) the sums of its rows by ``index``, each sum
    adding its rows in order from 0.0, as ``numpy.bincount`` and the sparse products do (one bincount over the
    flattened rows: bin ``index * C + c`` gets its rows in row order)."""
    c = values.shape[1]
    flat = (index[:, None] * c + np.arange(c)[None, :]).ravel()
    return np.bincount(flat, weights=values.ravel(), minlength=length * c).astype(float, copy=False).reshape(length, c)


class IncrementalPrediction:
    """The prediction of a sampler's history with its recency weights valued at an anchor, kept up to date.

    Built from ``prediction`` (``predict`` of ``history`` now, with the weights valued at the latest step: the
    anchor), it takes over that prediction's arrays (in row-major copies) and updates them in place; the clocked
    tasks' posterior and scores, and the other tasks' posterior and half-life scores, are written to them by
    :meth:`materialize` only (the explanation records read them), while the informativeness of the unclocked tasks
    is always current. ``caps_active``: where the consecutive cap and the exposure discount apply now (the
    policy's), kept up to date the same way.

    Args:
        prediction: ``predict(history, graph, config, operators)`` of now (both relations are computed here).
        history: the sampler's history (its :attr:`~History.journal` is set here and read by :meth:`sync`).
        config: the sampler's configuration (:meth:`supports` it).
        relations: the within and cross :class:`RelationRows`.
        env_codes, env_order, env_starts: the environment of each task, and the tasks by environment (positions
            ascending in each): ``env_order[env_starts[e]:env_starts[e + 1]]``.
        caps_active: ``(N,)`` bool.
    """

    def __init__(self, prediction: Prediction, history: History, config: SchedulerConfig,
                 relations: tuple[RelationRows, RelationRows], env_codes: np.ndarray, env_order: np.ndarray,
                 env_starts: np.ndarray, caps_active: np.ndarray) -> None:
        self.config = config
        self.prediction = pr = prediction
        #: the step the weights are valued at (the latest step of the history ``prediction`` was computed from)
        self.anchor = history.step - 1 if pr.anchor is None else int(pr.anchor)
        self.reference = pr.reference.copy()
        self.both_reference = np.concatenate([self.reference, self.reference])
        self.decayed_at = history.decayed.at if history.decayed is not None else None
        self.relations = relations
        self.env_codes = np.asarray(env_codes, dtype=np.int64)
        self.env_order, self.env_starts = env_order, env_starts
        sizes = np.diff(env_starts).astype(float)
        self.env_row_total = sizes - 1.0  # per environment (its tasks' row total in the environment relation)
        self.n = self.env_codes.size
        self.half_lives = (float(config.long_half_life), float(config.short_half_life))
        self.histories = (pr.long.history, pr.short.history)
        self.anchored = tuple(h.weight.copy() if h.anchored_weight is None else h.anchored_weight.copy()
                              for h in self.histories)
        for h in self.histories:
            h.anchored_weight = None
        # row-major storage: an update reads and writes rows
        for rel in (0, 1):
            pr.long.relations.get(rel)
            pr.short.relations.get(rel)
            est, has = pr.propagated[rel]
            est = np.ascontiguousarray(est)
            pr.propagated[rel] = (est, has)
            pr.long.relations._done[rel] = (est[:, :3], has)
            pr.short.relations._done[rel] = (est[:, 3:], has)
        for half, hp in enumerate((pr.long, pr.short)):
            c = slice(3 * half, 3 * half + 3)
            if config.use_within_edges and config.use_cross_edges:
                hp.prior = np.ascontiguousarray(hp.prior)
            elif config.use_within_edges:
                hp.prior = pr.propagated[0][0][:, c]
            elif config.use_cross_edges:
                hp.prior = pr.propagated[1][0][:, c]
            hp.posterior = np.ascontiguousarray(hp.posterior)
            hp.v_direct = hp.posterior[:, 1]
        self.environment = pr.environment
        self.caps = np.asarray(caps_active, dtype=bool).copy()
        self.observed = self.anchored[0] > 0
        self.env_estimate: np.ndarray | None = None  # (E, 6): an unobserved task's environment estimate
        if self.environment is not None:  # (the same rows predict wrote, and each environment's common one)
            self.env_estimate = np.zeros((sizes.size, 6))
            self._environment_rows(np.arange(sizes.size), env_order)
        self.dispatched = history.last_selected >= 0
        self.clocked = self._clocked(history, np.arange(self.n))
        self.clocked_rows = np.flatnonzero(self.clocked)
        self._compact()
        #: ``(N,)`` bool: unclocked rows whose posterior and scores are not written (:meth:`materialize`)
        self.stale_rows = np.zeros(self.n, dtype=bool)
        #: ``(N,)`` bool: unclocked rows whose cross estimate (so prior and informativeness) is not recomputed yet
        #: since an environment estimate it reads moved; :attr:`upper` bounds their informativeness
        self.dirty = np.zeros(self.n, dtype=bool)
        self.upper = np.zeros(self.n)
        self._cleaned: list[np.ndarray] = []  # rows made exact since the last sync (reported by it)
        self.clocked_written = True  # whether the clocked rows' are (as computed at the refresh)
        self._ticked: tuple[np.ndarray, ...] | None = None  # the clocked rows, prior, means and W of the last tick
        history.journal = []
        self._step_refs = self._step_references(history)
        #: tasks whose observation count (in flight included) may have changed since a reader set it to a list: the
        #: tasks :meth:`sync` brought up to date (an observation, a discard) and those :meth:`drawn`
        self.counted: list[np.ndarray] | None = None

    # ------------------------------------------------------------------ configuration and staleness
    @staticmethod
    def supports(config: SchedulerConfig) -> bool:
        """Whether :class:`IncrementalPrediction` computes this configuration's prediction: the default's rules
        (the decayed or the full history), the variance score without the paper's calibration (ranks over all N),
        the neighbours as the within relation, both phases. Other configurations recompute every draw."""
        return (not config.is_paper and not config.use_calibration and config.exploitation_score == "variance"
                and config.within_relation == "neighbours" and config.mode == "full")

    def stale(self, history: History) -> str | None:
        """Why this prediction cannot be brought up to date (a new global reference, an old anchor, rebased
        absorbed statistics), or ``None``."""
        ref = history.global_reference()
        if ref is None or not np.array_equal(ref, self.reference):
            return "reference"
        if history.step - 1 - self.anchor > ANCHOR_HALF_LIVES * min(self.half_lives):
            return "anchor"
        if history.decayed is not None and history.decayed.at != self.decayed_at:
            return "rebase"
        return None

    def clock(self, history: History, half_life: float) -> float:
        """The factor from the weights valued at the anchor to the weights now."""
        return 0.5 ** ((history.step - 1 - self.anchor) / half_life)

    # ------------------------------------------------------------------ the clocked tasks
    def _clocked(self, history: History, rows: np.ndarray) -> np.ndarray:
        return self.observed[rows] | (history.transitions[rows] > 0) | (self.caps[rows] & self.dispatched[rows])

    #: the compact copies (:meth:`_compact_rows`), in its order
    _COMPACT = ("c_prior", "c_values", "c_anchored")

    def _compact_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What the scores of the clocked ``rows`` read, as contiguous copies: prior and own means (long then short)
        and the anchored weights."""
        long_h, short_h = self.histories
        pr = self.prediction
        return (np.concatenate([pr.long.prior[rows], pr.short.prior[rows]], axis=1),
                np.concatenate([long_h.values[rows], short_h.values[rows]], axis=1),
                np.stack([self.anchored[0][rows], self.anchored[1][rows]], axis=1))

    def _compact(self) -> None:
        """The compact copies of every clocked task (:meth:`_compact_rows`)."""
        for name, rows_of in zip(self._COMPACT, self._compact_rows(self.clocked_rows), strict=True):
            setattr(self, name, rows_of)

    def _set_clocked(self, history: History, rows: np.ndarray) -> None:
        """Recompute which of ``rows`` are clocked; the compact copies follow."""
        now = self._clocked(history, rows)
        was = self.clocked[rows]
        if np.array_equal(now, was):
            return
        self.clocked[rows] = now
        gone = rows[~now & was]
        if gone.size:
            self.stale_rows[gone] = True  # (its written values are from before it left)
        if rows.size * 8 > self.n:
            self.clocked_rows = np.flatnonzero(self.clocked)
            self._compact()
            return
        # the compact copies: the rows that stay keep theirs (kept up to date by every update), the rows that leave
        # are deleted, the rows that join are read from the arrays and inserted in order
        old = self.clocked_rows
        out = np.searchsorted(old, gone)
        added = rows[now & ~was]
        if out.size:
            old = np.delete(old, out)
        at = np.searchsorted(old, added)
        self.clocked_rows = np.insert(old, at, added)
        for name, rows_in in zip(self._COMPACT, self._compact_rows(added), strict=True):
            kept = getattr(self, name)
            if out.size:
                kept = np.delete(kept, out, axis=0)
            setattr(self, name, np.insert(kept, at, rows_in, axis=0))

    def drawn(self, history: History, pos: int) -> None:
        """``pos`` was drawn: where the caps apply, its exposure now moves with the clock (it may join the clocked
        tasks)."""
        self.dispatched[pos] = True
        at = np.array([pos], dtype=np.int64)
        if self.counted is not None:
            self.counted.append(at)
        self.clean(at)
        self._set_clocked(history, at)

    # ------------------------------------------------------------------ bringing it up to date
    def _step_references(self, history: History) -> dict[int, tuple[bytes, bool]]:
        refs, has = history.step_references()
        ls = history.live_start
        return {ls + i: (refs[i].tobytes(), bool(has[i])) for i in range(has.size)}

    def sync(self, history: History) -> np.ndarray:
        """Bring the prediction up to the history's observations (:meth:`stale` must be ``None``); returns the
        tasks whose informativeness (or bound) may have changed among the unclocked ones, that :meth:`clean` made
        exact since the last sync, or that joined or left the clocked ones (distinct, ascending). The clock is
        :meth:`tick`'s."""
        changed = [np.atleast_1d(np.asarray(c, dtype=np.int64)) for c in history.journal]
        history.journal.clear()
        refs = self._step_references(history)
        moved = [s for s, r in refs.items() if self._step_refs.get(s, (None, False)) != r and
                 (r[1] or self._step_refs.get(s, (None, False))[1])]
        self._step_refs = refs
        if moved:  # a step's reference changed (a late group): every observation of that step is centred anew
            g = history.logged_groups()
            changed.append(g.task[member(g.step, np.array(sorted(moved), dtype=np.int64))])
        tasks = union(*changed) if changed else np.zeros(0, dtype=np.int64)
        if self.counted is not None and tasks.size:
            self.counted.append(tasks)
        cleaned = union(*self._cleaned) if self._cleaned else tasks[:0]
        self._cleaned.clear()
        if not tasks.size:
            return cleaned
        return union(self._touch(history, tasks), cleaned)

    def _touch(self, history: History, tasks: np.ndarray) -> np.ndarray:
        cfg = self.config
        a, ref = self.anchor, self.reference
        centered = history.centered_observations(ref)
        for k, (h, hl) in enumerate(zip(self.histories, self.half_lives, strict=True)):
            th = history.task_history_of(tasks, hl, ref, centered, a)
            h.values[tasks] = th.values
            h.groups[tasks] = th.groups
            h.weight[tasks] = th.weight
            self.anchored[k][tasks] = th.anchored_weight
        self.observed[tasks] = self.anchored[0][tasks] > 0
        if cfg.caps_on_decline_only:
            self.caps[tasks] = signal.declining(history, cfg.long_half_life, cfg.short_half_life, a, tasks)
        within = [self.relations[0].having(tasks), tasks]
        direct = self.relations[1].having(tasks)  # a neighbour's own history changed (or it became observed)
        cross = direct
        lazy = np.zeros(0, dtype=np.int64)
        moved = 0.0
        if self.environment is not None:
            envs = distinct(self.env_codes[tasks])
            members = self.members(envs)
            moved = self._environment_rows(envs, members)
            within.append(members)
        within = union(*within)
        if self.environment is not None:
            # the others read only unobserved neighbours' environment estimates that moved (an observed one's
            # substitute cancels): a clocked one, or one whose prior is recomputed anyway, now; an unclocked one
            # when it could be the pick or is read (:meth:`clean`)
            rel = self.relations[1]
            entries = rel.entries(members)
            indirect = rel.having(members, entries)
            indirect = indirect[~member(indirect, direct)]
            now = self.clocked[indirect] | member(indirect, within)
            lazy = indirect[~now]
            cross = union(direct, indirect[now])
        cross = union(cross, within[self.dirty[within]])
        self._relation_rows(0, within)
        self._relation_rows(1, cross)
        self.dirty[cross] = False
        rows = union(within, cross)
        self._prior_rows(rows)
        self._set_clocked(history, tasks)
        c = self.clocked_rows
        at = np.searchsorted(c, rows)
        inside = at < c.size
        inside[inside] = c[at[inside]] == rows[inside]
        if inside.any():  # clocked rows: their compact copies
            i = at[inside]
            for name, rows_of in zip(self._COMPACT, self._compact_rows(rows[inside]), strict=True):
                getattr(self, name)[i] = rows_of
        static = rows[~inside]
        self._static_informativeness(static)
        if lazy.size:
            # each moves with its weight on the moved estimates: those of the unobserved tasks of the environments
            unseen = ~self.observed[members]
            unseen_entries = entries[np.repeat(unseen, rel.col_indptr[members + 1] - rel.col_indptr[members])]
            share = np.minimum(rel.share_of(members[unseen], lazy, unseen_entries), 1.0)
            bound = np.where(self.dirty[lazy], self.upper[lazy], self.prediction.informativeness[lazy])
            self.upper[lazy] = bound + share * moved * (1.0 + 1e-9) + 1e-12
            self.dirty[lazy] = True
        return union(static, lazy, tasks)

    def _static_informativeness(self, rows: np.ndarray) -> None:
        """Unclocked ``rows`` (``W = 0``, own means the reference): the informativeness from the prior."""
        if rows.size:
            pr = self.prediction
            pr.informativeness[rows] = self._informativeness(
                np.concatenate([pr.long.prior[rows], pr.short.prior[rows]], axis=1), None, None)
            self.stale_rows[rows] = True

    def clean(self, rows: np.ndarray) -> np.ndarray:
        """Recompute the cross estimate, prior and informativeness of the dirty ones of ``rows``; returns them."""
        rows = rows[self.dirty[rows]]
        if rows.size:
            self._relation_rows(1, rows)
            self.dirty[rows] = False
            self._prior_rows(rows)
            self._static_informativeness(rows)
            self._cleaned.append(rows)
        return rows

    def static_value(self, rows: np.ndarray) -> np.ndarray:
        """The informativeness of unclocked ``rows``, or for a dirty one an upper bound on it (:meth:`clean` makes
        it exact)."""
        return np.where(self.dirty[rows], self.upper[rows], self.prediction.informativeness[rows])

    def members(self, envs: np.ndarray) -> np.ndarray:
        """Every task of the environments ``envs``, environment by environment (ascending positions in each)."""
        return self.env_order[_ranges(self.env_starts[envs], self.env_starts[envs + 1])]

    def _x(self, tasks: np.ndarray) -> np.ndarray:
        """``[1, long m v d, short m v d]`` of ``tasks`` (what the relations propagate)."""
        long_h, short_h = self.histories
        x = np.empty((tasks.size, 7))
        x[:, 0] = 1.0
        x[:, 1:4] = long_h.values[tasks]
        x[:, 4:] = short_h.values[tasks]
        return x

    def _environment_rows(self, envs: np.ndarray, members: np.ndarray) -> float:
        """The environment estimates of every task of ``envs`` (``members``, environment by environment). Returns a
        bound on how much the informativeness of an unclocked task whose cross neighbours' weight is all on these
        environments' unobserved tasks can have moved through them (scaled by that weight's share for any other):
        its cross estimate moves by at most the largest move of their common environment estimate (a
        neighbour-weighted mean), its prior by ``1 - within_fusion_weight`` times that, and the informativeness of a
        prior ``(m, v, d)`` in ``[0, 1] x [0, 0.25] x [0, 1]`` by at most ``(0.5 + decline_penalty)`` times the sum
        over the half-lives of ``(1 - a) |dv| + a (|dd| / 4 + |dm|)`` (``a = reconstruction_weight``; ``|d (d m (1 -
        m))| <= |dd| / 4 + |dm|``)."""
        own = self.observed[members]
        seen = members[own]  # each environment's observed tasks, ascending
        x = self._x(seen)
        sums = _column_sums(np.searchsorted(envs, self.env_codes[seen]), x, envs.size)
        # an unobserved task: its environment's sums; an observed one: less its own row
        e_local = np.searchsorted(envs, self.env_codes[members])
        agg = sums[e_local]
        agg[own] -= x
        total = agg[:, 0]
        has = total > 0
        row_total = self.env_row_total[envs][e_local]
        missing = np.maximum(row_total - total, 0.0)
        est = (agg[:, 1:] + missing[:, None] * self.both_reference) / np.where(has, row_total, 1.0)[:, None]
        est = np.where(has[:, None], est, self.both_reference)
        self.environment[0][members] = est
        self.environment[1][members] = has
        # the unobserved tasks' common row (the environment's sums with no row taken out)
        env_sums = sums
        total = env_sums[:, 0]
        row_e = self.env_row_total[envs]
        has_e = (total > 0) & (row_e > 0)  # an environment of one task has no unobserved task once it is observed
        missing = np.maximum(row_e - total, 0.0)
        common = (env_sums[:, 1:] + missing[:, None] * self.both_reference) / np.where(has_e, row_e, 1.0)[:, None]
        common = np.where(has_e[:, None], common, self.both_reference)
        step = np.abs(common - self.env_estimate[envs]).max(axis=0) if envs.size else np.zeros(6)
        self.env_estimate[envs] = common
        cfg = self.config
        if not cfg.use_cross_edges:
            return 0.0
        a = cfg.reconstruction_weight
        per_half = [(1.0 - a) * step[3 * h + 1] + a * (0.25 * step[3 * h + 2] + step[3 * h]) for h in (0, 1)]
        share = 1.0 - cfg.within_fusion_weight if cfg.use_within_edges else 1.0
        return (0.5 + cfg.decline_penalty) * share * sum(per_half)

    def _relation_rows(self, relation: int, rows: np.ndarray) -> None:
        """The within (0) or cross (1) estimates of ``rows``, as ``predict`` computes them."""
        rel = self.relations[relation]
        cols, w = rel.index[rows].T, rel.weight[rows].T  # (K, k): entry c of every row
        seen = np.flatnonzero(self.observed[cols] & rel.valid[rows].T)  # (flat entries)
        seen_cols = cols.ravel()[seen]
        per_neighbour = self.environment is not None and relation == 1
        # per entry: [1, long, short] of an observed neighbour (less its substitute across), 0 for the others; and
        # across, every neighbour's substitute (its environment's, its own where observed): one sum per row
        values = np.zeros((cols.size, 7))
        x = self._x(seen_cols)
        if per_neighbour:
            own = self.environment[0][seen_cols]
            x[:, 1:] -= own
            sub = np.take(self.env_estimate, rel.env[rows].T.ravel(), axis=0)
            sub[seen] = own
        values[seen] = x
        agg = _row_sums(w, values.reshape(*cols.shape, 7))
        total = rel.row_total[rows]
        has = agg[:, 0] > 0
        if self.environment is None:  # the global reference for every neighbour without history
            missing = np.maximum(total - agg[:, 0], 0.0)
            est = (agg[:, 1:] + missing[:, None] * self.both_reference) / np.where(has, total, 1.0)[:, None]
            est = np.where(has[:, None], est, self.both_reference)
        else:
            if per_neighbour:
                num = agg[:, 1:] + _row_sums(w, sub.reshape(*cols.shape, 6))
            else:
                missing = np.maximum(total - agg[:, 0], 0.0)
                num = agg[:, 1:] + missing[:, None] * self.environment[0][rows]
            est = np.where((total > 0)[:, None], num / np.where(total > 0, total, 1.0)[:, None],
                           self.environment[0][rows])
        est_all, has_all = self.prediction.propagated[relation]
        est_all[rows] = est
        has_all[rows] = has

    def _prior_rows(self, rows: np.ndarray) -> None:
        cfg = self.config
        if not (cfg.use_within_edges and cfg.use_cross_edges):
            return  # (one relation: the prior is its estimates; none: the reference)
        w = cfg.within_fusion_weight
        within, cross = self.prediction.propagated[0][0][rows], self.prediction.propagated[1][0][rows]
        both = w * within + (1.0 - w) * cross
        self.prediction.long.prior[rows] = both[:, :3]
        self.prediction.short.prior[rows] = both[:, 3:]

    # ------------------------------------------------------------------ scores
    def _half_scores(self, prior: np.ndarray, values: np.ndarray | None,
                     weight: np.ndarray | None) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """Posterior, reconstructed variance and score of each half-life of rows with ``prior`` (long then short
        ``m, v, d``), own means ``values`` and weights ``weight`` (``(k, 2)``); ``None``: ``W = 0`` (the own means
        are then the reference and count with weight 0)."""
        cfg = self.config
        n0, a = cfg.prior_strength, cfg.reconstruction_weight
        posts, recs, scores = [], [], []
        for half in (0, 1):
            post = np.empty((prior.shape[0], 3))
            for j in range(3):
                p = prior[:, 3 * half + j]
                if weight is None:  # (n0 p + 0 x) / (n0 + 0), the same bits
                    post[:, j] = (n0 * p) / n0
                else:
                    W = weight[:, half]
                    post[:, j] = (n0 * p + W * values[:, 3 * half + j]) / (n0 + W)
            m, v, d = post[:, 0], post[:, 1], post[:, 2]
            v_rec = d * m * (1.0 - m)
            posts.append(post)
            recs.append(v_rec)
            scores.append((1.0 - a) * v + a * v_rec)
        return posts, recs, scores

    def _informativeness(self, prior: np.ndarray, values: np.ndarray | None,
                         weight: np.ndarray | None) -> np.ndarray:
        _, _, (long, short) = self._half_scores(prior, values, weight)
        decline = np.maximum(0.0, long - short)
        return np.maximum(0.5 * (long + short) - self.config.decline_penalty * decline, 0.0)

    def clocked_weights(self, history: History) -> np.ndarray:
        """``(k, 2)``: the clocked tasks' ``W`` now."""
        return self.c_anchored * np.array([self.clock(history, h) for h in self.half_lives])

    def tick(self, history: History) -> tuple[np.ndarray, np.ndarray]:
        """The clocked tasks (ascending) and their informativeness now (their ``W`` the anchored weights times
        ``0.5 ** ((now - anchor) / h)``)."""
        self.clocked_written = False
        self.forget_ranks()
        weights = self.clocked_weights(history)
        self._ticked = (self.clocked_rows, self.c_prior, self.c_values, weights)
        return self.clocked_rows, self._informativeness(self.c_prior, self.c_values, weights)

    def materialize(self) -> Prediction:
        """Write every task's posterior, scores, decline, informativeness and ``W`` as of the last :meth:`tick` to
        the prediction's arrays (what the explanation records read) and return it."""
        pr = self.prediction
        ticked = self._ticked if not self.clocked_written else None
        self.clean(np.flatnonzero(self.dirty))
        rows = np.flatnonzero(self.stale_rows)
        if rows.size:
            if ticked is not None:
                rows = rows[~member(rows, ticked[0])]
            self._write_rows(rows, np.concatenate([pr.long.prior[rows], pr.short.prior[rows]], axis=1), None, None)
            self.stale_rows[:] = False
        if ticked is not None:
            rows, prior, values, weight = ticked
            for half, h in enumerate(self.histories):
                h.weight[rows] = weight[:, half]
            self._write_rows(rows, prior, values, weight)
            self.clocked_written = True
        return pr

    def _write_rows(self, rows: np.ndarray, prior: np.ndarray, values: np.ndarray | None,
                    weight: np.ndarray | None) -> None:
        pr = self.prediction
        posts, recs, scores = self._half_scores(prior, values, weight)
        for half, hp in enumerate((pr.long, pr.short)):
            hp.posterior[rows] = posts[half]
            hp.v_reconstructed[rows] = recs[half]
            hp.score[rows] = scores[half]
        decline = np.maximum(0.0, scores[0] - scores[1])
        pr.decline[rows] = decline
        pr.informativeness[rows] = np.maximum(0.5 * (scores[0] + scores[1]) - self.config.decline_penalty * decline,
                                              0.0)

    def forget_ranks(self) -> None:
        """Drop the percentile ranks the explanation records read (computed on first read from the arrays)."""
        pr = self.prediction
        for obj in (pr, pr.long, pr.short):
            obj.__dict__.pop("q", None)
