"""``envsched report STORE --html FILE``: the dashboard's views as one self-contained HTML file."""

from __future__ import annotations

from pathlib import Path

import click

from envsched.cli.dashboard import open_checks


@click.command("report")
@click.argument("store", metavar="STORE")
@click.option("--html", "html_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The HTML file to write (self-contained: it opens offline).")
@click.option("--run-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The run's explanation file (`envsched run --explain FILE`): phases, predictions and reasons.")
@click.option("--prefix", default="envsched", show_default=True, help="Table prefix of the store.")
@click.option("--last-steps", default=5, show_default=True, type=click.IntRange(1, 1000),
              help="Batches shown in the picks table.")
def report(store: str, html_file: Path, run_file: Path | None, prefix: str, last_steps: int) -> None:
    """Write the dashboard's views of STORE (a SQLite file or a postgresql:// URL) to one HTML file, with
    plotly.js and the data inlined, to attach to an issue or a paper's appendix. Reads the store read-only."""
    open_checks(store, run_file, "envsched report")
    from envsched.dashboard.reader import DashboardError
    from envsched.dashboard.report import write_report

    try:
        path = write_report(store, html_file, run_file=run_file, table_prefix=prefix, last_steps=last_steps)
    except (DashboardError, ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"report written to {path} ({path.stat().st_size / 1e6:.1f} MB, self-contained)")
