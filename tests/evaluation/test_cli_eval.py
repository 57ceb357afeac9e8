"""`envsched eval` with an in-process spec (reasoning_gym:...), --json output, and bad input."""

from __future__ import annotations

import json

from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.envs.reasoning_gym import build_reasoning_gym_pool, regenerate_item


def test_reasoning_gym_spec_json(tmp_path, stub_llm):
    tasks = build_reasoning_gym_pool(["chain_sum"], tasks_per_dataset=4, split="test")
    answers = {str(regenerate_item(t)["question"]): str(regenerate_item(t)["answer"]) for t in tasks}
    first = tasks[0]["instruction"]
    stub_llm.respond = lambda q, n: "wrong" if q == first else f"<answer>{answers[q]}</answer>"
    res = CliRunner().invoke(cli, ["eval", "reasoning_gym:chain_sum", "--llm-endpoint", stub_llm.url, "--model",
                                   "m", "--output-dir", str(tmp_path / "o"), "--num-tasks", "4", "--limit", "3",
                                   "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["scores"]["episodes"] == 3 and data["scores"]["successes"] == 2
    assert data["reproducible"] is True
    assert data["per_task"][tasks[0]["id"]]["outcome"] == "fail"
    assert json.loads((tmp_path / "o" / "result.json").read_text())["scores"] == data["scores"]


def test_bad_input_is_refused_clearly(tmp_path, stub_llm):
    runner = CliRunner()
    base = ["--llm-endpoint", stub_llm.url, "--model", "m", "--output-dir", str(tmp_path / "x")]
    res = runner.invoke(cli, ["eval", "nonsense:foo", *base])
    assert res.exit_code == 2 and "unknown environment spec" in res.output
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", *base, "--samples-per-task", "2"])
    assert res.exit_code == 2 and "--temperature" in res.output
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", "--llm-endpoint", "localhost:80", "--model", "m",
                              "--output-dir", str(tmp_path / "y")])
    assert res.exit_code == 2 and "http(s) URL" in res.output
    res = runner.invoke(cli, ["eval", "reasoning_gym:not_a_dataset", *base])
    assert res.exit_code != 0 and "not_a_dataset" in res.output
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", *base, "--seeds", "0,x"])
    assert res.exit_code == 2 and "'x' is not an integer" in res.output
    assert not (tmp_path / "x" / "episodes.jsonl").exists()


def test_openenv_flags_keep_their_meaning(tmp_path, stub_llm):
    """`openenv collect`/`eval` flags: --provider, --llm-endpoint without a port + --llm-port, -o, -n,
    --dataset-config (the reasoning-gym configuration of every item), --system-prompt, --keep-losses."""
    from envsched.envs.openenv_server import reasoning_gym_entry

    port = stub_llm.url.rsplit(":", 1)[1]
    seen = []

    def respond(q, n):
        seen.append(q)
        return "0"

    stub_llm.respond = respond
    res = CliRunner().invoke(cli, [
        "eval", "reasoning_gym:chain_sum", "--provider", "openai", "--llm-endpoint", "http://127.0.0.1",
        "--llm-port", port, "--model", "m", "-o", str(tmp_path / "o"), "-n", "3",
        "--dataset-config", '{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}',
        "--system-prompt", "Answer with one number.", "--keep-losses", "--num-tasks", "5", "--json",
        "--no-repro-check"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["scores"]["episodes"] == 3 and data["scores"]["planned_episodes"] == 3
    assert data["config"]["num_episodes"] == 3 and data["config"]["dataset_config"]["max_terms"] == 2
    assert len(seen) == 3
    for q in seen:  # two one-digit terms, as the configuration says
        assert q.count("+") + q.count("-") == 1, q
    task = {"id": "x", "initial_state": {"reasoning_gym": {"dataset": "chain_sum", "seed": 500_000_000,
                                                            "config": {"min_terms": 2, "max_terms": 2,
                                                                       "min_digits": 1, "max_digits": 1}}}}
    assert seen[0] == reasoning_gym_entry(task)[1]["question"]
    assert stub_llm.requests[0]["messages"][0] == {"role": "system", "content": "Answer with one number."}


def test_unknown_and_conflicting_flags_are_refused(tmp_path, stub_llm, monkeypatch):
    runner = CliRunner()
    out = ["-o", str(tmp_path / "z")]
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", "--llm-endpoint", stub_llm.url, "--model", "m",
                              *out, "--frobnicate"])
    assert res.exit_code == 2 and "No such option" in res.output and "--frobnicate" in res.output
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", "--model", "m", *out])  # scripted, no endpoint
    assert res.exit_code == 2 and "--llm-endpoint" in res.output and "scripted" in res.output
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", "--llm-endpoint", stub_llm.url, *out])
    assert res.exit_code == 2 and "--model is required" in res.output
    for name in ("OPENAI_API_KEY", "API_KEY"):
        monkeypatch.delenv(name, raising=False)
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", "--provider", "openai", "--model", "m", *out])
    assert res.exit_code == 2 and "OPENAI_API_KEY" in res.output
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", "--provider", "anthropic", "--model", "m",
                              "--llm-port", "80", *out])
    assert res.exit_code == 2 and "--llm-port" in res.output
    res = runner.invoke(cli, ["eval", "http://127.0.0.1:1", "--base-url", "http://127.0.0.1:2", "--llm-endpoint",
                              stub_llm.url, "--model", "m", *out])
    assert res.exit_code == 2 and "two different servers" in res.output
    base = ["--llm-endpoint", stub_llm.url, "--model", "m", *out]
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", *base, "--dataset-config", "[1, 2]"])
    assert res.exit_code == 2 and "JSON object" in res.output
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", *base, "--dataset-config", "{bad"])
    assert res.exit_code == 2 and "valid JSON" in res.output
    res = runner.invoke(cli, ["eval", "reasoning_gym:chain_sum", *base, "--dataset-config", '{"min_terms": "x"}'])
    assert res.exit_code == 2 and "rejected the configuration" in res.output
    res = runner.invoke(cli, ["eval", "bfcl", *base, "--dataset-config", "{}"])
    assert res.exit_code == 2 and "--dataset-config applies to" in res.output
    assert not (tmp_path / "z").exists()
