"""``envsched bench``: the rollout-efficiency benchmark (samplers x seeds at a matched rollout budget)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

QUICK = {"seeds": 2, "steps": 30, "coldstart_runs": 10, "coldstart_steps": 7,
         "samplers": ["uniform", "uniform-ds", "curriculum", "mopps", "greso", "plr", "envsched"]}


def _parse_kv(items: tuple[str, ...], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{what} options are KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


@click.command("bench")
@click.option("--samplers", default=None,
              help="Comma-separated samplers (default: all 11; see --list-samplers).")
@click.option("--seeds", default=None, type=click.IntRange(min=1), help="Number of seeds (0..N-1). Default 5.")
@click.option("--steps", default=None, type=click.IntRange(min=1), help="Budget steps per run. Default 200.")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(min=1),
              help="Groups (environment-task pairs) per step.")
@click.option("--group-size", default=8, show_default=True, type=click.IntRange(min=2), help="Rollouts per group.")
@click.option("--pool", "pool_arg", default="default", show_default=True,
              help="'default' (the 2,550-task benchmark pool), 'reasoning-gym' (generated fallback) or a pool file.")
@click.option("--learner", "learner_opts", multiple=True, metavar="KEY=VALUE",
              help="Learner model option, e.g. --learner sharing=0 --learner reward=binary (repeatable).")
@click.option("--sampler-option", "sampler_opts", multiple=True, metavar="SAMPLER.KEY=VALUE",
              help="Option of one sampler, e.g. --sampler-option mopps.forgetting=1.0 (repeatable).")
@click.option("--coldstart-runs", default=None, type=click.IntRange(min=0),
              help="Cold-start runs for the Table 4 figures (default 100; 0 to skip).")
@click.option("--coldstart-steps", default=None, type=click.IntRange(min=1), help="Steps per cold-start run (10).")
@click.option("--coldstart-samplers", default="envsched,uniform", show_default=True,
              help="Samplers given cold-start runs.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory (default bench-runs/<timestamp>); an existing one with the same settings is resumed.")
@click.option("--workers", default=None, type=click.IntRange(min=1),
              help="Worker processes (default: CPU count).")
@click.option("--ray", "use_ray", is_flag=True, help="Run the (sampler, seed) jobs as Ray tasks (local Ray).")
@click.option("--ray-address", default=None, help="Ray cluster address (implies --ray).")
@click.option("--quick", is_flag=True,
              help="Small setting: 7 samplers x 2 seeds x 30 steps, 10 cold starts (under 2 minutes on 2 cores).")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--list-samplers", is_flag=True, help="List the benchmark samplers and exit.")
def bench(samplers: str | None, seeds: int | None, steps: int | None, batch_size: int, group_size: int,
          pool_arg: str, learner_opts: tuple[str, ...], sampler_opts: tuple[str, ...], coldstart_runs: int | None,
          coldstart_steps: int | None, coldstart_samplers: str, out_dir: Path | None, workers: int | None,
          use_ray: bool, ray_address: str | None, quick: bool, no_plots: bool, as_json: bool,
          list_samplers: bool) -> None:
    """Run samplers against the learner model at a matched rollout budget and report what each one gets
    out of it: within-task reward variance, environment and tool coverage, signal groups per episode and
    per unit cost, exploitation hit rate (cold starts), learner score after 40/120/200 steps and rollouts
    needed to reach uniform's best 120-step score. Writes metrics (JSONL, Parquet), summary.md/json and
    PNG plots to the run directory; rerunning into the same directory resumes (finished runs are kept).
    """
    from envsched.bench.pools import load_bench_pool
    from envsched.bench.runner import DEFAULT_SAMPLERS, BenchConfig, available_samplers, run_benchmark

    console = Console(stderr=as_json)
    if list_samplers:
        for name, desc in available_samplers().items():
            console.print(f"[bold]{name}[/bold]: {desc}")
        return
    names = [s.strip() for s in samplers.split(",") if s.strip()] if samplers else \
        (list(QUICK["samplers"]) if quick else list(DEFAULT_SAMPLERS))
    avail = available_samplers()
    missing = [s for s in names if s not in avail]
    if missing and not samplers:
        console.print(f"[yellow]skipping samplers not available here: {', '.join(missing)}[/yellow]")
        names = [s for s in names if s in avail]
    elif missing:
        raise click.BadParameter(f"unknown or unavailable sampler(s) {missing}; available: {', '.join(avail)}",
                                 param_hint="--samplers")
    per_sampler: dict[str, dict[str, Any]] = {}
    for key, value in _parse_kv(sampler_opts, "--sampler-option").items():
        sname, dot, opt = key.partition(".")
        if not dot:
            raise click.BadParameter(f"--sampler-option keys are SAMPLER.KEY, got {key!r}")
        per_sampler.setdefault(sname, {})[opt] = value
    cold_names = [s.strip() for s in coldstart_samplers.split(",") if s.strip() and s.strip() in avail]
    cfg = BenchConfig(
        samplers=names,
        seeds=list(range(seeds if seeds is not None else (QUICK["seeds"] if quick else 5))),
        steps=steps if steps is not None else (QUICK["steps"] if quick else 200),
        batch_size=batch_size, group_size=group_size,
        learner=_parse_kv(learner_opts, "--learner"), sampler_options=per_sampler,
        coldstart_runs=coldstart_runs if coldstart_runs is not None else (QUICK["coldstart_runs"] if quick else 100),
        coldstart_steps=coldstart_steps if coldstart_steps is not None else (QUICK["coldstart_steps"] if quick else 10),
        coldstart_samplers=cold_names, pool=pool_arg,
    )
    cfg.score_steps = sorted({min(t, cfg.steps) for t in (40, 120, 200)})
    cfg.target_step = min(120, cfg.steps)
    try:
        cfg.validate()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    with console.status("loading the pool..."):
        try:
            pool, source = load_bench_pool(pool_arg)
        except (FileNotFoundError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    if out_dir is None:
        import time

        out_dir = Path("bench-runs") / time.strftime("%Y%m%d-%H%M%S")
    nworkers = workers or os.cpu_count() or 1
    console.print(f"pool: {source} ({len(pool)} tasks, {len(pool.envs)} environments); run dir: {out_dir}")
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=as_json) as prog:
        bar = prog.add_task("sampler steps", total=None)

        def on_progress(done: int, total: int) -> None:
            prog.update(bar, completed=done, total=total)

        try:
            summary = run_benchmark(cfg, out_dir, pool=pool, pool_source=source, workers=nworkers,
                                    ray_address=ray_address, use_ray=use_ray, progress=on_progress,
                                    plots=not no_plots)
        except FileExistsError as exc:
            raise click.ClickException(str(exc)) from None
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=float))
        return
    _print_summary(console, summary, cfg)
    console.print(f"\nwritten: {out_dir}/summary.md, summary.json, metrics.jsonl, metrics.parquet"
                  + ("" if no_plots else ", *.png"))


def _print_summary(console: Console, summary: dict[str, Any], cfg: Any) -> None:
    def f(d: dict[str, Any], digits: int) -> str:
        if not d or not d.get("n"):
            return "-"
        return f"{d['mean']:.{digits}f}±{d['std']:.{digits}f}"

    table = Table(title=f"rollout efficiency ({len(cfg.seeds)} seeds x {cfg.steps} steps x {cfg.batch_size} x "
                        f"{cfg.group_size} rollouts)")
    cols = [("batch_variance", "var/batch", 4), ("envs_covered", "envs", 1), ("tools_covered", "tools", 0),
            ("signal_per_episode", "signal/ep", 4)]
    cols += [(f"score@{t}", f"score@{t}", 1) for t in cfg.score_steps]
    cols += [("rollouts_to_target", "rollouts to target", 0)]
    table.add_column("sampler")
    for _, title, _ in cols:
        table.add_column(title, justify="right")
    for name, d in summary["samplers"].items():
        table.add_row(name, *[f(d[k], dg) for k, _, dg in cols])
    console.print(table)
    console.print(f"target = uniform's best score within {cfg.target_step} steps: {summary['target_score']:.2f}")
    for s, t in summary["coldstart"].items():
        rows = t["table"]
        if rows:
            last = rows[min(6, len(rows) - 1)]
            console.print(f"cold start {s} ({t['runs']} runs): hit rate step 1 {100 * rows[0]['hit_rate']:.1f}% -> "
                          f"step {last['step']} {100 * last['hit_rate']:.1f}% (low {100 * last['hit_rate_low']:.1f}%, "
                          f"high {100 * last['hit_rate_high']:.1f}%)")
    for k, v in summary.get("goals", {}).items():
        console.print(f"goal {k}: {v}")
