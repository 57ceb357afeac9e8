"""`envsched explain RUN_FILE` on run files that are not what `envsched run --explain` writes (issue 38,
finding 6): every one is refused with exit status 1 (2 for a usage error) and one line naming the file (and
the line, or the record), never a traceback, a hang or unbounded memory; nothing is written. The rules are
the ones `envsched report --run-file` applies (envsched.method.run_file), so both refuse the same inputs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.method.run_file import MAX_RUN_JSON_DEPTH, MAX_RUN_LINE_BYTES

HEADER = json.dumps({"format": "envsched.explain/1", "kind": "header", "num_tasks": 4})


def _pick(**changes: Any) -> dict[str, Any]:
    rec = {"format": "envsched.explain/1", "kind": "pick", "step": 0, "rank": 1, "task_id": "t0", "env": "e0",
           "phase": "coverage", "score": 0.5, "q": 0.25, "predicted": {"mean": 0.5, "dispersion": 1.0,
                                                                    "variance": 0.2}, "caps": {}}
    rec.update(changes)
    return rec


def _explain(*args: str) -> Any:
    return CliRunner().invoke(cli, ["explain", *args])


def _refused(res: Any, match: str, code: int = 1) -> str:
    text = res.output
    assert res.exit_code == code, text
    assert "Traceback" not in text and match in text, text
    error_lines = [line for line in text.splitlines() if line.startswith("Error")]
    assert len(error_lines) == 1, text
    return error_lines[0]


def _listing(folder: Path) -> list[tuple[str, int]]:
    return sorted((p.name, p.stat().st_size) for p in folder.iterdir())


# ---------------------------------------------------------------------------------------------- not a file
@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX special files")
def test_a_fifo_is_refused_without_hanging(tmp_path):
    """A named pipe with no writer blocked open() forever; a real process with a real FIFO and a timeout."""
    fifo = tmp_path / "run.jsonl"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "envsched.cli.main", "explain", str(fifo)], capture_output=True,
                          text=True, timeout=60)  # a guard against the hang: it answers in about a second
    assert proc.returncode == 1, proc.stderr
    assert "is not a regular file" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX special files")
def test_a_fifo_with_a_writer_streaming_forever_is_refused(tmp_path):
    fifo = tmp_path / "run.jsonl"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"f = open({str(fifo)!r}, 'w')\nwhile True: f.write('[' * 999)"],
                              stderr=subprocess.DEVNULL)
    try:
        res = _explain(str(fifo))
        _refused(res, "is not a regular file")
    finally:
        writer.kill()
        writer.wait(timeout=30)


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_a_device_is_refused_before_a_byte_is_read(target):
    if not os.path.exists(target):
        pytest.skip(f"no {target}")
    _refused(_explain(target), "is not a regular file")


def test_a_link_to_a_device_is_refused(tmp_path):
    link = tmp_path / "run.jsonl"
    link.symlink_to("/dev/zero")
    _refused(_explain(str(link)), "is not a regular file")


def test_a_socket_is_refused():
    folder = Path(tempfile.mkdtemp(dir="/tmp"))  # a socket's path must be short
    path = folder / "s.jsonl"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    try:
        _refused(_explain(str(path)), "is not a regular file")
    finally:
        s.close()


def test_a_missing_file_and_a_directory_are_refused(tmp_path):
    _refused(_explain(str(tmp_path / "none.jsonl")), "run file not found")
    _refused(_explain(str(tmp_path)), "is a directory", code=2)  # click's own usage error


# ---------------------------------------------------------------------------------------------- lines over the caps
LINES_OVER_THE_CAPS = {
    "nested_100000": (["[" * 100_000 + "]" * 100_000], "line 1: the JSON is nested deeper than 64"),
    "nested_objects": (['{"a":' * 50_000 + "1" + "}" * 50_000], "line 1: the JSON is nested deeper than 64"),
    "nested_just_over": ([HEADER, "[" * (MAX_RUN_JSON_DEPTH + 1) + "]" * (MAX_RUN_JSON_DEPTH + 1)],
                         "line 2: the JSON is nested deeper than 64"),
    "nested_inside_a_record": ([json.dumps(_pick(caps={"c": "@"})).replace(
        '"@"', "[" * 80 + "]" * 80)], "line 1: the JSON is nested deeper than 64"),
    "long_line": ([HEADER, json.dumps("x" * MAX_RUN_LINE_BYTES)], "line 2: the line is longer than 4194304 bytes"),
    "long_unfinished_line": ([HEADER, "{" + " " * (MAX_RUN_LINE_BYTES + 10)], "line 2: the line is longer than"),
}


@pytest.mark.parametrize("name", sorted(LINES_OVER_THE_CAPS))
def test_a_line_over_the_caps_is_refused_naming_it(tmp_path, name):
    lines, match = LINES_OVER_THE_CAPS[name]
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines) + ("" if name == "long_unfinished_line" else "\n"))
    before = _listing(tmp_path)
    line = _refused(_explain(str(path)), match)
    assert str(path) in line
    assert _listing(tmp_path) == before


def test_exactly_at_the_caps_is_read(tmp_path):
    """The caps are exact: a record nested to the cap and a line of the cap's length are taken in."""
    path = tmp_path / "run.jsonl"
    nested = "[" * (MAX_RUN_JSON_DEPTH - 2) + "]" * (MAX_RUN_JSON_DEPTH - 2)  # within relaxed (depth 2)
    rec = json.dumps(_pick(relaxed="@")).replace('"@"', nested)
    pad = MAX_RUN_LINE_BYTES - len(json.dumps(_pick(pad=""))) - 1  # the line, newline included, at the cap
    long_rec = json.dumps(_pick(step=1, pad="p" * pad))
    assert len(long_rec) + 1 == MAX_RUN_LINE_BYTES
    path.write_text("\n".join([HEADER, rec, long_rec]) + "\n")
    res = _explain(str(path), "--json")
    assert res.exit_code == 0, res.output[-500:]
    assert [r["step"] for r in json.loads(res.output)] == [1, 2]


# ---------------------------------------------------------------------------------------------- bad lines and records
BAD_RECORDS = {
    "invalid_utf8": (b"\xff\xfe{}", "line 1: not UTF-8 text"),
    "invalid_json": (b'{"format": ', "line 1: invalid JSON"),
    "not_a_record": (json.dumps({"step": 1}).encode(), "line 1: not an explanation record"),
    "a_list": (json.dumps([_pick()]).encode(), "line 1: not an explanation record"),
    "step_text": (json.dumps(_pick(step="3")).encode(), "has the step '3', expected a step number"),
    "step_negative": (json.dumps(_pick(step=-1)).encode(), "has the step -1, expected a step number"),
    "step_huge": (json.dumps(_pick(step=10**30)).encode(), "expected a step number"),
    "step_bool": (json.dumps(_pick(step=True)).encode(), "has the step True, expected a step number"),
    "step_missing": (json.dumps({k: v for k, v in _pick().items() if k != "step"}).encode(), "has the step None"),
    "phase_missing": (json.dumps({k: v for k, v in _pick().items() if k != "phase"}).encode(),
                      "is malformed (field 'phase' is missing)"),
    "predicted_text": (json.dumps(_pick(predicted="soon")).encode(), "the record of task 't0' at step 1 is malformed"),
    "caps_list": (json.dumps(_pick(caps=[1, 2])).encode(), "the record of task 't0' at step 1 is malformed"),
    "cap_not_an_object": (json.dumps(_pick(caps={"c": 5})).encode(), "is malformed"),
    "relations_number": (json.dumps(_pick(relations={"within": 5})).encode(), "is malformed"),
    "q_text": (json.dumps(_pick(q="high")).encode(), "is malformed (ValueError"),
    "relaxed_number": (json.dumps(_pick(relaxed=5)).encode(), "is malformed"),
}


@pytest.mark.parametrize("name", sorted(BAD_RECORDS))
@pytest.mark.parametrize("width", [80, 200])  # the vertical records and the wide table
def test_a_malformed_record_is_one_line_naming_it(tmp_path, monkeypatch, name, width):
    monkeypatch.setenv("COLUMNS", str(width))
    data, match = BAD_RECORDS[name]
    path = tmp_path / "run.jsonl"
    path.write_bytes(data + b"\n")
    line = _refused(_explain(str(path)), match)
    assert str(path) in line


@pytest.mark.parametrize("name", ["cap_not_an_object", "relations_number", "predicted_text", "phase_missing"])
def test_a_malformed_record_in_the_detailed_view_is_one_line(tmp_path, name):
    data, _ = BAD_RECORDS[name]
    path = tmp_path / "run.jsonl"
    path.write_bytes(data + b"\n")
    _refused(_explain(str(path), "--task", "t0"), "the record of task 't0' at step 1 is malformed")


def test_terminal_escapes_and_markup_in_a_record_are_shown_as_text(tmp_path, monkeypatch):
    path = tmp_path / "run.jsonl"
    rec = _pick(task_id="t\x1b[2J\x1b]0;owned\x07", env="[bold red]e0[/]", phase="[/closing]")
    path.write_text(json.dumps(rec) + "\n")
    for width in ("80", "200"):
        monkeypatch.setenv("COLUMNS", width)
        res = _explain(str(path))
        assert res.exit_code == 0, res.output
        assert "\x1b" not in res.output and "\\x1b[2J" in res.output
        assert "[bold red]e0[/]" in res.output.replace("\n", "") and "[/closing]" in res.output.replace("\n", "")
    full = {**rec, "predicted": None, "novelty": 0.5, "similarity": {"max_similarity": 0.1},
            "exposure": {"exposure": 0.0, "discount": 1.0},
            "coverage": {"env_selections_before": 0, "env_batch_count": 1, "task_observations_before": 0},
            "caps": {"\x1b[31mcap": {"paper": "[red]", "count": 1, "limit": 2, "reached": False}},
            "filters": {"progress": {"transitions": 0, "residual": None, "filtered": False},
                        "identifier": {"flagged": True, "reason": "[blink]\x1b[5m"}}}
    path.write_text(json.dumps(full) + "\n")
    res = _explain(str(path), "--task", rec["task_id"])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "[/closing]" in res.output and "[blink]\\x1b[5m" in res.output


def test_nan_and_infinity_in_a_record_do_not_break_the_json_output(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(_pick(q=float("nan"), score=float("inf"))) + "\n")
    res = _explain(str(path), "--json")
    assert res.exit_code == 0
    out = json.loads(res.output)  # Python's parser reads NaN and Infinity back
    assert out[0]["step"] == 1 and out[0]["score"] == float("inf")
