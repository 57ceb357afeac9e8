from collections import Counter

import numpy as np
import pytest

from envsched import CurriculumSampler, SequentialSampler, TaskPool, UniformSampler


def tasks(n, **kw):
    return [{"id": f"t{i}", "env": f"e{i % 2}", **{k: v(i) for k, v in kw.items()}} for i in range(n)]


def test_sequential_order_exhaustion_and_wrap():
    s = SequentialSampler(tasks(3), seeds=[5, 6])
    assert len(s) == 6
    first = s.sample(4)
    assert [(t["id"], t["seed"]) for t in first] == [("t0", 5), ("t0", 6), ("t1", 5), ("t1", 6)]
    rest = s.sample(4)
    assert [(t["id"], t["seed"]) for t in rest] == [("t2", 5), ("t2", 6)]
    assert s.exhausted and s.sample(1) == []
    w = SequentialSampler(tasks(2), wrap=True)
    assert [t["id"] for t in w.sample(5)] == ["t0", "t1", "t0", "t1", "t0"]
    assert not w.exhausted
    assert [t["id"] for t in SequentialSampler(tasks(2))] == ["t0", "t1"]
    with pytest.raises(ValueError, match="seeds must be a non-empty list of integers"):
        SequentialSampler(tasks(2), seeds=[])


def test_sequential_update_only_counts():
    s = SequentialSampler(tasks(2), seeds=[0, 1])
    a, b = s.sample(2)  # the same task with two seeds: two outstanding dispatches
    s.update(a, [1.0])
    s.update(b, [0.0])
    assert s.groups == 2 and s.outstanding_groups == 0


def test_uniform_is_without_replacement_per_epoch():
    s = UniformSampler(tasks(10), seed=1)
    seen = [t["id"] for _ in range(5) for t in s.sample(2)]
    assert sorted(seen) == sorted(f"t{i}" for i in range(10))
    assert s.epoch == 1


def test_uniform_batch_across_epoch_boundary_has_no_duplicates():
    for seed in range(20):
        s = UniformSampler(tasks(7), seed=seed)
        s.sample(5)
        batch = [t["id"] for t in s.sample(6)]  # 2 from epoch 1, 4 from epoch 2
        assert len(set(batch)) == 6, (seed, batch)
        assert s.epoch == 2


def test_uniform_is_uniform():
    s = UniformSampler(tasks(4), seed=0)
    counts = Counter(t["id"] for _ in range(400) for t in s.sample(1))
    assert set(counts.values()) == {100}


def test_curriculum_weight_formula_and_keys():
    pool = TaskPool(tasks(6, difficulty=lambda i: i // 2))
    s = CurriculumSampler(pool, group_size=4, epsilon=0.05, decay=0.5)
    assert s.curriculum_keys == ["0", "1", "2"]
    # unseen keys: p = 0.5, w = 1 - 2 * 0.5^4 + eps
    assert s.weights()["0"] == pytest.approx(1 - 2 * 0.5**4 + 0.05)
    s.require_dispatch = False
    s.update(pool.get("t0"), [1.0, 1.0, 1.0, 0.0])  # key "0": s = 3, f = 1
    s.update(pool.get("t1"), [1.0, 1.0, 0.0, 0.0])  # key "0": s = 0.5*3 + 2, f = 0.5*1 + 2
    p = (3.5 + 1) / (3.5 + 2.5 + 2)
    assert s.success_probabilities()["0"] == pytest.approx(p)
    assert s.weights()["0"] == pytest.approx(1 - p**4 - (1 - p) ** 4 + 0.05)


def test_curriculum_draws_follow_weights_and_cycle_within_key():
    pool = TaskPool(tasks(4, difficulty=lambda i: i // 2))  # keys 0: t0,t1 ; 1: t2,t3
    s = CurriculumSampler(pool, group_size=8, seed=0, require_dispatch=False)
    for _ in range(6):  # key "1" always solved -> low weight
        s.update(pool.get("t2"), [1.0] * 8)
    w = s.weights()
    assert w["1"] < w["0"] / 3
    draws = Counter(t["difficulty"] for t in s.sample(2000))
    expected = w["0"] / (w["0"] + w["1"])
    assert draws[0] / 2000 == pytest.approx(expected, abs=0.02)
    # within a key: without replacement, so two consecutive draws of key 0 in a fresh sampler differ
    s2 = CurriculumSampler(TaskPool(tasks(2, difficulty=lambda i: 0)), group_size=8, seed=3)
    assert sorted(t["id"] for t in s2.sample(2)) == ["t0", "t1"]


def test_curriculum_falls_back_to_id_without_the_key():
    s = CurriculumSampler(tasks(3), group_size=4, key="group")
    assert s.curriculum_keys == ["id:t0", "id:t1", "id:t2"]
    with pytest.raises(ValueError, match="key must be 'difficulty', 'group' or 'id'"):
        CurriculumSampler(tasks(3), group_size=4, key="env")
    with pytest.raises(ValueError, match="group_size must be an integer >= 1, got 0"):
        CurriculumSampler(tasks(3), group_size=0)


def test_curriculum_numeric_keys_sort_numerically():
    s = CurriculumSampler(tasks(12, difficulty=lambda i: i), group_size=2)
    assert s.curriculum_keys[:3] == ["0", "1", "2"] and s.curriculum_keys[-1] == "11"
    assert np.isclose(sum(s.weights().values()), 12 * (1 - 2 * 0.25 + 0.05))


def test_uniform_rng_seed_is_the_rfc_name_and_seed_an_alias():
    a, b, c = UniformSampler(tasks(8), rng_seed=4), UniformSampler(tasks(8), 4), UniformSampler(tasks(8), seed=4)
    draws = [[t["id"] for t in s.sample(8)] for s in (a, b, c)]
    assert draws[0] == draws[1] == draws[2] != [t["id"] for t in UniformSampler(tasks(8), rng_seed=5).sample(8)]
    assert a.rng_seed == a.seed == 4 and "rng_seed" not in a.get_params() and a.get_params()["seed"] == 4
    with pytest.raises(ValueError, match="disagree"):
        UniformSampler(tasks(8), 3, seed=4)


def test_uniform_iterates_without_end_one_epoch_at_a_time():
    import itertools

    s = UniformSampler(tasks(5), rng_seed=0)
    first = [t["id"] for t in itertools.islice(s, 5)]
    second = [t["id"] for t in itertools.islice(s, 5)]
    assert sorted(first) == sorted(second) == [f"t{i}" for i in range(5)] and first != second
    assert s.epoch == 2 and s.outstanding_groups == 10  # drawn through sample(): dispatched like any draw


def test_sequential_update_accepts_any_task_of_its_pool():
    s = SequentialSampler(tasks(3), seeds=[0])
    assert [t["id"] for t in s] == ["t0", "t1", "t2"] and not s.exhausted  # iterating leaves sample() alone
    s.update(tasks(3)[2], [1.0, 0.0])  # never drawn: only the counters move
    assert (s.groups, s.signal_groups, s.episodes) == (1, 1, 2)
    assert [t["id"] for t in s.sample(2)] == ["t0", "t1"]
    with pytest.raises(KeyError):
        s.update({"id": "elsewhere", "env": "e0"}, [1.0])
    strict = SequentialSampler(tasks(3), require_dispatch=True)
    with pytest.raises(ValueError, match="without an outstanding dispatch"):
        strict.update(tasks(3)[0], [1.0])
