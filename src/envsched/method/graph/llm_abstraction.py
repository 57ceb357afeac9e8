"""Optional LLM extractor of the abstract representation (EnvSched appendix E), over any OpenAI-compatible API.

The static extractor (:mod:`envsched.method.graph.abstraction`) reads keywords; an LLM can read the tool
descriptions and verifier code and state the execution structure more faithfully. This module asks an
OpenAI-compatible ``/chat/completions`` endpoint for the appendix E.1 structure as JSON, with a prompt
written for this project (not the paper's text), and:

* forbids difficulty or outcome guesses (the schema has no place for them and rejects extra keys);
* validates every answer against :data:`~envsched.method.graph.abstraction.ABSTRACTION_SCHEMA` (``jsonschema``);
* retries malformed answers, telling the model what was wrong, up to ``max_retries`` times, then raises
  :class:`LLMAbstractionError` naming the task, the endpoint and the last problem;
* caches valid answers on disk keyed by a hash of the task content, the model and the prompt version,
  so a pool is analysed once (a task whose content changes is analysed again).

HTTP through httpx (no SDK), attempts through tenacity. The API key, if the endpoint needs one, is read from the
``ENVSCHED_LLM_API_KEY`` environment variable (or passed in).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from envsched.errors import EnvSchedError, InvalidValueError
from envsched.llm_http import MAX_JSON_DEPTH, MAX_RESPONSE_BYTES, LLMResponseError, loads_bounded, post_bounded
from envsched.method.graph.abstraction import (
    ABSTRACTION_SCHEMA,
    CHECK_KINDS,
    CONFLICT_TYPES,
    EFFECTS,
    GATE_PROVENANCES,
    GATE_TYPES,
    INPUT_CATEGORIES,
    LITERAL_CATEGORIES,
    OPERATION_FAMILIES,
)
from envsched.validation import is_int, is_number

__all__ = ["PROMPT_VERSION", "SYSTEM_PROMPT", "LLMAbstractionError", "LLMAbstractor", "build_user_message"]

PROMPT_VERSION = "envsched-abstraction-v1"

SYSTEM_PROMPT = f"""You are a static analyser of tool-use tasks for reinforcement learning environments.
You receive one task as JSON: the environment's operations (tools with their descriptions and parameters),
the task instruction, a summary of the initial state, and the verifier's checks and code. The initial-state
summary is evidence for you only; the agent never sees it.

Describe the task's execution and reward structure as facts that follow from this static evidence, with
every domain-specific name removed: never write a tool name, entity identifier, database field, person name
or literal value. Use only the vocabularies below.

Return ONE JSON object with exactly these keys:
- "operations": one entry per operation the task can use: {{"family", "effect", "inputs", "required"}}.
  family: one of {list(OPERATION_FAMILIES)}; effect: one of {list(EFFECTS)};
  inputs: parameter categories from {list(INPUT_CATEGORIES)};
  required: true when completing this task needs the operation.
- "gates": prerequisites that must hold before an operation can succeed: {{"type", "provenance"}}.
  type: one of {list(GATE_TYPES)}; provenance (where the evidence is): one of {list(GATE_PROVENANCES)}.
- "dependencies": {{"from", "to", "kind"}}: "from" is an operation family or a gate type, "to" an operation
  family; kind "data" (the second consumes a value the first produces, e.g. an identifier that must be looked
  up through a tool path), "gate" (a gate guards the operation), "order" (the task requires this order).
- "check_groups": a partition of the verifier's checks into groups controlled by the same operation family or
  gate: {{"controlled_by", "kinds", "size"}}; controlled_by is a family or "gate_<type>"; kinds from
  {list(CHECK_KINDS)}; size = number of checks in the group.
- "conflicts": {{"type", "families"}} with type one of {list(CONFLICT_TYPES)} (an order that must be kept,
  operations that exclude each other, effects that cannot be undone).
- "literals": counts of the literals the task gives ready to use, by category {list(LITERAL_CATEGORIES)}.
  A value the agent must first obtain through a tool is a data dependency, not a literal.

Do not estimate difficulty, success rates, rewards or how an agent would behave; do not add other keys.
Answer with the JSON object only."""


class _Retry(EnvSchedError):
    """A problem worth another attempt (carried to tenacity)."""


class _HTTPStatus(EnvSchedError):
    """An HTTP error status from the endpoint (decided on by :meth:`LLMAbstractor._attempt`)."""

    def __init__(self, status_code: int, reason_phrase: str) -> None:
        super().__init__(f"HTTP {status_code} ({reason_phrase})")
        self.status_code = status_code
        self.reason_phrase = reason_phrase


class LLMAbstractionError(EnvSchedError, RuntimeError):
    """The LLM endpoint did not give a valid abstract representation after the allowed retries."""


def _summarise_state(state: Any, limit: int) -> str:
    if state in (None, "", [], {}):
        return ""
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def build_user_message(spec: Mapping[str, Any], *, state_chars: int = 3000) -> str:
    """The user message for one task: structured JSON (environment operations, task, state, verifier)."""
    verifier = spec.get("verifier") or {}
    payload = {
        "environment": {"operations": spec.get("tools") or []},
        "task": {"instruction": spec.get("instruction") or ""},
        "initial_state_summary": _summarise_state(spec.get("initial_state"), state_chars),
        "verifier": {"checks": verifier.get("checks") or [], "code": verifier.get("code") or ""},
    }
    return json.dumps(payload, ensure_ascii=False, sort_keys=True, default=str)


def _content_key(spec: Mapping[str, Any], model: str) -> str:
    content = {k: spec.get(k) for k in ("instruction", "tools", "initial_state", "verifier")}
    h = hashlib.sha256()
    h.update(PROMPT_VERSION.encode())
    h.update(b"\0" + model.encode() + b"\0")
    h.update(json.dumps(content, sort_keys=True, separators=(",", ":"), default=str).encode())
    return h.hexdigest()


#: Longest model reply (characters) or cache file (bytes) that is parsed; a longer one is a malformed answer
#: (a reply) or a cache miss (a file), refused before any parsing.
MAX_REPLY_CHARS = 200_000


def _strip_fence(content: str) -> str:
    """The text inside one Markdown code fence (```` ```json ... ``` ````), or the text itself.

    Plain string operations, linear in the reply's length: a regular expression here once took cubic time
    on a hostile reply (an open fence followed by thousands of newlines)."""
    text = content.strip()
    if len(text) >= 6 and text.startswith("```") and text.endswith("```"):
        inner = text[3:-3]
        if inner.startswith("json"):
            inner = inner[4:]
        return inner.strip()
    return text


class LLMAbstractor:
    """Abstract representations from an OpenAI-compatible chat endpoint, validated and cached.

    Args:
        endpoint: base URL (``http://host:port/v1``) or the full ``.../chat/completions`` URL.
        model: model name sent with each request.
        cache_dir: cache folder (default ``~/.cache/envsched/abstractions``).
        api_key: bearer token (default: ``ENVSCHED_LLM_API_KEY`` from the environment, if set).
        max_retries: extra attempts after a malformed answer or a transient HTTP failure.
        timeout: deadline in seconds of one HTTP request as a whole (connect, send, headers and body; not
            each read).
        max_response_bytes: largest response body read (default 4 MiB); reading stops past it.
        max_json_depth: deepest JSON nesting accepted in a response or an answer (default 64).
        clock: the clock each request's deadline is measured on (see :func:`envsched.llm_http.post_bounded`;
            default: the event loop's monotonic clock).
    """

    def __init__(self, endpoint: str, model: str, *, cache_dir: str | os.PathLike[str] | None = None,
                 api_key: str | None = None, max_retries: int = 3, timeout: float = 120.0,
                 max_response_bytes: int = MAX_RESPONSE_BYTES, max_json_depth: int = MAX_JSON_DEPTH,
                 clock: Callable[[], float] | None = None) -> None:
        if not endpoint or not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"llm endpoint must be an http(s) URL, got {endpoint!r}")
        if not model:
            raise ValueError("an llm model name is required")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if not is_number(timeout) or not timeout > 0:
            raise InvalidValueError(f"timeout must be a positive number of seconds, got {timeout!r}", name="timeout",
                                    value=timeout)
        for name, cap in (("max_response_bytes", max_response_bytes), ("max_json_depth", max_json_depth)):
            if not is_int(cap) or cap < 1:
                raise InvalidValueError(f"{name} must be a positive integer, got {cap!r}", name=name, value=cap)
        self.max_response_bytes = max_response_bytes
        self.max_json_depth = max_json_depth
        try:
            import jsonschema  # imported here: only the LLM path needs it
        except ImportError:
            raise ImportError("the LLM abstraction validates answers with jsonschema: "
                              "pip install 'envsched[graph]'") from None

        self.url = endpoint.rstrip("/")
        if not self.url.endswith("/chat/completions"):
            self.url += "/chat/completions"
        self.model = model
        self.cache_dir = Path(cache_dir) if cache_dir is not None else Path.home() / ".cache/envsched/abstractions"
        self.api_key = api_key if api_key is not None else os.environ.get("ENVSCHED_LLM_API_KEY")
        self.max_retries = max_retries
        self.timeout = timeout
        self.clock = clock
        self._validator = jsonschema.Draft202012Validator(ABSTRACTION_SCHEMA)
        self.stats = {"requests": 0, "cache_hits": 0, "retries": 0, "cached": 0}

    # ------------------------------------------------------------------ validation
    def validate(self, answer: Any) -> list[str]:
        """Problems with an answer (empty when it is a valid abstract representation)."""
        errors = sorted(self._validator.iter_errors(answer), key=lambda e: list(e.absolute_path))
        return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors[:10]]

    def _parse(self, content: str) -> tuple[Any, list[str]]:
        content = content or ""
        if len(content) > MAX_REPLY_CHARS:
            return None, [f"the reply is {len(content)} characters long, more than the limit of {MAX_REPLY_CHARS}"]
        text = _strip_fence(content)
        try:
            answer = loads_bounded(text, url=self.url, max_depth=self.max_json_depth)
        except json.JSONDecodeError as exc:
            return None, [f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"]
        except LLMResponseError:
            return None, ["not valid JSON (nested too deeply)"]
        except ValueError as exc:  # e.g. an integer literal past Python's digit limit
            return None, [f"not valid JSON ({exc})"]
        try:
            return answer, self.validate(answer)
        except RecursionError:
            return None, ["the JSON is nested too deeply"]

    # ------------------------------------------------------------------ cache
    def _cache_path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.json"

    def cached(self, spec: Mapping[str, Any]) -> dict[str, Any] | None:
        """The cached representation of this task content, or ``None``."""
        path = self._cache_path(_content_key(spec, self.model))
        try:
            if not path.is_file() or path.stat().st_size > MAX_REPLY_CHARS:
                return None  # absent, or too large to be one of ours: a miss, recomputed and overwritten
            answer = json.loads(path.read_text(encoding="utf-8"))
            return answer if not self.validate(answer) else None
        except (OSError, ValueError, RecursionError):  # unreadable, bad UTF-8, bad or too deeply nested JSON
            return None

    def _store(self, key: str, answer: dict[str, Any]) -> None:
        path = self._cache_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(answer, fh, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.stats["cached"] += 1

    # ------------------------------------------------------------------ HTTP
    def _post(self, messages: list[dict[str, str]]) -> str:
        body = json.dumps({"model": self.model, "messages": messages, "temperature": 0,
                           "response_format": {"type": "json_object"}}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self.stats["requests"] += 1
        resp = post_bounded(self.url, body, headers, timeout_s=self.timeout, max_bytes=self.max_response_bytes,
                            clock=self.clock)
        if resp.status_code >= 400:
            raise _HTTPStatus(resp.status_code, resp.reason_phrase)
        data = loads_bounded(resp.content, url=self.url, max_depth=self.max_json_depth)
        try:
            return str(data["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"response has no choices[0].message.content: {str(data)[:200]}") from None

    def _attempt(self, spec: Mapping[str, Any],
                 messages: list[dict[str, str]]) -> tuple[dict[str, Any] | None, str, str]:
        """One request: (answer, content, "") when valid; (None, content, problem) for a problem worth
        another attempt (a transient HTTP failure, or an invalid answer, which is then appended to
        ``messages`` with what was wrong); :class:`LLMAbstractionError` when the endpoint refuses."""
        try:
            content = self._post(messages)
        except _HTTPStatus as exc:
            code = exc.status_code
            if 400 <= code < 500 and code not in (408, 429):
                raise LLMAbstractionError(
                    f"task {spec.get('id')!r}: {self.url} refused the request (HTTP {code}: "
                    f"{exc.reason_phrase})") from None
            return None, "", f"HTTP {code} ({exc.reason_phrase})"
        except (httpx.TransportError, httpx.TooManyRedirects, OSError, ValueError) as exc:
            return None, "", f"request failed: {exc or type(exc).__name__}"
        answer, errors = self._parse(content)
        if not errors:
            return answer, content, ""
        problem = "; ".join(errors)
        messages[2:] = [{"role": "assistant", "content": content[:4000]},
                        {"role": "user", "content": "That answer is invalid: " + problem
                         + ". Reply again with only the corrected JSON object, using only the allowed keys "
                           "and vocabulary values."}]
        return None, content, problem

    def extract(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The abstract representation of one task (from the cache, else from the endpoint)."""
        key = _content_key(spec, self.model)
        hit = self.cached(spec)
        if hit is not None:
            self.stats["cache_hits"] += 1
            return hit
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": build_user_message(spec)}]
        problem = "no attempt made"
        retrying = Retrying(stop=stop_after_attempt(self.max_retries + 1), retry=retry_if_exception_type(_Retry),
                            reraise=True)
        try:
            for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        self.stats["retries"] += 1
                    answer, _content, problem = self._attempt(spec, messages)
                    if answer is not None:
                        self._store(key, answer)
                        return answer
                    raise _Retry(problem)
        except _Retry:
            pass
        raise LLMAbstractionError(
            f"task {spec.get('id')!r}: no valid abstract representation from {self.url} (model {self.model!r}) "
            f"after {self.max_retries + 1} attempts; last problem: {problem}")
