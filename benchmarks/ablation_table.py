"""What each mechanism of EnvSched's default contributes: the ablation tables of docs/results.md.

Reads ``envsched bench`` run folders (their ``metrics.jsonl``, or ``metrics.jsonl.gz``) that hold ``envsched``,
``uniform`` and EnvSched's ablations and variants on the same seeds (one folder, or several whose samplers do
not overlap), and writes one table (``docs/tables/<NAME>.json``, rendered into docs/results.md by
``benchmarks/readme_tables.py``). Per ablation or variant:

* the component it concerns: what an ablation switches off, or what a variant adds back (the parts of the
  paper's pipeline that the default leaves out), ours or the paper's;
* held-out score at the end of the budget (x100, mean over seeds), or with ``--steps 40,120`` at each of those
  steps (the v2 benchmark's endpoints);
* ``envsched - ablation``, paired by seed: mean and 95 % Student-t interval;
* the verdict, for an ablation: **earns its place** when the interval is above 0 (removing it costs held-out
  score), **removing it helps** when below 0; for a variant that adds a component: **leaving it out helps**
  when above 0, **adding it helps** when below 0; **identical on every seed** when the scores are
  equal on every seed (the switch changes nothing this learner reaches); with ``--margin M``, **equivalent
  (±M)** when the two one-sided paired tests put the difference within ±M (p < 0.05, not adjusted for the
  table's many rows); **not detected** otherwise (never "no effect": with few seeds an interval that crosses 0
  says only that no difference was detected);
* with ``--steps``: the steps to reach uniform's best held-out score within the run's target step (the run's
  ``summary.json``: mean over the seeds that reach it, and on how many seeds it is missed);
* batch reward variance and environments per batch, as a change from uniform's (the paper's batch figures:
  +34 % and +26 %).

Usage (the commands behind docs/results.md)::

    envsched bench --learner model --untuned --seeds 5 --coldstart-runs 0 --no-plots \\
        --samplers uniform,envsched,envsched-paper,envsched-coverage-only,... --out ablation-model
    python benchmarks/ablation_table.py ablation-model --name ablations_model
    python benchmarks/readme_tables.py

On v2 (``benchmarks/v2_ablation.py`` runs the set)::

    python benchmarks/ablation_table.py results/v2-ablation-dev-2026-12-06 --steps 40,120 --margin 2 \\
        --name ablations_v2_dev
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from envsched_lab.stats import paired_difference, tost

ROOT = Path(__file__).resolve().parents[1]

#: Variants that add a part of the paper's pipeline the default leaves out -> that part; their verdict reads the
#: other way round from an ablation's.
ADDED_BACK: dict[str, str] = {
    "envsched-env-pooling": "the within relation as the whole environment (ours; tried, variant adds it)",
    "envsched-with-calibration": "calibration: percentile ranks and quantile mapping (paper; left out, variant "
                                 "adds it)",
    "envsched-with-decline": "the recent-decline term (paper; left out, variant adds it)",
    "envsched-former-default": "calibration and decline term on the paper's neighbour rule (variant adds them)",
    "envsched-adaptive": "the online coverage share and the UCB coverage ranking (ours; left out, variant adds "
                         "both: the round-4 default)",
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
    """sampler -> seed -> that run's per-step records, in step order (``metrics.jsonl``, or ``metrics.jsonl.gz``
    where a committed run folder keeps its records compressed)."""
    path = run_dir / "metrics.jsonl"
    packed = run_dir / "metrics.jsonl.gz"
    if not path.is_file() and not packed.is_file():
        raise SystemExit(f"{path} does not exist: give the folder of an `envsched bench` run")
    runs: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    with path.open() if path.is_file() else gzip.open(packed, "rt") as fh:
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


def _at_step(recs: list[dict[str, Any]], key: str, step: int, where: str) -> float:
    """``key`` of the record of ``step``; ``SystemExit`` naming the run when it has no finite value there."""
    for r in recs:
        if int(r["step"]) == step:
            value = r.get(key)
            if value is None or not math.isfinite(float(value)):
                raise SystemExit(f"{where}: no {key!r} at step {step} (is it an evaluation step of the run?)")
            return float(value)
    raise SystemExit(f"{where}: no record of step {step} (the run has {len(recs)} steps)")


def _mean(recs: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([float(r[key]) for r in recs]))


def load_targets(run_dirs: list[Path]) -> dict[str, dict[str, Any]]:
    """sampler -> its steps to uniform's best held-out score and seeds that miss it (``summary.json`` of the
    folder that holds the sampler; a folder without one, or without uniform, gives nothing)."""
    out: dict[str, dict[str, Any]] = {}
    for run_dir in run_dirs:
        path = run_dir / "summary.json"
        if not path.is_file():
            continue
        per = json.loads(path.read_text()).get("samplers", {})
        if "uniform" not in per:
            continue  # the target is uniform's best score in the same folder
        for sampler, d in per.items():
            steps = d.get("steps_to_target") or {}
            out[sampler] = {"mean": steps.get("mean", math.nan), "reached": steps.get("n", 0),
                            "missed": d.get("target_missed", 0)}
    return out


def ablation_rows(runs: dict[str, dict[int, list[dict[str, Any]]]], *, steps: list[int] | None = None,
                  margin: float | None = None, targets: dict[str, dict[str, Any]] | None = None
                  ) -> list[dict[str, Any]]:
    """One record per ablation present in ``runs`` (plus ``envsched`` and ``uniform`` first).

    ``steps``: the held-out score at each of these steps (columns ``held-out@T``, ``envsched minus it @T``,
    ``verdict @T``) instead of at the end of the run; ``margin``: "equivalent (±margin)" by the two one-sided
    tests where no difference is detected; ``targets`` (:func:`load_targets`): a steps-to-target column."""
    for need in ("envsched", "uniform"):
        if need not in runs:
            raise SystemExit(f"the run has no {need!r} runs: the table compares against both")
    if margin is not None and not (math.isfinite(margin) and margin > 0):
        raise SystemExit(f"--margin must be a finite number > 0, got {margin}")
    points: list[tuple[str, int | None]] = [("", None)] if not steps else [(f"@{t}", t) for t in steps]
    scores: dict[str, dict[str, dict[int, float]]] = {}
    for suffix, step in points:
        scores[suffix] = {
            s: {seed: (_final(r, "heldout") if step is None else _at_step(r, "heldout", step, f"{s} seed {seed}"))
                for seed, r in per.items()} for s, per in runs.items()}
    var = {s: float(np.mean([_mean(r, "batch_variance") for r in per.values()])) for s, per in runs.items()}
    envs = {s: float(np.mean([_mean(r, "envs_covered") for r in per.values()])) for s, per in runs.items()}

    def pct(value: float, base: float) -> str:
        return f"{100.0 * (value / base - 1.0):+.0f} %"

    def compare(final: dict[str, dict[int, float]], sampler: str) -> tuple[str, str]:
        diff = paired_difference(final["envsched"], final[sampler])
        if sampler == "uniform":
            return _interval(diff), _verdict(diff, "envsched better", "uniform better", final, sampler, margin)
        seeds = set(final["envsched"]) & set(final[sampler])
        if seeds and all(final["envsched"][k] == final[sampler][k] for k in seeds):
            return _interval(diff), "identical on every seed"  # the switch changes nothing this learner reaches
        if sampler in ADDED_BACK:
            return _interval(diff), _verdict(diff, "leaving it out helps", "adding it helps", final, sampler, margin)
        return _interval(diff), _verdict(diff, "earns its place", "removing it helps", final, sampler, margin)

    def row(sampler: str, component: str) -> dict[str, Any]:
        out: dict[str, Any] = {"sampler": sampler, "component": component}
        for suffix, step in points:
            final = scores[suffix]
            label = "" if step is None else f" {suffix}"
            out[f"held-out{suffix}"] = f"{np.nanmean(list(final[sampler].values())):.2f}"
            out[f"envsched minus it{label}"], out[f"verdict{label}"] = \
                ("-", "-") if sampler == "envsched" else compare(final, sampler)
        if targets is not None:
            t = targets.get(sampler)
            if t is None:
                out["steps to uniform's best"] = "-"
            else:
                mean = f"{t['mean']:.0f}" if t["reached"] else "never"
                out["steps to uniform's best"] = f"{mean} (missed {t['missed']}/{t['reached'] + t['missed']})"
        out["batch variance vs uniform"] = pct(var[sampler], var["uniform"])
        out["envs/batch vs uniform"] = pct(envs[sampler], envs["uniform"])
        return out

    rows = [row("envsched", "nothing (the default)"), row("uniform", "everything (uniform baseline)")]
    rows += [row(s, c) for s, c in COMPONENTS.items() if s in runs]
    return rows


def _interval(diff: dict[str, Any]) -> str:
    return f"{diff['mean']:+.2f} [{diff['low']:+.2f}, {diff['high']:+.2f}] (n={diff['n']})"


def _verdict(diff: dict[str, Any], above: str, below: str, final: dict[str, dict[int, float]] | None = None,
             sampler: str = "", margin: float | None = None) -> str:
    if diff["significant"]:
        return above if diff["mean"] > 0 else below
    if margin is not None and final is not None and tost(final["envsched"], final[sampler], margin) < 0.05:
        return f"equivalent (±{margin:g})"
    return "not detected"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", type=Path, nargs="+", metavar="run_dir",
                        help="folder of an `envsched bench` run (holds metrics.jsonl); several merge")
    parser.add_argument("--name", required=True, help="table name: writes docs/tables/<NAME>.json")
    parser.add_argument("--out", type=Path, default=None, help="write the table here instead (a JSON file)")
    parser.add_argument("--steps", default=None,
                        help="comma-separated steps (e.g. 40,120): held-out score at each instead of at the end")
    parser.add_argument("--margin", type=float, default=None,
                        help="equivalence margin in points: 'equivalent (±M)' by two one-sided tests")
    args = parser.parse_args(argv)
    try:
        steps = sorted({int(t) for t in args.steps.split(",") if t.strip()}) if args.steps else None
    except ValueError:
        raise SystemExit(f"--steps {args.steps!r}: give whole steps, e.g. 40,120") from None
    if steps is not None and (not steps or steps[0] < 1):
        raise SystemExit(f"--steps {args.steps!r}: give steps of 1 or more, e.g. 40,120")
    targets = load_targets(args.run_dirs) if steps else None
    rows = ablation_rows(load_folders(args.run_dirs), steps=steps, margin=args.margin, targets=targets)
    columns = list(rows[0])
    align = ["left" if c in ("sampler", "component") or c.startswith("verdict") else "right" for c in columns]
    table = {"columns": columns, "align": align, "records": rows}
    out = args.out or ROOT / "docs" / "tables" / f"{args.name}.json"
    out.write_text(json.dumps(table, indent=1) + "\n")
    for r in rows:
        print(" | ".join(str(r[c]) for c in columns))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
