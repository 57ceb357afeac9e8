"""Hostile requests to envsched's OpenEnv server (Task API): a 4xx answer naming the problem, and the server
keeps serving correctly afterwards."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("openenv", reason="needs the openenv extra")

from envsched.envs.openenv_server import ServerThread, make_app
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
