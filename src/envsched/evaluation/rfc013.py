"""RFC 013's ``EnvEvalHarness``: an ``openenv.core.evals.EvalHarness`` built from OpenEnv's collect pipeline.

:class:`EnvEvalHarness` has the RFC's constructor ``(session_factory, harness_adapter, task_client,
output_dir=None)`` and ``run(harness_version, library_versions, dataset, eval_parameters) -> dict``. A run
enumerates the split with a :class:`~envsched.samplers.SequentialSampler` (tasks crossed with seeds, each
item repeated ``samples_per_task`` times), hands it to OpenEnv's own ``CollectRunner`` as ``tasks``, and
writes OpenEnv's result files (``results.jsonl`` through ``RolloutSerializer``, ``metadata.json``) plus
``result.json`` (an ``openenv.core.evals.EvalResult``: config and scores).

``CollectRunner`` writes only the episodes that produced a reward; it counts the others in ``num_failed``
and passes no seed to the session factory. The harness therefore wraps the session factory: every
session is created with the spec's ``seed``, and what became of each episode that left no line in
``results.jsonl`` is observed on the way (an infrastructure failure, a policy failure, a rollout the
environment could not score, the turn limit, a harness error). Scores come from
:func:`envsched.evaluation.metrics.report` -- the same code that scores envsched's richer
:class:`~envsched.evaluation.EvalHarness` -- so both report the same numbers for the same episodes:
``success_rate`` with its standard error and Wilson interval, ``mean_reward``, ``pass@k``,
``mean_turns``, ``mean_completion_tokens``, ``error_rate``/``unscored_rate``/``infra_error_rate`` kept
apart, ``by_difficulty``/``by_group``, ``per_task``, and the D4 reproducibility check.

envsched also provides the two pieces the RFC leaves to each environment: :class:`OpenEnvSessionFactory`
(maps a spec to ``reset(split=, index=, seed=)`` through OpenEnv's ``StepEnvSessionAdapter`` and
``GenericEnvClient``) and :class:`AnswerHarnessAdapter` (a white-box harness for text-answer
environments); and :func:`policy_model_step`, an OpenEnv ``ModelStep`` over any envsched policy that keeps
the endpoint's token counts.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envsched.envs.base import InfrastructureError
from envsched.envs.openenv import TaskAPIClient, http_base_url, selection_kwargs, with_port
from envsched.errors import InvalidValueError
from envsched.evaluation.harness import _json_safe
from envsched.evaluation.metrics import report, reproducibility_check
from envsched.evaluation.policy import AnswerAdapter, ChatCompletionsPolicy, Policy, PolicyError
from envsched.evaluation.records import EpisodeRecord
from envsched.samplers.simple import SequentialSampler
from envsched.validation import check_int, check_number, is_int, is_number

try:
    from openenv.core.env_server.mcp_types import Tool
    from openenv.core.evals import EvalConfig
    from openenv.core.evals import EvalHarness as OpenEnvEvalHarness
    from openenv.core.evals import EvalResult as OpenEnvEvalResult
    from openenv.core.generic_client import GenericEnvClient
    from openenv.core.harness import (
        HarnessAdapter,
        HarnessRolloutResult,
        HarnessRunLimits,
        ModelStepResult,
        ResourceSession,
        ResourceSessionFactory,
        RolloutEvent,
        StepEnvSessionAdapter,
        ToolResult,
        ToolTraceEntry,
        VerifyResult,
    )
    from openenv.core.harness.collect import (
        CollectRunner,
        RolloutSerializer,
    )
    from openenv.core.llm_client import LLMResponse
except ImportError as exc:  # pragma: no cover - depends on the environment
    from envsched.envs.base import EnvironmentUnavailable

    raise EnvironmentUnavailable(
        "envsched.evaluation.rfc013 needs the `openenv` package: pip install 'envsched[openenv]' "
        "(openenv==0.10.0; never together with openenv-core)") from exc

__all__ = [
    "EVAL_PARAMETERS",
    "RESULT_FILENAME",
    "AnswerHarnessAdapter",
    "EnvEvalHarness",
    "OpenEnvSessionFactory",
    "UsageModelStepResult",
    "classify_failure",
    "policy_model_step",
]

RESULT_FILENAME = "result.json"

#: ``eval_parameters`` keys and their defaults (RFC 013 section "EnvEvalHarness"; ``max_turns``,
#: ``max_tokens`` default as in ``openenv collect``). ``model`` and ``llm_endpoint`` are needed unless
#: the harness was given a ``model_step``.
EVAL_PARAMETERS: dict[str, Any] = {
    "split": "test", "limit": None, "seeds": [0], "samples_per_task": 1, "temperature": 0.0,
    "success_threshold": 1.0, "model": None, "llm_endpoint": None, "llm_port": None, "max_tokens": 200,
    "max_turns": 9, "system_prompt": None, "api_key": None, "episode_id_prefix": "ep", "resume": True,
    "keep_losses": True, "check_reproducibility": True,
}
_INFRA_CODES = re.compile(r"\(code: (CAPACITY_REACHED|SESSION_ERROR|FACTORY_ERROR)\)")


# ---------------------------------------------------------------------------- model step
@dataclass
class UsageModelStepResult(ModelStepResult):
    """OpenEnv's ``ModelStepResult`` plus the token counts the endpoint reported (``None`` if none)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def policy_model_step(policy: Policy) -> Callable[..., ModelStepResult]:
    """An OpenEnv ``ModelStep`` over an envsched policy (e.g. :class:`ChatCompletionsPolicy`).

    Text only: the reply becomes ``LLMResponse(content=text)`` without tool calls (use it with
    :class:`AnswerHarnessAdapter`; for tool-calling models use OpenEnv's ``build_model_step``).
    Sampling keys from ``HarnessRunLimits.sampling`` are ignored: the policy carries its own.
    """

    def model_step(messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]) -> ModelStepResult:
        resp = policy.complete(messages)
        return UsageModelStepResult(response=LLMResponse(content=resp.text), prompt_tokens=resp.prompt_tokens,
                                    completion_tokens=resp.completion_tokens)

    return model_step


# ---------------------------------------------------------------------------- harness adapter
class AnswerHarnessAdapter(HarnessAdapter):
    """White-box harness for text-answer environments (reasoning-gym style, envsched's pool server).

    Each turn asks the model; a reply with tool calls calls those tools (as OpenEnv's
    ``MCPHarnessAdapter`` does), a plain-text reply is parsed by :class:`AnswerAdapter` (the content of
    the last ``<answer>...</answer>``, else the whole reply) and sent to the session's single tool as
    ``{"answer": ...}``. It stops when a tool result is ``done`` or after ``max_turns``; it records
    ``metrics["turns"]``, ``metrics["tool_calls"]`` and, when the model step reports them,
    ``metrics["completion_tokens"]``/``metrics["prompt_tokens"]``. An empty answer raises
    :class:`~envsched.evaluation.policy.PolicyError` (a failure of the policy).
    """

    def __init__(self, adapter: AnswerAdapter | None = None) -> None:
        self.adapter = adapter or AnswerAdapter(system_prompt="")

    def run_white_box(self, model_step: Any, session: ResourceSession,
                      limits: HarnessRunLimits | None = None) -> HarnessRolloutResult:
        lim = limits or HarnessRunLimits()
        messages = list(session.initial_messages())
        tools = session.list_tools()
        if not tools:
            raise ValueError("AnswerHarnessAdapter needs a session with at least one tool")
        result = HarnessRolloutResult(messages=list(messages))
        tokens: dict[str, int | None] = {"completion_tokens": None, "prompt_tokens": None}
        for turn in range(lim.max_turns):
            step = model_step(messages, tools, dict(lim.sampling))
            result.metrics["turns"] = turn + 1
            for key in tokens:
                n = getattr(step, key, None)
                if n is None and key == "completion_tokens" and step.completion_ids:
                    n = len(step.completion_ids)
                if n is not None:
                    tokens[key] = (tokens[key] or 0) + int(n)
            result.completion_ids.extend(step.completion_ids)
            messages.append(step.response.to_message_dict())
            result.events.append(RolloutEvent(type="model_response",
                                              payload={"turn": turn, "content": step.response.content}))
            calls = [(c.id, c.name, dict(c.args)) for c in step.response.tool_calls]
            if not calls:
                answer = self.adapter.to_action(step.response.content or "", {})
                calls = [(f"answer-{turn}", tools[0].name, {"answer": answer})]
            for call_id, name, args in calls:
                tool_result = session.call_tool(name, args)
                result.tool_trace.append(ToolTraceEntry(tool_name=name, arguments=args, result=tool_result))
                messages.append({"role": "tool", "tool_call_id": call_id, "name": name,
                                 "content": _text(tool_result.data)})
                if tool_result.done:
                    result.done = True
                    break
            if result.done:
                break
        result.messages = list(messages)
        result.metrics.setdefault("turns", 0)
        result.metrics["tool_calls"] = len(result.tool_trace)
        result.metrics.update({k: v for k, v in tokens.items() if v is not None})
        return result

    def run_black_box(self, session: ResourceSession, limits: HarnessRunLimits | None = None) -> HarnessRolloutResult:
        raise NotImplementedError("AnswerHarnessAdapter is a white-box harness: it needs a model_step")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("observation"), Mapping):
        obs = value["observation"]
        return str(obs.get("feedback") or obs.get("prompt") or json.dumps(obs, sort_keys=True, default=str))
    return json.dumps(value, sort_keys=True, default=str)


# ---------------------------------------------------------------------------- session factory
class OpenEnvSessionFactory(ResourceSessionFactory):
    """Sessions on an OpenEnv server that select the task through ``reset(split=, index=, seed=)``.

    Each session is OpenEnv's ``StepEnvSessionAdapter`` over a fresh ``GenericEnvClient`` (one WebSocket
    session per episode). The spec's ``split`` and ``index`` go to ``reset``; the seed is the ``seed``
    argument, else the spec's ``seed`` (set by :class:`~envsched.samplers.SequentialSampler`). The session
    exposes one tool, ``answer(answer: str)``, whose argument is sent in the action field ``text_field``.

    Args:
        base_url: the server (``http://``, ``ws://.../ws`` or ``host:port``).
        text_field: the action field an answer goes into (envsched's pool server: ``answer``).
        connect_timeout_s, message_timeout_s: ``GenericEnvClient`` timeouts.
        reset_kwargs: further keys for every ``reset``.
    """

    def __init__(self, base_url: str, *, text_field: str = "answer", connect_timeout_s: float = 10.0,
                 message_timeout_s: float = 60.0, reset_kwargs: Mapping[str, Any] | None = None) -> None:
        self.base_url = http_base_url(base_url)
        if not isinstance(text_field, str) or not text_field:
            raise ValueError(f"text_field must be a non-empty string, got {text_field!r}")
        self.text_field = text_field
        self.connect_timeout_s = float(connect_timeout_s)
        self.message_timeout_s = float(message_timeout_s)
        self.reset_kwargs = dict(reset_kwargs or {})
        self.tool = Tool(name="answer", description="Submit the final answer to the task.",
                         input_schema={"type": "object", "properties": {"answer": {"type": "string"}},
                                       "required": ["answer"]})

    def __repr__(self) -> str:
        return f"OpenEnvSessionFactory({self.base_url!r})"

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> ResourceSession:
        if not isinstance(task, Mapping):
            raise TypeError(f"task must be a task spec (a mapping), got {type(task).__name__}")
        kwargs = selection_kwargs(task, self.reset_kwargs)
        if seed is None:
            seed = task.get("seed")
        client = GenericEnvClient(base_url=self.base_url, connect_timeout_s=self.connect_timeout_s,
                                  message_timeout_s=self.message_timeout_s)
        field = self.text_field
        return StepEnvSessionAdapter(
            client, task=task, seed=seed, episode_id=episode_id, tool_specs=[self.tool],
            action_builder=lambda name, args: {field: str(args.get("answer", ""))},
            initial_messages_builder=lambda result, spec: [{"role": "user", "content": _prompt(result.observation)}],
            reset_kwargs=kwargs)


def _prompt(observation: Any) -> str:
    if isinstance(observation, Mapping):
        for key in ("prompt", "question", "text"):
            if isinstance(observation.get(key), str) and observation[key]:
                return observation[key]
    return _text(observation)


# ---------------------------------------------------------------------------- failure classes
def classify_failure(exc: BaseException) -> str:
    """The outcome class of an episode that raised: ``infra_error`` (connection lost, timeouts,
    ``CAPACITY_REACHED``/``SESSION_ERROR``/``FACTORY_ERROR``, the LLM endpoint down), ``policy_error``
    (a malformed answer: not solved, reward 0) or ``error`` (the harness or the environment raised)."""
    if isinstance(exc, InfrastructureError | ConnectionError | TimeoutError | OSError):
        return "infra_error"
    if isinstance(exc, PolicyError):
        return "policy_error"
    if isinstance(exc, RuntimeError) and _INFRA_CODES.search(str(exc)):
        return "infra_error"
    try:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake
    except ImportError:  # pragma: no cover
        return "error"
    return "infra_error" if isinstance(exc, ConnectionClosed | InvalidHandshake) else "error"


class _Observed:
    """What happened to the current episode (``CollectRunner`` runs episodes one at a time)."""

    def __init__(self) -> None:
        self.by_episode: dict[str, dict[str, Any]] = {}
        self.current: dict[str, Any] | None = None

    def start(self, episode_id: str | None, task: Any) -> dict[str, Any]:
        self.current = {"task": task, "exception": None, "verify_reward": None, "done": False,
                        "trace_reward": None, "turns": 0, "completion_tokens": None}
        self.by_episode[str(episode_id)] = self.current
        return self.current

    def fail(self, exc: BaseException) -> None:
        if self.current is not None and self.current["exception"] is None:
            self.current["exception"] = exc


class _ObservedSession(ResourceSession):
    def __init__(self, inner: ResourceSession, obs: dict[str, Any], observed: _Observed) -> None:
        self._inner, self._obs, self._observed = inner, obs, observed

    def initial_messages(self) -> list[dict[str, Any]]:
        return self._inner.initial_messages()

    def list_tools(self) -> list[Any]:
        return self._inner.list_tools()

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            result = self._inner.call_tool(name, arguments)
        except Exception as exc:
            self._observed.fail(exc)
            raise
        reward = result.metadata.get("reward")
        if reward is None and isinstance(result.data, Mapping):
            reward = result.data.get("reward")
        if reward is not None:
            self._obs["trace_reward"] = float(reward)
        self._obs["done"] = self._obs["done"] or bool(result.done)
        return result

    def verify(self, transcript: list[dict[str, Any]], final_state: Any | None = None) -> VerifyResult:
        try:
            result = self._inner.verify(transcript, final_state)
        except Exception as exc:
            self._observed.fail(exc)
            raise
        state = final_state if isinstance(final_state, Mapping) else {}
        metrics = state.get("metrics") or {}
        self._obs.update(verify_reward=result.env_reward, done=self._obs["done"] or bool(state.get("done")),
                         turns=int(metrics.get("turns", 0) or 0), completion_tokens=metrics.get("completion_tokens"))
        return result

    def close(self) -> None:
        self._inner.close()


class _ObservedFactory(ResourceSessionFactory):
    """Passes the spec's seed (``CollectRunner`` passes none) and observes each episode."""

    def __init__(self, inner: ResourceSessionFactory, observed: _Observed) -> None:
        self._inner, self._observed = inner, observed

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> ResourceSession:
        obs = self._observed.start(episode_id, task)
        if task is None:
            raise RuntimeError("CollectRunner ran out of tasks (more episodes planned than the sampler holds)")
        if seed is None and isinstance(task, Mapping):
            seed = task.get("seed")
        try:
            session = self._inner.create(task=task, seed=seed, episode_id=episode_id)
        except Exception as exc:
            self._observed.fail(exc)
            raise
        return _ObservedSession(session, obs, self._observed)


def _observed_model_step(model_step: Any, observed: _Observed) -> Any:
    """Counts the model's turns and tokens of the current episode (also when the episode later fails)."""

    def step(messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]) -> Any:
        try:
            result = model_step(messages, tools, sampling)
        except Exception as exc:
            observed.fail(exc)
            raise
        cur = observed.current
        if cur is not None:
            cur["model_turns"] = cur.get("model_turns", 0) + 1
            n = getattr(result, "completion_tokens", None)
            if n is None and getattr(result, "completion_ids", None):
                n = len(result.completion_ids)
            if n is not None:
                cur["model_tokens"] = (cur.get("model_tokens") or 0) + int(n)
            pn = getattr(result, "prompt_tokens", None)
            if pn is not None:
                cur["model_prompt_tokens"] = (cur.get("model_prompt_tokens") or 0) + int(pn)
        return result
    return step


class _ObservedAdapter(HarnessAdapter):
    def __init__(self, inner: HarnessAdapter, observed: _Observed) -> None:
        self._inner, self._observed = inner, observed

    def run_white_box(self, model_step: Any, session: ResourceSession,
                      limits: HarnessRunLimits | None = None) -> HarnessRolloutResult:
        try:
            return self._inner.run_white_box(_observed_model_step(model_step, self._observed), session, limits)
        except Exception as exc:
            self._observed.fail(exc)
            raise

    def run_black_box(self, session: ResourceSession, limits: HarnessRunLimits | None = None) -> HarnessRolloutResult:
        return self._inner.run_black_box(session, limits)


# ---------------------------------------------------------------------------- the harness
class EnvEvalHarness(OpenEnvEvalHarness):
    """RFC 013's evaluation harness on OpenEnv's ``EvalHarness`` and ``CollectRunner``.

    Args:
        session_factory: an OpenEnv ``ResourceSessionFactory`` mapping a task spec to a session (e.g.
            :class:`OpenEnvSessionFactory`).
        harness_adapter: an OpenEnv ``HarnessAdapter`` (``MCPHarnessAdapter`` for tool-calling models,
            :class:`AnswerHarnessAdapter` for text answers).
        task_client: a :class:`~envsched.envs.openenv.TaskAPIClient` (anything with ``iter_tasks(split)``).
        output_dir: where ``results.jsonl``, ``metadata.json`` and ``result.json`` go; ``None``: a fresh
            temporary folder per run.
        model_step: (envsched extra) the ``ModelStep`` to evaluate; default: built from
            ``eval_parameters`` (``llm_endpoint``, ``model``, ``temperature``, ``max_tokens``) with
            :func:`policy_model_step` over :class:`ChatCompletionsPolicy`.

    ``run`` returns the scores as a dict (``EvalHarness.run``'s contract); ``run_from_config`` wraps them
    in OpenEnv's ``EvalResult``. ``eval_parameters`` keys: see :data:`EVAL_PARAMETERS`; unknown keys are
    refused.
    """

    def __init__(self, session_factory: ResourceSessionFactory, harness_adapter: HarnessAdapter,
                 task_client: TaskAPIClient, output_dir: Path | None = None, *,
                 model_step: Callable[..., ModelStepResult] | None = None) -> None:
        if not hasattr(session_factory, "create"):
            raise TypeError(f"session_factory must be a ResourceSessionFactory, got {type(session_factory).__name__}")
        if not hasattr(harness_adapter, "run_white_box"):
            raise TypeError(f"harness_adapter must be a HarnessAdapter, got {type(harness_adapter).__name__}")
        if not hasattr(task_client, "iter_tasks"):
            raise TypeError(f"task_client must have iter_tasks(split) (a TaskAPIClient), got "
                            f"{type(task_client).__name__}")
        self.session_factory = session_factory
        self.harness_adapter = harness_adapter
        self.task_client = task_client
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.model_step = model_step
        self.last_run: dict[str, Any] = {}

    # ------------------------------------------------------------------ parameters
    @staticmethod
    def parameters(eval_parameters: Mapping[str, Any] | None) -> dict[str, Any]:
        """``eval_parameters`` with defaults filled in, validated (``ValueError`` naming the key)."""
        given = dict(eval_parameters or {})
        unknown = sorted(set(given) - set(EVAL_PARAMETERS))
        if unknown:
            raise ValueError(f"unknown eval_parameters {unknown}; known: {sorted(EVAL_PARAMETERS)}")
        p = {**EVAL_PARAMETERS, **given}
        for key in ("samples_per_task", "max_turns", "max_tokens"):
            p[key] = check_int(p[key], f"eval_parameters[{key!r}]", low=1)
        if p["limit"] is not None:
            p["limit"] = check_int(p["limit"], "eval_parameters['limit'] (or None)", low=1)
        seeds = p["seeds"]
        if (not isinstance(seeds, list | tuple) or not seeds or len(set(seeds)) != len(seeds)
                or any(not is_int(s, numpy=False) or s < 0 for s in seeds)):
            raise InvalidValueError(f"eval_parameters['seeds'] must be a non-empty list of distinct integers >= 0, "
                                    f"got {seeds!r}", name="eval_parameters['seeds']", value=seeds)
        p["seeds"] = list(seeds)
        if not isinstance(p["split"], str) or not p["split"]:
            raise ValueError(f"eval_parameters['split'] must be a non-empty string, got {p['split']!r}")
        t = p["temperature"]
        check_number(t, "eval_parameters['temperature']", low=0, finite=False)
        if p["samples_per_task"] > 1 and t == 0:
            raise ValueError("eval_parameters['temperature'] must be > 0 when samples_per_task > 1 "
                             "(otherwise every sample of a task is the same completion)")
        thr = p["success_threshold"]
        check_number(thr, "eval_parameters['success_threshold']")
        for key in ("temperature", "success_threshold"):  # a numpy scalar is recorded as the float it is
            if not isinstance(p[key], int | float):
                p[key] = float(p[key])
        return p

    def _model_step(self, p: Mapping[str, Any]) -> Callable[..., ModelStepResult]:
        if self.model_step is not None:
            return self.model_step
        if not p["llm_endpoint"] or not p["model"]:
            raise ValueError("eval_parameters needs 'llm_endpoint' and 'model' (or build the harness with "
                             "model_step=...)")
        endpoint = with_port(str(p["llm_endpoint"]), p["llm_port"])
        policy = ChatCompletionsPolicy(endpoint, str(p["model"]), temperature=float(p["temperature"]),
                                       max_tokens=int(p["max_tokens"]), api_key=p["api_key"])
        step = policy_model_step(policy)
        if p["system_prompt"]:
            system = str(p["system_prompt"])

            def with_system(messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]) -> Any:
                if not any(m.get("role") == "system" for m in messages):
                    messages = [{"role": "system", "content": system}, *messages]
                return step(messages, tools, sampling)
            return with_system
        return step

    # ------------------------------------------------------------------ planning
    def tasks(self, split: str, limit: int | None = None) -> list[dict[str, Any]]:
        """The split's tasks from the Task API (the first ``limit``), each with ``split`` and ``index``."""
        out: list[dict[str, Any]] = []
        for i, t in enumerate(self.task_client.iter_tasks(split)):
            if limit is not None and i >= limit:
                break
            spec = dict(t) if isinstance(t, Mapping) else {"value": t}
            spec.setdefault("split", split)
            spec.setdefault("index", i)
            spec.setdefault("id", f"{getattr(self.task_client, 'env_name', 'env')}-{split}-{spec['index']}")
            out.append(spec)
        if not out:
            raise ValueError(f"split {split!r} has no tasks")
        return out

    # ------------------------------------------------------------------ reproducibility (D4)
    def reproducibility_check(self, task: Mapping[str, Any], seed: int | None) -> dict[str, Any]:
        """Create two fresh sessions for the same ``(split, index, seed)`` and compare a hash of their
        initial messages; a mismatch warns and records ``reproducible: false``."""
        def first_observation() -> Any:
            session = self.session_factory.create(task=dict(task), seed=seed, episode_id=None)
            try:
                return session.initial_messages()
            finally:
                session.close()

        return reproducibility_check(first_observation, task, seed, what="sessions")

    # ------------------------------------------------------------------ running
    def run(self, harness_version: str, library_versions: dict[str, str], dataset: str,
            eval_parameters: dict[str, Any]) -> dict[str, Any]:
        """Evaluate and return the scores (see the module docstring); write OpenEnv's result files."""
        p = self.parameters(eval_parameters)
        model_step = self._model_step(p)
        tasks = self.tasks(p["split"], p["limit"])
        sampler = SequentialSampler(tasks, p["seeds"])
        k = p["samples_per_task"]
        planned: list[tuple[dict[str, Any], int]] = [(item, j) for item in sampler for j in range(k)]
        out = self.output_dir if self.output_dir is not None else Path(tempfile.mkdtemp(prefix="envsched-eval-"))
        serializer = RolloutSerializer(out)
        repro = (self.reproducibility_check(planned[0][0], planned[0][0].get("seed")) if p["check_reproducibility"]
                 else {"reproducible": None, "skipped": True})
        observed = _Observed()
        runner = CollectRunner(session_factory=_ObservedFactory(self.session_factory, observed),
                               harness_adapter=_ObservedAdapter(self.harness_adapter, observed),
                               serializer=serializer, tasks=_repeat(sampler, k),
                               limits=HarnessRunLimits(max_turns=p["max_turns"]))
        should_keep = None if p["keep_losses"] else (lambda record: record.reward >= 0.0)
        collect = runner.run(model_step=model_step, num_episodes=len(planned),
                             episode_id_prefix=p["episode_id_prefix"], resume=bool(p["resume"]),
                             should_keep=should_keep)
        written = _read_results(serializer.results_path)
        records: list[EpisodeRecord] = []
        for i, (item, j) in enumerate(planned):
            eid = f"{p['episode_id_prefix']}-{i:06d}"
            records.append(_record(item, j, written.get(eid), observed.by_episode.get(eid), p["success_threshold"]))
        groups: dict[str, list[float | None]] = {}
        for r in records:
            groups.setdefault(f"{r.task_id}#{r.seed}", []).append(r.reward if r.scored else None)
        scored = [r.reward for r in records if r.scored and r.reward is not None]
        if scored:  # the sampler only counts: let it take whatever scale the environment's rewards have
            sampler.reward_range = (min(0.0, *scored), max(1.0, *scored))
        for (item, j) in planned:
            if j == 0:
                sampler.update(item, groups[f"{item['id']}#{item.get('seed')}"])
        rep = report(records, success_threshold=float(p["success_threshold"]), max_k=k)
        scores: dict[str, Any] = {
            **rep["scores"], "planned_episodes": len(planned),
            "by_difficulty": rep["by_difficulty"], "by_group": rep["by_group"], "by_env": rep["by_env"],
            "per_task": rep["per_task"], "reproducible": repro.get("reproducible"), "reproducibility": repro,
            "collect": {"num_collected": collect.num_collected, "num_skipped": collect.num_skipped,
                        "num_dropped": collect.num_dropped, "num_failed": collect.num_failed},
        }
        scores = _json_safe(scores)
        config = {"harness_name": self.name, "harness_version": harness_version,
                  "library_versions": dict(library_versions), "dataset": dataset,
                  "eval_parameters": _json_safe({k2: v for k2, v in p.items() if k2 != "api_key"})}
        serializer.write_metadata({**config, "output_dir": str(out), "num_episodes_planned": len(planned),
                                   "sampler": sampler.metrics(),
                                   "episodes": [{"episode_id": f"{p['episode_id_prefix']}-{i:06d}",
                                                 "task_id": r.task_id, "seed": r.seed, "sample": r.sample,
                                                 "outcome": r.outcome, "reward": r.reward,
                                                 "error": (r.error or "")[:300] or None}
                                                for i, r in enumerate(records)]})
        result = OpenEnvEvalResult(config=EvalConfig(**config), scores=scores)
        (out / RESULT_FILENAME).write_text(result.model_dump_json(indent=2))
        self.last_run = {"output_dir": out, "records": records, "sampler": sampler, "collect": collect}
        return scores

    def run_from_config(self, config: EvalConfig) -> OpenEnvEvalResult:
        """OpenEnv's entry point: ``run`` with the config's fields, wrapped in ``EvalResult``."""
        return super().run_from_config(config)


def _repeat(sampler: SequentialSampler, k: int) -> Iterator[dict[str, Any]]:
    for item in sampler:
        for _ in range(k):
            yield item


def _read_results(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                data = json.loads(line)
                out[str(data["episode_id"])] = data  # the last line of an episode wins
    return out


def _record(item: Mapping[str, Any], sample: int, written: Mapping[str, Any] | None,
            obs: Mapping[str, Any] | None, threshold: float) -> EpisodeRecord:
    diff = item.get("difficulty")
    common = {"task_id": str(item.get("id")), "seed": item.get("seed"), "sample": sample,
              "env": item.get("env"), "group": item.get("group"), "split": item.get("split"),
              "index": item.get("index"),
              "difficulty": diff if is_number(diff, numpy=False) else None}
    if written is not None:
        reward = float(written["reward"])
        metrics = written.get("metrics") or {}
        outcome = ("success" if reward >= threshold else "failure") if written.get("done") else "limit"
        tokens, ptokens = metrics.get("completion_tokens"), metrics.get("prompt_tokens")
        if tokens is None and obs is not None:
            tokens = obs.get("model_tokens")
        turns = metrics.get("turns") or (obs.get("model_turns") if obs is not None else 0) or 0
        return EpisodeRecord(**common, outcome=outcome, reward=reward, turns=int(turns),
                             completion_tokens=int(tokens) if isinstance(tokens, int | float) else None,
                             prompt_tokens=int(ptokens) if isinstance(ptokens, int | float) else None)
    if obs is None:
        return EpisodeRecord(**common, outcome="error", error="the episode was not run")
    tokens = obs.get("completion_tokens")
    if tokens is None:
        tokens = obs.get("model_tokens")
    ptokens = obs.get("model_prompt_tokens")
    extra = {"turns": int(obs.get("turns") or obs.get("model_turns") or 0), "prompt_tokens": ptokens,
             "completion_tokens": int(tokens) if isinstance(tokens, int | float) else None}
    exc = obs.get("exception")
    if exc is not None:
        outcome = classify_failure(exc)
        msg = f"{type(exc).__name__}: {str(exc)[:500]}"
        return EpisodeRecord(**common, outcome=outcome, reward=0.0 if outcome == "policy_error" else None,
                             error=msg, **extra)
    if obs.get("trace_reward") is None and obs.get("verify_reward") is None:
        if obs.get("done"):  # the environment ended the episode without a score
            return EpisodeRecord(**common, outcome="unscored", error="the environment returned no reward", **extra)
        return EpisodeRecord(**common, outcome="limit", reward=0.0,
                             error="turn limit reached before the environment ended the episode", **extra)
    # a reward was produced but the record was not written: dropped by should_keep (keep_losses off)
    reward = obs.get("trace_reward") if obs.get("trace_reward") is not None else obs.get("verify_reward")
    return EpisodeRecord(**common, outcome="success" if float(reward) >= threshold else "failure",
                         reward=float(reward), error="dropped by keep_losses=False", **extra)
