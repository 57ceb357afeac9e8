"""LLM-extraction answers that are not the promised JSON: a clear LLMAbstractionError, nothing cached.

Served by a local OpenAI-compatible stub on 127.0.0.1 (the only stand-in: a remote LLM cannot run here).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envsched.method.graph.llm_abstraction import LLMAbstractionError, LLMAbstractor

SPEC = {"id": "airline-7", "env": "airline", "instruction": "Cancel reservation ABC123.",
        "tools": [{"name": "cancel_reservation", "description": "Cancel a reservation by id"}],
        "verifier": {"checks": ["reservation cancelled"]}}
VALID = {
    "operations": [{"family": "lookup", "effect": "read", "inputs": ["identifier"], "required": True}],
    "gates": [], "dependencies": [], "check_groups": [], "conflicts": [], "literals": {"identifier": 1},
}


class _Stub:
    """Answers every chat request with the queued raw HTTP body (status 200)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.requests = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                stub.requests += 1
                body = stub.bodies.pop(0) if stub.bodies else b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)  # shutdown() waits up to one poll: 0.5 s by default
        self.thread.start()

    def answer(self, content: str) -> None:
        self.bodies.append(json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode())


@pytest.fixture
def stub() -> Iterator[_Stub]:
    s = _Stub()
    yield s
    s.server.shutdown()
    s.server.server_close()


def _answer(obj: object) -> str:
    return json.dumps(obj)


NOT_THE_PROMISED_JSON = {
    "prose": ("Sure! The task looks up a reservation and cancels it.", "not valid JSON"),
    "truncated": (_answer(VALID)[:40], "not valid JSON"),
    "broken fence": ("```json\n{\"operations\": [\n```", "not valid JSON"),
    "empty": ("", "not valid JSON"),
    "array": (_answer([VALID]), "is not of type 'object'"),
    "string": (_answer("operations"), "is not of type 'object'"),
    "extra key (difficulty guess)": (_answer({**VALID, "difficulty": 3}), "difficulty"),
    "missing key": (_answer({k: v for k, v in VALID.items() if k != "gates"}), "'gates' is a required property"),
    "value outside the vocabulary": (_answer({**VALID, "operations": [{**VALID["operations"][0], "family": "hack"}]}),
                                     "hack"),
    "wrong type": (_answer({**VALID, "literals": ["identifier"]}), "literals"),
    "NaN count": (json.dumps({**VALID, "literals": {"identifier": float("nan")}}), "literals"),
    "deep nesting": ("[" * 100000 + "]" * 100000, "(not valid JSON|is not of type 'object')"),
}


_KNOWN_GAPS: dict[str, pytest.MarkDecorator] = {}


@pytest.mark.parametrize("case", [pytest.param(c, marks=_KNOWN_GAPS.get(c, ())) for c in sorted(NOT_THE_PROMISED_JSON)])
def test_answer_that_is_not_the_promised_json(stub: _Stub, tmp_path: Path, case: str) -> None:
    content, problem = NOT_THE_PROMISED_JSON[case]
    llm = LLMAbstractor(stub.url, "stub-model", cache_dir=tmp_path / "cache", max_retries=1)
    stub.answer(content)
    stub.answer(content)  # the retry gets the same bad answer
    try:
        with pytest.raises(LLMAbstractionError) as info:
            llm.extract(SPEC)
    except RecursionError:  # pragma: no cover - reported as a finding, not hidden
        pytest.fail("a deeply nested answer raised RecursionError instead of LLMAbstractionError")
    message = str(info.value)
    assert "'airline-7'" in message and stub.url in message and "after 2 attempts" in message
    assert re.search(problem, message), message
    assert stub.requests == 2
    # no state change: nothing cached, so the next run asks again
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.json"))
    assert llm.cached(SPEC) is None


@pytest.mark.parametrize("body", [b"<html>502 Bad Gateway</html>", b'{"choices": []}', b'{"error": "overloaded"}',
                                  b"\xff\xfe garbage"])
def test_response_that_is_not_a_chat_completion(stub: _Stub, tmp_path: Path, body: bytes) -> None:
    llm = LLMAbstractor(stub.url, "stub-model", cache_dir=tmp_path / "cache", max_retries=0)
    stub.bodies.append(body)
    with pytest.raises(LLMAbstractionError, match=r"'airline-7'.*after 1 attempts; last problem: request failed"):
        llm.extract(SPEC)
    assert llm.cached(SPEC) is None


def test_a_bad_answer_then_a_good_one_is_cached(stub: _Stub, tmp_path: Path) -> None:
    llm = LLMAbstractor(stub.url, "stub-model", cache_dir=tmp_path / "cache", max_retries=1)
    stub.answer("not json")
    stub.answer(_answer(VALID))
    assert llm.extract(SPEC) == VALID
    assert llm.cached(SPEC) == VALID and stub.requests == 2
