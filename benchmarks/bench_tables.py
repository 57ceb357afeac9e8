"""Turn a benchmark run's ``summary.json`` (and a matrix's ``matrix.json``) into the table files of docs/tables/.

``python benchmarks/readme_tables.py`` then writes them into README.md and docs/benchmark.md between their
``<!-- table:NAME -->`` markers, so the published tables are exactly what the run measured.

Usage::

    python benchmarks/bench_tables.py --summary bench-runs/full/summary.json --prefix bench_default
    python benchmarks/bench_tables.py --matrix bench-runs/matrix-quick/matrix.json --prefix bench_matrix_quick
    python benchmarks/bench_tables.py --tuned src/envsched_lab/tuned.json --prefix bench_tuning
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TABLE_DIR = ROOT / "docs" / "tables"


def _write(name: str, columns: list[str], rows: list[list[str]]) -> Path:
    TABLE_DIR.mkdir(parents=True, exist_ok=True)
    path = TABLE_DIR / f"{name}.json"
    align = ["left"] + ["right"] * (len(columns) - 1)
    path.write_text(json.dumps({"columns": columns, "align": align, "rows": rows}, indent=1) + "\n")
    return path


def summary_tables(summary_file: Path, prefix: str) -> list[Path]:
    from envsched_lab.report import summary_tables as tables

    summary = json.loads(summary_file.read_text())
    cfg = SimpleNamespace(**summary["config"])
    out = []
    for (_title, head, rows), suffix in zip(tables(summary, cfg), ("heldout", "parts", "efficiency"), strict=True):
        out.append(_write(f"{prefix}_{suffix}", head, rows))
    goals = [["met" if v["met"] else "**not met**", v["sentence"]] for v in summary.get("goals", {}).values()]
    out.append(_write(f"{prefix}_goals", ["status", "goal, as measured"], goals))
    for s, t in summary.get("coldstart", {}).items():
        rows = [[str(r["step"]), f"{r['batch_variance']:.4f}", f"{100 * r['hit_rate']:.1f}%",
                 f"{100 * r['hit_rate_low']:.1f}%", f"{100 * r['hit_rate_high']:.1f}%"] for r in t["table"]]
        out.append(_write(f"{prefix}_coldstart_{s.replace('-', '_')}",
                          ["step", "batch variance", "hit rate", "low-variance half", "high-variance half"], rows))
    return out


def matrix_tables(matrix_file: Path, prefix: str) -> list[Path]:
    from envsched_lab.matrix import _setting_label

    doc = json.loads(matrix_file.read_text())
    names = doc["samplers"]
    rows = []
    for c in doc["cells"]:
        row = [_setting_label(c["setting"])]
        for s in names:
            d = c["samplers"].get(s)
            if not d:
                row.append("-")
                continue
            p = d.get("paired_vs_best") or {}
            mean = p.get("mean", math.nan)
            mark = {"win": "W", "loss": "L"}.get(c["verdict"][s], "-")  # "-": not detected ("tie" in old files)
            row.append(f"{d['heldout_score']['mean']:.2f} ({mean:+.2f}) {mark}")
        rows.append(row)
    out = [_write(f"{prefix}_cells", ["setting", *names], rows)]
    tally = [[s, str(t["win"]), str(t.get("not detected", t.get("tie", 0))), str(t["loss"])]
             for s, t in doc["tally"].items()]
    out.append(_write(f"{prefix}_tally", ["sampler", "wins", "not detected", "losses"], tally))
    return out


def tuning_table(tuned_file: Path, prefix: str) -> list[Path]:
    doc = json.loads(tuned_file.read_text())
    rows: list[list[str]] = []
    for name, e in doc["samplers"].items():
        params = ", ".join(f"{k} = {v}" for k, v in e["params"].items()) or "its defaults (trial 0 won)"
        rows.append([name, f"{e['trials'][0]['objective']:.2f}", f"{e['objective']:.2f}", params])
    return [_write(prefix, ["sampler", "objective with defaults", "best objective", "tuned values"], rows)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summary", type=Path)
    ap.add_argument("--matrix", type=Path)
    ap.add_argument("--tuned", type=Path)
    ap.add_argument("--prefix", required=True)
    args = ap.parse_args(argv)
    written: list[Any] = []
    if args.summary:
        written += summary_tables(args.summary, args.prefix)
    if args.matrix:
        written += matrix_tables(args.matrix, args.prefix)
    if args.tuned:
        written += tuning_table(args.tuned, args.prefix)
    for p in written:
        print(p.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
