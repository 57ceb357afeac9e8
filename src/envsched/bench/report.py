"""Aggregation of a benchmark run directory: metrics files, the summary table, the goal checks and plots.

Figures per sampler (mean and standard deviation over seeds):

* ``batch_variance``: mean over steps of the batch's mean within-task reward variance;
* ``envs_covered`` / ``tools_covered``: mean distinct environments / tools per batch;
* ``signal_per_episode`` / ``signal_per_cost``: signal (mixed) groups per rollout / per unit cost over the
  whole run, dropped groups of dynamic sampling included;
* ``score@t``: learner score after ``t`` budget steps (``t x B x n`` rollouts);
* ``rollouts_to_target``: rollouts spent when the learner score first reaches *uniform's best score within
  its first ``target_step`` steps* with the same seed (same initial learner; the mean over uniform's seeds
  where uniform did not run that seed); runs that never reach it are left out of the mean and counted in
  ``target_missed``.

The Table 4 form (cold-start runs): per step, the mean batch variance, the exploitation hit rate
(share of exploitation picks whose group is mixed; all groups for samplers without an exploitation phase
and for EnvSched's cold-start batch, which has no exploitation picks)
over all runs and in the low / high initial-variance halves (split at the median step-1 batch variance),
and the relative gap of batch variance between the halves.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["load_records", "summarise", "write_report"]


def load_records(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """All per-step records of finished runs and of cold-start blocks in ``run_dir``."""
    runs, cold = [], []
    for f in sorted((run_dir / "runs").glob("*.jsonl")):
        recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        (cold if f.name.endswith("__coldstart.jsonl") else runs).extend(recs)
    return runs, cold


def _ms(values: list[float]) -> dict[str, float]:
    arr = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))],
                     dtype=float)
    if arr.size == 0:
        return {"mean": math.nan, "std": math.nan, "n": 0}
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0, "n": int(arr.size)}


def summarise(runs: list[dict[str, Any]], cold: list[dict[str, Any]], config: Any) -> dict[str, Any]:
    by_run: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_run[(r["sampler"], r["seed"])].append(r)
    for v in by_run.values():
        v.sort(key=lambda r: r["step"])
    samplers = [s for s in config.samplers if any(k[0] == s for k in by_run)]
    # Uniform's best score within target_step steps, per seed: runs with the same seed face the same
    # initial learner, so each run is compared with uniform's run of its seed (the mean over uniform's
    # seeds for a seed uniform did not run).
    uniform_best = {seed: max(r["score"] for r in recs if r["step"] <= config.target_step)
                    for (s, seed), recs in by_run.items() if s == "uniform"}
    target = float(np.mean(list(uniform_best.values()))) if uniform_best else math.nan
    per: dict[str, Any] = {}
    for s in samplers:
        seeds = sorted(seed for (name, seed) in by_run if name == s)
        rows = [by_run[(s, seed)] for seed in seeds]
        d: dict[str, Any] = {"seeds": seeds}
        d["batch_variance"] = _ms([float(np.mean([r["batch_variance"] for r in recs])) for recs in rows])
        d["envs_covered"] = _ms([float(np.mean([r["envs_covered"] for r in recs])) for recs in rows])
        d["tools_covered"] = _ms([float(np.mean([r["tools_covered"] for r in recs])) for recs in rows])
        d["mean_reward"] = _ms([float(np.mean([r["mean_reward"] for r in recs])) for recs in rows])
        d["signal_per_episode"] = _ms([recs[-1]["signal_per_episode"] for recs in rows])
        d["signal_per_cost"] = _ms([recs[-1]["signal_per_cost"] for recs in rows])
        d["updates"] = _ms([recs[-1]["updates"] for recs in rows])
        d["score_start"] = _ms([recs[0]["score"] for recs in rows])
        for t in config.score_steps:
            d[f"score@{t}"] = _ms([recs[t - 1]["score"] for recs in rows if len(recs) >= t])
        reach, missed, steps_reach = [], 0, []
        for seed, recs in zip(seeds, rows, strict=True):
            goal = uniform_best.get(seed, target)
            hit = next((r for r in recs if not math.isnan(goal) and r["score"] >= goal - 1e-12), None)
            if hit is None:
                missed += 1
            else:
                reach.append(hit["rollouts"])
                steps_reach.append(hit["step"])
        d["rollouts_to_target"] = _ms(reach)
        d["steps_to_target"] = _ms(steps_reach)
        d["target_missed"] = missed
        picks = [sum(r["exploit_picks"] for r in recs if r["exploit_picks"] >= 0) for recs in rows]
        hits = [sum(r["exploit_hits"] for r in recs if r["exploit_hits"] >= 0) for recs in rows]
        d["exploit_hit_rate"] = _ms([h / p for h, p in zip(hits, picks, strict=True) if p > 0])
        per[s] = d
    out: dict[str, Any] = {"target_score": target, "target_step": config.target_step, "samplers": per,
                           "coldstart": _table4(cold, config), "goals": _goals(per, _table4(cold, config), config)}
    return out


def _table4(cold: list[dict[str, Any]], config: Any) -> dict[str, Any]:
    by_sampler: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in cold:
        by_sampler[r["sampler"]][r["run"]].append(r)
    out: dict[str, Any] = {}
    for s, runs in by_sampler.items():
        for v in runs.values():
            v.sort(key=lambda r: r["step"])
        ids = sorted(runs)
        v1 = np.array([runs[i][0]["batch_variance"] for i in ids])
        med = float(np.median(v1))
        low = {i for i, v in zip(ids, v1, strict=True) if v <= med}
        steps = min(len(runs[i]) for i in ids)
        table = []
        for k in range(steps):
            recs = [runs[i][k] for i in ids]

            def rate(rs: list[dict[str, Any]]) -> float:
                # a step without exploitation picks (a sampler without the notion, or EnvSched's cold-start
                # batch) counts all its groups
                picks = sum(r["exploit_picks"] if r["exploit_picks"] > 0 else config.batch_size for r in rs)
                hits = sum(r["exploit_hits"] if r["exploit_picks"] > 0 else r["signal_groups"] for r in rs)
                return hits / picks if picks else math.nan

            lo = [r for i, r in zip(ids, recs, strict=True) if i in low]
            hi = [r for i, r in zip(ids, recs, strict=True) if i not in low]
            var_lo = float(np.mean([r["batch_variance"] for r in lo])) if lo else math.nan
            var_hi = float(np.mean([r["batch_variance"] for r in hi])) if hi else math.nan
            table.append({
                "step": k + 1, "batch_variance": float(np.mean([r["batch_variance"] for r in recs])),
                "hit_rate": rate(recs), "hit_rate_low": rate(lo), "hit_rate_high": rate(hi),
                "variance_gap": abs(var_hi - var_lo) / max(var_lo, 1e-12) if lo and hi else math.nan,
            })
        out[s] = {"runs": len(ids), "table": table}
    return out


def _goals(per: dict[str, Any], t4: dict[str, Any], config: Any) -> dict[str, Any]:
    g: dict[str, Any] = {}
    if "envsched" in per and "uniform" in per:
        e, u = per["envsched"], per["uniform"]
        dv = e["batch_variance"]["mean"] / u["batch_variance"]["mean"] - 1
        de = e["envs_covered"]["mean"] / u["envs_covered"]["mean"] - 1
        g["variance_gain"] = {"value": dv, "goal": 0.34, "met": bool(dv >= 0.34)}
        g["envs_covered_gain"] = {"value": de, "goal": 0.26, "met": bool(de >= 0.26)}
        st = e["steps_to_target"]
        g["steps_to_uniform_best"] = {"value": st["mean"], "missed": e["target_missed"], "goal": 40,
                                      "met": bool(e["target_missed"] == 0 and st["mean"] <= 40)}
        best = max(per, key=lambda s: per[s]["signal_per_episode"]["mean"])
        g["highest_signal_per_episode"] = {"best": best, "met": best == "envsched"}
        ds, us = e.get(f"score@{config.steps}", {}), u.get(f"score@{config.steps}", {})
        if ds and us:
            rel = ds["mean"] / us["mean"] - 1
            g["final_score_vs_uniform"] = {"value": rel}
    if "envsched" in t4:
        tab = t4["envsched"]["table"]
        if len(tab) >= 7:
            r7 = tab[6]
            gap = abs(r7["hit_rate_low"] - r7["hit_rate_high"]) * 100
            g["hit_rate_step7"] = {"value": r7["hit_rate"], "goal": 0.92, "met": bool(r7["hit_rate"] >= 0.92)}
            g["hit_rate_group_gap_points"] = {"value": gap, "goal": 3.0, "met": bool(gap <= 3.0)}
    return g


def _fmt(d: dict[str, float], digits: int = 4) -> str:
    if not d or d.get("n", 0) == 0 or math.isnan(d["mean"]):
        return "-"
    return f"{d['mean']:.{digits}f} ± {d['std']:.{digits}f}"


def markdown_table(summary: dict[str, Any], config: Any) -> str:
    cols = [("batch_variance", "within-task var/batch", 4), ("envs_covered", "envs/batch", 2),
            ("tools_covered", "tools/batch", 1), ("signal_per_episode", "signal groups/episode", 4),
            ("signal_per_cost", "signal groups/cost", 4)]
    cols += [(f"score@{t}", f"score@{t}", 2) for t in config.score_steps]
    cols += [("rollouts_to_target", f"rollouts to uniform-best@{config.target_step}", 0)]
    head = "| sampler | " + " | ".join(c[1] for c in cols) + " | missed |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for s, d in summary["samplers"].items():
        cells = [_fmt(d[k], dg) for k, _, dg in cols]
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {d['target_missed']}/{len(d['seeds'])} |")
    out = "\n".join(lines) + "\n"
    out += f"\nTarget: uniform's best score within {config.target_step} steps, per seed (mean over seeds " \
           f"{summary['target_score']:.2f})\n"
    for s, t in summary["coldstart"].items():
        out += f"\nCold start ({s}, {t['runs']} runs; Table 4 form)\n\n"
        out += "| step | batch var | hit rate | hit low | hit high | var gap low/high |\n|---|---|---|---|---|---|\n"
        for r in t["table"]:
            out += (f"| {r['step']} | {r['batch_variance']:.4f} | {100 * r['hit_rate']:.1f}% | "
                    f"{100 * r['hit_rate_low']:.1f}% | {100 * r['hit_rate_high']:.1f}% | "
                    f"{100 * r['variance_gap']:.1f}% |\n")
    if summary["goals"]:
        out += "\nGoals\n\n"
        for k, v in summary["goals"].items():
            out += f"- {k}: {json.dumps(v)}\n"
    return out


def _plots(run_dir: Path, runs: list[dict[str, Any]], config: Any) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        by[r["sampler"]][r["seed"]].append(r)
    names = [s for s in config.samplers if s in by]

    def curve(s: str, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        seeds = by[s]
        n = min(len(v) for v in seeds.values())
        m = np.array([[sorted(v, key=lambda r: r["step"])[i][key] for i in range(n)] for v in seeds.values()])
        x = np.array([sorted(next(iter(seeds.values())), key=lambda r: r["step"])[i]["rollouts"] for i in range(n)])
        return x, m.mean(axis=0), m.std(axis=0)

    def smooth(y: np.ndarray, w: int = 5) -> np.ndarray:
        if y.size < w:
            return y
        k = np.ones(w) / w
        return np.convolve(np.pad(y, (w // 2, w - 1 - w // 2), mode="edge"), k, mode="valid")

    files = []
    style = {s: ("-" if s in ("envsched", "uniform") else "--") for s in names}
    cmap = plt.get_cmap("tab20")
    color = {s: cmap(i % 20) for i, s in enumerate(names)}
    specs = [
        ("batch_variance.png", [("batch_variance", "mean within-task reward variance per batch")]),
        ("coverage.png", [("envs_covered", "environments covered per batch"),
                          ("tools_covered", "tools covered per batch")]),
        ("signal_per_episode.png", [("signal_per_episode", "signal groups per episode (cumulative)")]),
        ("score_vs_rollouts.png", [("score", "learner score")]),
    ]
    for fname, panels in specs:
        fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
        for ax, (key, title) in zip(axes[0], panels, strict=True):
            for s in names:
                x, mu, sd = curve(s, key)
                y = smooth(mu) if key in ("batch_variance", "envs_covered", "tools_covered") else mu
                lw = 2.2 if s == "envsched" else 1.2
                ax.plot(x, y, style[s], lw=lw, label=s, color=color[s])
                if key == "score":
                    ax.fill_between(x, mu - sd, mu + sd, alpha=0.08, color=color[s])
            ax.set_xlabel("rollouts spent")
            ax.set_title(title)
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(run_dir / fname, dpi=110)
        plt.close(fig)
        files.append(fname)
    return files


def write_report(run_dir: Path, config: Any, *, plots: bool = True) -> dict[str, Any]:
    """Write ``metrics.jsonl``, ``metrics.parquet``, ``summary.json``, ``summary.md`` and the PNGs."""
    runs, cold = load_records(run_dir)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    if runs:
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = list(runs[0])
        pq.write_table(pa.table({c: [r.get(c) for r in runs] for c in cols}), run_dir / "metrics.parquet")
    if cold:
        (run_dir / "coldstart.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cold))
    summary = summarise(runs, cold, config)
    summary["config"] = asdict(config)
    if plots and runs:
        summary["plots"] = _plots(run_dir, runs, config)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    (run_dir / "summary.md").write_text(markdown_table(summary, config))
    return summary
