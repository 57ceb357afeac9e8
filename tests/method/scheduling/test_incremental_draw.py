"""``sample(1)`` from the maintained prediction draws what the whole computation draws: the same task, records,
metrics, state and random generator, draw after draw; through a saved state, a failed draw and flags."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest

import envsched.method.sampler as sampler_module
from envsched.errors import StateError
from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.sampler import EnvSchedSampler
from envsched.method.scheduling.incremental import IncrementalExploitation


def _pair(n: int = 600, envs: int = 12, *, anchored: bool = True, patterns: int = 200,
          **config) -> tuple[EnvSchedSampler, EnvSchedSampler]:
    """Two samplers of one pool: the first draws one task from the maintained prediction, the second recomputes
    the whole prediction every draw, with the first one's anchor (``anchored``: the same bits) or as every other
    draw does (the weights valued at the latest step: the same up to rounding). ``patterns``: the synthetic graph's
    abstract tokens (fewer: tasks of different environments more alike)."""
    g = synthetic_graph(n, envs, seed=2, patterns=patterns)
    tasks = synthetic_tasks(g)
    a = EnvSchedSampler(tasks, g, SchedulerConfig(**config), seed=4)
    b = EnvSchedSampler(tasks, g, SchedulerConfig(**config), seed=4)
    b._incremental_supported = lambda: False  # the whole computation, every draw
    if anchored:
        whole = b._select

        def select(n: int) -> list[int]:
            if not a._few_supported(n) or a._anchor is None or a.history.step - 1 == a._anchor.step:
                return whole(n)
            real = sampler_module.predict
            sampler_module.predict = functools.partial(real, anchor=a._anchor.step,
                                                       reference=np.array(a._anchor.reference))
            try:
                return whole(n)
            finally:
                sampler_module.predict = real

        b._select = select
    return a, b


def _spy(obj: object, method: str, after) -> None:
    """Replace ``obj.method`` by a call of it that passes its result to ``after`` before returning it."""
    real = getattr(obj, method)

    def spied(*args, **kwargs):
        out = real(*args, **kwargs)
        after(out)
        return out

    setattr(obj, method, spied)


def _state(s: EnvSchedSampler) -> dict:
    state = json.loads(json.dumps(s.state_dict()))
    state["extra"].pop("incremental", None)
    return state


def _close(x, y) -> bool:
    """Equal, floats within 1e-12 relative or one unit of the sixth decimal the records round to (the records of a
    prediction that differs by rounding: 0.0078125 may round either way)."""
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_close(x[k], y[k]) for k in x)
    if isinstance(x, list):
        return len(x) == len(y) and all(_close(u, v) for u, v in zip(x, y, strict=True))
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-12, abs_tol=1.0000001e-6)
    return x == y


def _drive(a: EnvSchedSampler, b: EnvSchedSampler, draws: int, rng: np.random.Generator, p: np.ndarray,
           late: list, *, flag_every: int = 0, exact: bool = True, explain_every: int = 1,
           sizes: tuple[int, ...] = (1,)) -> int:
    """Draws of both (``sample(sizes[k % len(sizes)])`` for draw ``k``: one task by default), compared (the records
    every ``explain_every`` draws; ``exact``: bit for bit, else within rounding); rewards (some unscored), late and
    dropped groups, flags. Returns how many draws came from the maintained prediction."""
    incremental = 0
    for k in range(draws):
        incremental += a._incremental is not None
        n = sizes[k % len(sizes)]
        ta, tb = a.sample(n), b.sample(n)
        assert ta == tb, f"draw {k}: {ta} != {tb}"
        if k % explain_every == 0:
            ea, eb = a.explanations(), b.explanations()
            assert ea == eb if exact else _close(ea, eb), f"draw {k}: the records differ"
        for j, t in enumerate(ta):
            if (k + j) % 9 == 4:
                for s in (a, b):
                    s.discard(t)
            elif (k + j) % 4 == 1:
                late.append(t)
            else:
                r = [None if rng.random() < 0.05 else float(rng.random() < p[a.position_of(t)]) for _ in range(8)]
                for s in (a, b):
                    s.update(t, r)
        if k % 4 == 3:
            for t in late:
                r = [float(rng.random() < p[a.position_of(t)]) for _ in range(8)]
                for s in (a, b):
                    s.update(t, r)
            late.clear()
        if flag_every and k % flag_every == flag_every - 1:  # flag the task just drawn, and later lift it
            for s in (a, b):
                s.flag_task(t, "test")
                if k % (2 * flag_every) == 2 * flag_every - 1:
                    s.unflag_task(t)
    ma, mb = a.metrics(), b.metrics()
    assert ma.keys() == mb.keys()
    assert all(ma[k] == mb[k] or (np.isnan(ma[k]) and np.isnan(mb[k])) for k in ma)
    assert _state(a) == _state(b)  # the random generator's included: the tiebreak draws are skipped, not saved
    return incremental


def _warm(a: EnvSchedSampler, b: EnvSchedSampler, rng: np.random.Generator, p: np.ndarray, steps: int = 6) -> None:
    for _ in range(steps):
        batch = a.sample(24)
        assert batch == b.sample(24)
        for t in batch:
            r = [float(rng.random() < p[a.position_of(t)]) for _ in range(8)]
            a.update(t, r)
            b.update(t, r)


_ADAPTIVE = {"adaptive_share": True, "adaptive_coverage": True}  # (the former default's online share and UCB coverage)


@pytest.mark.parametrize("config", [{}, _ADAPTIVE, {"unobserved_neighbours": "reference"},
                                    {"caps_on_decline_only": False, **_ADAPTIVE}])
def test_one_task_draws_equal_the_whole_computation(config):
    # bit for bit against the whole computation with the maintained prediction's anchor
    a, b = _pair(**config)
    rng = np.random.default_rng(7)
    p = rng.beta(0.6, 0.6, size=len(a.tasks))
    _warm(a, b, rng, p)
    late: list = []
    assert _drive(a, b, 80, rng, p, late, flag_every=11) >= 70  # (the first draw starts the maintained prediction)
    # a batch between one-task draws: the maintained prediction is dropped and started again after it
    _warm(a, b, rng, p, steps=1)
    assert a._incremental is None and a._anchor is None
    assert _drive(a, b, 20, rng, p, late) >= 15


@pytest.mark.parametrize("config", [{}, _ADAPTIVE, {"adaptive_share": True},
                                    {"adaptive_coverage": True, "coverage_share": 0.3},
                                    {"caps_on_decline_only": False, **_ADAPTIVE}])
def test_coverage_draws_of_the_debt_equal_the_whole_computation(config):
    # the draws the coverage debt gives a coverage slot are picked from the maintained prediction too (the
    # environments first in the policy's order, then the task's coverage score; with adaptive_coverage off the
    # fewest observed first, by informativeness): bit for bit the whole computation's, records and state included
    a, b = _pair(**config)
    rng = np.random.default_rng(13)
    p = rng.beta(0.6, 0.6, size=len(a.tasks))
    _warm(a, b, rng, p, steps=3)
    phases = []
    _spy(a, "_select_few", lambda out: out is not None and phases.append(a.last_phases()[0]))
    assert _drive(a, b, 90, rng, p, [], flag_every=7) >= 80
    assert len(phases) >= 80 and 20 <= phases.count("coverage") <= 50  # (share 0.3-0.5 of the draws)


@pytest.mark.parametrize("config", [{}, _ADAPTIVE, {"adaptive_share": True},
                                    {"caps_on_decline_only": False, **_ADAPTIVE},
                                    {"adaptive_coverage": True, "coverage_share": 0.4}])
def test_small_batches_equal_the_whole_computation(config):
    # sample(2) (TRL's trainer), sample(3), sample(5) and sample(8) are drawn from the maintained prediction too,
    # their coverage slots first, every pick after the first penalised by its similarity to the picks before it:
    # bit for bit the whole computation's, records, metrics and state included, between one-task draws, late
    # updates and flags; a batch of 64 in between drops the maintained prediction, and the next small draw starts it
    a, b = _pair(patterns=30, **config)  # (tasks of different environments alike: the penalty acts)
    assert a._few_supported(1) and not a._few_supported(2)  # (a pool of 600 tasks: the whole computation)
    a.few_draws_min_tasks = 0
    rng = np.random.default_rng(21)
    p = rng.beta(0.6, 0.6, size=len(a.tasks))
    _warm(a, b, rng, p, steps=3)
    few, similar = [], []

    def seen(out):
        if out is not None:
            few.append(len(out))
            similar.extend(p.max_similarity for p in a._last_picks[1:])

    _spy(a, "_select_few", seen)
    sizes = (2, 1, 3, 2, 5, 2, 8, 1)
    assert _drive(a, b, 64, rng, p, [], flag_every=9, sizes=sizes) >= 56
    _warm(a, b, rng, p, steps=1)  # (batches of 24: the whole computation)
    assert a._incremental is None
    assert _drive(a, b, 24, rng, p, [], sizes=sizes) >= 20
    # (a batch of 5 or 8 has two coverage groups or more: a new global reference once they are in, so the draw
    # after it is a whole computation)
    assert {2, 3, 5, 8} <= set(few) and len(few) >= 50
    assert max(similar) > 0.1 and sum(x > 0 for x in similar) >= 20  # the penalty acted


@pytest.mark.parametrize("config, keep", [({}, False), ({}, True), (_ADAPTIVE, False), (_ADAPTIVE, True)])
def test_coverage_draws_among_environments_never_selected_equal_the_whole_computation(monkeypatch, config, keep):
    # 40 environments, 16 tasks drawn before: the environments never selected tie first in the coverage order, and a
    # coverage draw ranks every task of all of them (with their tiebreak draws, read from the generator); ``keep``:
    # the one-task draws' sampler keeps the UCB coverage scores between draws (AdaptivePolicy.coverage_keep_min,
    # from 4,096 candidates otherwise), or under the fewest-observed rule its per-environment coverage index
    # (IncrementalExploitation.coverage_index_min_tasks, from 5,000 tasks otherwise); the whole computation's neither
    if keep and not config:
        monkeypatch.setattr(IncrementalExploitation, "coverage_index_min_tasks", 0)
    a, b = _pair(n=600, envs=40, **config)
    if keep and config:
        a.policy.coverage_keep_min = 8
    rng = np.random.default_rng(14)
    p = rng.beta(0.6, 0.6, size=len(a.tasks))
    for _ in range(2):
        batch = a.sample(8)
        assert batch == b.sample(8)
        for t in batch:
            r = [float(rng.random() < p[a.position_of(t)]) for _ in range(8)]
            a.update(t, r)
            b.update(t, r)
    never = int((a.history.env_selection_counts() == 0).sum())
    assert never >= 20
    tied = []
    _spy(a, "_coverage_pick", lambda out: out is not None and tied.append(out[0].tied_envs))
    assert _drive(a, b, 40, rng, p, []) >= 35
    assert max(tied) >= never - 1 and min(tied) >= 1  # the never-selected ones, tied, then fewer of them
    assert (a.policy._coverage_kept is not None) == (keep and bool(config)) and b.policy._coverage_kept is None
    assert (a._incremental is not None and a._incremental[1].cov is not None) == (keep and not config)


def test_the_rows_left_for_later_never_change_a_draw():
    # without explanation records read, the unclocked rows an update reaches only through an environment estimate
    # wait, bounded, until they could be the pick: early in a run (few tasks observed) they often could
    a, b = _pair(n=1200, envs=24)
    rng = np.random.default_rng(12)
    p = rng.beta(0.6, 0.6, size=len(a.tasks))
    _warm(a, b, rng, p, steps=2)
    waiting = []
    _spy(a, "_select_few", lambda _: a._incremental is not None and waiting.append(int(a._incremental[0].dirty.sum())))
    assert _drive(a, b, 120, rng, p, [], flag_every=17, explain_every=25) >= 110
    assert max(waiting) > 100  # rows did wait


def test_one_task_draws_equal_the_draws_of_every_other_draw():
    # against the whole computation every other draw makes (the weights valued at the latest step): the same
    # draws; the records' values differ by rounding at most
    a, b = _pair(anchored=False)
    rng = np.random.default_rng(6)
    p = rng.beta(0.6, 0.6, size=len(a.tasks))
    _warm(a, b, rng, p)
    assert _drive(a, b, 150, rng, p, [], flag_every=13, exact=False) >= 140


def test_a_saved_state_continues_with_the_same_draws():
    a, b = _pair()
    rng = np.random.default_rng(8)
    p = rng.beta(0.6, 0.6, size=len(a.tasks))
    _warm(a, b, rng, p)
    late: list = []
    _drive(a, b, 30, rng, p, late)
    saved = json.loads(json.dumps(a.state_dict()))
    assert saved["extra"]["incremental"]["anchor"] == a._anchor.step  # what the maintained prediction is rebuilt from
    resumed = EnvSchedSampler(a.tasks, a.graph, a.config, seed=4)
    resumed.load_state_dict(saved)
    assert resumed._incremental is None
    _drive(resumed, b, 30, rng, p, late)
    assert resumed._anchor.step == saved["extra"]["incremental"]["anchor"]  # the same anchor all along


def test_a_failed_draw_changes_nothing():
    a, b = _pair()
    rng = np.random.default_rng(9)
    p = rng.beta(0.6, 0.6, size=len(a.tasks))
    _warm(a, b, rng, p)
    late: list = []
    _drive(a, b, 10, rng, p, late)
    before = (a._rng.bit_generator.state, a.history.step)
    real = a.history.record_batch

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    a.history.record_batch = fail  # the commit fails after the maintained prediction was brought up to date
    with pytest.raises(RuntimeError, match="disk full"):
        a.sample(1)
    a.history.record_batch = real
    assert (a._rng.bit_generator.state, a.history.step) == before and a._incremental is None
    _drive(a, b, 20, rng, p, late)  # rebuilt from its anchor: the same draws


def test_a_state_with_a_bad_anchor_is_refused_by_name():
    a, b = _pair()
    rng = np.random.default_rng(10)
    p = rng.beta(0.6, 0.6, size=len(a.tasks))
    _warm(a, b, rng, p)
    _drive(a, b, 3, rng, p, [])
    good = json.loads(json.dumps(a.state_dict()))
    fresh = EnvSchedSampler(a.tasks, a.graph, a.config, seed=4)
    for field, value, message in (("anchor", a.history.step + 5, "incremental.anchor"),
                                  ("reference", [0.5, 0.3, 0.5], r"incremental.reference\[1\]"),
                                  ("reference", [0.5, 0.1], "incremental.reference"),
                                  ("decayed_at", None, "incremental.decayed_at")):
        bad = json.loads(json.dumps(good))
        bad["extra"]["incremental"][field] = value
        with pytest.raises(StateError, match=message):
            fresh.load_state_dict(bad)
        assert fresh.history.step == 0 and fresh._anchor is None  # nothing changed


@pytest.mark.parametrize("span", [0, 1_024])
def test_tiebreak_draws_read_ahead_equal_the_whole_array(monkeypatch, span):
    """The tiebreak draws a draw from the maintained prediction reads (one by one, or as a run from the first
    position to the last) are those of ``rng.random(N)`` at those positions, bit for bit."""
    monkeypatch.setattr(EnvSchedSampler, "tiebreak_span", span)
    a, _ = _pair(n=3_000, envs=60)
    rng = np.random.default_rng(3)
    state = np.random.default_rng(12).bit_generator.state
    bg = np.random.PCG64()
    bg.state = state
    whole = np.random.Generator(bg).random(3_000)
    for positions in (np.zeros(0, dtype=np.int64), np.array([0]), np.array([2_999]), np.arange(950, 1_000),
                      np.array([5, 700, 2_998]), np.sort(rng.choice(3_000, 64, replace=False)),
                      np.sort(rng.choice(3_000, 65, replace=False)), np.arange(100, 1_300, 7)):
        got = a._tiebreak_of(state, positions)
        assert got.shape == positions.shape and np.array_equal(got, whole[positions])
    assert a._tiebreak_of(state, np.array([1]))[0] != whole[0]  # (a read one position off would show)


def test_the_coverage_index_equals_a_recomputation(monkeypatch):
    # the coverage picks under the fewest-observed rule read each environment's kept (fewest observations of an
    # unclocked task, best informativeness or bound among them) and every task's observation count; after every
    # draw (with discards, late groups and flags) they equal the ones built from scratch, where not marked stale
    monkeypatch.setattr(IncrementalExploitation, "coverage_index_min_tasks", 0)  # (from 5,000 tasks otherwise)
    a, b = _pair(n=600, envs=40)
    rng = np.random.default_rng(15)
    p = rng.beta(0.6, 0.6, size=len(a.tasks))
    _warm(a, b, rng, p, steps=1)
    checked = []

    def check(_):
        if a._incremental is None or a._incremental[1].cov is None:
            return
        engine, chooser = a._incremental
        chooser._coverage_counts(a.history)
        assert np.array_equal(chooser.tobs, a.history.task_observation_counts())
        assert np.array_equal(chooser.cov, np.where(engine.clocked, -np.inf, engine.static_value(np.arange(600))))
        kept = chooser.env_fewest.copy(), chooser.env_best.copy(), chooser.env_stale.copy()
        chooser._coverage_envs(np.arange(40))
        fresh = ~kept[2]
        assert np.array_equal(kept[0][fresh], chooser.env_fewest[fresh])
        assert np.array_equal(kept[1][fresh], chooser.env_best[fresh])
        chooser.env_fewest[:], chooser.env_best[:], chooser.env_stale[:] = kept  # (as it was: the next check sees it)
        checked.append(int(kept[2].sum()))

    _spy(a, "_select_few", check)
    assert _drive(a, b, 80, rng, p, [], flag_every=13, explain_every=20) >= 70
    assert len(checked) >= 60
