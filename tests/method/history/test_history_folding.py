"""Folding in the paper preset: its window is the history horizon ``H``, and of the folded steps each task keeps in
the log the observations within ``H`` steps of its newest scored one; the rest is absorbed into the decayed
statistics. Every estimate stays within ``history_tolerance`` of the full history's, the counters exact, the logs
bounded, and a checkpoint round trip continues the same draws. States written by the bounded form (the paper
preset's earlier storage, which dropped what it folded) still load."""

from __future__ import annotations

import json
import math
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.sampler import EnvSchedSampler

G = synthetic_graph(120, 6, seed=11)
TASKS = synthetic_tasks(G)
P0 = np.random.default_rng(3).beta(0.6, 0.6, size=120)
BATCH = 8
#: A state the bounded form wrote (see test_a_paper_state_written_by_the_bounded_form_loads_with_its_estimates)
BOUNDED_STATE = Path(__file__).parent / "data" / "paper_bounded_state.json"


def _config(preset: str, **kw) -> SchedulerConfig:
    return (SchedulerConfig.paper if preset == "paper" else SchedulerConfig)(batch_size=BATCH, **kw)


class _Trainer:
    """A small asynchronous trainer: most groups come back at once, some a few steps late, some are
    dropped, some never come back and are discarded when they time out (10 steps later); success rates drift so
    the global reference keeps moving.

    Lost groups time out, as a real trainer's do: a group never discarded stays outstanding, and the next group of
    its task is matched to it (FIFO) and dated by that old step. Once the old step is folded, its reference is
    frozen, and the full history would move it: the one documented exception to the tolerance bound
    (envsched.method.history.statistics), not what this comparison measures."""

    timeout = 10

    def __init__(self, seed: int, max_delay: int = 4, lost: float = 0.01) -> None:
        self.rng = np.random.default_rng(seed)
        self.max_delay = max_delay
        self.lost = lost  # share of groups that never come back
        self.pending: deque[tuple[int, str, object]] = deque()
        self.expiring: deque[tuple[int, str]] = deque()

    def rewards(self, pos: int, step: int) -> list[float | None]:
        p = float(np.clip(P0[pos] + 0.35 * math.sin(step / 40 + pos), 0.0, 1.0))
        r: list[float | None] = (self.rng.random(BATCH) < p).astype(float).tolist()
        if self.rng.random() < 0.05:
            r[:3] = [None, None, None]
        return r

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
            elif u < 0.02 + self.lost:
                self.expiring.append((step + self.timeout, t))  # never comes back: discarded on time-out
                continue
            else:
                delay = int(self.rng.integers(1, self.max_delay + 1)) if u < 0.2 else 0
                self.pending.append((step + delay, t, self.rewards(int(t[1:]), step)))
        while self.expiring and self.expiring[0][0] <= step:
            _, t = self.expiring.popleft()
            for s in samplers:
                s.discard(t)
        due = [x for x in self.pending if x[0] <= step]
        self.pending = deque(x for x in self.pending if x[0] > step)
        for _, t, r in sorted(due, key=lambda x: -x[0]):  # out of order
            for s in samplers:
                s.update(t, r)
        return ids


def _compare(folded: EnvSchedSampler, full: EnvSchedSampler, tol: float) -> float:
    a, b = folded.history, full.history
    assert np.array_equal(a.task_observation_counts(), b.task_observation_counts())
    assert np.array_equal(a.env_selection_counts(), b.env_selection_counts())
    assert np.array_equal(a.scorable_counts(), b.scorable_counts())
    assert np.array_equal(a.transitions, b.transitions)
    assert np.array_equal(a.residual, b.residual)
    assert np.array_equal(a.outstanding_counts(), b.outstanding_counts())
    pa, pb = folded.predict(), full.predict()
    diffs = [np.abs(pa.reference - pb.reference).max(), np.abs(pa.informativeness - pb.informativeness).max()]
    for x, y in ((pa.long, pb.long), (pa.short, pb.short)):
        diffs += [np.abs(x.posterior - y.posterior).max(), np.abs(x.history.weight - y.history.weight).max(),
                  np.abs(x.history.values - y.history.values).max()]
        assert np.array_equal(x.history.groups, y.history.groups)
        assert np.array_equal(x.history.observed, y.history.observed)
    ma, mb = folded.metrics(), full.metrics()
    for key in ("observed_groups", "exploitation_hit_rate_cumulative", "mean_batch_envs", "progress_filtered",
                "outstanding_groups", "batch_reward_variance"):
        assert ma[key] == pytest.approx(mb[key], nan_ok=True, rel=0, abs=1e-12), key
    worst = float(max(diffs))
    assert worst <= tol, f"folded estimates differ by {worst:.3g} > {tol}"
    return worst


# The bounded (exact) history is the paper preset's; the default preset keeps the decayed form, compared with the
# full history in test_decayed_history.py.
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["paper"])
def test_folded_history_matches_the_full_history_on_a_long_asynchronous_run(preset):
    folded = EnvSchedSampler(TASKS, G, _config(preset), seed=5)
    full = EnvSchedSampler(TASKS, G, _config(preset, history_tolerance=0.0), seed=5)
    horizon = folded.config.history_horizon
    assert horizon == 268 and full.config.history_horizon is None
    trainer = _Trainer(seed=1)
    worst = 0.0
    for step in range(430):  # folds at steps 335 and 402
        trainer.step([folded, full], step)  # asserts identical choices every step
        if step in (200, 340, 429):
            worst = max(worst, _compare(folded, full, tol=SchedulerConfig().history_tolerance))
    h = folded.history
    assert h.live_start == 402 - horizon and full.history.live_start == 0
    assert len(h.obs) < len(full.history.obs) and len(h.dispatch) < len(full.history.dispatch)
    assert worst > 0.0 or preset == "paper"  # something was actually dropped and the comparison can see it


@pytest.mark.slow
def test_folding_keeps_only_what_the_tolerance_needs():
    s = EnvSchedSampler(TASKS, G, _config("paper", history_tolerance=1e-3), seed=2)  # the bounded form
    H = s.config.history_horizon
    assert H == 109
    trainer = _Trainer(seed=4, max_delay=2)
    sizes = []
    for step in range(900):
        trainer.step([s], step)
        sizes.append((len(s.history.obs), len(s.history.dispatch)))
    h = s.history
    assert H <= h.step - h.live_start < H + H // 4  # folded every H // 4 steps
    h.fold(h.step - H)  # what a fold keeps, checked right after one
    assert h.live_start == h.step - H
    o = h.obs
    st, pos, scored = o.col("step"), o.col("pos"), o.col("n_scored") > 0
    newest = np.full(h.n, -1)
    np.maximum.at(newest, pos[scored], st[scored])
    old = st < h.live_start
    assert np.all(scored[old]) and np.all(st[old] >= newest[pos[old]] - H)  # only what a task's mean needs
    assert np.all(o.col("frozen")[old] > 0) and np.all(o.col("frozen")[~old] == 0)
    d = h.dispatch
    assert np.all((d.col("step") >= h.live_start) | (d.col("status") == 0))  # old dispatches: outstanding only
    keep = s.config.progress_min_transitions + 1  # the progress filter keeps the points it reads
    assert np.array_equal(h._progress_len, np.minimum(h._progress_points, keep))
    assert h.num_observations > len(o)
    assert len(o) < 0.6 * h.num_observations  # most of the run's groups are absorbed now
    assert h.decayed.absorbed and len(s.state_dict()["extra"]["history"]["decayed"]["pos"]) <= len(TASKS)
    assert max(x[1] for x in sizes[300:]) <= BATCH * (H + H // 4 + 1) + h.outstanding_counts().sum()


@pytest.mark.parametrize("preset", ["adaptive", "paper"])
def test_checkpoint_round_trip_after_folding_continues_the_same_draws(preset):
    config = _config(preset, history_tolerance=1e-4)
    s = EnvSchedSampler(TASKS, G, config, seed=9)
    trainer = _Trainer(seed=6)
    for step in range(260):
        trainer.step([s], step)
    assert s.history.live_start > 0
    state = json.loads(json.dumps(s.state_dict()))
    r = EnvSchedSampler(TASKS, G, config, seed=0)
    r.load_state_dict(state)
    assert r.history.live_start == s.history.live_start
    assert r.metrics() == pytest.approx(s.metrics(), nan_ok=True)
    pa, pr = s.predict(), r.predict()
    assert np.array_equal(pa.informativeness, pr.informativeness)
    for step in range(260, 330):  # both get the same stream, pending groups included
        trainer.step([s, r], step)
    assert json.dumps(r.state_dict()) == json.dumps(s.state_dict())


def test_a_state_written_before_folding_existed_still_loads():
    config = _config("adaptive")
    s = EnvSchedSampler(TASKS, G, config, seed=1)
    trainer = _Trainer(seed=8)
    for step in range(18):  # before the decayed form's first fold (step 20): nothing folded yet, as then
        trainer.step([s], step)
    state = json.loads(json.dumps(s.state_dict()))
    hist = state["extra"]["history"]
    for key in ("live_start", "progress", "folded", "observations", "latest_observed_step"):
        del hist[key]
    for log in ("obs", "dispatch"):
        for col in ("ref_m", "ref_v", "ref_d", "frozen"):
            del hist[log][col]
    r = EnvSchedSampler(TASKS, G, config, seed=0)
    r.load_state_dict(state)
    assert np.array_equal(r.history.transitions, s.history.transitions)
    assert np.array_equal(r.history.residual, s.history.residual)
    for step in range(18, 40):  # across the first folds
        trainer.step([s, r], step)


def test_malformed_folded_state_is_refused_and_changes_nothing():
    s = EnvSchedSampler(TASKS, G, _config("adaptive", history_tolerance=1e-3), seed=1)
    trainer = _Trainer(seed=2)
    for step in range(150):
        trainer.step([s], step)
    good = json.loads(json.dumps(s.state_dict()))
    before = json.dumps(s.state_dict())
    for mutate, words in (
        (lambda h: h.update(live_start=h["step"] + 1), "live_start"),
        (lambda h: h["folded"].update(scored=[-1] * len(h["folded"]["pos"])), "folded scored"),
        (lambda h: h["folded"].update(reference=[0.1, 0.2]), "folded reference"),
        (lambda h: h["progress"]["count"].__setitem__(0, 0), "progress"),
        (lambda h: h["obs"]["frozen"].__setitem__(-1, 1) or h["obs"]["frozen"].__setitem__(0, 0), "frozen"),
    ):
        bad = json.loads(json.dumps(good))
        mutate(bad["extra"]["history"])
        with pytest.raises(ValueError, match=words.split()[0]):
            s.load_state_dict(bad)
        assert json.dumps(s.state_dict()) == before


def test_history_horizon_is_the_smallest_with_a_tail_below_the_tolerance():
    for tol, h in ((1e-9, 8.0), (1e-3, 8.0), (1e-6, 32.0)):
        c = SchedulerConfig(history_tolerance=tol, long_half_life=h, yield_half_life=h, adaptive_share=True)
        H = c.history_horizon
        tail = 2.0 ** (-H / h) / (1.0 - 2.0 ** (-1.0 / h))
        assert tail <= tol < 2.0 ** (-(H - 1) / h) / (1.0 - 2.0 ** (-1.0 / h))
    with pytest.raises(ValueError, match=r"yield_half_life=64.0 changes no batch"):  # the paper does not read it
        SchedulerConfig.paper(yield_half_life=64.0)
    assert SchedulerConfig(history_tolerance=0).history_horizon is None
    for bad in (-1e-3, 0.7, float("nan"), "1e-9"):
        with pytest.raises(ValueError, match="history_tolerance"):
            SchedulerConfig(history_tolerance=bad)


def test_tasks_whose_weight_underflowed_are_dropped_entirely():
    # half-lives of a twentieth of a step: weights underflow to 0.0 after about 54 steps, as in the full log.
    # No group is lost: the next report of a task with a lost group would be matched to the lost dispatch
    # (first in, first out) and dated by its step, long folded with a horizon of 2 steps (the one documented
    # case beyond the tolerance)
    kw = {"long_half_life": 0.05, "short_half_life": 0.02}
    folded = EnvSchedSampler(TASKS, G, _config("paper", **kw), seed=4)
    full = EnvSchedSampler(TASKS, G, _config("paper", history_tolerance=0.0, **kw), seed=4)
    assert folded.config.history_horizon == 2
    trainer = _Trainer(seed=3, max_delay=1, lost=0.0)
    for step in range(150):
        trainer.step([folded, full], step)
        if step % 50 == 49:
            _compare(folded, full, tol=1e-9)
    o, age = folded.history.obs, folded.history.step - 1
    newest = np.full(folded.history.n, -1)
    np.maximum.at(newest, o.col("pos"), o.col("step"))
    kept = np.unique(o.col("pos"))
    assert np.all(age - newest[kept] < 60)  # no task keeps rows once its weight is 0.0
    assert len(o) < 0.2 * len(full.history.obs)


def test_the_progress_points_load_by_the_fast_path_exactly_as_point_by_point(monkeypatch):
    """A saved state's progress points are checked in a few passes over all of them when they are what
    History.state writes; anything else goes through the per-point checks. Random states, valid and corrupted
    (wrong types, ranges, lengths, NaN, bools, huge ints, out-of-order points), give the same points or the same
    refusal either way."""
    import json
    import random

    from envsched.errors import StateError
    from envsched.method.history import statistics as st

    def load(raw, fast):
        if not fast:
            monkeypatch.setattr(st, "_progress_points_fast", lambda *a: None)
        try:
            return "ok", [a.tolist() for a in st._load_progress(json.loads(json.dumps(raw)), 50, 100, 500, 4)]
        except StateError as exc:
            return "refused", str(exc)
        finally:
            monkeypatch.undo()

    rng = random.Random(0)
    seen = set()
    for _ in range(600):
        pos = rng.sample(range(50), rng.randint(0, 6))
        count = [rng.randint(1, 6) for _ in pos]
        points = []
        for c in count:
            pts = [[rng.randint(0, 100), rng.randint(0, 499), rng.choice([0.0, 0.25, rng.random() / 4])]
                   for _ in range(rng.randint(1, min(4, c)))]
            if rng.random() < 0.5:
                pts.sort()
            points.append(pts)
        if points and rng.random() < 0.3:
            i = rng.randrange(len(points))
            j, c = rng.randrange(len(points[i])), rng.randrange(3)
            points[i][j][c] = rng.choice([-1, 101, 500, 0.3, float("nan"), True, "x", None, 2.0, 7, 10**30])
        if points and rng.random() < 0.05:
            points[0] = rng.choice([[], [[1, 2]], "x", [[1, 2, 0.1]] * 5])
        raw = {"pos": pos, "count": count, "points": points}
        fast, slow = load(raw, True), load(raw, False)
        assert fast == slow
        seen.add(fast[0])
    assert seen == {"ok", "refused"}
    # equal (step, sequence) with different variances, out of order: sorted as tuples
    assert load({"pos": [1], "count": [3], "points": [[[5, 7, 0.2], [5, 7, 0.1], [4, 9, 0.0]]]}, True) == \
        ("ok", [[1], [3], [3], [4, 5, 5], [0.0, 0.1, 0.2]])


def test_a_paper_state_written_by_the_bounded_form_loads_with_its_estimates():
    """``data/paper_bounded_state.json`` was written by the bounded form, the paper preset's storage before it kept
    the decayed statistics (envsched commit b4598b7, whose folds dropped what they removed from the logs into exact
    counters): the ``state_dict`` of ``SchedulerConfig.paper(batch_size=4, history_tolerance=0.5)`` (``H = 37``) on
    ``synthetic_graph(48, 4, seed=11)`` after 75 asynchronous steps (late groups, discards, unscored rewards, folds
    at steps 46, 55, 64 and 73), the estimates that code computed from it (``expected_at_load``) and the groups
    still in flight (``pending``: due step, task, rewards). It loads with those estimates, then folds as a paper
    run does."""
    saved = json.loads(BOUNDED_STATE.read_text())
    graph = synthetic_graph(48, 4, seed=11)
    config = SchedulerConfig.paper(**saved["config"])
    hist = saved["state"]["extra"]["history"]
    assert "decayed" not in hist and hist["live_start"] == 36 and len(hist["obs"]["pos"]) == 224
    s = EnvSchedSampler(synthetic_tasks(graph), graph, config, seed=0)
    s.load_state_dict(saved["state"])
    h = s.history
    assert h.horizon == h.task_horizon == 37 and h.live_start == 36 and h.decayed is not None
    # of its folded observations, those within H of their task's newest scored one stay in the log (clipped one by
    # one); the others (unscored, or outweighed by groups reported since its last fold) are absorbed at load
    saved_obs = {k: np.array(hist["obs"][k]) for k in ("pos", "step", "n_scored")}
    scored = saved_obs["n_scored"] > 0
    newest = np.full(48, -1)
    np.maximum.at(newest, saved_obs["pos"][scored], saved_obs["step"][scored])
    stays = (saved_obs["step"] >= 36) | (scored & (saved_obs["step"] >= newest[saved_obs["pos"]] - 37))
    assert len(h.obs) == int(stays.sum()) < 224 and int((h.obs.col("step") < 36).sum()) > 50
    assert h.decayed.absorbed
    want = saved["expected_at_load"]
    ref = h.global_reference()
    assert ref.tolist() == want["reference"]
    for name in ("task_observation_counts", "scorable_counts", "env_selection_counts"):
        assert getattr(h, name)().tolist() == want[name], name
    np.testing.assert_allclose(h.exposure(config.long_half_life), want["exposure_long"], rtol=1e-12, atol=0)
    for name, half_life in (("long", config.long_half_life), ("short", config.short_half_life)):
        th = h.task_history(half_life, ref)
        np.testing.assert_allclose(th.values, want[f"{name}_values"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(th.weight, want[f"{name}_weight"], rtol=1e-12, atol=0)
        assert th.groups.tolist() == want[f"{name}_groups"]
    np.testing.assert_allclose(s.predict().informativeness, want["informativeness"], rtol=0, atol=1e-12)

    # it goes on as a paper run: the groups in flight come back, later folds absorb, and its own state round-trips
    rng = np.random.default_rng(0)
    pending = [(due, t, r) for due, t, r in saved["pending"]]
    for step in range(75, 160):
        for t in s.sample(4):
            pending.append((step + int(rng.integers(0, 3)), t["id"], (rng.random(8) < 0.5).astype(float).tolist()))
        for _, t, r in [x for x in pending if x[0] <= step]:
            s.update(t, r)
        pending = [x for x in pending if x[0] > step]
    assert h is s.history and h.live_start == h.decayed_live_start(160) == 117 and h.decayed.absorbed
    assert h.num_observations == sum(h.task_observation_counts()) - int(h.outstanding_counts().sum())
    state = json.loads(json.dumps(s.state_dict()))
    assert "decayed" in state["extra"]["history"]
    r = EnvSchedSampler(synthetic_tasks(graph), graph, config, seed=1)
    r.load_state_dict(state)
    assert np.array_equal(r.predict().informativeness, s.predict().informativeness)
    assert [t["id"] for t in r.sample(4)] == [t["id"] for t in s.sample(4)]
