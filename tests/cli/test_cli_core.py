import json

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli


def _summary(stdout: str) -> dict:
    """The last JSON line of `run --json` (one line per step, then the summary)."""
    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert lines[-1]["kind"] == "summary" and all(x["kind"] == "step" for x in lines[:-1])
    return lines[-1]


@pytest.fixture
def pool_file(tmp_path):
    path = tmp_path / "pool.jsonl"
    with path.open("w") as fh:
        for i in range(40):
            fh.write(json.dumps({"id": f"t{i}", "env": f"env{i % 4}", "instruction": f"task {i}",
                                 "tools": [{"name": f"op{i % 5}", "description": "x"}]}) + "\n")
    return path


def test_help_explains_commands():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "run" in result.output and "pool" in result.output
    result = CliRunner().invoke(cli, ["run", "--help"])
    assert "NOT a benchmark" in result.output and "--batch-size" in result.output


def test_pool_inspect_json(pool_file):
    result = CliRunner().invoke(cli, ["pool", "inspect", str(pool_file), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["tasks"] == 40 and summary["environments"] == 4
    assert summary["by_env"]["env0"] == 10
    assert summary["missing"]["verifier"] == 40 and summary["missing"]["instruction"] == 0


def test_pool_inspect_reports_bad_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "env": "e"}\n{"id": "b"}\n')
    result = CliRunner().invoke(cli, ["pool", "inspect", str(bad)])
    assert result.exit_code == 1
    assert "line 2, field 'env': missing required field 'env'" in result.output


def test_run_json_and_resume(pool_file, tmp_path):
    out = tmp_path / "run"
    args = ["run", "--pool", str(pool_file), "--sampler", "uniform", "--batch-size", "8", "--group-size", "4",
            "--output", str(out)]
    result = CliRunner().invoke(cli, [*args, "--steps", "3", "--json"])
    assert result.exit_code == 0, result.output
    summary = _summary(result.stdout)
    assert summary["steps_run"] == 3
    assert summary["sampler_metrics"]["groups"] == 24 and summary["sampler_metrics"]["episodes"] == 96
    result = CliRunner().invoke(cli, [*args, "--steps", "5", "--resume", "--json"])
    assert result.exit_code == 0, result.output
    summary = _summary(result.stdout)
    assert summary["steps_run"] == 2 and summary["sampler_metrics"]["groups"] == 40
    result = CliRunner().invoke(cli, [*args, "--steps", "5"])
    assert result.exit_code == 1 and "already holds a run" in result.output


def test_run_rejects_bad_options(pool_file):
    r = CliRunner().invoke(cli, ["run", "--pool", str(pool_file), "--sampler", "nope", "--steps", "1"])
    assert r.exit_code == 2 and "unknown sampler 'nope'" in r.output
    r = CliRunner().invoke(cli, ["run", "--pool", str(pool_file), "--sampler", "uniform", "--batch-size", "41",
                                 "--steps", "1"])
    assert r.exit_code == 2 and "exceeds the pool's 40 tasks" in r.output
    r = CliRunner().invoke(cli, ["run", "--pool", str(pool_file), "--steps", "0"])
    assert r.exit_code == 2
    r = CliRunner().invoke(cli, ["run", "--resume"])
    assert r.exit_code == 2 and "--resume needs --output" in r.output


@pytest.mark.parametrize("name", ["curriculum", "mopps", "greso", "plr", "envsched"])
def test_run_every_registered_sampler(pool_file, name):
    result = CliRunner().invoke(cli, ["run", "--pool", str(pool_file), "--sampler", name, "--steps", "3",
                                      "--batch-size", "8", "--group-size", "4", "--json"])
    assert result.exit_code == 0, result.output
    summary = _summary(result.stdout)
    assert summary["sampler_metrics"]["groups"] == 24
    assert summary["sampler_metrics"]["dispatched_groups"] == 24


def test_the_command_list_of_docs_cli_names_every_command():
    """The list at the top of docs/cli.md is a reader's map: every command of `envsched --help` is on it."""
    from pathlib import Path

    from envsched.cli.main import COMMANDS

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    listing = text.split("```", 2)[1]
    commands = sorted(COMMANDS)
    assert {"run", "pool", "explain", "store", "bench", "eval", "dashboard", "report"} <= set(commands)
    missing = [c for c in commands if f"envsched {c} " not in listing]
    assert not missing, f"docs/cli.md's command list leaves out {missing}"


def test_list_samplers_points_to_the_page_that_says_which_to_choose():
    from pathlib import Path

    from click.testing import CliRunner

    from envsched.cli.main import cli
    from envsched.cli.run import CHOOSING_PAGE
    from envsched.samplers.registry import available_samplers

    res = CliRunner().invoke(cli, ["run", "--list-samplers"])
    assert res.exit_code == 0, res.output
    assert [line.split(":")[0] for line in res.output.splitlines()[:len(available_samplers())]] == \
        sorted(available_samplers())
    assert CHOOSING_PAGE in res.output
    page = Path(__file__).resolve().parents[2] / CHOOSING_PAGE.split()[0]
    assert page.is_file() and "Which sampler should I use?" in page.read_text()
