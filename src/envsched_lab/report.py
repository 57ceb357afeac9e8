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
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from envsched_lab.stats import paired_difference
from envsched_lab.variants import ENVSCHED_ABLATIONS

__all__ = ["TARGET_METRIC", "load_records", "paired_difference", "summarise", "write_report"]

#: The score the benchmark judges by: the held-out score (held-out tasks and environments together).
TARGET_METRIC = "heldout"


def has_module(name: str) -> bool:
    """Whether an optional dependency (``pyarrow``, ``matplotlib``: the ``lab`` extra) is importable."""
    import importlib.util

    return importlib.util.find_spec(name) is not None


#: The install command named when a package of the ``bench`` extra is missing.
BENCH_EXTRA_HINT = "pip install 'envsched[lab]'"
#: what each package of the ``bench`` extra writes
BENCH_OUTPUTS = {"pyarrow": "Parquet metrics (metrics.parquet)", "matplotlib": "PNG plots"}


def missing_bench_outputs(*, plots: bool = True) -> list[str]:
    """One sentence per missing ``bench`` package, naming the package and what is skipped without it
    (matplotlib may come with another dependency while pyarrow does not: each is checked on its own)."""
    return [f"{what} need {name}, which is not installed: they are skipped ({BENCH_EXTRA_HINT})"
            for name, what in BENCH_OUTPUTS.items() if not has_module(name) and (plots or name != "matplotlib")]


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
    metric = TARGET_METRIC if all(TARGET_METRIC in r for r in runs) else "score"
    # Uniform's best held-out score within target_step steps, per seed: runs with the same seed face the
    # same initial learner, so each run is compared with uniform's run of its seed (the mean over uniform's
    # seeds for a seed uniform did not run).
    uniform_best = {seed: max(r[metric] for r in recs if r["step"] <= config.target_step)
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
        d["heldout_initial"] = _ms([recs[0].get("heldout_initial", math.nan) for recs in rows])
        for key in sorted({k for recs in rows for k in recs[0] if k.startswith("baseline_")
                           and k != "baseline_constant_answer"}):
            d[key] = _ms([recs[0].get(key, math.nan) for recs in rows])
        for key in sorted({k for recs in rows for k in recs[0] if k.startswith("heldout_group_")
                           and k.endswith("_initial")}):
            d[key] = _ms([recs[0].get(key, math.nan) for recs in rows])
        d["cost"] = _ms([recs[-1]["cum_cost"] for recs in rows])
        for t in config.score_steps:
            d[f"score@{t}"] = _ms([recs[t - 1]["score"] for recs in rows if len(recs) >= t])
            for key in ("heldout", "heldout_a", "heldout_b"):
                name = "heldout_score" if key == "heldout" else key
                d[f"{name}@{t}"] = _ms([recs[t - 1].get(key, math.nan) for recs in rows if len(recs) >= t])
            # the neural learner's other score beside its primary one (the keys above), and the v2 pool's stages
            extra = [k for k in ("heldout_expected", "heldout_a_expected", "heldout_b_expected", "score_expected",
                                 "heldout_greedy", "heldout_a_greedy", "heldout_b_greedy", "score_greedy")]
            extra += sorted({k for recs in rows for k in recs[0] if k.startswith("heldout_group_")
                             and not k.endswith("_initial")})
            for key in extra:
                if any(key in recs[0] for recs in rows):
                    d[f"{key}@{t}"] = _ms([recs[t - 1].get(key, math.nan) for recs in rows if len(recs) >= t])
        if any("heldout_sampled" in recs[-1] for recs in rows):
            d["heldout_sampled"] = _ms([recs[-1].get("heldout_sampled", math.nan) for recs in rows])
        reach, missed, steps_reach, cost_reach = [], 0, [], []
        for seed, recs in zip(seeds, rows, strict=True):
            goal = uniform_best.get(seed, target)
            hit = next((r for r in recs if not math.isnan(goal) and r[metric] >= goal - 1e-12), None)
            if hit is None:
                missed += 1
            else:
                reach.append(hit["rollouts"])
                steps_reach.append(hit["step"])
                cost_reach.append(hit["cum_cost"])
        d["rollouts_to_target"] = _ms(reach)
        d["steps_to_target"] = _ms(steps_reach)
        d["cost_to_target"] = _ms(cost_reach)
        d["target_missed"] = missed
        picks = [sum(r["exploit_picks"] for r in recs if r["exploit_picks"] >= 0) for recs in rows]
        hits = [sum(r["exploit_hits"] for r in recs if r["exploit_hits"] >= 0) for recs in rows]
        d["exploit_hit_rate"] = _ms([h / p for h, p in zip(hits, picks, strict=True) if p > 0])
        per[s] = d
    _add_paired(per, by_run, config)
    t4 = _table4(cold, config)
    label = learner_label(config)
    out: dict[str, Any] = {"learner": label, "target_score": target, "target_step": config.target_step,
                           "target_metric": metric, "samplers": per, "coldstart": t4,
                           "goals": _goals(per, t4, config),
                           "significant": _significance_sentences(per, config)}
    baselines: dict[str, Any] = {}
    for (_, seed), recs in sorted(by_run.items()):
        if str(seed) not in baselines and any(k.startswith("baseline_") for k in recs[0]):
            baselines[str(seed)] = {k[len("baseline_"):]: recs[0][k] for k in recs[0] if k.startswith("baseline_")}
    if baselines:
        out["baselines"] = baselines
    if getattr(config, "pool", None) == "v2":
        from envsched_lab.gate import gate

        out["gate"] = gate(runs, learner=label)
    return out


def learner_label(config: Any) -> str:
    """The learner a run's figures come from, in words (every table and verdict names it)."""
    kind = getattr(config, "learner_kind", "model")
    if kind == "model":
        return "simulated learner (--learner model)"
    if getattr(config, "pool", None) == "v2":
        return "neural learner, pool v2"
    return f"neural learner, families {getattr(config, 'families', None) or 'default'}"


def _per_seed(by_run: Mapping[tuple[str, int], list[dict[str, Any]]], sampler: str, key: str,
              step: int) -> dict[int, float]:
    return {seed: float(recs[step - 1].get(key, math.nan)) for (s, seed), recs in by_run.items()
            if s == sampler and len(recs) >= step}


def _add_paired(per: dict[str, Any], by_run: Mapping[tuple[str, int], list[dict[str, Any]]], config: Any) -> None:
    """``paired_vs_uniform@t`` and ``paired_vs_best@t`` (the best other sampler by mean held-out score)."""
    key = TARGET_METRIC
    for t in config.score_steps:
        vals = {s: _per_seed(by_run, s, key, t) for s in per}
        means = {s: per[s].get(f"heldout_score@{t}", {}).get("mean", math.nan) for s in per}
        for s in per:
            if "uniform" in per and s != "uniform":
                per[s][f"paired_vs_uniform@{t}"] = paired_difference(vals[s], vals["uniform"])
            others = [o for o in per if o != s and not math.isnan(means[o])]
            if others:
                best = max(others, key=lambda o: means[o])
                per[s][f"paired_vs_best@{t}"] = {**paired_difference(vals[s], vals[best]), "other": best}


def _verdict(p: Mapping[str, Any]) -> str:
    if p.get("n", 0) < 2 or math.isnan(p.get("low", math.nan)):
        return "not detected"
    # An interval that crosses zero is "not detected", never a tie: equivalence needs a stated margin
    # (envsched_lab.stats.tost, used by the evaluation protocol).
    return "win" if p["low"] > 0 else "loss" if p["high"] < 0 else "not detected"


def _significance_sentences(per: Mapping[str, Any], config: Any) -> list[str]:
    t = config.score_steps[-1] if config.score_steps else config.steps
    out = []
    for s, d in per.items():
        p = d.get(f"paired_vs_uniform@{t}")
        if not p or p["n"] == 0:
            continue
        word = "significantly above" if p["significant"] and p["low"] > 0 else \
            "significantly below" if p["significant"] else "not significantly different from"
        out.append(f"{s} is {word} uniform in held-out score at step {t}: {p['mean']:+.2f} points "
                   f"(95% CI {p['low']:+.2f} to {p['high']:+.2f}, {p['n']} paired seeds; {learner_label(config)}).")
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


def _goal(value: float, goal: float, met: bool, sentence: str, **extra: Any) -> dict[str, Any]:
    return {"value": value, "goal": goal, "met": bool(met), "sentence": sentence, **extra}


def _relative(value: float, base: float) -> float:
    """``value / base - 1``; NaN when ``base`` is 0 (a tiny neural run where uniform saw no reward variance)."""
    return value / base - 1 if base else math.nan


def _goals(per: dict[str, Any], t4: dict[str, Any], config: Any) -> dict[str, Any]:
    """The paper's and the scheduler issue's goals, each with a sentence saying what was measured."""
    g: dict[str, Any] = {}
    u = per.get("uniform")
    paper = "envsched-paper" if "envsched-paper" in per else None
    if u is not None:
        for name, label in (("envsched", "EnvSched"), (paper, "EnvSched (paper preset)")):
            if not name or name not in per:
                continue
            e = per[name]
            dv = _relative(e["batch_variance"]["mean"], u["batch_variance"]["mean"])
            de = _relative(e["envs_covered"]["mean"], u["envs_covered"]["mean"])
            prefix = "" if name == "envsched" else "paper_"
            g[f"{prefix}variance_gain"] = _goal(dv, 0.34, dv >= 0.34, f"{label}: within-task variance per batch "
                                                f"{dv:+.1%} over uniform (paper: at least +34%).")
            env_goal = 0.26 if name == paper else 0.20
            g[f"{prefix}envs_covered_gain"] = _goal(de, env_goal, de >= env_goal,
                                                    f"{label}: environments per batch {de:+.1%} over uniform "
                                                    f"(goal: at least {env_goal:+.0%}).")
        if "envsched" in per:
            e = per["envsched"]
            st = e["steps_to_target"]
            met = e["target_missed"] == 0 and st["mean"] <= 40
            reached = (f"reached it at step {st['mean']:.1f} on average" if st.get("n") else "never reached it") + \
                (f", missed on {e['target_missed']} of {len(e['seeds'])} seeds" if e["target_missed"] else "")
            g["steps_to_uniform_best"] = _goal(st["mean"], 40, met, f"EnvSched {reached}: uniform's best held-out "
                                               f"score within {config.target_step} steps (goal: by step 40).",
                                               missed=e["target_missed"])
            ds, us = e.get(f"heldout_score@{config.steps}", {}), u.get(f"heldout_score@{config.steps}", {})
            if ds.get("n") and us.get("n"):
                rel = _relative(ds["mean"], us["mean"])
                g["final_score_vs_uniform"] = _goal(rel, 0.0, rel >= 0, f"EnvSched's held-out score at step "
                                                    f"{config.steps} is {rel:+.1%} relative to uniform's.")
            # EnvSched's own ablations are variants of it, not alternatives a user would pick instead
            rivals = [s for s in per if s not in ENVSCHED_ABLATIONS]
            best = max(rivals, key=lambda s: per[s]["signal_per_episode"]["mean"])
            best_all = max(per, key=lambda s: per[s]["signal_per_episode"]["mean"])
            also = "" if best_all in rivals else (f"; its ablation {best_all} has "
                                                  f"{per[best_all]['signal_per_episode']['mean']:.4f}")
            g["highest_signal_per_episode"] = _goal(
                per["envsched"]["signal_per_episode"]["mean"], per[best]["signal_per_episode"]["mean"],
                best == "envsched", f"Highest signal groups per episode among the samplers compared (EnvSched's "
                f"ablations aside): {best} ({per[best]['signal_per_episode']['mean']:.4f}; EnvSched "
                f"{per['envsched']['signal_per_episode']['mean']:.4f}{also}).", best=best)
    if "envsched" in t4:
        tab = t4["envsched"]["table"]
        if len(tab) >= 7:
            r7 = tab[6]
            gap = abs(r7["hit_rate_low"] - r7["hit_rate_high"]) * 100
            g["hit_rate_step7"] = _goal(r7["hit_rate"], 0.92, r7["hit_rate"] >= 0.92,
                                        f"EnvSched's exploitation hit rate at step 7: {r7['hit_rate']:.1%} "
                                        f"(goal: at least 92%).")
            g["hit_rate_group_gap_points"] = _goal(gap, 3.0, gap <= 3.0,
                                                   f"Low/high initial-variance groups at step 7: "
                                                   f"{100 * r7['hit_rate_low']:.1f}% / "
                                                   f"{100 * r7['hit_rate_high']:.1f}%, {gap:.1f} points apart "
                                                   f"(goal: at most 3).")
    return g


def _fmt(d: dict[str, float] | None, digits: int = 4, sd: bool = True) -> str:
    if not d or d.get("n", 0) == 0 or math.isnan(d["mean"]):
        return "-"
    return f"{d['mean']:.{digits}f} ± {d['std']:.{digits}f}" if sd else f"{d['mean']:.{digits}f}"


def _fmt_paired(p: Mapping[str, Any] | None) -> str:
    if not p or p.get("n", 0) == 0:
        return "-"
    if math.isnan(p.get("low", math.nan)):
        return f"{p['mean']:+.2f}"
    mark = "*" if p.get("significant") else ""
    return f"{p['mean']:+.2f} [{p['low']:+.2f}, {p['high']:+.2f}]{mark}"


def summary_tables(summary: dict[str, Any], config: Any) -> list[tuple[str, list[str], list[list[str]]]]:
    """The summary as (title, header, rows) tables, shared by the Markdown file and the terminal."""
    per = summary["samplers"]
    label = summary.get("learner") or learner_label(config)
    t_last = config.score_steps[-1] if config.score_steps else config.steps
    v2 = getattr(config, "pool", None) == "v2"
    paired_steps = list(config.score_steps) if v2 else [t_last]
    trivial = any("baseline_constant" in d for d in per.values())
    tables = []
    head = (["sampler"] + [f"held-out@{t}" for t in config.score_steps]
            + [f"vs uniform@{t}" for t in paired_steps] + [f"vs best other@{t_last}"])
    if trivial:
        head += ["initial", "best constant", "env mode"]
    rows = []
    for s, d in per.items():
        best = d.get(f"paired_vs_best@{t_last}")
        row = ([s] + [_fmt(d.get(f"heldout_score@{t}"), 2) for t in config.score_steps]
               + [_fmt_paired(d.get(f"paired_vs_uniform@{t}")) for t in paired_steps]
               + [(_fmt_paired(best) + f" ({best['other']})") if best else "-"])
        if trivial:
            row += [_fmt(d.get("heldout_initial"), 2), _fmt(d.get("baseline_constant"), 2),
                    _fmt(d.get("baseline_env_mode"), 2)]
        rows.append(row)
    tables.append((f"Held-out score, {label} (x100; mean ± sd over seeds; paired differences: mean [95% CI], "
                   "* = significant" + ("; beside it, the same seeds' initial policy and trivial baselines"
                                        if trivial else "") + ")", head, rows))
    head = ["sampler", f"held-out tasks@{t_last}", f"held-out envs@{t_last}", f"training pool@{t_last}",
            "training pool at step 1"]
    rows = [[s, _fmt(d.get(f"heldout_a@{t_last}"), 2), _fmt(d.get(f"heldout_b@{t_last}"), 2),
             _fmt(d.get(f"score@{t_last}"), 2), _fmt(d.get("score_start"), 2)] for s, d in per.items()]
    tables.append((f"Held-out tasks of training environments (a), held-out environments (b), training pool, "
                   f"{label}", head, rows))
    stages = sorted({k[len("heldout_group_"):-len(f"@{t_last}")] for d in per.values() for k in d
                     if k.startswith("heldout_group_") and k.endswith(f"@{t_last}")})
    if stages:
        head = ["sampler"] + [f"{g} {when}" for g in stages for when in ("initial", f"@{t_last}")]
        rows = [[s] + [_fmt(d.get(k), 2) for g in stages
                       for k in (f"heldout_group_{g}_initial", f"heldout_group_{g}@{t_last}")] for s, d in per.items()]
        tables.append((f"Held-out score by stage of the skills, {label}", head, rows))
    head = ["sampler", "var/batch", "envs/batch", "signal/episode", "signal/cost", "rollouts to target",
            "cost to target", "missed"]
    rows = [[s, _fmt(d["batch_variance"], 4, False), _fmt(d["envs_covered"], 1, False),
             _fmt(d["signal_per_episode"], 4, False), _fmt(d["signal_per_cost"], 4, False),
             _fmt(d["rollouts_to_target"], 0, False), _fmt(d.get("cost_to_target"), 0, False),
             f"{d['target_missed']}/{len(d['seeds'])}"] for s, d in per.items()]
    tables.append((f"Efficiency, {label} (target: uniform's best held-out score within {config.target_step} "
                   f"steps, per seed)", head, rows))
    return tables


def markdown_table(summary: dict[str, Any], config: Any) -> str:
    out = ""
    for title, head, rows in summary_tables(summary, config):
        out += f"{title}\n\n| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n"
        out += "".join("| " + " | ".join(r) + " |\n" for r in rows) + "\n"
    for s, t in summary["coldstart"].items():
        out += f"Cold start ({s}, {t['runs']} runs; Table 4 form)\n\n"
        out += "| step | batch var | hit rate | hit low | hit high | var gap low/high |\n|---|---|---|---|---|---|\n"
        for r in t["table"]:
            out += (f"| {r['step']} | {r['batch_variance']:.4f} | {100 * r['hit_rate']:.1f}% | "
                    f"{100 * r['hit_rate_low']:.1f}% | {100 * r['hit_rate_high']:.1f}% | "
                    f"{100 * r['variance_gap']:.1f}% |\n")
        out += "\n"
    if summary.get("significant"):
        out += "Paired comparisons with uniform\n\n" + "".join(f"- {x}\n" for x in summary["significant"]) + "\n"
    if summary["goals"]:
        out += f"Goals ({summary.get('learner') or learner_label(config)})\n\n" + "".join(
            f"- {'met' if v['met'] else 'NOT met'}: {v['sentence']}\n" for v in summary["goals"].values())
    if summary.get("gate"):
        out += "\n" + "\n".join(gate_lines(summary["gate"])) + "\n"
    return out


def gate_lines(g: Mapping[str, Any]) -> list[str]:
    """The v2 gate's verdict as text lines (the summary file and the terminal)."""
    word = {True: "PASSED", False: "FAILED", None: "not decided (runs missing)"}[g.get("passed")]
    lines = [f"Gate of the v2 benchmark ({g.get('learner')}): {word}", ""]
    for key in ("rl_moves", "oracle_variance", "constant", "uniform_coverage", "coverage_oracle"):
        c = g.get(key) or {}
        mark = {True: "met", False: "NOT met", None: "not decided"}[c.get("met")]
        lines.append(f"- {mark}: {c.get('sentence', '')}")
    return lines


#: Distinct colours (Okabe-Ito, then Tableau's darker tones): no two samplers get near-identical colours.
PALETTE = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442",
           "#8c564b", "#7f7f7f", "#17becf", "#9467bd", "#bcbd22", "#e377c2", "#393b79", "#637939"]


def sampler_colours(names: list[str]) -> dict[str, str]:
    """A colour per sampler, stable for the common ones (uniform black, EnvSched vermillion)."""
    fixed = {"uniform": PALETTE[0], "envsched": PALETTE[4], "envsched-paper": PALETTE[5], "plr": PALETTE[3],
             "mopps": PALETTE[1], "uniform-ds": PALETTE[2], "greso": PALETTE[6], "curriculum": PALETTE[8]}
    free = [c for c in PALETTE if c not in fixed.values()]
    out = {}
    for s in names:
        out[s] = fixed.get(s) or (free.pop(0) if free else PALETTE[len(out) % len(PALETTE)])
    return out


#: EnvSched's ablations: drawn lighter in the shared-axis plots, and in their own row of the paired figure
def _is_ablation(name: str) -> bool:
    return name.startswith("envsched-") and name != "envsched-paper"


def _plots(run_dir: Path, runs: list[dict[str, Any]], config: Any) -> list[str]:
    """The benchmark's PNGs. The main one is ``heldout_vs_uniform.png`` (paired differences to uniform with
    their 95 % intervals); absolute held-out and training scores are small multiples (one panel per sampler,
    uniform in grey in each), so that no two samplers' bands overlap; the per-batch statistics share one axis
    with thin lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    by: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        by[r["sampler"]][r["seed"]].append(r)
    names = [s for s in config.samplers if s in by]
    n_seeds = min(len(by[s]) for s in names)

    def curve(s: str, key: str, x_key: str = "rollouts") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        runs_ = [sorted(v, key=lambda r: r["step"]) for v in by[s].values()]
        n = min(len(v) for v in runs_)
        m = np.array([[v[i].get(key, math.nan) for i in range(n)] for v in runs_], dtype=float)
        xs = np.array([[v[i][x_key] for i in range(n)] for v in runs_], dtype=float)
        return xs.mean(axis=0), m.mean(axis=0), m.std(axis=0)

    def smooth(y: np.ndarray, w: int = 5) -> np.ndarray:
        if y.size < w:
            return y
        k = np.ones(w) / w
        return np.convolve(np.pad(y, (w // 2, w - 1 - w // 2), mode="edge"), k, mode="valid")

    def finish(fig: Any, fname: str, caption: str, legend_from: Any = None, top: float = 1.0) -> str:
        right = 1.0
        if legend_from is not None:
            handles, labels = legend_from.get_legend_handles_labels()
            fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0 - 2.0 / fig.get_figwidth(), 0.5),
                       fontsize=8, frameon=False)
            right = 1.0 - 2.1 / fig.get_figwidth()
        fig.text(0.01, 0.01, caption, fontsize=8, ha="left", va="bottom")
        fig.tight_layout(rect=(0, 0.04, right, top))
        fig.savefig(run_dir / fname, dpi=110)
        plt.close(fig)
        return fname

    files = []
    color = sampler_colours(names)
    x_label = {"rollouts": "rollouts spent", "cum_cost": "cumulative cost"}
    cost_note = (" Cost: generated tokens (EOS included)." if getattr(config, "learner_kind", "model") == "neural"
                 else " Cost: BFCL calls, checks of other tool tasks, 1 per reasoning-gym rollout.")
    multiples = [
        ("heldout_vs_rollouts.png", "rollouts", [("heldout", "-", "held-out tasks and envs")],
         "held-out score (x100)", ""),
        ("heldout_parts.png", "rollouts", [("heldout_a", "-", "(a) held-out tasks of training envs"),
                                           ("heldout_b", "--", "(b) held-out environments")],
         "held-out score (x100)", ""),
        ("heldout_vs_cost.png", "cum_cost", [("heldout", "-", "held-out tasks and envs")], "held-out score (x100)",
         cost_note),
        ("score_vs_rollouts.png", "rollouts", [("score", "-", "training pool")], "training-pool score (x100)", ""),
    ]
    for fname, x_key, keys, ylabel, note in multiples:
        ncols = min(4, len(names))
        nrows = math.ceil(len(names) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.1 * ncols, 2.5 * nrows + 0.5), sharex=True, sharey=True,
                                 squeeze=False)
        for ax, s in zip(axes.flat, names, strict=False):
            for key, ls, label in keys:
                if s != "uniform" and "uniform" in by:
                    ux, umu, _ = curve("uniform", key, x_key)
                    ax.plot(ux, umu, ls, lw=1.0, color="0.55", label=f"uniform: {label}")
                x, mu, sd = curve(s, key, x_key)
                ax.plot(x, mu, ls, lw=1.4, color=color[s], label=f"sampler: {label}")
                ax.fill_between(x, mu - sd, mu + sd, alpha=0.10, color=color[s], lw=0)
            ax.set_title(s, fontsize=9)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(4))  # narrow panels: few ticks, "20k" rather than "20000"
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if abs(v) >= 1000 else f"{v:g}"))
        for ax in list(axes.flat)[len(names):]:
            ax.set_visible(False)
        for ax in axes[-1]:
            ax.set_xlabel(x_label[x_key], fontsize=8)
        for ax in axes[:, 0]:
            ax.set_ylabel(ylabel, fontsize=8)
        legend_ax = next((ax for ax, s in zip(axes.flat, names, strict=False) if s != "uniform"), axes.flat[0])
        handles, labels = legend_ax.get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, frameon=False)
        files.append(finish(fig, fname, f"One panel per sampler (grey: uniform). Lines: mean over {n_seeds} "
                                        f"seeds; bands: ± 1 standard deviation over seeds.{note}",
                            top=1 - 0.3 / fig.get_figheight()))
    shared = [
        ("batch_variance.png",
         [("batch_variance", "mean within-task reward variance", "within-task variance per batch")],
         f"Lines: mean over {n_seeds} seeds (5-step moving average)."),
        ("coverage.png", [("envs_covered", "environments per batch", "environment coverage"),
                          ("tools_covered", "tools per batch", "tool coverage")],
         f"Lines: mean over {n_seeds} seeds (5-step moving average)."),
        ("signal_per_episode.png", [("signal_per_episode", "signal groups per episode",
                                     "signal groups per episode (cumulative)")],
         f"Lines: mean over {n_seeds} seeds. A group has {config.group_size} rollouts: "
         f"{1 / config.group_size:.3f} is the ceiling."),
    ]
    for fname, panels, caption in shared:
        fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels) + 2.2, 4.4), squeeze=False)
        for ax, (key, ylabel, title) in zip(axes[0], panels, strict=True):
            for s in names:
                x, mu, _ = curve(s, key)
                y = mu if key == "signal_per_episode" else smooth(mu)
                ax.plot(x, y, ":" if _is_ablation(s) else "-", lw=1.8 if s == "envsched" else 1.1, label=s,
                        color=color[s], alpha=0.7 if _is_ablation(s) else 1.0)
            ax.set_xlabel("rollouts spent")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.grid(alpha=0.3)
        files.append(finish(fig, fname, caption, legend_from=axes[0][-1]))
    if "uniform" in by and len(names) > 1:
        files.insert(0, _paired_plot(run_dir, by, names, color, plt))
    return files


def _paired_plot(run_dir: Path, by: Mapping[str, Mapping[int, list[dict[str, Any]]]], names: list[str],
                 color: Mapping[str, str], plt: Any) -> str:
    """The main figure: held-out score minus uniform's, paired by seed (same learner). Left, the curves of the
    samplers a user chooses between (thin lines, light 95 % bands; EnvSched's ablations in a panel of their
    own); right, the difference at the last step with its 95 % interval per sampler, sorted, so that which
    samplers beat uniform, and by how much, reads at a glance."""
    fname = "heldout_vs_uniform.png"
    uni = {seed: {r["step"]: r.get(TARGET_METRIC, math.nan) for r in recs} for seed, recs in by["uniform"].items()}
    curves: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    n_pairs = 0
    for s in names:
        seeds = sorted(set(by[s]) & set(uni))
        if s == "uniform" or not seeds:
            continue
        steps = sorted(set.intersection(*[{r["step"] for r in by[s][k]} for k in seeds]))
        diffs = np.array([[next(r for r in by[s][k] if r["step"] == t).get(TARGET_METRIC, math.nan) - uni[k][t]
                           for t in steps] for k in seeds], dtype=float)
        x = np.array([next(r for r in by[s][seeds[0]] if r["step"] == t)["rollouts"] for t in steps], dtype=float)
        mu = diffs.mean(axis=0)
        half = (stats.t.ppf(0.975, len(seeds) - 1) * diffs.std(axis=0, ddof=1) / math.sqrt(len(seeds))
                if len(seeds) > 1 else np.full_like(mu, np.nan))
        curves[s] = (x, mu, half)
        n_pairs = max(n_pairs, len(seeds))
    groups = [("samplers", [s for s in curves if not _is_ablation(s)]),
              ("EnvSched's ablations (and EnvSched)", [s for s in curves if _is_ablation(s)])]
    groups = [(t, g + (["envsched"] if t.startswith("EnvSched's") and "envsched" in curves else []))
              for t, g in groups if [x for x in g if x != "envsched"]]
    fig = plt.figure(figsize=(12.5, 3.6 * len(groups) + 0.6))
    grid = fig.add_gridspec(len(groups), 2, width_ratios=(1.6, 1.0))
    for row, (title, group) in enumerate(groups):
        ax = fig.add_subplot(grid[row, 0])
        for s in group:
            x, mu, half = curves[s]
            ax.plot(x, mu, "-", lw=2.0 if s == "envsched" else 1.2, label=s, color=color[s])
            ax.fill_between(x, mu - half, mu + half, alpha=0.10, color=color[s], lw=0)
            ax.annotate(s, (x[-1], mu[-1]), xytext=(3, 0), textcoords="offset points", fontsize=7,
                        color=color[s], va="center")
        ax.axhline(0.0, color="black", lw=0.9)
        ax.set_ylabel("held-out minus uniform (points)", fontsize=8)
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        ax.margins(x=0.18)
        ax.set_xlim(left=0)
        ax.set_xlabel("rollouts spent", fontsize=8)
    ax = fig.add_subplot(grid[:, 1])
    order = sorted(curves, key=lambda s: curves[s][1][-1])
    for i, s in enumerate(order):
        _, mu, half = curves[s]
        significant = bool(np.isfinite(half[-1]) and abs(mu[-1]) > half[-1])
        ax.errorbar(mu[-1], i, xerr=None if not np.isfinite(half[-1]) else half[-1], fmt="o", color=color[s],
                    ms=6 if significant else 4, mfc=color[s] if significant else "white", capsize=3, lw=1.3)
    ax.set_yticks(range(len(order)), order, fontsize=8)
    ax.axvline(0.0, color="black", lw=0.9)
    ax.set_xlabel("held-out minus uniform at the last step (points)", fontsize=8)
    ax.set_title("at the end of the budget (filled: 95% interval excludes 0)", fontsize=9, loc="left")
    ax.grid(alpha=0.3, axis="x")
    fig.suptitle("held-out score: paired difference to uniform (same seed, same learner)", fontsize=10)
    fig.text(0.01, 0.01, f"Mean paired difference over {n_pairs} seeds; bands and bars: 95% Student-t interval.",
             fontsize=8, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(run_dir / fname, dpi=110)
    plt.close(fig)
    return fname


def write_report(run_dir: Path, config: Any, *, plots: bool = True) -> dict[str, Any]:
    """Write ``metrics.jsonl``, ``metrics.parquet``, ``summary.json``, ``summary.md`` and the PNGs."""
    runs, cold = load_records(run_dir)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    written = ["summary.md", "summary.json", "metrics.jsonl"]
    if runs and has_module("pyarrow"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = sorted({c for r in runs for c in r})
        pq.write_table(pa.table({c: [r.get(c) for r in runs] for c in cols}), run_dir / "metrics.parquet")
        written.append("metrics.parquet")
    if cold:
        (run_dir / "coldstart.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cold))
    summary = summarise(runs, cold, config)
    summary["config"] = asdict(config)
    if plots and runs and has_module("matplotlib"):
        summary["plots"] = _plots(run_dir, runs, config)
        written += summary["plots"]
    summary["written"] = written
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    (run_dir / "summary.md").write_text(markdown_table(summary, config))
    return summary
