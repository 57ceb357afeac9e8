"""Scheduling policies: each preset hands the batch builder complete inputs (the paper's values where a rule of
the default is off), a typed trace for explanations, metrics and state, and the builder follows whatever a
policy supplies."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.history import signal
from envsched.method.sampler import EnvSchedSampler
from envsched.method.scheduling.batch import SchedulingContext, build_batch
from envsched.method.scheduling.policy import (
    AdaptivePolicy,
    BatchInputs,
    PaperPolicy,
    PolicyTrace,
    make_policy,
)

#: the former default's online share and UCB coverage order (the default now takes the paper's): the tests of
#: those rules name them
_ADAPTIVE = {"adaptive_share": True, "adaptive_coverage": True}


def _warm(config: SchedulerConfig, steps: int = 3) -> EnvSchedSampler:
    g = synthetic_graph(160, 8, seed=2)
    s = EnvSchedSampler(synthetic_tasks(g), g, config, seed=1)
    rng = np.random.default_rng(0)
    p = rng.beta(0.6, 0.6, size=160)
    for _ in range(steps):
        for t in s.sample(16):
            s.update(t, (rng.random(8) < p[s.position_of(t)]).astype(float).tolist())
    return s


def _inputs(s: EnvSchedSampler, n: int = 16) -> tuple[BatchInputs, PolicyTrace]:
    prediction = s.predict()
    assert prediction is not None
    return s.policy.inputs(n, s.history, prediction, np.zeros(len(s.tasks)), np.random.default_rng(0))


@pytest.mark.parametrize("config, kind", [
    (SchedulerConfig.paper(), PaperPolicy), (SchedulerConfig.paper(mode="coverage_only"), PaperPolicy),
    (SchedulerConfig(), AdaptivePolicy), (SchedulerConfig(adaptive_coverage=False), AdaptivePolicy),
    (SchedulerConfig(exploitation_score="variance", adaptive_coverage=False, adaptive_share=False,
                     caps_on_decline_only=True), AdaptivePolicy),
])
def test_the_config_chooses_the_policy(config, kind):
    assert isinstance(make_policy(config, np.array([0, 0, 1]), 2), kind)
    assert type(EnvSchedSampler([{"id": "a", "env": "x"}, {"id": "b", "env": "y"}], None, config).policy) is kind


def test_the_paper_policy_supplies_the_papers_rules_and_traces_nothing():
    s = _warm(SchedulerConfig.paper())
    inputs, trace = _inputs(s, 16)
    info = s.predict().informativeness
    assert inputs.coverage_slots == 8 and inputs.coverage_fewest_observed_first
    assert np.array_equal(inputs.env_order, s.history.env_selection_counts()) and inputs.env_order.sum() == 48
    assert np.array_equal(inputs.coverage_score, info) and np.array_equal(inputs.exploitation_score, info)
    assert inputs.caps_active.dtype == bool and inputs.caps_active.all()
    assert trace.explain([0, 1]) is None and trace.summary() == {}
    assert all(math.isnan(v) for v in trace.metrics().values()) and len(trace.metrics()) == 3
    assert all(r["adaptive"] is None for r in s.explanations())


def test_the_adaptive_policy_supplies_the_defaults_rules():
    s = _warm(SchedulerConfig(**_ADAPTIVE))
    inputs, trace = _inputs(s, 16)
    info = s.predict().informativeness
    assert not inputs.coverage_fewest_observed_first
    assert inputs.coverage_score is trace.coverage_score and not np.array_equal(inputs.coverage_score, info)
    # exploitation: the paper's calibrated informativeness, untouched (the trace records no score of its own)
    assert np.array_equal(inputs.exploitation_score, info) and trace.exploitation_score is None
    # the former default's signal-probability score, where it is switched on, is a probability
    signal_inputs, signal_trace = _inputs(_warm(SchedulerConfig(exploitation_score="signal_probability")), 16)
    assert signal_inputs.exploitation_score is signal_trace.exploitation_score
    assert np.all((signal_inputs.exploitation_score >= 0) & (signal_inputs.exploitation_score <= 1 + 1e-9))
    assert inputs.caps_active is trace.caps_active and not inputs.caps_active.all()  # caps only on decline
    # the UCB order: every environment was selected, so no -inf; higher priority is a smaller key
    assert np.isfinite(inputs.env_order).all() and (inputs.env_order < 0).all()
    assert trace.coverage_slots == inputs.coverage_slots and 1 <= inputs.coverage_slots <= 8
    assert 0.0625 <= trace.share <= 0.5 and 0 < trace.coverage_yield < 1 and 0 < trace.exploitation_yield < 1
    assert list(trace.summary()) == ["share", "coverage_yield", "exploitation_yield", "coverage_slots"]
    assert trace.metrics()["adaptive_share"] == trace.share
    batch, per_pos = trace.explain([3, 7])
    assert batch == trace.summary() and set(per_pos) == {3, 7}
    assert per_pos[3]["signal_alpha"] == float(trace.signal_alpha[3]) and isinstance(per_pos[3]["caps_active"], bool)


@pytest.mark.parametrize("switch", ["adaptive_coverage", "exploitation_score", "caps_on_decline_only",
                                    "adaptive_share"])
def test_a_rule_switched_off_gets_the_papers_part(switch):
    off = {"adaptive_coverage": False, "exploitation_score": "variance", "caps_on_decline_only": False,
           "adaptive_share": False}
    s = _warm(SchedulerConfig(**{**_ADAPTIVE, switch: off[switch]}))
    inputs, trace = _inputs(s, 16)
    info = s.predict().informativeness
    paper, _ = PaperPolicy(s.config).inputs(16, s.history, s.predict(), np.zeros(160), np.random.default_rng(0))
    if switch == "adaptive_coverage":
        assert trace.coverage_score is None and inputs.coverage_fewest_observed_first
        assert np.array_equal(inputs.env_order, paper.env_order) and np.array_equal(inputs.coverage_score, info)
    elif switch == "exploitation_score":
        assert trace.exploitation_score is None and np.array_equal(inputs.exploitation_score, info)
    elif switch == "caps_on_decline_only":
        assert trace.caps_active is None and inputs.caps_active.all()
    else:
        assert trace.share is None and inputs.coverage_slots == paper.coverage_slots == 8
        assert trace.summary() == {"coverage_slots": 8.0}


def test_the_trace_summary_is_the_state_format_and_survives_a_round_trip():
    s = _warm(SchedulerConfig(**_ADAPTIVE))
    state = s.state_dict()
    assert state["extra"]["last_adaptive"] == s._last_trace.summary() and "share" in state["extra"]["last_adaptive"]
    t = PolicyTrace.from_summary(state["extra"]["last_adaptive"])
    assert t.summary() == state["extra"]["last_adaptive"] and t.explain([0]) is None
    fresh = EnvSchedSampler(s.tasks, s.graph, s.config, seed=1)
    fresh.load_state_dict(state)
    assert fresh.metrics()["adaptive_share"] == s.metrics()["adaptive_share"] == t.share
    assert fresh.state_dict()["extra"]["last_adaptive"] == state["extra"]["last_adaptive"]


def test_the_builder_follows_the_policys_inputs_and_refuses_none_after_cold_start():
    """A policy of one's own: coverage starts from the environment the policy puts first, fills with the
    policy's coverage score, and exploitation takes the policy's score; no preset is consulted."""
    s = _warm(SchedulerConfig.paper())
    inputs, _ = _inputs(s, 8)
    env = s.env_codes
    order = np.zeros(len(s.envs))
    order[5] = -1.0  # environment 5 first
    favourite = np.zeros(160)
    favourite[np.flatnonzero(env == 5)[-1]] = 1.0
    exploit = np.zeros(160)
    exploit[[0, 17, 34]] = [0.5, 0.9, 0.7]  # three environments; the penalty (<= 0.2) keeps the order
    mine = dataclasses.replace(inputs, coverage_slots=1, env_order=order, coverage_score=favourite,
                               coverage_fewest_observed_first=False, exploitation_score=exploit,
                               caps_active=np.zeros(160, dtype=bool))
    config = dataclasses.replace(s.config, use_progress_filter=False)
    ctx = SchedulingContext(graph=s.graph, history=s.history, prediction=s.predict(), config=config,
                            env_codes=env, num_envs=len(s.envs), tiebreak=np.linspace(0, 1, 160),
                            env_tiebreak=np.zeros(len(s.envs)), identifier_flagged=np.zeros(160, dtype=bool),
                            centrality=np.zeros(160), similarity=s._similarity, inputs=mine)
    picks = build_batch(ctx, 4)
    assert [p.phase for p in picks] == ["coverage", "exploitation", "exploitation", "exploitation"]
    assert picks[0].pos == int(np.flatnonzero(env == 5)[-1])
    assert [p.pos for p in picks[1:]] == [17, 34, 0] and [p.exposure_discount for p in picks[1:]] == [1.0] * 3
    with pytest.raises(ValueError, match="needs the policy's inputs"):
        build_batch(dataclasses.replace(ctx, inputs=None), 4)


def test_the_adaptive_coverage_score_is_computed_only_where_read_and_equals_the_whole_array():
    """The default's coverage score is a LazyScores: a read computes only the tasks asked about, elementwise, so
    every value equals the whole array's (the former eager computation) bit for bit."""
    from envsched.method.history import signal
    from envsched.method.scheduling.policy import LazyScores

    g = synthetic_graph(160, 40, seed=2)  # 40 environments: a batch of 4 reads a small share (4 * 8 <= 40)
    s = EnvSchedSampler(synthetic_tasks(g), g, SchedulerConfig(batch_size=4, **_ADAPTIVE), seed=1)
    rng = np.random.default_rng(0)
    for _ in range(6):
        for t in s.sample(4):
            s.update(t, (rng.random(8) < 0.5).astype(float).tolist())
    prediction = s.predict()
    tiebreak = np.random.default_rng(3).random(len(s.tasks))
    inputs, trace = s.policy.inputs(4, s.history, prediction, tiebreak, np.random.default_rng(0))
    lazy = inputs.coverage_score
    assert isinstance(lazy, LazyScores) and lazy.computed() == 0 and lazy.size == len(s.tasks)
    assert lazy is trace.coverage_score
    c, g = s.config, s.config.rollouts_per_task
    a, b = trace.signal_alpha, trace.signal_beta
    eager = (signal.optimistic_signal(a, b, g, c.ucb_quantile) + 1e-3 * signal.mixed_probability(a, b, g)
             + 1e-12 * tiebreak)
    some = np.array([5, 3, 5, 100])
    assert np.array_equal(lazy[some], eager[some]) and lazy.computed() == 3
    assert lazy[7] == eager[7] and lazy[-1] == eager[-1] and lazy.computed() == 5
    assert np.array_equal(lazy[np.array([-2, 7])], eager[[-2, 7]]) and lazy.computed() == 6
    assert np.array_equal(lazy[10:20], eager[10:20]) and lazy.computed() == 16  # 16 * 8 < 160: still lazy
    assert np.array_equal(lazy[np.array([30, 31, 32, 33, 34])], eager[30:35])  # reaches N / 8: all of them
    assert lazy.computed() == len(s.tasks) and np.array_equal(np.asarray(lazy), eager)
    assert np.array_equal(lazy[np.arange(160) % 2 == 0], eager[::2])
    # an array read before anything was computed
    fresh = s.policy.inputs(4, s.history, prediction, tiebreak, np.random.default_rng(0))[0].coverage_score
    assert np.array_equal(np.asarray(fresh), eager)
    # a batch whose environments are a large share of the pool gets the whole array at once, the same values
    whole = s.policy.inputs(8, s.history, prediction, tiebreak, np.random.default_rng(0))[0].coverage_score
    assert isinstance(whole, np.ndarray) and np.array_equal(whole, eager)
    # the batch builder draws the same batch from either
    ctx = dict(graph=s.graph, history=s.history, prediction=prediction, config=s.config, env_codes=s.env_codes,
               num_envs=len(s.envs), tiebreak=tiebreak, env_tiebreak=np.zeros(len(s.envs)),
               identifier_flagged=np.zeros(160, dtype=bool), centrality=s._centrality, similarity=s._similarity)
    fresh = s.policy.inputs(4, s.history, prediction, tiebreak, np.random.default_rng(0))[0]
    picks = [build_batch(SchedulingContext(**ctx, inputs=dataclasses.replace(fresh, coverage_score=score)), 4)
             for score in (fresh.coverage_score, eager)]
    assert [p.pos for p in picks[0]] == [p.pos for p in picks[1]] and picks[0][0].phase == "coverage"


def test_coverage_scores_kept_between_calls_are_the_scores_of_now():
    """AdaptivePolicy.coverage_score of many positions keeps each task's score before its tiebreak term with the
    posterior it is of: a later call gives the scores computed anew, bit for bit, where a posterior moved in
    either parameter as where it did not."""
    n = 600
    kept = AdaptivePolicy(SchedulerConfig(), np.arange(n) % 12, 12)
    kept.coverage_keep_min = 16
    rng = np.random.default_rng(5)
    alpha, beta = rng.uniform(0.2, 6.0, n), rng.uniform(0.2, 6.0, n)
    for step in range(5):
        some = np.sort(rng.choice(n, 300, replace=False))
        tiebreak = rng.random(some.size)
        mixed = signal.mixed_probability(alpha[some], beta[some], 8) if step % 2 else None
        got = kept.coverage_score(alpha[some], beta[some], mixed, tiebreak, some)
        assert np.array_equal(got, kept.coverage_score(alpha[some], beta[some], mixed, tiebreak))
        alpha[rng.choice(n, 40, replace=False)] += 0.5  # one parameter moves for some tasks, the other for others
        beta[rng.choice(n, 40, replace=False)] *= 1.5
    assert np.isfinite(kept._coverage_kept[0]).sum() > 300  # (kept, and read back)
