"""What each mechanism of EnvSched's default contributes: the ablation tables of docs/results.md.

Reads ``envsched bench`` run folders (their ``metrics.jsonl``) that hold ``envsched``, ``uniform`` and
EnvSched's ablations and variants on the same seeds (one folder, or several whose samplers do not overlap),
and writes one table (``docs/tables/<NAME>.json``, rendered into docs/results.md by ``benchmarks/readme_tables.py``).
Per ablation or variant:

* the component it concerns: what an ablation switches off, or what a variant adds back (the parts of the
  paper's pipeline that the default leaves out), ours or the paper's;
* held-out score at the end of the budget (x100, mean over seeds);
* ``envsched - ablation``, paired by seed: mean and 95 % Student-t interval;
* the verdict, for an ablation: **earns its place** when the interval is above 0 (removing it costs held-out
  score), **removing it helps** when below 0; for a variant that adds a component: **leaving it out helps**
  when above 0, **adding it helps** when below 0; **identical on every seed** when the final scores are
  equal on every seed (the switch changes nothing this learner reaches); **not detected** otherwise (never
  "no effect": with few seeds an interval that crosses 0 says only that no difference was detected);
* batch reward variance and environments per batch, as a change from uniform's (the paper's batch figures:
  +34 % and +26 %).

Usage (the commands behind docs/results.md)::

    envsched bench --learner model --untuned --seeds 5 --coldstart-runs 0 --no-plots \\
        --samplers uniform,envsched,envsched-paper,envsched-coverage-only,... --out ablation-model
    python benchmarks/ablation_table.py ablation-model --name ablations_model
    python benchmarks/readme_tables.py
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from envsched_lab.report import paired_difference

ROOT = Path(__file__).resolve().parents[1]

#: Variants that add a part of the paper's pipeline the default leaves out -> that part; their verdict reads the
#: other way round from an ablation's.
ADDED_BACK: dict[str, str] = {
    "envsched-env-pooling": "the within relation as the whole environment (ours; tried, variant adds it)",
    "envsched-with-calibration": "calibration: percentile ranks and quantile mapping (paper; left out, variant "
                                 "adds it)",
    "envsched-with-decline": "the recent-decline term (paper; left out, variant adds it)",
    "envsched-former-default": "calibration and decline term on the paper's neighbour rule (variant adds them)",
}

#: Ablation sampler -> the component it removes (and whose rule that component is).
REMOVED: dict[str, str] = {
    # the graph still shapes the default through the similarity penalty and cold start
    "envsched-no-graph": "the graph prior, both relations (paper)",
    "envsched-no-within": "the within-environment relation (paper)",
    "envsched-no-cross": "the cross-environment relation (paper)",
    "envsched-reference-neighbours": "a neighbour without history counts with its environment (ours; ablation = "
                                     "the global reference)",
    "envsched-shuffled-graph": "the graph's neighbours (control: shuffled, same degrees)",
    "envsched-noise-features": "the graph's features (control: noise features)",
    "envsched-exploitation-only": "coverage (paper)",
    "envsched-coverage-only": "exploitation (paper)",
    "envsched-signal-score": "the variance prediction in exploitation (variant = our signal-probability score)",
    "envsched-fixed-share": "online coverage share (ours; ablation = fixed share)",
    "envsched-paper-coverage": "UCB coverage ranking (ours; ablation = paper's ranking)",
    "envsched-caps-always": "caps only on decline (ours; ablation = caps every step)",
    "envsched-paper": "all three of our rules, with the paper's pipeline (ablation = the paper preset)",
}

#: Every row after ``envsched`` and ``uniform``, in table order.
COMPONENTS: dict[str, str] = {**ADDED_BACK, **REMOVED}


def load_folders(run_dirs: list[Path]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """:func:`load_runs` of several folders merged; a sampler in two folders is an error naming both."""
    merged: dict[str, dict[int, list[dict[str, Any]]]] = {}
    origin: dict[str, Path] = {}
    for run_dir in run_dirs:
        for sampler, per_seed in load_runs(run_dir).items():
            if sampler in merged:
                raise SystemExit(f"sampler {sampler!r} is in both {origin[sampler]} and {run_dir}: give each "
                                 "sampler's runs once")
            merged[sampler], origin[sampler] = per_seed, run_dir
    return merged


def load_runs(run_dir: Path) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """sampler -> seed -> that run's per-step records, in step order."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: give the folder of an `envsched bench` run")
    runs: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    with path.open() as fh:
        for line in fh:
            rec = json.loads(line)
            runs[rec["sampler"]][int(rec["seed"])].append(rec)
    for per_seed in runs.values():
        for recs in per_seed.values():
            recs.sort(key=lambda r: r["step"])
    return runs


def _final(recs: list[dict[str, Any]], key: str) -> float:
    vals = [float(r[key]) for r in recs if key in r and r[key] is not None and math.isfinite(float(r[key]))]
    return vals[-1] if vals else math.nan


def _mean(recs: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([float(r[key]) for r in recs]))


def ablation_rows(runs: dict[str, dict[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """One record per ablation present in ``runs`` (plus ``envsched`` and ``uniform`` first)."""
    for need in ("envsched", "uniform"):
        if need not in runs:
            raise SystemExit(f"the run has no {need!r} runs: the table compares against both")
    final = {s: {seed: _final(r, "heldout") for seed, r in per.items()} for s, per in runs.items()}
    var = {s: float(np.mean([_mean(r, "batch_variance") for r in per.values()])) for s, per in runs.items()}
    envs = {s: float(np.mean([_mean(r, "envs_covered") for r in per.values()])) for s, per in runs.items()}

    def pct(value: float, base: float) -> str:
        return f"{100.0 * (value / base - 1.0):+.0f} %"

    def row(sampler: str, component: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sampler": sampler,
            "component": component,
            "held-out": f"{np.nanmean(list(final[sampler].values())):.2f}",
            "batch variance vs uniform": pct(var[sampler], var["uniform"]),
            "envs/batch vs uniform": pct(envs[sampler], envs["uniform"]),
        }
        if sampler in ("envsched", "uniform"):
            diff = paired_difference(final["envsched"], final["uniform"])
            out["envsched minus it"] = "-" if sampler == "envsched" else _interval(diff)
            out["verdict"] = "-" if sampler == "envsched" else _verdict(diff, "envsched better", "uniform better")
            return out
        diff = paired_difference(final["envsched"], final[sampler])
        out["envsched minus it"] = _interval(diff)
        seeds = set(final["envsched"]) & set(final[sampler])
        if seeds and all(final["envsched"][k] == final[sampler][k] for k in seeds):
            out["verdict"] = "identical on every seed"  # the switch changes nothing this learner reaches
            return out
        out["verdict"] = (_verdict(diff, "leaving it out helps", "adding it helps") if sampler in ADDED_BACK
                          else _verdict(diff, "earns its place", "removing it helps"))
        return out

    rows = [row("envsched", "nothing (the default)"), row("uniform", "everything (uniform baseline)")]
    rows += [row(s, c) for s, c in COMPONENTS.items() if s in runs]
    return rows


def _interval(diff: dict[str, Any]) -> str:
    return f"{diff['mean']:+.2f} [{diff['low']:+.2f}, {diff['high']:+.2f}] (n={diff['n']})"


def _verdict(diff: dict[str, Any], above: str, below: str) -> str:
    if not diff["significant"]:
        return "not detected"
    return above if diff["mean"] > 0 else below


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", type=Path, nargs="+", metavar="run_dir",
                        help="folder of an `envsched bench` run (holds metrics.jsonl); several merge")
    parser.add_argument("--name", required=True, help="table name: writes docs/tables/<NAME>.json")
    args = parser.parse_args(argv)
    rows = ablation_rows(load_folders(args.run_dirs))
    columns = ["sampler", "component", "held-out", "envsched minus it", "verdict", "batch variance vs uniform",
               "envs/batch vs uniform"]
    table = {"columns": columns, "align": ["left", "left", "right", "right", "left", "right", "right"],
             "records": rows}
    out = ROOT / "docs" / "tables" / f"{args.name}.json"
    out.write_text(json.dumps(table, indent=1) + "\n")
    for r in rows:
        print(" | ".join(str(r[c]) for c in columns))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
