"""BFCL multi-turn: pool counts from the installed bfcl-eval data, ground-truth replays, the episode protocol."""

from __future__ import annotations

import copy
import sys
from collections import Counter

import pytest

pytest.importorskip("bfcl_eval", reason="needs bfcl-eval: pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0")

from envsched.envs import bfcl
from envsched.envs.base import EnvironmentUnavailable
from envsched.envs.bfcl import (
    BFCLEnvironment,
    build_bfcl_pool,
    ground_truth_calls,
    replay_reward,
)
from envsched.pool import TaskPool

EXPECTED_ENVS = {  # bfcl-eval 2026.3.23, the rarest-involved-class rule of envsched.envs.bfcl
    "MessageAPI": 160, "TwitterAPI": 156, "TicketAPI": 124, "MathAPI": 100,
    "TradingBot": 80, "VehicleControlAPI": 76, "GorillaFileSystem": 52, "TravelAPI": 52,
}


@pytest.fixture(scope="module")
def specs() -> list[dict]:
    return build_bfcl_pool()


def test_pool_counts_and_fields(specs: list[dict]) -> None:
    pool = TaskPool(specs)
    assert len(pool) == 800
    assert dict(Counter(s["env"] for s in specs)) == EXPECTED_ENVS
    assert Counter(s["group"] for s in specs) == {c: 200 for c in bfcl.MULTI_TURN_CATEGORIES}
    assert [s["index"] for s in specs] == list(range(800))
    assert all(v == 0 for v in pool.missing_fields().values())
    # every task in exactly one env, and that env is one of its involved classes
    for s in specs:
        assert s["env"] in s["bfcl"]["involved_classes"]


def test_spec_content_matches_the_package_data(specs: list[dict]) -> None:
    s = next(x for x in specs if x["id"] == "bfcl/multi_turn_base_0")
    assert s["env"] == "TwitterAPI"  # involves TwitterAPI and GorillaFileSystem: the rarer class wins
    assert s["instruction"].startswith("[turn 1] Move 'final_report.pdf' within document directory")
    assert s["instruction"].count("[turn ") == 4
    names = {t["name"] for t in s["tools"]}
    assert {"mv", "grep", "post_tweet"} <= names
    mv = next(t for t in s["tools"] if t["name"] == "mv")
    assert "source" in mv["parameters"]["properties"] and mv["class"] == "GorillaFileSystem"
    assert "GorillaFileSystem" in s["initial_state"]
    assert "after turn 1: mkdir(dir_name='temp')" in s["verifier"]["checks"]
    assert "def mv(" in s["verifier"]["code"] and "def grep(" in s["verifier"]["code"]
    assert s["difficulty"] == sum(len(t) for t in ground_truth_calls(s)) == 10
    # miss_func: the held-out function is a tool available from its turn on
    mf = next(x for x in specs if x["id"] == "bfcl/multi_turn_miss_func_0")
    sort = next(t for t in mf["tools"] if t["name"] == "sort")
    assert sort["available_from_turn"] == 3


@pytest.mark.slow
def test_ground_truth_replays_score_full_marks_on_all_800(specs: list[dict]) -> None:
    unscored: list[tuple[str, dict]] = []
    failed: list[str] = []
    for s in specs:
        reward, info = replay_reward(s, ground_truth_calls(s), return_info=True)
        if reward is None:
            unscored.append((s["id"], info))
        elif reward != 1.0:
            failed.append(s["id"])
    if unscored:  # reported, with the checker's reason
        print("BFCL tasks the checker cannot score:", unscored)
    assert failed == []
    assert len(unscored) == 0  # bfcl-eval 2026.3.23 scores every multi-turn task


@pytest.mark.slow
def test_dropping_one_ground_truth_call_fails_every_task(specs: list[dict]) -> None:
    still_pass = []
    for s in specs:
        calls = ground_truth_calls(s)
        last = max(i for i, turn in enumerate(calls) if turn)
        calls[last] = calls[last][:-1]
        if replay_reward(s, calls) != 0.0:
            still_pass.append(s["id"])
    assert still_pass == []


def test_corrupting_an_argument_lowers_the_score(specs: list[dict]) -> None:
    s = next(x for x in specs if x["id"] == "bfcl/multi_turn_base_0")
    calls = ground_truth_calls(s)
    assert replay_reward(s, calls) == 1.0
    bad = copy.deepcopy(calls)
    bad[0][1] = "mkdir(dir_name='tmp')"
    reward, info = replay_reward(s, bad, return_info=True)
    assert reward == 0.0 and info["valid"] is False and "error_type" in info


def test_step_protocol_runs_an_episode_turn_by_turn() -> None:
    env = BFCLEnvironment()
    obs = env.reset("multi_turn_base_1")
    assert obs["turn"] == 0 and obs["num_turns"] == 4
    assert "alex" in obs["messages"][0]["content"]
    assert any(t["name"] == "ls" for t in obs["tools"])
    gt = ground_truth_calls("multi_turn_base_1")
    step = env.step(gt[0])
    assert not step.done and step.observation["turn"] == 0
    assert "workspace" in step.observation["results"][0]  # the real file system listing
    nxt = env.step([])  # end of turn 1
    assert not nxt.done and nxt.observation["turn"] == 1
    for turn in gt[1:]:
        # several steps within a turn are fine: one call per step
        for call in turn:
            assert not env.step([call]).done
        last = env.step("done with this turn")  # a text reply also ends the turn
    assert last.done and last.reward == 1.0 and env.final_reward() == 1.0
    assert env.calls[1] == [[c] for c in gt[1]]
    with pytest.raises(RuntimeError, match="over"):
        env.step(["ls()"])


def test_miss_func_turn_announces_the_added_function() -> None:
    env = BFCLEnvironment()
    obs = env.reset("multi_turn_miss_func_0")
    assert "sort" not in {t["name"] for t in obs["tools"]}
    gt = ground_truth_calls("multi_turn_miss_func_0")
    for t in range(3):
        if gt[t]:
            env.step(gt[t])
        obs = env.step([]).observation
    assert obs["turn"] == 3 and [t["name"] for t in obs["new_tools"]] == ["sort"]
    assert "updated some more functions" in obs["messages"][0]["content"]
    assert "sort" in {t["name"] for t in obs["tools"]}


def test_unsafe_calls_are_never_evaluated(tmp_path) -> None:
    env = BFCLEnvironment()
    env.reset("multi_turn_base_1")
    marker = tmp_path / "pwned"
    res = env.step([f"__import__('os').system('touch {marker}')", "ls(a=__import__('os').getcwd())",
                    "nonexistent_tool(x=1)", "ls(a=True)"])
    out = res.observation["results"]
    assert out[0].startswith("Error during execution: not a plain function call")
    assert "literals" in out[1] and "nonexistent_tool" in out[2]
    assert "current_directory_content" in out[3]
    assert res.info["rejected"] == 3 and not marker.exists()
    assert env.calls[0] == [["ls(a=True)"]]


def test_instances_are_fresh_per_episode_and_released() -> None:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    gt = ground_truth_calls("multi_turn_base_0")
    env = BFCLEnvironment()
    # a first, wrong episode of the task changes the state (creates 'wrong')...
    env.reset("multi_turn_base_0")
    env.step(["cd(folder='document')", "mkdir(dir_name='wrong')"])
    for _ in gt:
        r = env.step([])
    assert r.done and r.reward == 0.0
    # ... and must not leak into the next episode of the same task
    assert replay_reward("multi_turn_base_0", gt) == 1.0
    assert not [k for k in vars(multi_turn_utils) if k.startswith("envsched")]


def test_force_termination_and_early_final_reward() -> None:
    env = BFCLEnvironment(max_steps_per_turn=2)
    env.reset("multi_turn_base_1")
    env.step(["ls(a=True)"])
    env.step(["ls(a=True)"])
    r = env.step(["ls(a=True)"])
    assert r.done and r.reward == 0.0 and "force-terminated" in r.info["terminated"]
    env2 = BFCLEnvironment()
    env2.reset("multi_turn_base_1")
    assert env2.final_reward() == 0.0
    assert env2.last_check["error_type"] == "multi_turn:force_terminated"


def test_bad_inputs_are_clear_errors(specs: list[dict]) -> None:
    env = BFCLEnvironment()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(["ls()"])
    with pytest.raises(KeyError, match="no BFCL multi-turn entry"):
        env.reset("multi_turn_base_9999")
    with pytest.raises(ValueError, match="not a BFCL task"):
        env.reset({"id": "x", "env": "y"})
    env.reset("multi_turn_base_1")
    with pytest.raises(TypeError, match="list of call strings"):
        env.step([1, 2])
    with pytest.raises(ValueError, match="unknown BFCL multi-turn category"):
        build_bfcl_pool(["web_search"])
    with pytest.raises(TypeError):
        build_bfcl_pool("base")
    with pytest.raises(ValueError, match="turns of calls"):
        replay_reward(specs[0], [[]] * 50)
    assert [s["id"] for s in build_bfcl_pool(["base"], limit=2)] == ["bfcl/multi_turn_base_0",
                                                                    "bfcl/multi_turn_base_1"]


def test_missing_package_gives_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "bfcl_eval" or m.startswith("bfcl_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # makes `import bfcl_eval` fail
    bfcl._bfcl.cache_clear()
    try:
        assert bfcl.bfcl_available() is False
        with pytest.raises(EnvironmentUnavailable, match=r"pip install --no-deps bfcl-eval==2026\.3\.23 mpmath"):
            BFCLEnvironment()
    finally:
        bfcl._bfcl.cache_clear()


def test_episodes_do_not_leak_the_decimal_precision(specs: list[dict]) -> None:
    import decimal

    before = decimal.getcontext().prec
    math_tasks = [s for s in specs if s["env"] == "MathAPI"][:10]
    for s in math_tasks:
        assert replay_reward(s, ground_truth_calls(s)) == 1.0
    assert decimal.getcontext().prec == before  # BFCL's MathAPI sets it; envsched keeps that local


def test_environment_options_are_checked() -> None:
    from envsched.errors import InvalidValueError

    for kwargs, message in (({"max_steps_per_turn": 2.5}, r"^max_steps_per_turn must be an integer >= 1, got 2\.5$"),
                            ({"max_steps_per_turn": 0}, r"^max_steps_per_turn must be an integer >= 1, got 0$"),
                            ({"call_timeout_s": "2"}, r"^call_timeout_s must be a number > 0, got '2'$"),
                            ({"call_memory_mb": True}, r"^call_memory_mb must be an integer >= 1, got True$")):
        with pytest.raises(InvalidValueError, match=message):
            BFCLEnvironment(**kwargs)
    assert BFCLEnvironment().max_steps_per_turn == 20 and BFCLEnvironment(max_steps_per_turn=3).max_steps_per_turn == 3
