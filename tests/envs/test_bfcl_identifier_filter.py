"""BFCL multi-turn's identifier filter: its logic with injected replays, and on real BFCL episodes through the
scheduler's interface."""

from __future__ import annotations

import importlib.util

import pytest

from envsched.envs.base import Trajectory
from envsched.envs.bfcl_identifier_filter import BfclIdentifierFilter, _is_known, call_identifiers, known_identifiers
from envsched.method.config import SchedulerConfig


def test_identifier_heuristics():
    assert call_identifiers("send_message(receiver_id='USR002', message='hi there')") == ["USR002"]
    assert call_identifiers("book(date='2026-12-15', cls='business', code='LAX', cost=120.5)") == []
    assert call_identifiers("fund_account(amount=10000)") == ["10000"]
    assert call_identifiers("f(card='card_3456', n=12)") == ["card_3456"]
    assert call_identifiers("not a call (") == []
    ev = known_identifiers("his passport starts with 'US', numbered 9148817941; fund $10,000", {"id": "card_3456"})
    assert _is_known("US9148817941", ev) and _is_known("10000", ev) and _is_known("card_3456", ev)
    assert not _is_known("USR002", ev)


class _Scripted:
    """A replayable toy environment: the reward is 1 iff every call in ``needed`` was made."""

    def __init__(self, needed: set[str]) -> None:
        self.needed = needed
        self.replays = 0

    def replay(self, task, calls_per_turn):
        self.replays += 1
        made = {c for turn in calls_per_turn for c in turn}
        return 1.0 if self.needed <= made else 0.0

    def execute(self, task, calls_per_turn):
        messages = [[{"role": "user", "content": task["instruction"]}]] + [[]] * (len(calls_per_turn) - 1)
        outputs = [["ok: id=acct_77" if "lookup" in c else "ok" for c in turn] for turn in calls_per_turn]
        return messages, outputs


def test_flags_only_when_removing_the_suspicious_action_lowers_the_reward():
    task = {"id": "t", "env": "bank", "instruction": "Pay the electricity bill.", "initial_state": {"user": "ann"}}
    guessed = "pay(account='acct_99')"
    env = _Scripted({guessed})
    f = BfclIdentifierFilter(replay=env.replay, execute=env.execute)
    v = f.check(task, Trajectory([[guessed]], 1.0))
    assert v.flagged and v.suspicious[0].identifiers == ["acct_99"] and v.suspicious[0].reward_without == 0.0
    assert "acct_99" in v.reason
    # the same identifier read from an earlier tool output is legitimate
    looked_up = ["lookup(user='ann')", "pay(account='acct_77')"]
    v = BfclIdentifierFilter(replay=_Scripted(set(looked_up)).replay, execute=env.execute).check(
        task, Trajectory([looked_up], 1.0))
    assert not v.flagged and v.suspicious == []
    # a suspicious action the reward does not depend on: not flagged
    env2 = _Scripted({"pay(account='acct_77')"})
    v = BfclIdentifierFilter(replay=env2.replay, execute=env.execute).check(
        task, Trajectory([["lookup(user='ann')", "pay(account='acct_77')", "note(ref='zz_123')"]], 1.0))
    assert not v.flagged and [s.identifiers for s in v.suspicious] == [["zz_123"]]
    # a low-reward trajectory is not examined
    env3 = _Scripted({"never"})
    v = BfclIdentifierFilter(replay=env3.replay, execute=env.execute).check(task, Trajectory([[guessed]], 1.0))
    assert not v.flagged and env3.replays == 1 and "below" in v.reason


@pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None,
                    reason="needs bfcl-eval: pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0")
def test_bfcl_ground_truth_with_an_unseen_receiver_id_is_flagged_and_leaves_exploitation():
    from envsched.envs.bfcl import build_bfcl_pool, ground_truth_calls
    from envsched.method.graph.synthetic import graph_from_arrays
    from envsched.method.sampler import EnvSchedSampler

    specs = {s["id"]: s for s in build_bfcl_pool(["multi_turn_base"])}
    f = BfclIdentifierFilter()
    # multi_turn_base_62: the ground truth messages 'USR002' although no user turn, initial state or earlier
    # output names it; without that call the checker fails the episode.
    task = specs["bfcl/multi_turn_base_62"]
    v = f.check(task, Trajectory(ground_truth_calls(task), 1.0))
    assert v.reward == 1.0 and v.flagged
    assert any(s.identifiers == ["USR002"] and s.reward_without == 0.0 for s in v.suspicious)
    # a task whose ground truth only uses what the agent saw
    clean = specs["bfcl/multi_turn_base_0"]
    v0 = f.check(clean, Trajectory(ground_truth_calls(clean), 1.0))
    assert v0.reward == 1.0 and not v0.flagged and v0.suspicious == []
    # through the sampler: the flagged task leaves exploitation
    tasks = [task, clean, specs["bfcl/multi_turn_base_1"]]
    g = graph_from_arrays([t["id"] for t in tasks], [t["env"] for t in tasks], [[], [], []], [[1], [0], [0]])
    s = EnvSchedSampler(tasks, g, config=SchedulerConfig.paper(mode="exploitation_only"), identifier_filter=f,
                        require_dispatch=False)
    s.update(task["id"], [0.0, 1.0])
    assert s.submit_trajectory(task["id"], Trajectory(ground_truth_calls(task), 1.0)).flagged
    assert task["id"] not in [t["id"] for t in s.sample(2)]
    assert "USR002" in s.identifier_flags()[task["id"]]


def test_a_real_bfcl_episode_yields_its_trajectory_and_the_sampler_flags_it():
    """The wiring: BFCLEnvironment.trajectory() of a finished episode goes straight to submit_trajectory."""
    from envsched.envs.bfcl import BFCLEnvironment, build_bfcl_pool, ground_truth_calls, replay_reward
    from envsched.method.graph.synthetic import graph_from_arrays
    from envsched.method.sampler import EnvSchedSampler

    specs = {s["id"]: s for s in build_bfcl_pool(["multi_turn_base"])}
    task, clean = specs["bfcl/multi_turn_base_62"], specs["bfcl/multi_turn_base_0"]
    tasks = [task, clean]
    g = graph_from_arrays([t["id"] for t in tasks], [t["env"] for t in tasks], [[], []], [[1], [0]])
    s = EnvSchedSampler(tasks, g, identifier_filter=BfclIdentifierFilter(), require_dispatch=False)
    for spec in tasks:
        env = BFCLEnvironment()
        env.reset(spec)
        with pytest.raises(RuntimeError, match="finished episode"):
            env.trajectory()
        result = None
        for calls in ground_truth_calls(spec):
            if calls:
                env.step(calls)
            result = env.step([])  # end of turn
        assert result is not None and result.done and result.reward == 1.0
        traj = env.trajectory()
        assert traj.reward == 1.0 and traj.calls_per_turn == [list(c) for c in ground_truth_calls(spec)]
        assert replay_reward(spec, traj.calls_per_turn) == 1.0  # the filter's replays see the same episode
        verdict = s.submit_trajectory(spec, traj)
        assert verdict is not None and verdict.flagged == (spec is task)
    assert list(s.identifier_flags()) == [task["id"]]
