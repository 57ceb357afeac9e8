"""run_episode's retries (tenacity): infrastructure failures only, waits backoff_s * 2**k capped at backoff_max_s."""

from __future__ import annotations

from envsched.envs.base import InfrastructureError
from envsched.evaluation.harness import EpisodeSettings, run_episode
from envsched.evaluation.policy import AnswerAdapter, ChatCompletionsPolicy

TASK = {"id": "t0", "env": "e", "instruction": "say 4"}
POLICY = ChatCompletionsPolicy("http://127.0.0.1:9", "m")  # never reached: the environment fails first


def _factory(exc: Exception, calls: list[int]):
    def make():
        calls.append(1)
        raise exc
    return make


def test_infrastructure_failures_are_retried_with_capped_exponential_backoff():
    sleeps: list[float] = []
    calls: list[int] = []
    settings = EpisodeSettings(max_retries=4, backoff_s=1.0, backoff_max_s=3.0)
    rec = run_episode(_factory(InfrastructureError("server at capacity"), calls), POLICY, AnswerAdapter(), TASK,
                      0, 0, settings, sleep=sleeps.append)
    assert sleeps == [1.0, 2.0, 3.0, 3.0]
    assert len(calls) == 5 and rec.attempts == 5
    assert rec.outcome == "infra_error" and rec.error == "InfrastructureError: server at capacity"


def test_other_failures_are_not_retried():
    sleeps: list[float] = []
    calls: list[int] = []
    rec = run_episode(_factory(RuntimeError("bug in the environment"), calls), POLICY, AnswerAdapter(), TASK,
                      0, 0, EpisodeSettings(max_retries=3), sleep=sleeps.append)
    assert sleeps == [] and len(calls) == 1 and rec.attempts == 1
    assert rec.outcome == "error" and rec.error.startswith("RuntimeError: bug in the environment")


def test_no_retries_means_one_attempt():
    sleeps: list[float] = []
    calls: list[int] = []
    rec = run_episode(_factory(InfrastructureError("down"), calls), POLICY, AnswerAdapter(), TASK, None, 0,
                      EpisodeSettings(max_retries=0), sleep=sleeps.append)
    assert sleeps == [] and len(calls) == 1 and rec.outcome == "infra_error" and rec.attempts == 1


def test_http_failures_keep_their_error_classes():
    """Through httpx as through urllib before: refused connections and timeouts are PolicyUnavailable (an
    InfrastructureError, so retried); the per-request timeout applies."""
    import socket
    import time

    import pytest

    from envsched.evaluation.policy import PolicyUnavailable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    with pytest.raises(PolicyUnavailable, match=r"unreachable"):
        ChatCompletionsPolicy(f"http://127.0.0.1:{closed_port}", "m").complete([{"role": "user", "content": "hi"}])
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        policy = ChatCompletionsPolicy(f"http://127.0.0.1:{silent.getsockname()[1]}", "m", timeout_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(PolicyUnavailable, match=r"unreachable"):
            policy.complete([{"role": "user", "content": "hi"}])
        assert time.monotonic() - t0 < 10
    assert issubclass(PolicyUnavailable, InfrastructureError)
