"""The stand-in vLLM server's HTTP layer: a client that hangs up leaves no traceback on stderr."""

from __future__ import annotations

import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("torch")

from envsched.integrations.standin import _QuietServer


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _reset_mid_request(server_cls: type[ThreadingHTTPServer]) -> None:
    """A client sends half a request line and resets the connection (SO_LINGER 0)."""
    httpd = server_cls(("127.0.0.1", 0), _Echo)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)  # a quick shutdown()
    t.start()
    try:
        c = socket.create_connection(httpd.server_address[:2])
        time.sleep(0.05)  # the server's thread is in readline by now
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
        time.sleep(0.3)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_reset_connection_prints_nothing(capsys):
    _reset_mid_request(_QuietServer)
    assert "Traceback" not in capsys.readouterr().err


def test_the_plain_server_would_print_a_traceback(capsys):
    # the control: the same reset through http.server's own error handler prints one
    _reset_mid_request(ThreadingHTTPServer)
    assert "ConnectionResetError" in capsys.readouterr().err
