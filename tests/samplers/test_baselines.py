import numpy as np
import pytest

from envsched.pool.pool import TaskPool
from envsched.samplers.baselines import DynamicSamplingSampler, GRESOSampler, MoPPSSampler, PLRSampler, is_mixed
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


def test_greso_self_tuning():
    pool = _pool(8)
    s = GRESOSampler(pool, seed=0)
    batch = s.sample(8)
    for t in batch:  # every group easy zero-variance: easy share 1 > 0.25/3, hard share 0 < 0.5/3
        s.update(t, [1.0] * 4)
    s.sample(1)
    assert s.p_easy == pytest.approx(0.49) and s.p_hard == pytest.approx(0.51)
    lo = GRESOSampler(pool, seed=0, initial_rate=0.05)
    for t in lo.sample(8):
        lo.update(t, [1.0] * 4)
    lo.sample(1)
    assert lo.p_easy == pytest.approx(0.05)  # clipped at the lower bound


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


def test_plr_draws_equal_a_sort_per_draw():
    """PLR orders the seen tasks once per batch; the draws equal the plain rule (replay_distribution, which
    sorts the eligible tasks for every draw), ties and score changes included."""

    class PerDraw(PLRSampler):
        def _select(self, n: int) -> list[int]:
            chosen, taken = [], np.zeros(len(self.tasks), dtype=bool)
            for _ in range(n):
                unseen = ~self.seen & ~taken
                replay = self.replay_distribution(exclude=taken)
                if unseen.any() and (self._rng.random() < 1.0 - self.seen.sum() / len(self.tasks)
                                     or replay.sum() == 0):
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
        fast, plain = PLRSampler(tasks, seed=1, score_ema=0.5), PerDraw(tasks, seed=1, score_ema=0.5)
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
