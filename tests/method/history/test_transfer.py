"""Prediction for every task (the default's graph prior): on a constructed pool, a task without history of its own
is predicted from its neighbours along both relations, a neighbour without history counts with its environment's
estimate, and a task's own history takes over from the prior as its groups accumulate."""

from __future__ import annotations

import numpy as np
import pytest

from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import graph_from_arrays
from envsched.method.sampler import EnvSchedSampler

# environment A: a0..a3, environment B: b0..b2 (positions 0-3 and 4-6)
IDS = ["a0", "a1", "a2", "a3", "b0", "b1", "b2"]
ENVS = ["A"] * 4 + ["B"] * 3
WITHIN = [[1, 2], [0, 2], [0, 1], [0, 1], [5, 6], [4, 6], [4, 5]]
CROSS = [[4], [5], [6], [4], [0], [1], [2]]
MIXED = [1.0, 0.0] * 4  # m 0.5, v 0.25, d 1
MOSTLY = [1.0] * 7 + [0.0]  # m 0.875, v 0.109375, d 1
PASS, FAIL = [1.0] * 8, [0.0] * 8  # v 0, d 0


def _stats(r: list[float]) -> np.ndarray:
    x = np.asarray(r)
    m, v = x.mean(), x.var()
    return np.array([m, v, v / (m * (1 - m)) if 0 < m < 1 else 0.0])


def _sampler(config: SchedulerConfig, observed: dict[str, list[list[float]]]) -> EnvSchedSampler:
    tasks = [{"id": i, "env": e} for i, e in zip(IDS, ENVS, strict=True)]
    s = EnvSchedSampler(tasks, graph_from_arrays(IDS, ENVS, WITHIN, CROSS), config, seed=0, require_dispatch=False)
    for task, groups in observed.items():
        for rewards in groups:
            s.update(task, rewards)  # without a dispatch: every group dated step 0, weight 1
    return s


OBSERVED = {"a1": [MIXED], "a2": [MOSTLY], "b1": [PASS], "b2": [FAIL]}


def test_an_unseen_task_is_predicted_from_its_neighbours_along_both_relations():
    s = _sampler(SchedulerConfig(), OBSERVED)
    pred = s.predict()
    long = pred.long
    a1, a2, b1, b2 = (_stats(OBSERVED[t][0]) for t in ("a1", "a2", "b1", "b2"))
    r = np.mean([a1, a2, b1, b2], axis=0)  # the reference: every group of step 0
    np.testing.assert_allclose(pred.reference, r)
    env_a_without = {0: (a1 + a2 + r) / 3, 3: (a1 + a2 + r) / 3}  # a3 (resp. a0) unobserved counts with r
    env_b_without_b0 = (b1 + b2) / 2
    # a0: both within neighbours observed; its cross neighbour b0 has no history: b0's environment estimate
    np.testing.assert_allclose(long.within[0], (a1 + a2) / 2)
    np.testing.assert_allclose(long.cross[0], env_b_without_b0)
    # a3: within neighbours a0 (no history: the estimate of A without a3) and a1
    np.testing.assert_allclose(long.within[3], 0.5 * env_a_without[3] + 0.5 * a1)
    # b0: within b1, b2; cross neighbour a0 has no history: A's estimate without a0
    np.testing.assert_allclose(long.within[4], (b1 + b2) / 2)
    np.testing.assert_allclose(long.cross[4], env_a_without[0])
    for i in (0, 3, 4):  # no own history: the prediction is the equal-weight fusion of the two relations
        np.testing.assert_allclose(long.posterior[i], 0.5 * long.within[i] + 0.5 * long.cross[i])
        assert long.history.weight[i] == 0
    # the unseen task next to mixed groups is predicted more informative than the one next to all-pass/all-fail
    assert pred.informativeness[0] > pred.informativeness[4] + 0.01
    assert len(set(np.round(pred.informativeness[[0, 3, 4]], 12))) == 3  # not one constant for the unseen
    # the former default (no graph prior) predicted every unseen task at the reference
    flat = _sampler(SchedulerConfig(use_within_edges=False, use_cross_edges=False), OBSERVED).predict()
    assert flat.informativeness[0] == flat.informativeness[3] == flat.informativeness[4]


def test_the_paper_counts_a_neighbour_without_history_with_the_global_reference():
    pred = _sampler(SchedulerConfig.paper(), OBSERVED).predict()
    np.testing.assert_allclose(pred.long.cross[0], pred.reference)  # b0 unobserved
    np.testing.assert_allclose(pred.long.within[3], 0.5 * pred.reference + 0.5 * _stats(MIXED))
    assert pred.long.relations.environment is None


def test_a_task_without_observed_neighbours_gets_its_environment_and_then_the_reference():
    s = _sampler(SchedulerConfig(), {"a1": [MIXED]})
    pred = s.predict()
    r = pred.reference
    np.testing.assert_allclose(r, _stats(MIXED))
    # b-tasks: no observed task in B and their cross neighbours' A-estimates: A without a0 is (a1 + 2 r) / 3 = r
    np.testing.assert_allclose(pred.long.posterior[4:], np.broadcast_to(r, (3, 3)))
    # with a second environment observed, B's unobserved tasks move to B's observed level
    s = _sampler(SchedulerConfig(), {"a1": [MIXED], "b1": [PASS]})
    pred = s.predict()
    r, b1 = pred.reference, _stats(PASS)
    np.testing.assert_allclose(pred.long.relations.environment[6], (b1 + r) / 2)  # b2: b0 unobserved, b1
    assert pred.informativeness[6] < pred.informativeness[2]  # next to an all-pass task vs next to a mixed one


@pytest.mark.parametrize("own", [PASS, MIXED])
def test_a_tasks_own_history_takes_over_from_the_prior(own):
    """a0 starts at its neighbours' prediction; each own group (weight 1) moves it by ``W / (W + prior_strength)``
    towards its own history, so after a few groups its own outcome decides."""
    config = SchedulerConfig()
    prior_v, got = None, []
    for k in range(6):
        pred = _sampler(config, {**OBSERVED, "a0": [own] * k}).predict()
        long = pred.long
        w = long.history.weight[0]
        assert w == k
        expected = (config.prior_strength * long.prior[0] + w * long.history.values[0]) / (config.prior_strength + w)
        np.testing.assert_allclose(long.posterior[0], expected)
        if k == 0:
            prior_v = long.posterior[0, 1]
        got.append(long.posterior[0, 1])
    own_v = _stats(own)[1]
    gaps = np.abs(np.array(got) - own_v)
    assert np.all(np.diff(gaps) < 0)  # closer to its own history with every group
    assert gaps[-1] < 0.1 * abs(prior_v - own_v)
    assert abs(got[1] - own_v) == pytest.approx(abs(prior_v - own_v) / 3, rel=0.35)  # one group: 2/3 of the way
