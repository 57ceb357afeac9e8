"""`envsched eval` fails fast: an endpoint nobody listens on stops it before the first episode, consecutive
infrastructure failures stop it early (the circuit breaker), and a run with no scored episode exits non-zero."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.evaluation import CircuitBreaker, EndpointUnreachable, EvalHarness, EvaluationStopped, check_endpoint
from envsched.evaluation.policy import ChatCompletionsPolicy

SRC = Path(__file__).resolve().parents[2] / "src"


def _closed_port() -> int:
    """A port on 127.0.0.1 that nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_closed_port_stops_before_the_first_episode_with_the_connection_error(tmp_path):
    port = _closed_port()
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    # a real process, as a user runs it (the bound only guards against a hang: retries would take minutes)
    proc = subprocess.run([sys.executable, "-m", "envsched.cli.main", "eval", "reasoning_gym:chain_sum",
                           "--num-tasks", "20", "--llm-endpoint", f"http://127.0.0.1:{port}", "--model", "m",
                           "-o", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Connection refused" in proc.stderr and f"127.0.0.1:{port}" in proc.stderr
    assert "no episode was run" in proc.stderr
    assert not (tmp_path / "run" / "episodes.jsonl").exists() or not (tmp_path / "run" / "episodes.jsonl").read_text()


def test_consecutive_infrastructure_failures_trip_the_breaker(tmp_path, stub_llm):
    stub_llm.respond = lambda q, n: ("raw", 503, b"overloaded")  # the server answers, every answer fails
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["eval", "reasoning_gym:chain_sum", "--num-tasks", "20", "--llm-endpoint",
                                   stub_llm.url, "--model", "m", "-o", str(out), "--retries", "0",
                                   "--stop-after", "3"])
    assert res.exit_code == 1
    assert "stopped after 3 consecutive episodes failed on infrastructure (3 of 20" in res.output
    assert "HTTP 503" in res.output  # the cause on screen, not only in episodes.jsonl
    lines = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in lines] == ["infra_error"] * 3
    assert sum(stub_llm.calls.values()) == 3  # nothing ran after the breaker tripped


def test_a_run_whose_episodes_all_failed_on_infrastructure_exits_non_zero(tmp_path, stub_llm):
    stub_llm.respond = lambda q, n: ("raw", 503, b"overloaded")
    res = CliRunner().invoke(cli, ["eval", "reasoning_gym:chain_sum", "--limit", "2", "--llm-endpoint",
                                   stub_llm.url, "--model", "m", "-o", str(tmp_path / "run"), "--retries", "0"])
    assert res.exit_code == 1
    assert "every one of the 2 episodes failed on infrastructure" in res.output
    assert json.loads((tmp_path / "run" / "result.json").read_text())["scores"]["infra_error_rate"] == 1.0


def test_a_run_with_scored_episodes_still_exits_zero(tmp_path, stub_llm):
    answers = iter(["<answer>1</answer>", ("raw", 503, b"overloaded")])
    stub_llm.respond = lambda q, n: next(answers)
    res = CliRunner().invoke(cli, ["eval", "reasoning_gym:chain_sum", "--limit", "2", "--llm-endpoint",
                                   stub_llm.url, "--model", "m", "-o", str(tmp_path / "run"), "--retries", "0"])
    assert res.exit_code == 0, res.output


def test_breaker_counts_only_consecutive_failures():
    b = CircuitBreaker(2)
    assert not b.record("infra_error", "ConnectionError: refused\ntraceback")
    assert not b.record("failure")  # a scored episode resets the count
    assert not b.record("infra_error", "x")
    assert b.record("infra_error", "PolicyUnavailable: down") and b.last_error == "PolicyUnavailable: down"
    assert not CircuitBreaker(None).record("infra_error")
    with pytest.raises(ValueError, match=r"threshold \(or None\) must be an integer >= 1, got 0"):
        CircuitBreaker(0)


def test_check_endpoint_names_what_and_why():
    port = _closed_port()
    with pytest.raises(EndpointUnreachable, match=rf"the model server at http://127.0.0.1:{port}/v1 .*refused"):
        check_endpoint(f"http://127.0.0.1:{port}/v1", what="the model server")
    with pytest.raises(ValueError, match="invalid port"):
        check_endpoint("http://127.0.0.1:99999", what="x")
    with socket.socket() as s:  # a listening socket is reachable
        s.bind(("127.0.0.1", 0))
        s.listen()
        check_endpoint(f"127.0.0.1:{s.getsockname()[1]}")


def test_harness_stops_and_keeps_the_episodes_for_resume(tmp_path, stub_llm):
    from envsched.envs.reasoning_gym import ReasoningGymEnvironment, build_reasoning_gym_pool

    stub_llm.respond = lambda q, n: ("raw", 503, b"overloaded")
    tasks = build_reasoning_gym_pool(["chain_sum"], tasks_per_dataset=6, split="test")
    policy = ChatCompletionsPolicy(stub_llm.url, "m")
    h = EvalHarness(ReasoningGymEnvironment, policy, tasks, max_retries=0, max_consecutive_infra_errors=2,
                    check_reproducibility=False)
    with pytest.raises(EvaluationStopped) as info:
        h.run(tmp_path)
    assert (info.value.failures, info.value.done, info.value.planned) == (2, 2, 6)
    stub_llm.respond = lambda q, n: "<answer>0</answer>"
    result = EvalHarness(ReasoningGymEnvironment, policy, tasks, max_retries=0, max_consecutive_infra_errors=2,
                         check_reproducibility=False).run(tmp_path)  # resumes: the 2 failed ones are re-run
    assert result.scores["episodes"] == 6 and result.scores["outcomes"]["infra_error"] == 0


def test_an_unreachable_endpoint_skips_an_in_training_evaluation_without_stopping_training(tmp_path):
    from envsched.envs.reasoning_gym import ReasoningGymEnvironment, build_reasoning_gym_pool
    from envsched.evaluation import EvalSchedule

    tasks = build_reasoning_gym_pool(["chain_sum"], tasks_per_dataset=2, split="test")
    policy = ChatCompletionsPolicy(f"http://127.0.0.1:{_closed_port()}", "m")
    harness = EvalHarness(ReasoningGymEnvironment, policy, tasks, check_reproducibility=False)
    seen = []
    schedule = EvalSchedule(harness, None, 10, lambda step, result: seen.append(step), output_dir=tmp_path)
    assert schedule.maybe_run(0) is None and seen == [] and schedule.evaluations == 0
    assert [step for step, _ in schedule.skipped] == [0] and "Connection refused" in schedule.skipped[0][1]
