"""Reading an explanation run file (``envsched run --explain FILE``) safely: the one home of the rules every
reader applies (``envsched explain``, ``envsched report --run-file``, the dashboard).

A run file is JSON Lines that anyone may hand over, so a reader

* opens only a regular file, without blocking: a named pipe, a device such as ``/dev/zero`` or a socket is
  refused before a byte is read (:func:`open_run_file`);
* reads one line at a time and refuses a line longer than :data:`MAX_RUN_LINE_BYTES` without holding more
  than that in memory (:func:`read_run_line`);
* refuses a line nested deeper than :data:`MAX_RUN_JSON_DEPTH`, never a ``RecursionError``
  (:func:`parse_run_line`).

Each refusal is a ``ValueError`` (``FileNotFoundError`` for a missing file) whose one-line message names the
file and, for a line, its number; a line over the caps is a :class:`RunFileLimitError` (a ``ValueError``), so
that a reader which skips malformed lines can still stop at one that is too large to be a record. Kept free of
heavy imports: the dashboard reads run files without the scheduler's graph stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from envsched.errors import EnvSchedError
from envsched.llm_http import json_depth

__all__ = ["EXPLAIN_FORMAT", "MAX_RUN_JSON_DEPTH", "MAX_RUN_LINE_BYTES", "RunFileLimitError", "open_run_file",
           "parse_run_line", "read_run_line"]

EXPLAIN_FORMAT = "envsched.explain/1"
#: the longest line accepted, in bytes: a pick record is a few kB (its neighbours included), the header with
#: the sampler's configuration tens of kB
MAX_RUN_LINE_BYTES = 4 * 2**20
#: the deepest JSON nesting accepted in a line: records nest five levels (record, relations, relation,
#: neighbours, neighbour)
MAX_RUN_JSON_DEPTH = 64


class RunFileLimitError(EnvSchedError, ValueError):
    """A run-file line longer than :data:`MAX_RUN_LINE_BYTES` or nested deeper than :data:`MAX_RUN_JSON_DEPTH`."""


def _not_regular(path: Path) -> str:
    return (f"run file {path} is not a regular file (a named pipe, device or socket): a run file is the JSONL file "
            "written by `envsched run --explain FILE`")


def open_run_file(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for binary reading, if it is a regular file. Opened non-blocking and checked with
    ``fstat`` on the open descriptor (no window between the check and the open): a named pipe without a
    writer, a device or a socket is refused with ``ValueError`` instead of hanging or reading forever;
    a directory is a ``ValueError``; a missing file ``FileNotFoundError``."""
    p = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise FileNotFoundError(f"run file not found: {p}") from None
    except IsADirectoryError:
        raise ValueError(f"{p} is a directory, expected an explanation run file (JSONL)") from None
    except OSError as exc:
        with contextlib.suppress(OSError):  # a socket cannot be opened at all: say what it is
            if not stat.S_ISREG(os.stat(p).st_mode):
                raise ValueError(_not_regular(p)) from None
        raise ValueError(f"run file {p}: cannot open it ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ValueError(f"{p} is a directory, expected an explanation run file (JSONL)")
        if not stat.S_ISREG(mode):
            raise ValueError(_not_regular(p))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_run_line(fh: BinaryIO, where: str) -> bytes:
    """The next line of ``fh`` with its ``\\n`` (the last line may lack it; ``b""`` at the end), reading at
    most :data:`MAX_RUN_LINE_BYTES` + 1 bytes: a longer line is a :class:`RunFileLimitError` naming ``where``
    (the file and line number)."""
    line = fh.readline(MAX_RUN_LINE_BYTES + 1)
    if len(line) > MAX_RUN_LINE_BYTES and not line.endswith(b"\n"):
        raise RunFileLimitError(f"{where}: the line is longer than {MAX_RUN_LINE_BYTES} bytes, more than an "
                                "explanation record holds")
    return line


def parse_run_line(line: bytes | str, where: str) -> Any:
    """One line as JSON. ``ValueError`` naming ``where`` when it is not UTF-8 or not JSON,
    :class:`RunFileLimitError` when it is nested deeper than :data:`MAX_RUN_JSON_DEPTH` levels."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{where}: not UTF-8 text") from None
    too_deep = f"{where}: the JSON is nested deeper than {MAX_RUN_JSON_DEPTH} levels (an explanation record has 5)"
    try:
        value = json.loads(line)
    except RecursionError:
        raise RunFileLimitError(too_deep) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: invalid JSON ({exc.msg})") from None
    # only a line with more brackets than the cap can be nested deeper than it
    if line.count("[") + line.count("{") > MAX_RUN_JSON_DEPTH and \
            json_depth(value, MAX_RUN_JSON_DEPTH) > MAX_RUN_JSON_DEPTH:
        raise RunFileLimitError(too_deep)
    return value
