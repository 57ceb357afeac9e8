"""DPS and SEC pinned on small constructed cases: hand-computed filter posteriors and TD(0) values, the
selection rules, and the protocol's edge cases (None rewards, late updates, discards, strict state loading,
atomic sampling, durable resume, registration)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envsched.pool import TaskPool
from envsched.samplers.dps import DPSSampler
from envsched.samplers.registry import available_samplers, make_sampler
from envsched.samplers.sec import GRPO_EPSILON, SECSampler


def _pool(n: int = 8, envs: int = 2) -> TaskPool:
    return TaskPool([{"id": f"t{i}", "env": f"e{i % envs}", "difficulty": i % 3} for i in range(n)])


def _state(s: Any) -> str:
    return json.dumps(s.state_dict(), sort_keys=True)


# ---------------------------------------------------------------------------------------------------- DPS
def test_dps_filter_posterior_by_hand_over_two_observations_and_a_prediction_step():
    s = DPSSampler(_pool(3), seed=0, candidate_ratio=1.0, transition_decay=0.5, require_dispatch=False)
    # step 0: t0 observed partially solved (2 of 4). Joint posterior of (previous = uniform, now = partial):
    # row "partial" of outer(e2, 1/3) * P0 (P0 = 1/3 everywhere) normalised = 1/3 each, so
    # alpha = 1 + 1/3 on row "partial"; every column is [1, 4/3, 1] / (10/3): prior = P @ e2 = [.3, .4, .3]
    s.update("t0", [1.0, 0.0, 1.0, 0.0])
    assert s.state_probabilities()["t0"] == pytest.approx({"unsolved": 0.3, "partial": 0.4, "solved": 0.3})
    np.testing.assert_allclose(s.transition_matrix("t0")[:, 0], [0.3, 0.4, 0.3])
    s.sample(1)  # ends step 0 (t0 was observed in it: no propagation)
    assert s.partial_probability()[0] == pytest.approx(0.4)
    s.sample(1)  # ends step 1, in which t0 was not observed: counts decay, belief predicted one step
    # alpha = 0.5 * alpha + 0.5 * 1 = 1 + 1/6 on row "partial"; columns [1, 7/6, 1] / (19/6)
    # previous = [.3, .4, .3]; prior = P @ previous = [6, 7, 6] / 19 (all columns are equal)
    assert s.state_probabilities()["t0"] == pytest.approx({"unsolved": 6 / 19, "partial": 7 / 19, "solved": 6 / 19})
    # step 2: t0 observed solved. Joint of (previous, now = solved) = previous * P[solved, :] normalised
    # = [.3, .4, .3]; alpha = 0.5 * alpha + 0.5 * 1 + joint: row "partial" 1 + 1/12, row "solved" 1 + joint
    # prior = column "solved" of alpha normalised = [1, 13/12, 1.3] / (203/60) = [60, 65, 78] / 203
    s.update("t0", [1.0, 1.0, 1.0, 1.0])
    assert s.state_probabilities()["t0"] == pytest.approx(
        {"unsolved": 60 / 203, "partial": 65 / 203, "solved": 78 / 203})
    p = s.transition_matrix("t0")
    np.testing.assert_allclose(p.sum(axis=0), 1.0)
    np.testing.assert_allclose(p[:, 1], np.array([1.0, 13 / 12, 1.4]) / (3 + 1 / 12 + 0.4))  # from "partial"


def test_dps_filters_a_solved_prompt_and_prefers_a_partially_solved_one():
    s = DPSSampler(_pool(8), seed=1, candidate_ratio=8.0)
    batch = s.sample(8)
    assert {t["id"] for t in batch} == {f"t{i}" for i in range(8)}
    for t in batch:
        if t["id"] == "t0":
            s.update(t, [1.0] * 8)  # all pass: solved
        elif t["id"] == "t1":
            s.update(t, [1.0, 0.0] * 4)  # partially solved
        else:
            s.discard(t)  # dropped: no observation
    p = s.partial_probability()
    assert p[1] == pytest.approx(0.4) and p[0] == pytest.approx(0.3)
    assert p[1] > 1 / 3 > p[0] and np.allclose(p[2:], 1 / 3)
    (first,) = s.sample(1)
    assert first["id"] == "t1"  # the partially solved prompt goes first
    s.update(first, [0.0, 1.0] * 4)
    rest = s.sample(7)
    assert "t0" not in {t["id"] for t in rest}  # the solved prompt is the one left out of 7 of 8
    # it stays solved (fed directly): its predicted partial probability keeps falling, below an unseen prompt's
    s.require_dispatch = False
    history = [s.partial_probability()[0]]
    for _ in range(3):
        s.update("t0", [1.0] * 8)
        history.append(s.partial_probability()[0])
    assert all(b < a for a, b in itertools.pairwise(history)) and history[-1] < 0.3


def test_dps_graded_rewards_and_reward_range():
    s = DPSSampler(TaskPool([{"id": "a", "env": "e"}, {"id": "b", "env": "e"}, {"id": "c", "env": "e"}],
                            reward_range=(0.0, 10.0)), seed=0, require_dispatch=False)
    s.update("a", [10.0, 10.0])  # the top of the range: solved
    s.update("b", [5.0, 5.0])  # all half: partially solved (no signal, but neither 0 nor 1)
    s.update("c", [0.0, 0.0])  # the bottom: unsolved
    probs = s.state_probabilities()
    assert max(probs["a"], key=probs["a"].get) == "solved"
    assert max(probs["b"], key=probs["b"].get) == "partial"
    assert max(probs["c"], key=probs["c"].get) == "unsolved"


def test_dps_none_rewards_are_no_observation_and_late_updates_count():
    s = DPSSampler(_pool(6), seed=2, candidate_ratio=1.0)
    first = s.sample(2)
    second = s.sample(2)  # the first batch is still outstanding
    before = _state(s)
    s.update(first[0], [None, None])  # unscored: counted, nothing learned
    after = json.loads(_state(s))
    assert after["extra"] == json.loads(before)["extra"] and s.unscored_episodes == 2
    s.update(first[1], [None, 1.0, None, 0.0])  # late, one of each: partially solved from the scored two
    assert s.partial_probability()[s.position_of(first[1])] == pytest.approx(0.4)
    for t in second:
        s.discard(t)
    assert s.outstanding_groups == 0 and s.metrics()["discarded_groups"] == 2


def test_dps_named_priors_and_impossible_moves():
    s = DPSSampler(_pool(3), seed=0, transition_prior="local", require_dispatch=False)
    np.testing.assert_allclose(s.transition_matrix("t0")[:, 0], [0.5, 0.5, 0.0])  # unsolved never jumps to solved
    s.update("t0", [0.0, 0.0])  # unsolved
    s.update("t0", [1.0, 1.0])  # solved right after: impossible under "local" (the code would divide by 0)
    assert np.isfinite(s.alpha).all() and np.isfinite(s.prior).all()
    assert s.prior[0].sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="transition_prior"):
        DPSSampler(_pool(3), transition_prior="nope")
    with pytest.raises(ValueError, match="transition_prior"):
        DPSSampler(_pool(3), transition_prior=[[1.0, 1.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="candidate_ratio"):
        DPSSampler(_pool(3), candidate_ratio=0.5)
    with pytest.raises(ValueError, match="transition_decay"):
        DPSSampler(_pool(3), transition_decay=float("nan"))


def test_dps_candidates_follow_the_epoch_stream():
    s = DPSSampler(_pool(10), seed=4, candidate_ratio=2.0)
    # 2 candidates a draw from a random order of the 10 tasks: 5 draws cover the pool once, then a new order
    seen = [t["id"] for _ in range(5) for t in s.sample(1)]
    assert len(set(seen)) == 5
    assert s.metrics()["dps_tracked_fraction"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------------- SEC
def _abs_adv_mean(rewards: list[float]) -> float:
    """By hand: mean |r - mean| / (Bessel std + 1e-6)."""
    m = sum(rewards) / len(rewards)
    sd = math.sqrt(sum((r - m) ** 2 for r in rewards) / (len(rewards) - 1))
    return sum(abs(r - m) for r in rewards) / len(rewards) / (sd + 1e-6)


@pytest.mark.parametrize("zero_fill", [False, True])
def test_sec_td0_values_by_hand(zero_fill):
    pool = TaskPool([{"id": f"{e}{i}", "env": e} for e in "ab" for i in range(4)])
    s = SECSampler(pool, seed=0, learning_rate=0.5, temperature=1.0, zero_fill_unplayed=zero_fill,
                   require_dispatch=False)
    assert s.values() == {"a": 0.0, "b": 0.0}
    s.sample(2)  # step 1 starts
    s.update("a0", [1.0, 0.0, 0.0, 0.0])  # mean |A| = 0.375 / (0.5 + 1e-6)
    s.update("b0", [1.0, 1.0, 0.0, 0.0])  # mean |A| = 0.5 / (sqrt(1/3) + 1e-6)
    s.update("b1", [1.0, None, None])  # one scored rollout: no advantage, nothing added
    r_a, r_b = 0.375 / (0.5 + 1e-6), 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert r_a == pytest.approx(_abs_adv_mean([1.0, 0.0, 0.0, 0.0]))
    assert s.values() == {"a": 0.0, "b": 0.0}  # the step has not ended
    s.sample(2)  # ends step 1: Q <- Q + 0.5 (r - Q)
    q = s.values()
    assert q["a"] == pytest.approx(0.5 * r_a, rel=1e-12) and q["b"] == pytest.approx(0.5 * r_b, rel=1e-12)
    assert q["b"] > q["a"]  # toward the category with the larger mean absolute advantage
    # Boltzmann: softmax(Q / T)
    pa = math.exp(q["a"]) / (math.exp(q["a"]) + math.exp(q["b"]))
    assert s.probabilities() == pytest.approx({"a": pa, "b": 1 - pa}, rel=1e-12)
    # step 2: only "a" is played, with two groups (the category's reward is the mean over its rollouts)
    s.update("a1", [1.0, 1.0, 0.0, 0.0])
    s.update("a2", [1.0, 0.0, 0.0, 0.0])
    s.sample(1)
    r2 = (4 * r_b + 4 * r_a) / 8
    assert s.values()["a"] == pytest.approx(0.5 * r_a + 0.5 * (r2 - 0.5 * r_a), rel=1e-12)
    # "b" was not played: unchanged, or decayed toward 0 as the published code does
    assert s.values()["b"] == pytest.approx(0.25 * r_b if zero_fill else 0.5 * r_b, rel=1e-12)


def test_sec_default_decays_unplayed_arms_as_the_code_does():
    """The authors' ``BanditPriority.update`` gives every arm absent from the step's batch a reward of 0; with
    51 environments and 64 groups a step about 14 arms are unplayed each step, so the rule matters."""
    pool = TaskPool([{"id": f"{e}{i}", "env": e} for e in "abc" for i in range(3)])
    runs = {}
    for name in ("sec", "sec-played-arms"):
        s = make_sampler(name, pool, seed=0)
        s.sample(1)
        state = s.state_dict()
        state["extra"]["q"] = [0.8, 0.4, 0.2]
        s.load_state_dict(state)
        s.require_dispatch = False
        s.update("a0", [1.0, 0.0])  # only "a" is played in this step: mean |A| = 0.5 / (sqrt(0.5) + 1e-6)
        s.sample(1)
        runs[name] = s.values()
    r = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert runs["sec"] == pytest.approx({"a": 0.4 + 0.5 * r, "b": 0.2, "c": 0.1}, rel=1e-12)
    assert runs["sec-played-arms"] == pytest.approx({"a": 0.4 + 0.5 * r, "b": 0.4, "c": 0.2}, rel=1e-12)
    assert SECSampler(pool).zero_fill_unplayed is True


def test_sec_a_step_without_a_scored_group_updates_nothing():
    """The code updates once per trained batch; a step whose groups were all dropped or unscored trained on
    nothing, so no value decays."""
    pool = TaskPool([{"id": f"{e}{i}", "env": e} for e in "ab" for i in range(3)])
    s = SECSampler(pool, seed=0, zero_fill_unplayed=True)
    for t in s.sample(2):
        s.update(t, [1.0, 0.0])
    batch = s.sample(2)  # values updated from the first step
    before = s.values()
    assert max(before.values()) > 0
    s.discard(batch[0])
    s.update(batch[1], [None, 1.0])  # one scored rollout: no advantage
    s.sample(1)
    assert s.values() == before


def test_sec_advantage_matches_grpo_with_bessel_std_and_its_epsilon():
    assert GRPO_EPSILON == 1e-6
    assert _abs_adv_mean([1.0, 1.0, 0.0, 0.0]) == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-6))


def test_sec_boltzmann_draw_frequencies_follow_softmax():
    pool = TaskPool([{"id": f"{e}{i}", "env": e} for e in "xyz" for i in range(400)])
    s = SECSampler(pool, seed=5, temperature=0.5)
    state = s.state_dict()
    state["extra"]["q"] = [0.0, 0.4, 0.8]
    s.load_state_dict(state)
    expected = np.exp(np.array([0.0, 0.4, 0.8]) / 0.5)
    expected /= expected.sum()
    assert list(s.probabilities().values()) == pytest.approx(expected.tolist(), rel=1e-12)
    counts = {"x": 0, "y": 0, "z": 0}
    for _ in range(60):
        for t in s.sample(20):  # no group reported: the values stay where they were set
            counts[s.category_of(t)] += 1
            s.discard(t)
    freq = np.array(list(counts.values())) / 1200
    np.testing.assert_allclose(freq, expected, atol=0.04)


def test_sec_tasks_within_a_category_are_drawn_once_per_pass():
    s = SECSampler(TaskPool([{"id": f"a{i}", "env": "a"} for i in range(3)]), seed=2)
    first_pass = [s.sample(1)[0]["id"] for _ in range(3)]
    assert sorted(first_pass) == ["a0", "a1", "a2"]  # every task once before any again
    assert s.sample(3)  # a full batch of the pool starts another pass and stays distinct


def test_sec_batch_stays_distinct_when_a_favoured_category_runs_out():
    pool = TaskPool([{"id": "solo", "env": "s"}] + [{"id": f"m{i}", "env": "m"} for i in range(6)])
    s = SECSampler(pool, seed=0, temperature=0.01)
    state = s.state_dict()
    state["extra"]["q"] = [1.0, 0.0]  # "s" is drawn for nearly every slot, but it has one task
    s.load_state_dict(state)
    batch = [t["id"] for t in s.sample(4)]
    assert len(set(batch)) == 4 and "solo" in batch


def test_sec_category_can_be_another_field():
    s = SECSampler(_pool(9, envs=3), category="difficulty")
    assert sorted(s.categories) == ["0", "1", "2"]
    assert s.category_of("t4") == "1"
    with pytest.raises(ValueError, match="temperature"):
        SECSampler(_pool(3), temperature=0.0)
    with pytest.raises(ValueError, match="learning_rate"):
        SECSampler(_pool(3), learning_rate=1.5)


def test_sec_late_updates_join_the_current_step_and_discards_add_nothing():
    s = SECSampler(_pool(8), seed=1)
    first = s.sample(2)
    second = s.sample(2)
    s.update(first[0], [1.0, 0.0])  # late: it belongs to the step under way
    s.discard(first[1])
    assert s.state_dict()["extra"]["pending_count"] == [2, 0] or s.state_dict()["extra"]["pending_count"] == [0, 2]
    for t in second:
        s.discard(t)
    s.sample(1)
    assert max(s.values().values()) > 0 and min(s.values().values()) == 0.0


# ---------------------------------------------------------------------------------------------------- shared
class _FailingRng:
    """Delegates to a generator but fails in ``method`` after it has drawn (to test atomic sampling)."""

    def __init__(self, rng: np.random.Generator, method: str) -> None:
        self._rng, self._method = rng, method

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._rng, name)
        if name != self._method:
            return attr

        def failing(*args: Any, **kwargs: Any) -> Any:
            attr(*args, **kwargs)
            raise RuntimeError("interrupted")

        return failing


@pytest.mark.parametrize(("cls", "method"), [(DPSSampler, "permutation"), (SECSampler, "integers")])
def test_sample_is_atomic_on_error(cls, method):
    s = cls(_pool(8), seed=3, require_dispatch=False)
    s.sample(2)
    s.update("t0", [1.0, 0.0])
    s.update("t1", [1.0, 1.0])
    if cls is DPSSampler:
        s._cursor = len(s.tasks)  # force a fresh candidate order, drawn with permutation()
    before = _state(s)
    s._rng = _FailingRng(s._rng, method)
    with pytest.raises(RuntimeError, match="interrupted"):
        s.sample(3)
    assert _state(s) == before


def _bad_values(cls: type) -> list[tuple[str, Any, str]]:
    if cls is DPSSampler:
        return [("alpha", "nan", "extra.alpha[0][0][0] must be a finite number in [0.0, "),
                ("alpha", "inf", "extra.alpha[0][0][0] must be a finite number"),
                ("alpha", "none", "extra.alpha[0][0][0] must be a finite number"),
                ("alpha", "neg", "extra.alpha[0][0][0] must be a finite number"),
                ("prior", "nan", "extra.prior[0][0] must be a finite number in [0.0, 1.0], got nan"),
                ("prior", "big", "extra.prior[0][0] must be a finite number in [0.0, 1.0], got 1.5"),
                ("prior", "sum", "extra.prior holds a belief that does not sum to 1"),
                ("tracked", "num", "extra.tracked[0] must be true or false, got 1"),
                ("observations", "neg", "extra.observations[0] must be a whole number in [0, "),
                ("order", "dup", "extra.order is not a permutation"), ("cursor", "big", "extra.cursor must be a whole"),
                ("steps", "none", "extra.steps must be a whole number"),
                ("steps", "bool", "extra.steps must be a whole number in [0, 9007199254740992], got True"),
                ("prior", "short", "extra.prior must have 8 entries, got 7"),
                ("alpha", "missing", "extra.alpha is missing")]
    return [("q", "nan", "extra.q[0] must be a finite number in [0.0, "), ("q", "inf", "extra.q[0] must be a finite"),
            ("q", "none", "extra.q[0] must be a finite number"), ("q", "neg", "extra.q[0] must be a finite number"),
            ("q", "huge", "extra.q[0] must be a finite number"),
            ("pending_sum", "nan", "extra.pending_sum[0] must be a finite number in [0.0, inf), got nan"),
            ("pending_count", "neg", "extra.pending_count[0] must be a whole number in [0, "),
            ("pending_sum", "orphan", "extra.pending_sum exceeds"),
            ("used", "num", "extra.used[0] must be true or false"),
            ("categories", "other", "extra.categories are not this sampler's"),
            ("steps", "neg", "extra.steps must be a whole number"), ("q", "missing", "extra.q is missing")]


def _corrupt(extra: dict[str, Any], field: str, how: str) -> None:
    v = extra[field]
    flat = v
    while isinstance(flat, list) and flat and isinstance(flat[0], list):
        flat = flat[0]
    if how == "missing":
        del extra[field]
    elif how in ("nan", "inf", "none", "neg", "big", "huge", "num"):
        new = {"nan": float("nan"), "inf": float("inf"), "none": None, "neg": -1, "big": 1.5, "huge": 1e9,
               "num": 1}[how]
        if isinstance(flat, list):
            flat[0] = new
        else:
            extra[field] = {"big": 10**6, "neg": -1, "none": None}.get(how, new)
    elif how == "bool":
        extra[field] = True
    elif how == "sum":
        flat[0], flat[1], flat[2] = 0.5, 0.5, 0.5
    elif how == "dup":
        v[0] = v[1]
    elif how == "short":
        extra[field] = v[:-1]
    elif how == "orphan":
        extra["pending_count"] = [0] * len(extra["pending_count"])
        extra["pending_sum"] = [1.0] * len(extra["pending_sum"])
    elif how == "other":
        extra[field] = list(reversed(v))


@pytest.mark.parametrize("cls", [DPSSampler, SECSampler])
def test_state_loader_refuses_bad_values_and_changes_nothing(cls):
    src = cls(_pool(8), seed=1)
    for t in src.sample(4):
        src.update(t, [1.0, 0.0, 1.0])
    src.sample(2)
    good = json.loads(json.dumps(src.state_dict()))
    for field, how, fragment in _bad_values(cls):
        target = cls(_pool(8), seed=9)
        target.sample(1)
        before = _state(target)
        bad = json.loads(json.dumps(good))
        _corrupt(bad["extra"], field, how)
        with pytest.raises(ValueError, match=f"malformed {cls.__name__} state") as info:
            target.load_state_dict(bad)
        assert fragment in str(info.value), (field, how, str(info.value))
        assert _state(target) == before, (field, how)
    target = cls(_pool(8), seed=9)
    target.load_state_dict(good)
    assert _state(target) == _state(src) and target.sample(2) == src.sample(2)


@pytest.mark.parametrize("name", ["dps", "sec"])
def test_registered_everywhere(name, tmp_path: Path):
    from envsched.cli.run import SAMPLER_NAMES
    from envsched.store import DurableSampler
    from envsched_lab.runner import DEFAULT_SAMPLERS, make_bench_sampler
    from envsched_lab.runner import available_samplers as bench_samplers
    from envsched_lab.tuning import tuning_space

    pool = _pool(12, envs=3)
    assert name in available_samplers() and name in SAMPLER_NAMES
    assert name in DEFAULT_SAMPLERS and name in bench_samplers()
    assert tuning_space(name)
    s = make_sampler(name, pool, seed=4)
    assert type(s) is type(make_bench_sampler(name, pool, seed=4))
    # durable: a store written by this sampler resumes from the store alone
    durable = DurableSampler(make_sampler(name, pool, seed=4), tmp_path / "h.sqlite", group_size=4)
    reference = make_sampler(name, pool, seed=4)
    rng = np.random.default_rng(0)
    for _ in range(4):
        batch = durable.sample(3)
        assert [t["id"] for t in reference.sample(3)] == [t["id"] for t in batch]
        for t in batch:
            rewards = rng.integers(0, 2, size=4).astype(float).tolist()
            durable.update(t, rewards)
            reference.update(t, rewards)
    durable.close()
    resumed = DurableSampler.resume(tmp_path / "h.sqlite")
    assert type(resumed.sampler) is type(reference)
    assert _state(resumed.sampler) == _state(reference)
    assert resumed.sample(3) == reference.sample(3)
