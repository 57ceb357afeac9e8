"""``envsched run`` streams its rows, writes explanation records and a history store that ``envsched explain``
and ``envsched store`` read, and the CLI's messages name what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_pool.jsonl"
ARGS = ["run", "--pool", str(TINY), "--batch-size", "8", "--group-size", "4"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_rows_reach_a_pipe_while_the_run_goes_on(tmp_path):
    """`run | head -2` gets the title and header, then rows as steps end: the reader sees a row before the
    run is over (the run is far longer than the reader waits), and the run then stops quietly on the
    closed pipe instead of writing a traceback."""
    env = {**os.environ, "ENVSCHED_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "envsched.cli.main", *ARGS, "--sampler", "uniform",
                             "--steps", "1000000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        title = proc.stdout.readline().decode()
        header = proc.stdout.readline().decode()
        first = proc.stdout.readline().decode()
        assert "uniform on" in title and "within-task var" in header
        assert first.split()[0] == "1" and first.split()[-2].endswith("/8")
        proc.stdout.close()  # the reader leaves, as `head` does
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    assert rc == 0 and "Traceback" not in err
    assert "envsched: scheduling 1000000 batches" in err  # progress goes to stderr, piped or not


def test_json_lines_one_per_step_then_summary(tmp_path):
    res = CliRunner().invoke(cli, [*ARGS, "--sampler", "uniform", "--steps", "3", "--json"])
    assert res.exit_code == 0, res.output
    lines = _lines(res.stdout)
    assert [x["kind"] for x in lines] == ["step", "step", "step", "summary"]
    assert [x["step"] for x in lines[:3]] == [1, 2, 3]
    assert all(x["groups"] == 8 for x in lines[:3])
    assert lines[-1]["sampler_metrics"]["groups"] == 24


def test_explain_and_store_from_the_cli_alone(tmp_path):
    explain_file, store = tmp_path / "explain.jsonl", tmp_path / "history.sqlite"
    runner = CliRunner()
    res = runner.invoke(cli, [*ARGS, "--steps", "3", "--json", "--explain", str(explain_file),
                              "--store", str(store)])
    assert res.exit_code == 0, res.output
    steps = _lines(res.stdout)[:3]
    # explain counts steps as run does: run's step 2 is explain's step 2
    res = runner.invoke(cli, ["explain", str(explain_file), "--step", "2", "--json"])
    assert res.exit_code == 0, res.output
    records = json.loads(res.stdout)
    assert len(records) == 8 and {r["step"] for r in records} == {2}
    assert {r["env"] for r in records} and steps[1]["envs_covered"] == len({r["env"] for r in records})
    res = runner.invoke(cli, ["explain", str(explain_file), "--step", "0"])
    assert res.exit_code == 2 and "0 is not in the range 1<=x<=" in res.output
    res = runner.invoke(cli, ["explain", str(explain_file), "--step", "4"])
    assert res.exit_code == 1 and "no explanation records for step 4" in res.output
    # the store holds the run: 3 draws and 24 updates, and it rebuilds
    res = runner.invoke(cli, ["store", "info", str(store), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["by_kind"] == {"sample": 3, "update": 24}
    assert info["sampler_class"].endswith(":EnvSchedSampler")
    res = runner.invoke(cli, ["store", "verify", str(store), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["ok"], res.output
    # a second run on the same store without --resume is refused before any work, nothing changed
    before = store.read_bytes()
    res = runner.invoke(cli, [*ARGS, "--steps", "1", "--store", str(store), "--sampler", "envsched"])
    assert res.exit_code == 1 and "already holds a run's history" in res.output
    assert store.read_bytes() == before
    # explanations exist for EnvSched only
    res = runner.invoke(cli, [*ARGS, "--sampler", "uniform", "--steps", "1", "--explain", str(tmp_path / "x")])
    assert res.exit_code == 2 and "--sampler uniform writes none" in res.output


def test_explain_on_a_steps_file_says_where_explanations_come_from(tmp_path):
    out = tmp_path / "run1"
    res = CliRunner().invoke(cli, [*ARGS, "--sampler", "uniform", "--steps", "1", "--output", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["explain", str(out / "steps.jsonl")])
    assert res.exit_code == 1
    assert "not an explanation record" in res.output and "envsched run --explain FILE" in res.output


def test_relaxed_caps_are_shown_as_relaxed():
    from envsched.cli.explain import _caps

    rec = {"caps": {"cold_start_max_per_env": {"count": 4, "limit": 2, "reached": True},
                    "env_quota_per_batch": {"count": 11, "limit": 11, "reached": True},
                    "max_per_env_coverage": {"count": 0, "limit": 4, "reached": False}},
           "relaxed": ["cold_start_max_per_env->4"]}
    assert _caps(rec) == "cold_start_max_per_env relaxed to 4 (4/2), env_quota_per_batch=11/11"
    assert _caps({"caps": {}, "relaxed": ["progress_filter"]}) == "progress_filter relaxed"
    assert _caps({"caps": {"c": {"count": 1, "limit": 2, "reached": False}}}) == "-"


def test_resume_with_another_sampler_names_the_field(tmp_path):
    out = tmp_path / "run"
    runner = CliRunner()
    res = runner.invoke(cli, [*ARGS, "--sampler", "uniform", "--steps", "1", "--output", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, [*ARGS, "--sampler", "plr", "--steps", "2", "--output", str(out), "--resume"])
    assert res.exit_code == 1
    msg = " ".join(res.output.split())
    assert "sampler: 'uniform' in the checkpoint, 'plr' now" in msg
    assert "'pool'" not in msg and "batch_size" not in msg  # only what differs
    res = runner.invoke(cli, [*ARGS, "--sampler", "uniform", "--steps", "2", "--output", str(out)])
    assert res.exit_code == 1
    assert "continue it with --resume" in res.output and "resume=True" not in res.output


def test_store_info_on_a_missing_file_says_not_found_and_creates_nothing(tmp_path):
    missing = tmp_path / "missing.sqlite"
    for cmd in ("info", "verify"):
        res = CliRunner().invoke(cli, ["store", cmd, str(missing)])
        assert res.exit_code == 1 and f"store not found: {missing}" in res.output
    assert not missing.exists()


def test_pool_inspect_on_an_empty_file_fails(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = CliRunner().invoke(cli, ["pool", "inspect", str(empty)])
    assert res.exit_code == 1 and "holds no task specs (an empty pool)" in res.output
    res = CliRunner().invoke(cli, ["run", "--pool", str(empty), "--steps", "1"])
    assert res.exit_code == 1 and "an empty pool" in res.output


def test_truncated_json_message_reads_right(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "env": "e"}\n{"id": "b", "env": "e", "instruction": "unterminated\n')
    res = CliRunner().invoke(cli, ["pool", "inspect", str(bad)])
    assert res.exit_code == 1
    assert "line 2: invalid JSON (Unterminated string starting at column 40)" in res.output
    assert "at at" not in res.output


def test_missing_extra_is_named_before_any_work(monkeypatch, tmp_path):
    from envsched.cli import common

    monkeypatch.setitem(common.EXTRAS, "postgres", ("envsched_no_such_module",))
    res = CliRunner().invoke(cli, [*ARGS, "--steps", "1", "--store", "postgresql+psycopg://u@127.0.0.1:1/db"])
    assert res.exit_code == 1
    assert res.output.strip().splitlines()[-1] == (
        "Error: --store with a PostgreSQL URL needs the 'postgres' extra (envsched_no_such_module not installed): "
        "python -m pip install 'envsched[postgres]' (in a clone: python -m pip install -e '.[postgres]')")
    assert "envsched: " not in res.output  # no pool was loaded


def test_help_imports_no_command_and_no_numpy():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom envsched.cli.main import cli\n"
            "r = CliRunner().invoke(cli, ['--help'])\nassert r.exit_code == 0, r.output\n"
            "print(r.output)\nprint(sorted(m for m in sys.modules if m.startswith(('numpy', 'envsched.cli.', "
            "'sklearn', 'rich'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "['envsched.cli.main']"
    for name in ("run", "pool", "explain", "store", "bench", "eval"):
        assert f"  {name} " in out


def test_eval_on_an_openenv_server_names_its_extra_first(monkeypatch, tmp_path):
    from envsched.cli import common

    monkeypatch.setitem(common.EXTRAS, "openenv", ("envsched_no_such_module",))
    res = CliRunner().invoke(cli, ["eval", "http://127.0.0.1:9/", "--llm-endpoint", "http://127.0.0.1:9/v1",
                                   "--model", "m", "--output-dir", str(tmp_path / "e")])
    assert res.exit_code != 0
    assert "evaluating on an OpenEnv server (http://127.0.0.1:9/) needs the 'openenv' extra" in res.output
    assert "python -m pip install 'envsched[openenv]'" in res.output
    assert not (tmp_path / "e").exists()


def test_the_help_lists_the_registry_samplers(monkeypatch):
    from envsched.cli.run import SAMPLER_NAMES
    from envsched.samplers import registry

    assert sorted(SAMPLER_NAMES) == sorted(registry.available_samplers())
    text = " ".join(CliRunner().invoke(cli, ["run", "--help"], terminal_width=400).output.split())
    assert "Sampler to drive: " + ", ".join(sorted(registry.available_samplers())) + " (see" in text
    record = registry.SamplerRecord("newcomer-test", "a sampler registered later",
                                    "envsched.samplers.registry:_uniform")
    monkeypatch.setitem(registry.SAMPLERS, "newcomer-test", record)
    text = " ".join(CliRunner().invoke(cli, ["run", "--help"], terminal_width=400).output.split())
    assert "newcomer-test" in text  # one more sampler in the registry: one more in the help


def _unwritable_dirs(tmp_path: Path) -> list[Path]:
    """Directories in which no file can be created, as whoever runs the tests: root (CI) ignores permission
    bits, so besides a read-only folder (for other users) this uses sysfs, where not even root may create a
    file, when it refuses here."""
    out = []
    if os.geteuid() != 0:
        ro = tmp_path / "read-only"
        ro.mkdir()
        ro.chmod(0o555)
        out.append(ro)
    sysfs = Path("/sys")
    if sysfs.is_dir():
        try:
            (sysfs / "envsched-write-check").open("w").close()
        except OSError:
            out.append(sysfs)
    return out


@pytest.mark.parametrize("option", ["--explain", "--output", "--store"])
def test_an_unwritable_output_path_is_refused_in_one_line_before_any_step(tmp_path, option):
    """An output path under a regular file, or in a folder that refuses new files: one line naming the option,
    the path and why; no step runs, and the other outputs of the command are not created either."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    targets = [a_file / "x.jsonl"] + [d / "envsched-x" for d in _unwritable_dirs(tmp_path)]
    assert len(targets) >= 2 or os.geteuid() != 0  # as root, sysfs must be the second case
    for target in targets:
        good = tmp_path / "good-run"
        args = [*ARGS, "--sampler", "envsched", "--steps", "2", option, str(target)]
        if option != "--output":
            args += ["--output", str(good)]  # a writable output given with the bad one is not created
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 1, res.output
        lines = res.output.strip().splitlines()
        assert lines == [lines[0]] and lines[0].startswith(f"Error: {option} {target}: "), res.output
        assert lines[0].endswith("; nothing was run")
        assert ("is a file, not a directory" in lines[0]) == (target.parent == a_file)
        assert "Traceback" not in res.output and "step" not in res.stdout
        assert not good.exists() and not target.exists()
        assert not (tmp_path / "cache").exists()  # no pool loaded, no graph built
    assert a_file.read_text() == "not a folder\n"


def test_a_store_path_that_is_a_folder_is_refused_before_any_work(tmp_path):
    """(click itself refuses an --explain folder and an --output file, as usage errors.)"""
    folder = tmp_path / "folder"
    folder.mkdir()
    res = CliRunner().invoke(cli, [*ARGS, "--sampler", "envsched", "--steps", "1", "--store", str(folder)])
    assert res.exit_code == 1 and res.output.strip() == f"Error: --store {folder}: {folder} is a directory; " \
                                                      "nothing was run", res.output
    assert not (tmp_path / "cache").exists()


def test_writable_outputs_in_new_folders_still_run(tmp_path):
    """The check creates nothing, and a path whose folders do not exist yet is fine when they can be made."""
    deep = tmp_path / "new" / "deeper"
    res = CliRunner().invoke(cli, [*ARGS, "--sampler", "envsched", "--steps", "2", "--json",
                                   "--explain", str(deep / "x.jsonl"), "--output", str(deep / "run"),
                                   "--store", str(tmp_path / "s.sqlite")])
    assert res.exit_code == 0, res.output
    assert (deep / "x.jsonl").stat().st_size > 0 and (deep / "run" / "steps.jsonl").exists()
    assert [p.name for p in deep.iterdir() if p.name.startswith(".envsched")] == []


def test_eval_refuses_an_unwritable_output_dir_before_reading_any_task(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    res = CliRunner().invoke(cli, ["eval", "reasoning_gym:chain_sum", "--num-tasks", "2", "-o", str(a_file / "out"),
                                   "--llm-endpoint", "http://127.0.0.1:9/v1", "--model", "m"])
    assert res.exit_code == 1
    assert res.output.strip() == f"Error: --output-dir {a_file / 'out'}: {a_file} is a file, not a directory; " \
                                 "nothing was run", res.output
