"""A local OpenAI-compatible chat-completions stub on 127.0.0.1 whose answers the test controls.

It stands in for the remote LLM endpoint (the only stubbed component): each request's last user
message is passed to ``stub.respond(question, call_number)``, which returns the reply text, or
``("raw", status, body_bytes)`` for a malformed / failing answer.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class StubLLM:
    def __init__(self) -> None:
        self.respond: Callable[[str, int], Any] = lambda q, n: "no idea"
        self.calls: Counter[str] = Counter()
        self.requests: list[dict[str, Any]] = []
        self.completion_tokens = 7
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                question = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
                with stub._lock:
                    stub.calls[question] += 1
                    n = stub.calls[question]
                    stub.requests.append(body)
                reply = stub.respond(question, n)
                if isinstance(reply, tuple) and reply[0] == "raw":
                    _, status, raw = reply
                else:
                    raw = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": reply}}],
                                      "usage": {"prompt_tokens": 11, "completion_tokens": stub.completion_tokens,
                                                "total_tokens": 11 + stub.completion_tokens}}).encode()
                    status = 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout under test)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub_llm():
    stub = StubLLM()
    yield stub
    stub.close()
