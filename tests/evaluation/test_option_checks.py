"""Evaluation options are checked with envsched.errors: a wrong type or range is an InvalidValueError
(a ValueError and a TypeError) naming the option, with the message's meaning unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envsched.errors import InvalidValueError
from envsched.evaluation.guards import CircuitBreaker
from envsched.evaluation.metrics import pass_at_k, wilson_interval
from envsched.evaluation.policy import ChatCompletionsPolicy


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_tokens": "512"}, r"^max_tokens must be an integer >= 1, got '512'$"),
    ({"max_tokens": True}, r"^max_tokens must be an integer >= 1, got True$"),
    ({"temperature": "0"}, r"^temperature must be a number >= 0, got '0'$"),
    ({"temperature": -0.5}, r"^temperature must be a number >= 0, got -0\.5$"),
    ({"timeout_s": 0}, r"^timeout_s must be a number > 0, got 0$"),
    ({"max_json_depth": 2.5}, r"^max_json_depth must be an integer >= 1, got 2\.5$"),
])
def test_policy_options(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        ChatCompletionsPolicy("http://127.0.0.1:9/v1", "m", **kwargs)


def test_policy_keeps_an_infinite_timeout_and_stores_numpy_integers_as_ints() -> None:
    p = ChatCompletionsPolicy("http://127.0.0.1:9/v1", "m", timeout_s=math.inf, max_tokens=np.int64(8))
    assert type(p.max_tokens) is int and p.max_tokens == 8


def test_metrics_and_breaker() -> None:
    assert pass_at_k(np.int64(4), 2, 1) == pytest.approx(0.5)
    with pytest.raises(InvalidValueError, match=r"^k must be an integer, got 1\.0$"):
        pass_at_k(4, 2, 1.0)
    with pytest.raises(InvalidValueError, match=r"^successes must be an integer, got True$"):
        wilson_interval(True, 3)
    with pytest.raises(InvalidValueError, match=r"threshold \(or None\) must be an integer >= 1, got '5'"):
        CircuitBreaker("5")


def test_openenv_eval_parameters() -> None:
    pytest.importorskip("openenv")
    from envsched.evaluation.rfc013 import EnvEvalHarness

    p = EnvEvalHarness.parameters({"max_turns": np.int64(3), "temperature": np.float32(0.5), "seeds": [0, 1]})
    assert type(p["max_turns"]) is int and type(p["temperature"]) is float and p["temperature"] == 0.5
    for bad, message in (({"max_turns": "3"}, r"eval_parameters\['max_turns'\] must be an integer >= 1, got '3'"),
                         ({"seeds": [0, True]}, r"eval_parameters\['seeds'\] must be a non-empty list"),
                         ({"success_threshold": math.nan}, r"eval_parameters\['success_threshold'\] must be a "
                                                           r"finite number, got nan"),
                         ({"limit": 0}, r"eval_parameters\['limit'\] \(or None\) must be an integer >= 1")):
        with pytest.raises(InvalidValueError, match=message):
            EnvEvalHarness.parameters(bad)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_turns": 0}, r"^max_turns must be an integer >= 1, got 0$"),
    ({"max_retries": "3"}, r"^max_retries must be an integer >= 0, got '3'$"),
    ({"success_threshold": "1"}, r"^success_threshold must be a number, got '1'$"),
    ({"episode_timeout_s": 0.0}, r"^episode_timeout_s must be a number > 0, got 0\.0$"),
    ({"backoff_s": -1}, r"^backoff_s must be a number >= 0, got -1$"),
])
def test_episode_settings(kwargs: dict, message: str) -> None:
    from envsched.evaluation.harness import EpisodeSettings

    with pytest.raises(InvalidValueError, match=message):
        EpisodeSettings(**kwargs)
    settings = EpisodeSettings(max_turns=np.int64(4), episode_timeout_s=math.inf)
    assert type(settings.max_turns) is int and settings.max_turns == 4


def test_wilson_confidence_and_openenv_client_timeouts() -> None:
    with pytest.raises(InvalidValueError, match=r"^confidence must be a finite number in \(0, 1\), got '0\.9'$"):
        wilson_interval(1, 3, confidence="0.9")
    from envsched.envs.openenv import TaskAPIClient

    with pytest.raises(InvalidValueError, match=r"^timeout_s must be a number > 0, got True$"):
        TaskAPIClient("http://127.0.0.1:9", "env", timeout_s=True)
