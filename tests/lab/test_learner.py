import itertools

import numpy as np
import pytest

from envsched.pool.pool import TaskPool
from envsched_lab.learner import LearnerConfig, LearnerModel, task_structure


def _pool(n_env=4, per_env=6):
    specs = []
    for e in range(n_env):
        for i in range(per_env):
            specs.append({"id": f"e{e}/t{i}", "env": f"env{e}", "pattern": f"p{i % 2}",
                          "tools": [{"name": f"op{i % 3}"}, {"name": "common"}],
                          "verifier": {"checks": ["c1", "c2", "c3", "c4"][: 1 + i % 4]}})
    return TaskPool(specs)


def test_seeded_determinism_and_range():
    pool = _pool()
    a, b, c = LearnerModel(pool, seed=7), LearnerModel(pool, seed=7), LearnerModel(pool, seed=8)
    pos = np.arange(len(pool))
    ra, ca = a.rollout(pos, 8)
    rb, _ = b.rollout(pos, 8)
    rc, _ = c.rollout(pos, 8)
    assert np.array_equal(ra, rb)
    assert not np.array_equal(ra, rc)
    assert ((ra >= 0) & (ra <= 1)).all()
    # no executable environment: a task with tools costs its number of checks per rollout (1 at least)
    checks = np.array([len(t["verifier"]["checks"]) for t in pool], dtype=float)
    assert ca.shape == ra.shape and np.array_equal(ca, np.repeat(checks[:, None], 8, axis=1))
    # graded: a task with 4 checks yields multiples of 1/4; binary mode yields 0/1 only
    four = [i for i, t in enumerate(pool) if len(t["verifier"]["checks"]) == 4]
    assert np.allclose((ra[four] * 4) % 1, 0)
    rbin, _ = LearnerModel(pool, {"reward": "binary"}, seed=7).rollout(pos, 8)
    assert set(np.unique(rbin)) <= {0.0, 1.0}
    # training the same groups keeps two equal-seed models equal
    a.train(pos, ra)
    b.train(pos, rb)
    assert np.array_equal(a.competence(), b.competence())


def test_no_signal_no_learning():
    pool = _pool()
    m = LearnerModel(pool, {"forgetting": 0.0}, seed=1)
    before = m.competence().copy()
    pos = np.arange(len(pool))
    flat = np.tile(np.array([[0.0] * 8, [1.0] * 8, [0.5] * 8]), (len(pool) // 3, 1))
    assert m.train(pos, flat) == 0.0
    assert np.array_equal(m.competence(), before)
    # with forgetting on and nothing learnt yet, nothing moves either (skills sit at their initial values)
    m2 = LearnerModel(pool, seed=1)
    m2.train(pos, flat)
    assert np.allclose(m2.competence(), before)


def test_learning_is_proportional_to_group_signal():
    pool = _pool()
    small, big = LearnerModel(pool, seed=2), LearnerModel(pool, seed=2)
    c0 = small.competence()[0]
    small.train([0], [[0, 0, 0, 0, 0, 0, 0, 1.0]])  # std 0.331
    big.train([0], [[0, 0, 0, 0, 1, 1, 1, 1.0]])  # std 0.5
    gain_small, gain_big = small.competence()[0] - c0, big.competence()[0] - c0
    assert gain_small > 0 and gain_big > 0
    assert gain_big / gain_small == pytest.approx(0.5 / np.std([0] * 7 + [1]), rel=0.05)


def test_transfer_direction_and_no_sharing():
    pool = _pool()
    i = 0  # e0/t0
    same_env = [j for j, t in enumerate(pool) if t["env"] == "env0" and j != i]
    other = [j for j, t in enumerate(pool) if t["env"] != "env0" and t["pattern"] != pool[i]["pattern"]]
    shared = LearnerModel(pool, {"sharing": 1.0, "forgetting": 0.0}, seed=3)
    c0 = shared.competence()
    shared.train([i], [[0, 1] * 4])
    d = shared.competence() - c0
    assert d[i] > 0
    assert (d[same_env] > 0).all()          # transfer to tasks sharing the environment / tools
    assert d[i] >= d[same_env].max() - 1e-12  # the trained task gains most
    iso = LearnerModel(pool, {"sharing": 0.0, "forgetting": 0.0}, seed=3)
    c0 = iso.competence()
    iso.train([i], [[0, 1] * 4])
    d = iso.competence() - c0
    assert d[i] > 0
    assert np.allclose(np.delete(d, i), 0.0)  # structure sharing off: nothing else moves
    assert other  # the pool has unrelated tasks (sanity of the fixture)


def test_forgetting_relaxes_toward_initial():
    pool = _pool()
    m = LearnerModel(pool, {"forgetting": 0.1, "sharing": 0.5, "transfer": 0.0}, seed=4)
    c0 = m.competence().copy()
    m.train([0], [[0, 1] * 4])
    after = m.competence()[0]
    assert after > c0[0]
    gaps = []
    other = next(j for j, t in enumerate(pool) if t["env"] == "env3" and t["pattern"] != pool[0]["pattern"])
    for _ in range(5):  # train something unrelated with signal: task 0's skills are not moved
        m.train([other], [[0, 1] * 4])
        gaps.append(m.competence()[0] - c0[0])
    assert all(g2 < g1 for g1, g2 in itertools.pairwise(gaps))
    assert 0 < gaps[-1] < after - c0[0]


def test_expected_reward_matches_rollouts_and_score():
    pool = _pool()
    m = LearnerModel(pool, seed=5)
    pos = np.arange(len(pool))
    r, _ = m.rollout(pos, 4000, rng=np.random.default_rng(0))
    assert np.abs(r.mean(axis=1) - m.expected_reward()).max() < 0.03
    assert np.abs(r.var(axis=1) - m.expected_variance()).max() < 0.02
    assert m.score() == pytest.approx(100 * m.expected_reward().mean())


def test_misleading_features_and_bad_input():
    pool = _pool()
    assert not LearnerModel(pool, seed=1).misleading.any()
    noisy = LearnerModel(pool, {"feature_noise": 1.0}, seed=1)
    assert noisy.misleading.all()
    with pytest.raises(ValueError, match="sharing"):
        LearnerConfig(sharing=1.5)
    with pytest.raises(ValueError, match="unknown learner option"):
        LearnerModel(pool, {"shareing": 0.5})
    m = LearnerModel(pool, seed=1)
    with pytest.raises(ValueError, match="rewards must be"):
        m.train([0, 1], [[0.0, 1.0]])
    with pytest.raises(ValueError, match="positions"):
        m.rollout([len(pool)], 2)


def test_task_structure_patterns():
    tools, pattern, env, checks = task_structure({"id": "a", "env": "E", "tools": [{"name": "x"}],
                                                  "verifier": {"checks": ["1", "2"]}, "group": "g"})
    assert (tools, pattern, env, checks) == (["E::x"], "group:g", "E", 2)
    rg = task_structure({"id": "b", "env": "reasoning_gym/gcd", "reasoning_gym": {"dataset": "gcd"},
                         "verifier": {"checks": ["a", "b", "c"]}})
    assert rg[1] == "rg:arithmetic" and rg[3] == 1


def test_bfcl_rollouts_run_the_real_checker():
    bfcl = pytest.importorskip("envsched.envs.bfcl")
    if not bfcl.bfcl_available():
        pytest.skip("bfcl-eval not installed")
    specs = bfcl.build_bfcl_pool(["base"], limit=2)
    pool = TaskPool(specs)
    easy = LearnerModel(pool, {"difficulty_mean": -40.0, "difficulty_sd": 0.0}, seed=0)
    hard = LearnerModel(pool, {"difficulty_mean": 40.0, "difficulty_sd": 0.0}, seed=0)
    assert easy.bfcl_tasks == [0, 1]
    r_easy, cost = easy.rollout([0, 1], 3)
    r_hard, _ = hard.rollout([0, 1], 3)
    full = [bfcl.replay_reward(t, bfcl.ground_truth_calls(t)) for t in specs]
    assert np.array_equal(r_easy, np.array([[full[0]] * 3, [full[1]] * 3]))  # every call right: checker's verdict
    assert (r_hard == 0).all()  # every tool wrong: the real checker fails it
    assert cost[0, 0] == sum(len(t) for t in bfcl.ground_truth_calls(specs[0]))
    assert easy.bfcl_rollouts == 6


def _mixed(n_groups: int, n_mixed: int) -> np.ndarray:
    """``n_groups`` groups of 8 rewards, the first ``n_mixed`` with signal (std 0.5), the rest all-fail."""
    r = np.zeros((n_groups, 8))
    r[:n_mixed, :4] = 1.0
    return r


def _move(model: LearnerModel, before: np.ndarray) -> np.ndarray:
    return np.abs(model.competence() - before)


def test_mean_step_gives_a_full_batch_of_signal_no_more_per_group_than_a_diluted_one():
    # The structural handicap of the "mean" step: a task in a batch of 24 mixed groups moves exactly as much as
    # the same task in a batch of 24 groups of which 8 are mixed, so filtering (dynamic sampling) buys nothing
    # per group.
    pool = _pool()
    cfg = {"forgetting": 0.0, "transfer": 0.0, "sharing": 0.0}
    full, diluted = LearnerModel(pool, cfg, seed=3), LearnerModel(pool, cfg, seed=3)
    pos = np.arange(24)
    b_full, b_dil = full.competence().copy(), diluted.competence().copy()
    full.train(pos, _mixed(24, 24))
    diluted.train(pos, _mixed(24, 8))
    assert np.allclose(_move(full, b_full)[:8], _move(diluted, b_dil)[:8])


def test_normalised_step_lets_a_batch_of_signal_move_more_per_step():
    pool = _pool()
    cfg = {"forgetting": 0.0, "transfer": 0.0, "sharing": 0.0, "step": "normalised", "normalised_lr": 0.05}
    full, diluted = LearnerModel(pool, cfg, seed=3), LearnerModel(pool, cfg, seed=3)
    pos = np.arange(24)
    for _ in range(30):  # each optimiser sees its own kind of batch, as in a run
        b_full, b_dil = full.competence().copy(), diluted.competence().copy()
        full.train(pos, _mixed(24, 24))
        diluted.train(pos, _mixed(24, 8))
    step_full, step_dil = _move(full, b_full), _move(diluted, b_dil)
    # a step's length is about normalised_lr either way (sharing 0: the move is the competence move)
    assert np.linalg.norm(step_full) == pytest.approx(0.05, rel=0.05)
    assert np.linalg.norm(step_dil) == pytest.approx(0.05, rel=0.05)
    # the full batch spreads it over 3x the tasks: total movement sqrt(3)x larger, each task 1/sqrt(3) of it
    assert step_full.sum() / step_dil.sum() == pytest.approx(np.sqrt(3), rel=0.02)
    assert (step_dil[8:] == 0).all() and (step_full > 0).all()


def test_normalised_state_round_trips_and_refuses_bad_values():
    pool = _pool()
    m = LearnerModel(pool, {"step": "normalised"}, seed=4)
    m.train(np.arange(6), _mixed(6, 3))
    state = m.state_dict()
    other = LearnerModel(pool, {"step": "normalised"}, seed=4)
    other.load_state_dict(state)
    assert other.norm_sq_mean == m.norm_sq_mean > 0 and other.norm_steps == 1
    with pytest.raises(ValueError, match="norm_sq_mean"):
        other.load_state_dict({**state, "norm_sq_mean": float("nan")})
    assert other.norm_sq_mean == m.norm_sq_mean
    with pytest.raises(ValueError, match="step must be"):
        LearnerConfig(step="adam")
    # the normalised step's knobs are refused where the mean step would ignore them
    with pytest.raises(ValueError, match=r"normalised_lr=0\.1 is read only with step='normalised'"):
        LearnerConfig(normalised_lr=0.1)
    assert LearnerConfig(step="normalised", normalised_lr=0.1).normalised_lr == 0.1
