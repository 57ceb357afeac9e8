"""``EnvSchedSampler``: the EnvSched scheduler as an RFC 013 ``TaskSampler``.

Each ``sample(n)`` runs the paper's rollout-history loop (2.1): predict every task's informativeness from
the rollout history propagated over the dual-relation graph (:mod:`~envsched.method.history.prediction`), let the
preset's scheduling policy turn it into the batch's inputs (:mod:`~envsched.method.scheduling.policy`), then
build the batch by coverage and exploitation (:mod:`~envsched.method.scheduling.batch`), and record why each
task was chosen (:mod:`~envsched.method.explain`). ``update`` adds one group's statistics to the history
(:mod:`~envsched.method.history.statistics`).

Asynchronous trainers are first-class: an update is matched to the oldest outstanding dispatch of its task
and dated by the step it was drawn in, so updates may arrive batches later or out of order; a dropped group
is released with ``discard``; groups that never come back stay outstanding (``metrics()["outstanding_groups"]``)
and keep counting as observations of their task for coverage (so the task is not re-drawn as unseen).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import envsched.validation as _check
from envsched.errors import StateError
from envsched.method.config import SchedulerConfig
from envsched.method.explain import build_records, filter_snapshot, write_records
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.history import signal
from envsched.method.history.incremental import IncrementalPrediction, RelationRows
from envsched.method.history.prediction import Prediction, RelationOperator, predict, relation_operators
from envsched.method.history.sets import union
from envsched.method.history.statistics import PHASES, History
from envsched.method.migrations import read_config
from envsched.method.scheduling.batch import (
    BatchSimilarity,
    Pick,
    SchedulingContext,
    SimilarityIndex,
    build_batch,
    representative_scores,
)
from envsched.method.scheduling.identifier_filter import IdentifierFilter, IdentifierVerdict, Trajectory
from envsched.method.scheduling.incremental import IncrementalExploitation
from envsched.method.scheduling.policy import (
    DEBT_BOUND,
    TRACE_SUMMARY_KEYS,
    AdaptivePolicy,
    PolicyTrace,
    SchedulingPolicy,
    make_policy,
)
from envsched.pool.pool import TaskPool
from envsched.samplers.base import BaseSampler, GroupResult
from envsched.validation import check_number

__all__ = ["EnvSchedSampler", "make_envsched_paper_sampler", "make_envsched_sampler"]


@dataclass(frozen=True)
class _Anchor:
    """What the maintained prediction of one-task draws was started from: its anchor step, the global reference and
    the step the absorbed statistics were valued at then (:class:`IncrementalPrediction`). The prediction itself is
    a function of the history and these, rebuilt from them after ``load_state_dict`` or a failed draw."""

    step: int
    reference: tuple[float, float, float]
    decayed_at: int | None


class _AtPositions:
    """Values of a per-task array at a few positions (the explanation records of a one-task draw read the policy's
    per-task values only at the pick): ``values[pos]`` and ``values.dtype`` as a numpy array's. A value may be a
    callable of no argument, computed when first read (from what it captured at the draw)."""

    def __init__(self, values: dict[int, Any], dtype: Any) -> None:
        self._values, self.dtype = values, np.dtype(dtype)

    def __getitem__(self, pos: int) -> Any:
        value = self._values[int(pos)]
        if callable(value):
            value = self._values[int(pos)] = value()
        return value


@dataclass(frozen=True, eq=False)
class _PendingExplanation:
    """What the last batch's explanation records are built from, on demand (:meth:`EnvSchedSampler.explanations`)."""

    step: int
    picks: list[Pick]
    prediction: Prediction | None
    snapshot: dict[int, tuple[int, float, bool, int]]  # filter_snapshot of the picks
    flags: dict[int, str]  # identifier flags at the time
    trace: PolicyTrace | None  # the policy's trace (None: cold start, no policy ran)
    #: writes out what the maintained prediction of a one-task draw holds compactly (before the next draw)
    materialize: Any = None


class EnvSchedSampler(BaseSampler):
    """EnvSched (arXiv 2610.37609): informativeness prediction on a dual-relation graph plus
    coverage-aware batch scheduling.

    Args:
        tasks: a :class:`~envsched.pool.TaskPool` (or a sequence of task specs with ``id`` and ``env``).
        graph: the dual-relation graph over exactly these tasks, in the same order. ``None`` builds it with
            :func:`envsched.method.graph.build.build_graph` and the default :class:`GraphConfig`.
        config: scheduler hyperparameters (:class:`~envsched.method.config.SchedulerConfig`). The default,
            ``SchedulerConfig()``, is the adaptive mode; ``SchedulerConfig.paper()`` is the faithful paper
            preset.
        seed: seed of the random generator that breaks exact ties (deterministic given the seed).
        identifier_filter: the environment's identifier filter, any
            :class:`~envsched.method.scheduling.identifier_filter.IdentifierFilter` (BFCL multi-turn's:
            :class:`~envsched.envs.bfcl_identifier_filter.BfclIdentifierFilter`); trajectories reach it via
            :meth:`submit_trajectory`.
        run_file: a JSONL file to which every ``sample()`` appends one explanation record per selected task
            (``envsched explain RUN_FILE`` prints them).
        reward_range, require_dispatch: as :class:`~envsched.samplers.base.BaseSampler`.
    """

    def __init__(self, tasks: TaskPool | Sequence[Any], graph: DualRelationGraph | None = None,
                 config: SchedulerConfig | None = None, seed: int | None = 0, *,
                 identifier_filter: IdentifierFilter | None = None,
                 run_file: str | os.PathLike[str] | None = None,
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True) -> None:
        if config is not None and not isinstance(config, SchedulerConfig):
            raise TypeError(f"config must be a SchedulerConfig, got {type(config).__name__}")
        if identifier_filter is not None and not callable(getattr(identifier_filter, "check", None)):
            raise TypeError("identifier_filter must implement IdentifierFilter (a check(task, trajectory) method "
                            f"returning an IdentifierVerdict), got {type(identifier_filter).__name__}")
        super().__init__(tasks, seed=seed, reward_range=reward_range, require_dispatch=require_dispatch)
        self.config = config if config is not None else SchedulerConfig()
        env_names = [self.env_of(i) for i in range(len(self.tasks))]
        env_names = ["" if e is None else str(e) for e in env_names]
        self.envs: list[str] = sorted(set(env_names))
        env_pos = {e: i for i, e in enumerate(self.envs)}
        self.env_codes = np.fromiter((env_pos[e] for e in env_names), dtype=np.int64, count=len(env_names))
        if graph is None:
            graph = self._build_graph(tasks)
        self._check_graph(graph, env_names)
        self.graph = graph
        self.identifier_filter = identifier_filter
        self.run_file = Path(run_file) if run_file is not None else None
        self._history = History(len(self.tasks), self.env_codes, len(self.envs), self.config)
        self._centrality = representative_scores(graph)
        self._similarity = SimilarityIndex(graph, self.env_codes)
        self._operators = relation_operators(graph, self.config.within_relation)
        self._tool_indptr, self._tool_codes, self.num_tools = self._tool_table()
        self._flags: dict[int, str] = {}
        self._last_picks: list[Pick] = []
        self._last_records: list[dict[str, Any]] | None = []
        self._pending_explain: _PendingExplanation | None = None
        self._last_prediction: Prediction | None = None
        self._batch_totals = {"batches": 0, "envs": 0, "tools": 0}
        self._last_tools = 0
        #: the preset's scheduling policy (:mod:`envsched.method.scheduling.policy`)
        self.policy: SchedulingPolicy = make_policy(self.config, self.env_codes, len(self.envs))
        self._last_trace = PolicyTrace()  # of the last batch a policy ran for (metrics and state)
        #: the coverage share owed by draws too small to hold a coverage slot (policy.settle_coverage_debt)
        self._coverage_debt = 0.0
        # small draws from a maintained prediction (_select_few); the structures are built on the first one
        self._anchor: _Anchor | None = None
        self._incremental: tuple[IncrementalPrediction, IncrementalExploitation] | None = None
        self._relation_rows: tuple[RelationRows, RelationRows] | None = None
        self._tiebreak_reader: np.random.Generator | None = None  # (_tiebreak_of: set to a state, never seeded)

    # ------------------------------------------------------------------ construction helpers
    def _build_graph(self, tasks: Any) -> DualRelationGraph:
        try:
            from envsched.method.config import GraphConfig
            from envsched.method.graph.build import build_graph
        except ImportError as exc:
            raise RuntimeError("graph=None needs envsched.method.graph.build.build_graph, which is not "
                               f"available ({exc}); pass a DualRelationGraph") from None
        pool = tasks if isinstance(tasks, TaskPool) else TaskPool(self.tasks, reward_range=self.reward_range)
        return build_graph(pool, GraphConfig())

    def _check_graph(self, graph: DualRelationGraph, env_names: list[str]) -> None:
        if not isinstance(graph, DualRelationGraph):
            raise TypeError(f"graph must be a DualRelationGraph, got {type(graph).__name__}")
        n = len(self.tasks)
        if graph.num_nodes != n:
            raise ValueError(f"the graph has {graph.num_nodes} nodes but the sampler has {n} tasks: build the "
                             "graph from this pool")
        if list(graph.task_ids) != self._keys:
            bad = next(i for i, (a, b) in enumerate(zip(graph.task_ids, self._keys, strict=True)) if a != b)
            raise ValueError(f"the graph's node {bad} is task {graph.task_ids[bad]!r} but the sampler's task "
                             f"{bad} is {self._keys[bad]!r}: the graph must list the same tasks in the same order")
        for name in ("within_index", "within_weight", "within_similarity"):
            if getattr(graph, name).shape != graph.within_index.shape or graph.within_index.shape[0] != n:
                raise ValueError(f"graph.{name} must have shape (N, K_within) with N = {n}")
        for name in ("cross_index", "cross_weight", "cross_similarity"):
            if getattr(graph, name).shape != graph.cross_index.shape or graph.cross_index.shape[0] != n:
                raise ValueError(f"graph.{name} must have shape (N, K_cross) with N = {n}")
        for name in ("within_index", "cross_index"):
            idx = getattr(graph, name)
            if idx.size and (idx.min() < -1 or idx.max() >= n):
                raise ValueError(f"graph.{name} has neighbour indices outside [-1, {n})")
        for name in ("full_features", "abstract_features"):
            if getattr(graph, name).shape[0] != n:
                raise ValueError(f"graph.{name} must have {n} rows")
        codes = np.asarray(graph.env_codes)
        if codes.shape != (n,):
            raise ValueError(f"graph.env_codes must have shape ({n},)")
        genv = np.asarray(graph.envs, dtype=object)[codes]
        if not np.array_equal(genv, np.asarray(env_names, dtype=object)):
            bad = int(np.flatnonzero(genv != np.asarray(env_names, dtype=object))[0])
            raise ValueError(f"the graph puts task {self._keys[bad]!r} in environment {genv[bad]!r}, the task "
                             f"spec says {env_names[bad]!r}")

    def _tool_table(self) -> tuple[np.ndarray, np.ndarray, int]:
        vocab: dict[str, int] = {}
        indptr = [0]
        codes: list[int] = []
        for t in self.tasks:
            tools = t.get("tools") if isinstance(t, Mapping) else None
            names = {str(x["name"]) for x in tools or [] if isinstance(x, Mapping) and "name" in x}
            codes.extend(vocab.setdefault(nm, len(vocab)) for nm in sorted(names))
            indptr.append(len(codes))
        return np.asarray(indptr, dtype=np.int64), np.asarray(codes, dtype=np.int64), len(vocab)

    def __repr__(self) -> str:
        c = self.config
        preset = ("default" if c == SchedulerConfig(rollouts_per_task=c.rollouts_per_task) else "paper" if c.is_paper
                  else "custom")
        return (f"EnvSchedSampler({len(self.tasks)} tasks in {len(self.envs)} environments, seed={self.seed}, "
                f"{preset}, mode={c.mode!r}, coverage share {'<= ' if c.adaptive_share else ''}"
                f"{c.coverage_share:g})")

    def get_params(self) -> dict[str, Any]:
        return {"seed": self.seed, "config": self.config.to_dict(), "run_file": str(self.run_file or ""),
                "reward_range": self.reward_range, "require_dispatch": self.require_dispatch}

    # ------------------------------------------------------------------ BaseSampler hooks
    def check_sample_size(self, n: Any) -> int:
        """As :meth:`BaseSampler.check_sample_size`, and refuses an ``n`` whose coverage share leaves no
        exploitation slot (:meth:`SchedulerConfig.coverage_slots_for`)."""
        n = super().check_sample_size(n)
        self.config.coverage_slots_for(n)
        return n

    def _select(self, n: int) -> list[int]:
        self.config.coverage_slots_for(n)  # refuses an n that leaves no exploitation slot (no state changed)
        one = self._few_supported(n)
        if one:
            positions = self._select_few(n)
            if positions is not None:
                return positions
        else:
            self._drop_incremental(forget=True)
        tiebreak = self._rng.random(len(self.tasks))
        env_tiebreak = self._rng.random(len(self.envs))
        prediction = predict(self._history, self.graph, self.config, self._operators)
        flagged = np.zeros(len(self.tasks), dtype=bool)
        if self._flags:
            flagged[list(self._flags)] = True
        inputs, trace = None, None
        if prediction is not None:  # cold start (no scored history yet) has its own rules
            inputs, trace = self.policy.inputs(n, self._history, prediction, tiebreak, self._rng,
                                               coverage_debt=self._coverage_debt)
        ctx = SchedulingContext(graph=self.graph, history=self._history, prediction=prediction, config=self.config,
                                env_codes=self.env_codes, num_envs=len(self.envs), tiebreak=tiebreak,
                                env_tiebreak=env_tiebreak, identifier_flagged=flagged, centrality=self._centrality,
                                similarity=self._similarity, inputs=inputs)
        picks = build_batch(ctx, n)
        if len(picks) != n:  # cannot happen for n <= N (fill ignores every cap); guard the invariant
            raise RuntimeError(f"EnvSched built {len(picks)} picks for a batch of {n}")
        positions = [p.pos for p in picks]
        pos = np.asarray(positions, dtype=np.int64)
        tools = np.concatenate([self._tool_codes[self._tool_indptr[p]:self._tool_indptr[p + 1]] for p in pos])
        n_tools, n_envs = int(np.unique(tools).size), int(np.unique(self.env_codes[pos]).size)
        if one and prediction is not None:  # one-task draws from here on keep this prediction up to date
            self._start_incremental(prediction, trace)
        # commit: recording the batch is the last step that changes the history; everything that can fail on
        # a valid state ran above (BaseSampler.sample restores the generator and _select_checkpoint's fields)
        step = self._history.record_batch(positions, [p.phase for p in picks])
        if one and self._incremental is not None:
            self._drawn(positions)
        self._last_picks = picks
        self._last_prediction = prediction
        # explanation records are built on demand (explanations()) or every step with a run file
        if trace is not None:
            self._last_trace = trace
            if trace.coverage_debt is not None:
                self._coverage_debt = trace.coverage_debt
        self._pending_explain = _PendingExplanation(step, picks, prediction, filter_snapshot(self._history, positions),
                                                    dict(self._flags), trace)
        self._last_records = None
        self._last_tools = n_tools
        self._batch_totals["batches"] += 1
        self._batch_totals["envs"] += n_envs
        self._batch_totals["tools"] += n_tools
        if self.run_file is not None:
            try:
                write_records(self.run_file, self._records(), self._run_header)
            except Exception as exc:
                warnings.warn(f"could not append explanations to {self.run_file}: {type(exc).__name__}: {exc}",
                              RuntimeWarning, stacklevel=3)
        return positions

    # ------------------------------------------------------------------ one-task draws
    def _incremental_supported(self) -> bool:
        """Whether ``sample(1)`` is drawn from a maintained prediction: the default's rules (and the configurations
        :meth:`IncrementalPrediction.supports`), without a run file (whose records read every draw's whole
        prediction)."""
        return (self.run_file is None and isinstance(self.policy, AdaptivePolicy)
                and IncrementalPrediction.supports(self.config))

    #: ``sample(n)`` with ``n > 1`` is drawn from the maintained prediction on pools of at least this many tasks (a
    #: draw then brings the neighbourhoods of its updates up to date, about ``tasks per environment x cross
    #: neighbours`` rows each, instead of a pass over the pool: on the benchmark pools ``sample(2)`` costs about the
    #: same either way at 2,550 tasks, a third less at 10,000 and a third at 100,000)
    few_draws_min_tasks: int = 5_000

    def _few_supported(self, n: int) -> bool:
        """Whether ``sample(n)`` is drawn from a maintained prediction: :meth:`_incremental_supported`, and one task,
        or a batch small enough that the caps put each of its tasks in another environment (``caps_for(n) == (1,
        1)``: ``n <= 8`` at the default caps, so that every penalty is a similarity across environments) from a pool
        of at least :attr:`few_draws_min_tasks` tasks."""
        if not self._incremental_supported():
            return False
        return n == 1 or (len(self.tasks) >= self.few_draws_min_tasks and self.config.caps_for(n) == (1, 1))

    def _drop_incremental(self, *, forget: bool) -> None:
        """Drop the maintained prediction (``forget``: and its anchor, so that the next one-task draw starts
        anew from a whole computation)."""
        self._incremental = None
        self._history.journal = None
        if forget:
            self._anchor = None

    def _start_incremental(self, prediction: Prediction, trace: PolicyTrace | None) -> None:
        """Keep ``prediction`` (of now, computed by this draw) up to date from here on; its anchor is now."""
        caps = trace.caps_active if trace is not None and trace.caps_active is not None else None
        if caps is None:
            caps = np.ones(len(self.tasks), dtype=bool)
        self._incremental = self._build_incremental(prediction, caps)
        engine = self._incremental[0]
        self._anchor = _Anchor(engine.anchor, tuple(float(x) for x in engine.reference), engine.decayed_at)

    def _build_incremental(self, prediction: Prediction,
                           caps: np.ndarray) -> tuple[IncrementalPrediction, IncrementalExploitation]:
        if self._relation_rows is None:
            within, cross = self._operators
            assert isinstance(within, RelationOperator)  # IncrementalPrediction.supports: the neighbours
            self._relation_rows = (RelationRows.of(within, self.env_codes), RelationRows.of(cross, self.env_codes))
        idx = self._similarity
        engine = IncrementalPrediction(prediction, self._history, self.config, self._relation_rows, self.env_codes,
                                       idx.order, idx.starts, caps)
        return engine, IncrementalExploitation(engine, self.config, self._flags)

    def _drawn(self, positions: list[int]) -> None:
        engine, chooser = self._incremental
        for pos in positions:
            engine.drawn(self._history, pos)
        chooser.update(np.array(sorted(positions), dtype=np.int64), self._flags)

    def _resume_incremental(self) -> tuple[IncrementalPrediction, IncrementalExploitation] | None:
        """The maintained prediction of :attr:`_anchor`, recomputed from the history (after ``load_state_dict`` or
        a failed draw): the same bits the uninterrupted one holds."""
        a = self._anchor
        h = self._history
        if a is None:
            return None
        reference = np.array(a.reference)
        now = h.global_reference()
        if (now is None or not np.array_equal(now, reference) or (h.decayed.at if h.decayed is not None else None)
                != a.decayed_at):
            return None  # it would be stale (IncrementalPrediction.stale): the next draw starts anew
        prediction = predict(h, self.graph, self.config, self._operators, anchor=a.step, reference=reference)
        c = self.config
        if c.caps_on_decline_only:
            caps = signal.declining(h, c.long_half_life, c.short_half_life, a.step)
        else:
            caps = np.ones(len(self.tasks), dtype=bool)
        engine, pick = self._build_incremental(prediction, caps)
        engine.decayed_at = a.decayed_at
        return engine, pick

    def _tiebreak_of(self, state: dict[str, Any], positions: np.ndarray) -> np.ndarray:
        """The tiebreak draws of ``positions`` (ascending) that ``rng.random(N)`` from the generator ``state`` would
        give, read without drawing the others when they are few (the generator jumps ahead): the draws from the first
        position to the last at once where they are many or close together (an environment's tasks), else one by
        one."""
        if not positions.size:
            return np.zeros(0)
        gen = self._tiebreak_reader
        if gen is None:  # (one generator reused: a fresh PCG64() gathers entropy, several times a read's cost)
            gen = self._tiebreak_reader = np.random.Generator(np.random.PCG64(0))
        bg = gen.bit_generator
        bg.state = state
        first = int(positions[0])
        span = int(positions[-1]) - first + 1
        if positions.size > 64 or span <= max(self.tiebreak_span, 8 * positions.size):
            bg.advance(first)
            return gen.random(span)[positions - first]
        out = np.empty(positions.size)
        at = 0
        for i, p in enumerate(positions.tolist()):
            bg.advance(p - at)
            out[i] = (int(bg.random_raw()) >> 11) * (1.0 / 9007199254740992.0)  # numpy's next_double
            at = p + 1
        return out

    #: Tiebreak draws of positions at most this far apart (or eight per position read) are drawn as one run.
    tiebreak_span: int = 1_024

    def _select_few(self, n: int) -> list[int] | None:
        """``sample(n)`` from the maintained prediction, for a batch whose every task comes from another environment
        (:meth:`_few_supported`: ``sample(1)``, and the ``sample(2)`` of TRL's trainer): the picks, tiebreaks, trace
        and records the whole computation gives (exactly, on the prediction with the anchor's recency weights), in
        time that does not grow with the pool; ``None`` when this draw needs the whole computation (a new global
        reference, an old anchor, no eligible task, no maintained prediction yet). The coverage slots are the
        policy's (with the coverage debt, :func:`~envsched.method.scheduling.policy.settle_coverage_debt`) and come
        first (:meth:`_coverage_pick`), then exploitation's, each pick penalised by its similarity to the picks
        before it (:class:`~envsched.method.scheduling.batch.BatchSimilarity`), as in
        :func:`~envsched.method.scheduling.batch.build_batch`."""
        h = self._history
        if self._incremental is None:
            self._incremental = self._resume_incremental()
            if self._incremental is None:
                return None
        engine, chooser = self._incremental
        if engine.stale(h) is not None:
            self._drop_incremental(forget=True)
            return None
        chooser.update(engine.sync(h), self._flags)
        clocked, info = engine.tick(h)
        state = self._rng.bit_generator.state
        policy = self.policy
        assert isinstance(policy, AdaptivePolicy)  # (_incremental_supported)
        env_counts = h.env_selection_counts()
        slots, debt, adaptive = policy.coverage_slots(n, h, env_counts, self._coverage_debt)
        in_batch_env = np.zeros(len(self.envs), dtype=bool)
        similarity = BatchSimilarity(self._similarity) if n > 1 else None  # (the last pick penalises nobody)
        picks: list[Pick] = []
        coverage: dict[int, float | Any] = {}  # each pick's coverage score, or a callable giving its tiebreak draw

        def tiebreak_of(pos: np.ndarray) -> np.ndarray:
            return self._tiebreak_of(state, pos)

        for k in range(n):
            if k < slots:
                got = self._coverage_pick(engine, clocked, info, state, env_counts, in_batch_env,
                                          similarity if picks else None, k + 1 < n)
                if got is not None:
                    pick, coverage[got[0].pos] = got
            elif not picks:
                got = chooser.pick(h, clocked, info, tiebreak_of)
                if got is not None:
                    pos, base, exposure, discount = got
                    # (no batch member yet: the penalty is none, and the score is the base score)
                    pick = Pick(pos=pos, phase="exploitation", rank=1, score=base, base_score=base,
                                max_similarity=0.0, exposure=exposure, exposure_discount=discount)
            else:
                got = chooser.pick_penalised(h, clocked, info, tiebreak_of, in_batch_env, similarity.max_sim)
                if got is not None:
                    pos, score, base, ms, exposure, discount = got
                    pick = Pick(pos=pos, phase="exploitation", rank=k + 1, score=score, base_score=base,
                                max_similarity=ms, exposure=exposure, exposure_discount=discount)
            if got is None:  # (the whole computation goes on to its other phases)
                self._drop_incremental(forget=True)
                return None
            pos = pick.pos
            if pos not in coverage:
                coverage[pos] = lambda at=pos: float(self._tiebreak_of(state, np.array([at]))[0])
            e = int(self.env_codes[pos])
            pick.rank = k + 1
            pick.env_batch_count, pick.env_coverage_count = 1, int(pick.phase == "coverage")
            pick.env_selections_before = int(env_counts[e])
            pick.task_observations_before = h.task_observation_count(pos)
            picks.append(pick)
            in_batch_env[e] = True
            if k + 1 < n:  # the last pick penalises nobody
                similarity.add(pos)
        self._rng.bit_generator.advance(len(self.tasks) + len(self.envs))  # the tiebreak draws, as if drawn
        positions = [p.pos for p in picks]
        prediction = engine.prediction
        trace = self._few_trace(positions, prediction, slots, debt, adaptive, coverage)
        tools = np.concatenate([self._tool_codes[self._tool_indptr[p]:self._tool_indptr[p + 1]] for p in positions])
        n_tools = int(np.unique(tools).size)
        step = h.record_batch(positions, [p.phase for p in picks])
        self._drawn(positions)
        self._coverage_debt = debt
        self._last_picks = picks
        self._last_prediction = prediction
        self._last_trace = trace
        self._pending_explain = _PendingExplanation(step, picks, prediction, filter_snapshot(h, positions),
                                                    dict(self._flags), trace, engine.materialize)
        self._last_records = None
        self._last_tools = n_tools
        self._batch_totals["batches"] += 1
        self._batch_totals["envs"] += n
        self._batch_totals["tools"] += n_tools
        return positions

    def _coverage_pick(self, engine: IncrementalPrediction, clocked: np.ndarray, info: np.ndarray,
                       state: dict[str, Any], env_counts: np.ndarray, in_batch_env: np.ndarray,
                       similarity: BatchSimilarity | None, more: bool) -> tuple[Pick, float] | None:
        """A coverage pick of a draw from the maintained prediction whose picks so far (if any) are each of another
        environment, by the rule of :func:`~envsched.method.scheduling.batch.build_batch`'s coverage phase: of the
        environments not in the batch (``in_batch_env``) with a task the consecutive cap leaves eligible, those first
        in the policy's environment order (ties included); in them the task with the highest coverage score (the
        fewest observed first, where the policy says so) times ``1 - similarity_penalty x`` its largest similarity
        to the picks so far (``similarity``; ``None``: no pick yet, no penalty), exact ties to the higher tiebreak
        draw; ``more``: whether picks of the draw come after this one. Reads the environments' order and the tasks of
        the first environments only. Returns the pick and its coverage score, or ``None`` when no task is eligible.
        ``clocked``, ``info``: :meth:`IncrementalPrediction.tick`'s; ``state``: the generator's state before the draw
        (the tiebreak draws)."""
        c, h = self.config, self._history
        policy = self.policy
        assert isinstance(policy, AdaptivePolicy)  # (_incremental_supported)
        key = policy.env_order(h, env_counts) if c.adaptive_coverage else env_counts
        live = ~in_batch_env
        chooser = self._incremental[1]
        if (not c.adaptive_coverage and similarity is None  # (the fewest observed first, no pick yet: kept per env)
                and len(self.tasks) >= chooser.coverage_index_min_tasks):
            got = chooser.coverage_pick(h, key, live, clocked, info, lambda pos: self._tiebreak_of(state, pos))
            if got is None:
                return None
            pos, value, tied_envs = got
            return Pick(pos=pos, phase="coverage", rank=1, score=value, base_score=value, max_similarity=0.0,
                        tied_envs=tied_envs), value
        while True:  # the first environments in the order; one whose every task is capped is skipped
            if not live.any():
                return None
            first = live & (key == key[live].min())
            envs = np.flatnonzero(first)
            if envs.size * 8 < len(self.envs):
                members = np.sort(self._similarity.members(envs))
            else:  # (many environments tied, as those never selected are: a pass over the pool beats a sort)
                members = np.flatnonzero(first[self.env_codes])
            capped = h.consecutive_blocked(members) & engine.caps[members]
            cands = members[~capped]
            if cands.size:
                break
            live[envs] = False
        tiebreak: np.ndarray | None = None
        lam = c.similarity_penalty
        ms = None
        if c.adaptive_coverage:
            cleaned = engine.clean(cands)  # (the prior of rows left for later, which the posterior reads, made exact)
            alpha, beta = signal.signal_posterior(h, engine.prediction.long.prior[cands, 0], c.signal_prior_ess,
                                                  c.long_half_life, cands)
            tiebreak = self._tiebreak_of(state, cands)
            score = policy.coverage_score(alpha, beta, None, tiebreak, cands)
            low = cands
            if similarity is not None:  # base x (1 - lambda x max_sim)
                ms = similarity.max_sim(low)
            penalised = score if ms is None else score * (1.0 - lam * ms)
        else:  # the informativeness, the fewest observed first: a row left for later (dirty) has an upper bound on
            # it, and only those whose bound reaches the best exact score are made exact
            obs = h.task_observation_counts()[cands]
            low = cands[obs == obs.min()]
            at = np.minimum(np.searchsorted(clocked, low), max(clocked.size - 1, 0))
            is_clocked = clocked[at] == low if clocked.size else np.zeros(low.size, dtype=bool)
            now = info[at] if clocked.size else 0.0
            if similarity is not None:
                ms = similarity.max_sim(low)
            done: list[np.ndarray] = []
            while True:
                score = np.where(is_clocked, now, engine.static_value(low))
                penalised = score if ms is None else score * (1.0 - lam * ms)
                bounded = ~is_clocked & engine.dirty[low]
                top = penalised[~bounded].max() if not bounded.all() else -np.inf
                reach = np.flatnonzero(bounded & (penalised >= top))
                if not reach.size:
                    break
                done.append(engine.clean(low[reach]))
            cleaned = union(*done) if done else low[:0]
        if more and cleaned.size:  # (a later exploitation pick of this draw reads them; else the next sync)
            self._incremental[1].update(cleaned, self._flags)
        best = np.flatnonzero(penalised == penalised.max())
        if best.size > 1:
            draws = tiebreak[best] if tiebreak is not None else self._tiebreak_of(state, low[best])
            best = best[[int(np.argmax(draws))]]
        i = int(best[0])
        value = float(score[i])
        pick = Pick(pos=int(low[i]), phase="coverage", rank=1, score=float(penalised[i]), base_score=value,
                    max_similarity=0.0 if ms is None else float(ms[i]),
                    tied_envs=int(np.count_nonzero(np.bincount(self.env_codes[cands], minlength=len(self.envs)))))
        return pick, value

    def _few_trace(self, positions: list[int], prediction: Prediction, slots: int, debt: float,
                   adaptive: dict[str, float], coverage: dict[int, float | Any]) -> PolicyTrace:
        """What :class:`AdaptivePolicy` reports for a batch of ``positions`` with ``slots`` coverage slots, its per-task
        values at the picks only. ``debt``: the coverage debt after it; ``adaptive``: the share and the phases'
        yields; ``coverage``: each pick's coverage score, or a callable giving its tiebreak draw (the score is then
        computed when explanation records read it)."""
        c, h = self.config, self._history
        values: dict[str, Any] = dict(adaptive)
        at = np.array(sorted(positions), dtype=np.int64)
        if c.adaptive_coverage:
            alpha, beta = signal.signal_posterior(h, prediction.long.prior[at, 0], c.signal_prior_ess,
                                                  c.long_half_life, at)
            policy = self.policy
            assert isinstance(policy, AdaptivePolicy)  # (_incremental_supported)

            def coverage_score(i: int, tiebreak: Any) -> Any:  # (read by explanation records only: on demand)
                return lambda: float(policy.coverage_score(alpha[i:i + 1], beta[i:i + 1], None,
                                                           np.array([tiebreak()]))[0])

            values.update(
                signal_alpha=_AtPositions({int(p): float(alpha[i]) for i, p in enumerate(at)}, float),
                signal_beta=_AtPositions({int(p): float(beta[i]) for i, p in enumerate(at)}, float),
                coverage_score=_AtPositions({int(p): coverage_score(i, coverage[int(p)])
                                             if callable(coverage[int(p)]) else coverage[int(p)]
                                             for i, p in enumerate(at)}, float))
        if c.caps_on_decline_only:
            caps = self._incremental[0].caps
            values["caps_active"] = _AtPositions({int(p): bool(caps[p]) for p in at}, bool)
        return PolicyTrace(explained=True, coverage_slots=slots, coverage_debt=debt, **values)

    def _run_header(self) -> dict[str, Any]:
        """The run file's header fields (built only when a header is written: a new or empty run file)."""
        return {"sampler": type(self).__name__, "seed": self.seed, "num_tasks": len(self.tasks),
                "num_envs": len(self.envs), "config": self.config.to_dict()}

    def _select_checkpoint(self) -> Any:
        # the fields _select sets before the batch is recorded; all are replaced, not edited (the maintained
        # prediction is edited: a failed draw drops it, and the next one-task draw rebuilds it from its anchor)
        return (self._last_trace, self._last_picks, self._last_prediction, self._pending_explain, self._last_records,
                self._last_tools, dict(self._batch_totals), self._anchor, self._coverage_debt)

    def _select_rollback(self, checkpoint: Any) -> None:
        (self._last_trace, self._last_picks, self._last_prediction, self._pending_explain, self._last_records,
         self._last_tools, self._batch_totals, self._anchor, self._coverage_debt) = checkpoint
        self._drop_incremental(forget=False)

    def _observe(self, group: GroupResult) -> None:
        low, high = self.reward_range
        scored01 = (group.scored - low) / (high - low)
        n = group.scored.size
        raw_var = math.nan
        if n:
            vals = group.scored.tolist()
            mean = math.fsum(vals) / n
            raw_var = math.fsum((r - mean) ** 2 for r in vals) / n
        self._history.record_observation(group.position, scored01, len(group.rewards), raw_var,
                                         group.mean_variance01 if n else None)

    def _on_discard(self, position: int) -> None:
        self._history.record_discard(position)

    # ------------------------------------------------------------------ identifier filter
    def submit_trajectory(self, task: Any, trajectory: Trajectory) -> IdentifierVerdict | None:
        """Give the identifier filter a saved trajectory of ``task``. Trajectories below
        ``config.identifier_min_reward`` (on the reward scale mapped to [0, 1]) are not checked (``None``).
        A flagged task leaves exploitation until :meth:`unflag_task`."""
        pos = self.position_of(task)
        if not isinstance(trajectory, Trajectory):
            raise TypeError(f"trajectory must be an envsched.envs.base.Trajectory, got {type(trajectory).__name__}")
        if self.identifier_filter is None:
            raise ValueError("this sampler has no identifier_filter: pass one to the constructor")
        r = trajectory.reward
        check_number(r, "trajectory.reward")
        low, high = self.reward_range
        if (trajectory.reward - low) / (high - low) < self.config.identifier_min_reward - 1e-9:
            return None
        verdict = self.identifier_filter.check(self.tasks[pos], trajectory)
        if verdict.flagged:
            self._flags[pos] = verdict.reason or "flagged by the identifier filter"
        return verdict

    def flag_task(self, task: Any, reason: str) -> None:
        """Flag a task directly (an environment that ran the identifier check itself)."""
        if not isinstance(reason, str) or not reason:
            raise ValueError("flag_task needs a non-empty reason")
        self._flags[self.position_of(task)] = reason

    def unflag_task(self, task: Any) -> None:
        self._flags.pop(self.position_of(task), None)

    def identifier_flags(self) -> dict[str, str]:
        """Flagged task ids and the reason each was flagged."""
        return {self._keys[p]: r for p, r in sorted(self._flags.items())}

    # ------------------------------------------------------------------ introspection
    @property
    def history(self) -> History:
        """The dispatch/observation history (read it; do not modify it)."""
        return self._history

    @property
    def step(self) -> int:
        """Number of batches drawn so far."""
        return self._history.step

    def _records(self) -> list[dict[str, Any]]:
        if self._last_records is None:
            if self._pending_explain is None:
                self._last_records = []
            else:
                pe = self._pending_explain
                if pe.materialize is not None:
                    pe.materialize()
                self._last_records = build_records(pe.step, pe.picks, graph=self.graph, snapshot=pe.snapshot,
                                                   prediction=pe.prediction, config=self.config, task_ids=self._keys,
                                                   envs=self.envs, env_codes=self.env_codes,
                                                   identifier_flags=pe.flags, trace=pe.trace)
        return self._last_records

    def explanations(self, task: Any | None = None) -> list[dict[str, Any]]:
        """Explanation records of the last batch (of one task if given); see :mod:`envsched.method.explain`
        for the schema. Empty after ``load_state_dict`` until the next ``sample``."""
        records = self._records()
        if task is None:
            return [dict(r) for r in records]
        key = self._keys[self.position_of(task)]
        return [dict(r) for r in records if r["task_id"] == key]

    def predict(self) -> Prediction | None:
        """The current prediction over all tasks (what the next ``sample`` would use)."""
        return predict(self._history, self.graph, self.config, self._operators)

    def last_phases(self) -> list[str]:
        return [p.phase for p in self._last_picks]

    # ------------------------------------------------------------------ metrics and state
    def _extra_metrics(self) -> dict[str, float]:
        h = self._history
        m: dict[str, float] = {"steps": float(h.step), "observed_groups": float(h.num_observations)}
        latest = h.latest_observed_step()
        if latest is not None:
            s = h.step_summary(latest)
            m["batch_reward_variance"] = s["mean_variance"]
            m["batch_reward_variance_step"] = float(latest)
            m["exploitation_hit_rate"] = (s["exploitation_hits"] / s["exploitation_groups"]
                                          if s["exploitation_groups"] else math.nan)
        else:
            m.update(batch_reward_variance=math.nan, batch_reward_variance_step=math.nan,
                     exploitation_hit_rate=math.nan)
        m["exploitation_hit_rate_cumulative"] = h.cumulative_hit_rate()
        m["last_batch_tools"] = float(self._last_tools)
        b = self._batch_totals["batches"]
        m["mean_batch_envs"] = self._batch_totals["envs"] / b if b else 0.0
        m["mean_batch_tools"] = self._batch_totals["tools"] / b if b else 0.0
        phases = self.last_phases()
        for ph in ("cold_start", "coverage", "exploitation", "fill"):
            m[f"last_batch_{ph}"] = float(phases.count(ph))
        m["progress_filtered"] = float(h.progress_filtered().sum())
        m["identifier_flagged"] = float(len(self._flags))
        m["coverage_debt"] = self._coverage_debt
        m.update(self._last_trace.metrics())
        ref = h.global_reference()
        for j, name in enumerate(("mean", "variance", "dispersion")):
            m[f"global_reference_{name}"] = float(ref[j]) if ref is not None else math.nan
        return m

    def _extra_state(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "graph": {"nodes": self.graph.num_nodes, "pool_fingerprint": self.graph.pool_fingerprint},
            "history": self._history.state(),
            "flags": {self._keys[p]: r for p, r in self._flags.items()},
            "batch_totals": dict(self._batch_totals),
            "last_tools": self._last_tools,
            "last_phases": [p.phase for p in self._last_picks],
            "last_adaptive": self._last_trace.summary(),
            # the coverage share owed by draws too small for a coverage slot (written only while there is one)
            **({"coverage_debt": self._coverage_debt} if self._coverage_debt else {}),
            # one-task draws from a maintained prediction: what it was started from (it is rebuilt from these)
            **({"incremental": {"anchor": self._anchor.step, "reference": list(self._anchor.reference),
                                "decayed_at": self._anchor.decayed_at}} if self._anchor is not None else {}),
        }

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        extra = _check.mapping(extra, "", keys=("config", "history", "batch_totals"))
        try:
            cfg = read_config(dict(_check.mapping(extra["config"], "config")))
        except (TypeError, ValueError) as exc:
            raise StateError("config", f"is not a SchedulerConfig: {str(exc)[:200]}") from None
        if cfg != self.config:
            diff = sorted(k for k, v in cfg.to_dict().items() if self.config.to_dict()[k] != v)
            raise ValueError(f"state was saved with another SchedulerConfig (differs in {diff})")
        if "graph" in extra:  # states of every version write it; tolerate only its absence
            g = _check.mapping(extra["graph"], "graph")
            if "nodes" in g:
                _check.whole(g["nodes"], "graph.nodes", low=self.graph.num_nodes, high=self.graph.num_nodes)
            fp = g.get("pool_fingerprint")
            if fp is not None:
                _check.text(fp, "graph.pool_fingerprint", allow_empty=True)
            if fp and self.graph.pool_fingerprint and fp != self.graph.pool_fingerprint:
                raise ValueError("state was saved with a graph of another pool (pool fingerprints differ)")
        low, high = self.reward_range
        try:
            history = History.from_state(extra["history"], len(self.tasks), self.env_codes, len(self.envs),
                                         self.config, raw_var_high=(high - low) ** 2 / 4 * (1 + 1e-9))
        except StateError as exc:
            raise exc.within("history.") from None
        n = len(self.tasks)
        flags = {}
        for k, r in _check.mapping(extra.get("flags", {}), "flags").items():
            if k not in self._pos:
                raise StateError("flags", f"names task {str(k)[:60]!r}, which is not in this sampler's tasks")
            flags[self._pos[k]] = _check.text(r, f"flags[{str(k)[:60]!r}]")
        raw_totals = _check.mapping(extra["batch_totals"], "batch_totals", keys=("batches", "envs", "tools"))
        batches = _check.whole(raw_totals["batches"], "batch_totals.batches", high=history.step)
        totals = {"batches": batches,
                  "envs": _check.whole(raw_totals["envs"], "batch_totals.envs", high=batches * len(self.envs)),
                  "tools": _check.whole(raw_totals["tools"], "batch_totals.tools", high=batches * self.num_tools)}
        last_tools = _check.whole(extra.get("last_tools", 0), "last_tools", high=self.num_tools)
        phases = [_check.choice(p, f"last_phases[{i}]", PHASES[:4])
                  for i, p in enumerate(_check.sequence(extra.get("last_phases", []), "last_phases", max_length=n))]
        raw_adaptive = _check.mapping(extra.get("last_adaptive", {}), "last_adaptive")
        unknown = sorted(map(str, set(raw_adaptive) - set(TRACE_SUMMARY_KEYS)))
        if unknown:
            raise StateError("last_adaptive", f"has unknown keys {unknown[:5]}")
        last_adaptive = {k: (float(_check.whole(v, f"last_adaptive.{k}", high=n)) if k == "coverage_slots"
                             else _check.finite(v, f"last_adaptive.{k}", low=0.0, high=1.0))
                         for k, v in raw_adaptive.items()}
        debt = _check.finite(extra.get("coverage_debt", 0.0), "coverage_debt", low=-DEBT_BOUND, high=DEBT_BOUND,
                             high_open=True)
        anchor = None
        if "incremental" in extra:
            inc = _check.mapping(extra["incremental"], "incremental", keys=("anchor", "reference", "decayed_at"))
            step = _check.whole(inc["anchor"], "incremental.anchor", high=max(history.step - 1, 0))
            ref = _check.sequence(inc["reference"], "incremental.reference", length=3)
            reference = tuple(_check.finite(x, f"incremental.reference[{j}]", low=0.0, high=(1.0, 0.25, 1.0)[j])
                              for j, x in enumerate(ref))
            at = inc["decayed_at"]
            if (at is None) != (history.decayed is None):
                raise StateError("incremental.decayed_at", "must be null exactly when the history keeps no decayed "
                                                           "statistics")
            if at is not None:
                at = _check.whole(at, "incremental.decayed_at", high=max(history.step - 1, 0))
            anchor = _Anchor(step, reference, at)
        self._history = history
        self._flags = flags
        self._batch_totals = totals
        self._last_tools = last_tools
        self._last_trace = PolicyTrace.from_summary(last_adaptive)
        self._coverage_debt = debt
        self._last_picks = [Pick(pos=-1, phase=p, rank=i + 1, score=math.nan, base_score=math.nan,
                                 max_similarity=math.nan) for i, p in enumerate(phases)]
        self._last_records = []
        self._pending_explain = None
        self._last_prediction = None
        self._incremental = None  # (the new history has no journal; rebuilt from the anchor on the next draw)
        self._anchor = anchor if self._incremental_supported() else None


def make_envsched_sampler(pool: TaskPool, *, seed: int = 0, group_size: int = 8, preset: str = "default",
                          **options: Any) -> EnvSchedSampler:
    """Registry factory (``envsched.samplers.registry``): an :class:`EnvSchedSampler` over ``pool`` with its
    graph built by ``graph_build.build_graph``. ``preset``: ``"default"`` (``SchedulerConfig()``, registry
    name ``envsched``) or ``"paper"`` (``SchedulerConfig.paper()``, ``envsched-paper``); ``"adaptive"``, the
    default's former name, is still read as ``"default"`` with a ``FutureWarning`` (the lab's ``envsched-adaptive``
    is another configuration: the online coverage share and the UCB coverage order). ``options`` are
    :class:`SchedulerConfig` fields (they override the preset) plus ``graph``, ``run_file`` and
    ``identifier_filter``."""
    if preset == "adaptive":
        warnings.warn("make_envsched_sampler(preset='adaptive') is the default's former name: pass "
                      "preset='default' (SchedulerConfig(), the paper's fixed coverage share); the online share is "
                      "SchedulerConfig(adaptive_share=True, adaptive_coverage=True)", FutureWarning, stacklevel=2)
        preset = "default"
    if preset not in ("default", "paper"):
        raise ValueError(f"preset must be 'default' or 'paper', got {preset!r}")
    extra = {k: options.pop(k) for k in ("graph", "run_file", "identifier_filter") if k in options}
    fields = {"rollouts_per_task": group_size, **options}
    config = SchedulerConfig.paper(**fields) if preset == "paper" else SchedulerConfig(**fields)
    return EnvSchedSampler(pool, extra.pop("graph", None), config, seed, **extra)


def make_envsched_paper_sampler(pool: TaskPool, *, seed: int = 0, group_size: int = 8,
                                **options: Any) -> EnvSchedSampler:
    """Registry factory of ``envsched-paper``: :func:`make_envsched_sampler` with ``preset="paper"``."""
    return make_envsched_sampler(pool, seed=seed, group_size=group_size, preset="paper", **options)
