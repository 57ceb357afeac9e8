"""The LLM abstraction path against a local OpenAI-compatible stub server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envsched.method.config import GraphConfig
from envsched.method.graph.build import build_graph
from envsched.method.graph.llm_abstraction import SYSTEM_PROMPT, LLMAbstractionError, LLMAbstractor
from envsched.pool import TaskPool

VALID = {
    "operations": [{"family": "lookup", "effect": "read", "inputs": ["identifier"], "required": True},
                   {"family": "delete", "effect": "destructive", "inputs": ["identifier"], "required": True}],
    "gates": [{"type": "authentication", "provenance": "tool_description"}],
    "dependencies": [{"from": "lookup", "to": "delete", "kind": "data"}],
    "check_groups": [{"controlled_by": "delete", "kinds": ["state_equals"], "size": 1}],
    "conflicts": [{"type": "destructive", "families": ["delete"]}],
    "literals": {"identifier": 1},
}
OTHER = {**VALID, "operations": [{"family": "compute", "effect": "read", "inputs": ["money"], "required": True}],
         "dependencies": [], "conflicts": [], "gates": []}


class Stub:
    """Serves queued chat-completion contents; records every request body."""

    def __init__(self) -> None:
        self.queue: list[tuple[int, str]] = []
        self.default: tuple[int, str] | None = None
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                status, content = stub.queue.pop(0) if stub.queue else stub.default or (500, "")
                payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload.encode())

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)  # shutdown() waits up to one poll: 0.5 s by default


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    s.thread.start()
    try:
        yield s
    finally:
        s.server.shutdown()
        s.server.server_close()


TASK = {"id": "t1", "env": "airline", "instruction": "Cancel reservation ZX9QK1.",
        "tools": [{"name": "cancel_reservation", "description": "Cancel a reservation."}],
        "verifier": {"checks": ["reservation ZX9QK1 is cancelled"]}}


def test_malformed_answers_are_retried_then_validated_and_cached(stub: Stub, tmp_path: Path) -> None:
    stub.queue = [(200, "this is not json"),
                  (200, json.dumps({**VALID, "difficulty": "hard"})),  # extra key: difficulty guesses refused
                  (200, json.dumps({**VALID, "operations": [{"family": "teleport", "effect": "read"}]})),
                  (200, "```json\n" + json.dumps(VALID) + "\n```")]
    llm = LLMAbstractor(stub.url, "stub-model", cache_dir=tmp_path, max_retries=3, api_key="k")
    assert llm.extract(TASK) == VALID
    assert len(stub.requests) == 4 and llm.stats["retries"] == 3
    first = stub.requests[0]
    assert first["path"] == "/v1/chat/completions" and first["body"]["model"] == "stub-model"
    assert first["auth"] == "Bearer k"
    assert first["body"]["messages"][0]["content"] == SYSTEM_PROMPT
    user = json.loads(first["body"]["messages"][1]["content"])
    assert user["task"]["instruction"] == TASK["instruction"]
    # the retry tells the model what was wrong
    retry = stub.requests[2]["body"]["messages"][-1]["content"]
    assert "difficulty" in retry and "Additional properties" in retry
    assert "teleport" in stub.requests[3]["body"]["messages"][-1]["content"]
    # cached: a second extractor (fresh process) makes no request
    again = LLMAbstractor(stub.url, "stub-model", cache_dir=tmp_path)
    assert again.extract(dict(TASK)) == VALID and len(stub.requests) == 4 and again.stats["cache_hits"] == 1
    # the cache is keyed by content: a changed task is asked again
    stub.queue = [(200, json.dumps(OTHER))]
    assert again.extract({**TASK, "instruction": "Compute the refund."}) == OTHER
    assert len(stub.requests) == 5
    # another model is another cache entry
    stub.queue = [(200, json.dumps(OTHER))]
    assert LLMAbstractor(stub.url, "other-model", cache_dir=tmp_path).extract(TASK) == OTHER


def test_gives_a_clear_error_after_retries(stub: Stub, tmp_path: Path) -> None:
    stub.default = (200, json.dumps({"operations": []}))
    llm = LLMAbstractor(stub.url, "m", cache_dir=tmp_path, max_retries=2)
    with pytest.raises(LLMAbstractionError, match=r"task 't1'.*after 3 attempts.*required property"):
        llm.extract(TASK)
    assert len(stub.requests) == 3
    assert not list(tmp_path.rglob("*.json"))  # nothing invalid is cached
    stub.default = (503, "")
    with pytest.raises(LLMAbstractionError, match="HTTP 503"):
        llm.extract(TASK)
    stub.requests.clear()
    stub.default = (401, "")
    with pytest.raises(LLMAbstractionError, match="HTTP 401"):
        llm.extract(TASK)
    assert len(stub.requests) == 1  # a refused request is not retried


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        LLMAbstractor("127.0.0.1:9", "m")
    with pytest.raises(ValueError, match="model"):
        LLMAbstractor("http://127.0.0.1:9", "")


def test_build_graph_with_llm_abstraction(stub: Stub, tmp_path: Path) -> None:
    tasks = [TASK, {**TASK, "id": "t2", "instruction": "Cancel reservation AB1234."},
             {"id": "c1", "env": "clinic", "instruction": "Delete appointment 55.",
              "tools": [{"name": "delete_appointment"}]},
             {"id": "c2", "env": "clinic", "instruction": "Compute the bill.", "tools": [{"name": "bill"}]}]
    answers = {"Cancel reservation ZX9QK1.": VALID, "Cancel reservation AB1234.": VALID,
               "Delete appointment 55.": VALID, "Compute the bill.": OTHER}
    stub.queue = [(200, "{broken"), *[(200, json.dumps(answers[t["instruction"]])) for t in tasks]]
    cfg = GraphConfig(abstraction="llm", llm_endpoint=stub.url, llm_model="m", llm_cache_dir=str(tmp_path),
                      k_cross=1)
    g = build_graph(TaskPool(tasks), cfg)
    assert len(stub.requests) == 5
    # the cross neighbour follows the LLM's structure: t1 ~ c1 (same answer), not c2
    assert g.task_ids[g.cross_index[0][0]] == "c1"
    assert g.task_ids[g.cross_index[3][0]] in ("t1", "t2")
    build_graph(TaskPool(tasks), cfg)  # all cached now
    assert len(stub.requests) == 5
