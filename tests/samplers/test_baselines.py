import json
import re

import numpy as np
import pytest

from envsched.pool.pool import TaskPool
from envsched.samplers.baselines import DynamicSamplingSampler, GRESOSampler, MoPPSSampler, PLRSampler, is_mixed
from envsched.samplers.registry import make_sampler
from envsched.samplers.simple import UniformSampler


def _pool(n=8, envs=2):
    return TaskPool([{"id": f"t{i}", "env": f"e{i % envs}"} for i in range(n)])


def test_is_mixed_and_dynamic_sampling():
    assert is_mixed([0, 1, 1])
    assert not is_mixed([1, 1, 1]) and not is_mixed([0.0, 0.0]) and not is_mixed([0.5, 0.5])
    assert is_mixed([None, 0.25, 0.5]) and not is_mixed([None, 1.0]) and not is_mixed([None, None])
    pool = _pool(20)
    ds, uni = DynamicSamplingSampler(pool, seed=3), UniformSampler(pool, seed=3)
    assert DynamicSamplingSampler.post_filter and ds.max_gen_rounds == 10
    assert [t["id"] for t in ds.sample(7)] == [t["id"] for t in uni.sample(7)]  # selection = uniform
    assert ds.keep_group([0, 1]) and not ds.keep_group([1, 1])
    with pytest.raises(ValueError, match="max_gen_rounds"):
        DynamicSamplingSampler(pool, max_gen_rounds=0)


def test_mopps_posterior_update_formula():
    pool = _pool(4)
    s = MoPPSSampler(pool, forgetting=0.5, require_dispatch=False)
    s.update("t0", [1, 1, 0, 0])
    assert (s.alpha[0], s.beta[0]) == (3.0, 3.0)  # 0.5*1 + 0.5*1 + 2
    s.update("t0", [1, 0.5, None, 0])  # fractional successes 1.5 of 3 scored
    assert s.alpha[0] == pytest.approx(0.5 * 3 + 0.5 + 1.5)
    assert s.beta[0] == pytest.approx(0.5 * 3 + 0.5 + 1.5)
    acc = MoPPSSampler(pool, forgetting=1.0, require_dispatch=False)
    acc.update("t1", [1] * 8)
    acc.update("t1", [1, 0, 0, 0])
    assert (acc.alpha[1], acc.beta[1]) == (10.0, 4.0)
    assert acc.posterior_mean()[1] == pytest.approx(10 / 14)


def test_mopps_selects_closest_to_target():
    pool = _pool(4)
    s = MoPPSSampler(pool, candidate_ratio=4.0, seed=0)
    # t2 is sharply at p = 0.5, the others sharply at 0.99 / 0.01
    s.alpha[:] = [990.0, 10.0, 1000.0, 990.0]
    s.beta[:] = [10.0, 990.0, 1000.0, 10.0]
    for _ in range(5):
        (task,) = s.sample(1)
        assert task["id"] == "t2"
        s.discard(task)
    picked = {t["id"] for t in s.sample(2)}
    assert "t2" in picked and len(picked) == 2
    # a candidate pool smaller than the pool: only candidates are eligible (ratio 1 -> n candidates)
    s2 = MoPPSSampler(pool, candidate_ratio=1.0, seed=1)
    assert len(s2.sample(3)) == 3


def test_mopps_state_round_trip():
    pool = _pool(4)
    a = MoPPSSampler(pool, seed=5)
    for t in a.sample(2):
        a.update(t, [0, 1, 1])
    b = MoPPSSampler(pool, seed=5)
    b.load_state_dict(a.state_dict())
    assert [t["id"] for t in a.sample(2)] == [t["id"] for t in b.sample(2)]
    bad = a.state_dict()
    bad["extra"]["alpha"] = [1.0]
    with pytest.raises(ValueError, match="MoPPS"):
        b.load_state_dict(bad)


class _Recorder:
    """Forwards to a generator and records the ``alpha`` argument of each ``beta`` call."""

    def __init__(self, rng):
        self.rng, self.alphas = rng, []

    def __getattr__(self, name):
        return getattr(self.rng, name)

    def beta(self, a, b, *args, **kwargs):
        self.alphas.append(np.asarray(a).copy())
        return self.rng.beta(a, b, *args, **kwargs)


def test_mopps_candidates_come_from_the_epoch_loader():
    """Each step's candidates are the next slice of the loader's order: an epoch offers every task once as a
    candidate, and the epoch's last short slice is dropped (drop_last)."""
    pool = _pool(20)
    s = MoPPSSampler(pool, seed=2, candidate_ratio=3.0)
    s.alpha = np.arange(20, dtype=float) + 1.0  # a candidate's alpha names it
    s._rng = _Recorder(s._rng)
    for _ in range(5):
        batch = s.sample(2)  # 6 candidates a step: 3 steps an epoch (18 tasks), the 2 left over dropped
        cand = set((s._rng.alphas[-1] - 1).astype(int).tolist())
        assert {s.position_of(t) for t in batch} <= cand and len(cand) == 6
        for t in batch:
            s.discard(t)
    epoch1 = [set((a - 1).astype(int).tolist()) for a in s._rng.alphas[:3]]
    assert len(set().union(*epoch1)) == 18  # three disjoint slices of one order
    assert len(set().union(*[set((a - 1).astype(int).tolist()) for a in s._rng.alphas[3:5]])) == 12
    # an infinite ratio (accepted by the constructor) makes the whole pool the candidates of every step
    whole = MoPPSSampler(pool, seed=0, candidate_ratio=float("inf"))
    whole._rng = _Recorder(whole._rng)
    assert len(whole.sample(3)) == 3 and len(whole._rng.alphas[-1]) == 20
    # with candidate_ratio 1 the candidates are the batch: the pool once per epoch, in batches
    u = MoPPSSampler(_pool(12), seed=4, candidate_ratio=1.0)
    ids = [t["id"] for _ in range(6) for t in u.sample(4)]
    assert sorted(ids[:12]) == sorted(ids[12:]) == sorted(f"t{i}" for i in range(12))


def test_mopps_state_resumes_the_loader_mid_epoch():
    pool = _pool(12)
    a = MoPPSSampler(pool, seed=7, candidate_ratio=1.0)
    first = [t["id"] for t in a.sample(4)]
    state = json.loads(json.dumps(a.state_dict()))
    assert state["extra"]["cursor"] == 4
    b = MoPPSSampler(pool, seed=0, candidate_ratio=1.0)
    b.load_state_dict(state)
    rest = [t["id"] for t in b.sample(4)] + [t["id"] for t in b.sample(4)]
    assert sorted(first + rest) == sorted(f"t{i}" for i in range(12))  # the restored one finishes the epoch
    assert rest == [t["id"] for t in a.sample(4)] + [t["id"] for t in a.sample(4)]
    for field, value, message in (("order", [*range(11), 0], "extra.order is not a permutation"),
                                  ("cursor", 13, "extra.cursor must be a whole number in [0, 12]"),
                                  ("cursor", None, "extra.cursor must be a whole number")):
        bad = json.loads(json.dumps(state))
        bad["extra"][field] = value
        with pytest.raises(ValueError, match=re.escape(message)):
            MoPPSSampler(pool, candidate_ratio=1.0).load_state_dict(bad)


def test_greso_keep_probability_and_runs():
    pool = _pool(4)
    s = GRESOSampler(pool, require_dispatch=False)
    for _ in range(3):
        s.update("t0", [1, 1, 1])  # easy zero-variance run of 3
    s.update("t1", [0, 0])  # hard run of 1
    for _ in range(10):
        s.update("t2", [0, 0])  # hard run of 10: the 1% floor
    p = s.keep_probability()
    assert p[0] == pytest.approx(0.5**3)
    assert p[1] == pytest.approx(0.5)
    assert p[2] == pytest.approx(0.01)
    assert p[3] == 1.0
    s.update("t0", [0, 1, 1])  # signal resets the run
    assert s.keep_probability()[0] == 1.0
    s.update("t1", [1, 1])  # an easy group after a hard run starts a new (easy) run of 1
    assert s.run_length[1] == 1 and s.run_easy[1]


def _report(sampler, tasks, rewards):
    for t in tasks:
        sampler.update(t, rewards)


MIXED, EASY, HARD = [1.0, 0.0, 1.0, 0.0], [1.0] * 4, [0.0] * 4


def test_greso_rates_frozen_in_the_first_epoch_then_tuned_once_per_training_step():
    """The authors' trainer tunes p_easy / p_hard after each training step (however many generation rounds it
    took), and only from the loader's second epoch."""
    s = GRESOSampler(_pool(8), seed=0, max_gen_rounds=3)
    _report(s, s.sample(4), MIXED)  # round 1 of step 1 (epoch 1): 4 kept groups fill the training batch
    _report(s, s.sample(4), EASY)  # step 1 ended in the first epoch: no tuning; step 2 begins
    assert (s.p_easy, s.p_hard) == (0.5, 0.5) and s.metrics()["epoch"] == 1
    _report(s, s.sample(4), EASY)  # epoch 2 begins; step 2's second round (nothing kept yet)
    assert s.metrics()["epoch"] == 2
    _report(s, s.sample(4), MIXED)  # step 2's third round: still the same training step, no tuning
    assert (s.p_easy, s.p_hard) == (0.5, 0.5)
    s.sample(4)  # step 2 ended (4 kept, and 3 rounds): one tuning over its 12 groups, 8 of them easy
    assert s.p_easy == pytest.approx(0.49) and s.p_hard == pytest.approx(0.51)
    assert s.state_dict()["extra"]["window"] == [0, 0, 0]


def test_greso_tuning_compares_shares_with_at_least():
    """A share equal to its target lowers the rate (the code's ``>=``): 1 easy and 2 hard of 12 groups."""
    s = GRESOSampler(_pool(12), seed=0, max_gen_rounds=1)
    _report(s, s.sample(12), MIXED)  # epoch 1
    batch = s.sample(12)  # epoch 2 begins: step 1 ended in epoch 1, rates frozen
    for i, t in enumerate(batch):
        s.update(t, EASY if i == 0 else HARD if i < 3 else MIXED)
    s.sample(1)
    assert s.p_easy == pytest.approx(0.49) and s.p_hard == pytest.approx(0.49)
    lo = GRESOSampler(_pool(4), seed=0, initial_rate=0.05, max_gen_rounds=1)
    for _ in range(3):
        _report(lo, lo.sample(4), EASY)
    assert lo.p_easy == pytest.approx(0.05)  # clipped at the lower bound


def test_greso_a_step_ends_after_max_gen_rounds_without_a_full_batch():
    s = GRESOSampler(_pool(4), seed=1, max_gen_rounds=2, train_batch_size=3)
    for _ in range(2):  # epoch 1
        _report(s, s.sample(2), MIXED)
    p = []
    for _ in range(6):  # all hard: nothing kept, so each step is 2 rounds
        _report(s, s.sample(2), HARD)
        p.append(s.p_hard)
    # rounds 1-2 of the first epoch-2 step, then a tuning at every second round
    assert p == pytest.approx([0.5, 0.5, 0.49, 0.49, 0.48, 0.48])


def test_greso_walks_the_loader_one_epoch_at_a_time():
    """With nothing skipped, GRESO's stream is uniform without replacement per epoch, and a batch that
    crosses an epoch's end holds distinct tasks."""
    s = GRESOSampler(_pool(10), seed=3)
    drawn = []
    for _ in range(5):
        batch = [t["id"] for t in s.sample(4)]
        assert len(set(batch)) == 4
        drawn += batch
        _report(s, batch, MIXED)
    assert sorted(drawn[:10]) == sorted(f"t{i}" for i in range(10))  # epoch 1
    assert sorted(drawn[10:20]) == sorted(f"t{i}" for i in range(10))  # epoch 2
    assert s.metrics()["epoch"] == 2


def test_greso_skipped_tasks_are_passed_over_for_the_rest_of_their_epoch():
    pool = _pool(20)
    s = GRESOSampler(pool, seed=5, floor=1e-12, require_dispatch=False)
    for i in range(10):  # t0..t9: long hard runs, kept with probability 1e-12
        for _ in range(60):
            s.update(f"t{i}", HARD)
    per_epoch: dict[int, list[str]] = {}
    for _ in range(6):
        batch = s.sample(5)
        per_epoch.setdefault(int(s.metrics()["epoch"]), []).extend(t["id"] for t in batch)
    # each epoch hands out the ten other tasks once and never comes back to a skipped one
    assert {e: sorted(ids) for e, ids in per_epoch.items()} == {e: sorted(f"t{i}" for i in range(10, 20))
                                                               for e in (1, 2, 3)}


def test_greso_fills_from_skipped_tasks_once_it_has_met_every_task():
    s = GRESOSampler(_pool(6), seed=2, floor=1e-12, require_dispatch=False)
    for i in range(6):
        for _ in range(60):
            s.update(f"t{i}", EASY)
    batch = [s.position_of(t) for t in s.sample(3)]
    # every task met once and skipped: the first three skipped, in walk order, and the epoch is used up
    assert batch == s.state_dict()["extra"]["order"][:3]
    assert s.state_dict()["extra"]["cursor"] == 6 and s.metrics()["epoch"] == 1


def test_greso_state_resumes_the_stream_and_the_step_exactly():
    pool = _pool(9)
    rng = np.random.default_rng(0)
    a = GRESOSampler(pool, seed=4, max_gen_rounds=2)
    for _ in range(7):
        _report(a, a.sample(4), [float(x) for x in rng.integers(0, 2, size=4)])
    state = a.state_dict()
    extra = state["extra"]
    assert 0 < extra["cursor"] < 9 and extra["rounds"] > 0  # mid-epoch and mid-step
    b = GRESOSampler(pool, seed=99, max_gen_rounds=2)
    b.load_state_dict(json.loads(json.dumps(state)))
    for _ in range(12):  # across epochs and steps
        ba, bb = a.sample(4), b.sample(4)
        assert ba == bb and (a.p_easy, a.p_hard, a.epoch) == (b.p_easy, b.p_hard, b.epoch)
        rewards = [float(x) for x in rng.integers(0, 2, size=4)]
        _report(a, ba, rewards)
        _report(b, bb, rewards)
    for field, value, message in (("order", [0] * 9, "extra.order is not a permutation"),
                                  ("cursor", 10, "extra.cursor must be a whole number in [0, 9]"),
                                  ("rounds", 3, "extra.rounds must be a whole number in [0, 2]"),
                                  ("kept", 10**6, "extra.kept must be a whole number"),
                                  ("epoch", -1, "extra.epoch must be a whole number")):
        bad = json.loads(json.dumps(state))
        bad["extra"][field] = value
        fresh = GRESOSampler(pool, seed=1, max_gen_rounds=2)
        before = json.dumps(fresh.state_dict(), sort_keys=True)
        with pytest.raises(ValueError, match=re.escape(message)):
            fresh.load_state_dict(bad)
        assert json.dumps(fresh.state_dict(), sort_keys=True) == before


def test_greso_skips_zero_variance_tasks_statistically():
    pool = _pool(40)
    s = GRESOSampler(pool, seed=1, require_dispatch=False)
    for i in range(20):
        for _ in range(6):
            s.update(f"t{i}", [0, 0, 0])  # keep probability 0.5**6 = 1.6%
    s._window = [0, 0, 0]  # no self-tuning signal for this check
    counts = np.zeros(40)
    for _ in range(50):
        for t in s.sample(10):
            counts[s.position_of(t)] += 1
            s.discard(t)
    assert counts[:20].sum() < 0.1 * counts[20:].sum()


def test_plr_replay_distribution_values():
    pool = _pool(4)
    s = PLRSampler(pool, temperature=0.5, staleness_coef=0.2, seed=0)
    batch = s.sample(3)  # nothing seen: three unseen draws
    ids = [t["id"] for t in batch]
    assert len(set(ids)) == 3 and s.draws == 3
    scores = {ids[0]: [0, 1, 0, 1], ids[1]: [0, 0, 0, 1], ids[2]: [1, 1, 1, 1]}  # |adv| 0.5, 0.375, 0
    for tid, r in scores.items():
        s.update(tid, r)
    pos = [s.position_of(t) for t in ids]
    assert s.scores[pos].tolist() == [0.5, 0.375, 0.0]
    p = s.replay_distribution()
    ps = np.array([1.0, 1 / 2**2, 1 / 3**2])
    ps /= ps.sum()
    stale = np.array([3 - 1, 3 - 2, 3 - 3], dtype=float)
    pc = stale / stale.sum()
    assert np.allclose(p[pos], 0.8 * ps + 0.2 * pc)
    unseen = next(i for i in range(4) if i not in pos)
    assert p[unseen] == 0.0 and p.sum() == pytest.approx(1.0)


def test_plr_draws_unseen_then_replays():
    pool = _pool(6)
    s = PLRSampler(pool, seed=2)
    first = s.sample(6)
    assert sorted(t["id"] for t in first) == [f"t{i}" for i in range(6)]
    for i, t in enumerate(first):
        s.update(t, [0, 1] if i == 0 else [1, 1])
    # all seen: every draw replays; the top-ranked task dominates at temperature 0.1
    counts = {}
    for _ in range(30):
        (t,) = s.sample(1)
        counts[t["id"]] = counts.get(t["id"], 0) + 1
        s.discard(t)
    top = first[0]["id"]
    assert counts.get(top, 0) >= 20


def test_plr_and_greso_state_round_trip():
    pool = _pool(6)
    for cls in (PLRSampler, GRESOSampler):
        a = cls(pool, seed=4)
        for t in a.sample(3):
            a.update(t, [0, 0, 1])
        b = cls(pool, seed=4)
        b.load_state_dict(a.state_dict())
        assert [t["id"] for t in a.sample(3)] == [t["id"] for t in b.sample(3)]


@pytest.mark.parametrize("kwargs", [{"candidate_ratio": 0.5}, {"forgetting": 2.0}, {"target": -1},
                                    {"prior": (0, 1)}])
def test_mopps_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        MoPPSSampler(_pool(), **kwargs)


@pytest.mark.parametrize(("cls", "kwargs"), [(GRESOSampler, {"floor": 0}), (GRESOSampler, {"initial_rate": 0.01}),
                                             (PLRSampler, {"temperature": 0}), (PLRSampler, {"staleness_coef": 2})])
def test_bad_arguments(cls, kwargs):
    with pytest.raises(ValueError):
        cls(_pool(), **kwargs)


@pytest.mark.parametrize("min_seen", [1.0, 0.4, 0.0])
def test_plr_draws_equal_a_sort_per_draw(min_seen):
    """PLR orders the seen tasks once per batch; the draws equal the plain rule (the code's proportionate
    schedule, with replay_distribution sorting the eligible tasks for every draw), ties and score changes
    included."""

    class PerDraw(PLRSampler):
        def _select(self, n: int) -> list[int]:
            chosen, taken = [], np.zeros(len(self.tasks), dtype=bool)
            p_seen = self.seen.sum() / len(self.tasks)
            for _ in range(n):
                unseen = ~self.seen & ~taken
                replay = self.replay_distribution(exclude=taken)
                if unseen.any() and not (p_seen >= self.min_seen_fraction and replay.sum() > 0
                                         and self._rng.random() < p_seen):
                    cand = np.flatnonzero(unseen)
                    i = int(cand[self._rng.integers(cand.size)])
                else:
                    i = int(self._rng.choice(len(self.tasks), p=replay / replay.sum()))
                chosen.append(i)
                taken[i] = True
                self.draws += 1
                self.last_draw[i] = self.draws
            return chosen

    for n_tasks, steps in ((40, 50), (600, 30)):
        tasks = [{"id": f"t{i}", "env": f"e{i % 7}"} for i in range(n_tasks)]
        opts = {"seed": 1, "score_ema": 0.5, "min_seen_fraction": min_seen}
        fast, plain = PLRSampler(tasks, **opts), PerDraw(tasks, **opts)
        rng = np.random.default_rng(0)
        p = rng.random(n_tasks)
        for k in range(steps):
            batch = fast.sample(16)
            assert [t["id"] for t in batch] == [t["id"] for t in plain.sample(16)], k
            for t in batch:
                r = (rng.random(4) < p[int(t["id"][1:])]).astype(float)
                r = (r * 0.5).round(1) if k % 5 == 0 else r  # equal scores: ties broken by position
                fast.update(t, r.tolist())
                plain.update(t, r.tolist())
        assert fast.seen.sum() > 0.5 * n_tasks


def test_plr_plays_every_task_once_before_any_replay():
    """The code's rho = 1.0: no replay until every task has a score, however high the seen ones score; then
    only replays (here the top-scored task is in every batch)."""
    s = PLRSampler(_pool(12), seed=0)
    first = []
    for k in range(3):
        batch = s.sample(4)
        first += [t["id"] for t in batch]
        for t in batch:
            s.update(t, [1, 0, 1, 0] if t["id"] == first[0] else [1, 1, 1, 1])
        assert s.metrics()["seen_fraction"] == pytest.approx((k + 1) / 3)
    assert sorted(first) == sorted(f"t{i}" for i in range(12))
    for _ in range(10):
        batch = [t["id"] for t in s.sample(4)]
        assert first[0] in batch
        for t in batch:
            s.discard(t)
    # the paper's rule from the first step (plr-early-replay) replays as soon as a task is seen: over 20 seeds,
    # the first three batches repeat tasks (about 2.4 a seed)
    repeats = 0
    for seed in range(20):
        early, drawn = make_sampler("plr-early-replay", _pool(12), seed=seed), []
        for _ in range(3):
            batch = early.sample(4)
            drawn += [t["id"] for t in batch]
            _report(early, batch, [1, 0, 1, 0])
        repeats += len(drawn) - len(set(drawn))
    assert repeats > 20


def test_plr_a_task_without_a_scored_group_stays_unseen_and_is_drawn_again():
    s = PLRSampler(_pool(4), seed=3)
    batch = s.sample(2)
    s.update(batch[0], [None, None])  # unscored
    s.discard(batch[1])  # dropped
    assert s.metrics()["seen_fraction"] == 0.0
    second = s.sample(2)
    for t in second:
        s.update(t, [1, 0])
    # nothing replays while a task is unseen: the third batch is exactly the tasks without a score
    third = {t["id"] for t in s.sample(2)}
    assert third == {f"t{i}" for i in range(4)} - {t["id"] for t in second}


def test_a_plr_record_without_min_seen_fraction_resumes_the_early_replay_it_recorded():
    """A construction record written before PLR swept every level first names no ``min_seen_fraction``: it is
    rebuilt with 0.0 (replay from the second step), so a history store of it replays the draws it recorded."""
    from envsched import TaskPool
    from envsched.samplers.baselines import PLRSampler

    pool = TaskPool([{"id": f"t{i}", "env": f"e{i % 3}"} for i in range(30)])
    early = PLRSampler(pool, seed=4, min_seen_fraction=0.0)
    record = early.to_record()
    record["sampler_params"].pop("min_seen_fraction")
    rebuilt = PLRSampler.from_record(pool, record)
    assert rebuilt.min_seen_fraction == 0.0
    assert PLRSampler(pool, seed=4).min_seen_fraction == 1.0  # today's default sweeps first
    for sampler in (early, rebuilt):
        for task in sampler.sample(6):
            sampler.update(task, [0.0, 1.0, 1.0, 0.0])
    assert [t["id"] for t in rebuilt.sample(6)] == [t["id"] for t in early.sample(6)]
