"""The Task API server is fit to expose: bounded pages, ranges refused like /task, short 4xx answers that
do not echo the request, capped bodies, no tracebacks, and a default split for a bare ``reset()``.

One real server (envsched's pool environment on OpenEnv's ``create_app``, uvicorn on 127.0.0.1) serves a
split larger than the page limit.
"""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.error
import urllib.request

import pytest

pytest.importorskip("openenv.core.env_server")

from openenv.core.generic_client import GenericEnvClient

from envsched.envs.openenv import TaskAPIClient, TaskAPIRequestError
from envsched.envs.openenv_server import MAX_BODY_BYTES, MAX_PAGE_SIZE, ServerThread, make_app
from envsched.pool.pool import TaskPool

BIG = MAX_PAGE_SIZE + 20


@pytest.fixture(scope="module")
def server():
    tasks = [{"id": f"big-{i}", "env": "qa", "split": "big", "initial_state": {"question": f"B{i}?", "answer": "b"}}
             for i in range(BIG)]
    tasks += [{"id": f"tr-{i}", "env": "qa", "split": "train", "initial_state": {"question": f"T{i}?", "answer": "t"}}
              for i in range(5)]
    tasks.append({"id": "broken", "env": "qa", "split": "bad", "initial_state": {}})  # its runner raises
    srv = ServerThread(make_app(TaskPool(tasks), env_name="hard", max_concurrent_envs=2)).start()
    yield srv
    srv.stop()


def _post(url: str, body: bytes | dict, *, path: str) -> tuple[int, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_pages_are_bounded_and_ranges_refused_like_task(server):
    u = server.url
    code, body = _post(u, {"split": "big"}, path="/hard/task_range")  # the whole split: over the limit
    assert code == 400 and str(MAX_PAGE_SIZE) in json.loads(body)["detail"]
    code, body = _post(u, {"split": "big", "start": 0, "stop": MAX_PAGE_SIZE}, path="/hard/task_range")
    assert code == 200 and len(json.loads(body)["tasks"]) == MAX_PAGE_SIZE
    code, body = _post(u, {"split": "big", "start": MAX_PAGE_SIZE}, path="/hard/task_range")
    assert code == 200 and [t["id"] for t in json.loads(body)["tasks"]][-1] == f"big-{BIG - 1}"
    for bad in ({"start": -1, "stop": 3}, {"start": -10**30}, {"start": 0, "stop": 10**18}, {"start": 5, "stop": 2},
                {"start": BIG + 1}):
        code, body = _post(u, {"split": "big", **bad}, path="/hard/task_range")
        assert code == 400, (bad, body)
        assert str(10**18) not in body and str(-10**30) not in body
    code, body = _post(u, {"split": "big", "index": BIG}, path="/hard/task")
    assert code == 400
    code, body = _post(u, {"split": "big"}, path="/hard/tasks")  # a bounded preview
    assert code == 200 and len(json.loads(body)["tasks"]) == MAX_PAGE_SIZE
    client = TaskAPIClient(u, "hard")
    assert client.num_tasks("big") == BIG
    assert [t["id"] for t in client.iter_tasks("big", page_size=MAX_PAGE_SIZE)] == [f"big-{i}" for i in range(BIG)]


def test_client_mistakes_are_short_4xx_without_echo(server):
    u = server.url
    marker = "ZZ-secret-" + "x" * 40
    for path, body, status in (
        ("/hard/num_tasks", {"split": marker}, 400),                      # unknown split (was 500)
        ("/hard/task", {"split": "big", "index": marker}, 422),           # not an integer
        ("/hard/task_range", {"split": "big", "start": marker}, 422),
        ("/hard/num_tasks", {"split": "big", "extra": marker}, 422),      # unknown key
        ("/reset", {"split": "big", "index": marker}, 400),               # was 500
        ("/reset", {"split": marker, "index": 0}, 400),
        ("/step", {"action": {"answer": 3, "nonsense": marker}}, 422),    # malformed action (was 500)
        ("/step", {"action": {"answer": "b"}}, 409),                      # stateless HTTP step
    ):
        code, text = _post(u, body, path=path)
        assert code == status, (path, body, code, text)
        assert marker not in text and "Traceback" not in text and len(text) < 400, text
    code, text = _post(u, {"split": "bad", "index": 0, "episode_id": marker}, path="/reset")
    assert (code, json.loads(text)) == (500, {"detail": "internal server error"})  # no traceback, no echo
    code, text = _post(u, b"{not json" + marker.encode(), path="/hard/num_tasks")
    assert code == 422 and marker not in text
    with pytest.raises(IndexError, match="unknown split"):
        TaskAPIClient(u, "hard").num_tasks("nope")  # a caller error, not an InfrastructureError
    with pytest.raises(TaskAPIRequestError) as info:
        TaskAPIClient(u, "hard")._call("POST", "task", {"split": "big", "index": "abc"})
    assert info.value.status == 422


def _raw(port: int, head: bytes, body_chunks=()) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        for chunk in body_chunks:
            sock.sendall(chunk)
        data = b""
        while True:
            part = sock.recv(65536)
            if not part:
                return data
            data += part


def test_request_bodies_are_capped(server):
    # a declared 200 MB body is refused from its headers: the server answers before any of it is sent
    head = (b"POST /hard/num_tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200000000\r\n\r\n")
    reply = _raw(server.port, head)
    assert reply.startswith(b"HTTP/1.1 413") and str(MAX_BODY_BYTES).encode() in reply
    # a chunked body without Content-Length is refused as soon as it passes the limit
    head = (b"POST /hard/num_tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    chunks = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * (MAX_BODY_BYTES // len(chunk) + 2) + [b"0\r\n\r\n"]
    reply = _raw(server.port, head, chunks)
    assert reply.startswith(b"HTTP/1.1 413") and b"xxxx" not in reply
    # a body just under the limit is served
    code, text = _post(server.url, json.dumps({"split": "big"}).encode() + b" " * (MAX_BODY_BYTES - 100),
                       path="/hard/num_tasks")
    assert (code, json.loads(text)) == (200, {"num_tasks": BIG})


def test_reset_without_split_and_index_serves_the_default_split(server):
    client = GenericEnvClient(base_url=server.url).sync()
    try:
        r = client.reset(seed=3)  # OpenEnv's generic reset: the default split "train", index 3 % 5
        assert r.observation["task_id"] == "tr-3" and r.observation["prompt"] == "T3?"
        assert client.reset().observation["task_id"] == "tr-0"
        assert client.reset(seed=7, split="big").observation["task_id"] == "big-7"
        assert client.step({"answer": "b"}).reward == 1.0
    finally:
        client.close()
    with pytest.raises(ValueError, match="default_split"):
        make_app(TaskPool([{"id": "a", "env": "qa", "split": "test", "initial_state": {"question": "q"}}]),
                 default_split="train")


# ---------------------------------------------------------------------------- bounded per client (issue 23)
def _qa_pool(n: int = 4) -> TaskPool:
    return TaskPool([{"id": f"q{i}", "env": "qa", "split": "train", "initial_state": {"question": f"Q{i}?",
                                                                                     "answer": "a"}}
                     for i in range(n)])


@pytest.mark.slow
def test_idle_sessions_expire_and_a_new_client_is_served():
    """The audit's lock: with every session held by an idle client, a new client was refused forever."""
    import time

    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from envsched.envs.server_guard import IDLE_CLOSE_CODE

    app = make_app(_qa_pool(), env_name="idle", max_concurrent_envs=2, idle_timeout_s=1.5)
    with ServerThread(app) as srv:
        url = srv.url.replace("http://", "ws://") + "/ws"
        with contextlib.ExitStack() as stack:
            idle = [stack.enter_context(connect(url)) for _ in range(2)]
            idle[0].send(json.dumps({"type": "reset", "data": {"index": 0}}))  # one mid-episode, one never sent
            assert json.loads(idle[0].recv(timeout=10))["type"] == "observation"
            with connect(url) as third:  # at capacity
                assert json.loads(third.recv(timeout=10))["data"]["code"] == "CAPACITY_REACHED"
            assert app.state.env_server.active_sessions == 2
            for ws in idle:  # each told why, then closed with the idle code
                assert json.loads(ws.recv(timeout=10))["data"]["code"] == "IDLE_TIMEOUT"
                with pytest.raises(ConnectionClosed) as info:
                    ws.recv(timeout=10)
                assert info.value.rcvd.code == IDLE_CLOSE_CODE
            deadline = time.monotonic() + 10
            while app.state.env_server.active_sessions and time.monotonic() < deadline:
                time.sleep(0.05)
            assert app.state.env_server.active_sessions == 0  # the capacity is free again
            with connect(url) as fresh:
                fresh.send(json.dumps({"type": "reset", "data": {"index": 3}}))
                assert json.loads(fresh.recv(timeout=10))["data"]["observation"]["task_id"] == "q3"
                fresh.send(json.dumps({"type": "step", "data": {"answer": "a"}}))
                assert json.loads(fresh.recv(timeout=10))["data"]["reward"] == 1.0


@pytest.mark.slow
def test_an_active_session_is_kept_and_mcp_sessions_expire():
    """Messages keep a WebSocket session (OpenEnv's reaper does not take it from under its connection, even when
    the client only asks for state); sessions opened over HTTP /mcp have no connection and expire when idle."""
    import time

    from websockets.sync.client import connect

    app = make_app(_qa_pool(), env_name="act", max_concurrent_envs=3, idle_timeout_s=1.0)
    with ServerThread(app) as srv:
        for i in range(2):
            code, text = _post(srv.url, {"jsonrpc": "2.0", "method": "openenv/session/create", "id": i}, path="/mcp")
            assert code == 200 and "session_id" in json.loads(text)["result"]
        with connect(srv.url.replace("http://", "ws://") + "/ws") as ws:
            ws.send(json.dumps({"type": "reset", "data": {"index": 1}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "observation"
            assert app.state.env_server.active_sessions == 3
            t0 = time.monotonic()
            while time.monotonic() - t0 < 7.5:  # past OpenEnv's reaper interval (5 s) and 7 idle limits
                ws.send(json.dumps({"type": "state"}))
                assert json.loads(ws.recv(timeout=10))["type"] == "state"
                time.sleep(0.4)
            assert app.state.env_server.active_sessions == 1  # the two /mcp sessions reaped, ours kept
            ws.send(json.dumps({"type": "step", "data": {"answer": "a"}}))
            assert json.loads(ws.recv(timeout=10))["data"]["reward"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name, value", [("ENVSCHED_OPENENV_IDLE_TIMEOUT_S", "0"),
                                         ("ENVSCHED_OPENENV_IDLE_TIMEOUT_S", "soon"),
                                         ("ENVSCHED_OPENENV_BODY_TIMEOUT_S", "-1"),
                                         ("ENVSCHED_OPENENV_BODY_TIMEOUT_S", "1e9"),
                                         ("ENVSCHED_OPENENV_MAX_BODY_BYTES", "0"),
                                         ("ENVSCHED_OPENENV_MAX_SESSIONS", "many")])
def test_limits_from_the_environment_are_checked(monkeypatch, name, value):
    from envsched.envs.openenv_server import create_default_app

    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        create_default_app()


def test_limits_from_make_app_are_checked_and_kept():
    for kwargs in ({"idle_timeout_s": 0}, {"idle_timeout_s": True}, {"body_timeout_s": float("nan")},
                   {"idle_timeout_s": 10**6}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            make_app(_qa_pool(), **kwargs)
    app = make_app(_qa_pool(), idle_timeout_s=42, body_timeout_s=7)
    assert (app.state.idle_timeout_s, app.state.body_timeout_s) == (42.0, 7.0)
    assert app.state.env_server._session_idle_timeout_s == 42.0  # OpenEnv's reaper uses the same limit


@pytest.mark.slow
def test_the_launcher_serves_with_the_head_deadline(tmp_path):
    """``python -m envsched.envs.openenv_server`` (the documented way): a stalled request head gets 408."""
    import os
    import subprocess
    import sys
    import time

    from envsched.envs.openenv_server import _free_port

    port = _free_port("127.0.0.1")
    pool = tmp_path / "pool.jsonl"
    pool.write_text("\n".join(json.dumps(t) for t in _qa_pool()) + "\n")
    env = {**os.environ, "ENVSCHED_OPENENV_POOL": str(pool), "ENVSCHED_OPENENV_HEADER_TIMEOUT_S": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "envsched.envs.openenv_server", "--port", str(port),
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-2000:]
                time.sleep(0.2)
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHo")
            assert sock.recv(200).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - t0 < 15
    finally:
        proc.terminate()
        proc.wait(timeout=30)
