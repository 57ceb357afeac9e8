"""The draw channel of :class:`~envsched.integrations.trl_async.EnvSchedAsyncGRPOTrainer`: the trainer answers
the rollout child's draw requests over a ``multiprocessing.connection`` on 127.0.0.1.

Any local process can connect to that port. Only a peer that proves it holds the channel's 32-byte key
(``multiprocessing.connection``'s HMAC challenge, both ways) is served, and no other peer can stall the server
or make it stop serving the child:

* **accept** -- the listening socket is polled with a short timeout, so the serving thread sees a stop request
  and enforces the deadlines below between accepts; an error accepting one connection (even "too many open
  files") is logged and the loop goes on;
* **handshake** -- each connection is authenticated in a thread of its own within :data:`HANDSHAKE_TIMEOUT_S`:
  a peer that closes at once (``EOFError``), sends bytes that are not the protocol (``AssertionError``,
  ``OSError``, ``AuthenticationError``), holds a wrong key or says nothing is dropped, whatever it raised, and
  a silent one is cut off at the deadline (its socket is shut down, which ends the blocked read). At most
  :data:`MAX_PENDING_HANDSHAKES` run at once; further connections wait in the listen backlog;
* **requests** -- once authenticated, a request that started to arrive must arrive whole, and the reply must
  be taken, within :data:`MESSAGE_TIMEOUT_S`.

The child's side, :func:`connect_draw_channel`, connects and authenticates within one deadline and raises
:class:`DrawChannelError` saying what went wrong (nothing listening, no handshake in time, a key refused).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import AuthenticationError, Connection, answer_challenge, deliver_challenge
from typing import Any

from envsched.errors import EnvSchedError

__all__ = ["CONNECT_TIMEOUT_S", "HANDSHAKE_TIMEOUT_S", "MAX_PENDING_HANDSHAKES", "MESSAGE_TIMEOUT_S",
           "DrawChannelError", "DrawServer", "connect_draw_channel"]

logger = logging.getLogger(__name__)

#: seconds a connecting peer has to complete the HMAC handshake (the rollout child needs milliseconds)
HANDSHAKE_TIMEOUT_S = 10.0
#: seconds an authenticated peer has to finish sending a request it started, or to take a reply
MESSAGE_TIMEOUT_S = 30.0
#: seconds the rollout child waits to connect and authenticate before failing with :class:`DrawChannelError`
CONNECT_TIMEOUT_S = 120.0
#: handshakes in progress at once; further connections wait in the listen backlog
MAX_PENDING_HANDSHAKES = 16
#: how often the serving thread wakes to check for a stop request and expired deadlines
_POLL_S = 0.1


class DrawChannelError(EnvSchedError, ConnectionError):
    """The rollout child could not reach or authenticate to the trainer's draw server."""


class _Deadlines:
    """Deadlines on blocking socket operations in several threads, enforced by :meth:`sweep` (called by the
    serving thread): a socket past its deadline is shut down, which ends the call blocked on it with
    ``EOFError`` or ``OSError``; :meth:`within` then raises ``TimeoutError`` in that thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[int, tuple[socket.socket, float]] = {}
        self._fired: set[int] = set()

    @contextlib.contextmanager
    def within(self, sock: socket.socket, seconds: float, what: str) -> Iterator[None]:
        key = id(sock)
        with self._lock:
            self._until[key] = (sock, time.monotonic() + seconds)
        try:
            yield
        finally:
            with self._lock:
                self._until.pop(key, None)
                fired = key in self._fired
                self._fired.discard(key)
            if fired:
                raise TimeoutError(f"{what} took longer than {seconds:g} s")

    def sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [(key, sock) for key, (sock, until) in self._until.items() if until <= now]
            for key, _ in late:
                del self._until[key]
                self._fired.add(key)
        for _, sock in late:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class DrawServer:
    """Answers requests from peers that hold :attr:`authkey`, one reply per request made by ``reply(request)``
    (an exception in it is sent back as ``("error", "Type: message")``). Listens on ``host`` (an ephemeral
    port: :attr:`address`) from construction; :meth:`serve_forever` serves until its ``stop`` event is set.

    :attr:`counts` says what happened: connections ``accepted``, ``authenticated`` and ``dropped`` (failed or
    too slow handshakes), ``requests`` answered; :attr:`last_drop` is the latest reason a connection was
    dropped."""

    def __init__(self, reply: Callable[[Any], Any], *, authkey: bytes | None = None, host: str = "127.0.0.1") -> None:
        self.authkey = os.urandom(32) if authkey is None else bytes(authkey)
        self._reply = reply
        self._sock = socket.create_server((host, 0), backlog=64)
        self._sock.settimeout(_POLL_S)
        self.address: tuple[str, int] = tuple(self._sock.getsockname()[:2])  # type: ignore[assignment]
        self._deadlines = _Deadlines()
        self._lock = threading.Lock()
        self._pending = 0
        self._open: set[socket.socket] = set()
        self.counts = {"accepted": 0, "authenticated": 0, "dropped": 0, "requests": 0}
        self.last_drop: str | None = None

    def serve_forever(self, stop: threading.Event) -> None:
        """Accept and serve connections until ``stop`` is set (or :meth:`close`); never ends on a peer's error."""
        while not stop.is_set():
            self._deadlines.sweep()
            with self._lock:
                full = self._pending >= MAX_PENDING_HANDSHAKES
            if full:
                stop.wait(_POLL_S)
                continue
            try:
                sock, _ = self._sock.accept()
            except (TimeoutError, BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                if self._sock.fileno() < 0:
                    return  # closed
                logger.warning("envsched: the draw server could not accept a connection (%s)", exc)
                stop.wait(_POLL_S)
                continue
            with self._lock:
                self._pending += 1
                self._open.add(sock)
                self.counts["accepted"] += 1
            threading.Thread(target=self._connection, args=(sock, stop), name="envsched-draws-conn",
                             daemon=True).start()
        self._shutdown_open()

    def close(self) -> None:
        """Stop listening and end every open connection (a :meth:`serve_forever` still running returns)."""
        with contextlib.suppress(OSError):
            self._sock.close()
        self._shutdown_open()

    def _shutdown_open(self) -> None:
        with self._lock:
            socks = list(self._open)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _drop(self, why: str) -> None:
        with self._lock:
            self.counts["dropped"] += 1
            self.last_drop = why
        logger.info("envsched: dropped a connection to the draw server: %s", why)

    def _connection(self, sock: socket.socket, stop: threading.Event) -> None:
        conn: Connection | None = None
        authenticated = False
        try:
            try:
                sock.setblocking(True)
                conn = Connection(os.dup(sock.fileno()))
                with self._deadlines.within(sock, HANDSHAKE_TIMEOUT_S, "the handshake"):
                    deliver_challenge(conn, self.authkey)
                    answer_challenge(conn, self.authkey)
                authenticated = True
            except Exception as exc:  # any failure of a peer's handshake drops that peer, nothing else
                self._drop(f"handshake failed ({type(exc).__name__}: {exc})")
                return
            finally:
                with self._lock:
                    self._pending -= 1
                    if authenticated:
                        self.counts["authenticated"] += 1
            self._serve(conn, sock, stop)
        finally:
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
            with self._lock:
                self._open.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def _serve(self, conn: Connection, sock: socket.socket, stop: threading.Event) -> None:
        """Answer an authenticated peer until it leaves, stalls mid-message or ``stop`` is set."""
        while not stop.is_set():
            try:
                if not conn.poll(_POLL_S):
                    continue
                with self._deadlines.within(sock, MESSAGE_TIMEOUT_S, "a request"):
                    request = conn.recv()
            except (EOFError, OSError):
                return  # the peer is gone (or was cut off)
            except Exception as exc:  # an authenticated peer that sent something unreadable
                self._drop(f"unreadable request ({type(exc).__name__}: {exc})")
                return
            try:
                reply = self._reply(request)
            except Exception as exc:
                logger.exception("envsched: answering a draw request failed")
                reply = ("error", f"{type(exc).__name__}: {exc}")
            with self._lock:  # counted before the reply goes out, so a peer that has its reply sees the count
                self.counts["requests"] += 1
            try:
                with self._deadlines.within(sock, MESSAGE_TIMEOUT_S, "a reply"):
                    conn.send(reply)
            except (EOFError, OSError):
                return


def connect_draw_channel(address: tuple[str, int], authkey: bytes, *, timeout_s: float | None = None
                         ) -> Connection:
    """A connection to the draw server at ``address``, authenticated with ``authkey``, within ``timeout_s``
    seconds in all (default :data:`CONNECT_TIMEOUT_S`, read at the call); :class:`DrawChannelError` naming the
    address and what happened otherwise."""
    if timeout_s is None:
        timeout_s = CONNECT_TIMEOUT_S
    host, port = address[0], address[1]
    where = f"the trainer's draw server at {host}:{port}"
    deadline = time.monotonic() + timeout_s
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        raise DrawChannelError(f"envsched: cannot connect to {where} ({exc.strerror or exc}): the trainer process "
                               "is gone, or its port is blocked") from None
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), cut)
    timer.daemon = True
    conn: Connection | None = None
    try:
        sock.settimeout(None)  # blocking: the timer bounds the handshake as a whole
        conn = Connection(os.dup(sock.fileno()))
        timer.start()
        answer_challenge(conn, authkey)
        deliver_challenge(conn, authkey)
        if expired.is_set():  # cut off just as the handshake ended: the connection is gone
            raise TimeoutError
    except Exception as exc:
        timer.cancel()
        if conn is not None:
            conn.close()
        if expired.is_set():
            raise DrawChannelError(f"envsched: {where} did not complete the handshake within {timeout_s:g} s (the "
                                   "trainer is not serving draws: stalled, or busy with other connections)") from None
        if isinstance(exc, AuthenticationError):
            raise DrawChannelError(f"envsched: {where} refused this process's key, or answered with the wrong one "
                                   "(the address belongs to another process)") from None
        raise DrawChannelError(f"envsched: the handshake with {where} failed ({type(exc).__name__}: {exc})") \
            from None
    finally:
        timer.cancel()
        sock.close()  # the connection holds its own descriptor
    return conn
