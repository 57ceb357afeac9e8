"""Policies for evaluation: an OpenAI-compatible chat-completions client, and adapters that turn the
model's text into each environment's action format.

The policy under evaluation is a checkpoint served behind an OpenAI-compatible endpoint (vLLM,
``mlx_lm.server``, TGI...). :class:`ChatCompletionsPolicy` posts ``/v1/chat/completions`` with httpx
(no SDK), and reads the token counts from the response's ``usage``.

Failure classes (they decide how an episode is counted, see :mod:`envsched.evaluation.metrics`):

* :class:`PolicyUnavailable` (an :class:`~envsched.envs.base.InfrastructureError`): the endpoint cannot
  be reached, times out, or answers 5xx/429 -- retried, reported as ``infra_error``;
* :class:`PolicyError`: the policy answered, but malformed (no JSON, no choices, no text, an action the
  adapter cannot parse) -- the policy's failure: counted as not solved and in ``error_rate``.
"""

from __future__ import annotations

import ast
import json
import re
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx

from envsched.envs.base import InfrastructureError, StepResult
from envsched.errors import EnvSchedError
from envsched.llm_http import (
    MAX_JSON_DEPTH,
    MAX_RESPONSE_BYTES,
    LLMResponseError,
    ResponseDeadline,
    loads_bounded,
    post_bounded,
)
from envsched.validation import check_int, check_number, is_int

__all__ = [
    "ActionAdapter",
    "AnswerAdapter",
    "ChatCompletionsPolicy",
    "FunctionCallAdapter",
    "Policy",
    "PolicyError",
    "PolicyResponse",
    "PolicyUnavailable",
    "adapter_for",
    "chat_completions_url",
    "observation_text",
]


class PolicyError(EnvSchedError):
    """The policy answered, but its answer is unusable (malformed response or action)."""


class PolicyUnavailable(InfrastructureError):
    """The policy endpoint failed (unreachable, timeout, HTTP 5xx or 429): infrastructure, retried."""


@dataclass
class PolicyResponse:
    """One completion: its text and the token counts the endpoint reported (``None`` if it did not)."""

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float = 0.0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@runtime_checkable
class Policy(Protocol):
    """Anything that completes a chat."""

    def complete(self, messages: Sequence[Mapping[str, Any]], *, timeout_s: float | None = None) -> PolicyResponse:
        """Return the assistant's next message for ``messages``."""
        ...


def chat_completions_url(endpoint: str) -> str:
    """``http://host:port``, ``.../v1`` or ``.../v1/chat/completions`` -> the chat-completions URL."""
    if not isinstance(endpoint, str) or "://" not in endpoint:
        raise ValueError(f"the LLM endpoint must be an http(s) URL, got {endpoint!r}")
    parts = urllib.parse.urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the LLM endpoint must be an http(s) URL with a host, got {endpoint!r}")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ValueError(f"the LLM endpoint {endpoint!r} has an invalid port: {exc}") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path = path + ("/chat/completions" if path.endswith("/v1") else "/v1/chat/completions")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class ChatCompletionsPolicy:
    """An OpenAI-compatible chat-completions client.

    Args:
        endpoint: the server (``http://127.0.0.1:8000``, ``.../v1`` or the full ``.../v1/chat/completions``).
        model: the model name the server knows the checkpoint by.
        temperature: sampling temperature (must be > 0 to draw several different samples per task).
        max_tokens: the most tokens one completion may hold.
        timeout_s: deadline of one request as a whole -- connect, send, headers and body, not each read
            (an episode's deadline can shorten it).
        api_key: sent as a bearer token when given.
        extra_body: further request fields (``top_p``, ``stop``, ``seed``...).
        max_response_bytes: largest response body read (default 4 MiB; reading stops past it, a
            :class:`PolicyError` naming the endpoint and the cap).
        max_json_depth: deepest JSON nesting accepted in a response (default 64).
        clock: the clock each request's deadline is measured on (see :func:`envsched.llm_http.post_bounded`;
            default: the event loop's monotonic clock).
    """

    def __init__(self, endpoint: str, model: str, *, temperature: float = 0.0, max_tokens: int = 512,
                 timeout_s: float = 120.0, api_key: str | None = None,
                 extra_body: Mapping[str, Any] | None = None, max_response_bytes: int = MAX_RESPONSE_BYTES,
                 max_json_depth: int = MAX_JSON_DEPTH, clock: Callable[[], float] | None = None) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        check_number(temperature, "temperature", low=0, finite=False)
        max_tokens = check_int(max_tokens, "max_tokens", low=1)
        check_number(timeout_s, "timeout_s", low=0, low_open=True, finite=False)
        max_response_bytes = check_int(max_response_bytes, "max_response_bytes", low=1)
        max_json_depth = check_int(max_json_depth, "max_json_depth", low=1)
        self.max_response_bytes = max_response_bytes
        self.max_json_depth = max_json_depth
        self.url = chat_completions_url(endpoint)
        self.endpoint = endpoint
        self.model = model
        self.temperature = float(temperature)
        self.max_tokens = max_tokens
        self.timeout_s = float(timeout_s)
        self.api_key = api_key
        self.extra_body = dict(extra_body or {})
        self.clock = clock

    def __repr__(self) -> str:
        return f"ChatCompletionsPolicy({self.url!r}, model={self.model!r}, temperature={self.temperature})"

    def complete(self, messages: Sequence[Mapping[str, Any]], *, timeout_s: float | None = None) -> PolicyResponse:
        body = {"model": self.model, "messages": [dict(m) for m in messages], "temperature": self.temperature,
                "max_tokens": self.max_tokens, **self.extra_body}
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        timeout = self.timeout_s if timeout_s is None else max(0.001, min(self.timeout_s, timeout_s))
        t0 = time.monotonic()
        try:
            resp = post_bounded(self.url, json.dumps(body).encode(), headers, timeout_s=timeout,
                                max_bytes=self.max_response_bytes, clock=self.clock)
        except LLMResponseError as exc:  # answered, but past the size cap
            raise PolicyError(f"malformed policy response: {exc}") from None
        except ResponseDeadline as exc:
            raise PolicyUnavailable(f"LLM endpoint {self.url} unreachable: timed out, no complete response within the "
                                    f"{exc.timeout_s:g} s deadline (the whole request, not each read)") from exc
        except (httpx.TransportError, httpx.TooManyRedirects, OSError) as exc:
            # connection refused or lost, DNS, TLS (httpx.TimeoutException is a TransportError)
            raise PolicyUnavailable(f"LLM endpoint {self.url} unreachable: {exc or type(exc).__name__}") from exc
        if resp.status_code >= 400:
            text = resp.content[:300].decode("utf-8", "replace")
            if resp.status_code >= 500 or resp.status_code in (408, 429):
                raise PolicyUnavailable(f"LLM endpoint {self.url} answered HTTP {resp.status_code}: {text}")
            raise PolicyError(f"LLM endpoint {self.url} refused the request (HTTP {resp.status_code}): {text}")
        raw = resp.content
        latency = time.monotonic() - t0
        return parse_chat_response(raw, latency, url=self.url, max_json_depth=self.max_json_depth)


def parse_chat_response(raw: bytes | str, latency_s: float = 0.0, *, url: str = "(response)",
                        max_json_depth: int = MAX_JSON_DEPTH) -> PolicyResponse:
    """Read a chat-completions response body; :class:`PolicyError` when it is malformed or nested deeper
    than ``max_json_depth`` (``url`` names the endpoint in that message)."""
    try:
        data = loads_bounded(raw, url=url, max_depth=max_json_depth)
    except LLMResponseError as exc:
        raise PolicyError(f"malformed policy response: {exc}") from None
    except ValueError:
        raise PolicyError(f"malformed policy response (not JSON): {str(raw)[:200]!r}") from None
    if not isinstance(data, dict):
        raise PolicyError(f"malformed policy response: {type(data).__name__} instead of an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise PolicyError(f"malformed policy response: no choices in {str(data)[:200]}")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise PolicyError("malformed policy response: choices[0] has no message")
    content = message.get("content")
    if content is None and message.get("tool_calls"):
        content = json.dumps([{"name": c.get("function", {}).get("name"),
                               "arguments": c.get("function", {}).get("arguments")}
                              for c in message["tool_calls"] if isinstance(c, dict)])
    if not isinstance(content, str):
        raise PolicyError(f"malformed policy response: message content is {type(content).__name__}")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return PolicyResponse(content, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")),
                          latency_s, data)


def _count(value: Any) -> int | None:
    return int(value) if is_int(value, numpy=False) and value >= 0 else None


# ---------------------------------------------------------------------------- adapters
def observation_text(observation: Any) -> str:
    """The text of an observation: a string as is; from a dict its ``prompt``/``question``/``instruction``/
    ``text``/``feedback`` field, else its JSON."""
    if isinstance(observation, str):
        return observation
    if isinstance(observation, Mapping):
        for key in ("prompt", "question", "instruction", "text", "content", "feedback", "message"):
            value = observation.get(key)
            if isinstance(value, str) and value:
                return value
    try:
        return json.dumps(observation, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(observation)


@runtime_checkable
class ActionAdapter(Protocol):
    """Turns observations into chat messages and the model's text into the environment's action."""

    def initial_messages(self, task: Mapping[str, Any], observation: Any) -> list[dict[str, Any]]: ...

    def to_action(self, text: str, task: Mapping[str, Any]) -> Any: ...

    def feedback_message(self, result: StepResult) -> dict[str, Any]: ...


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)


class AnswerAdapter:
    """Question/answer environments (reasoning-gym, OpenEnv text answers): the action is the answer text.

    If the model writes ``<answer>...</answer>``, the content of the last tag is the answer (so a model
    may reason first); otherwise the whole reply, stripped. An empty answer is a malformed action.
    """

    system_prompt = ("Answer the question. Reason if you need to, then give only the final answer "
                     "inside <answer></answer> tags.")

    def __init__(self, system_prompt: str | None = None) -> None:
        if system_prompt is not None:
            self.system_prompt = system_prompt

    def initial_messages(self, task: Mapping[str, Any], observation: Any) -> list[dict[str, Any]]:
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*msgs, {"role": "user", "content": observation_text(observation)}]

    def to_action(self, text: str, task: Mapping[str, Any]) -> str:
        tags = _ANSWER_TAG.findall(text)
        answer = (tags[-1] if tags else text).strip()
        if not answer:
            raise PolicyError("malformed answer: the reply is empty")
        return answer

    def feedback_message(self, result: StepResult) -> dict[str, Any]:
        return {"role": "user", "content": observation_text(result.observation)}


class FunctionCallAdapter:
    """Function-calling environments (BFCL multi-turn): the action is a list of calls written as Python
    call expressions (``["cd(folder='docs')", "ls()"]``), BFCL's own format.

    The model answers with Python calls (``[f(a=1), g()]``, in a code fence or not) or a JSON list of
    ``{"name": ..., "arguments": {...}}``; ``[]`` or a plain-text reply ends the user's turn (BFCL's
    protocol). A reply that starts like a call list but does not parse is a malformed action.
    Observations are BFCL's dicts (``messages``, ``tools``, ``results``) or text.
    """

    system_prompt = ("You can call the functions listed below. To call functions, reply with only a Python "
                     "list of calls, e.g. [func_a(x=1), func_b(name='y')]. The results come back to you. "
                     "When the user's request is done, reply [] (or a short text answer).")

    def __init__(self, system_prompt: str | None = None) -> None:
        if system_prompt is not None:
            self.system_prompt = system_prompt

    def initial_messages(self, task: Mapping[str, Any], observation: Any) -> list[dict[str, Any]]:
        tools = (observation.get("tools") if isinstance(observation, Mapping) else None) or task.get("tools") or []
        system = self.system_prompt + "\n\nFunctions:\n" + _describe_tools(tools)
        return [{"role": "system", "content": system}, *self._turn_messages(observation)]

    def to_action(self, text: str, task: Mapping[str, Any]) -> list[str]:
        body = text.strip()
        if not body.startswith(("[", "```", "{")) and not re.match(r"^[A-Za-z_][\w.]*\(", body):
            return []  # a text reply ends the turn
        return parse_function_calls(text)

    def feedback_message(self, result: StepResult) -> dict[str, Any]:
        obs = result.observation
        if isinstance(obs, Mapping) and "results" in obs:
            return {"role": "user", "content": "Function results:\n" + "\n".join(map(str, obs["results"]))}
        msgs = self._turn_messages(obs)
        content = "\n".join(m["content"] for m in msgs)
        if isinstance(obs, Mapping) and obs.get("new_tools"):
            content += "\n\nNew functions:\n" + _describe_tools(obs["new_tools"])
        return {"role": "user", "content": content}

    @staticmethod
    def _turn_messages(observation: Any) -> list[dict[str, Any]]:
        if isinstance(observation, Mapping) and isinstance(observation.get("messages"), list):
            msgs = [{"role": "user", "content": str(m.get("content", ""))}
                    for m in observation["messages"] if isinstance(m, Mapping)]
            if msgs:
                return msgs
        return [{"role": "user", "content": observation_text(observation)}]


def _describe_tools(tools: Sequence[Any]) -> str:
    lines = []
    for t in tools:
        if isinstance(t, Mapping):
            params = t.get("parameters")
            lines.append(f"- {t.get('name')}: {t.get('description', '')}"
                         + (f" parameters: {json.dumps(params, sort_keys=True)}" if params else ""))
    return "\n".join(lines) or "(none)"


def parse_function_calls(text: str) -> list[str]:
    """Model text -> a list of Python call strings; :class:`PolicyError` if it is neither calls nor JSON."""
    body = text.strip()
    fence = re.search(r"```(?:python|json)?\s*(.*?)```", body, re.S)
    if fence:
        body = fence.group(1).strip()
    if not body:
        raise PolicyError("malformed function calls: the reply is empty")
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, list) and all(isinstance(c, Mapping) and isinstance(c.get("name"), str) for c in data):
        calls = []
        for c in data:
            args = c.get("arguments") or {}
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    raise PolicyError(f"malformed function call arguments for {c['name']}: {args[:100]!r}") from None
            if not isinstance(args, Mapping):
                raise PolicyError(f"malformed function call arguments for {c['name']}")
            calls.append(f"{c['name']}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")")
        return calls
    source = body if body.startswith("[") else "[" + ", ".join(x for x in body.splitlines() if x.strip()) + "]"
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError:
        raise PolicyError(f"malformed function calls (neither Python calls nor JSON): {text[:200]!r}") from None
    if not isinstance(tree.body, ast.List | ast.Tuple):
        raise PolicyError(f"malformed function calls: expected a list of calls, got {text[:200]!r}")
    calls = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call):
            raise PolicyError(f"malformed function calls: {ast.unparse(node)!r} is not a call")
        try:
            for kw in node.keywords:
                ast.literal_eval(kw.value)
            for arg in node.args:
                ast.literal_eval(arg)
        except ValueError:
            raise PolicyError(f"malformed function call {ast.unparse(node)!r}: arguments must be literals") from None
        calls.append(ast.unparse(node))
    return calls


def adapter_for(env_name: str) -> ActionAdapter:
    """The default adapter for an environment runner's ``name``."""
    if env_name.lower().startswith(("bfcl", "tau", "acebench")):
        return FunctionCallAdapter()
    return AnswerAdapter()
