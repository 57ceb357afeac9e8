"""OpenEnv: a client for the Task API routes and an episode runner over OpenEnv's WebSocket session.

:class:`TaskAPIClient` reads task metadata over HTTP (the RFC 013 client: ``list_splits``, ``list_tasks``,
``num_tasks``, ``get_task``, ``get_task_range``, ``iter_tasks``). It needs only the standard library, so
task discovery works without the ``openenv`` package. Errors follow the RFC: HTTP 501 raises
``NotImplementedError``, HTTP 400 ``IndexError`` (an index or range out of bounds, an unknown split),
HTTP 404 ``LookupError`` (wrong environment name), any other 4xx :class:`TaskAPIRequestError` (a
``ValueError``): every 4xx is the caller's mistake. A server that cannot be reached (or answers 5xx)
raises :class:`~envsched.envs.base.InfrastructureError`.

:class:`OpenEnvEnvironment` runs episodes over the server's ``/ws`` session with ``openenv``'s
``GenericEnvClient`` (PyPI ``openenv==0.10.0``; never ``openenv-core``, which owns the same import
package). Each episode opens a fresh connection and sends ``reset(split=..., index=..., seed=...)``, so
the environment -- not the client -- decides the task's content. A lost connection, ``CAPACITY_REACHED``,
a session/factory error or a timeout raise :class:`InfrastructureError`; an action the server rejects
as invalid raises :class:`InvalidActionError` (the policy's fault); an exception inside the environment
raises :class:`OpenEnvServerError`.

Note: OpenEnv's HTTP ``/reset`` and ``/step`` routes are stateless (each request builds a new env), so
episodes only ever run over ``/ws``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from http.client import HTTPException
from typing import Any

from envsched.envs.base import Environment, EnvironmentUnavailable, InfrastructureError, StepResult
from envsched.errors import EnvSchedError
from envsched.validation import check_int, check_number

__all__ = [
    "InvalidActionError",
    "OpenEnvEnvironment",
    "OpenEnvServerError",
    "TaskAPIClient",
    "TaskAPIError",
    "TaskAPIRequestError",
    "http_base_url",
    "selection_kwargs",
    "with_port",
]

#: WebSocket error codes that mean the infrastructure (not the policy, not the task) failed.
INFRA_CODES = frozenset({"CAPACITY_REACHED", "SESSION_ERROR", "FACTORY_ERROR"})
_TEXT_FIELDS: dict[str, str] = {}
_SERVER_ERROR = re.compile(r"Server error: (?P<message>.*) \(code: (?P<code>[A-Z_]+)\)\s*$", re.S)


class TaskAPIError(InfrastructureError):
    """The Task API answered with a server error (HTTP 5xx other than 501) or an unreadable body."""

    def __init__(self, message: str, *, status: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class TaskAPIRequestError(EnvSchedError, ValueError):
    """The Task API refused the request as the caller's mistake (HTTP 4xx other than 400, 404 and 501):
    a bad field, a body too large, ... Not an infrastructure failure: retrying does not help."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class OpenEnvServerError(EnvSchedError, RuntimeError):
    """The environment raised inside ``reset``/``step`` (WS ``EXECUTION_ERROR``): the episode is unscored."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class InvalidActionError(EnvSchedError, ValueError):
    """The server rejected the action as invalid (WS ``VALIDATION_ERROR``): a failure of the policy."""


def http_base_url(url: str) -> str:
    """The HTTP base of an OpenEnv server from any form users give: ``http(s)://host:port[/path]``,
    ``ws(s)://host:port[/path]/ws`` or ``host:port``. Paths (a server behind a prefix) are kept;
    a trailing ``/ws`` is removed."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"an OpenEnv base URL must be a non-empty string, got {url!r}")
    raw = url.strip()
    if "://" not in raw:
        raw = "http://" + raw
    parts = urllib.parse.urlsplit(raw)
    scheme = {"ws": "http", "wss": "https", "http": "http", "https": "https"}.get(parts.scheme.lower())
    if scheme is None:
        raise ValueError(f"unsupported scheme {parts.scheme!r} in OpenEnv URL {url!r} "
                         "(use http://, https://, ws:// or wss://)")
    if not parts.hostname:
        raise ValueError(f"OpenEnv URL {url!r} names no host")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ValueError(f"OpenEnv URL {url!r} has an invalid port: {exc}") from None
    path = parts.path.rstrip("/")
    if path.endswith("/ws"):
        path = path[:-3]
    return urllib.parse.urlunsplit((scheme, parts.netloc, path, "", ""))


def with_port(url: str, port: int | None) -> str:
    """``openenv collect``'s ``--llm-port``: ``port`` is added to ``url`` when the URL names none."""
    if port is None:
        return url
    port = check_int(port, "port", low=1, high=65535)
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or parts.port is not None:
        return url
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    auth = parts.netloc.rpartition("@")[0]
    netloc = (auth + "@" if auth else "") + f"{host}:{port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def selection_kwargs(task: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``reset`` keys that select ``task`` (RFC 013): its ``split`` and ``index``, over ``base``."""
    kwargs = dict(base or {})
    for key in ("split", "index"):
        if task.get(key) is not None:
            kwargs[key] = task[key]
    return kwargs


def _detail(body: bytes) -> Any:
    try:
        data = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return body.decode("utf-8", "replace")[:500]
    return data.get("detail", data) if isinstance(data, dict) else data


class TaskAPIClient:
    """RFC 013's client for an OpenEnv server's Task API.

    Args:
        base_url: the server (``http://127.0.0.1:8000``, a ``ws://.../ws`` URL, a base with a path prefix).
        env_name: the environment name the routes are keyed by. Pass it explicitly: environments rename
            it (``reasoning_gym`` is served as ``reasoning_gym_env``); :meth:`list_environments` lists them.
        timeout_s: per-request timeout.
    """

    def __init__(self, base_url: str, env_name: str, *, timeout_s: float = 30.0) -> None:
        if not isinstance(env_name, str) or not env_name.strip():
            raise ValueError(f"env_name must be a non-empty string, got {env_name!r}")
        check_number(timeout_s, "timeout_s", low=0, low_open=True, finite=False)
        self.base_url = http_base_url(base_url)
        self.env_name = env_name.strip()
        self.timeout_s = float(timeout_s)

    def __repr__(self) -> str:
        return f"TaskAPIClient({self.base_url!r}, env_name={self.env_name!r})"

    @classmethod
    def from_env_client(cls, env: Any, env_name: str | None = None, *, timeout_s: float = 30.0) -> TaskAPIClient:
        """A client for the server an ``openenv`` ``EnvClient`` (or its ``.sync()`` wrapper, or an
        :class:`OpenEnvEnvironment`) talks to; the HTTP base is derived from its ``ws://`` URL. Without
        ``env_name`` the server must serve exactly one environment."""
        inner = getattr(env, "async_client", env)
        url = (getattr(inner, "base_url", None) or getattr(inner, "_base_url", None)
               or getattr(inner, "_ws_url", None))
        if not isinstance(url, str) or not url:
            raise ValueError(f"cannot derive a base URL from {type(env).__name__}: it has no base_url/_ws_url")
        if env_name is None:
            names = cls.list_environments(url, timeout_s=timeout_s)
            if len(names) != 1:
                raise ValueError(f"the server at {http_base_url(url)} serves {names!r}: pass env_name")
            env_name = names[0]
        return cls(url, env_name, timeout_s=timeout_s)

    @staticmethod
    def list_environments(base_url: str, *, timeout_s: float = 30.0) -> list[str]:
        """Names the server's Task API is keyed by (``GET /list_environments``)."""
        data = _http_json("GET", http_base_url(base_url) + "/list_environments", None, timeout_s, "list_environments")
        if not isinstance(data, list):
            raise TaskAPIError(f"/list_environments returned {type(data).__name__}, expected a list")
        return [str(x) for x in data]

    # ------------------------------------------------------------------ the routes
    def _call(self, method: str, route: str, body: dict[str, Any] | None = None) -> Any:
        url = f"{self.base_url}/{urllib.parse.quote(self.env_name)}/{route}"
        return _http_json(method, url, body, self.timeout_s, f"{self.env_name}/{route}")

    def list_splits(self) -> list[dict[str, str]]:
        """The splits the environment serves, as ``[{"name": ..., "type": ...}, ...]``."""
        data = self._call("GET", "splits")
        if not isinstance(data, list):
            raise TaskAPIError(f"{self.env_name}/splits returned {type(data).__name__}, expected a list")
        return data

    def list_tasks(self, split: str) -> list[Any]:
        """The tasks of ``split`` as the server lists them (may be a bounded preview: use :meth:`iter_tasks`)."""
        return self._field(self._call("POST", "tasks", {"split": _split(split)}), "tasks", list)

    def num_tasks(self, split: str) -> int:
        """Number of tasks in ``split``."""
        n = self._field(self._call("POST", "num_tasks", {"split": _split(split)}), "num_tasks", int)
        if n < 0:
            raise TaskAPIError(f"{self.env_name}/num_tasks returned a negative count {n}")
        return n

    def get_task(self, split: str, index: int) -> Any:
        """The task at ``index`` of ``split``; ``IndexError`` when out of range (HTTP 400)."""
        index = check_int(index, "index")
        return self._field(self._call("POST", "task", {"split": _split(split), "index": index}), "task", object)

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[Any]:
        """Tasks ``[start:stop]`` of ``split`` (slice semantics)."""
        body: dict[str, Any] = {"split": _split(split)}
        for key, value in (("start", start), ("stop", stop)):
            if value is not None:
                body[key] = check_int(value, f"{key} (or None)")
        return self._field(self._call("POST", "task_range", body), "tasks", list)

    def iter_tasks(self, split: str, page_size: int = 256) -> Iterator[Any]:
        """Every task of ``split``: pages through ``task_range`` with ``num_tasks`` as the total."""
        page_size = check_int(page_size, "page_size", low=1)
        total = self.num_tasks(split)
        start = 0
        while start < total:
            page = self.get_task_range(split, start, min(start + page_size, total))
            if not page:
                raise TaskAPIError(f"{self.env_name}: task_range [{start}, {min(start + page_size, total)}) "
                                   f"of split {split!r} came back empty although num_tasks is {total}")
            yield from page
            start += len(page)

    def _field(self, data: Any, key: str, kind: type) -> Any:
        if not isinstance(data, dict) or key not in data:
            raise TaskAPIError(f"{self.env_name}: malformed Task API response, no {key!r} in {str(data)[:200]}")
        value = data[key]
        if kind is not object and (not isinstance(value, kind) or isinstance(value, bool)):
            raise TaskAPIError(f"{self.env_name}: {key!r} is {type(value).__name__}, expected {kind.__name__}")
        return value


def _split(split: str) -> str:
    if not isinstance(split, str) or not split:
        raise ValueError(f"split must be a non-empty string, got {split!r}")
    return split


def _http_json(method: str, url: str, body: dict[str, Any] | None, timeout_s: float, what: str) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        detail = _detail(exc.read() or b"")
        status = exc.code
        if status == 501:
            raise NotImplementedError(f"{what}: the server does not implement this Task API method "
                                      f"(HTTP 501): {detail}") from None
        if status == 400:
            raise IndexError(f"{what}: {detail}") from None
        if status == 404:
            raise LookupError(f"{what}: not found (HTTP 404): {detail}. Either the environment name is wrong "
                              "(see TaskAPIClient.list_environments) or the server predates the Task API "
                              "(openenv-core 0.3.0)") from None
        if 400 <= status < 500:  # 409, 413, 422, ...: the caller's mistake, not the infrastructure's
            raise TaskAPIRequestError(f"{what}: the server refused the request (HTTP {status}): {detail}",
                                      status=status) from None
        raise TaskAPIError(f"{what}: server error HTTP {status}: {detail}", status=status, detail=detail) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InfrastructureError(f"{what}: cannot reach the OpenEnv server at {url}: {reason}") from exc
    try:
        return json.loads(raw)
    except ValueError:
        raise TaskAPIError(f"{what}: the server's answer is not JSON: {raw[:200]!r}") from None


def _require_openenv() -> Any:
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise EnvironmentUnavailable(
            "the OpenEnv episode runner needs the `openenv` package: pip install 'envsched[openenv]' "
            "(which pins openenv==0.10.0; do not install openenv-core next to it)") from exc
    return GenericEnvClient


class OpenEnvEnvironment(Environment):
    """Runs episodes of an OpenEnv environment over its WebSocket session.

    ``reset(task, seed)`` opens a fresh session and sends ``reset(split=task["split"],
    index=task["index"], seed=seed, **reset_kwargs)`` (only the keys the task has). ``step(action)``
    sends a dict action as is; a string is wrapped into the action's single text field (read from the
    server's ``/schema``, or ``text_field``). :meth:`final_reward` is the reward of the step that ended
    the episode (``None`` if the environment could not score it or the episode is not over).

    Args:
        base_url: the server (any form :func:`http_base_url` accepts).
        env_name: Task API name (only used by :attr:`task_client`).
        connect_timeout_s, message_timeout_s: WebSocket timeouts (a timeout is an infrastructure error).
        reset_kwargs: extra keys for every ``reset`` (the environment drops keys its ``reset`` does not declare).
        text_field: the action field a text answer goes into (default: discovered from ``/schema``).
    """

    name = "openenv"

    def __init__(self, base_url: str, env_name: str | None = None, *, connect_timeout_s: float = 10.0,
                 message_timeout_s: float = 60.0, reset_kwargs: Mapping[str, Any] | None = None,
                 text_field: str | None = None) -> None:
        self.base_url = http_base_url(base_url)
        self.env_name = env_name
        check_number(connect_timeout_s, "connect_timeout_s", low=0, low_open=True, finite=False)
        check_number(message_timeout_s, "message_timeout_s", low=0, low_open=True, finite=False)
        self.connect_timeout_s = float(connect_timeout_s)
        self.message_timeout_s = float(message_timeout_s)
        self.reset_kwargs = dict(reset_kwargs or {})
        self._text_field = text_field
        self._client: Any = None
        self._socket: Any = None
        self._done = False
        self._reward: float | None = None
        self.steps = 0

    def __repr__(self) -> str:
        return f"OpenEnvEnvironment({self.base_url!r}, env_name={self.env_name!r})"

    @property
    def task_client(self) -> TaskAPIClient:
        """A :class:`TaskAPIClient` for the same server."""
        if self.env_name is None:
            return TaskAPIClient.from_env_client(self)
        return TaskAPIClient(self.base_url, self.env_name)

    # ------------------------------------------------------------------ schema
    def action_schema(self) -> dict[str, Any]:
        """The action's JSON schema (``GET /schema``)."""
        data = _http_json("GET", self.base_url + "/schema", None, self.connect_timeout_s, "schema")
        if not isinstance(data, dict) or not isinstance(data.get("action"), dict):
            raise TaskAPIError(f"/schema at {self.base_url} has no action schema")
        return data["action"]

    @property
    def text_field(self) -> str:
        """The action field a text answer is sent in: the schema's single required string field
        (read once per server and cached)."""
        if self._text_field is None:
            cached = _TEXT_FIELDS.get(self.base_url)
            if cached is None:
                schema = self.action_schema()
                props = schema.get("properties", {})
                required = [k for k in schema.get("required", []) if k != "metadata"]
                strings = [k for k in (required or props)
                           if k != "metadata" and props.get(k, {}).get("type") == "string"]
                if len(strings) != 1:
                    raise ValueError(f"cannot tell which action field takes a text answer from the schema "
                                     f"{sorted(props)}; pass text_field=... or send dict actions")
                cached = _TEXT_FIELDS[self.base_url] = strings[0]
            self._text_field = cached
        return self._text_field

    # ------------------------------------------------------------------ episodes
    def reset(self, task: Mapping[str, Any], seed: int | None = None) -> Any:
        if not isinstance(task, Mapping):
            raise TypeError(f"task must be a task spec (a mapping), got {type(task).__name__}")
        kwargs = selection_kwargs(task, self.reset_kwargs)
        if seed is not None:
            kwargs["seed"] = check_int(seed, "seed", low=0)
        self._disconnect()
        generic_client = _require_openenv()
        with contextlib.suppress(ValueError):  # resolve the text field now (cached), not mid-episode
            _ = self.text_field
        self._done, self._reward, self.steps = False, None, 0
        client = generic_client(base_url=self.base_url, connect_timeout_s=self.connect_timeout_s,
                                message_timeout_s=self.message_timeout_s).sync()
        self._client = client
        result = self._guard(lambda: client.reset(**kwargs), "reset")
        self._socket = _socket_of(client)
        self._done = bool(result.done)
        self._reward = _reward(result.reward)
        return result.observation

    def step(self, action: Any) -> StepResult:
        if self._client is None:
            raise RuntimeError("step() before reset(): start an episode first")
        if self._done:
            raise RuntimeError("the episode is over; reset() to start another")
        payload = {self.text_field: action} if isinstance(action, str) else action
        if not isinstance(payload, Mapping):
            raise TypeError(f"an OpenEnv action must be a dict or a text answer, got {type(action).__name__}")
        client = self._client
        self._check_session("step")
        try:
            result = self._guard(lambda: client.step(dict(payload)), "step")
        except (OpenEnvServerError, InvalidActionError):
            self._check_session("step")  # a silent reconnect answers "step before reset": that is a lost session
            raise
        self._check_session("step")
        self.steps += 1
        self._done = bool(result.done)
        self._reward = _reward(result.reward)
        return StepResult(result.observation, self._reward, self._done, {"metadata": result.metadata or {}})

    def final_reward(self) -> float | None:
        return self._reward if self._done else None

    def _check_session(self, what: str) -> None:
        """OpenEnv's client reconnects silently when its socket closed, which would send this step to a
        new session that never saw the reset: treat a replaced or closed socket as a lost connection."""
        ws = _socket_of(self._client)
        if self._socket is not None and (ws is not self._socket or _closed(ws)):
            self._disconnect()
            raise InfrastructureError(f"OpenEnv {what} at {self.base_url}: the WebSocket session was lost "
                                      "mid-episode (the server closed the connection)")

    def close(self) -> None:
        self._disconnect()

    def _disconnect(self) -> None:
        client, self._client, self._socket = self._client, None, None
        if client is not None:
            with contextlib.suppress(Exception):  # best effort: the server may be gone already
                client.close()

    def _guard(self, call: Any, what: str) -> Any:
        """Run one WS exchange, mapping failures to envsched's error classes."""
        try:
            return call()
        except RuntimeError as exc:
            m = _SERVER_ERROR.match(str(exc))
            if m is None:
                self._disconnect()
                raise InfrastructureError(f"OpenEnv {what} at {self.base_url} failed: {exc}") from exc
            code, message = m.group("code"), m.group("message")
            if code in INFRA_CODES:
                self._disconnect()
                raise InfrastructureError(f"OpenEnv {what} at {self.base_url}: {code}: {message}") from exc
            if code == "VALIDATION_ERROR":
                raise InvalidActionError(f"OpenEnv rejected the {what}: {message}") from exc
            raise OpenEnvServerError(f"OpenEnv {what} failed in the environment: {code}: {message}", code) from exc
        except (TimeoutError, ConnectionError, OSError, asyncio.CancelledError,
                concurrent.futures.CancelledError) as exc:
            self._disconnect()
            kind = "timed out" if isinstance(exc, TimeoutError) else "lost the connection"
            raise InfrastructureError(f"OpenEnv {what} at {self.base_url} {kind}: "
                                      f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            if _is_connection_closed(exc):
                self._disconnect()
                raise InfrastructureError(f"OpenEnv {what} at {self.base_url} lost the connection: {exc}") from exc
            raise


def _socket_of(client: Any) -> Any:
    inner = getattr(client, "async_client", client)
    return getattr(inner, "_ws", None)


def _closed(ws: Any) -> bool:
    if ws is None:
        return True
    state = getattr(ws, "state", None)
    return getattr(state, "name", "OPEN") in ("CLOSING", "CLOSED")


def _is_connection_closed(exc: BaseException) -> bool:
    try:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, ConnectionClosed | InvalidHandshake)


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise OpenEnvServerError(f"the environment returned a non-numeric reward {value!r}", "BAD_REWARD") from None
