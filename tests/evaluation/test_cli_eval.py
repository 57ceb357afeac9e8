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
