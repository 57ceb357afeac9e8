"""In-training evaluation (RFC 013): a reproducible evaluation of a policy on a held-out split.

* :class:`EvalHarness` runs a split crossed with seeds through any envsched environment runner and a
  policy, with retries, a concurrency limit, per-episode timeouts and resumption from its JSONL;
* :class:`ChatCompletionsPolicy` queries an OpenAI-compatible endpoint; adapters turn its text into actions;
* :func:`compare_eval_results` lists fixed, regressed and left-out tasks and the change of each metric;
* :class:`EvalSchedule` evaluates every ``n`` optimizer steps (step 0: the baseline).
"""

from envsched.evaluation.compare import EvalComparison, compare_eval_results
from envsched.evaluation.harness import EpisodeSettings, EvalHarness, EvalResult, run_episode
from envsched.evaluation.metrics import binomial_se, pass_at_k, score_records
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

__all__ = [
    "OUTCOMES",
    "AnswerAdapter",
    "ChatCompletionsPolicy",
    "EpisodeLog",
    "EpisodeRecord",
    "EpisodeSettings",
    "EvalComparison",
    "EvalHarness",
    "EvalResult",
    "EvalSchedule",
    "FunctionCallAdapter",
    "Policy",
    "PolicyError",
    "PolicyResponse",
    "PolicyUnavailable",
    "binomial_se",
    "compare_eval_results",
    "episode_key",
    "pass_at_k",
    "run_episode",
    "score_records",
]
