"""The async trainer's draw server against any local process (issue 38, finding 3).

The server (``envsched.integrations._draw_server.DrawServer``, what ``EnvSchedAsyncGRPOTrainer`` runs) listens
on 127.0.0.1, where every local process can reach it. Each attack below is made with real sockets; afterwards
the serving thread must still be alive and the legitimate client (holding the key, as the rollout child does)
must get its draw. The child's side (``connect_draw_channel``) must fail within its deadline with one clear
error against servers that misbehave. Deadlines are shortened to 1 s here so that each case stays within the
hostile suite's time budget (the defaults are 10 s for a handshake and 30 s for a message).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import AuthenticationError, Client, Connection, answer_challenge, deliver_challenge
from typing import Any

import pytest

from envsched.integrations import _draw_server
from envsched.integrations._draw_server import DrawChannelError, DrawServer, connect_draw_channel


@pytest.fixture
def server(monkeypatch) -> Iterator[DrawServer]:
    monkeypatch.setattr(_draw_server, "HANDSHAKE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(_draw_server, "MESSAGE_TIMEOUT_S", 1.0)
    drawn: list[int] = []

    def reply(request: Any) -> tuple[Any, ...]:
        if request == "boom":
            raise RuntimeError("the sampler failed")
        drawn.append(len(drawn))
        return ("ok", drawn[-1], {"task_id": f"t{drawn[-1]}"})

    srv = DrawServer(reply)
    stop = threading.Event()
    thread = threading.Thread(target=srv.serve_forever, args=(stop,), daemon=True)
    thread.start()
    srv.thread = thread  # type: ignore[attr-defined]
    yield srv
    stop.set()
    thread.join(5)
    srv.close()
    assert not thread.is_alive()


def _draw(srv: DrawServer, timeout_s: float = 8.0) -> tuple[Any, ...]:
    conn = connect_draw_channel(srv.address, srv.authkey, timeout_s=timeout_s)
    try:
        conn.send(1)
        assert conn.poll(timeout_s), "no reply"
        return conn.recv()
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------- outsiders
def _connect_and_close(addr: Any) -> list[socket.socket]:
    socket.create_connection(addr).close()
    return []


def _one_byte(addr: Any) -> list[socket.socket]:
    s = socket.create_connection(addr)
    s.sendall(b"\x00")
    s.close()
    return []


def _garbage(addr: Any) -> list[socket.socket]:
    s = socket.create_connection(addr)
    s.sendall(bytes(range(256)) * 4)
    return [s]


def _http(addr: Any) -> list[socket.socket]:
    s = socket.create_connection(addr)
    s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return [s]


def _huge_length(addr: Any) -> list[socket.socket]:
    s = socket.create_connection(addr)
    s.sendall(struct.pack("!i", 2**31 - 1) + b"x" * 16)  # announces 2 GiB, sends 16 bytes
    return [s]


def _long_length_then_stall(addr: Any) -> list[socket.socket]:
    s = socket.create_connection(addr)
    s.sendall(struct.pack("!i", -1) + b"\x00\x00")  # the 8-byte length form, cut short
    return [s]


def _silent_flood(addr: Any) -> list[socket.socket]:
    return [socket.create_connection(addr) for _ in range(_draw_server.MAX_PENDING_HANDSHAKES + 4)]


def _slowloris(addr: Any) -> list[socket.socket]:
    s = socket.create_connection(addr)

    def trickle() -> None:
        try:
            for _ in range(40):
                s.sendall(b"\x00")
                time.sleep(0.1)
        except OSError:
            pass  # cut off by the server

    threading.Thread(target=trickle, daemon=True).start()
    return [s]


def _half_close(addr: Any) -> list[socket.socket]:
    s = socket.create_connection(addr)
    s.shutdown(socket.SHUT_WR)
    return [s]


def _reset(addr: Any) -> list[socket.socket]:
    s = socket.create_connection(addr)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # RST instead of FIN
    return []


def _burst(addr: Any) -> list[socket.socket]:
    for _ in range(200):
        socket.create_connection(addr).close()
    return []


def _wrong_key(addr: Any) -> list[socket.socket]:
    with pytest.raises(AuthenticationError):
        Client(addr, authkey=b"wrong key " * 4)
    return []


def _reflect_challenge(addr: Any) -> list[socket.socket]:
    """Read the server's challenge and send it back as our own (a reflection attempt, no key)."""
    s = socket.create_connection(addr)
    conn = Connection(os.dup(s.fileno()))
    challenge = conn.recv_bytes(256)
    conn.send_bytes(challenge)
    return [s]


def _empty_key(addr: Any) -> list[socket.socket]:
    with pytest.raises((AuthenticationError, EOFError, OSError)):
        Client(addr, authkey=b"")
    return []


def _until_every_connection_is_dealt_with(srv: DrawServer, limit_s: float = 5.0) -> None:
    """Until every connection the server accepted has authenticated or been dropped: a stalled outsider is cut
    off at its 1 s deadline, one that fails its handshake at once is dropped at once (a fixed 1.3 s wait made
    every case wait for the slowest). ``limit_s`` only guards against a hang."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        counts = dict(srv.counts)
        if counts["accepted"] == counts["authenticated"] + counts["dropped"]:
            return
        time.sleep(0.02)
    raise AssertionError(f"connections still in their handshake after {limit_s} s: {srv.counts}")


OUTSIDERS: dict[str, Callable[[Any], list[socket.socket]]] = {
    f.__name__.strip("_"): f for f in (_connect_and_close, _one_byte, _garbage, _http, _huge_length,
                                       _long_length_then_stall, _silent_flood, _slowloris, _half_close, _reset,
                                       _burst, _wrong_key, _reflect_challenge, _empty_key)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OUTSIDERS))
def test_an_outsider_never_stops_the_server_serving_the_child(server, name):
    held = OUTSIDERS[name](server.address)
    try:
        t0 = time.monotonic()
        reply = _draw(server)
        assert reply[0] == "ok" and reply[2] == {"task_id": f"t{reply[1]}"}
        assert time.monotonic() - t0 < 8
        assert server.thread.is_alive()  # type: ignore[attr-defined]
        # and the next child too, after the outsider's connection was dealt with
        _until_every_connection_is_dealt_with(server)
        assert _draw(server)[0] == "ok"
    finally:
        for s in held:
            s.close()
    assert server.counts["authenticated"] == 2 and server.counts["requests"] == 2
    if name not in ("burst", "connect_and_close", "one_byte", "reset"):  # these may close before the accept
        assert server.counts["dropped"] >= 1 and server.last_drop


def test_a_stalled_outsider_is_cut_off_at_the_handshake_deadline(server):
    s = socket.create_connection(server.address)
    try:
        s.settimeout(5)
        assert s.recv(4096)  # the server's challenge
        t0 = time.monotonic()
        assert s.recv(4096) == b""  # then nothing from us: the server shuts the connection at its deadline
        assert 0.5 < time.monotonic() - t0 < 4
    finally:
        s.close()
    time.sleep(0.2)
    assert "TimeoutError: the handshake took longer than 1 s" in (server.last_drop or "")


# ---------------------------------------------------------------------------------------------- insiders
def _authenticated(srv: DrawServer) -> tuple[socket.socket, Connection]:
    s = socket.create_connection(srv.address)
    conn = Connection(os.dup(s.fileno()))
    answer_challenge(conn, srv.authkey)
    deliver_challenge(conn, srv.authkey)
    return s, conn


def test_a_peer_with_the_key_that_stalls_mid_request_is_cut_off(server):
    s, conn = _authenticated(server)
    try:
        s.sendall(struct.pack("!i", 100) + b"\x80")  # a pickle of 100 bytes, 1 sent
        assert _draw(server)[0] == "ok"  # served meanwhile
        s.settimeout(5)
        t0 = time.monotonic()
        assert s.recv(4096) == b""  # cut off at the message deadline
        assert time.monotonic() - t0 < 4
    finally:
        conn.close()
        s.close()
    assert _draw(server)[0] == "ok"


def test_a_peer_with_the_key_sending_an_unreadable_request_is_dropped(server):
    s, conn = _authenticated(server)
    try:
        conn.send_bytes(b"\x80\x05not a pickle")
        s.settimeout(5)
        assert s.recv(4096) == b""
    finally:
        conn.close()
        s.close()
    assert "unreadable request" in (server.last_drop or "")
    assert _draw(server)[0] == "ok"


def test_a_failing_draw_is_answered_as_an_error_and_serving_goes_on(server):
    s, conn = _authenticated(server)
    try:
        conn.send("boom")
        assert conn.poll(5)
        assert conn.recv() == ("error", "RuntimeError: the sampler failed")
        conn.send(1)
        assert conn.poll(5) and conn.recv()[0] == "ok"
    finally:
        conn.close()
        s.close()


def test_a_peer_with_the_key_leaving_mid_request_is_dropped(server):
    s, conn = _authenticated(server)
    s.sendall(struct.pack("!i", len(pickle.dumps(1))))
    conn.close()
    s.close()
    assert _draw(server)[0] == "ok"


# ---------------------------------------------------------------------------------------------- the child's side
def _fake_server(behaviour: Callable[[socket.socket], None]) -> tuple[socket.socket, threading.Thread]:
    lsock = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        try:
            conn, _ = lsock.accept()
        except OSError:
            return
        try:
            behaviour(conn)
        except (OSError, EOFError, AuthenticationError):
            pass  # the child gave up or was refused: what the test checks on its side
        finally:
            time.sleep(0.5)
            conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return lsock, t


def _until_the_child_closes(conn: socket.socket) -> None:
    """Say nothing more and keep the connection until the child gives up on it (10 s at most)."""
    conn.settimeout(10)
    with contextlib.suppress(OSError):
        while conn.recv(4096):
            pass


def _never_speaks(conn: socket.socket) -> None:
    _until_the_child_closes(conn)


def _closes(conn: socket.socket) -> None:
    conn.close()


def _garbage_challenge(conn: socket.socket) -> None:
    conn.sendall(struct.pack("!i", 8) + b"not it!!")
    _until_the_child_closes(conn)


def _other_key(conn: socket.socket) -> None:
    c = Connection(os.dup(conn.fileno()))
    deliver_challenge(c, b"another process's key, 32 bytes")


def _trickles(conn: socket.socket) -> None:
    conn.sendall(struct.pack("!i", 30))  # a challenge of 30 bytes, sent one byte at a time
    for _ in range(30):
        conn.sendall(b"\x00")
        time.sleep(0.1)


CHILD_CASES = {
    "never_speaks": (_never_speaks, "did not complete the handshake within 1 s"),
    "closes_at_once": (_closes, "the handshake with the trainer's draw server at"),
    "garbage_challenge": (_garbage_challenge, "the handshake with the trainer's draw server at"),
    "another_key": (_other_key, "refused this process's key"),
    "trickles_bytes": (_trickles, "did not complete the handshake within 1 s"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHILD_CASES))
def test_the_childs_connect_fails_within_its_deadline_with_one_clear_error(name):
    behaviour, match = CHILD_CASES[name]
    lsock, t = _fake_server(behaviour)
    try:
        t0 = time.monotonic()
        with pytest.raises(DrawChannelError, match=match) as info:
            connect_draw_channel(lsock.getsockname(), b"k" * 32, timeout_s=1.0)
        assert time.monotonic() - t0 < 3
        assert f"127.0.0.1:{lsock.getsockname()[1]}" in str(info.value) and "\n" not in str(info.value)
    finally:
        lsock.close()
        t.join(5)


def test_the_childs_connect_to_a_closed_port_fails_at_once():
    lsock = socket.create_server(("127.0.0.1", 0))
    address = lsock.getsockname()
    lsock.close()
    with pytest.raises(DrawChannelError, match=r"cannot connect to the trainer's draw server at 127\.0\.0\.1:\d+"):
        connect_draw_channel(address, b"k" * 32, timeout_s=5)
