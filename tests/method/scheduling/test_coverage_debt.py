"""The coverage debt: a draw too small to hold a coverage slot (``round(share * n) = 0``, every ``sample(1)``)
carries its unrounded share across draws, so that an asynchronous trainer drawing one group at a time gets the
coverage share a batch of 64 gets; batches that round to a slot draw as before; the debt is part of the state."""

from __future__ import annotations

import json

import numpy as np
import pytest

from envsched.errors import StateError
from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.sampler import EnvSchedSampler
from envsched.method.scheduling.policy import DEBT_BOUND, settle_coverage_debt

N, ENVS, GROUP = 600, 12, 8


@pytest.fixture(scope="module")
def pool():
    g = synthetic_graph(N, ENVS, seed=21)
    return synthetic_tasks(g), g, np.random.default_rng(3).beta(0.6, 0.6, size=N)


def _sampler(pool, config: SchedulerConfig | None = None) -> EnvSchedSampler:
    tasks, g, _ = pool
    return EnvSchedSampler(tasks, g, config or SchedulerConfig(), seed=5)


def _draw(s: EnvSchedSampler, n: int, rng: np.random.Generator, p: np.ndarray) -> list[str]:
    """``sample(n)`` and the updates of its groups; returns the phases."""
    batch = s.sample(n)
    phases = s.last_phases()
    for t in batch:
        s.update(t, [float(x) for x in rng.random(GROUP) < p[s.position_of(t)]])
    return phases


def _warm(s: EnvSchedSampler, rng: np.random.Generator, p: np.ndarray, steps: int = 4) -> None:
    for _ in range(steps):
        _draw(s, 64, rng, p)


def _batch_share(s: EnvSchedSampler, n: int = 64) -> float:
    """The coverage share a ``sample(n)`` would get now: its policy's coverage slots over ``n`` (nothing drawn)."""
    tiebreak = np.zeros(len(s.tasks))
    inputs, _ = s.policy.inputs(n, s.history, s.predict(), tiebreak, np.random.default_rng(0))
    return inputs.coverage_slots / n


def test_the_rule_carries_the_unrounded_share_of_draws_without_a_slot():
    assert settle_coverage_debt(3, 0.4, 8, 0.3) == (3, 0.3)  # a slot of its own: the debt stays
    assert settle_coverage_debt(0, 0.0, 1, 0.3) == (0, 0.3)  # no share, nothing owed
    assert settle_coverage_debt(0, 0.3, 1, 0.1) == (0, pytest.approx(0.4))
    assert settle_coverage_debt(0, 0.3, 1, 0.4) == (1, pytest.approx(-0.3))  # 0.7 reaches 0.5: a slot, less 1
    assert settle_coverage_debt(0, 0.5, 1, 0.0) == (1, -0.5)  # round(0.5) = 0, but 0.5 reaches the slot
    rng = np.random.default_rng(0)
    for n in (1, 2, 3):
        debt, slots, owed = 0.0, 0, 0.0
        for share in rng.uniform(0.0, 0.5 / n, size=2000):  # every draw rounds to no slot
            assert round(share * n) == 0
            got, debt = settle_coverage_debt(0, share, n, debt)
            slots, owed = slots + got, owed + share * n
            assert -DEBT_BOUND <= debt < DEBT_BOUND
        assert abs(slots - owed) < 1.0  # the slots given are the share owed, to less than one


def test_sample1_gets_the_coverage_share_a_batch_of_64_gets(pool):
    # before the debt, sample(1) never had a coverage pick (round(share * 1) = 0 at any share up to 0.5)
    _, _, p = pool
    s = _sampler(pool)
    rng = np.random.default_rng(1)
    _warm(s, rng, p)
    assert (s.history.env_selection_counts() > 0).all()  # no never-selected bonus: the 64-batch is round(64 share)
    phases, batch_shares = [], []
    for _ in range(200):
        batch_shares.append(_batch_share(s))  # what a sample(64) would give coverage now
        phases += _draw(s, 1, rng, p)
    got = phases.count("coverage") / len(phases)
    want = float(np.mean(batch_shares))
    assert phases.count("coverage") > 0
    # round(64 share) / 64 is within 1/128 of the share, and the debt keeps the picks within one of the share owed
    # (1/200 of the draws)
    assert abs(got - want) <= 1 / 128 + 1 / 200, (got, want)
    assert 0.0625 <= want <= 0.5 and set(phases) == {"coverage", "exploitation"}


@pytest.mark.parametrize("preset", ["paper", "fixed"])
def test_a_fixed_share_is_the_share_of_sample1_and_sample2_draws(pool, preset):
    # the paper preset's 0.5 (sample(1): 0 slots rounded, so every other draw is coverage's), and the default (a
    # fixed share) at 0.2, where sample(2) rounds to no slot either
    _, _, p = pool
    config = SchedulerConfig.paper() if preset == "paper" else SchedulerConfig(coverage_share=0.2)
    share = config.coverage_share
    for n, draws in ((1, 200), (2, 100)):
        if round(share * n):
            continue  # (the paper's sample(2) has its own slot)
        s = _sampler(pool, config)
        rng = np.random.default_rng(2)
        _warm(s, rng, p, steps=2)
        phases = [ph for _ in range(draws) for ph in _draw(s, n, rng, p)]
        assert abs(phases.count("coverage") - share * n * draws) < 1.0, (n, phases.count("coverage"))
        assert _batch_share(s) == round(share * 64) / 64  # and a batch of 64, for comparison: its rounded share


def test_batches_that_round_to_a_slot_leave_the_debt_as_it_is(pool):
    _, _, p = pool
    s = _sampler(pool)
    rng = np.random.default_rng(4)
    for _ in range(6):
        _draw(s, 64, rng, p)
        assert s._coverage_debt == 0.0 and "coverage_debt" not in s.state_dict()["extra"]
    for _ in range(3):
        _draw(s, 1, rng, p)
    owed = s._coverage_debt
    assert owed != 0.0 and s.metrics()["coverage_debt"] == owed
    assert json.loads(json.dumps(s.state_dict()))["extra"]["coverage_debt"] == owed
    phases = _draw(s, 64, rng, p)
    assert s._coverage_debt == owed and phases.count("coverage") >= 4  # a batch of its own slots: debt unchanged


def _resumable(pool) -> tuple[EnvSchedSampler, dict]:
    """A sampler after a run of sample(1) with a debt owed, and its saved state."""
    _, _, p = pool
    s = _sampler(pool)
    rng = np.random.default_rng(6)
    _warm(s, rng, p, steps=3)
    for _ in range(7):
        _draw(s, 1, rng, p)
    assert s._coverage_debt != 0.0
    return s, json.loads(json.dumps(s.state_dict()))


def _next(s: EnvSchedSampler, p: np.ndarray, draws: int = 20) -> list[tuple[str, str]]:
    rng = np.random.default_rng(9)  # the same rewards for every sampler compared
    out = []
    for _ in range(draws):
        (t,) = s.sample(1)
        out.append((t["id"], s.last_phases()[0]))
        s.update(t, [float(x) for x in rng.random(GROUP) < p[s.position_of(t)]])
    return out


def test_a_resumed_sampler_owes_the_same_debt_and_draws_the_same(pool):
    _, _, p = pool
    s, state = _resumable(pool)
    resumed = _sampler(pool)
    resumed.load_state_dict(state)
    assert resumed._coverage_debt == s._coverage_debt
    want = _next(s, p)
    assert _next(resumed, p) == want
    assert {ph for _, ph in want} == {"coverage", "exploitation"}
    # without its debt (a state written before the debt existed loads with none) the same state draws otherwise:
    # the debt is what makes the resumed draws the same
    older = json.loads(json.dumps(state))
    del older["extra"]["coverage_debt"]
    forgot = _sampler(pool)
    forgot.load_state_dict(older)
    assert forgot._coverage_debt == 0.0
    assert _next(forgot, p) != want


@pytest.mark.parametrize("value", [0.5, -0.51, 7.0, float("nan"), float("inf"), "0.1", True, None, [0.1]])
def test_a_bad_debt_in_a_state_is_refused_by_name_and_changes_nothing(pool, value):
    s, state = _resumable(pool)
    before = json.dumps(s.state_dict(), sort_keys=True)
    bad = json.loads(json.dumps(state))
    bad["extra"]["coverage_debt"] = value
    with pytest.raises(StateError, match=r"extra\.coverage_debt must be a finite number in \[-0\.5, 0\.5\)"):
        s.load_state_dict(bad)
    assert json.dumps(s.state_dict(), sort_keys=True) == before  # nothing changed
    fresh = _sampler(pool)
    with pytest.raises(StateError, match="coverage_debt"):
        fresh.load_state_dict(bad)
    assert fresh.history.step == 0 and fresh._coverage_debt == 0.0
