"""``envsched dashboard STORE``: a live web page over a run's history store (read-only), on 127.0.0.1."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from envsched.cli.common import float_range, pip_command, require_store_backend

#: the import names the ``dashboard`` extra provides
DASHBOARD_MODULES = ("starlette", "uvicorn", "plotly")


def require_dashboard_extra(what: str) -> None:
    """Fail in one line when the ``dashboard`` extra is missing (naming what is missing and the pip command)."""
    missing = [m for m in DASHBOARD_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(f"{what} needs the 'dashboard' extra ({', '.join(missing)} not installed): "
                                   f"{pip_command('dashboard')}")


def open_checks(store: str, run_file: Path | None, what: str) -> None:
    """The checks both `dashboard` and `report` make before opening anything."""
    require_dashboard_extra(what)
    require_store_backend(store, f"{what} of a PostgreSQL store")
    if run_file is not None:  # the run-file rules `envsched explain` applies too: a regular file only
        from envsched.method.run_file import open_run_file

        try:
            open_run_file(run_file).close()
        except (OSError, ValueError) as exc:
            hint = "" if "envsched run --explain" in str(exc) else \
                " (the run file is the one given to `envsched run --explain FILE`)"
            raise click.BadParameter(f"{exc}{hint}", param_hint="--run-file") from None


@click.command("dashboard")
@click.argument("store", metavar="STORE")
@click.option("--run-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The run's explanation file (`envsched run --explain FILE`): phases, predictions and reasons.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to serve on; only loopback addresses unless --allow-remote.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to serve on (0: any free port).")
@click.option("--allow-remote", is_flag=True,
              help="Allow a non-loopback --host (whoever reaches it sees the pool's task ids and instructions).")
@click.option("--prefix", default="envsched", show_default=True, help="Table prefix of the store.")
@click.option("--poll", "poll_s", default=0.25, show_default=True, type=float_range(0.1, 60.0),
              help="Seconds between reads of new events.")
def dashboard(store: str, run_file: Path | None, host: str, port: int, allow_remote: bool, prefix: str,
              poll_s: float) -> None:
    """Serve a live dashboard over STORE (a SQLite file or a postgresql:// URL written by `envsched run --store`
    or DurableSampler), read-only: it never writes to the store and never blocks its writer.

    The page refreshes by itself while a trainer writes the store: environment coverage over training steps,
    signal over time, predictions against outcomes (with --run-file), the latest batches with the reasons for
    each pick, and the asynchronous state. See docs/dashboard.md.
    """
    open_checks(store, run_file, "envsched dashboard")
    from envsched.dashboard.app import PortUnavailableError, is_loopback, serve
    from envsched.dashboard.reader import DashboardError

    if not is_loopback(host) and not allow_remote:
        raise click.BadParameter(f"{host} is not a loopback address: anyone who can reach it would see the run "
                                 "(task ids, instructions); pass --allow-remote to serve it there anyway",
                                 param_hint="--host")

    def ready(url: str) -> None:  # called once the store is open and the port is bound
        click.echo(f"envsched dashboard: {url} (read-only; Ctrl-C to stop)", err=True)

    try:
        serve(store, run_file=None if run_file is None else str(run_file), table_prefix=prefix, host=host,
              port=port, allow_remote=allow_remote, poll_s=poll_s, ready=ready)
    except (DashboardError, PortUnavailableError, ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
