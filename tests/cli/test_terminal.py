"""What a user sees on an 80 x 24 terminal: `envsched run`, `explain`, `bench --quick` and `store info` run in a
real tmux pane of that size and the screen (with its scrollback) is read back with ``capture-pane``.

A line the terminal had to wrap (longer than the 80 columns) comes back from ``capture-pane -J`` joined, so
longer than 80 characters: that is a broken line. The progress display must never share a line with a table
row, and no value may be cut to an ellipsis.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_pool.jsonl"
WIDTH, HEIGHT = 80, 24

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (apt-get install tmux; .ci/run installs it)")


def _width(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


class Pane:
    """A detached tmux session of WIDTH x HEIGHT on a private server (its own socket under tmp_path)."""

    def __init__(self, tmp_path: Path) -> None:
        self.sock = str(tmp_path / "tmux.sock")
        conf = tmp_path / "tmux.conf"
        conf.write_text("set -g history-limit 100000\nset -g status off\n")
        self.conf = str(conf)
        self.env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                    "ENVSCHED_CACHE_DIR": str(tmp_path / "cache"), "TERM": "xterm-256color"}
        self.env.pop("COLUMNS", None)
        self.env.pop("LINES", None)
        self.cwd = self.tmp = tmp_path
        self.n = 0
        # a session that lives as long as the fixture: the server would otherwise exit with each run's session
        self.tmux("new-session", "-d", "-s", "keep", "-x", str(WIDTH), "-y", str(HEIGHT), "sleep 3600")

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.sock, "-f", self.conf, *args], capture_output=True, text=True,
                              env=self.env, check=True).stdout

    def run(self, args: list[str], timeout_s: float = 600, record: Path | None = None) -> tuple[int, list[str]]:
        """Run ``envsched ARGS`` in a fresh WIDTH x HEIGHT pane; return its exit status and every screen line
        (scrollback included), wrapped lines joined. ``record``: also write every byte the command sends to
        the terminal to this file (tmux ``pipe-pane``, attached before the command starts)."""
        self.n += 1
        name = f"t{self.n}"
        cmd = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "envsched.cli.main", *args])
        if record is not None:  # the command waits until the pipe is attached
            cmd = f"tmux -S {shlex.quote(self.sock)} wait-for {name}-go; {cmd}"
        self.tmux("new-session", "-d", "-s", name, "-x", str(WIDTH), "-y", str(HEIGHT), "-c", str(self.cwd),
                  f"{cmd}; echo __exit=$?; sleep 3600")
        if record is not None:
            self.tmux("pipe-pane", "-o", "-t", name, f"cat > {shlex.quote(str(record))}")
            self.tmux("wait-for", "-S", f"{name}-go")
        deadline = time.monotonic() + timeout_s  # only a guard against a hang
        try:
            while time.monotonic() < deadline:
                screen = self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", name)
                m = re.search(r"__exit=(\d+)", screen)
                if m:
                    lines = screen.splitlines()
                    return int(m.group(1)), lines[: next(i for i, x in enumerate(lines) if "__exit=" in x)]
                time.sleep(0.5)
            raise AssertionError(f"envsched {' '.join(args)} did not finish in {timeout_s} s")
        finally:
            self.tmux("kill-session", "-t", name)


@pytest.fixture
def pane(tmp_path):
    p = Pane(tmp_path)
    yield p
    subprocess.run(["tmux", "-S", p.sock, "kill-server"], capture_output=True)


def _assert_clean(lines: list[str]) -> None:
    broken = [x for x in lines if _width(x) > WIDTH]
    assert not broken, "lines the 80-column terminal had to wrap:\n" + "\n".join(broken)
    cut = [x for x in lines if "…" in x]
    assert not cut, "values cut to an ellipsis:\n" + "\n".join(cut)


def test_run_rows_and_progress_on_separate_lines(pane):
    rc, lines = pane.run(["run", "--pool", str(TINY), "--batch-size", "8", "--group-size", "4", "--steps", "40",
                          "--explain", "explain.jsonl"])
    assert rc == 0, "\n".join(lines)
    _assert_clean(lines)
    row = re.compile(r"^\s+(\d+)\s+\d+\s+\d+\s+[\d.-]+\s+[\d.-]+\s+\d+/8\s+\d+$")
    steps = [int(m.group(1)) for x in lines if (m := row.match(x))]
    assert steps == list(range(1, 41))  # every row whole, in order, alone on its line (no progress text on it)

    # explain: vertical records on 80 columns, nothing cut; --task: the neighbours one per record
    rc, lines = pane.run(["explain", "explain.jsonl", "--step", "3"])
    assert rc == 0, "\n".join(lines)
    _assert_clean(lines)
    records = json.loads(subprocess.run(
        [sys.executable, "-m", "envsched.cli.main", "explain", "explain.jsonl", "--step", "3", "--json"],
        capture_output=True, text=True, env=pane.env, cwd=pane.cwd, check=True).stdout)
    screen = "\n".join(lines)
    for rec in records:  # every selected task id appears whole
        assert f"step 3 rank {rec['rank']}: {rec['task_id']} ({rec['env']})" in screen
    with_history = next(r for r in records if r.get("predicted"))
    rc, lines = pane.run(["explain", "explain.jsonl", "--step", "3", "--task", with_history["task_id"]])
    assert rc == 0, "\n".join(lines)
    _assert_clean(lines)
    for nb in with_history["relations"]["within"]["neighbors"]:
        assert any(nb["id"] in x for x in lines)


_CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BAR = re.compile(r"^steps\b.*?\b(\d+)/(\d+)\b")
_ROW = re.compile(r"^\s+(\d+)\s+\d+\s+\d+\s+[\d.-]+\s+[\d.-]+\s+\d+/\d+\s+\d+\s*$")


def test_run_progress_bar_moves_with_the_rows(pane):
    """Every byte `envsched run` sends to the terminal (tmux ``pipe-pane``), in order: each time a row is
    printed, the bar drawn under it counts that row's step, and no bar ever counts fewer steps than the rows
    above it (it used to show the count of its last timed refresh: 42/50 while rows 43-50 printed)."""
    raw = pane.tmp / "raw.txt"
    rc, lines = pane.run(["run", "--pool", str(TINY), "--batch-size", "8", "--group-size", "4", "--steps", "50",
                          "--sampler", "uniform"], record=raw)
    assert rc == 0, "\n".join(lines)
    events = []  # ("row" | "bar", step) in the order they reached the terminal
    for segment in re.split(r"[\r\n]", _CSI.sub("", raw.read_bytes().decode("utf-8", "replace"))):
        if m := _ROW.match(segment):
            events.append(("row", int(m.group(1))))
        elif m := _BAR.match(segment):
            assert int(m.group(2)) == 50, segment
            events.append(("bar", int(m.group(1))))
    assert [s for kind, s in events if kind == "row"] == list(range(1, 51))
    last_row = 0
    for (kind, step), nxt in zip(events, [*events[1:], None], strict=True):
        if kind == "row":
            last_row = step
            assert nxt is not None and nxt[0] == "bar" and nxt[1] == step, \
                f"row {step} was printed with the bar at {nxt}"
        else:
            assert step >= last_row, f"the bar showed {step}/50 under row {last_row}"
    assert events[-1] == ("bar", 50)


def test_store_info_shows_every_parameter_whole(pane):
    env = pane.env
    subprocess.run([sys.executable, "-m", "envsched.cli.main", "run", "--pool", str(TINY), "--batch-size", "8",
                    "--group-size", "4", "--steps", "3", "--store", "h.sqlite"], capture_output=True, env=env,
                   cwd=pane.cwd, check=True)
    info = json.loads(subprocess.run([sys.executable, "-m", "envsched.cli.main", "store", "info", "h.sqlite",
                                      "--json"], capture_output=True, text=True, env=env, cwd=pane.cwd,
                                     check=True).stdout)
    rc, lines = pane.run(["store", "info", "h.sqlite"])
    assert rc == 0, "\n".join(lines)
    _assert_clean(lines)
    screen = "\n".join(lines)
    config = info["sampler_params"]["config"]
    assert len(json.dumps(info["sampler_params"])) > 200  # more than the table used to show
    for key, value in config.items():  # each parameter with the value --json gives
        assert f"config.{key}: {json.dumps(value)}" in screen, key
    assert info["pool_fingerprint"] in screen.replace("│", "").replace(" ", "").replace("\n", "")


def test_bench_quick_output_fits(pane):
    # the --quick layout on the tiny pool, with fewer seeds and steps so that the test stays short
    rc, lines = pane.run(["bench", "--quick", "--pool", str(TINY), "--batch-size", "8", "--seeds", "2", "--steps",
                          "6", "--coldstart-runs", "2", "--coldstart-steps", "3", "--workers", "1", "--no-plots",
                          "--out", "bench-out"])
    assert rc == 0, "\n".join(lines)
    _assert_clean(lines)
    screen = "\n".join(lines)
    assert "Held-out score" in screen and "written to bench-out" in screen
