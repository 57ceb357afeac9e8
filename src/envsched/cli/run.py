"""``envsched run``: drive a sampler for N steps against a reward source and print per-step statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envsched.bench.loop import StepStats, run_schedule
from envsched.bench.rewards import StochasticRewardSource
from envsched.cli.common import load_pool_or_default
from envsched.samplers.registry import available_samplers, make_sampler


def _fmt(x: float, digits: int = 4) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else f"{x:.{digits}f}"


@click.command("run")
@click.option("--pool", "pool_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Task pool (JSONL/JSON). Default: the bundled pool, built on first use and cached.")
@click.option("--sampler", "sampler_name", default="envsched", show_default=True,
              help="Sampler to drive: " + ", ".join(sorted(available_samplers())) + " (see `--list-samplers`).")
@click.option("--steps", default=50, show_default=True, type=click.IntRange(min=1), help="Batches to schedule.")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(min=1),
              help="Environment-task pairs (GRPO groups) per batch.")
@click.option("--group-size", default=8, show_default=True, type=click.IntRange(min=1), help="Rollouts per pair.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Seed of the sampler and of the reward source.")
@click.option("--unscored-rate", default=0.0, show_default=True, type=click.FloatRange(0.0, 0.99),
              help="Share of simulated rollouts returned unscored (reward None).")
@click.option("--output", "run_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory: steps.jsonl, checkpoint.json, summary.json.")
@click.option("--resume", is_flag=True, help="Continue the run in --output from its checkpoint.")
@click.option("--log-every", default=1, show_default=True, type=click.IntRange(min=1),
              help="Print one table row every this many steps.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of tables.")
@click.option("--list-samplers", is_flag=True, help="List the available samplers and exit.")
def run(pool_file: Path | None, sampler_name: str, steps: int, batch_size: int, group_size: int, seed: int,
        unscored_rate: float, run_dir: Path | None, resume: bool, log_every: int, as_json: bool,
        list_samplers: bool) -> None:
    """Run the scheduling loop: sample a batch, roll it out, update the sampler, repeat.

    Rewards come from a seeded stochastic simulation of a policy (StochasticRewardSource: latent skills
    per environment and tool, graded rewards from verifier checks, skills grow only from groups with
    signal). It exercises a sampler end to end; it is NOT a benchmark (use `envsched bench` for that).

    Each row shows one batch: environments and tools covered, mean reward, mean within-task reward
    variance (the GRPO signal EnvSched targets) and the number of groups with signal.
    """
    console = Console(stderr=as_json)
    if list_samplers:
        for name, desc in sorted(available_samplers().items()):
            console.print(f"[bold]{name}[/bold]: {desc}")
        return
    if resume and run_dir is None:
        raise click.UsageError("--resume needs --output DIR (the run to continue)")
    if sampler_name not in available_samplers():
        raise click.BadParameter(f"unknown sampler {sampler_name!r}; choose one of: "
                                 f"{', '.join(sorted(available_samplers()))}", param_hint="--sampler")
    pool = load_pool_or_default(pool_file, console)
    if batch_size > len(pool):
        raise click.BadParameter(f"--batch-size {batch_size} exceeds the pool's {len(pool)} tasks",
                                 param_hint="--batch-size")
    try:
        with console.status(f"building the {sampler_name} sampler over {len(pool)} tasks..."):
            sampler = make_sampler(sampler_name, pool, seed=seed, group_size=group_size)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sampler") from None
    source = StochasticRewardSource(pool, seed=seed, unscored_rate=unscored_rate)
    config = {"pool": pool.fingerprint(), "sampler": sampler_name, "batch_size": batch_size,
              "group_size": group_size, "seed": seed, "unscored_rate": unscored_rate, "steps_planned": steps}

    table = Table(title=f"{sampler_name} on {pool.name or 'pool'} ({len(pool)} tasks, {len(pool.envs)} envs)")
    for col in ("step", "envs", "tools", "mean reward", "within-task var", "signal groups", "unscored"):
        table.add_column(col, justify="right")
    rows: list[StepStats] = []

    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        bar = progress.add_task("scheduling", total=steps)

        def on_step(stats: StepStats) -> None:
            rows.append(stats)
            progress.update(bar, completed=stats.step)

        try:
            run_schedule(sampler, source, steps=steps, batch_size=batch_size, group_size=group_size,
                         run_dir=run_dir, resume=resume,
                         config={k: v for k, v in config.items() if k != "steps_planned"}, on_step=on_step)
        except (FileExistsError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None

    for s in rows:
        if s.step % log_every == 0 or s.step == steps:
            table.add_row(str(s.step), str(s.envs_covered), str(s.tools_covered), _fmt(s.mean_reward, 3),
                          _fmt(s.mean_within_task_variance), f"{s.signal_groups}/{s.groups}", str(s.unscored_episodes))
    metrics = sampler.metrics()
    summary = {
        "config": config,
        "steps_run": len(rows),
        "mean_envs_covered": float(sum(s.envs_covered for s in rows) / len(rows)) if rows else None,
        "mean_tools_covered": float(sum(s.tools_covered for s in rows) / len(rows)) if rows else None,
        "mean_within_task_variance": (float(sum(s.mean_within_task_variance for s in rows) / len(rows))
                                      if rows else None),
        "sampler_metrics": metrics,
    }
    if run_dir is not None:
        (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    console.print(table)
    console.print(f"signal groups per episode: [bold]{metrics['signal_groups_per_episode']:.4f}[/bold]   "
                  f"per unit cost: {metrics['signal_groups_per_cost']:.6f}   "
                  f"zero-signal fraction: {metrics['zero_signal_fraction']:.3f}   "
                  f"episodes: {int(metrics['episodes'])}   unscored: {int(metrics['unscored_episodes'])}")
    if rows:
        console.print(f"mean per batch: {summary['mean_envs_covered']:.2f} environments, "
                      f"{summary['mean_tools_covered']:.2f} tools, within-task variance "
                      f"{summary['mean_within_task_variance']:.5f}")
    if run_dir is not None:
        console.print(f"run written to {run_dir} (resume with --output {run_dir} --resume)")
