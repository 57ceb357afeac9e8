"""Rewrite the measured tables of README.md (and docs/*.md) from the JSON files that hold the measurements.

A generated table sits between two markers, and nothing else in the document is touched::

    <!-- table:install_timings -->
    | step | wall time |
    |---|---:|
    | ... generated ... |
    <!-- /table:install_timings -->

The rows come from ``docs/tables/<NAME>.json`` (the marker's name), which the measuring command writes or a
person fills in from its output. Two forms are accepted:

* ``{"columns": ["step", "wall time"], "align": ["left", "right"], "rows": [["install", "2 min 5 s"], ...]}``;
* ``{"columns": [...], "records": [{"step": "install", "wall time": "2 min 5 s"}, ...]}`` (one object per row,
  looked up by column name; ``"format": {"column": "{:.4f}"}`` formats numbers).

Usage::

    python benchmarks/readme_tables.py            # rewrite every marked table in README.md and docs/*.md
    python benchmarks/readme_tables.py --check    # exit 1 (and list them) if a table differs from its JSON

The documentation test (``tests/test_docs.py``) runs the check, so a table cannot drift from its data.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TABLE_DIR = ROOT / "docs" / "tables"
_MARKED = re.compile(r"(<!-- table:(?P<name>[A-Za-z0-9_.-]+) -->\n)(?P<body>.*?)(<!-- /table:(?P=name) -->)", re.S)


class TableError(ValueError):
    """A table's JSON is missing or malformed (the message names the file and what is wrong)."""


def _cell(value: Any, fmt: str | None) -> str:
    if value is None:
        return "-"
    if fmt is not None and isinstance(value, int | float) and not isinstance(value, bool):
        return fmt.format(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def render(data: Mapping[str, Any], *, source: str = "<table>") -> str:
    """The Markdown table (with a trailing newline) for one table's JSON."""
    columns = data.get("columns")
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
        raise TableError(f"{source}: 'columns' must be a non-empty list of column names")
    align = data.get("align") or ["left"] * len(columns)
    if len(align) != len(columns) or any(a not in ("left", "right", "center") for a in align):
        raise TableError(f"{source}: 'align' must give left/right/center for each of the {len(columns)} columns")
    formats: Mapping[str, str] = data.get("format") or {}
    if "rows" in data:
        rows: Sequence[Sequence[Any]] = data["rows"]
        for i, row in enumerate(rows, start=1):
            if not isinstance(row, list) or len(row) != len(columns):
                raise TableError(f"{source}: row {i} has {len(row) if isinstance(row, list) else 'no'} cells, "
                                 f"expected {len(columns)}")
    elif "records" in data:
        rows = []
        for i, rec in enumerate(data["records"], start=1):
            missing = [c for c in columns if c not in rec]
            if missing:
                raise TableError(f"{source}: record {i} lacks {missing}")
            rows.append([rec[c] for c in columns])
    else:
        raise TableError(f"{source}: give 'rows' (lists of cells) or 'records' (objects by column name)")
    rule = {"left": "---", "right": "---:", "center": ":---:"}
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(rule[a] for a in align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(v, formats.get(c)) for c, v in zip(columns, row, strict=True)) + " |")
    return "\n".join(lines) + "\n"


def load_table(name: str, table_dir: Path = TABLE_DIR) -> Mapping[str, Any]:
    path = table_dir / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TableError(f"table {name!r} is marked in a document but {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise TableError(f"{path}: invalid JSON ({exc.msg.removesuffix(' at')} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise TableError(f"{path}: expected a JSON object")
    return data


def rewrite(text: str, table_dir: Path = TABLE_DIR) -> tuple[str, list[str]]:
    """``text`` with every marked table regenerated, and the names of the tables that changed."""
    changed: list[str] = []

    def repl(m: re.Match[str]) -> str:
        name = m.group("name")
        body = render(load_table(name, table_dir), source=str(table_dir / f"{name}.json"))
        if body != m.group("body"):
            changed.append(name)
        return m.group(1) + body + m.group(4)

    return _MARKED.sub(repl, text), changed


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report tables that differ from their JSON")
    args = parser.parse_args(argv)
    stale = []
    for doc in documents():
        text = doc.read_text(encoding="utf-8")
        try:
            new, changed = rewrite(text)
        except TableError as exc:
            print(f"{doc.relative_to(ROOT)}: {exc}", file=sys.stderr)
            return 1
        stale += [f"{doc.relative_to(ROOT)}: table {name}" for name in changed]
        if changed and not args.check:
            doc.write_text(new, encoding="utf-8")
    for line in stale:
        print(("stale: " if args.check else "rewrote: ") + line)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
