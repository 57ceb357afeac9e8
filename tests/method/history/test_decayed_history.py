"""The decayed form of the history (the default preset): O(1) state per task and half-life.

Observations older than the live window are absorbed into exponentially decayed sums, relative to their step's
reference (exact centring at any later reference). What is linear in the recency weights (the task weights ``W``,
the signal sums, the yields, the exposure) equals the full history's up to floating-point rounding, and so do
the task means where no absorbed observation is clipped. The estimator change is the clip of the absorbed block's
mean instead of each observation: a task mean differs from the full history's by at most ``sum_absorbed w_i e_i /
W`` per statistic, ``e_i`` the distance of the unclipped centred value to the clip range (an observation absorbed
clipped on a reference ``r_c``, as a converted state's are: ``e_i = |r - r_c|``), since clipping is 1-Lipschitz
and the full history's mean lies in the range. The tests check that bound with the rows each fold absorbed.
"""

from __future__ import annotations

import json
import math
from collections import deque

import numpy as np
import pytest

from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.history import signal, statistics
from envsched.method.history.statistics import DECAYED_WINDOW, History
from envsched.method.sampler import EnvSchedSampler

N, E, BATCH = 60, 6, 8
ENV = np.arange(N) % E
DEFAULT = SchedulerConfig(batch_size=BATCH)
FULL = SchedulerConfig(batch_size=BATCH, history_tolerance=0.0)
HALF_LIVES = (DEFAULT.long_half_life, DEFAULT.short_half_life, DEFAULT.yield_half_life)


class _Feed:
    """The same dispatches and reports into several histories: random batches and phases, groups of 8 with some
    one scored reward, some late (out of order, at most 4 steps: inside the live window), some discarded, and with
    ``lost > 0`` some never reported (the next report of such a task is then matched to the lost dispatch and
    dated by its old step). ``p(pos, step)`` is the success rate of a task."""

    def __init__(self, histories: list[History], p, seed: int, late: float = 0.2, lost: float = 0.0,
                 graded: bool = False, active=None) -> None:
        self.histories, self.p, self.graded = histories, p, graded
        self.active = active  # the positions a step draws from (``active(step)``); None: all
        self.rng = np.random.default_rng(seed)
        self.late, self.lost = late, lost
        self.pending: deque[tuple[int, int, np.ndarray]] = deque()

    def step(self) -> None:
        rng = self.rng
        step = self.histories[0].step
        pos = rng.choice(N if self.active is None else self.active(step), size=BATCH, replace=False).tolist()
        phases = rng.choice(["coverage", "exploitation", "fill"], size=BATCH, p=[0.4, 0.5, 0.1]).tolist()
        for h in self.histories:
            h.record_batch(pos, phases)
        for p in pos:
            u = rng.random()
            if u < 0.02:
                for h in self.histories:
                    h.record_discard(p)
            elif u < 0.02 + self.lost:
                continue
            else:
                delay = int(rng.integers(1, 5)) if u < 0.02 + self.lost + self.late else 0
                q = self.p(p, step)
                if self.graded:  # half at q - a, half at q + a: m = q, v = a ** 2, d = a ** 2 / (q (1 - q))
                    q += rng.uniform(-0.03, 0.03)
                    r = q + (0.2 + 0.025 * (p % 3)) * np.tile([-1.0, 1.0], 4)
                else:
                    r = (rng.random(8) < q).astype(float)
                    if rng.random() < 0.1:
                        r = r[:1]  # one scored reward: scored, not scorable
                self.pending.append((step + delay, p, r))
        due = [x for x in self.pending if x[0] <= step]
        self.pending = deque(x for x in self.pending if x[0] > step)
        for _, p, r in sorted(due, key=lambda x: -x[0]):
            for h in self.histories:
                h.record_observation(p, r, 8, float(np.var(r)))


def _recording(dec: History) -> list[tuple]:
    """Record, for every fold of ``dec``, the absorbed scored rows with a step reference: positions, steps,
    statistics ``(k, 3)``, their steps' references ``(k, 3)`` and the reference they were clipped on (``None``:
    absorbed unclipped)."""
    folds: list[tuple] = []
    absorb = dec.decayed.absorb

    def wrapper(now, obs, dispatch_pos, dispatch_step, reference, clip):
        keep = (obs["n_scored"] > 0) & (obs["frozen"] == 1)
        if keep.any():
            folds.append((obs["pos"][keep].copy(), obs["step"][keep].copy(),
                          np.stack([obs[c][keep] for c in ("m", "v", "d")], axis=1),
                          np.stack([obs[f"ref_{c}"][keep] for c in ("m", "v", "d")], axis=1),
                          None if reference is None else np.array(reference)))
        absorb(now, obs, dispatch_pos, dispatch_step, reference, clip)

    dec.decayed.absorb = wrapper
    return folds


def _bound(folds, full: History, half_life: float, reference: np.ndarray) -> np.ndarray:
    """``(N, 3)``: ``sum_absorbed w_i e_i / W`` (module docstring), ``W`` the full history's weight."""
    lo, hi = np.array([0.0, 0.0, 0.0]), np.array([1.0, 0.25, 1.0])
    num = np.zeros((N, 3))
    for pos, step, x, ref_s, clipped_on in folds:
        w = np.power(0.5, ((full.step - 1) - step) / half_life)
        if clipped_on is None:
            y = x - ref_s + reference
            e = np.maximum(lo - y, 0.0) + np.maximum(y - hi, 0.0)
        else:
            e = np.broadcast_to(np.abs(reference - clipped_on), x.shape)
        for j in range(3):
            num[:, j] += np.bincount(pos, weights=w * e[:, j], minlength=N)
    weight = full.task_history(half_life, reference).weight
    return np.divide(num, weight[:, None], out=np.zeros((N, 3)), where=weight[:, None] > 0)


def _compare_linear(dec: History, full: History) -> None:
    """What the decayed form keeps exactly (up to rounding)."""
    for name in ("task_observation_counts", "scorable_counts", "env_selection_counts", "outstanding_counts"):
        assert np.array_equal(getattr(dec, name)(), getattr(full, name)()), name
    assert np.array_equal(dec.transitions, full.transitions) and np.array_equal(dec.residual, full.residual)
    assert dec.cumulative_hit_rate() == pytest.approx(full.cumulative_hit_rate(), nan_ok=True, rel=1e-12)
    close = {"rtol": 1e-10, "atol": 1e-12}
    for h in HALF_LIVES:
        np.testing.assert_allclose(dec.exposure(h), full.exposure(h), **close)
        np.testing.assert_allclose(np.array(signal.signal_counts(dec, h)), np.array(signal.signal_counts(full, h)),
                                   **close)
        np.testing.assert_allclose(np.array(signal.env_signal(dec, h)), np.array(signal.env_signal(full, h)), **close)
        yd, yf = signal.phase_yields(dec, h), signal.phase_yields(full, h)
        for k in yf:
            np.testing.assert_allclose(yd[k], yf[k], **close)
    assert np.array_equal(signal.declining(dec, HALF_LIVES[0], HALF_LIVES[1]),
                          signal.declining(full, HALF_LIVES[0], HALF_LIVES[1]))


def test_every_preset_keeps_the_one_form_and_only_the_window_differs():
    paper = SchedulerConfig.paper(batch_size=BATCH)
    assert statistics.history_window(DEFAULT) == DECAYED_WINDOW and statistics.task_horizon(DEFAULT) is None
    assert statistics.history_window(paper) == statistics.task_horizon(paper) == paper.history_horizon == 268
    assert statistics.history_window(FULL) is None and statistics.task_horizon(FULL) is None
    assert statistics.history_window(SchedulerConfig.paper(history_tolerance=0.0)) is None
    for config, window in ((DEFAULT, DECAYED_WINDOW), (paper, 268)):
        h = History(N, ENV, E, config)
        assert h.horizon == window and isinstance(h.decayed, statistics.DecayedStatistics)
        assert h.decayed.half_lives == (2.0, 8.0)
    full = History(N, ENV, E, FULL)
    assert full.horizon is None and full.decayed is None
    with pytest.raises(ValueError, match="absorbs nothing"):
        full.fold(1)


def test_decayed_statistics_equal_the_full_history_where_nothing_is_clipped():
    # graded rewards with central means and variances and a reference that moves little: no centred observation
    # leaves the clip range (binary rewards would not do: their dispersion is always 1 or 0, the edges of its range)
    def p(pos, step):
        return 0.35 + 0.3 * (pos % 5) / 4 + 0.02 * math.sin(step / 9)

    dec, full = History(N, ENV, E, DEFAULT), History(N, ENV, E, FULL)
    folds = _recording(dec)
    feed = _Feed([dec, full], p, seed=3, graded=True)
    checked = 0
    for step in range(160):
        feed.step()
        if step % 20 == 19:
            _compare_linear(dec, full)
            ref = full.global_reference()
            assert np.array_equal(dec.global_reference(), ref)
            for h in (DEFAULT.long_half_life, DEFAULT.short_half_life):
                a, b = dec.task_history(h, ref), full.task_history(h, ref)
                assert len(folds) > 0 or step < 20
                assert np.all(_bound(folds, full, h, ref) == 0.0)  # the case clips nothing
                np.testing.assert_allclose(a.weight, b.weight, rtol=1e-10, atol=0)
                np.testing.assert_allclose(a.values, b.values, rtol=0, atol=1e-12)
                assert np.array_equal(a.groups, b.groups)
                checked += 1
    assert dec.live_start > 120 and len(dec.obs) < 0.2 * len(full.obs)  # most is absorbed
    assert checked == 16


def test_decayed_task_histories_stay_within_the_bound_where_the_clip_binds():
    # extreme tasks (all-fail / all-pass: m = 0 or 1, v = 0) and a reference that swings: clipping everywhere
    def p(pos, step):
        return [0.0, 1.0, 0.5, 0.1][pos % 4] if pos % 3 else float(np.clip(0.5 + 0.45 * math.sin(step / 6), 0, 1))

    dec, full = History(N, ENV, E, DEFAULT), History(N, ENV, E, FULL)
    folds = _recording(dec)
    feed = _Feed([dec, full], p, seed=5)
    worst_ratio, clipped = 0.0, 0
    for step in range(300):
        feed.step()
        if step % 25 == 24 and step > 40:
            _compare_linear(dec, full)
            ref = full.global_reference()
            for h in (DEFAULT.long_half_life, DEFAULT.short_half_life):
                a, b = dec.task_history(h, ref), full.task_history(h, ref)
                np.testing.assert_allclose(a.weight, b.weight, rtol=1e-10, atol=0)
                bound = _bound(folds, full, h, ref)
                dev = np.abs(a.values - b.values)
                assert np.all(dev <= bound + 1e-12)
                clipped += int((bound > 1e-9).sum())
                worst_ratio = max(worst_ratio, float(dev.max()))
    assert clipped > 0 and worst_ratio > 1e-6  # the case does clip, and the bound is what keeps it in check


def test_the_paper_preset_absorbs_only_what_weighs_below_the_tolerance_and_keeps_the_sums_exact():
    # the paper preset's window is its history horizon H, and of the older steps each task keeps in the log (clipped
    # one by one) its observations within H steps of its newest scored one; only the rest is absorbed. Half the
    # tasks are drawn only early and again late (their early rows get absorbed), and left again (they keep theirs)
    tol = 1e-2
    paper = SchedulerConfig.paper(batch_size=BATCH, history_tolerance=tol)
    H = paper.history_horizon
    assert H == 82 and (paper.long_half_life, paper.short_half_life) == (8.0, 2.0)

    def p(pos, step):  # extreme tasks and a swinging reference: the clip binds
        return [0.0, 1.0, 0.5, 0.1][pos % 4] if pos % 3 else float(np.clip(0.5 + 0.45 * math.sin(step / 6), 0, 1))

    def active(step):
        return np.arange(N if step < 30 or 130 <= step < 140 else N // 2)

    dec, full = History(N, ENV, E, paper), History(N, ENV, E, SchedulerConfig.paper(batch_size=BATCH,
                                                                                     history_tolerance=0.0))
    assert dec.horizon == dec.task_horizon == H and full.decayed is None
    folds = _recording(dec)
    feed = _Feed([dec, full], p, seed=7, active=active)
    clipped = 0
    for step in range(320):
        feed.step()
        if step % 40 == 39 and step > 100:
            _compare_linear(dec, full)  # exact: every absorbed observation still counts with its weight
            ref = full.global_reference()
            assert np.array_equal(dec.global_reference(), ref)
            for h in (paper.long_half_life, paper.short_half_life):
                a, b = dec.task_history(h, ref), full.task_history(h, ref)
                np.testing.assert_allclose(a.weight, b.weight, rtol=1e-10, atol=0)
                assert np.array_equal(a.groups, b.groups)
                bound = _bound(folds, full, h, ref)
                assert bound.max() <= tol  # what is absorbed weighs below the tolerance next to the task's newest
                assert np.all(np.abs(a.values - b.values) <= bound + 1e-12)
                clipped += int((bound > 1e-12).sum())
    assert dec.live_start == dec.decayed_live_start(320) == 220 and dec.decayed.absorbed  # folds every H // 4 = 20
    dec.fold(dec.step - H)  # what a fold keeps, checked right after one
    o = dec.obs
    st, pos, scored = o.col("step"), o.col("pos"), o.col("n_scored") > 0
    newest = np.full(N, -1)
    np.maximum.at(newest, pos[scored], st[scored])
    old = st < dec.live_start
    assert np.all(scored[old]) and np.all(st[old] >= newest[pos[old]] - H)  # only what a task's mean needs
    # a task drawn early and not since keeps its rows, clipped one by one: its mean is theirs
    dormant = old & (newest[pos] < 30)
    assert dormant.any() and np.all(pos[dormant] >= N // 2)
    assert sum(f[0].size for f in folds) > 0 and clipped > 0  # early rows were absorbed and the clip binds
    assert len(o) < 0.6 * len(full.obs)


def test_an_exact_log_state_converts_on_load_to_the_decayed_form():
    def p(pos, step):
        return float(np.clip(0.2 + 0.6 * (pos % 7) / 6 + 0.25 * math.sin(step / 30), 0, 1))

    run, full = History(N, ENV, E, DEFAULT), History(N, ENV, E, FULL)
    feed = _Feed([run, full], p, seed=8)
    for _ in range(157):
        feed.step()
    state = json.loads(json.dumps(full.state()))
    assert "decayed" not in state and state["live_start"] == 0
    conv = History.from_state(state, N, ENV, E, DEFAULT)
    # the window of a decayed run of the same length, and, centred on today's reference, the full history's
    # estimates exactly (every absorbed observation is clipped as the log clips it)
    assert conv.live_start == run.live_start == conv.decayed_live_start(157) == 140
    assert len(conv.obs) == len(run.obs) and len(conv.dispatch) == len(run.dispatch)
    ref = full.global_reference()
    assert np.array_equal(conv.global_reference(), ref)
    _compare_linear(conv, full)
    for h in (DEFAULT.long_half_life, DEFAULT.short_half_life):
        a, b = conv.task_history(h, ref), full.task_history(h, ref)
        np.testing.assert_allclose(a.weight, b.weight, rtol=1e-10, atol=0)
        np.testing.assert_allclose(a.values, b.values, rtol=0, atol=1e-12)
    # it continues as a decayed run: within the bound, the load being its first fold
    o = full.obs
    _, has = full.step_references()
    first = (o.col("n_scored") > 0) & (o.col("step") < 140)
    first &= has[o.col("step")]
    folds = _recording(conv)  # (the list the later folds go to)
    folds.append((o.col("pos")[first].copy(), o.col("step")[first].copy(),
                  np.stack([o.col(c)[first] for c in ("m", "v", "d")], axis=1), np.zeros((int(first.sum()), 3)), ref))
    feed.histories = [conv, full]
    for _ in range(40):
        feed.step()
    ref = full.global_reference()
    _compare_linear(conv, full)
    for h in (DEFAULT.long_half_life, DEFAULT.short_half_life):
        dev = np.abs(conv.task_history(h, ref).values - full.task_history(h, ref).values)
        assert np.all(dev <= _bound(folds, full, h, ref) + 1e-12)


# ---------------------------------------------------------------------- through the sampler
G = synthetic_graph(120, 6, seed=11)
TASKS = synthetic_tasks(G)
P0 = np.random.default_rng(3).beta(0.6, 0.6, size=120)


class _Trainer:
    """Asynchronous: most groups at once, some up to 4 steps late (out of order), some dropped, a few lost."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.pending: deque[tuple[int, str, list]] = deque()

    def step(self, samplers: list[EnvSchedSampler], step: int) -> list[str]:
        batches = [s.sample(BATCH) for s in samplers]
        ids = [t["id"] for t in batches[0]]
        for b in batches[1:]:
            assert [t["id"] for t in b] == ids, f"the samplers' choices differ at step {step}"
        for t in ids:
            u = self.rng.random()
            if u < 0.02:
                for s in samplers:
                    s.discard(t)
            elif u < 0.03:
                continue
            else:
                p = float(np.clip(P0[int(t[1:])] + 0.35 * math.sin(step / 40 + int(t[1:])), 0.0, 1.0))
                r = (self.rng.random(BATCH) < p).astype(float).tolist()
                delay = int(self.rng.integers(1, 5)) if u < 0.2 else 0
                self.pending.append((step + delay, t, r))
        due = [x for x in self.pending if x[0] <= step]
        self.pending = deque(x for x in self.pending if x[0] > step)
        for _, t, r in sorted(due, key=lambda x: -x[0]):
            for s in samplers:
                s.update(t, r)
        return ids


@pytest.mark.slow
def test_checkpoint_round_trip_after_5000_asynchronous_steps_continues_the_same_draws():
    s = EnvSchedSampler(TASKS, G, DEFAULT, seed=9)
    trainer = _Trainer(seed=6)
    for step in range(5000):  # the 5,000 asynchronous steps
        trainer.step([s], step)
    h = s.history
    assert h.decayed is not None and h.decayed.absorbed
    # the state holds the live window, the outstanding dispatches (lost groups stay outstanding: 1 % here) and
    # arrays over the pool, nothing that grows with the run
    window = BATCH * (DECAYED_WINDOW + DECAYED_WINDOW // 4)
    assert len(h.obs) <= window + 40  # the window and a few late groups
    assert len(h.dispatch) <= window + h.outstanding_counts().sum()
    hist = s.state_dict()["extra"]["history"]
    assert len(hist["decayed"]["pos"]) <= 120 and len(hist["batch_sizes"]) <= DECAYED_WINDOW + DECAYED_WINDOW // 4
    state = json.loads(json.dumps(s.state_dict()))
    r = EnvSchedSampler(TASKS, G, DEFAULT, seed=0)
    r.load_state_dict(state)
    assert np.array_equal(r.predict().informativeness, s.predict().informativeness)
    assert r.metrics() == pytest.approx(s.metrics(), nan_ok=True)
    for step in range(5000, 5100):
        trainer.step([s, r], step)  # identical draws
    assert json.dumps(r.state_dict()) == json.dumps(s.state_dict())


def _refused_and_unchanged(s: EnvSchedSampler, good: dict, part: str, mutate, words: str) -> None:
    """A copy of the state ``good`` with ``mutate`` applied to ``extra.history`` (``part``: a key below it, or "")
    is refused with a message matching ``words`` and leaves the sampler's state as it was."""
    before = json.dumps(s.state_dict())
    bad = json.loads(json.dumps(good))
    history = bad["extra"]["history"]
    mutate(history[part] if part else history)
    with pytest.raises(ValueError, match=words):
        s.load_state_dict(bad)
    assert json.dumps(s.state_dict()) == before


def test_a_decayed_state_is_refused_by_the_full_log_and_malformed_ones_change_nothing():
    s = EnvSchedSampler(TASKS, G, DEFAULT, seed=1)
    trainer = _Trainer(seed=2)
    for step in range(60):
        trainer.step([s], step)
    good = json.loads(json.dumps(s.state_dict()))
    before = json.dumps(s.state_dict())
    assert "decayed" in good["extra"]["history"]
    with pytest.raises(ValueError, match=r"live_start.*history_tolerance=0"):
        History.from_state(good["extra"]["history"], 120, s.env_codes, len(s.envs), FULL)
    for mutate, words in (
        (lambda d: d["half_lives"][0].update(half_life=3.0), "half_life"),
        (lambda d: d["half_lives"][1]["weight"].__setitem__(0, -1.0), "weight"),
        (lambda d: d["half_lives"][0]["mean"][1].__setitem__(0, 0.5), "mean"),
        (lambda d: d["half_lives"][1]["share"].__setitem__(0, 1.5), "share"),
        (lambda d: d["half_lives"][0]["signal"].__setitem__(0, 1e9), "signal"),
        (lambda d: d.update(at=10**6), "at"),
        (lambda d: d.update(pos=d["pos"][:-1]), "entries"),
    ):
        _refused_and_unchanged(s, good, "decayed", mutate, words)
    assert json.dumps(s.state_dict()) == before


def test_a_late_group_of_an_absorbed_step_keeps_the_reference_when_it_is_the_only_one():
    # nothing is reported for 30 steps (the first folds absorb only dispatches); then one group, matched to its
    # task's dispatch of step 0 (first in, first out), is the only scored observation: the global reference is
    # its statistics, before and after the next fold absorbs it, as in the full history
    dec, full = History(N, ENV, E, DEFAULT), History(N, ENV, E, FULL)
    for step in range(30):
        pos = [(step * BATCH + i) % N for i in range(BATCH)]
        for h in (dec, full):
            h.record_batch(pos, ["coverage"] * BATCH)
    assert dec.live_start == 12 and dec.global_reference() is None
    r = np.array([1.0, 0.0, 1.0, 1.0])
    for h in (dec, full):
        h.record_observation(0, r, 4, float(np.var(r)))
    want = np.array([0.75, 0.1875, 1.0])
    for _ in range(6):  # across the folds at steps 32 and 36
        np.testing.assert_allclose(dec.global_reference(), want, rtol=0, atol=1e-15)
        np.testing.assert_allclose(full.global_reference(), want, rtol=0, atol=1e-15)
        a, b = dec.task_history(8.0, want), full.task_history(8.0, want)
        np.testing.assert_allclose(a.values, b.values, atol=1e-15)
        np.testing.assert_allclose(a.weight, b.weight, rtol=1e-12)
        for h in (dec, full):
            h.record_batch([1, 2], ["coverage", "coverage"])
    assert dec.live_start == 20 and len(dec.obs) == 0  # absorbed


def test_a_live_window_without_signal_after_a_fold_is_read_without_error() -> None:
    """Regression: once folds have absorbed observations, a live window with no signal group made the
    per-environment signal count an empty ``np.bincount`` (int64 even with float weights), and adding the
    decayed float sums to it in place raised. All-fail groups for 60 steps after 20 mixed ones reach it."""
    from envsched.samplers.registry import make_sampler
    from envsched.testing import default_check_pool

    s = make_sampler("envsched", default_check_pool(), seed=0, group_size=4)
    rng = np.random.default_rng(0)
    for step in range(80):
        for t in s.sample(4):
            s.update(t, [float(x) for x in rng.integers(0, 2, 4)] if step < 20 else [0.0] * 4)
    assert s._history.decayed.absorbed
    counts, scorable = signal.env_signal(s._history, s.config.long_half_life)
    assert counts.dtype == np.float64 and counts.sum() > 0 and scorable.sum() > counts.sum()


def test_the_decayed_signal_sums_are_cached_until_the_history_changes_and_read_only():
    g = synthetic_graph(N, E, seed=0)
    s = EnvSchedSampler(synthetic_tasks(g), g, DEFAULT, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(DECAYED_WINDOW + 8):  # past the first fold
        for t in s.sample(BATCH):
            s.update(t, (rng.random(8) < 0.5).astype(float).tolist())
    h = s.history
    first = h.decayed_signal(DEFAULT.long_half_life)
    assert first is not None and h.decayed_signal(DEFAULT.long_half_life) is first  # one computation per step
    fresh = h.decayed.signal(DEFAULT.long_half_life, h.step - 1)
    assert np.array_equal(first.successes, fresh.successes) and np.array_equal(first.scorable, fresh.scorable)
    with pytest.raises(ValueError):
        first.signal[0] = 1.0  # shared between the readers of a step: nobody may change it
    batch = s.sample(BATCH)
    again = h.decayed_signal(DEFAULT.long_half_life)
    assert again is not first  # a new step ages the sums: computed again
    assert np.array_equal(again.failures, h.decayed.signal(DEFAULT.long_half_life, h.step - 1).failures)
    s.update(batch[0], [1.0] * 8)
    assert h.decayed_signal(DEFAULT.long_half_life) is not again


def _unpacked(state):
    """``state`` with every packed array written as a list (what the same state is below the packing size)."""
    from envsched import validation as _validate

    if isinstance(state, dict) and "packed" in state:
        code = state["packed"]
        arr = np.frombuffer(__import__("base64").b64decode(state["base64"]), dtype=_validate._PACKED_DTYPES[code])
        return arr.tolist()
    if isinstance(state, dict):
        return {k: _unpacked(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_unpacked(v) for v in state]
    return state


def test_a_packed_checkpoint_holds_the_same_state_and_continues_the_same_draws(monkeypatch):
    from envsched import validation as _validate

    s = EnvSchedSampler(TASKS, G, DEFAULT, seed=4)
    trainer = _Trainer(seed=5)
    for step in range(300):
        trainer.step([s], step)
    as_lists = json.loads(json.dumps(s.state_dict()))
    monkeypatch.setattr(_validate, "PACK_MIN_ENTRIES", 1)  # every per-task array packed (120 tasks here)
    packed = json.loads(json.dumps(s.state_dict()))
    hist = packed["extra"]["history"]
    assert hist["decayed"]["pos"]["packed"] == "<i8" and hist["progress"]["v"]["packed"] == "<f8"
    assert hist["decayed"]["half_lives"][0]["mean"][1]["packed"] == "<f8"
    assert _unpacked(packed) == as_lists  # the same numbers, bit for bit
    r = EnvSchedSampler(TASKS, G, DEFAULT, seed=0)
    r.load_state_dict(packed)
    assert json.dumps(r.state_dict()) == json.dumps(s.state_dict())
    assert np.array_equal(r.predict().informativeness, s.predict().informativeness)
    for step in range(300, 360):
        trainer.step([s, r], step)  # identical draws
    assert json.dumps(r.state_dict()) == json.dumps(s.state_dict())


def test_malformed_packed_arrays_are_refused_by_name_and_change_nothing(monkeypatch):
    import base64

    from envsched import validation as _validate

    monkeypatch.setattr(_validate, "PACK_MIN_ENTRIES", 1)
    s = EnvSchedSampler(TASKS, G, DEFAULT, seed=1)
    trainer = _Trainer(seed=2)
    for step in range(80):
        trainer.step([s], step)
    good = json.loads(json.dumps(s.state_dict()))
    before = json.dumps(s.state_dict())

    def with_values(packed, change):
        arr = np.frombuffer(base64.b64decode(packed["base64"]), dtype=_validate._PACKED_DTYPES[packed["packed"]]).copy()
        change(arr)
        return {**packed, "base64": base64.b64encode(arr.tobytes()).decode()}

    for mutate, words in (
        (lambda h: h["decayed"].update(pos={**h["decayed"]["pos"], "packed": "<f8"}), r"decayed\.pos must be a packed"),
        (lambda h: h["decayed"]["pos"].update(base64="not base64!"), r"decayed\.pos\.base64 is not valid"),
        (lambda h: h["decayed"]["pos"].update(base64=h["decayed"]["pos"]["base64"][:-4]),
         r"decayed\.pos"),
        (lambda h: h["decayed"]["pos"].update(extra=1), r"unknown keys"),
        (lambda h: h["decayed"]["half_lives"][0].update(
            weight=with_values(h["decayed"]["half_lives"][0]["weight"], lambda a: a.__setitem__(0, np.nan))),
         r"weight\[0\] must be a finite number"),
        (lambda h: h["progress"].update(step=with_values(h["progress"]["step"], lambda a: a.__setitem__(1, -3))),
         r"progress\.step\[1\] must be a whole number"),
        (lambda h: h["progress"].update(step=with_values(h["progress"]["step"], lambda a: a.sort() or a[::-1].sort())),
         r"progress\.step\[\d+\] is before the task's previous point"),
        (lambda h: h["progress"].update(length=with_values(h["progress"]["length"], lambda a: a.__setitem__(0, 9))),
         r"progress\.length\[0\]"),
    ):
        _refused_and_unchanged(s, good, "", mutate, words)
    assert json.dumps(s.state_dict()) == before
