"""``envsched store ...``: look into a run's history store and check that it rebuilds."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from envsched.store import DurableSampler, HistoryStore, StoreError


@click.group()
def store() -> None:
    """Inspect and verify history stores (SQLite files or postgresql:// URLs) written by DurableSampler."""


def _open(target: str, prefix: str) -> HistoryStore:
    try:
        return HistoryStore(target, table_prefix=prefix)
    except (StoreError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@store.command("info")
@click.argument("target")
@click.option("--prefix", default="envsched", show_default=True, help="Table prefix of the store.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def info(target: str, prefix: str, as_json: bool) -> None:
    """Show what TARGET holds: sampler class and configuration, pool fingerprint, events and snapshots.

    Reading checks the whole event log (its hash chain); a damaged store exits with status 1.
    """
    st = _open(target, prefix)
    try:
        header = st.header()
        if header is None:
            raise click.ClickException(f"store {st.where} holds no history yet")
        events = st.events()
        snaps = st.snapshot_seqs()
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    kinds = Counter(e.kind for e in events)
    summary: dict[str, Any] = {
        "store": st.where, "sampler_class": header["sampler_class"], "sampler_params": header["sampler_params"],
        "pool_fingerprint": header["pool_fingerprint"], "num_tasks": header["num_tasks"],
        "group_size": header.get("group_size"), "events": len(events), "by_kind": dict(kinds),
        "snapshots": snaps,
        "updates_with_unscored_rollouts": sum(1 for e in events if e.kind == "update"
                                              and any(r is None for r in e.payload["rewards"])),
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    console = Console()
    table = Table(title=f"history store {st.where}", show_header=False)
    for key in ("sampler_class", "num_tasks", "group_size", "events", "by_kind", "snapshots",
                "updates_with_unscored_rollouts"):
        table.add_row(key, str(summary[key]))
    table.add_row("pool_fingerprint", summary["pool_fingerprint"][:16] + "...")
    table.add_row("sampler_params", json.dumps(summary["sampler_params"])[:200])
    console.print(table)


@store.command("verify")
@click.argument("target")
@click.option("--prefix", default="envsched", show_default=True, help="Table prefix of the store.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def verify(target: str, prefix: str, as_json: bool) -> None:
    """Rebuild the sampler of TARGET twice -- from the latest snapshot and by replaying every event from the
    initial state, checking every logged draw -- and compare the two states. Exits with status 1 on any
    difference or damage. Needs a sampler whose configuration the store could record as JSON."""
    st = _open(target, prefix)
    result: dict[str, Any] = {"store": st.where}
    try:
        fast = DurableSampler.resume(st, use_snapshots=True)
        full = DurableSampler.resume(st, use_snapshots=False)
    except StoreError as exc:
        result.update(ok=False, error=str(exc))
    else:
        a, b = fast.sampler.state_dict(), full.sampler.state_dict()
        same = json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        result.update(ok=same, events=full.seq, replayed_from_snapshot=fast.replayed_events,
                      metrics=full.sampler.metrics())
        if not same:
            result["error"] = "the snapshot rebuild and the full replay disagree"
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif result["ok"]:
        Console().print(f"[green]ok[/green]: {result['events']} events replayed; the snapshot rebuild "
                        f"(replaying {result['replayed_from_snapshot']}) gives the same state")
    else:
        click.echo(f"failed: {result['error']}", err=True)
    if not result["ok"]:
        sys.exit(1)
