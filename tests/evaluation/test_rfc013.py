"""RFC 013's API section, walked piece by piece and called exactly as the RFC writes it, against a real
OpenEnv server (envsched's pool environment on OpenEnv's ``create_app``, uvicorn on 127.0.0.1), OpenEnv's
own client and harness classes (``GenericEnvClient``, ``StepEnvSessionAdapter``, ``CollectRunner``,
``MCPHarnessAdapter``, ``EvalHarness``/``EvalConfig``/``EvalResult``) and the local OpenAI-compatible stub
as the checkpoint under evaluation.

The evaluation of ``test_same_evaluation_in_rfc_form_and_envsched_form`` is the one shown side by side in
docs/evaluation.md.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest

pytest.importorskip("openenv.core.env_server")

from openenv.core.evals import EvalConfig
from openenv.core.evals import EvalHarness as OpenEnvEvalHarness
from openenv.core.evals import EvalResult as OpenEnvEvalResult
from openenv.core.generic_client import GenericEnvClient
from openenv.core.harness import MCPHarnessAdapter, ModelStepResult
from openenv.core.harness.collect import CollectRunner, RolloutSerializer
from openenv.core.llm_client import LLMResponse, ToolCall

from envsched.envs.openenv import OpenEnvEnvironment, TaskAPIClient
from envsched.envs.openenv_server import ServerThread, _free_port, make_app
from envsched.evaluation import (
    ChatCompletionsPolicy,
    EvalHarness,
    EvalSchedule,
    compare_eval_results,
)
from envsched.evaluation.rfc013 import AnswerHarnessAdapter, EnvEvalHarness, OpenEnvSessionFactory
from envsched.pool.pool import TaskPool
from envsched.samplers import CurriculumSampler, SequentialSampler, TaskSampler, UniformSampler

QA = [("Say yes.", "yes", "a"), ("Say no.", "no", "a"), ("Pick any word.", None, "b"), ("Say up.", "up", "b"),
      ("Say down.", "down", "b")]


@pytest.fixture(scope="module")
def server():
    tasks = [{"id": f"t{i}", "env": "qa", "split": "test", "group": g, "difficulty": i % 2,
              "initial_state": {"question": q, **({"answer": a} if a else {})}} for i, (q, a, g) in enumerate(QA)]
    tasks += [{"id": f"tr{i}", "env": "qa", "split": "train", "group": "a", "difficulty": i % 3,
               "initial_state": {"question": f"Train {i}?", "answer": "x"}} for i in range(6)]
    srv = ServerThread(make_app(TaskPool(tasks), env_name="rfc_env", max_concurrent_envs=4)).start()
    yield srv
    srv.stop()


def checkpoint(version: int):
    """The answers of two checkpoints: v1 solves t0, t1 half the time, never t4; v2 fixes t4 and breaks t0."""

    def respond(question: str, n: int) -> str:
        if question == "Say yes.":
            return "yes" if version == 1 else "no"
        if question == "Say no.":
            return "no" if n % 2 == 0 else "maybe"  # every second sample right: pass@1 0.5, pass@2 1
        if question == "Pick any word.":
            return "word"  # no reference answer: the environment cannot score it
        if question == "Say up.":
            return "   "  # an empty answer: a failure of the policy (reward 0, error_rate)
        if question == "Say down.":
            return "Thinking... <answer>down</answer>" if version == 2 else "left"
        raise AssertionError(question)

    return respond


def test_rfc_task_api_client(server):
    client = TaskAPIClient(server.url, "rfc_env")                      # __init__(base_url, env_name)
    assert client.list_splits() == [{"name": "test", "type": "test"}, {"name": "train", "type": "train"}]
    assert [t["id"] for t in client.list_tasks("test")] == ["t0", "t1", "t2", "t3", "t4"]
    assert client.num_tasks("train") == 6
    assert client.get_task("test", 3)["initial_state"] == {"question": "Say up."}  # no reference answer served
    assert [t["id"] for t in client.get_task_range("test")] == ["t0", "t1", "t2", "t3", "t4"]
    assert [t["id"] for t in client.get_task_range("test", 1, 3)] == ["t1", "t2"]
    assert [t["id"] for t in client.iter_tasks("train", page_size=4)] == [f"tr{i}" for i in range(6)]
    assert [t["id"] for t in client.iter_tasks("test")][-1] == "t4"   # page_size=256 by default
    with pytest.raises(IndexError):                                  # HTTP 400 -> IndexError
        client.get_task("test", 5)
    env = GenericEnvClient(base_url=server.url.replace("http://", "ws://") + "/ws")
    derived = TaskAPIClient.from_env_client(env, "rfc_env")          # from_env_client(env, env_name)
    assert (derived.base_url, derived.env_name) == (server.url, "rfc_env")
    assert TaskAPIClient.from_env_client(env).env_name == "rfc_env"  # env_name=None: the server's only one


def test_rfc_samplers_protocol_and_counters():
    tasks = [{"id": f"k{i}", "split": "train", "index": i, "difficulty": i % 3, "group": "g"} for i in range(6)]
    seq = SequentialSampler(tasks, [0, 1])                           # SequentialSampler(tasks, seeds)
    uni = UniformSampler(tasks, rng_seed=5)                          # UniformSampler(tasks, rng_seed)
    cur = CurriculumSampler(tasks, 4, key="difficulty")              # CurriculumSampler(tasks, group_size, key)
    assert [t["id"] for t in UniformSampler(tasks, 5).sample(6)] == [t["id"] for t in uni.sample(6)]
    assert [t["id"] for t in UniformSampler(tasks, seed=5).sample(6)] == [t["id"] for t in
                                                                         UniformSampler(tasks, rng_seed=5).sample(6)]
    for sampler in (seq, uni, cur):
        assert isinstance(sampler, TaskSampler)
        batch = sampler.sample(2)                                    # sample(n)
        assert len(batch) == 2
        sampler.update(batch[0], [1.0, None, 0.0], [10.0, 4.0, 6.0])  # update(task, rewards, costs)
        sampler.update(batch[1], [1.0, 1.0])                         # costs=None
        assert (sampler.groups, sampler.signal_groups, sampler.episodes, sampler.cost) == (2, 1, 5, 20.0)
        assert sampler.signal_groups_per_episode == pytest.approx(1 / 5)
        assert sampler.signal_groups_per_cost == pytest.approx(1 / 20)
        assert sampler.zero_signal_fraction == pytest.approx(0.5)
        assert sampler.metrics()["episodes"] == 5
        state = sampler.state_dict()                                 # state_dict() / load_state_dict(state)
        clone = type(sampler)(tasks, [0, 1]) if sampler is seq else (
            UniformSampler(tasks, rng_seed=5) if sampler is uni else CurriculumSampler(tasks, 4, key="difficulty"))
        clone.load_state_dict(json.loads(json.dumps(state)))
        assert [t["id"] for t in clone.sample(3)] == [t["id"] for t in sampler.sample(3)]
    # the curriculum counts an unscored rollout in episodes and cost, never in its statistics
    fresh = CurriculumSampler(tasks, 4, key="difficulty")
    fresh.require_dispatch = False
    fresh.update(tasks[0], [None, None])
    assert fresh.success_probabilities()["0"] == 0.5 and fresh.episodes == 2
    # SequentialSampler and UniformSampler are task iterables (for CollectRunner)
    items = list(SequentialSampler(tasks, [0, 1]))
    assert [(t["id"], t["seed"]) for t in items[:3]] == [("k0", 0), ("k0", 1), ("k1", 0)] and len(items) == 12
    assert len({t["id"] for t in itertools.islice(UniformSampler(tasks, rng_seed=1), 6)}) == 6  # one epoch
    # update on a sequential sampler only moves the counters, for any task of its pool
    it = SequentialSampler(tasks, [0])
    for item in it:
        it.update(item, [1.0])
    assert it.groups == 6 and it.episodes == 6
    with pytest.raises(KeyError):
        it.update({"id": "not-in-pool"}, [1.0])


def _params(llm_url: str, **kw):
    return {"split": "test", "seeds": [0], "samples_per_task": 2, "temperature": 0.7, "llm_endpoint": llm_url,
            "model": "ckpt", "max_turns": 3, **kw}


@pytest.mark.slow
def test_same_evaluation_in_rfc_form_and_envsched_form(server, stub_llm, tmp_path):
    stub_llm.respond = checkpoint(1)
    # ---- RFC form: EnvEvalHarness(session_factory, harness_adapter, task_client, output_dir)
    harness = EnvEvalHarness(OpenEnvSessionFactory(server.url), AnswerHarnessAdapter(),
                             TaskAPIClient(server.url, "rfc_env"), tmp_path / "rfc")
    assert isinstance(harness, OpenEnvEvalHarness)
    rfc = harness.run("0.1.0", {"openenv": "0.10.0"}, "rfc_env:test", _params(stub_llm.url))
    # ---- envsched form: the same evaluation with envsched's EvalHarness
    envsched = EvalHarness(lambda: OpenEnvEnvironment(server.url, "rfc_env"),
                           ChatCompletionsPolicy(stub_llm.url, "ckpt", temperature=0.7),
                           TaskAPIClient(server.url, "rfc_env"), split="test", seeds=[0], samples_per_task=2,
                           max_turns=3).run(tmp_path / "envsched")
    assert rfc["outcomes"] == {"success": 3, "failure": 3, "limit": 0, "policy_error": 2, "unscored": 2,
                               "infra_error": 0, "error": 0}
    assert rfc["scored"] == 8 and rfc["success_rate"] == pytest.approx(3 / 8)
    assert rfc["success_rate_se"] == pytest.approx(math.sqrt(3 / 8 * 5 / 8 / 8))
    lo, hi = rfc["success_rate_ci"]
    assert 0 < lo < 3 / 8 < hi < 1
    assert rfc["unscored_rate"] == pytest.approx(0.2) and rfc["error_rate"] == pytest.approx(0.2)
    assert rfc["infra_error_rate"] == 0
    assert rfc["pass@1"] == pytest.approx((1 + 0.5 + 0 + 0) / 4) and rfc["pass@2"] == pytest.approx(2 / 4)
    assert rfc["mean_turns"] == 1.0 and rfc["mean_completion_tokens"] == 7.0
    assert rfc["by_group"]["a"]["success_rate"] == pytest.approx(3 / 4)
    assert rfc["by_difficulty"]["1"]["scored"] == 4  # t1, t3
    assert {k: v["outcome"] for k, v in rfc["per_task"].items()} == {
        "t0": "pass", "t1": "pass", "t2": "unscored", "t3": "fail", "t4": "fail"}
    assert rfc["reproducible"] is True
    # one implementation of every score: the two forms agree
    for key in ("episodes", "scored", "successes", "success_rate", "success_rate_se", "success_rate_ci",
                "mean_reward", "mean_reward_se", "pass@1", "pass@2", "mean_turns", "mean_completion_tokens",
                "unscored_rate", "infra_error_rate", "error_rate", "outcomes"):
        assert envsched.scores[key] == pytest.approx(rfc[key]), key
    as_json = envsched.to_dict()  # NaN -> null, as in the RFC form's JSON-ready dict
    assert as_json["per_task"] == rfc["per_task"]
    for key in ("by_group", "by_difficulty", "by_env"):
        for name, row in as_json[key].items():
            assert {k: v for k, v in row.items() if row[k] != rfc[key][name].get(k)} == {}, (key, name)
    # OpenEnv's result files: results.jsonl (the rewarded episodes), metadata.json, result.json
    lines = [json.loads(x) for x in (tmp_path / "rfc" / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and {x["task"]["id"] for x in lines} == {"t0", "t1", "t4"}
    assert [x["episode_id"] for x in lines][:2] == ["ep-000000", "ep-000001"]
    meta = json.loads((tmp_path / "rfc" / "metadata.json").read_text())
    assert [e["outcome"] for e in meta["episodes"]][4:8] == ["unscored", "unscored", "policy_error", "policy_error"]
    stored = OpenEnvEvalResult.model_validate_json((tmp_path / "rfc" / "result.json").read_text())
    assert stored.config.harness_name == "EnvEvalHarness" and stored.scores["pass@2"] == rfc["pass@2"]

    # ---- the same run again resumes: CollectRunner skips the rewarded episodes; the others re-run
    calls = sum(stub_llm.calls.values())
    again = harness.run("0.1.0", {"openenv": "0.10.0"}, "rfc_env:test", _params(stub_llm.url))
    assert again["collect"]["num_skipped"] == 6 and sum(stub_llm.calls.values()) == calls + 4
    assert {k: v for k, v in again.items() if k != "collect"} == {k: v for k, v in rfc.items() if k != "collect"}

    # ---- a later checkpoint, compared: t4 fixed, t0 regressed, t2 left out (unscored on both sides)
    stub_llm.respond = checkpoint(2)
    config = EvalConfig(harness_name="EnvEvalHarness", harness_version="0.1.0", library_versions={},
                        dataset="rfc_env:test", eval_parameters=_params(stub_llm.url, resume=False))
    harness.output_dir = tmp_path / "rfc2"
    after = harness.run_from_config(config)
    assert isinstance(after, OpenEnvEvalResult)
    diff = compare_eval_results(rfc, after)                          # compare_eval_results(before, after)
    assert diff.fixed == ["t4"] and diff.regressed == ["t0"] and set(diff.left_out) == {"t2"}
    assert compare_eval_results(tmp_path / "rfc" / "result.json", envsched).fixed == []


def test_env_eval_harness_with_openenv_mcp_adapter_and_infra_failures(server, tmp_path):
    """OpenEnv's own MCPHarnessAdapter with a tool-calling model step; then a server that is not there."""

    def model_step(messages, tools, sampling):
        question = messages[-1]["content"]
        answer = {"Say yes.": "yes", "Say no.": "no", "Say up.": "down"}.get(question, "?")
        return ModelStepResult(response=LLMResponse(content="", tool_calls=[
            ToolCall(id="c1", name=tools[0].name, args={"answer": answer})]), completion_ids=[1, 2, 3])

    client = TaskAPIClient(server.url, "rfc_env")
    harness = EnvEvalHarness(OpenEnvSessionFactory(server.url), MCPHarnessAdapter(), client, tmp_path / "mcp",
                             model_step=model_step)
    s = harness.run("0.1.0", {}, "rfc_env:test", {"limit": 4})
    assert s["outcomes"]["success"] == 2 and s["outcomes"]["failure"] == 1 and s["outcomes"]["unscored"] == 1
    assert s["mean_completion_tokens"] == 3.0 and s["success_rate"] == pytest.approx(2 / 3)
    dead = f"http://127.0.0.1:{_free_port('127.0.0.1')}"
    down = EnvEvalHarness(OpenEnvSessionFactory(dead, connect_timeout_s=2), MCPHarnessAdapter(), client,
                          tmp_path / "down", model_step=model_step)
    s = down.run("0.1.0", {}, "rfc_env:test", {"limit": 2, "seeds": [3]})
    assert s["infra_error_rate"] == 1.0 and s["scored"] == 0 and s["success_rate"] is None
    assert s["reproducible"] is None and s["per_task"]["t0"]["outcome"] == "infra_error"
    with pytest.raises(ValueError, match="unknown eval_parameters"):
        harness.run("0.1.0", {}, "x", {"splitt": "test"})
    with pytest.raises(ValueError, match="temperature"):
        harness.run("0.1.0", {}, "x", {"samples_per_task": 2})
    with pytest.raises(ValueError, match="llm_endpoint"):
        EnvEvalHarness(OpenEnvSessionFactory(server.url), MCPHarnessAdapter(), client).run("0", {}, "x", {})


def _scripted(messages, tools, sampling):
    answer = {"Say yes.": "yes", "Say no.": "no", "Train 0?": "x", "Train 1?": "x"}.get(messages[-1]["content"], "?")
    return ModelStepResult(response=LLMResponse(content="", tool_calls=[
        ToolCall(id="c", name=tools[0].name, args={"answer": answer})]))


def test_samplers_are_task_iterables_for_collect_runner(server, tmp_path):
    """RFC 013: SequentialSampler and UniformSampler are valid ``tasks`` for OpenEnv's CollectRunner; the
    trainer (here: the test) feeds rewards back with ``update``."""
    client = TaskAPIClient(server.url, "rfc_env")
    seq = SequentialSampler(list(client.iter_tasks("test"))[:2], [0, 1])
    runner = CollectRunner(session_factory=OpenEnvSessionFactory(server.url), harness_adapter=MCPHarnessAdapter(),
                           serializer=RolloutSerializer(tmp_path / "seq"), tasks=seq)
    result = runner.run(model_step=_scripted, num_episodes=len(seq))
    assert result.num_collected == 4 and result.avg_reward == 1.0
    records = [json.loads(x) for x in (tmp_path / "seq" / "results.jsonl").read_text().splitlines()]
    assert [(r["task"]["id"], r["task"]["seed"]) for r in records] == [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)]
    for r in records:
        seq.update(r["task"], [r["reward"]])  # only moves the counters
    assert seq.episodes == 4 and seq.groups == 4
    uni = UniformSampler(list(client.iter_tasks("train")), rng_seed=0)
    result = CollectRunner(session_factory=OpenEnvSessionFactory(server.url), harness_adapter=MCPHarnessAdapter(),
                           serializer=RolloutSerializer(tmp_path / "uni"), tasks=uni).run(model_step=_scripted,
                                                                                          num_episodes=8)
    assert result.num_collected == 8  # more episodes than tasks: the sampler starts a new epoch
    records = [json.loads(x) for x in (tmp_path / "uni" / "results.jsonl").read_text().splitlines()]
    assert len({r["task"]["id"] for r in records[:6]}) == 6 and uni.epoch == 2
    solved = {r["task"]["id"] for r in records if r["reward"] == 1.0}
    assert solved <= {"tr0", "tr1"} and solved


def test_eval_schedule_rfc_form(server, stub_llm, tmp_path):
    stub_llm.respond = checkpoint(1)
    harness = EnvEvalHarness(OpenEnvSessionFactory(server.url), AnswerHarnessAdapter(),
                             TaskAPIClient(server.url, "rfc_env"))
    config = EvalConfig(harness_name="EnvEvalHarness", harness_version="0.1.0", library_versions={},
                        dataset="rfc_env:test", eval_parameters={"llm_endpoint": stub_llm.url, "model": "ckpt",
                                                                 "limit": 2, "check_reproducibility": False})
    seen = []
    sampler = UniformSampler([{"id": f"tr{i}", "split": "train", "index": i} for i in range(6)], rng_seed=0)
    # EvalSchedule(harness, config, every_n_steps, on_result)
    schedule = EvalSchedule(harness, config, 2, lambda step, result: seen.append((step, result)),
                            sampler=sampler, output_dir=tmp_path)
    assert isinstance(schedule.maybe_run(0), OpenEnvEvalResult)  # the baseline
    for step in (1, 2):
        for task in sampler.sample(2):
            sampler.update(task, [1.0, 0.0], [3.0, 4.0])
        schedule.maybe_run(step)
    assert [s for s, _ in seen] == [0, 2]
    assert seen[1][1].scores["training"]["sampler_episodes"] == 8 and seen[1][1].scores["success_rate"] == 1.0
    assert json.loads((tmp_path / "step-00000002" / "result.json").read_text())["scores"]["training"]["step"] == 2
    assert (tmp_path / "step-00000000" / "results.jsonl").exists()
    with pytest.raises(TypeError, match="EvalConfig"):
        EvalSchedule(harness, 5, 2, None)  # a config slot filled with a number


def test_cli_with_openenv_base_url_and_family_variant(server, stub_llm, tmp_path):
    """`envsched eval family:variant --base-url URL ...` as `openenv eval` writes it: the server's tasks of
    that group, episodes over its WebSocket session."""
    from click.testing import CliRunner

    from envsched.cli.main import cli

    stub_llm.respond = checkpoint(1)
    out = tmp_path / "cli"
    res = CliRunner().invoke(cli, ["eval", "qa:a", "--base-url", server.url, "--llm-endpoint", stub_llm.url,
                                   "--model", "ckpt", "-o", str(out), "--json", "--no-repro-check"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert sorted(data["per_task"]) == ["t0", "t1"] and data["config"]["base_url"] == server.url
    assert data["scores"]["successes"] == 1
    res = CliRunner().invoke(cli, ["eval", "qa:nope", "--base-url", server.url, "--llm-endpoint", stub_llm.url,
                                   "--model", "ckpt", "-o", str(tmp_path / "none")])
    assert res.exit_code == 2 and "no group 'nope'" in res.output and "['a', 'b']" in res.output
