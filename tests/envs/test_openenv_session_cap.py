"""The OpenEnv server's per-client session cap: one client address cannot hold every session.

A real server on 127.0.0.1; clients connect from distinct loopback addresses (127.0.0.2, 127.0.0.3: Linux routes
the whole 127.0.0.0/8 to the loopback interface), so the server sees distinct client addresses.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import sys
import time

import pytest

pytest.importorskip("openenv.core.env_server")

from envsched.envs.openenv_server import ServerThread, default_sessions_per_client, is_loopback, make_app
from envsched.pool.pool import TaskPool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs 127.0.0.2 (Linux loopback)")


def _pool() -> TaskPool:
    return TaskPool([{"id": f"q{i}", "env": "qa", "split": "train", "initial_state": {"question": f"Q{i}?",
                                                                                     "answer": "a"}}
                     for i in range(6)])


def _connect(srv: ServerThread, source: str):
    from websockets.sync.client import connect

    sock = socket.create_connection((srv.host, srv.port), timeout=10, source_address=(source, 0))
    return connect(srv.url.replace("http://", "ws://") + "/ws", sock=sock, open_timeout=10)


def _reset(ws, index: int = 0) -> dict:
    ws.send(json.dumps({"type": "reset", "data": {"index": index}}))
    return json.loads(ws.recv(timeout=10))


def _refusal(ws) -> dict:
    """The frame a connection refused a session gets at once (OpenEnv creates the session on connect)."""
    return json.loads(ws.recv(timeout=10))


def _episode(ws, index: int) -> float:
    assert _reset(ws, index)["type"] == "observation"
    ws.send(json.dumps({"type": "step", "data": {"answer": "a"}}))
    return json.loads(ws.recv(timeout=10))["data"]["reward"]


def _wait_sessions(app, n: int) -> None:
    deadline = time.monotonic() + 10
    while app.state.env_server.active_sessions != n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert app.state.env_server.active_sessions == n


def test_a_client_over_its_cap_is_refused_and_others_are_served():
    app = make_app(_pool(), env_name="cap", max_concurrent_envs=4, max_sessions_per_client=2, cap_loopback=True)
    server = app.state.env_server
    with ServerThread(app) as srv, contextlib.ExitStack() as stack:
        a = [stack.enter_context(_connect(srv, "127.0.0.2")) for _ in range(2)]
        assert [_episode(ws, k) for k, ws in enumerate(a)] == [1.0, 1.0]
        with _connect(srv, "127.0.0.2") as third:  # over its cap: refused with a message that says why
            reply = _refusal(third)
            assert reply["type"] == "error" and reply["data"]["code"] == "CAPACITY_REACHED"
            message = reply["data"]["message"]
            assert "per client" in message and "at most 2" in message and "other clients" in message
        assert server.sessions_by_client() == {"127.0.0.2": 2}  # the refusal held no session
        b = [stack.enter_context(_connect(srv, "127.0.0.3")) for _ in range(2)]
        assert [_episode(ws, 2 + k) for k, ws in enumerate(b)] == [1.0, 1.0]  # another client is served
        assert server.sessions_by_client() == {"127.0.0.2": 2, "127.0.0.3": 2}
        assert [_episode(ws, 4) for ws in a] == [1.0, 1.0]  # the capped client's own sessions go on
        a.pop().close()  # one of client A's sessions ends: A may open one again
        _wait_sessions(app, 3)
        assert _episode(stack.enter_context(_connect(srv, "127.0.0.2")), 5) == 1.0
        assert server.sessions_by_client() == {"127.0.0.2": 2, "127.0.0.3": 2}


def test_many_refused_attempts_change_nothing():
    """A client that keeps retrying past its cap is refused every time and takes no session."""
    app = make_app(_pool(), env_name="cap2", max_concurrent_envs=3, max_sessions_per_client=1, cap_loopback=True)
    with ServerThread(app) as srv, _connect(srv, "127.0.0.2") as held:
        assert _episode(held, 0) == 1.0
        for _ in range(20):
            with _connect(srv, "127.0.0.2") as again:
                assert _refusal(again)["data"]["code"] == "CAPACITY_REACHED"
        assert app.state.env_server.sessions_by_client() == {"127.0.0.2": 1}
        _wait_sessions(app, 1)
        with _connect(srv, "127.0.0.3") as other:
            assert _episode(other, 1) == 1.0


def test_mcp_sessions_count_against_the_same_cap():
    app = make_app(_pool(), env_name="cap3", max_concurrent_envs=4, max_sessions_per_client=1, cap_loopback=True)

    def create(source: str) -> dict:
        conn = http.client.HTTPConnection(app_srv.host, app_srv.port, timeout=10, source_address=(source, 0))
        conn.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}),
                     {"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
        conn.close()
        return answer

    with ServerThread(app) as app_srv:
        assert "session_id" in create("127.0.0.2")["result"]
        refused = create("127.0.0.2")
        assert "per client" in refused["error"]["message"]
        assert "session_id" in create("127.0.0.3")["result"]
        assert app.state.env_server.sessions_by_client() == {"127.0.0.2": 1, "127.0.0.3": 1}


def test_loopback_clients_are_not_capped_unless_asked():
    """On a loopback server every client has the same address: a cap per address would only lower capacity."""
    app = make_app(_pool(), env_name="lo", max_concurrent_envs=3, max_sessions_per_client=1)
    with ServerThread(app) as srv, contextlib.ExitStack() as stack:
        wss = [stack.enter_context(_connect(srv, "127.0.0.1")) for _ in range(3)]
        assert [_episode(ws, k) for k, ws in enumerate(wss)] == [1.0, 1.0, 1.0]
        assert app.state.env_server.sessions_by_client() == {}


def test_the_default_cap_and_bad_values():
    assert [default_sessions_per_client(n) for n in (1, 2, 3, 8, 32)] == [1, 1, 2, 4, 16]
    assert make_app(_pool()).state.env_server.max_sessions_per_client == 4  # 8 sessions by default
    assert make_app(_pool(), max_concurrent_envs=5).state.env_server.max_sessions_per_client == 3
    assert make_app(_pool(), max_sessions_per_client=7).state.env_server.max_sessions_per_client == 7
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="max_sessions_per_client"):
            make_app(_pool(), max_sessions_per_client=bad)
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="cap_loopback"):
            make_app(_pool(), cap_loopback=bad)
    assert [is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "::1", "localhost", "10.0.0.1", None, "x")] == [
        True, True, True, True, False, False, False]


@pytest.mark.slow
@pytest.mark.parametrize("name, value", [("ENVSCHED_OPENENV_MAX_SESSIONS_PER_CLIENT", "0"),
                                         ("ENVSCHED_OPENENV_MAX_SESSIONS_PER_CLIENT", "lots"),
                                         ("ENVSCHED_OPENENV_CAP_LOOPBACK", "maybe")])
def test_the_cap_from_the_environment_is_checked(monkeypatch, name, value):
    from envsched.envs.openenv_server import create_default_app

    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        create_default_app()


def test_the_cap_from_the_environment_is_used(monkeypatch, tmp_path):
    from envsched.envs.openenv_server import create_default_app

    path = tmp_path / "pool.jsonl"
    _pool().to_jsonl(path)
    monkeypatch.setenv("ENVSCHED_OPENENV_POOL", str(path))
    monkeypatch.setenv("ENVSCHED_OPENENV_MAX_SESSIONS", "10")
    assert create_default_app().state.env_server.max_sessions_per_client == 5
    monkeypatch.setenv("ENVSCHED_OPENENV_MAX_SESSIONS_PER_CLIENT", "3")
    monkeypatch.setenv("ENVSCHED_OPENENV_CAP_LOOPBACK", "1")
    server = create_default_app().state.env_server
    assert (server.max_sessions_per_client, server.cap_loopback) == (3, True)
