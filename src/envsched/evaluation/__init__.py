"""In-training evaluation (RFC 013): a reproducible evaluation of a policy on a held-out split.

* :class:`EvalHarness` runs a split crossed with seeds through any envsched environment runner and a
  policy, with retries, a concurrency limit, per-episode timeouts and resumption from its JSONL;
* :class:`ChatCompletionsPolicy` queries an OpenAI-compatible endpoint; adapters turn its text into actions;
* :func:`check_endpoint` and :class:`CircuitBreaker` stop an evaluation early when its endpoints cannot be
  reached (before the first episode, or after consecutive infrastructure failures);
* :func:`compare_eval_results` lists fixed, regressed and left-out tasks and the change of each metric;
* :class:`EvalSchedule` evaluates every ``n`` optimizer steps (step 0: the baseline);
* :class:`EnvEvalHarness` (RFC 013's form: an ``openenv.core.evals.EvalHarness`` on OpenEnv's
  ``CollectRunner``), :class:`OpenEnvSessionFactory`, :class:`AnswerHarnessAdapter` and
  :func:`policy_model_step` live in :mod:`envsched.evaluation.rfc013` (they need ``openenv``;
  imported on first use). Both harnesses score with :func:`envsched.evaluation.metrics.report`.
"""

from typing import Any

from envsched.evaluation.compare import EvalComparison, compare_eval_results
from envsched.evaluation.guards import CircuitBreaker, EndpointUnreachable, EvaluationStopped, check_endpoint
from envsched.evaluation.harness import EpisodeSettings, EvalHarness, EvalResult, run_episode
from envsched.evaluation.metrics import binomial_se, pass_at_k, report, score_records, wilson_interval
from envsched.evaluation.policy import (
    AnswerAdapter,
    ChatCompletionsPolicy,
    FunctionCallAdapter,
    Policy,
    PolicyError,
    PolicyResponse,
    PolicyUnavailable,
)
from envsched.evaluation.records import OUTCOMES, EpisodeLog, EpisodeRecord, episode_key
from envsched.evaluation.schedule import EvalSchedule

_OPENENV = ("AnswerHarnessAdapter", "EnvEvalHarness", "OpenEnvSessionFactory", "policy_model_step")

__all__ = [
    "OUTCOMES",
    "AnswerAdapter",
    "AnswerHarnessAdapter",
    "ChatCompletionsPolicy",
    "CircuitBreaker",
    "EndpointUnreachable",
    "EnvEvalHarness",
    "EpisodeLog",
    "EpisodeRecord",
    "EpisodeSettings",
    "EvalComparison",
    "EvalHarness",
    "EvalResult",
    "EvalSchedule",
    "EvaluationStopped",
    "FunctionCallAdapter",
    "OpenEnvSessionFactory",
    "Policy",
    "PolicyError",
    "PolicyResponse",
    "PolicyUnavailable",
    "binomial_se",
    "check_endpoint",
    "compare_eval_results",
    "episode_key",
    "pass_at_k",
    "policy_model_step",
    "report",
    "run_episode",
    "score_records",
    "wilson_interval",
]


def __getattr__(name: str) -> Any:
    """Import the OpenEnv-based pieces on first use (``openenv`` takes seconds to import)."""
    if name in _OPENENV:
        from envsched.evaluation import rfc013

        return getattr(rfc013, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
