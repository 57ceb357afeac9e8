"""``envsched store ...``: look into a run's history store and check that it rebuilds."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from envsched.cli.common import is_url, require_store_backend
from envsched.errors import redact_url


@click.group()
def store() -> None:
    """Inspect and verify history stores (SQLite files or postgresql:// URLs) written by DurableSampler."""


def _open(target: str, prefix: str) -> Any:
    """Open an existing store; a SQLite path that does not exist is "not found" (and no file is created)."""
    require_store_backend(target, f"store {redact_url(target)}")
    if not is_url(target):
        path = Path(target)
        if not path.exists():
            raise click.ClickException(f"store not found: {target} (no such file; a SQLite store is the file given "
                                       "to `envsched run --store PATH` or DurableSampler(sampler, PATH))")
        if path.is_dir():
            raise click.ClickException(f"{target} is a directory; a SQLite store is a file")
    from envsched.store import HistoryStore, StoreError

    try:
        return HistoryStore(target, table_prefix=prefix, read_only=True)  # inspection never writes
    except (StoreError, ValueError, ImportError) as exc:
        raise click.ClickException(str(exc)) from None


@store.command("info")
@click.argument("target")
@click.option("--prefix", default="envsched", show_default=True, help="Table prefix of the store.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def info(target: str, prefix: str, as_json: bool) -> None:
    """Show what TARGET holds: format, tables, sampler class and configuration, pool fingerprint, events and
    snapshots, and the format's in-place upgrades the store still lacks (its next writer makes them).

    Reading checks the whole event log (its hash chain); a damaged store exits with status 1.
    """
    from envsched.store import StoreError
    from envsched.store.schema import Payload

    st = _open(target, prefix)
    try:
        header = st.header()
        if header is None:
            raise click.ClickException(f"store {st.where} holds no history yet")
        events = st.events()
        snaps = st.snapshot_seqs()
        upgrades = st.pending_upgrades()
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    kinds = Counter(e.kind for e in events)
    summary: dict[str, Any] = {
        "store": st.where, "format": header["format"], "tables": list(st.tables.names()),
        "sampler_class": header["sampler_class"], "sampler_params": header["sampler_params"],
        "pool_fingerprint": header["pool_fingerprint"], "num_tasks": header["num_tasks"],
        "group_size": header.get("group_size"), "events": len(events), "by_kind": dict(kinds),
        "snapshots": snaps,
        "updates_with_unscored_rollouts": sum(1 for e in events if e.kind == "update"
                                              and any(r is None for r in Payload(e.payload).rewards)),
        "upgrades_pending": upgrades,
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    console = Console()
    # every value whole (long ones fold onto further lines; --json gives the same values unchanged)
    table = Table(title=f"history store {st.where}", show_header=False)
    table.add_column(overflow="fold")
    table.add_column(overflow="fold")
    for key in ("format", "tables", "sampler_class", "num_tasks", "group_size", "events", "by_kind", "snapshots",
                "updates_with_unscored_rollouts", "upgrades_pending", "pool_fingerprint"):
        table.add_row(key, escape(str(summary[key])))
    console.print(table)
    params = summary["sampler_params"]
    console.print("sampler_params:")  # one line per parameter, below the table: a long one wraps at spaces
    for key, value in _flat(params) if isinstance(params, dict) else [("", params)]:
        console.print(Text(f"  {key}: {json.dumps(value)}" if key else f"  {json.dumps(value)}"))


def _flat(params: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{"config": {"seed": 0}}`` -> ``[("config.seed", 0)]``: one line per parameter in ``store info``."""
    out: list[tuple[str, Any]] = []
    for key, value in params.items():
        if isinstance(value, dict) and value:
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


@store.command("verify")
@click.argument("target")
@click.option("--prefix", default="envsched", show_default=True, help="Table prefix of the store.")
@click.option("--graph", "graph_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="An EnvSchedSampler's graph file (the store's recorded path is never opened).")
@click.option("--workers", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Processes and threads for rebuilding an EnvSchedSampler's graph (the store's counts are "
                   "never used).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def verify(target: str, prefix: str, graph_path: str | None, workers: int, as_json: bool) -> None:
    """Rebuild the sampler of TARGET twice -- from the latest snapshot and by replaying every event from the
    initial state, checking every logged draw -- and compare the two states. Exits with status 1 on any
    difference or damage.

    The store is opened read-only and is data only: nothing in it chooses a file to read or write, an
    address to call, a number of processes or a class outside envsched's samplers. What a sampler needs that
    a store cannot safely carry is given here: an EnvSchedSampler's graph with --graph (else it is rebuilt
    from the recorded GraphConfig; an LLM-abstraction graph needs --graph), its explanation file is never
    written. Each recorded field left unused is printed on one line."""
    from envsched.store import DurableSampler, StoreError

    st = _open(target, prefix)
    result: dict[str, Any] = {"store": st.where, "notes": []}
    try:
        fast = DurableSampler.resume(st, use_snapshots=True, graph_path=graph_path, workers=workers)
        full = DurableSampler.resume(st, use_snapshots=False, graph_path=graph_path, workers=workers)
    except (StoreError, ValueError, OSError) as exc:
        result.update(ok=False, error=str(exc))
    else:
        a, b = fast.sampler.state_dict(), full.sampler.state_dict()
        same = json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        result.update(ok=same, events=full.seq, replayed_from_snapshot=fast.replayed_events,
                      metrics=full.sampler.metrics(), notes=list(dict.fromkeys(fast.notes + full.notes)))
        if not same:
            result["error"] = "the snapshot rebuild and the full replay disagree"
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        for note in result["notes"]:
            click.echo(f"note: {note}", err=True)
        if result["ok"]:
            Console().print(f"[green]ok[/green]: {result['events']} events replayed; the snapshot rebuild "
                            f"(replaying {result['replayed_from_snapshot']}) gives the same state")
        else:
            click.echo(f"failed: {result['error']}", err=True)
    if not result["ok"]:
        sys.exit(1)

