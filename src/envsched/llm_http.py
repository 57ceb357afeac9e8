"""Bounded HTTP calls to OpenAI-compatible LLM endpoints: a size cap, a whole-request deadline, a JSON depth cap.

Both envsched clients of an LLM endpoint (the evaluation policy, :mod:`envsched.evaluation.policy`, and the
graph's LLM abstraction, :mod:`envsched.method.graph.llm_abstraction`) post through :func:`post_bounded` and
parse through :func:`loads_bounded`, so that a misbehaving or hostile endpoint cannot exhaust the client:

* the response body is streamed and reading stops as soon as it passes ``max_bytes``
  (:data:`MAX_RESPONSE_BYTES`, 4 MiB, by default; a declared ``Content-Length`` above it is refused before
  reading; the cap applies to the decoded body, so a compressed bomb stops there too);
* ``timeout_s`` bounds the whole request -- connect, send, headers and body together -- not each read
  (httpx's own timeouts are per operation: an endpoint sending one byte every 1.5 s never trips
  ``timeout=3``, so they are left off and one deadline covers everything). The deadline is measured on the
  event loop's clock, which a caller may replace (``clock``): a test advances its own clock instead of waiting;
* JSON nested deeper than ``max_depth`` (:data:`MAX_JSON_DEPTH`, 64) is refused with
  :class:`ResponseTooDeep` instead of a ``RecursionError`` from the parser or a later recursive walk.

Every error names the endpoint and the cap it met. See docs/limits.md, "LLM responses".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from envsched.errors import EnvSchedError
from envsched.validation import check_int, check_number

__all__ = [
    "ERROR_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_RESPONSE_BYTES",
    "BoundedResponse",
    "LLMResponseError",
    "ResponseDeadline",
    "ResponseTooDeep",
    "ResponseTooLarge",
    "json_depth",
    "loads_bounded",
    "post_bounded",
]

#: Largest response body read from an LLM endpoint (bytes, after content decoding). A chat completion of a
#: few thousand tokens is a few KiB; 4 MiB leaves room for long answers and tool-call lists.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: Deepest JSON nesting accepted in a response (the top-level object is depth 1). A chat completion is
#: about 5 deep; the abstraction schema about 4 inside the answer.
MAX_JSON_DEPTH = 64
#: Most bytes read of an error response (status >= 400): enough for its message, the rest is not read.
ERROR_BODY_BYTES = 64 * 1024

_T = TypeVar("_T")


class LLMResponseError(EnvSchedError, ValueError):
    """An LLM endpoint's response broke a limit (too large or nested too deeply); the message names the
    endpoint and the limit."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"LLM endpoint {url}: {message}")
        self.url = url


class ResponseTooLarge(LLMResponseError):
    """The response body passed ``max_bytes`` (reading stopped there)."""


class ResponseTooDeep(LLMResponseError):
    """The response's JSON is nested deeper than ``max_depth``."""


class ResponseDeadline(EnvSchedError, TimeoutError):
    """The whole request (connect, send, headers, body) did not finish within its deadline."""

    def __init__(self, url: str, timeout_s: float) -> None:
        super().__init__(f"LLM endpoint {url}: no complete response within the {timeout_s:g} s deadline "
                         "(the deadline covers the whole request, not each read)")
        self.url = url
        self.timeout_s = timeout_s


@dataclass(frozen=True)
class BoundedResponse:
    """A response read within the limits: status, reason and the (complete) body."""

    status_code: int
    reason_phrase: str
    content: bytes
    url: str


async def _post(url: str, content: bytes, headers: Mapping[str, str], max_bytes: int,
                follow_redirects: bool) -> BoundedResponse:
    # no per-operation timeouts: the caller's deadline covers the whole request
    async with (httpx.AsyncClient(timeout=httpx.Timeout(None), follow_redirects=follow_redirects) as client,
                client.stream("POST", url, content=content, headers=dict(headers)) as resp):
        limit = max_bytes if resp.status_code < 400 else min(max_bytes, ERROR_BODY_BYTES)
        declared = resp.headers.get("content-length")
        if resp.status_code < 400 and declared is not None and declared.isdigit() and int(declared) > limit:
            raise ResponseTooLarge(url, f"the response declares {int(declared)} bytes, more than the cap "
                                        f"of {limit} bytes (max_response_bytes); not read")
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > limit:
                if resp.status_code >= 400:  # an error's message: its start is enough
                    chunks.append(chunk[: len(chunk) - (size - limit)])
                    break
                raise ResponseTooLarge(url, f"the response body passed the cap of {limit} bytes "
                                            "(max_response_bytes); reading stopped there")
            chunks.append(chunk)
        return BoundedResponse(resp.status_code, resp.reason_phrase, b"".join(chunks), str(resp.url))


def _run(factory: Callable[[], Coroutine[Any, Any, _T]], clock: Callable[[], float] | None = None) -> _T:
    """Run a coroutine to completion from synchronous code (in a helper thread if this thread has a loop), on a
    new event loop whose clock is ``clock`` when given."""

    def new_loop() -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        loop.time = clock  # type: ignore[method-assign,assignment]  # what every timer of the loop reads
        return loop

    def run() -> _T:
        with asyncio.Runner(loop_factory=new_loop if clock is not None else None) as runner:
            return runner.run(factory())

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="envsched-llm-http") as pool:
        return pool.submit(run).result()


def post_bounded(url: str, content: bytes, headers: Mapping[str, str], *, timeout_s: float,
                 max_bytes: int = MAX_RESPONSE_BYTES, follow_redirects: bool = True,
                 clock: Callable[[], float] | None = None) -> BoundedResponse:
    """POST ``content`` to ``url`` and read the response within ``timeout_s`` seconds in all and at most
    ``max_bytes`` of body.

    ``clock`` (seconds, never decreasing) is the clock the deadline is measured on; by default the event loop's
    own (``time.monotonic``). The loop reads it whenever it wakes (on I/O or a callback), so a clock that a
    test advances passes the deadline at the loop's next wake-up, without the test waiting for it.

    Raises :class:`ResponseDeadline` (a ``TimeoutError``) when the deadline passes, whatever the request was
    doing; :class:`ResponseTooLarge` when a successful response's body passes ``max_bytes`` (error responses,
    status >= 400, are cut at :data:`ERROR_BODY_BYTES` instead); httpx's transport errors as they come.
    """
    check_number(timeout_s, "timeout_s", low=0, low_open=True, finite=False)
    max_bytes = check_int(max_bytes, "max_bytes", low=1)

    async def bounded() -> BoundedResponse:
        try:
            async with asyncio.timeout(timeout_s):
                return await _post(url, content, headers, max_bytes, follow_redirects)
        except TimeoutError as exc:
            if isinstance(exc, ResponseDeadline):
                raise
            raise ResponseDeadline(url, timeout_s) from None

    return _run(bounded, clock)


def json_depth(obj: Any, stop_above: int | None = None) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, ``[]`` is 1), without recursion; stops counting
    once it passes ``stop_above``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if stop_above is not None and deepest > stop_above:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def loads_bounded(data: bytes | str, *, url: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(data)``, refusing JSON nested deeper than ``max_depth`` with :class:`ResponseTooDeep`
    (never a ``RecursionError``). Malformed JSON raises ``ValueError`` (``json.JSONDecodeError``) as usual."""
    max_depth = check_int(max_depth, "max_depth", low=1)
    raw = data.encode() if isinstance(data, str) else data
    too_deep = f"the JSON is nested deeper than the cap of {max_depth} levels (max_json_depth)"
    try:
        value = json.loads(data)
    except RecursionError:
        raise ResponseTooDeep(url, too_deep) from None
    if raw.count(b"[") + raw.count(b"{") > max_depth and json_depth(value, max_depth) > max_depth:
        raise ResponseTooDeep(url, too_deep)
    return value
