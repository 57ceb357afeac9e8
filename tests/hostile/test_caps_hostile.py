"""Memory and time caps on untrusted files and numbers (issue 23, findings 6 and 9).

Every crafted input here is refused with a clear error before it can cost memory or time: graph files
whose declared or decompressed sizes are huge (checked from the zip directory and the ``.npy`` headers),
special files given as pools or graphs (FIFOs, devices, /proc), huge pool files made sparse with
``truncate`` (no disk used), command-line numbers at and beyond each documented bound, and terminal escape
sequences in pool-derived names. The inputs that would once have exhausted the machine run in a child
process with an address-space limit; the child reports its peak RSS, which must stay under 2 GiB, and a
generous timeout guards against a hang.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest
from click.testing import CliRunner

import envsched
from envsched.cli import common
from envsched.cli.main import cli
from envsched.method.config import GRAPH_INT_BOUNDS, GraphConfig
from envsched.method.graph.build import build_graph
from envsched.method.graph.io import (
    DEFAULT_MAX_BYTES,
    MAX_COMPRESSION_RATIO,
    MAX_NEIGHBORS,
    GraphFileError,
    load_graph,
    read_graph_header,
    save_graph,
)
from envsched.pool import TaskPool, TaskSpecError
from envsched.pool.pool import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_JSON_BYTES, DEFAULT_MAX_LINE_BYTES

GiB = 2**30
SRC = str(Path(envsched.__file__).resolve().parents[1])
HANG_S = 120  # generous: every case here finishes in well under a second when it is refused early


def _child(code: str, *, timeout: float = HANG_S, env: dict[str, str] | None = None) -> tuple[int, str, int]:
    """Run ``code`` in a fresh interpreter limited to 6 GiB of address space; ``(exit code, stderr, peak RSS
    in bytes)``. The child prints its own ``ru_maxrss`` last, whatever happens."""
    wrapper = textwrap.dedent("""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))
        try:
        {body}
        finally:
            sys.stderr.write("\\nMAXRSS %d\\n" % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """).format(body=textwrap.indent(textwrap.dedent(code), "    "))
    full_env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", **(env or {})}
    try:
        proc = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, timeout=timeout,
                              env=full_env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for more than {timeout} s")
    found = re.findall(r"MAXRSS (\d+)", proc.stderr)
    assert found, f"the child died without reporting (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return proc.returncode, proc.stderr, int(found[-1]) * 1024  # ru_maxrss is in KiB on Linux


def _assert_small(rss: int) -> None:
    assert rss < 2 * GiB, f"peak RSS {rss / GiB:.2f} GiB"


# ================================================================================================ graph files
def _graph_pool() -> TaskPool:
    return TaskPool([{"id": f"e{e}/t{t}", "env": f"env{e}", "instruction": f"do thing {t} in {e}",
                      "tools": [{"name": f"tool_{e}_{t % 2}", "description": "a tool"}],
                      "verifier": {"checks": [f"thing {t} done"]}} for e in range(3) for t in range(5)])


@pytest.fixture(scope="module")
def good_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[TaskPool, Path]:
    pool = _graph_pool()
    return pool, save_graph(build_graph(pool), tmp_path_factory.mktemp("caps") / "good.graph.npz")


def _npy_header(shape: tuple[int, ...], descr: str) -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header = header + " " * (117 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()


def _rewrite(src: Path, dst: Path, member: str, payload: bytes | None = None, *,
             stream_zeros: int = 0, header: bytes = b"", compress: bool = False) -> Path:
    """A copy of the graph file ``src`` with ``member`` replaced by ``payload`` or by ``header`` followed by
    ``stream_zeros`` zero bytes written in 1 MiB chunks (so the test itself stays small)."""
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=method) as zout:
        for item in zin.infolist():
            if item.filename != member:
                zout.writestr(item.filename, zin.read(item.filename))
        if payload is not None:
            zout.writestr(member, payload)
        else:
            with zout.open(member, "w", force_zip64=True) as fh:
                fh.write(header)
                chunk = bytes(2**20)
                left = stream_zeros
                while left > 0:
                    fh.write(chunk[:min(left, len(chunk))])
                    left -= len(chunk)
    return dst


@pytest.fixture(scope="module")
def zip_bomb(good_graph: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``within_weight`` replaced by 768 MiB of deflated zeros (under 1 MiB on disk): about 1000:1."""
    _, good = good_graph
    size = 768 * 2**20
    rows = size // 4 // 15
    return _rewrite(good, tmp_path_factory.mktemp("bomb") / "bomb.graph.npz", "within_weight.npy",
                    header=_npy_header((15, rows), "<f4"), stream_zeros=15 * rows * 4, compress=True)


@pytest.mark.slow
@pytest.mark.hostile_budget(30)  # many inputs (or a deadline the test waits out) in one call
def test_the_zip_bomb_is_refused_from_the_directory_in_a_small_process(zip_bomb: Path) -> None:
    assert zip_bomb.stat().st_size < 4 * 2**20
    rc, err, rss = _child(f"""
        from envsched.method.graph.io import GraphFileError, load_graph
        try:
            load_graph({str(zip_bomb)!r})
        except GraphFileError as exc:
            print("REFUSED", exc, file=sys.stderr)
    """)
    assert rc == 0 and "REFUSED" in err, err[-1500:]
    assert re.search(rf"field 'within_weight'.*compressed \d+:1 .*more than the {MAX_COMPRESSION_RATIO}:1", err)
    _assert_small(rss)


def test_the_zip_bomb_header_alone_is_refused_too(zip_bomb: Path) -> None:
    with pytest.raises(GraphFileError, match="zip bomb"):
        read_graph_header(zip_bomb)


@pytest.mark.slow
def test_a_51_kb_file_declaring_44_gib_is_a_clear_error_not_memory_error(good_graph: Any, tmp_path: Path) -> None:
    """Issue 23: the header declares 44.7 GiB of float64, the member holds a few bytes."""
    _, good = good_graph
    bad = _rewrite(good, tmp_path / "declared.graph.npz", "within_similarity.npy",
                   _npy_header((15, 400_000_000), "<f8") + bytes(50_000))
    assert bad.stat().st_size < 100_000
    rc, err, rss = _child(f"""
        from envsched.method.graph.io import GraphFileError, load_graph
        try:
            load_graph({str(bad)!r})
        except GraphFileError as exc:
            print("REFUSED", exc, file=sys.stderr)
    """)
    assert rc == 0 and "REFUSED" in err and "MemoryError" not in err, err[-1500:]
    assert re.search(r"field 'within_similarity': declares \(15, 400000000\) float64 \(48000000000 bytes\) "
                     r"but holds 50000 bytes", err), err[-1500:]
    _assert_small(rss)


DECLARED = {
    "task ids declared 10**10 long": ("task_ids.npy", (10**10,), "<U5"),
    "feature data declared 2**40 entries": ("full_features/data.npy", (2**40,), "<f4"),
    "header declared 1 GiB": ("__header__.npy", (GiB,), "|u1"),
    "vocabulary declared 10**12 terms": ("vocab/full/task_text.npy", (10**12,), "<U5"),
    "indptr declared 10**11 long": ("abstract_features/indptr.npy", (10**11,), "<i8"),
}


@pytest.mark.parametrize("case", sorted(DECLARED))
def test_a_declared_size_bomb_is_refused_from_the_npy_header(good_graph: Any, tmp_path: Path, case: str) -> None:
    pool, good = good_graph
    member, shape, descr = DECLARED[case]
    bad = _rewrite(good, tmp_path / "d.graph.npz", member, _npy_header(shape, descr) + bytes(64))
    with pytest.raises(GraphFileError, match=r"declares .* but holds 64 bytes") as info:
        load_graph(bad, pool)
    assert info.value.field == member.removesuffix(".npy")


def test_the_decompressed_size_bound_is_the_callers_to_set(good_graph: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pool, good = good_graph
    assert 6 * GiB == DEFAULT_MAX_BYTES
    with pytest.raises(GraphFileError, match="byte limit of a graph file"):
        load_graph(good, pool, max_bytes=4096)
    monkeypatch.setenv("ENVSCHED_GRAPH_MAX_BYTES", "4096")
    with pytest.raises(GraphFileError, match="ENVSCHED_GRAPH_MAX_BYTES"):
        load_graph(good, pool)
    assert load_graph(good, pool, max_bytes=10**6).num_nodes == 15  # the argument wins over the variable
    monkeypatch.setenv("ENVSCHED_GRAPH_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="ENVSCHED_GRAPH_MAX_BYTES='lots' is not a whole number"):
        load_graph(good, pool)
    with pytest.raises(ValueError, match="max_bytes must be a positive"):
        load_graph(good, pool, max_bytes=0)


def test_a_file_of_thousands_of_members_is_refused_before_numpy_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "many.graph.npz"
    with zipfile.ZipFile(path, "w") as z:
        for i in range(5000):
            z.writestr(f"m{i}.npy", b"")
    with pytest.raises(GraphFileError, match="5000 zip members"):
        load_graph(path)


@pytest.mark.parametrize("content", [b"", b"PK\x05\x06" + b"\x00" * 18, b"not a zip at all" * 100],
                         ids=["empty file", "end record only", "text"])
def test_a_graph_file_that_is_no_zip_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.graph.npz"
    path.write_bytes(content)
    with pytest.raises(GraphFileError, match="not an envsched graph file"):
        load_graph(path)


def test_a_zip64_end_record_claiming_billions_of_members_is_refused(tmp_path: Path) -> None:
    zip64_end = b"PK\x06\x06" + (44).to_bytes(8, "little") + b"\x2d\x00\x2d\x00" + bytes(8) \
        + (4 * 10**9).to_bytes(8, "little") * 2 + (10**6).to_bytes(8, "little") + bytes(8)
    locator = b"PK\x06\x07" + bytes(4) + (0).to_bytes(8, "little") + (1).to_bytes(4, "little")
    end = b"PK\x05\x06" + bytes(4) + b"\xff\xff" * 2 + b"\xff\xff\xff\xff" * 2 + bytes(2)
    path = tmp_path / "z64.graph.npz"
    path.write_bytes(zip64_end + locator + end)
    with pytest.raises(GraphFileError, match="4000000000 zip members"):
        load_graph(path)


def _special_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    sock.close()
    link = tmp_path / "zero-link.jsonl"
    link.symlink_to("/dev/zero")
    return {"named pipe": (fifo, "named pipe"), "/dev/zero": (Path("/dev/zero"), "character device"),
            "/dev/null": (Path("/dev/null"), "character device"), "socket": (sock_path, "socket"),
            "symlink to /dev/zero": (link, "character device")}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["named pipe", "/dev/zero", "/dev/null", "socket", "symlink to /dev/zero"])
def test_a_special_file_as_a_graph_is_refused_without_hanging(tmp_path: Path, case: str) -> None:
    path, kind = _special_files(tmp_path)[case]
    rc, err, rss = _child(f"""
        from envsched.method.graph.io import GraphFileError, load_graph
        try:
            load_graph({str(path)!r})
        except GraphFileError as exc:
            print("REFUSED", exc, file=sys.stderr)
    """, timeout=60)
    assert rc == 0 and "REFUSED" in err and f"not a regular file ({'a ' + kind}" in err, err[-1500:]
    _assert_small(rss)


def test_a_directory_as_a_graph_is_a_graph_file_error(tmp_path: Path) -> None:
    with pytest.raises(GraphFileError, match="directory"):
        load_graph(tmp_path)


# ================================================================================================= pool files
@pytest.mark.parametrize("case", ["named pipe", "/dev/zero", "/dev/null", "socket", "symlink to /dev/zero"])
def test_a_special_file_as_a_pool_is_refused(tmp_path: Path, case: str) -> None:
    path, kind = _special_files(tmp_path)[case]
    with pytest.raises(TaskSpecError, match=f"is a {kind}.*not a regular file"):
        TaskPool.from_file(path)


PSEUDO = ["/proc/self/status", "/proc/self/environ", "/proc/self/maps", "/sys/kernel/mm/transparent_hugepage"]


@pytest.mark.parametrize("path", PSEUDO)
def test_proc_and_sys_files_are_refused(path: str) -> None:
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist here")
    with pytest.raises(TaskSpecError, match=r"special file under /(proc|sys)"):
        TaskPool.from_file(path)


def test_a_symlink_into_proc_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "pool.json"
    link.symlink_to("/proc/self/status")
    with pytest.raises(TaskSpecError, match="special file under /proc"):
        TaskPool.from_file(link)


def test_pool_dev_zero_on_the_command_line_is_one_line_in_a_small_process() -> None:
    """Issue 23: `--pool /dev/zero` grew to about 24 GB; now refused before any read."""
    _, err, rss = _child("""
        from envsched.cli.main import cli
        try:
            cli(["run", "--pool", "/dev/zero", "--steps", "1"], standalone_mode=True)
        except SystemExit as exc:
            print("EXIT", exc.code, file=sys.stderr)
    """)
    assert "EXIT 1" in err and "/dev/zero: is a character device, not a regular file" in err, err[-1500:]
    assert "Traceback" not in err
    _assert_small(rss)


SPARSE = {  # name, apparent size, limit phrase: the files take no disk (truncate makes a hole)
    "5 GiB jsonl": ("big.jsonl", 5 * GiB, "limit of a pool file"),
    "5 GiB JSONL upper-case suffix": ("BIG.JSONL", 5 * GiB, "limit of a pool file"),
    "300 MiB json": ("big.json", 300 * 2**20, "limit of a .json pool"),
    "1 GiB without suffix": ("pool", GiB, "limit of a .json pool"),
    "64 GiB json": ("huge.json", 64 * GiB, "limit of a .json pool"),
}


@pytest.mark.parametrize("case", sorted(SPARSE))
def test_a_huge_pool_file_is_refused_before_reading(tmp_path: Path, case: str) -> None:
    name, size, phrase = SPARSE[case]
    path = tmp_path / name
    with path.open("wb") as fh:
        fh.truncate(size)
    with pytest.raises(TaskSpecError, match=f"is {size} bytes, more than the .*{re.escape(phrase)}"):
        TaskPool.from_file(path)


def test_a_sparse_line_of_100_mib_stops_at_the_line_limit(tmp_path: Path) -> None:
    path = tmp_path / "line.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"id": "a", "env": "e"}\n')
        fh.truncate(100 * 2**20)
    _, err, rss = _child(f"""
        from envsched.pool import TaskPool, TaskSpecError
        try:
            TaskPool.from_file({str(path)!r})
        except TaskSpecError as exc:
            print("REFUSED", exc, file=sys.stderr)
    """)
    assert "REFUSED" in err and f"line 2: line longer than {DEFAULT_MAX_LINE_BYTES} bytes" in err, err[-1500:]
    _assert_small(rss)


def test_pool_limits_are_documented_defaults_the_caller_can_change(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = (DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_JSON_BYTES, DEFAULT_MAX_LINE_BYTES)
    assert defaults == (4 * GiB, 256 * 2**20, 16 * 2**20)
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps({"id": f"t{i}", "env": "e"}) + "\n" for i in range(50)))
    jsn = tmp_path / "p.json"
    jsn.write_text(json.dumps([{"id": f"t{i}", "env": "e"} for i in range(50)]))
    with pytest.raises(TaskSpecError, match="more than the 100-byte limit of a pool file"):
        TaskPool.from_file(jsonl, max_file_bytes=100)
    with pytest.raises(TaskSpecError, match=r"more than the 100-byte limit of a \.json pool"):
        TaskPool.from_file(jsn, max_json_bytes=100)
    with pytest.raises(TaskSpecError, match="line 1: line longer than 10 bytes"):
        TaskPool.from_file(jsonl, max_line_bytes=10)
    monkeypatch.setenv("ENVSCHED_POOL_MAX_BYTES", "200")
    with pytest.raises(TaskSpecError, match="200-byte limit"):
        TaskPool.from_file(jsonl)
    assert len(TaskPool.from_file(jsonl, max_file_bytes=10**6)) == 50  # the argument wins
    monkeypatch.setenv("ENVSCHED_POOL_MAX_BYTES", "")
    monkeypatch.setenv("ENVSCHED_POOL_MAX_LINE_BYTES", "5")
    with pytest.raises(TaskSpecError, match="longer than 5 bytes"):
        TaskPool.from_file(jsonl)
    monkeypatch.setenv("ENVSCHED_POOL_MAX_LINE_BYTES", "")
    monkeypatch.setenv("ENVSCHED_POOL_MAX_JSON_BYTES", "1e9")
    with pytest.raises(ValueError, match="ENVSCHED_POOL_MAX_JSON_BYTES='1e9' is not a whole number"):
        TaskPool.from_file(jsn)
    monkeypatch.delenv("ENVSCHED_POOL_MAX_JSON_BYTES")
    assert len(TaskPool.from_file(jsn)) == 50


NESTED = {
    "300 nested lists in a JSONL line": ("jsonl", '{"id": "a", "env": "e", "initial_state": ' + "[" * 300
                                         + "]" * 300 + "}\n"),
    "300 nested objects in a JSONL line": ("jsonl", '{"id": "a", "env": "e", "initial_state": '
                                           + '{"k": ' * 300 + "1" + "}" * 300 + "}\n"),
    "257 levels in a .json pool": ("json", '[{"id": "a", "env": "e", "initial_state": ' + "[" * 256 + "]" * 256
                                   + "}]"),
    "nesting inside a tool": ("jsonl", '{"id": "a", "env": "e", "tools": [{"name": "t", "parameters": '
                              + "[" * 400 + "]" * 400 + "}]}\n"),
}


@pytest.mark.parametrize("case", sorted(NESTED))
def test_deep_nesting_below_the_parser_limit_is_still_refused(tmp_path: Path, case: str) -> None:
    """json parses these (under its recursion limit), but serialising them later could overflow it."""
    suffix, text = NESTED[case]
    path = tmp_path / f"p.{suffix}"
    path.write_text(text)
    with pytest.raises(TaskSpecError, match="nested too deeply: more than 256 levels"):
        TaskPool.from_file(path)


def test_deep_nesting_from_an_iterable_is_refused_and_256_levels_load() -> None:
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(TaskSpecError, match="item 1, field 'initial_state': JSON nested too deeply"):
        TaskPool([{"id": "a", "env": "e", "initial_state": deep}])
    ok: Any = []
    for _ in range(254):
        ok = [ok]
    assert len(TaskPool([{"id": "a", "env": "e", "initial_state": ok}])) == 1


# ============================================================================================ look-alike ids
LOOKALIKE_IDS = {
    "Latin a / Cyrillic a": ("task-a", "task-\u0430"),
    "Latin e / Cyrillic ie": ("env/e1", "env/\u04351"),
    "Latin o / Greek omicron": ("solve", "s\u03bflve"),
    "Latin p / Cyrillic er": ("p1", "\u04401"),
    "Latin c / Cyrillic es": ("calc", "\u0441al\u0441"),
    "Latin x / Cyrillic ha": ("x-7", "\u0445-7"),
    "Latin A / Greek Alpha": ("A", "\u0391"),
    "Latin B / Cyrillic Ve": ("B-task", "\u0412-task"),
    "Latin H / Cyrillic En": ("H2O", "\u041d2O"),
    "whole-script Cyrillic ace": ("ace", "\u0430\u0441\u0435"),
    "Latin i / Cyrillic Byelorussian i": ("index", "\u0456ndex"),
    "Latin y / Cyrillic u": ("day", "da\u0443"),
    "Latin v / Greek nu": ("v2", "\u03bd2"),
    "digit zero / capital O": ("t0", "tO"),
    "digit one / small L": ("task-1", "task-l"),
    "capital I / small L": ("Item", "ltem"),
    "hyphen / Unicode hyphen": ("a-b", "a\u2010b"),
    "fullwidth Cyrillic mix": ("\uff41bc", "\u0430bc"),
}


@pytest.mark.parametrize("case", sorted(LOOKALIKE_IDS))
def test_lookalike_ids_across_scripts_are_refused(case: str) -> None:
    first, second = LOOKALIKE_IDS[case]
    with pytest.raises(TaskSpecError, match=r"item 2, field 'id'.*looks like .*confusable") as info:
        TaskPool([{"id": first, "env": "e"}, {"id": second, "env": "e"}])
    assert repr(second)[1:-1] in str(info.value) or second in str(info.value)


@pytest.mark.parametrize("pair", [("Task", "task"), ("tache", "t\u00e2che"), ("rn", "m"), ("task_1", "task-1"),
                                  ("e", "\u0451"), ("g", "q")])
def test_ids_that_only_look_related_still_load(pair: tuple[str, str]) -> None:
    assert TaskPool([{"id": pair[0], "env": "e"}, {"id": pair[1], "env": "e"}]).ids == list(pair)


# ===================================================================================== terminal escapes
ANSI_ENVS = {
    "clear screen": "\x1b[2J\x1b[H",
    "colour": "\x1b[31mred\x1b[0m",
    "window title with BEL": "\x1b]0;owned\x07",
    "C1 CSI": "\x9b31m",
    "bidi override": "env\u202eexe.txt",
    "NUL": "a\x00b",
    "backspace": "ok\x08\x08no",
    "carriage return overwrite": "safe\rEVIL",
}


def _ansi_pool(tmp_path: Path, env: str) -> Path:
    path = tmp_path / "ansi.jsonl"
    path.write_text(json.dumps({"id": "a", "env": env, "split": env + "-split"}) + "\n"
                    + json.dumps({"id": "b", "env": "[bold red]markup[/]"}) + "\n")
    return path


@pytest.mark.parametrize("case", sorted(ANSI_ENVS))
def test_control_characters_in_names_never_reach_the_terminal_raw(tmp_path: Path, case: str) -> None:
    env = ANSI_ENVS[case]
    result = CliRunner().invoke(cli, ["pool", "inspect", str(_ansi_pool(tmp_path, env))], terminal_width=200)
    assert result.exit_code == 0, result.output
    raw = [c for c in env if not c.isprintable()]
    assert raw and not any(c in result.output for c in raw), repr(result.output)
    assert common.visible(env) in result.output
    assert "[bold red]markup[/]" in result.output  # markup is shown, not applied


def test_control_characters_in_pool_graph_tables_are_escaped(tmp_path: Path) -> None:
    specs = [{"id": f"t{i}", "env": "\x1b[2J" + ("x" if i < 3 else "y"), "instruction": f"add {i} numbers",
              "tools": [{"name": "add", "description": "add numbers"}]} for i in range(6)]
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in specs))
    result = CliRunner().invoke(cli, ["pool", "graph", str(path), "--no-save", "--task", "t0"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\\x1b[2Jx" in result.output


def test_the_pool_name_of_a_json_pool_is_escaped(tmp_path: Path) -> None:
    path = tmp_path / "named.json"
    path.write_text(json.dumps({"name": "\x1b]52;c;ZXZpbA==\x07pool", "tasks": [{"id": "a", "env": "e"}]}))
    result = CliRunner().invoke(cli, ["pool", "inspect", str(path)], terminal_width=200)
    assert result.exit_code == 0 and "\x1b" not in result.output and "\\x1b]52;c;" in result.output


# ========================================================================================= CLI numbers
def _numeric_options() -> dict[str, tuple[click.Command, click.Option]]:
    """Every numeric option of every command, found by walking the CLI (so a new one cannot be missed)."""
    found: dict[str, tuple[click.Command, click.Option]] = {}
    ctx = click.Context(cli)

    def walk(cmd: click.Command, prefix: str) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), f"{prefix} {name}".strip())
            return
        for p in cmd.params:
            if isinstance(p, click.Option) and isinstance(p.type, click.types._NumberParamTypeBase):
                found[f"{prefix} {p.opts[0]}"] = (cmd, p)

    walk(cli, "")
    return found


def test_every_numeric_option_has_an_upper_bound() -> None:
    options = _numeric_options()
    assert len(options) >= 30
    unbounded = [name for name, (_, p) in options.items()
                 if not isinstance(p.type, click.types._NumberRangeBase) or p.type.max is None]
    assert not unbounded, f"numeric options without an upper bound: {unbounded}"
    floats = [name for name, (_, p) in options.items() if isinstance(p.type, click.FloatRange)]
    assert all(isinstance(options[n][1].type, common.FiniteFloatRange) for n in floats), floats


BOUNDS = {  # option: (command path, bound); the bound from cli/common.py, so the docs and the code agree
    "--steps": ("run", common.MAX_STEPS), "--batch-size": ("run", common.MAX_BATCH_SIZE),
    "--group-size": ("run", common.MAX_GROUP_SIZE), "--seed": ("run", common.MAX_SEED),
    "--log-every": ("run", common.MAX_STEPS),
    "bench --seeds": ("bench", common.MAX_BENCH_SEEDS), "bench --steps": ("bench", common.MAX_BENCH_STEPS),
    "bench --batch-size": ("bench", common.MAX_BATCH_SIZE), "bench --group-size": ("bench", common.MAX_GROUP_SIZE),
    "bench --coldstart-runs": ("bench", common.MAX_COLDSTART_RUNS),
    "bench --coldstart-steps": ("bench", common.MAX_BENCH_STEPS), "bench --workers": ("bench", common.MAX_WORKERS),
    "bench --trials": ("bench", common.MAX_TRIALS),
    "eval --num-episodes": ("eval", common.MAX_TASKS), "eval --samples-per-task": ("eval", common.MAX_SAMPLES_PER_TASK),
    "eval --limit": ("eval", common.MAX_TASKS), "eval --num-tasks": ("eval", common.MAX_TASKS),
    "eval --concurrency": ("eval", common.MAX_CONCURRENCY), "eval --max-turns": ("eval", common.MAX_TURNS),
    "eval --max-tokens": ("eval", common.MAX_TOKENS), "eval --retries": ("eval", common.MAX_RETRIES),
    "eval --llm-port": ("eval", 65535),
    "explain --step": ("explain", common.MAX_EXPLAIN_STEP),
    "pool build --limit": ("pool build", common.MAX_TASKS),
    "pool build --tasks-per-dataset": ("pool build", common.MAX_TASKS_PER_DATASET),
    "pool build --tiers": ("pool build", common.MAX_TIERS), "pool build --seed": ("pool build", common.MAX_SEED),
    "pool graph --top": ("pool graph", common.MAX_TOP), "pool graph --k-within": ("pool graph", common.MAX_NEIGHBOURS),
    "pool graph --k-cross": ("pool graph", common.MAX_NEIGHBOURS),
    "pool graph --exact-max-nodes": ("pool graph", common.MAX_EXACT_NODES),
}
FLOAT_BOUNDS = {
    "eval --temperature": common.MAX_TEMPERATURE, "eval --backoff": common.MAX_BACKOFF_S,
    "eval --episode-timeout": common.MAX_EPISODE_TIMEOUT_S, "eval --success-threshold": common.MAX_THRESHOLD,
    "--unscored-rate": 0.99,
}


def _option(key: str) -> click.Option:
    options = _numeric_options()
    return options[f"run {key}" if key.startswith("--") else key][1]


@pytest.mark.parametrize("key", sorted(BOUNDS))
def test_an_integer_option_takes_its_bound_and_refuses_one_more(key: str) -> None:
    _, bound = BOUNDS[key]
    opt = _option(key)
    assert opt.type.convert(str(bound), opt, None) == bound
    with pytest.raises(click.BadParameter, match=rf"{bound + 1} is not in the range .*x<={bound}\b"):
        opt.type.convert(str(bound + 1), opt, None)


@pytest.mark.parametrize("key", sorted(FLOAT_BOUNDS))
@pytest.mark.parametrize("value", ["over", "nan", "inf", "-inf"])
def test_a_float_option_refuses_values_beyond_its_bound_and_non_finite_ones(key: str, value: str) -> None:
    bound = FLOAT_BOUNDS[key]
    opt = _option(key)
    assert opt.type.convert(str(bound), opt, None) == bound
    text = str(bound * 2 + 1) if value == "over" else value
    with pytest.raises(click.BadParameter, match=r"not in the range|not a finite number"):
        opt.type.convert(text, opt, None)


ISSUE_CASES = {
    "--k-within 100000000": (["pool", "graph", "POOL", "--no-save", "--k-within", "100000000"], "--k-within",
                             "1<=x<=1024"),
    "--k-cross 2**40": (["pool", "graph", "POOL", "--no-save", "--k-cross", str(2**40)], "--k-cross",
                        "1<=x<=1024"),
    "--group-size 100000000": (["run", "--pool", "POOL", "--group-size", "100000000"], "--group-size",
                               "1<=x<=1024"),
    "--batch-size 10**9": (["run", "--pool", "POOL", "--batch-size", "1000000000"], "--batch-size",
                           "1<=x<=16384"),
    "--steps 10**12": (["run", "--pool", "POOL", "--steps", str(10**12)], "--steps", "1<=x<=1000000"),
    "bench --workers 100000": (["bench", "--workers", "100000"], "--workers", "1<=x<=64"),
    "eval --concurrency 10**6": (["eval", "SPEC", "--concurrency", "1000000"], "--concurrency", "1<=x<=256"),
    "eval --temperature nan": (["eval", "SPEC", "--temperature", "nan"], "--temperature", "not a finite number"),
    "eval --success-threshold inf": (["eval", "SPEC", "--success-threshold", "inf"], "--success-threshold",
                                     "not a finite number"),
    "pool build --tasks-per-dataset 10**9": (["pool", "build", "reasoning_gym", "--tasks-per-dataset",
                                              "1000000000"], "--tasks-per-dataset", "0<=x<=100000"),
}


@pytest.mark.parametrize("case", sorted(ISSUE_CASES))
def test_the_cli_refuses_an_out_of_range_number_in_one_line_in_a_small_process(tmp_path: Path, case: str) -> None:
    """The issue's values ran out of memory (24 GB) or time (over 120 s); now a click usage error."""
    args, option, bound = ISSUE_CASES[case]
    pool = tmp_path / "p.jsonl"
    pool.write_text("".join(json.dumps({"id": f"t{i}", "env": f"e{i % 2}", "instruction": "x"}) + "\n"
                            for i in range(8)))
    args = [str(pool) if a == "POOL" else a for a in args]
    _, err, rss = _child(f"""
        from envsched.cli.main import cli
        try:
            cli({args!r}, prog_name="envsched")
        except SystemExit as exc:
            print("EXIT", exc.code, file=sys.stderr)
    """)
    assert "EXIT 2" in err, err[-1500:]
    line = next(ln for ln in err.splitlines() if ln.startswith("Error:"))
    assert f"Invalid value for '{option}'" in line and bound in line, line
    assert "Traceback" not in err
    _assert_small(rss)


def test_eval_seeds_are_bounded_in_value_and_count() -> None:
    from envsched.cli.eval import _seeds

    assert _seeds((str(common.MAX_SEED),)) == [common.MAX_SEED]
    with pytest.raises(click.BadParameter, match="seeds must lie in"):
        _seeds((str(common.MAX_SEED + 1),))
    with pytest.raises(click.BadParameter, match=f"at most {common.MAX_EVAL_SEEDS} seeds"):
        _seeds((",".join(str(i) for i in range(common.MAX_EVAL_SEEDS + 1)),))


# ======================================================================================= library configs
GRAPH_CONFIGS = {
    "k_within 100000000": ({"k_within": 100_000_000}, "k_within must be <= 1,024"),
    "k_cross 1025": ({"k_cross": 1025}, "k_cross must be <= 1,024"),
    "k_within a string": ({"k_within": "6"}, "k_within must be an integer"),
    "k_cross a float": ({"k_cross": 12.0}, "k_cross must be an integer"),
    "k_within True": ({"k_within": True}, "k_within must be an integer"),
    "exact_max_nodes 10**9": ({"exact_max_nodes": 10**9}, "exact_max_nodes must be <= 200,000"),
    "workers 1000": ({"workers": 1000}, "workers must be <= 64"),
    "ann_dense_dim 10**6": ({"ann_dense_dim": 10**6}, "ann_dense_dim must be <= 4,096"),
    "recall_sample 10**8": ({"recall_sample": 10**8}, "recall_sample must be <= 100,000"),
    "exact_block_rows 10**7": ({"exact_block_rows": 10**7}, "exact_block_rows must be <= 65,536"),
    "min_bandwidth NaN": ({"min_bandwidth": float("nan")}, "min_bandwidth must be a finite number"),
    "min_similarity inf": ({"min_similarity": float("inf")}, "min_similarity must be a finite number"),
}


@pytest.mark.parametrize("case", sorted(GRAPH_CONFIGS))
def test_graph_config_refuses_out_of_range_values(case: str) -> None:
    kwargs, message = GRAPH_CONFIGS[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        GraphConfig(**kwargs)


def test_the_library_and_cli_bounds_agree() -> None:
    assert GRAPH_INT_BOUNDS["k_within"] == GRAPH_INT_BOUNDS["k_cross"] == common.MAX_NEIGHBOURS == MAX_NEIGHBORS
    assert GRAPH_INT_BOUNDS["exact_max_nodes"] == common.MAX_EXACT_NODES
    cfg = GraphConfig(k_within=common.MAX_NEIGHBOURS, k_cross=common.MAX_NEIGHBOURS,
                      exact_max_nodes=common.MAX_EXACT_NODES)
    assert (cfg.k_within, cfg.exact_max_nodes) == (1024, 200_000)


def test_the_run_title_shows_an_escaped_pool_name(tmp_path: Path) -> None:
    path = tmp_path / "named.json"
    path.write_text(json.dumps({"name": "\x1b[2J\x1b[3Jwiped", "tasks": [{"id": f"t{i}", "env": f"e{i % 2}"}
                                                                       for i in range(4)]}))
    result = CliRunner().invoke(cli, ["run", "--pool", str(path), "--sampler", "uniform", "--steps", "1",
                                      "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "uniform on \\x1b[2J\\x1b[3Jwiped" in result.output


def test_a_bare_npy_array_holding_a_zip_end_record_is_not_a_graph(tmp_path: Path) -> None:
    path = tmp_path / "array.graph.npz"
    with path.open("wb") as fh:
        np.save(fh, np.frombuffer(b"PK\x05\x06" + bytes(18), dtype=np.uint8))
    with pytest.raises(GraphFileError, match=r"a single array, not an \.npz archive"):
        load_graph(path)
