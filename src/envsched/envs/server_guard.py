"""Transport limits of envsched's OpenEnv server (:mod:`envsched.envs.openenv_server`), per client.

OpenEnv (0.10.0) gives every WebSocket connection its own environment session and counts it against
``max_concurrent_envs`` for as long as the connection is open, and its idle-session reaper skips sessions
with a WebSocket attached; uvicorn reads a request head for as long as the client takes. So eight idle
WebSocket clients used to hold the server's eight sessions forever, and slow-header connections were held
without limit. This module bounds each client:

* :class:`WebSocketGuard` (ASGI middleware, active however the app is served) records the client's address for
  the request (:func:`current_client`: the per-client session cap of :mod:`envsched.envs.openenv_server`
  counts by it); a WebSocket that sends no message for ``idle_timeout_s`` gets an ``IDLE_TIMEOUT`` error
  frame and is closed with code :data:`IDLE_CLOSE_CODE`; OpenEnv then destroys its session (its own
  ``finally``), so the slot is free for the next client. A reply the client does not read within the same
  time ends the connection too. Messages above ``max_message_bytes`` and binary frames are answered with an
  error and dropped.
  Error frames are rewritten to a stable message and code (never the exception text or the client's
  input; the original goes to the server log), also in ``/mcp`` JSON-RPC answers.
* :class:`GuardedH11Protocol` (uvicorn's h11 protocol with a request-head deadline): a connection that has
  not sent a complete request head within ``header_timeout_s`` of connecting (or of starting its next
  request) gets ``408`` and is closed. uvicorn has a keep-alive timeout but no header timeout; serve with
  ``python -m envsched.envs.openenv_server`` or ``uvicorn ... --http envsched.envs.server_guard:GuardedH11Protocol``.

The request body deadline and size cap are in :mod:`envsched.envs.openenv_server` (``_BodyLimit``).
Limits and defaults: docs/limits.md, "Server".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import random
import threading
from typing import Any

from envsched.envs._settings import env_number
from envsched.validation import check_int, check_number, is_int

__all__ = [
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "IDLE_CLOSE_CODE",
    "GuardedH11Protocol",
    "WebSocketGuard",
    "current_client",
    "env_seconds",
    "field_errors",
    "in_websocket",
    "register_client_message",
    "register_field_names",
]

#: Seconds a WebSocket session may stay without a client message before it is closed (its capacity freed).
DEFAULT_IDLE_TIMEOUT_S = 60.0
#: Seconds a connection has to send a complete request head (request line and headers).
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: Largest WebSocket message accepted (bytes of text); larger ones get an error and are dropped.
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
#: WebSocket close code of a session ended for idleness (4000-4999: application codes; 408 as in HTTP).
IDLE_CLOSE_CODE = 4408

log = logging.getLogger("envsched.openenv_server")

_IN_WEBSOCKET: contextvars.ContextVar[bool] = contextvars.ContextVar("envsched_in_websocket", default=False)
_CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("envsched_client", default=None)
_CLIENT_MESSAGES: set[str] = set()
_CLIENT_MESSAGES_LOCK = threading.Lock()
_MAX_CLIENT_MESSAGES = 4096


def in_websocket() -> bool:
    """Whether the current task serves a WebSocket connection (set by :class:`WebSocketGuard`)."""
    return _IN_WEBSOCKET.get()


def current_client() -> str | None:
    """The address of the client the current task serves (set by :class:`WebSocketGuard` from the ASGI scope;
    behind a proxy, the address uvicorn's ``--proxy-headers`` put there), or ``None``."""
    return _CLIENT.get()


def register_client_message(message: str) -> str:
    """Mark ``message`` as written by the server for clients (it quotes no input), so that error frames
    carrying it are passed through; any other exception text is replaced by a stable message."""
    with _CLIENT_MESSAGES_LOCK:
        if len(_CLIENT_MESSAGES) < _MAX_CLIENT_MESSAGES:
            _CLIENT_MESSAGES.add(message)
    return message


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds, at most a day, from environment variable ``name`` (``default`` when
    unset)."""
    return env_number(name, default, high=86_400, unit="seconds")


def check_seconds(name: str, value: Any) -> float:
    """``value`` as a float in (0, 86400] seconds, else ``ValueError`` naming ``name``."""
    return check_number(value, name, low=0, high=86_400, low_open=True)


# ---------------------------------------------------------------------------- error frames
_WS_MESSAGES = {
    "INVALID_JSON": "the message is not valid JSON",
    "UNKNOWN_TYPE": "unknown message type (expected reset, step, state, close or mcp)",
    "VALIDATION_ERROR": "invalid message",
    "EXECUTION_ERROR": "internal server error",
    "FACTORY_ERROR": "the environment could not be created",
    "SESSION_ERROR": "session error",
}
_RPC_MESSAGES = {-32700: "Parse error", -32600: "Invalid Request", -32601: "Method not found",
                 -32602: "Invalid params", -32603: "Internal error", -32000: "Server error"}


def _safe(message: Any) -> bool:
    if not isinstance(message, str):
        return False
    if message.startswith("Server at capacity: ") and len(message) < 200:  # OpenEnv's, numbers only
        return True
    with _CLIENT_MESSAGES_LOCK:
        return message in _CLIENT_MESSAGES


_KNOWN_FIELDS: set[str] = {"body", "query", "path", "header", "data", "type", "action"}
_fields_loaded = False


def register_field_names(*models: Any) -> None:
    """Field names of server-side models: the only names an error location may show (a client's own key,
    e.g. an unexpected field, is shown as ``?``)."""
    for model in models:
        _KNOWN_FIELDS.update(getattr(model, "model_fields", {}))


def _known_fields() -> set[str]:
    global _fields_loaded
    if not _fields_loaded:
        _fields_loaded = True
        try:
            from openenv.core.env_server import types as openenv_types
            from pydantic import BaseModel
        except ImportError:  # pragma: no cover
            return _KNOWN_FIELDS
        register_field_names(*(v for v in vars(openenv_types).values()
                               if isinstance(v, type) and issubclass(v, BaseModel)))
    return _KNOWN_FIELDS


def field_errors(errors: Any) -> list[dict[str, Any]]:
    """Pydantic errors as ``{"loc", "type"}`` only: without ``input``/``msg``/``ctx`` (they quote the client's
    values), and with location names that are not fields of the server's models shown as ``?``."""
    known = _known_fields()
    out = []
    for e in errors if isinstance(errors, list) else []:
        if isinstance(e, dict):
            loc = [x if is_int(x, numpy=False) else (x if x in known else "?")
                   for x in (e.get("loc") or [])][:8]
            out.append({"loc": loc, "type": str(e.get("type", "invalid"))[:40]})
    return out[:10]


def sanitize_rpc_error(error: Any) -> Any:
    """A JSON-RPC error object with a stable message (by code) and no ``data``."""
    if not isinstance(error, dict):
        return error
    code = error.get("code")
    message = error.get("message")
    if not _safe(message):
        if message not in _RPC_MESSAGES.values():
            log.warning("JSON-RPC error %s replaced by a stable message: %.300r", code, message)
        message = _RPC_MESSAGES.get(code, "Server error") if isinstance(code, int) else "Server error"
    return {"code": code, "message": message, "data": None}


def sanitize_frame(text: str) -> str:
    """An outgoing WebSocket text frame with error details replaced by stable messages (other frames as is)."""
    if not text.startswith(('{"type":"error"', '{"type":"mcp"')):
        return text
    try:
        frame = json.loads(text)
    except ValueError:
        return text
    data = frame.get("data") if isinstance(frame, dict) else None
    if not isinstance(data, dict):
        return text
    if frame.get("type") == "mcp":
        if isinstance(data.get("error"), dict):
            data["error"] = sanitize_rpc_error(data["error"])
            return json.dumps(frame)
        return text
    code = data.get("code")
    message = data.get("message")
    clean: dict[str, Any] = {"code": code}
    if _safe(message):
        clean["message"] = message
    else:
        clean["message"] = _WS_MESSAGES.get(code, "request failed") if isinstance(code, str) else "request failed"
        if code != "VALIDATION_ERROR":
            log.warning("WebSocket %s error replaced by a stable message: %.300r", code, message)
    if code == "VALIDATION_ERROR":
        clean["errors"] = field_errors(data.get("errors"))
    if code == "CAPACITY_REACHED":
        for key in ("active_sessions", "max_sessions"):
            if isinstance(data.get(key), int):
                clean[key] = data[key]
    frame["data"] = clean
    return json.dumps(frame)


def _error_frame(code: str, message: str) -> dict[str, Any]:
    return {"type": "websocket.send", "text": json.dumps({"type": "error", "data": {"message": message,
                                                                                   "code": code}})}


# ---------------------------------------------------------------------------- the ASGI guard
class WebSocketGuard:
    """ASGI middleware bounding each WebSocket connection (idle time, unread replies, message size) and
    rewriting error answers (WebSocket error frames, ``/mcp`` JSON-RPC errors) to stable messages.

    Args:
        app: the ASGI app (OpenEnv's FastAPI app).
        idle_timeout_s: seconds without a client message after which the connection is closed
            (:data:`IDLE_CLOSE_CODE`); also the longest a reply may wait for the client to read it.
        max_message_bytes: largest text message passed to the app.
    """

    def __init__(self, app: Any, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.app = app
        self.idle_timeout_s = check_seconds("idle_timeout_s", idle_timeout_s)
        max_message_bytes = check_int(max_message_bytes, "max_message_bytes", low=1)
        self.max_message_bytes = max_message_bytes
        self._warned_unguarded = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        client = scope.get("client")
        token = _CLIENT.set(str(client[0]) if client else None)
        try:
            if scope["type"] == "websocket":
                await self._websocket(scope, receive, send)
            elif scope["type"] == "http" and scope.get("path") == "/mcp":
                await self._http_mcp(scope, receive, send)
            else:
                if scope["type"] == "http" and not _HeadDeadline.in_use and not self._warned_unguarded:
                    self._warned_unguarded = True
                    log.warning("served without envsched's request-head timeout: slow-header clients are not cut "
                                "off; serve with `python -m envsched.envs.openenv_server` or uvicorn "
                                "`--http envsched.envs.server_guard:GuardedH11Protocol` (docs/limits.md)")
                await self.app(scope, receive, send)
        finally:
            _CLIENT.reset(token)

    async def _websocket(self, scope: Any, receive: Any, send: Any) -> None:
        idle = self.idle_timeout_s
        limit = self.max_message_bytes
        closed = False

        async def close_idle(reason: str, *, abort: bool = False) -> None:
            nonlocal closed
            closed = True
            try:
                async with asyncio.timeout(1.0):
                    await send(_error_frame("IDLE_TIMEOUT", f"session closed: {reason}"))
                    await send({"type": "websocket.close", "code": IDLE_CLOSE_CODE, "reason": "idle timeout"})
            except (TimeoutError, OSError, RuntimeError):
                abort = True
            if abort:  # the client does not read: its socket would otherwise stay until the kernel gives up
                _abort_transport(send)

        async def guarded_receive() -> Any:
            while True:
                if closed:
                    return {"type": "websocket.disconnect", "code": IDLE_CLOSE_CODE}
                try:
                    async with asyncio.timeout(idle):
                        message = await receive()
                except TimeoutError:
                    log.info("WebSocket %s closed after %g s without a message", _peer(scope), idle)
                    await close_idle(f"no message for {idle:g} s (idle timeout)")
                    return {"type": "websocket.disconnect", "code": IDLE_CLOSE_CODE}
                if message.get("type") == "websocket.receive":
                    text = message.get("text")
                    if text is None:
                        await guarded_send(_error_frame("INVALID_MESSAGE", "binary frames are not accepted; "
                                                                           "send JSON text messages"))
                        continue
                    if len(text) > limit:  # characters >= bytes / 4; the byte count needs no encoding then
                        size = len(text.encode("utf-8", "surrogatepass")) if len(text) * 4 > limit else len(text)
                        if size > limit:
                            await guarded_send(_error_frame("MESSAGE_TOO_LARGE",
                                                            f"message larger than the limit of {limit} bytes"))
                            continue
                return message

        async def guarded_send(message: Any) -> None:
            if closed:
                return  # the guard closed the connection: the app's late close or error frames are dropped
            if message.get("type") == "websocket.send" and isinstance(message.get("text"), str):
                message = {**message, "text": sanitize_frame(message["text"])}
            try:
                async with asyncio.timeout(idle):
                    await send(message)
            except TimeoutError:
                log.info("WebSocket %s closed: a reply unread for %g s", _peer(scope), idle)
                await close_idle(f"a reply unread for {idle:g} s", abort=True)
                raise ConnectionResetError("the client did not read the reply") from None

        token = _IN_WEBSOCKET.set(True)
        try:
            await self.app(scope, guarded_receive, guarded_send)
        except Exception:
            if not closed:
                raise
        finally:
            _IN_WEBSOCKET.reset(token)

    async def _http_mcp(self, scope: Any, receive: Any, send: Any) -> None:
        """``POST /mcp`` answers JSON-RPC errors with HTTP 200: rewrite their messages like error frames."""
        start: dict[str, Any] | None = None
        chunks: list[bytes] = []

        async def buffered_send(message: Any) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(chunks)
            try:
                answer = json.loads(body)
            except ValueError:
                answer = None
            if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
                answer["error"] = sanitize_rpc_error(answer["error"])
                body = json.dumps(answer).encode()
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, buffered_send)


def _peer(scope: Any) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "(unknown peer)"


def _abort_transport(send: Any) -> None:
    """Drop the connection at once when the server exposes it (uvicorn passes its protocol's bound ``send``):
    a client that does not read would otherwise keep the socket until the kernel gives up."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    abort = getattr(transport, "abort", None)
    if callable(abort):
        with contextlib.suppress(Exception):  # best effort: the connection is being dropped anyway
            abort()


# ---------------------------------------------------------------------------- uvicorn protocol
def _h11_protocol() -> type:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol


class _HeadDeadline:
    """Mixin for uvicorn's h11 protocol: a request head must be complete ``header_timeout_s`` (up to 10 % more,
    at random) after the connection opens or after the next request's first byte; else ``408`` and the
    connection is closed."""

    header_timeout_s: float | None = None
    in_use = False  # set once a connection is served through this protocol (for the warning above)
    timeouts = 0  # connections closed for a late request head (process-wide count, for tests/benchmarks)

    def _head_timeout_s(self) -> float:
        """The deadline, plus up to 10 % at random: connections opened together (a slowloris burst) are then
        cut off over a spread of time instead of in one event-loop turn that would delay every other client."""
        seconds = self.header_timeout_s
        if seconds is None:
            seconds = env_seconds("ENVSCHED_OPENENV_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S)
        return seconds * (1.0 + 0.1 * random.random())

    def connection_made(self, transport: Any) -> None:
        _HeadDeadline.in_use = True
        super().connection_made(transport)  # type: ignore[misc]
        self._head_timer = self.loop.call_later(self._head_timeout_s(), self._head_late)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle  # type: ignore[attr-defined]
        if self._head_timer is None and (cycle is None or cycle.response_complete):
            # the first bytes of the next request on a kept-alive connection
            self._head_timer = self.loop.call_later(self._head_timeout_s(), self._head_late)  # type: ignore[attr-defined]
        super().data_received(data)  # type: ignore[misc]

    def handle_events(self) -> None:
        super().handle_events()  # type: ignore[misc]
        cycle = self.cycle  # type: ignore[attr-defined]
        upgraded = self.transport.get_protocol() is not self  # type: ignore[attr-defined]
        if self._head_timer is not None and (upgraded or (cycle is not None and not cycle.response_complete)):
            self._head_timer.cancel()  # the head is complete (a request is being served, or a WebSocket)
            self._head_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        cycle = self.cycle  # type: ignore[attr-defined]
        pending = self.conn.trailing_data[0]  # type: ignore[attr-defined]  # part of a next request, pipelined
        if (self._head_timer is None and pending and not self.transport.is_closing()  # type: ignore[attr-defined]
                and (cycle is None or cycle.response_complete)):
            self._head_timer = self.loop.call_later(self._head_timeout_s(), self._head_late)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def _head_late(self) -> None:
        self._head_timer = None
        transport = self.transport  # type: ignore[attr-defined]
        if transport.is_closing() or transport.get_protocol() is not self:
            return
        _HeadDeadline.timeouts += 1
        body = b"request head not received in time"
        transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                        b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        transport.close()


class GuardedH11Protocol(_HeadDeadline, _h11_protocol()):  # type: ignore[misc]
    """uvicorn's h11 HTTP protocol with a request-head deadline (``ENVSCHED_OPENENV_HEADER_TIMEOUT_S``,
    default :data:`DEFAULT_HEADER_TIMEOUT_S`). Use it with ``uvicorn --http
    envsched.envs.server_guard:GuardedH11Protocol`` or :func:`guarded_protocol` for another deadline."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None


def guarded_protocol(header_timeout_s: float) -> type:
    """A :class:`GuardedH11Protocol` with its own request-head deadline."""
    seconds = check_seconds("header_timeout_s", header_timeout_s)
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": seconds})
