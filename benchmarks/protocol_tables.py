"""Write the README's protocol tables (``docs/tables/protocol_*.json``) from a protocol report.

Usage::

    python benchmarks/protocol_tables.py results/protocol-2026-12-04/protocol-report.json
    python benchmarks/protocol_tables.py results/protocol-round2-2026-12-04/protocol-report.json --name protocol_round2
    python benchmarks/readme_tables.py       # then rewrite the marked tables

``protocol_primary``: EnvSched's paired difference with each primary baseline, untuned and tuned (mean, 95 %
interval, Holm p, verdict; an "equivalent" verdict carries its TOST Holm p). ``protocol_controls``: the
negative controls (untuned only). ``--name`` sets the tables' prefix (one pair per evaluation round). Numbers are
read from the report, never typed by hand.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _cells(c: Mapping[str, Any] | None) -> list[str]:
    if c is None:
        return ["-", "-", "-"]
    verdict = c["verdict"]
    if verdict == "equivalent":
        verdict = f"equivalent (TOST p {c['p_equivalence_holm']:.2g})"
    elif verdict in ("better", "worse"):
        verdict = f"**{verdict}**"
    return [f"{c['mean']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}]", f"{c['p_holm']:.3g}", verdict]


def tables(report: Mapping[str, Any], name: str = "protocol") -> dict[str, dict[str, Any]]:
    """The two tables' JSON documents (readme_tables.py's ``rows`` form)."""
    untuned, tuned = report["untuned"], report.get("tuned") or {"primary": {}}
    primary = {"columns": ["EnvSched minus", "untuned: mean [95 % CI]", "Holm p", "verdict",
                           "tuned: mean [95 % CI]", "Holm p", "verdict"],
               "align": ["left", "right", "right", "left", "right", "right", "left"],
               "rows": [[b, *_cells(c), *_cells(tuned["primary"].get(b))] for b, c in untuned["primary"].items()]}
    controls = {"columns": ["EnvSched minus", "mean [95 % CI]", "Holm p", "verdict"],
                "align": ["left", "right", "right", "left"],
                "rows": [[b, *_cells(c)] for b, c in untuned["controls"].items()]}
    return {f"{name}_primary": primary, f"{name}_controls": controls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a protocol-report.json written by envsched bench --protocol")
    parser.add_argument("--name", default="protocol", help="prefix of the tables' names (default: protocol)")
    args = parser.parse_args()
    if not args.name.replace("_", "").isalnum():
        raise SystemExit(f"--name must be letters, digits and underscores, got {args.name!r}")
    try:
        report = json.loads(args.report.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"cannot read the protocol report {args.report}: {exc}") from None
    if report.get("format") != "envsched.protocol/1":
        raise SystemExit(f"{args.report} is not a protocol report (format {report.get('format')!r})")
    for name, doc in tables(report, args.name).items():
        path = ROOT / "docs" / "tables" / f"{name}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
