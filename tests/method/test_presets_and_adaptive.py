"""EnvSched presets: the batch split as a share, its refusal, the pinned paper preset, the adaptive mode's rules
(posterior with None rewards, the online coverage share, caps on decline, coverage of never-selected
environments), state round-trips and the registry entries."""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter

import numpy as np
import pytest

from envsched.method.config import ADAPTIVE_TUNING_SPACE, SchedulerConfig
from envsched.method.graph.synthetic import graph_from_arrays, synthetic_graph, synthetic_tasks
from envsched.method.history import signal
from envsched.method.sampler import EnvSchedSampler
from envsched.samplers.registry import available_samplers, make_sampler

#: The online coverage share and the UCB coverage ranking: rules of ours that both presets leave off; the tests of
#: those rules switch them on.
ADAPTIVE = {"adaptive_share": True, "adaptive_coverage": True}

# ---------------------------------------------------------------------------------------------- the split


@pytest.mark.parametrize(("share", "n", "slots"), [
    (0.5, 1, 0), (0.5, 2, 1), (0.5, 3, 2), (0.5, 5, 2), (0.5, 7, 4), (0.5, 32, 16), (0.5, 64, 32),
    (0.5, 100, 50), (0.25, 64, 16), (0.25, 10, 2), (0.25, 3, 1), (0.125, 32, 4), (0.0, 64, 0),
])
def test_coverage_slots_are_a_share_of_any_n(share, n, slots):
    assert SchedulerConfig.paper(coverage_share=share).coverage_slots_for(n) == slots
    assert SchedulerConfig(coverage_share=share, coverage_share_floor=0.0,
                           adaptive_share=True).coverage_slots_for(n) == slots


def _pool(n_envs: int, per_env: int):
    tasks = [{"id": f"e{e}t{j}", "env": f"env{e}"} for e in range(n_envs) for j in range(per_env)]
    return tasks, [t["env"] for t in tasks]


def _ring_graph(tasks, envs):
    """Within: the other tasks of the environment; cross: task ``i + per_env`` (the next environment's
    same slot, wrapping around)."""
    n = len(tasks)
    per_env = sum(e == envs[0] for e in envs)
    within = [[j for j in range(n) if j != i and envs[j] == envs[i]] for i in range(n)]
    return graph_from_arrays([t["id"] for t in tasks], envs, within, [[(i + per_env) % n] for i in range(n)])


def _binary(rng, p):
    return (rng.random(8) < p).astype(float).tolist()


@pytest.mark.parametrize("n", [10, 24, 32])
def test_paper_split_holds_at_batch_sizes_other_than_64(n):
    # the bug: batch_size=32 made 32 coverage slots take the whole batch (0 exploitation picks)
    g = synthetic_graph(240, 8, seed=4)
    tasks = synthetic_tasks(g)
    s = EnvSchedSampler(tasks, g, SchedulerConfig.paper(batch_size=32), seed=0)
    rng = np.random.default_rng(0)
    for step in range(4):
        batch = s.sample(n)
        if step:
            assert Counter(s.last_phases()) == {"coverage": round(n / 2), "exploitation": n - round(n / 2)}
        for t in batch:
            s.update(t, _binary(rng, 0.5))


def test_caps_scale_with_the_batch():
    c = SchedulerConfig.paper()
    assert c.caps_for(64) == (4, 11)
    assert c.caps_for(32) == (2, 6)  # round(5.5) = 6
    assert c.caps_for(128) == (8, 22)
    assert c.caps_for(4) == (1, 1)
    assert SchedulerConfig.paper(batch_size=32).caps_for(32) == (4, 11)


def test_a_split_without_exploitation_is_refused_and_changes_nothing():
    with pytest.raises(ValueError, match="no exploitation slot"):
        SchedulerConfig(coverage_share=1.0)
    with pytest.raises(ValueError, match="no exploitation slot"):
        SchedulerConfig.paper(coverage_share=0.99, batch_size=32)  # round(31.68) = 32
    assert SchedulerConfig.paper(coverage_share=0.99, batch_size=64).coverage_slots_for(64) == 63
    assert SchedulerConfig.paper(coverage_share=1.0, mode="coverage_only").coverage_slots_for(5) == 5
    with pytest.raises(ValueError, match="coverage_share_floor"):
        SchedulerConfig(coverage_share_floor=-0.1)
    with pytest.raises(ValueError, match="exploitation_rule"):
        SchedulerConfig(exploitation_rule="greedy")
    g = synthetic_graph(60, 4, seed=1)
    tasks = synthetic_tasks(g)
    cfg = SchedulerConfig.paper(coverage_share=0.7)
    s = EnvSchedSampler(tasks, g, cfg, seed=5)
    ref = EnvSchedSampler(tasks, g, cfg, seed=5)
    rng = np.random.default_rng(3)
    for _ in range(2):
        for t in s.sample(8):
            s.update(t, _binary(rng, 0.5))
    rng = np.random.default_rng(3)
    for _ in range(2):
        for t in ref.sample(8):
            ref.update(t, _binary(rng, 0.5))
    before = json.dumps(s.state_dict())
    with pytest.raises(ValueError, match=r"n=1 .* no exploitation slot"):
        s.sample(1)  # round(0.7) = 1 coverage slot of 1
    assert json.dumps(s.state_dict()) == before
    assert [t["id"] for t in s.sample(8)] == [t["id"] for t in ref.sample(8)]  # the RNG did not move either


# ---------------------------------------------------------------------------------------------- paper preset


def _pinned_run(cfg, n_tasks, n_envs, n, steps, seed):
    g = synthetic_graph(n_tasks, n_envs, seed=seed)
    tasks = synthetic_tasks(g)
    s = EnvSchedSampler(tasks, g, cfg, seed=seed)
    rng = np.random.default_rng(100 + seed)
    p = rng.beta(0.6, 0.6, size=len(tasks))
    out = []
    for _ in range(steps):
        batch = s.sample(n)
        ids = [s.position_of(t) for t in batch]
        out.append(ids)
        for t, i in zip(batch, ids, strict=True):
            r: list[float | None] = (rng.random(8) < p[i]).astype(float).tolist()
            if i % 7 == 0:
                r[0] = None
            if i % 11 == 0:  # graded rewards on some tasks
                r = [x if x is None else 0.5 * x + 0.25 * (k % 2) for k, x in enumerate(r)]
            s.update(t, r)
    return out


@pytest.mark.parametrize(("case", "cfg", "shape", "digest", "second", "last"), [
    ("default64", {}, (600, 12, 64, 8, 0), "a93ca01b3e4b0701", [339, 450, 285, 388, 239, 425, 284, 550],
     [536, 571, 514, 180, 341, 210, 244, 383, 361, 482, 177, 171]),
    ("b16_full", {"batch_size": 16}, (120, 12, 16, 10, 1), "40c40a83b8d0c790", [20, 66, 34, 53, 74, 13, 23, 79],
     [77, 45, 87, 85, 31, 100, 119, 36, 9, 104, 116, 91]),
    ("b16_exp_only", {"batch_size": 16, "mode": "exploitation_only"}, (120, 12, 16, 6, 2), "8b6a140d4a624898",
     [82, 40, 18, 118, 57, 17, 32, 94], [7, 31, 40, 21, 114, 75, 53, 30, 8, 119, 6, 96]),
])
def test_paper_preset_draws_exactly_what_the_code_before_the_adaptive_mode_drew(case, cfg, shape, digest,
                                                                                  second, last):
    # expected values computed on commit 338c686 (before the share and the adaptive mode), with
    # SchedulerConfig(**cfg, coverage_slots=batch_size // 2): every batch's positions, hashed
    out = _pinned_run(SchedulerConfig.paper(**cfg), *shape)
    assert out[1][:8] == second and out[-1][:12] == last
    assert hashlib.sha256(json.dumps(out).encode()).hexdigest()[:16] == digest


# ---------------------------------------------------------------------------------------------- posterior


def test_signal_posterior_counts_scored_rewards_and_ignores_none():
    tasks, envs = _pool(2, 2)
    g = _ring_graph(tasks, envs)
    s = EnvSchedSampler(tasks, g, reward_range=(0.0, 10.0), require_dispatch=False)
    s.update("e0t0", [10.0, None, 0.0, 10.0])  # 2 successes, 1 failure; None is not a failure
    s.update("e0t1", [None, None])  # nothing scored: no counts at all
    s.update("e1t0", [2.5, 7.5, None])  # graded: 0.25 + 0.75 successes, 0.75 + 0.25 failures
    succ, fail = signal.signal_counts(s.history, 8.0)
    np.testing.assert_allclose(succ, [2.0, 0.0, 1.0, 0.0])
    np.testing.assert_allclose(fail, [1.0, 0.0, 1.0, 0.0])
    mu = np.array([0.5, 0.2, 0.4, 0.9])
    a, b = signal.signal_posterior(s.history, mu, 4.0, 8.0)
    np.testing.assert_allclose(a, [4.0, 0.8, 2.6, 3.6])
    np.testing.assert_allclose(b, [3.0, 3.2, 3.4, 0.4])


def test_signal_probability_formulas():
    # Beta(1, 1), G = 2: 1 - E[p^2] - E[(1-p)^2] = 1 - 1/3 - 1/3
    assert signal.mixed_probability(np.array([1.0]), np.array([1.0]), 2)[0] == pytest.approx(1 / 3)
    # concentrated posterior: the predictive probability tends to 1 - p^G - (1-p)^G
    p = 0.3
    big = signal.mixed_probability(np.array([p * 1e6]), np.array([(1 - p) * 1e6]), 8)[0]
    assert big == pytest.approx(1 - p ** 8 - (1 - p) ** 8, abs=1e-4)
    assert signal.group_signal(np.array([0.0, 0.5, 1.0]), 4).tolist() == [0.0, 1 - 2 * 0.5 ** 4, 0.0]
    # optimistic: an interval holding 0.5 gives the peak; an all-fail posterior stays low
    opt = signal.optimistic_signal(np.array([2.0, 1.0]), np.array([2.0, 40.0]), 8, 0.9)
    assert opt[0] == pytest.approx(1 - 2 * 0.5 ** 8) and opt[1] < 0.6
    q = signal.beta_quantile(np.array([3.0]), np.array([5.0]), 0.9)[0]
    assert 3 / 8 < q < 0.7


def test_signal_score_exploitation_prefers_mixed_tasks_over_uniform_ones():
    tasks, envs = _pool(2, 3)
    g = _ring_graph(tasks, envs)
    s = EnvSchedSampler(tasks, g, SchedulerConfig(mode="exploitation_only", batch_size=2, **ADAPTIVE,
                                                  exploitation_score="signal_probability"), require_dispatch=False)
    s.update("e0t0", [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    s.update("e0t1", [0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    s.update("e1t0", [0.0] * 8)
    s.update("e1t1", [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    assert sorted(t["id"] for t in s.sample(2)) == ["e0t1", "e1t1"]
    rec = {r["task_id"]: r for r in s.explanations()}
    assert all(0.8 < r["base_score"] <= 1.0 for r in rec.values())
    ad = rec["e0t1"]["adaptive"]
    assert ad["signal_alpha"] + ad["signal_beta"] == pytest.approx(4.0 + 8)  # prior ess + 8 scored rollouts
    assert ad["exploitation_score"] == pytest.approx(rec["e0t1"]["base_score"])
    assert ad["caps_active"] is False and ad["coverage_score"] is not None
    paper = EnvSchedSampler(tasks, g, SchedulerConfig.paper(mode="exploitation_only", batch_size=2),
                            require_dispatch=False)
    paper.update("e0t1", [0.0, 1.0])
    paper.sample(2)
    assert all(r["adaptive"] is None for r in paper.explanations())


def test_default_exploitation_ranks_by_the_predicted_variance():
    tasks, envs = _pool(2, 3)
    g = _ring_graph(tasks, envs)
    s = EnvSchedSampler(tasks, g, SchedulerConfig(mode="exploitation_only", batch_size=2), require_dispatch=False)
    for t, r in (("e0t0", [1.0] * 8), ("e0t1", [0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]), ("e1t0", [0.0] * 8),
                 ("e1t1", [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])):
        s.update(t, r)
    info = s.predict().informativeness
    assert sorted(t["id"] for t in s.sample(2)) == ["e0t1", "e1t1"]  # the mixed groups: highest predicted variance
    rec = {r["task_id"]: r for r in s.explanations()}
    for tid, r in rec.items():
        assert r["base_score"] == pytest.approx(info[s.position_of(tid)], rel=1e-5)  # a variance, not a probability
        assert r["adaptive"]["exploitation_score"] is None and r["adaptive"]["caps_active"] is False


# ---------------------------------------------------------------------------------------------- adaptive share


def _share_run(coverage_signal: bool, steps: int = 8):
    g = synthetic_graph(160, 8, seed=3)
    tasks = synthetic_tasks(g)
    s = EnvSchedSampler(tasks, g, SchedulerConfig(coverage_share=0.75, batch_size=16, **ADAPTIVE), seed=1)
    rng = np.random.default_rng(7)
    slots = []
    for _ in range(steps):
        batch = s.sample(16)
        slots.append(s.last_phases().count("coverage"))
        for t, ph in zip(batch, s.last_phases(), strict=True):
            mixed = (ph == "coverage") == coverage_signal
            s.update(t, [0.0, 1.0] * 4 if mixed else [float(rng.random() < 0.5)] * 8)
    return s.metrics(), slots


def test_adaptive_share_moves_toward_the_phase_whose_picks_yield_signal():
    m_cov, slots_cov = _share_run(coverage_signal=True)
    m_exp, slots_exp = _share_run(coverage_signal=False)
    assert m_cov["adaptive_coverage_yield"] > 0.8 and m_cov["adaptive_exploitation_yield"] < 0.2
    assert m_cov["adaptive_share"] == 0.75  # up to the cap
    assert slots_cov[-1] == 12 and slots_cov[-1] > slots_cov[1]
    # toward the floor (0.0625): coverage's Beta(1, 1) prior over its few recent groups keeps it a bit above
    assert m_exp["adaptive_share"] < 0.1 and m_exp["adaptive_exploitation_yield"] > 0.8
    assert slots_exp[-1] == 1 and slots_exp[-1] < slots_exp[1]


def test_never_selected_environments_raise_the_coverage_slots_and_come_first():
    tasks, envs = _pool(6, 4)
    s = EnvSchedSampler(tasks, _ring_graph(tasks, envs), SchedulerConfig(batch_size=4), seed=0)
    rng = np.random.default_rng(0)
    first = s.sample(4)  # cold start: one representative of 4 of the 6 environments
    for t in first:
        s.update(t, _binary(rng, 0.5))
    unseen = {f"env{e}" for e in range(6)} - {t["env"] for t in first}
    assert len(unseen) == 2
    batch = s.sample(4)
    cov = [t["env"] for t, ph in zip(batch, s.last_phases(), strict=True) if ph == "coverage"]
    assert set(cov) == unseen  # 2 slots (round(0.5 * 4)) although the yields alone would allow fewer


def test_caps_apply_only_on_decline_in_the_adaptive_mode():
    tasks, envs = _pool(2, 6)
    star = "e0t0"

    def streak(cfg, flip_at=None):
        s = EnvSchedSampler(tasks, _ring_graph(tasks, envs), cfg, seed=0)
        picked = []
        for step in range(10):
            batch = s.sample(3)
            picked.append(star in [t["id"] for t in batch])
            for t in batch:
                mixed = t["id"] == star and (flip_at is None or step < flip_at)
                s.update(t, [0.0, 1.0] * 2 if mixed else [1.0] * 4)
        return picked

    base = {"mode": "exploitation_only", "batch_size": 3, "use_progress_filter": False}
    assert all(streak(SchedulerConfig(**base))[1:])  # always mixed: re-picked every batch
    paper = streak(SchedulerConfig(**base, caps_on_decline_only=False))
    assert not any(all(paper[i:i + 3]) for i in range(len(paper) - 2))  # C_task = 2 always
    declined = streak(SchedulerConfig(**base), flip_at=3)
    assert not any(all(declined[i:i + 3]) for i in range(3, len(declined) - 2))


# ---------------------------------------------------------------------------------------------- state, registry


@pytest.mark.parametrize("rule", ["mean", "thompson", "upper_quantile"])
def test_adaptive_state_round_trips_and_resumes_the_same_draws(rule):
    g = synthetic_graph(200, 10, seed=6)
    tasks = synthetic_tasks(g)
    cfg = SchedulerConfig(exploitation_rule=rule, batch_size=16, exploitation_score="signal_probability",
                          **ADAPTIVE)
    p = np.random.default_rng(2).random(200)

    def run(s, steps, start):
        out = []
        for k in range(start, start + steps):
            batch = s.sample(16)
            out.append([t["id"] for t in batch])
            for t in batch:
                r = np.random.default_rng(k * 1000 + int(t["id"][1:]))
                s.update(t, (r.random(8) < p[int(t["id"][1:])]).astype(float).tolist())
        return out

    s = EnvSchedSampler(tasks, g, cfg, seed=4)
    run(s, 4, 0)
    state = json.loads(json.dumps(s.state_dict()))
    r = EnvSchedSampler(tasks, g, cfg, seed=99)
    r.load_state_dict(state)
    assert r.metrics()["adaptive_share"] == s.metrics()["adaptive_share"]
    assert not math.isnan(s.metrics()["adaptive_share"])
    assert run(r, 3, 4) == run(s, 3, 4)


def test_registry_builds_both_presets_through_one_factory():
    assert "envsched" in available_samplers() and "envsched-paper" in available_samplers()
    g = synthetic_graph(60, 4, seed=0)
    tasks = synthetic_tasks(g)
    a = make_sampler("envsched", tasks, seed=1, group_size=4, graph=g)
    p = make_sampler("envsched-paper", tasks, seed=1, group_size=4, graph=g)
    assert a.config == SchedulerConfig(rollouts_per_task=4) and not a.config.is_paper
    assert p.config == SchedulerConfig.paper(rollouts_per_task=4) and p.config.is_paper
    abl = make_sampler("envsched-paper", tasks, graph=g, mode="coverage_only", use_cross_edges=False)
    assert abl.config.is_paper and abl.config.mode == "coverage_only" and not abl.config.use_cross_edges
    abl_a = make_sampler("envsched", tasks, graph=g, mode="exploitation_only")
    assert not abl_a.config.is_paper and abl_a.config.coverage_slots_for(16) == 0
    assert ", paper, " in repr(p) and ", default, " in repr(a) and ", custom, " in repr(abl_a)


def test_tuning_space_names_real_fields_and_holds_the_defaults():
    fields = SchedulerConfig().to_dict()
    default = SchedulerConfig()
    for name, space in ADAPTIVE_TUNING_SPACE.items():
        assert name in fields
        value = getattr(default, name)
        if isinstance(space, tuple):
            assert space[0] <= value <= space[1], name
            for end in space:  # both ends are valid configurations
                assert getattr(SchedulerConfig(**{**ADAPTIVE, name: end}), name) == end
        else:
            assert value in space, name
    assert SchedulerConfig(coverage_share=0.125, coverage_share_floor=0.125,
                           adaptive_share=True).coverage_slots_for(64) == 8
