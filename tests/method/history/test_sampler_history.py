"""EnvSched stages 1-2: observation statistics, centering, histories, propagation and calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import rankdata

from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import graph_from_arrays
from envsched.method.history.prediction import percentile_ranks, propagate, quantile_map, relation_operator
from envsched.method.history.statistics import observation_statistics
from envsched.method.sampler import EnvSchedSampler


def _pool(n_envs: int, per_env: int) -> tuple[list[dict], list[str]]:
    tasks = [{"id": f"e{e}t{j}", "env": f"env{e}"} for e in range(n_envs) for j in range(per_env)]
    return tasks, [t["env"] for t in tasks]


def _sampler(tasks, envs, within, cross, config=None, **kw) -> EnvSchedSampler:
    """A paper-preset sampler (these tests pin the paper's rules) over a hand-made graph."""
    g = graph_from_arrays([t["id"] for t in tasks], envs, within, cross)
    return EnvSchedSampler(tasks, g, config=config or SchedulerConfig.paper(), require_dispatch=False, **kw)


def _var_rewards(v: float, mean: float = 0.5) -> list[float]:
    """Two rewards with population variance ``v`` around ``mean``."""
    x = math.sqrt(v)
    return [mean - x, mean + x]


def test_observation_statistics_and_dispersion_reconstructs_variance():
    m, v, d = observation_statistics(np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]))
    assert (m, v) == (0.375, pytest.approx(0.234375))
    assert d == pytest.approx(1.0)  # binary rewards reach the largest variance for their mean
    m, v, d = observation_statistics(np.array([0.25, 0.75]))
    assert d == pytest.approx(v / (m * (1 - m)))
    assert d * m * (1 - m) == pytest.approx(v)
    assert observation_statistics(np.array([])) is None
    assert observation_statistics(np.array([1.0, 1.0]))[2] == 0.0


def test_none_rewards_never_enter_estimates():
    tasks, envs = _pool(2, 2)
    s = _sampler(tasks, envs, [[1], [0], [3], [2]], [[2], [3], [0], [1]])
    s.update("e0t0", [None, None, None])
    assert s.predict() is None  # nothing scored: still no reference, still cold start
    assert s.metrics()["unscored_episodes"] == 3
    assert s.history.task_observation_counts()[0] == 1  # but the group counts as an observation
    s.update("e0t1", [1.0, None, 0.0, None])
    obs = s.history.obs
    assert obs.col("n_scored").tolist() == [0, 2]
    assert obs.col("m")[1] == 0.5 and obs.col("v")[1] == 0.25  # None is not a zero
    pred = s.predict()
    assert pred.reference.tolist() == [0.5, 0.25, 1.0]


def test_reward_scale_is_mapped_to_unit_interval():
    tasks, envs = _pool(1, 2)
    g = graph_from_arrays([t["id"] for t in tasks], envs, [[1], [0]], [[], []])
    s = EnvSchedSampler(tasks, g, reward_range=(0.0, 10.0), require_dispatch=False)
    s.update("e0t0", [0.0, 10.0])
    assert s.history.obs.col("v")[0] == 0.25 and s.history.obs.col("raw_var")[0] == 25.0
    assert s.metrics()["batch_reward_variance"] == 25.0  # metrics stay on the declared scale


def test_reference_initialised_by_first_observed_batch_then_step_level():
    tasks, envs = _pool(2, 4)
    s = _sampler(tasks, envs, [[]] * 8, [[]] * 8, SchedulerConfig.paper(batch_size=4, reference_min_fraction=1.0))
    b0 = s.sample(4)
    s.update(b0[0], [0.0, 0.0, 0.0, 1.0])  # 1 of 4 groups of step 0: no step-level reference yet
    assert s.history.global_reference()[0] == 0.25
    b1 = s.sample(4)
    s.update(b1[0], [1.0, 1.0, 1.0, 0.0])  # 1 of step 1's 2 coverage groups: the first batch stays the reference
    assert s.history.global_reference()[0] == 0.25
    assert s.last_phases() == ["coverage", "coverage", "exploitation", "exploitation"]
    s.update(b1[1], [1.0, 1.0, 1.0, 1.0])  # both coverage groups of step 1: it has its own reference
    assert s.history.global_reference()[0] == pytest.approx((0.75 + 1.0) / 2)
    s.update(b1[2], [0.0, 0.0, 0.0, 0.0])  # exploitation groups are selected for variance: not in the reference
    assert s.history.global_reference()[0] == pytest.approx((0.75 + 1.0) / 2)


def test_a_step_of_one_task_has_no_reference_in_the_default():
    # sample(1)'s one group is exploitation's or, where the coverage debt gives the draw its slot, coverage's. Made its
    # step's reference, it would be centred on itself (its own history exactly the reference, whatever its rewards) and
    # move the global reference with every group; in the default such a step has no reference, its group is not
    # shifted
    tasks, envs = _pool(2, 4)
    within = [[j for j in range(e * 4, e * 4 + 4) if j != i] for e in range(2) for i in range(e * 4, e * 4 + 4)]
    cross = [[(i + 4) % 8] for i in range(8)]
    for config, degenerate in ((SchedulerConfig(), False), (SchedulerConfig.paper(), True)):
        s = _sampler(tasks, envs, within, cross, config)
        first = s.sample(2)  # cold start: the reference of step 0
        for t in first:
            s.update(t, [0.0, 1.0, 1.0, 1.0])
        ref0 = s.history.global_reference().copy()
        assert ref0[0] == 0.75
        phases = []
        for _ in range(2):
            (task,) = s.sample(1)
            phases += s.last_phases()
            s.update(task, [0.0, 0.0, 0.0, 0.0])  # an all-fail group of a step of one task
            ref = s.history.global_reference()
            own = s.history.task_history(config.long_half_life, ref).values[s.position_of(task)]
            if degenerate:  # the paper preset keeps its rule: the group is its step's reference, and centred onto it
                assert ref.tolist() == [0.0, 0.0, 0.0]
                assert own.tolist() == ref.tolist()
            else:
                assert ref.tolist() == ref0.tolist()  # the reference stays step 0's
                assert own.tolist() == [0.0, 0.0, 0.0]  # the group as observed
        assert phases == ["coverage", "exploitation"]  # the coverage debt: share 0.5, then 0.4 or 0.5


def test_a_step_whose_reference_would_rest_on_one_group_has_none_in_the_default():
    # sample(2) at share 0.5: one coverage and one exploitation group. Exploitation groups never make the default's
    # reference, so the coverage group alone would be its step's reference and centred onto it exactly
    tasks, envs = _pool(2, 4)
    within = [[j for j in range(e * 4, e * 4 + 4) if j != i] for e in range(2) for i in range(e * 4, e * 4 + 4)]
    cross = [[(i + 4) % 8] for i in range(8)]
    for config, degenerate in ((SchedulerConfig(adaptive_share=False), False), (SchedulerConfig.paper(), True)):
        s = _sampler(tasks, envs, within, cross, config)
        for t in s.sample(2):  # cold start: two groups, the reference of step 0
            s.update(t, [0.0, 1.0, 1.0, 1.0])
        ref0 = s.history.global_reference().copy()
        batch = s.sample(2)
        assert s.last_phases() == ["coverage", "exploitation"]
        for t, phase in zip(batch, s.last_phases(), strict=True):
            s.update(t, [0.0, 0.0, 0.0, 0.0] if phase == "coverage" else [1.0, 1.0, 1.0, 1.0])
        ref = s.history.global_reference()
        if degenerate:  # the paper preset's rule: the step's groups (here both: a paper step uses them all) decide
            assert ref.tolist() != ref0.tolist()
        else:
            assert ref.tolist() == ref0.tolist()  # the coverage group alone makes no reference
            cov = s.position_of(batch[0])
            own = s.history.task_history(config.long_half_life, ref).values[cov]
            assert own.tolist() == [0.0, 0.0, 0.0]  # the group as observed, not centred onto itself
        # with two observed groups that can make it, a step of the default has its reference again: their mean
        if not degenerate:
            more = s.sample(4)
            phases = s.last_phases()
            for t, phase in zip(more, phases, strict=True):
                s.update(t, [0.0, 0.0, 1.0, 1.0] if phase == "coverage" else [1.0, 1.0, 1.0, 1.0])
            means = [0.5 if p == "coverage" else 1.0 for p in phases if p != "exploitation"]
            assert len(means) >= 2 and s.history.global_reference()[0] == pytest.approx(np.mean(means))


def test_centering_shifts_old_observations_to_the_current_level_and_clips():
    tasks, envs = _pool(1, 4)
    s = _sampler(tasks, envs, [[]] * 4, [[]] * 4, SchedulerConfig.paper(reference_min_fraction=1.0))
    b0 = s.sample(2)
    for t in b0:
        s.update(t, [0.0, 0.0, 0.0, 1.0])  # step 0: mean 0.25
    b1 = s.sample(2)
    for t in b1:
        s.update(t, [1.0, 1.0, 1.0, 0.0])  # step 1: mean 0.75
    ref = s.history.global_reference()
    assert ref[0] == 0.75
    _pos, step, vals = s.history.centered_observations(ref)
    old = step == 0
    assert np.allclose(vals[old, 0], 0.75)  # 0.25 observed when the level was 0.25 -> today's 0.75
    assert np.allclose(vals[~old, 0], 0.75)
    # clipping: a big upward shift of a variance stays within [0, 0.25]
    s2 = _sampler(tasks, envs, [[]] * 4, [[]] * 4, SchedulerConfig.paper(reference_min_fraction=1.0))
    s2.update("e0t0", _var_rewards(0.24))
    s2.update("e0t1", [1.0, 1.0])
    ref2 = s2.history.global_reference()
    _, _, v2 = s2.history.centered_observations(ref2 + np.array([0.0, 0.2, 0.0]))
    assert v2[:, 1].max() <= 0.25 and v2[:, 1].min() >= 0.0


def test_half_life_weights_recent_observations_more():
    tasks, envs = _pool(1, 2)
    s = _sampler(tasks, envs, [[1], [0]], [[], []],
                 SchedulerConfig.paper(long_half_life=4.0, short_half_life=1.0, reference_min_fraction=1.0))
    s.update("e0t0", [0.0, 0.0])  # no dispatch yet: dated step 0
    for _ in range(2):
        s.sample(2)  # steps 0 and 1 both dispatch both tasks
    s.discard("e0t0")  # drops the oldest dispatch (step 0)
    s.update("e0t0", [1.0, 1.0])  # matched to the step-1 dispatch
    ref = s.history.global_reference()
    long = s.history.task_history(4.0, ref)
    short = s.history.task_history(1.0, ref)
    assert long.groups[0] == 2
    assert long.weight[0] == pytest.approx(1 + 0.5 ** (1 / 4))
    assert short.weight[0] == pytest.approx(1.5)
    assert short.values[0, 0] > long.values[0, 0]  # the short half-life trusts the recent (higher) mean more
    assert long.weight[1] == 0 and np.allclose(long.values[1], ref)  # no history -> the reference


def _fusion_setup(config: SchedulerConfig):
    # task 0 (target, env0): within neighbour 1 (env0), cross neighbour 2 (env1); 3 is unrelated (env1)
    tasks = [{"id": f"t{i}", "env": e} for i, e in enumerate(["env0", "env0", "env1", "env1"])]
    envs = [t["env"] for t in tasks]
    s = _sampler(tasks, envs, [[1], [0], [3], [2]], [[2], [3], [0], [1]], config)
    s.update("t1", _var_rewards(0.05))
    s.update("t2", _var_rewards(0.02))
    return s, s.predict()


def test_equal_weight_fusion_as_in_case_study_f1_and_edge_ablations():
    _s, pred = _fusion_setup(SchedulerConfig.paper())
    hl = pred.long
    assert hl.within[0, 1] == pytest.approx(0.05) and hl.cross[0, 1] == pytest.approx(0.02)
    assert hl.prior[0, 1] == pytest.approx(0.035)  # F.1: 0.05 within, 0.02 cross -> 0.04 (rounded)
    assert hl.posterior[0, 1] == pytest.approx(0.035)  # no own history
    # task 3's only neighbours (within 2, cross 1) are observed too; task 0 has both relations
    _, p_nw = _fusion_setup(SchedulerConfig.paper(use_within_edges=False))
    assert p_nw.long.prior[0, 1] == pytest.approx(0.02)
    _, p_nc = _fusion_setup(SchedulerConfig.paper(use_cross_edges=False))
    assert p_nc.long.prior[0, 1] == pytest.approx(0.05)
    _, p_none = _fusion_setup(SchedulerConfig.paper(use_within_edges=False, use_cross_edges=False))
    assert np.allclose(p_none.long.prior, p_none.reference)


def test_unobserved_neighbours_count_with_the_reference():
    # task 0 has neighbours 1 (weight 0.6), 2 (0.3), 3 (0.1); only 1 and 3 have history
    index = np.array([[1, 2, 3], [0, -1, -1], [0, -1, -1], [0, -1, -1]])
    weight = np.array([[0.6, 0.3, 0.1], [1.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0]])
    op = relation_operator(index, weight, 4)
    values = np.array([[0.5, 0.0, 0.0], [0.4, 0.20, 0.8], [9.0, 9.0, 9.0], [0.6, 0.10, 0.5]])
    ref = np.array([0.3, 0.05, 0.4])
    est, has = propagate(values, np.array([False, True, False, True]), op, ref)
    # B.1: a neighbour without history counts with the reference (task 2's own values are never read)
    assert est[0] == pytest.approx(0.6 * values[1] + 0.3 * ref + 0.1 * values[3])
    assert est[0, 1] == pytest.approx(0.6 * 0.20 + 0.3 * 0.05 + 0.1 * 0.10)  # 0.145, not 0.19 (observed only)
    assert has.tolist() == [True, False, False, False]  # 1, 2, 3: their only neighbour (0) has no history
    assert np.allclose(est[2], ref) and np.allclose(est[3], ref)
    assert np.allclose(est[1], ref)


def test_no_observed_neighbour_uses_global_reference_and_own_history_fuses():
    tasks, envs = _pool(2, 3)
    # e0t0's within neighbour e0t1 and cross neighbour e1t1 stay unobserved
    within = [[1], [0], [0], [4], [3], [3]]
    cross = [[4], [3], [5], [0], [1], [2]]
    s = _sampler(tasks, envs, within, cross, SchedulerConfig.paper(prior_strength=1.0))
    s.update("e0t2", _var_rewards(0.16))
    s.update("e1t2", _var_rewards(0.04))
    pred = s.predict()
    ref = pred.reference
    assert not pred.long.within_has[0] and not pred.long.cross_has[0]
    assert np.allclose(pred.long.within[0], ref) and np.allclose(pred.long.cross[0], ref)
    # e0t2 has its own history (W = 1): posterior = (prior + own) / 2
    hl = pred.long
    i = 2
    assert hl.history.weight[i] == 1.0
    assert np.allclose(hl.posterior[i], (hl.prior[i] + hl.history.values[i]) / 2)


def test_calibration_ranks_average_ties_and_quantile_mapping():
    x = np.array([0.1, 0.3, 0.3, 0.0])
    assert percentile_ranks(x).tolist() == [0.5, 0.875, 0.875, 0.25]
    assert np.array_equal(percentile_ranks(x), rankdata(x, method="average") / 4)
    rng = np.random.default_rng(0)
    v, q = rng.random(501), rng.random(300)
    assert np.allclose(quantile_map(v, q), np.quantile(v, q, method="linear"), rtol=0, atol=1e-15)
    tasks, envs = _pool(3, 3)
    within = [[1, 2], [0, 2], [0, 1], [4, 5], [3, 5], [3, 4], [7, 8], [6, 8], [6, 7]]
    cross = [[3], [4], [5], [6], [7], [8], [0], [1], [2]]
    s = _sampler(tasks, envs, within, cross)
    for i, v0 in [(0, 0.2), (4, 0.01), (8, 0.1)]:
        s.update(tasks[i]["id"], _var_rewards(v0, 0.5 - 0.1 * (i % 2)))
    pred = s.predict()
    for hl in (pred.long, pred.short):
        q = 0.5 * percentile_ranks(hl.v_direct) + 0.5 * percentile_ranks(hl.v_reconstructed)
        assert np.allclose(hl.q, q)
        assert np.allclose(hl.score, np.quantile(hl.v_direct, q, method="linear"))
        assert np.allclose(hl.v_reconstructed, hl.posterior[:, 2] * hl.posterior[:, 0] * (1 - hl.posterior[:, 0]))
    assert np.allclose(pred.q, rankdata(pred.informativeness) / 9)


def test_recent_decline_lowers_priority():
    tasks, envs = _pool(2, 2)
    cfg = SchedulerConfig.paper(long_half_life=8.0, short_half_life=1.0)

    def run(config):
        s = _sampler(tasks, envs, [[1], [0], [3], [2]], [[2], [3], [0], [1]], config)
        for step in range(6):
            # the drawn task depends on the penalty: release it, so that both runs hold identical observations
            # (dated by this step, phase "external") and differ only in the priority formula
            s.discard(s.sample(1)[0])
            s.update("e0t0", _var_rewards(0.24 if step < 4 else 0.0))  # informative, then solved
            s.update("e1t0", _var_rewards(0.02 + 0.03 * step))  # rising
        return s.predict()

    with_penalty = run(cfg)
    without = run(SchedulerConfig.paper(long_half_life=8.0, short_half_life=1.0, decline_penalty=0.0))
    assert with_penalty.decline[0] > 0  # short-term score below long-term: a recent decline
    assert with_penalty.informativeness[0] < without.informativeness[0]
    assert with_penalty.decline[2] == 0  # rising task: no decline, no penalty
    assert with_penalty.informativeness[2] == pytest.approx(without.informativeness[2])


def test_predict_is_none_before_history_and_config_validation():
    tasks, envs = _pool(1, 2)
    s = _sampler(tasks, envs, [[1], [0]], [[], []])
    assert s.predict() is None
    with pytest.raises(ValueError, match="max_per_env_coverage"):
        SchedulerConfig.paper(max_per_env_coverage=0)
    with pytest.raises(ValueError, match="mode"):
        SchedulerConfig.paper(mode="greedy")
    with pytest.raises(ValueError, match="variance_clip"):
        SchedulerConfig.paper(variance_clip=(0.0, 0.5))
    with pytest.raises(ValueError, match="unknown SchedulerConfig"):
        SchedulerConfig.from_dict({"nope": 1})
    c = SchedulerConfig.paper()
    assert SchedulerConfig.from_dict(c.to_dict()) == c
    assert (c.batch_size, c.coverage_share, c.max_per_env_coverage, c.env_quota_per_batch,
            c.max_consecutive_selections) == (64, 0.5, 4, 11, 2)
    assert c.coverage_slots_for(64) == 32 and c.is_paper and not SchedulerConfig().is_paper
