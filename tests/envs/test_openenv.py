"""The OpenEnv Task API client and WebSocket episode runner against real servers on 127.0.0.1.

One server is the default app started the documented way (``python -m uvicorn
envsched.envs.openenv_server:app``) in a subprocess, so that it can be killed mid-episode; the others
run in threads.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

pytest.importorskip("openenv.core.env_server")

from openenv.core.env_server import Action, Observation, State, create_app
from openenv.core.env_server import Environment as OpenEnvBase

from envsched.envs.base import InfrastructureError
from envsched.envs.openenv import (
    OpenEnvEnvironment,
    TaskAPIClient,
    http_base_url,
)
from envsched.envs.openenv_server import (
    ServerThread,
    _free_port,
    chain_sum_pool,
    make_app,
    reasoning_gym_entry,
)
from envsched.evaluation import EvalHarness
from envsched.pool.pool import TaskPool

POOL = [
    {"id": "a", "env": "qa", "split": "test", "initial_state": {"question": "Say yes.", "answer": "yes"}},
    {"id": "b", "env": "qa", "split": "test", "initial_state": {"question": "Say no.", "answer": "no"}},
    {"id": "c", "env": "qa", "split": "test", "initial_state": {"question": "Anything?"}},
    {"id": "d", "env": "qa", "split": "test", "initial_state": {"question": "Say up.", "answer": "up"}},
    {"id": "e", "env": "qa", "split": "test", "initial_state": {"question": "Say down.", "answer": "down"}},
    {"id": "t0", "env": "qa", "split": "train", "initial_state": {"question": "Train?", "answer": "x"}},
]


@pytest.fixture(scope="module")
def proc_server(tmp_path_factory, uvicorn_app):
    """The default app in a uvicorn subprocess, serving POOL (killable)."""
    path = tmp_path_factory.mktemp("pool") / "pool.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in POOL) + "\n")
    env = {**os.environ, "ENVSCHED_OPENENV_POOL": str(path), "ENVSCHED_OPENENV_NAME": "qa_pool"}
    with uvicorn_app(env) as (proc, port):
        yield proc, f"http://127.0.0.1:{port}"


def test_http_base_url_forms():
    assert http_base_url("ws://127.0.0.1:8000/ws") == "http://127.0.0.1:8000"
    assert http_base_url("wss://h.example:443/prefix/env/ws/") == "https://h.example:443/prefix/env"
    assert http_base_url("127.0.0.1:9000") == "http://127.0.0.1:9000"
    assert http_base_url("http://127.0.0.1:9000/a/b/") == "http://127.0.0.1:9000/a/b"
    for bad in ("", "ftp://x:1", "http://:80", "http://h:99999"):
        with pytest.raises(ValueError):
            http_base_url(bad)


@pytest.mark.slow
def test_task_api_client_routes_paging_and_errors(proc_server):
    _, url = proc_server
    client = TaskAPIClient(url.replace("http://", "ws://") + "/ws", "qa_pool")
    assert client.base_url == url
    assert TaskAPIClient.list_environments(url) == ["qa_pool"]
    assert client.list_splits() == [{"name": "test", "type": "test"}, {"name": "train", "type": "train"}]
    assert client.num_tasks("test") == 5
    assert [t["id"] for t in client.list_tasks("test")] == ["a", "b", "c", "d", "e"]
    task = client.get_task("test", 3)
    assert task["id"] == "d" and task["index"] == 3
    assert "answer" not in task["initial_state"]  # the reference answer is not served to agents
    assert [t["id"] for t in client.get_task_range("test", 1, 3)] == ["b", "c"]
    assert [t["id"] for t in client.iter_tasks("test", page_size=2)] == ["a", "b", "c", "d", "e"]
    with pytest.raises(IndexError):
        client.get_task("test", 5)
    with pytest.raises(IndexError, match="unknown split"):  # the caller's mistake: 400, not infrastructure
        client.num_tasks("nope")
    with pytest.raises(IndexError):  # negative ranges are refused like negative /task indexes
        client.get_task_range("test", -2)
    with pytest.raises(LookupError, match="not found"):
        TaskAPIClient(url, "no_such_env").num_tasks("test")
    with pytest.raises(ValueError):
        client.iter_tasks("test", page_size=0).__next__()
    with pytest.raises(InfrastructureError):
        TaskAPIClient(f"http://127.0.0.1:{_free_port('127.0.0.1')}", "x", timeout_s=2).num_tasks("test")
    env = OpenEnvEnvironment(url)
    derived = TaskAPIClient.from_env_client(env)
    assert (derived.base_url, derived.env_name) == (url, "qa_pool")
    from openenv.core.generic_client import GenericEnvClient

    ws_client = GenericEnvClient(base_url=url.replace("http://", "ws://"))
    for c in (ws_client, ws_client.sync()):
        d = TaskAPIClient.from_env_client(c, "qa_pool")
        assert d.base_url == url and d.num_tasks("train") == 1


class _NoTasksAction(Action):
    text: str


class _NoTasksObs(Observation):
    echo: str = ""


class _NoTaskAPIEnv(OpenEnvBase):
    """An OpenEnv environment without the Task API methods."""

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed=None, episode_id=None, **kw):
        return _NoTasksObs(echo="hi")

    def step(self, action, timeout_s=None, **kw):
        return _NoTasksObs(echo=action.text, done=True, reward=1.0)

    @property
    def state(self):
        return self._state


def test_501_maps_to_not_implemented():
    with ServerThread(create_app(_NoTaskAPIEnv, _NoTasksAction, _NoTasksObs, env_name="bare")) as srv:
        client = TaskAPIClient(srv.url, "bare")
        with pytest.raises(NotImplementedError, match="501"):
            client.num_tasks("test")
        with pytest.raises(NotImplementedError):
            list(client.iter_tasks("test"))


def test_episodes_over_websocket_and_a_server_that_goes_away(proc_server):
    proc, url = proc_server
    env = OpenEnvEnvironment(url, "qa_pool")
    obs = env.reset({"id": "a", "split": "test", "index": 0}, seed=1)
    assert obs["prompt"] == "Say yes." and obs["task_id"] == "a"
    assert env.text_field == "answer"
    step = env.step(" YES ")
    assert step.done and step.reward == 1.0 and env.final_reward() == 1.0
    env.reset({"split": "test", "index": 1})
    assert env.step("yes").reward == 0.0
    env.reset({"split": "test", "index": 2})  # no reference answer: the environment cannot score it
    r = env.step("whatever")
    assert r.done and r.reward is None and env.final_reward() is None
    # the server goes away mid-episode: an infrastructure error, reported as such by the harness too
    env.reset({"split": "test", "index": 3})
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    with pytest.raises(InfrastructureError):
        env.step("up")
    with pytest.raises(InfrastructureError):
        env.reset({"split": "test", "index": 3})
    env.close()

    class Never:
        def complete(self, messages, timeout_s=None):
            raise AssertionError("the policy must not be asked: the environment is down")

    harness = EvalHarness(lambda: OpenEnvEnvironment(url, "qa_pool", connect_timeout_s=2), Never(),
                          [POOL[0]], max_retries=1, backoff_s=0.01)
    result = harness.run()
    assert result.scores["outcomes"]["infra_error"] == 1
    assert result.scores["infra_error_rate"] == 1.0 and result.scores["scored"] == 0
    assert result.reproducible is None and "InfrastructureError" in result.reproducibility["error"]
    assert result.per_task["a"]["outcome"] == "infra_error"


@pytest.mark.slow
def test_capacity_reached_is_infrastructure_and_default_pool():
    pool = chain_sum_pool({"test": 3, "train": 2}, tiers=5)
    assert len(pool) == 25
    with ServerThread(make_app(pool, max_concurrent_envs=1)) as srv:
        client = TaskAPIClient(srv.url, "envsched_pool")
        assert client.num_tasks("test") == 15 and client.num_tasks("train") == 10
        t = client.get_task("test", 7)
        assert (t["id"], t["difficulty"], t["group"]) == ("chain_sum-test-7", 2, "chain_sum")
        a, b = OpenEnvEnvironment(srv.url), OpenEnvEnvironment(srv.url)
        question = a.reset(t, seed=0)["prompt"]
        _, entry = reasoning_gym_entry(pool.get("chain_sum-test-7"), 0)
        assert question == entry["question"] and question.count("+") + question.count("-") == 3  # 4 terms
        with pytest.raises(InfrastructureError, match="CAPACITY_REACHED"):
            b.reset(t, seed=0)
        assert a.step(entry["answer"]).reward == 1.0
        a.close()
        b.close()
        # the same (split, index, seed) gives the same question on a fresh session; another seed another
        c = OpenEnvEnvironment(srv.url)
        assert c.reset(t, seed=0)["prompt"] == question
        assert c.reset(t, seed=1)["prompt"] != question
        c.close()
    with pytest.raises(ValueError):
        chain_sum_pool({"test": 0})


def test_pool_server_rejects_gappy_indices():
    with pytest.raises(ValueError, match="indices"):
        make_app(TaskPool([{"id": "x", "env": "e", "split": "test", "index": 1,
                            "initial_state": {"question": "q"}}]))
