"""``envsched pool ...``: inspect, build and analyse task pools."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from envsched.cli.common import load_pool, load_pool_or_default, shown


@click.group()
def pool() -> None:
    """Inspect, build and analyse task pools (JSONL/JSON files of task specs)."""


@pool.command("inspect")
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect_pool(file: Path | None, as_json: bool) -> None:
    """Validate a pool FILE and show its counts by environment and split, and the static fields tasks lack.

    Without FILE, inspects the bundled pool. A malformed file is reported with its line and field, and
    the command exits with status 1.
    """
    console = Console(stderr=as_json)
    task_pool = load_pool(file) if file is not None else load_pool_or_default(None, console)
    summary = task_pool.summary()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    console.print(f"[bold]{shown(summary['name'] or file)}[/bold]: {summary['tasks']} tasks in "
                  f"{summary['environments']} environments, reward range {summary['reward_range']}")
    console.print(f"fingerprint {summary['fingerprint'][:16]}...")
    envs = Table(title="tasks by environment")
    envs.add_column("environment")
    envs.add_column("tasks", justify="right")
    for env, count in sorted(summary["by_env"].items()):
        envs.add_row(shown(env), str(count))
    console.print(envs)
    splits = ", ".join(f"{shown(k)}: {v}" for k, v in sorted(summary["by_split"].items()))
    console.print(f"splits: {splits}")
    missing = Table(title="static fields missing (EnvSched reads them; a missing one leaves its view empty)")
    missing.add_column("field")
    missing.add_column("tasks without it", justify="right")
    missing.add_column("share", justify="right")
    for field, count in summary["missing"].items():
        missing.add_row(field, str(count), f"{count / max(summary['tasks'], 1):.1%}")
    console.print(missing)


from envsched.cli.pool_build import build  # noqa: E402  (registered here; defined in its own module)

pool.add_command(build)

from envsched.cli.pool_graph import graph  # noqa: E402  (registered here; defined in its own module)

pool.add_command(graph)
