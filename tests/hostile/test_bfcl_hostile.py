"""Hostile BFCL calls: bounded literals, every call under a time and memory budget in a worker process, an
exceeded budget scored as the policy's failure, and the evaluation deadline enforced inside a step."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("bfcl_eval", reason="needs bfcl-eval: pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0")

from envsched.envs.bfcl import MAX_CALL_CHARS, MAX_CALLS_PER_STEP, BFCLEnvironment

MATH_TASK = "multi_turn_base_0"  # GorillaFileSystem + TwitterAPI


def _math_task() -> str:
    from envsched.envs._bfcl_package import _entries_by_id

    return next(i for i, e in _entries_by_id().items() if "MathAPI" in e["involved_classes"]
                and i.startswith("multi_turn_base"))


REFUSED_CALLS = {
    "50 MB string": ("ls(a='" + "x" * 50_000_000 + "')", "characters long"),
    "one character over the limit": ("ls(a='" + "x" * MAX_CALL_CHARS + "')", "characters long"),
    "200,000 unary minus signs": ("ls(a=" + "-" * 200_000 + "1)", "characters long"),
    "50,000 unary minus signs": ("ls(a=" + "-" * 50_000 + "1)", "nested too deeply|sign may only"),
    "double minus": ("ls(a=--1)", "sign may only precede a number"),
    "40 nested lists": ("ls(a=" + "[" * 40 + "]" * 40 + ")", "nest at most"),
    "too many items": ("ls(a=[" + "1," * 20_000 + "])", "at most 10000 items"),
    "huge integer": ("ls(a=" + "9" * 30 + ")", "smaller than 2\\*\\*63"),
    "power expression": ("ls(a=3**30000000)", "must be literals"),
    "name reference": ("ls(a=os)", "must be literals"),
    "lambda": ("ls(a=lambda: 1)", "must be literals"),
    "call in an argument": ("ls(a=__import__('os'))", "must be literals"),
    "attribute call": ("os.system('id')", "not a plain function call"),
    "f-string": ("ls(a=f'{1}')", "must be literals"),
    "**kwargs": ("ls(**{'a': 1})", "\\*\\*kwargs"),
    "dict unpacking": ("ls(a={**{}})", "unpacking"),
    "unknown function": ("rm_rf(a=1)", "no such function"),
    "NUL byte": ("ls(a='\x00')", "syntax|literals"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_CALLS))
def test_hostile_call_gets_an_error_result_and_runs_nothing(case: str) -> None:
    call, problem = REFUSED_CALLS[case]
    env = BFCLEnvironment()
    try:
        env.reset(MATH_TASK)
        result = env.step([call])
        assert not result.done
        (message,) = result.observation["results"]
        assert message.startswith("Error during execution:")
        import re

        assert re.search(problem, message), message
        assert result.info["rejected"] == 1
        assert env.calls == [[] for _ in env.calls]  # nothing reached BFCL's executor
    finally:
        env.close()


def test_a_step_with_too_many_calls_ends_the_episode_as_a_failure() -> None:
    env = BFCLEnvironment()
    try:
        env.reset(MATH_TASK)
        result = env.step(["ls()"] * (MAX_CALLS_PER_STEP + 1))
        assert result.done and result.reward == 0.0
        assert "more than the limit" in result.info["terminated"]
    finally:
        env.close()


def test_a_call_over_its_time_budget_is_killed_and_scored_as_the_policys_failure() -> None:
    task = _math_task()
    env = BFCLEnvironment(call_timeout_s=1.0)
    try:
        env.reset(task)
        started = time.monotonic()
        result = env.step(["power(base=3, exponent=30000000)"])  # 32 s of work in process before
        took = time.monotonic() - started
        assert result.done and result.reward == 0.0
        assert "longer than its 1s budget" in result.info["terminated"]
        assert env.last_check["valid"] is False
        assert took < 20, took  # killed, not run to completion (a hang guard, not a speed target)
    finally:
        env.close()


def test_a_call_over_its_memory_budget_is_scored_as_the_policys_failure() -> None:
    task = _math_task()
    env = BFCLEnvironment(call_timeout_s=30.0, call_memory_mb=64)
    try:
        env.reset(task)
        result = env.step(["square_root(number=2, precision=1000000000)"])
        assert result.done and result.reward == 0.0
        assert "exceeded its memory budget" in result.info["terminated"]
    finally:
        env.close()


def test_the_episode_deadline_is_enforced_inside_a_step() -> None:
    task = _math_task()
    env = BFCLEnvironment(call_timeout_s=60.0)
    try:
        env.reset(task)
        env.set_deadline(time.monotonic() + 1.0)
        result = env.step(["power(base=3, exponent=30000000)"])
        assert result.done and result.reward == 0.0
        assert "deadline" in result.info["terminated"]
    finally:
        env.close()


def test_normal_calls_still_work_after_a_killed_episode() -> None:
    task = _math_task()
    env = BFCLEnvironment(call_timeout_s=0.5)
    env.reset(task)
    env.step(["power(base=3, exponent=30000000)"])
    env.close()
    env = BFCLEnvironment()
    try:
        env.reset(task)
        result = env.step(["add(a=2, b=3)"])
        assert not result.done and "5" in result.observation["results"][0]
    finally:
        env.close()


def test_evaluation_scores_a_call_past_the_episode_deadline_as_a_failure_not_an_infra_error() -> None:
    """The audit's case: a 5 s episode ran 8-11.6 s and was retried as an infrastructure failure."""
    from envsched.envs.bfcl import build_bfcl_pool
    from envsched.evaluation.harness import EpisodeSettings, run_episode
    from envsched.evaluation.policy import FunctionCallAdapter, PolicyResponse

    spec = next(s for s in build_bfcl_pool(["base"]) if "MathAPI" in s["bfcl"]["involved_classes"])

    class SlowCallPolicy:  # stands in for a model that answers with one expensive call
        def complete(self, messages: object, *, timeout_s: float | None = None) -> PolicyResponse:
            return PolicyResponse(text="[power(base=3, exponent=30000000)]")

    # the deadline (1 s) comes before the default per-call budget (2 s): the deadline is what stops the call
    settings = EpisodeSettings(episode_timeout_s=1.0, max_retries=2, backoff_s=0.0, backoff_max_s=0.0)
    rec = run_episode(BFCLEnvironment, SlowCallPolicy(), FunctionCallAdapter(), spec, None, 0, settings,
                      sleep=lambda s: None)
    assert rec.outcome == "failure" and rec.reward == 0.0
    assert rec.attempts == 1
    assert rec.duration_s < 15, rec.duration_s  # a hang guard: the call was killed at the deadline
