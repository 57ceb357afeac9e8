"""Hostile requests to envsched's OpenEnv server (Task API, WebSocket sessions, slow clients): a 4xx answer or an
error frame naming the problem without quoting the input, slow or idle clients cut off, and the server keeps serving
correctly afterwards."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("openenv", reason="needs the openenv extra")

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from envsched.envs.openenv_server import ServerThread, make_app
from envsched.envs.server_guard import IDLE_CLOSE_CODE
from envsched.pool import TaskPool


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    pool = TaskPool([{"id": f"t{i}", "env": "qa", "split": "test", "index": i,
                      "initial_state": {"question": f"q{i}", "answer": "a"}} for i in range(5)])
    with ServerThread(make_app(pool, env_name="qa")) as srv:
        yield srv.url


def _post(url: str, route: str, body: bytes) -> tuple[int, Any]:
    req = urllib.request.Request(f"{url}/qa/{route}", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return exc.code, json.loads(text)
        except ValueError:
            return exc.code, text.decode(errors="replace")


HOSTILE = {
    "negative index": ("task", {"split": "test", "index": -1}, 400, "Invalid task index"),
    "index past the end": ("task", {"split": "test", "index": 5}, 400, "Invalid task index"),
    "30-digit index": ("task", {"split": "test", "index": 10**30}, 400, "Invalid task index"),
    # the hardened server (openenv_server.harden_app) names the field and the kind of mistake, never the input
    "fractional index": ("task", {"split": "test", "index": 1.5}, 422, "index (int_from_float)"),
    "split a number": ("task", {"split": 5, "index": 0}, 422, "split (string_type)"),
    "split missing": ("task", {"index": 0}, 422, "split (missing)"),
    "body null": ("task", None, 422, "body (model_attributes_type)"),
    "body a list": ("task", [1, 2], 422, "body (model_attributes_type)"),
    "range start a string": ("task_range", {"split": "test", "start": "a"}, 422, "start (int_parsing)"),
    "split a list": ("tasks", {"split": ["test"]}, 422, "split (string_type)"),
    "num_tasks split an object": ("num_tasks", {"split": {"a": 1}}, 422, "split (string_type)"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_request_gets_a_4xx_naming_the_problem(server: str, case: str) -> None:
    route, body, status, words = HOSTILE[case]
    code, answer = _post(server, route, json.dumps(body).encode())
    assert code == status, answer
    assert words in json.dumps(answer)
    assert _post(server, "task", b'{"split": "test", "index": 2}') == (
        200, {"task": {"id": "t2", "env": "qa", "split": "test", "index": 2, "initial_state": {"question": "q2"}}})


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b'{"split": "test", "index": 1', b""])
def test_body_that_is_not_json(server: str, raw: bytes) -> None:
    code, answer = _post(server, "task", raw)
    assert code == 422 and ("json_invalid" in json.dumps(answer) or "missing" in json.dumps(answer)), answer
    assert "not json" not in json.dumps(answer)  # the input is not echoed


def test_huge_range_is_refused_not_allocated(server: str) -> None:
    code, answer = _post(server, "task_range", json.dumps({"split": "test", "start": -10**30,
                                                           "stop": 10**30}).encode())
    assert code == 400, answer
    assert str(10**30) not in json.dumps(answer)  # refused with a short message, the input not echoed
    code, answer = _post(server, "task_range", json.dumps({"split": "test", "start": 0, "stop": 5}).encode())
    assert code == 200 and [t["id"] for t in answer["tasks"]] == [f"t{i}" for i in range(5)]


def test_unknown_split_is_a_4xx(server: str) -> None:
    code, answer = _post(server, "num_tasks", b'{"split": "nope"}')
    assert 400 <= code < 500, answer


# ---------------------------------------------------------------------------- per-client bounds (issue 23, finding 4)
# A second server with short limits: idle WebSocket sessions end after 2 s, a request head must arrive within 1 s and
# a body within 2 s. Each crafted input below gets a stable error code and message that never quotes it (MARK), and
# the server keeps serving.

MARK = "ZZ-MARK-4c1d"
RESET = json.dumps({"type": "reset", "data": {"split": "test", "index": 1}})
STEP = json.dumps({"type": "step", "data": {"answer": "a"}})


@pytest.fixture(scope="module")
def guarded() -> Iterator[ServerThread]:
    pool = TaskPool([{"id": f"t{i}", "env": "qa", "split": "test", "index": i,
                      "initial_state": {"question": f"q{i}", "answer": "a"}} for i in range(5)])
    app = make_app(pool, env_name="qa", max_concurrent_envs=16, idle_timeout_s=2.0, body_timeout_s=2.0)
    with ServerThread(app, header_timeout_s=1.0) as srv:
        yield srv


def _ws_url(srv: ServerThread, query: str = "") -> str:
    return srv.url.replace("http://", "ws://") + "/ws" + query


def _reply(ws: Any) -> tuple[str, dict[str, Any]]:
    raw = ws.recv(timeout=15)
    return raw, json.loads(raw)


def _deep(n: int) -> str:
    return "[" * n + "]" * n


# name: (frame, error code, words of the message or None, whether the server then closes the connection)
WS_FRAMES: dict[str, tuple[str | bytes, str, str | None, bool]] = {
    "not JSON": (MARK + "{", "INVALID_JSON", "not valid JSON", False),
    "truncated JSON": ('{"type": "reset", "data": {"index": "' + MARK, "INVALID_JSON", "not valid JSON", False),
    "a JSON array": (json.dumps([1, MARK]), "SESSION_ERROR", "session error", True),
    "a JSON string": (json.dumps(MARK), "SESSION_ERROR", "session error", True),
    "a JSON number": ("5", "SESSION_ERROR", "session error", True),
    "JSON null": ("null", "SESSION_ERROR", "session error", True),
    "nested 400,000 deep": (_deep(400_000), "SESSION_ERROR", "session error", True),
    "unknown type": (json.dumps({"type": MARK}), "UNKNOWN_TYPE", "unknown message type", False),
    "type a number": (json.dumps({"type": 5, "x": MARK}), "UNKNOWN_TYPE", "unknown message type", False),
    "type a list": (json.dumps({"type": ["reset", MARK]}), "UNKNOWN_TYPE", "unknown message type", False),
    "reset index a string": (json.dumps({"type": "reset", "data": {"split": "test", "index": MARK}}),
                             "EXECUTION_ERROR", "index must be an integer", False),
    "reset index negative": (json.dumps({"type": "reset", "data": {"split": "test", "index": -1}}),
                             "EXECUTION_ERROR", "task index out of range", False),
    "reset index 10**30": (json.dumps({"type": "reset", "data": {"split": "test", "index": 10**30}}),
                           "EXECUTION_ERROR", "task index out of range", False),
    "reset index a float": (json.dumps({"type": "reset", "data": {"split": "test", "index": 1.5}}),
                            "EXECUTION_ERROR", "index must be an integer", False),
    "reset unknown split": (json.dumps({"type": "reset", "data": {"split": MARK, "index": 0}}),
                            "EXECUTION_ERROR", "unknown split", False),
    "reset split an object": (json.dumps({"type": "reset", "data": {"split": {"a": MARK}, "index": 0}}),
                              "EXECUTION_ERROR", "unknown split", False),
    "reset seed negative": (json.dumps({"type": "reset", "data": {"seed": -5}}),
                            "EXECUTION_ERROR", "seed must be >= 0", False),
    "reset seed a string": (json.dumps({"type": "reset", "data": {"seed": MARK}}),
                            "EXECUTION_ERROR", "seed must be an integer", False),
    "reset data a list": (json.dumps({"type": "reset", "data": [MARK]}), "VALIDATION_ERROR", "invalid message",
                          False),
    "reset data a string": (json.dumps({"type": "reset", "data": MARK}), "VALIDATION_ERROR", "invalid message",
                            False),
    "step answer a number": (json.dumps({"type": "step", "data": {"answer": 12345}}), "VALIDATION_ERROR",
                             "invalid message", False),
    "step answer null": (json.dumps({"type": "step", "data": {"answer": None}}), "VALIDATION_ERROR",
                         "invalid message", False),
    "step extra field": (json.dumps({"type": "step", "data": {"answer": "a", MARK: MARK}}), "VALIDATION_ERROR",
                         "invalid message", False),
    "step without data": (json.dumps({"type": "step"}), "VALIDATION_ERROR", "invalid message", False),
    "step answer an object": (json.dumps({"type": "step", "data": {"answer": {"x": MARK}}}), "VALIDATION_ERROR",
                              "invalid message", False),
    "message over the size limit": (json.dumps({"type": "step", "data": {"answer": MARK * 100_000}}),
                                    "MESSAGE_TOO_LARGE", "larger than the limit of 1048576 bytes", False),
    "binary frame": (MARK.encode() + b"\x00\xff", "INVALID_MESSAGE", "binary frames are not accepted", False),
    "mcp request invalid": (json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "method": 7, MARK: 1, "id": 1}}),
                            "", None, False),
    "mcp tools/call": (json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/call", "id": 2,
                                                           "params": {"name": MARK, "arguments": {"a": MARK}}}}),
                       "", None, False),
}


@pytest.mark.parametrize("case", sorted(WS_FRAMES))
def test_hostile_websocket_frame_gets_a_stable_error_without_echo(guarded: ServerThread, case: str) -> None:
    frame, code, words, closes = WS_FRAMES[case]
    with connect(_ws_url(guarded), max_size=None) as ws:
        ws.send(RESET)
        assert _reply(ws)[1]["type"] == "observation"
        ws.send(frame)
        raw, reply = _reply(ws)
        assert MARK not in raw and "Traceback" not in raw and "validation error" not in raw and len(raw) < 600, raw
        if code:  # an OpenEnv error frame
            assert reply["type"] == "error" and reply["data"]["code"] == code, raw
            assert words in reply["data"]["message"], raw
        else:  # a JSON-RPC answer inside an mcp frame: the standard message of its code, no data
            assert reply["type"] == "mcp" and set(reply["data"]["error"]) == {"code", "message", "data"}, raw
            assert reply["data"]["error"]["data"] is None
        if closes:
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=15)
        else:  # the same session still runs its episode
            ws.send(STEP)
            assert _reply(ws)[1]["data"]["reward"] == 1.0
    with connect(_ws_url(guarded)) as ws:  # and the server serves the next client
        ws.send(RESET)
        assert _reply(ws)[1]["data"]["observation"]["task_id"] == "t1"


@pytest.mark.parametrize("query", [f"?session_id={MARK}", "?session_id=", "?session_id=" + "9" * 2000])
def test_attaching_to_an_unknown_session_is_refused_without_echo(guarded: ServerThread, query: str) -> None:
    with connect(_ws_url(guarded, query)) as ws:
        if not query.endswith("="):
            raw = ws.recv(timeout=15)
            assert json.loads(raw)["data"] == {"code": "SESSION_ERROR", "message": "session error"}
            assert MARK not in raw and "9999" not in raw
        else:  # an empty id: a new session of its own
            ws.send(RESET)
            assert json.loads(ws.recv(timeout=15))["type"] == "observation"


def _raw_reply(port: int, first: bytes, drip: bytes = b"", every_s: float = 0.3) -> tuple[bytes, float]:
    """Send ``first``, then ``drip`` one byte every ``every_s`` seconds; what the server answers and when."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        try:
            sock.sendall(first)
            for b in drip:
                time.sleep(every_s)
                sock.sendall(bytes([b]))
        except OSError:
            pass  # the server closed the connection while we dripped
        data = b""
        while True:
            try:
                part = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not part:
                break
            data += part
    return data, time.monotonic() - t0


SLOW_CLIENTS = {
    "connects and sends nothing": (b"", b"", "408"),
    "half a request line": (b"GET /hea", b"", "408"),
    "headers dripped": (b"GET /health HTTP/1.1\r\n", b"Host: x\r\nX-A: " + b"y" * 40 + b"\r\n\r\n", "408"),
    "head without its final CRLF": (b"GET /health HTTP/1.1\r\nHost: x\r\n", b"", "408"),
    "WebSocket upgrade dripped": (b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n",
                                  b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n", "408"),
    "body declared, never sent": (b"POST /qa/num_tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: 100\r\n\r\n{", b"", "408"),
    "chunked body stalls": (b"POST /qa/num_tasks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"sp",
                            b"", "408"),
    "body dripped past the deadline": (b"POST /qa/num_tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n",
                                       b'{"split": "test"}' + b" " * 23, "408"),
    "keep-alive, then a partial second request": (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /heal", b"", "408"),
    "a 200 KB header": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"z" * 200_000 + b"\r\n\r\n", b"", "400"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SLOW_CLIENTS))
def test_slow_or_stalled_client_is_cut_off(guarded: ServerThread, case: str) -> None:
    first, drip, status = SLOW_CLIENTS[case]
    data, elapsed = _raw_reply(guarded.port, first, drip)
    last = data[data.rfind(b"HTTP/1.1 "):] if data else b""
    assert last.startswith(f"HTTP/1.1 {status}".encode()), data[-300:]
    assert elapsed < 15, elapsed  # a hang guard: the limits are 1 s (head) and 2 s (body)
    assert b"zzzz" not in data and b"split" not in data  # the request is not echoed
    code, answer = _get_health(guarded.url)
    assert code == 200 and answer == {"status": "healthy"}


def _get_health(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url + "/health", timeout=10) as resp:
        return resp.status, json.loads(resp.read())


def test_two_hundred_slow_header_connections_are_cut_off_while_health_answers(guarded: ServerThread) -> None:
    socks = [socket.create_connection(("127.0.0.1", guarded.port), timeout=20) for _ in range(200)]
    try:
        for s in socks:
            s.sendall(b"GET /health HTTP/1.1\r\nHo")
        assert _get_health(guarded.url)[0] == 200  # served while they are all connected
        t0 = time.monotonic()
        replies = [s.recv(200) for s in socks]  # each answered 408 once its head deadline passes
        assert all(r.startswith(b"HTTP/1.1 408") for r in replies), {r[:20] for r in replies}
        assert time.monotonic() - t0 < 15
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("body", [
    json.dumps({"jsonrpc": "2.0", "method": 5, "id": 1, MARK: MARK}).encode(),
    b"{" + MARK.encode(),
    json.dumps({"jsonrpc": "2.0", "method": "tools/call", "id": 1, "params": {"name": MARK}}).encode(),
    json.dumps({"jsonrpc": "2.0", "method": MARK, "id": 1}).encode(),
    json.dumps({"jsonrpc": "2.0", "method": "tools/list", "id": 1, "params": MARK}).encode(),
])
def test_mcp_errors_do_not_echo(guarded: ServerThread, body: bytes) -> None:
    req = urllib.request.Request(guarded.url + "/mcp", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read().decode()
    answer = json.loads(raw)
    assert MARK not in raw and "validation error" not in raw and answer["error"]["data"] is None, raw
    assert answer["error"]["message"] in ("Parse error", "Invalid Request", "Method not found", "Invalid params",
                                          "Internal error", "Server error"), raw


@pytest.mark.slow
def test_a_client_that_never_sends_a_message_is_closed_with_the_idle_code(guarded: ServerThread) -> None:
    with connect(_ws_url(guarded)) as ws:
        t0 = time.monotonic()
        raw = ws.recv(timeout=15)
        assert json.loads(raw)["data"]["code"] == "IDLE_TIMEOUT" and "2 s" in raw
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=15)
        assert info.value.rcvd is not None and info.value.rcvd.code == IDLE_CLOSE_CODE
        assert time.monotonic() - t0 < 15


@pytest.mark.slow
@pytest.mark.hostile_budget(30)  # many inputs (or a deadline the test waits out) in one call
def test_a_client_that_does_not_read_its_replies_is_dropped(guarded: ServerThread) -> None:
    """Frames are sent on a raw socket with a tiny receive buffer and never read: the server's replies back up,
    and the connection is dropped once a reply waits longer than the idle limit (no session is left behind)."""
    server = guarded.app.state.env_server
    before = server.active_sessions
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(20)
    sock.connect(("127.0.0.1", guarded.port))
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    sock.sendall(f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 101")
    frame = _masked('{"type": "state"}')
    sock.setblocking(False)
    t0 = time.monotonic()
    sent_until_blocked = 0
    try:
        while time.monotonic() - t0 < 20:
            try:
                sock.send(frame * 64)
                sent_until_blocked += 64
            except BlockingIOError:
                time.sleep(0.05)
            except OSError:
                break  # dropped by the server
            if sent_until_blocked > 200_000:
                time.sleep(0.05)
    finally:
        sock.close()
    deadline = time.monotonic() + 15
    while server.active_sessions > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.active_sessions == before
    assert time.monotonic() - t0 < 40


def _masked(text: str) -> bytes:
    payload = text.encode()
    mask = os.urandom(4)
    assert len(payload) < 126
    return bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


# ---------------------------------------------------------------------------------------- sessions per client
# One client used to be able to hold every session (8 connections filled a default server). Clients connect from
# distinct loopback addresses (Linux routes 127.0.0.0/8 to the loopback interface) to a server that counts them.
CAP_ATTACKS = ["40 connections at once", "40 connections one after the other", "connect, close, connect again x 40",
               "20 /mcp session creates", "20 /mcp creates while 3 WebSockets are held"]


@pytest.fixture(scope="module")
def capped() -> Iterator[tuple[ServerThread, Any]]:
    pool = TaskPool([{"id": f"t{i}", "env": "qa", "split": "test", "index": i,
                      "initial_state": {"question": f"q{i}", "answer": "a"}} for i in range(5)])
    app = make_app(pool, env_name="qa", max_concurrent_envs=8, max_sessions_per_client=3, cap_loopback=True,
                   idle_timeout_s=30.0)
    with ServerThread(app) as srv:
        yield srv, app.state.env_server


def _from(srv: ServerThread, source: str) -> Any:
    sock = socket.create_connection((srv.host, srv.port), timeout=15, source_address=(source, 0))
    return connect(_ws_url(srv), sock=sock, open_timeout=15, close_timeout=2)


def _mcp(srv: ServerThread, source: str, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    import http.client

    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=15, source_address=(source, 0))
    try:
        conn.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "method": method, "id": 1, "params": params or {}}),
                     {"Content-Type": "application/json"})
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def _served(srv: ServerThread, source: str) -> bool:
    with _from(srv, source) as ws:
        ws.send(RESET)
        if json.loads(ws.recv(timeout=15))["type"] != "observation":
            return False
        ws.send(STEP)
        return json.loads(ws.recv(timeout=15))["data"]["reward"] == 1.0


def _wait_idle(server: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while server.active_sessions and time.monotonic() < deadline:
        time.sleep(0.05)


def _refused(reply: dict[str, Any]) -> bool:
    """A refusal for being over the per-client share, with the message that says so."""
    data = reply.get("data") or {}
    error = reply.get("error") or {}
    message = str(data.get("message") or error.get("message") or "")
    return "per client" in message and (data.get("code") == "CAPACITY_REACHED" or reply.get("jsonrpc") == "2.0")


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="needs 127.0.0.2 (Linux loopback)")
@pytest.mark.parametrize("attack", CAP_ATTACKS)
@pytest.mark.hostile_budget(60)
def test_one_client_cannot_take_more_than_its_share(capped, attack: str) -> None:
    """Each attack makes 40 (or 20) attempts from one address beyond what it holds: it ends up with its share of
    3 sessions, every other attempt is refused with the per-client message, and another client is served."""
    import contextlib

    srv, server = capped
    _wait_idle(server)
    replies: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if attack.endswith("held"):  # the client first takes its share over WebSockets
            for ws in [stack.enter_context(_from(srv, "127.0.0.2")) for _ in range(3)]:
                ws.send(RESET)
                assert json.loads(ws.recv(timeout=15))["type"] == "observation"
        if attack == "40 connections at once":
            conns = [stack.enter_context(_from(srv, "127.0.0.2")) for _ in range(40)]
            replies = [json.loads(ws.recv(timeout=15)) if k >= 3 else {} for k, ws in enumerate(conns)]
            replies = replies[3:]  # the first 3 connections got the share's sessions (no frame until a message)
        elif attack == "40 connections one after the other":
            for k in range(40):
                ws = stack.enter_context(_from(srv, "127.0.0.2"))
                if k >= 3:
                    replies.append(json.loads(ws.recv(timeout=15)))
        elif attack == "connect, close, connect again x 40":
            for ws in [stack.enter_context(_from(srv, "127.0.0.2")) for _ in range(3)]:
                ws.send(RESET)
                assert json.loads(ws.recv(timeout=15))["type"] == "observation"
            for _ in range(40):
                with _from(srv, "127.0.0.2") as ws:
                    replies.append(json.loads(ws.recv(timeout=15)))
        else:  # /mcp session creates
            answers = [_mcp(srv, "127.0.0.2", "openenv/session/create") for _ in range(20)]
            replies = answers[3:] if not attack.endswith("held") else answers
            for answer in answers[:3] if not attack.endswith("held") else []:  # closed after the test
                stack.callback(_mcp, srv, "127.0.0.2", "openenv/session/close",
                               {"session_id": answer["result"]["session_id"]})
        assert replies and all(_refused(r) for r in replies), [r for r in replies if not _refused(r)][:2]
        assert server.sessions_by_client().get("127.0.0.2", 0) == 3  # never more than its share
        assert _served(srv, "127.0.0.3")  # another client is served meanwhile
