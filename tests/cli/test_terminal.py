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
from typing import Any

import pytest

from envsched.cli.explain import COMPACT_TERMS, DETAIL_TERMS, HANG, LEGEND

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_pool.jsonl"
WIDTH, HEIGHT = 80, 24

pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="tmux is not installed (apt-get install tmux; .ci/run installs it)"),
              pytest.mark.slow]  # a real terminal per test: outside the fast lane


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

    def run(self, args: list[str], timeout_s: float = 600, record: Path | None = None,
            width: int = WIDTH) -> tuple[int, list[str]]:
        """Run ``envsched ARGS`` in a fresh ``width`` x HEIGHT pane; return its exit status and every screen line
        (scrollback included), wrapped lines joined. ``record``: also write every byte the command sends to
        the terminal to this file (tmux ``pipe-pane``, attached before the command starts)."""
        self.n += 1
        name = f"t{self.n}"
        cmd = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "envsched.cli.main", *args])
        if record is not None:  # the command waits until the pipe is attached
            cmd = f"tmux -S {shlex.quote(self.sock)} wait-for {name}-go; {cmd}"
        self.tmux("new-session", "-d", "-s", name, "-x", str(width), "-y", str(HEIGHT), "-c", str(self.cwd),
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
                time.sleep(0.1)  # a capture costs about 3 ms; a 0.5 s poll waited 0.25 s per run on average
            raise AssertionError(f"envsched {' '.join(args)} did not finish in {timeout_s} s")
        finally:
            self.tmux("kill-session", "-t", name)


@pytest.fixture
def pane(tmp_path):
    p = Pane(tmp_path)
    yield p
    subprocess.run(["tmux", "-S", p.sock, "kill-server"], capture_output=True)


def _assert_clean(lines: list[str], width: int = WIDTH) -> None:
    broken = [x for x in lines if _width(x) > width]
    assert not broken, f"lines the {width}-column terminal had to wrap:\n" + "\n".join(broken)
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


# ---------------------------------------------------------------------------------------------- explain's lines
def _logical(lines: list[str], starts: Any) -> list[list[Any]]:
    """The screen's lines joined into the lines explain printed: a line for which ``starts(text, indent)`` holds
    begins one; any other line continues the last and must be indented HANG further than the line it continues
    (a wrapped line that lost its indent reads as a line of its own)."""
    out: list[list[Any]] = []
    for x in lines:
        if not x.strip():
            continue
        indent = len(x) - len(x.lstrip(" "))
        if starts(x.strip(), indent):
            out.append([indent, x.strip(), 1])
        else:
            assert out and indent == out[-1][0] + HANG, f"a wrapped line lost its indent: {x!r} after {out[-1][1]!r}"
            out[-1][1] += " " + x.strip()
            out[-1][2] += 1
    return out


def _legend_starts(text: str, indent: int) -> bool:
    return text == "Terms:" or (indent == 2 and any(text.startswith(f"{term}: ") for term, _ in LEGEND.values()))


def _compact_starts(run_file: str) -> Any:
    def starts(text: str, indent: int) -> bool:
        if indent == 0:
            return text.startswith(f"{run_file}: ") or bool(re.match(r"step \d+ rank \d+: ", text)) or text == "Terms:"
        return indent == 2 and (text.startswith(("q ", "within ")) or _legend_starts(text, indent))
    return starts


_DETAIL_LINES = ("q = ", "global reference:", "decline ", "within-environment estimate", "cross-environment estimate",
                 "similarity to the batch", "environment:", "cap ", "progress filter:", "relaxed to fill", "cold start")


def _detail_starts(record: dict[str, Any]) -> Any:
    neighbours = {f"{nb['id']} ({nb['env']})" for rel in record["relations"].values() for nb in rel["neighbors"]}

    def starts(text: str, indent: int) -> bool:
        heading = f"{record['task_id']} ({record['env']}) at step"
        return ((indent == 0 and (text.startswith(heading) or text == "Terms:"))
                or (indent == 2 and (text.startswith(_DETAIL_LINES) or _legend_starts(text, indent)))
                or (indent == 4 and text in neighbours) or (indent == 6 and text.startswith("weight ")))
    return starts


def _n(x: Any, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _explain_piped(pane: Pane, args: list[str], env: dict[str, str] | None = None) -> list[str]:
    res = subprocess.run([sys.executable, "-m", "envsched.cli.main", "explain", *args], capture_output=True, text=True,
                         env=env or pane.env, cwd=pane.cwd, check=True)
    return res.stdout.splitlines()


def test_explain_wraps_with_a_hanging_indent_and_explains_every_term(pane):
    """At 80 and 100 columns and piped: a line too long for the terminal continues on lines indented two spaces
    further than it (it used to continue at column 0), nothing is lost, and every term the output uses is in
    its legend, once (q, within/cross, (ref), off, caps ... were unexplained)."""
    subprocess.run([sys.executable, "-m", "envsched.cli.main", "run", "--pool", str(TINY), "--batch-size", "8",
                    "--group-size", "4", "--steps", "8", "--explain", "run.jsonl"], capture_output=True, env=pane.env,
                   cwd=pane.cwd, check=True)
    # a copy where some estimates stand in for unobserved neighbours and the cross relation is switched off
    crafted = []
    for line in (pane.tmp / "run.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "pick" and rec["step"] == 5 and rec.get("relations"):
            rec["relations"]["cross"]["used"] = False
            rec["relations"]["within"]["has_observed_neighbors"] = False
        crafted.append(json.dumps(rec))
    (pane.tmp / "ablated.jsonl").write_text("\n".join(crafted) + "\n")
    records = json.loads("\n".join(_explain_piped(pane, ["ablated.jsonl", "--step", "6", "--json"])))
    detailed = next(r for r in records if r.get("predicted"))
    narrow = {**pane.env, "COLUMNS": "60"}
    wrapped = 0
    for where in ("80 columns", "100 columns", "piped", "piped at 60 columns"):
        for view in ("records", "task"):
            args = ["ablated.jsonl", "--step", "6"] + (["--task", detailed["task_id"]] if view == "task" else [])
            if where.startswith("piped"):
                width = 60 if "60" in where else 80
                lines = _explain_piped(pane, args, narrow if width == 60 else None)
            else:
                width = int(where.split()[0])
                rc, lines = pane.run(["explain", *args], width=width)
                assert rc == 0, "\n".join(lines)
            _assert_clean(lines, width)
            starts = _compact_starts("ablated.jsonl") if view == "records" else _detail_starts(detailed)
            logical = _logical(lines, starts)
            wrapped += sum(n - 1 for _, _, n in logical)
            texts = [t for _, t, _ in logical]
            legend_at = texts.index("Terms:")
            shown = set(texts[legend_at + 1:])
            body = "\n".join(texts[:legend_at])
            terms = COMPACT_TERMS if view == "records" else DETAIL_TERMS
            for key in terms:  # a term of the view is explained when the output uses it, and only once
                term, meaning = LEGEND[key]
                used = {"ref": "(ref)" in body, "off": " off" in body,
                        "novelty": "novelty" in body, "relaxed": "relaxed to fill" in body}.get(key, True)
                assert (f"{term}: {meaning}" in shown) == used, (where, view, key)
            assert len(shown) == len(texts) - legend_at - 1  # no entry twice
            assert "(ref)" in body and " off" in body  # the crafted step uses both
            if view == "records":
                for rec in records:  # each record's numbers, whole, on its own (joined) line
                    pred = rec.get("predicted") or {}
                    assert (f"q {_n(rec.get('q'))}; predicted mean {_n(pred.get('mean'), 3)}, dispersion "
                            f"{_n(pred.get('dispersion'), 3)}, variance {_n(pred.get('variance'))}") in texts
            else:
                for rel in ("within", "cross"):
                    for nb in detailed["relations"][rel]["neighbors"]:
                        assert f"{nb['id']} ({nb['env']})" in texts
    assert wrapped > 0  # the outputs did need wrapping: the indent rule was exercised


def test_explain_legend_alone_and_without(pane):
    subprocess.run([sys.executable, "-m", "envsched.cli.main", "run", "--pool", str(TINY), "--batch-size", "8",
                    "--group-size", "4", "--steps", "3", "--explain", "run.jsonl"], capture_output=True, env=pane.env,
                   cwd=pane.cwd, check=True)
    rc, lines = pane.run(["explain", "--legend"])
    assert rc == 0, "\n".join(lines)
    _assert_clean(lines)
    texts = [t for _, t, _ in _logical(lines, lambda text, indent: _legend_starts(text, indent))]
    assert texts == ["Terms:"] + [f"{term}: {meaning}" for term, meaning in
                                  (LEGEND[k] for k in dict.fromkeys((*COMPACT_TERMS, *DETAIL_TERMS)))]
    plain = _explain_piped(pane, ["run.jsonl", "--no-legend"])
    assert "Terms:" not in plain and _logical(plain, _compact_starts("run.jsonl"))[-1][1].startswith("within ")
    res = subprocess.run([sys.executable, "-m", "envsched.cli.main", "explain"], capture_output=True, text=True,
                         env=pane.env, cwd=pane.cwd)
    assert res.returncode == 2 and "Missing argument 'RUN_FILE' (or give --legend" in res.stderr


def test_dashboard_on_a_port_in_use_is_one_line_and_no_url(pane):
    import socket

    subprocess.run([sys.executable, "-m", "envsched.cli.main", "run", "--pool", str(TINY), "--batch-size", "8",
                    "--group-size", "4", "--steps", "2", "--store", "h.sqlite"], capture_output=True, env=pane.env,
                   cwd=pane.cwd, check=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, lines = pane.run(["dashboard", "h.sqlite", "--port", str(port)], timeout_s=120)
    screen = [x for x in lines if x.strip()]
    assert rc == 1 and len(screen) == 1, "\n".join(lines)
    assert screen[0].startswith(f"Error: cannot serve on 127.0.0.1:{port}: address already in use")
