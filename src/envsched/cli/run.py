"""``envsched run``: drive a sampler for N steps against a reward source, one output row per step as it happens.

Rows go to stdout (a fixed-width line per step, or one JSON object per line with ``--json``) and are flushed
as each step ends, so a pipe (``| head``, ``| tee log``) sees them at once. Progress never shares a line with a
row: on a terminal the rows scroll above rich's live progress bar; piped, progress is a plain stderr line every
few seconds (see :class:`_Display`). Phases go to stderr. EnvSched's graph is cached by pool fingerprint and
graph configuration (``envsched.method.graph.cache.cached_graph``, the cache ``envsched bench`` uses too).
``--explain FILE`` records why each task was picked (read it with ``envsched explain FILE``); ``--store PATH``
runs the sampler on a durable history store (read it with ``envsched store info|verify PATH``).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import click

from envsched.cli.common import (
    MAX_BATCH_SIZE,
    MAX_GROUP_SIZE,
    MAX_SEED,
    MAX_STEPS,
    check_output_paths,
    echo_wrapped,
    float_range,
    int_range,
    is_url,
    load_pool_or_default,
    note,
    require_extra,
    require_store_backend,
    visible,
)
from envsched.errors import redact_url

#: the class of the registry's EnvSched samplers (graph from the cache, explanation records)
_ENVSCHED_CLASS = "envsched.method.sampler:EnvSchedSampler"
#: The docs page that answers "which sampler should I use?" (shown by --list-samplers).
CHOOSING_PAGE = "docs/choosing.md (in the repository and the docs site)"


def _is_envsched(name: str) -> bool:
    from envsched.samplers.registry import resolve

    try:
        return resolve(name)[0].sampler_class == _ENVSCHED_CLASS
    except ValueError:
        return False


def __getattr__(name: str) -> Any:
    if name == "SAMPLER_NAMES":  # the registry's names, read when asked (no second list here)
        from envsched.samplers.registry import available_samplers

        return tuple(available_samplers())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _SamplerOption(click.Option):
    """``--sampler``, whose help lists the registry's samplers when it is shown (read from
    :mod:`envsched.samplers.registry` then, so that `envsched run`'s import stays light)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from envsched.samplers.registry import available_samplers

        self.help = "Sampler to drive: " + ", ".join(sorted(available_samplers())) + " (see `--list-samplers`)."
        return super().get_help_record(ctx)

_COLUMNS = (("step", 6), ("envs", 5), ("tools", 6), ("mean reward", 12), ("within-task var", 16),
            ("signal groups", 14), ("unscored", 9))


def _fmt(x: float, digits: int = 4) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else f"{x:.{digits}f}"


def _row(values: list[str]) -> str:
    return "".join(v.rjust(w) for v, (_, w) in zip(values, _COLUMNS, strict=True))


class _Display:
    """Where rows and progress go, so that they never share a line.

    - stdout a terminal: one rich Console on stdout; rows (or ``--json`` lines) are printed through the live
      progress bar's console, above the bar, which stays on the last line of the screen.
    - stdout piped, stderr a terminal: rows as plain lines on stdout, rich's progress bar on stderr.
    - stderr not a terminal: rows as plain lines, a plain progress line on stderr every few seconds.
    """

    def __init__(self, total: int, start: int, *, as_json: bool, interval_s: float = 5.0) -> None:
        self.total, self.start, self.interval = total, start, interval_s
        self.t0 = self.last = time.monotonic()
        self.progress: Any = None
        self.task: Any = None
        out_tty = sys.stdout.isatty()  # rows (JSON lines too) then go through the bar's console, above the bar
        if out_tty or sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            console = Console(stderr=not out_tty, highlight=False)
            self.progress = Progress(TextColumn("steps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                     TextColumn("left"), TimeRemainingColumn(), console=console,
                                     transient=True, redirect_stdout=False, redirect_stderr=False)
        self.rows_on_console = out_tty
        self.as_json = as_json

    def __enter__(self) -> _Display:
        if self.progress is not None:
            self.progress.start()
            self.task = self.progress.add_task("steps", total=max(self.total - self.start, 0))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def row(self, step: int, text: str | None) -> None:
        """Step ``step`` has ended: the bar moves to it and its row (``None``: no row this step) is printed.

        On a terminal showing both, the bar's new count and the row reach the screen in one write, under the
        live display's lock (so its refresh thread cannot draw in between): the bar never shows fewer steps
        than the rows above it, nor more. (rich redraws the bar as last refreshed when a line is printed
        above it, so updating the count alone would leave it behind the rows.)"""
        if self.progress is None:
            if text is not None:
                click.echo(text)
                sys.stdout.flush()
            self._plain_progress(step)
            return
        if not self.rows_on_console:  # rows on stdout (piped), the bar on the terminal's stderr
            if text is not None:
                click.echo(text)
                sys.stdout.flush()
            self.progress.update(self.task, completed=step - self.start, refresh=True)
            return
        lock = getattr(self.progress.live, "_lock", None) or contextlib.nullcontext()
        console = self.progress.console
        with lock, console:  # the console buffers what is printed inside and writes it once, on exit
            self.progress.update(self.task, completed=step - self.start)
            self.progress.refresh()
            if text is not None:
                # a JSON line stays one line (the terminal may fold it, rich does not cut it)
                console.print(text, markup=False, highlight=False, soft_wrap=self.as_json)

    def _plain_progress(self, step: int) -> None:
        """A plain progress line on stderr every few seconds and at the last step."""
        now = time.monotonic()
        if now - self.last < self.interval and step < self.total:
            return
        self.last = now
        rate = (step - self.start) / max(now - self.t0, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else math.nan
        click.echo(f"envsched: step {step}/{self.total} ({100 * step / self.total:.0f}%), {now - self.t0:.1f} s "
                   f"elapsed" + (f", about {eta:.0f} s left" if step < self.total and eta == eta else ""), err=True)


@click.command("run")
@click.option("--pool", "pool_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Task pool (JSONL/JSON). Default: the bundled pool, built on first use and cached.")
@click.option("--sampler", "sampler_name", cls=_SamplerOption, default="envsched", show_default=True,
              help="Sampler to drive (see `--list-samplers`).")
@click.option("--steps", default=50, show_default=True, type=int_range(1, MAX_STEPS), help="Batches to schedule.")
@click.option("--batch-size", default=64, show_default=True, type=int_range(1, MAX_BATCH_SIZE),
              help="Environment-task pairs (GRPO groups) per batch.")
@click.option("--group-size", default=8, show_default=True, type=int_range(1, MAX_GROUP_SIZE),
              help="Rollouts per pair.")
@click.option("--seed", default=0, show_default=True, type=int_range(0, MAX_SEED),
              help="Seed of the sampler and of the reward source.")
@click.option("--unscored-rate", default=0.0, show_default=True, type=float_range(0.0, 0.99),
              help="Share of simulated rollouts returned unscored (reward None).")
@click.option("--output", "run_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory: steps.jsonl, checkpoint.json, summary.json.")
@click.option("--resume", is_flag=True, help="Continue the run in --output from its checkpoint.")
@click.option("--explain", "explain_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write EnvSched's explanation records (why each task was picked) to this JSONL file; "
                   "read it with `envsched explain FILE`.")
@click.option("--store", "store_target", default=None, metavar="PATH|URL",
              help="Run the sampler on a durable history store (a SQLite file, or a postgresql:// URL with the "
                   "'postgres' extra); read it with `envsched store info|verify PATH`.")
@click.option("--log-every", default=1, show_default=True, type=int_range(1, MAX_STEPS),
              help="Print one row every this many steps.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object per step (JSON lines), then a summary object (\"kind\": \"summary\").")
@click.option("--list-samplers", is_flag=True,
              help="List the available samplers (and where to read which to choose) and exit.")
def run(pool_file: Path | None, sampler_name: str, steps: int, batch_size: int, group_size: int, seed: int,
        unscored_rate: float, run_dir: Path | None, resume: bool, explain_file: Path | None,
        store_target: str | None, log_every: int, as_json: bool, list_samplers: bool) -> None:
    """Run the scheduling loop: sample a batch, roll it out, update the sampler, repeat.

    Rewards come from a seeded stochastic simulation of a policy (StochasticRewardSource: latent skills
    per environment and tool, graded rewards from verifier checks, skills grow only from groups with
    signal). It exercises a sampler end to end; it is NOT a benchmark (use `envsched bench` for that).

    Each row is printed as its step ends: environments and tools covered, mean reward, mean within-task
    reward variance (the GRPO signal EnvSched targets) and the number of groups with signal. Steps count
    from 1, as in `envsched explain`.
    """
    from envsched.samplers.registry import available_samplers

    if list_samplers:
        for name, desc in sorted(available_samplers().items()):
            click.echo(f"{name}: {desc}")
        click.echo(f"\nWhich to choose, per situation and from which evidence: {CHOOSING_PAGE}")
        return
    if resume and run_dir is None:
        raise click.UsageError("--resume needs --output DIR (the run to continue)")
    if sampler_name not in available_samplers():
        raise click.BadParameter(f"unknown sampler {sampler_name!r}; choose one of: "
                                 f"{', '.join(sorted(available_samplers()))}", param_hint="--sampler")
    if explain_file is not None and not _is_envsched(sampler_name):
        raise click.BadParameter(f"explanation records come from EnvSched; --sampler {sampler_name} writes none "
                                 "(drop --explain or use --sampler envsched)", param_hint="--explain")
    if explain_file is not None and not resume and explain_file.exists() and explain_file.stat().st_size > 0:
        raise click.BadParameter(f"{explain_file} already holds explanation records; choose a new file, or "
                                 "continue that run with --output DIR --resume", param_hint="--explain")
    if run_dir is not None and not resume and any((run_dir / f).exists() for f in ("checkpoint.json", "steps.jsonl")):
        raise click.ClickException(f"{run_dir} already holds a run: continue it with --resume, or choose another "
                                   "--output directory")
    check_output_paths([("--output", run_dir, True), ("--explain", explain_file, False),
                        ("--store", Path(store_target) if store_target and not is_url(store_target) else None,
                         False)])
    if store_target is not None:
        require_store_backend(store_target, "--store with a PostgreSQL URL")
    pool = load_pool_or_default(pool_file)
    if batch_size > len(pool):
        raise click.BadParameter(f"--batch-size {batch_size} exceeds the pool's {len(pool)} tasks",
                                 param_hint="--batch-size")
    sampler = _make_sampler(sampler_name, pool, seed=seed, group_size=group_size)
    if store_target is not None:
        sampler = _on_store(sampler, store_target, group_size=group_size, resume=resume)

    from envsched.simulation.loop import StepStats, run_schedule
    from envsched.simulation.rewards import StochasticRewardSource

    source = StochasticRewardSource(pool, seed=seed, unscored_rate=unscored_rate)
    config = {"pool": pool.fingerprint(), "sampler": sampler_name, "batch_size": batch_size,
              "group_size": group_size, "seed": seed, "unscored_rate": unscored_rate}
    rows: list[StepStats] = []
    start = _checkpoint_step(run_dir) if resume and run_dir is not None else 0
    if start >= steps:
        note(f"the run in {run_dir} has already done {start} of {steps} steps; nothing to do "
             "(ask for more with a larger --steps)")
    display = _Display(steps, start, as_json=as_json)
    title = f"{sampler_name} on {visible(pool.name or 'pool')} ({len(pool)} tasks, {len(pool.envs)} envs)"
    note(f"scheduling {steps - start} batches of {batch_size} pairs x {group_size} rollouts with {sampler_name}")
    if not as_json and start < steps:
        click.echo(title)
        click.echo(_row([c for c, _ in _COLUMNS]))
        sys.stdout.flush()

    def on_step(stats: StepStats) -> None:
        rows.append(stats)
        if explain_file is not None:
            _write_explanations(sampler, explain_file)
        text = None
        if stats.step % log_every == 0 or stats.step == steps:
            if as_json:
                text = json.dumps({"kind": "step", **stats.as_dict()})
            else:
                text = _row([str(stats.step), str(stats.envs_covered), str(stats.tools_covered),
                             _fmt(stats.mean_reward, 3), _fmt(stats.mean_within_task_variance),
                             f"{stats.signal_groups}/{stats.groups}", str(stats.unscored_episodes)])
        display.row(stats.step, text)

    started = time.monotonic()
    try:
        with display:
            run_schedule(sampler, source, steps=steps, batch_size=batch_size, group_size=group_size,
                         run_dir=run_dir, resume=resume, config=config, on_step=on_step)
    except (FileExistsError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    except BrokenPipeError:  # `envsched run | head`: the reader left; stop quietly (the checkpoint is kept)
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second BrokenPipeError when Python flushes stdout at exit
        sys.exit(0)
    if rows:
        note(f"{len(rows)} steps in {time.monotonic() - started:.1f} s")
    metrics = sampler.metrics()
    summary: dict[str, Any] = {
        "config": {**config, "steps_planned": steps},
        "steps_run": len(rows),
        "mean_envs_covered": float(sum(s.envs_covered for s in rows) / len(rows)) if rows else None,
        "mean_tools_covered": float(sum(s.tools_covered for s in rows) / len(rows)) if rows else None,
        "mean_within_task_variance": (float(sum(s.mean_within_task_variance for s in rows) / len(rows))
                                      if rows else None),
        "sampler_metrics": metrics,
        "explain_file": str(explain_file) if explain_file is not None else None,
        "store": None if store_target is None else redact_url(store_target),
    }
    if run_dir is not None:
        (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
    if hasattr(sampler, "close"):
        sampler.close()
    if as_json:
        click.echo(json.dumps({"kind": "summary", **summary}))
        return
    lines = [f"signal groups per episode: {metrics['signal_groups_per_episode']:.4f}, per unit cost: "
             f"{metrics['signal_groups_per_cost']:.6f}",
             f"zero-signal fraction: {metrics['zero_signal_fraction']:.3f}; episodes: {int(metrics['episodes'])}, "
             f"unscored: {int(metrics['unscored_episodes'])}"]
    if rows:
        lines.append(f"mean per batch: {summary['mean_envs_covered']:.2f} environments, "
                     f"{summary['mean_tools_covered']:.2f} tools")
        lines.append(f"mean within-task variance: {summary['mean_within_task_variance']:.5f}")
    if run_dir is not None:
        lines.append(f"run written to {run_dir}; resume with: --output {run_dir} --resume")
    if explain_file is not None:
        lines.append(f"explanations written to {explain_file}; read them with: envsched explain {explain_file}")
    if store_target is not None:
        shown_target = redact_url(store_target)  # a URL's password is not printed
        lines.append(f"history store {shown_target}; check it with: envsched store verify {shown_target}")
    echo_wrapped(lines)


def _write_explanations(sampler: Any, path: Path) -> None:
    """Append the explanation records of the batch just drawn to ``path`` (what EnvSchedSampler(run_file=...)
    writes). The CLI writes them itself, so that where they go is not part of the sampler's configuration: a
    history store of the run then rebuilds without rewriting them (`envsched store verify`)."""
    from envsched.method.explain import write_records
    from envsched.samplers.wrappers import unwrap

    inner = unwrap(sampler)  # a DurableSampler wraps the EnvSchedSampler
    write_records(path, inner.explanations(),
                  lambda: {"sampler": type(inner).__name__, "seed": inner.seed, "num_tasks": len(inner.tasks),
                           "num_envs": len(inner.envs), "config": inner.config.to_dict()})


def _make_sampler(name: str, pool: Any, *, seed: int, group_size: int) -> Any:
    """Build the sampler; EnvSched gets the graph from the cache ``envsched bench`` uses."""
    from envsched.samplers.registry import make_sampler

    options: dict[str, Any] = {}
    if _is_envsched(name):
        from envsched.method.config import GraphConfig

        if len(pool) > GraphConfig().exact_max_nodes:
            require_extra("graph", f"EnvSched on a pool of {len(pool):,} tasks (approximate neighbours above "
                                   f"{GraphConfig().exact_max_nodes:,})")
        from envsched.method.graph.cache import cache_dir, cached_graph

        note(f"loading EnvSched's graph over {len(pool)} tasks (built on first use for this pool and "
             f"configuration, then cached in {cache_dir()})...")
        options["graph"] = cached_graph(pool)
    try:
        return make_sampler(name, pool, seed=seed, group_size=group_size, **options)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sampler") from None


def _on_store(sampler: Any, target: str, *, group_size: int, resume: bool) -> Any:
    """Wrap ``sampler`` in a DurableSampler on ``target``; an existing history needs --resume."""
    from envsched.store import DurableSampler, HistoryStore, StoreError

    try:
        store = HistoryStore(target)
        if store.header() is not None and not resume:
            raise click.ClickException(f"store {store.where} already holds a run's history; continue that run with "
                                       "--output DIR --resume, or give a new --store")
        return DurableSampler(sampler, store, group_size=group_size)
    except (StoreError, ValueError, ImportError) as exc:
        raise click.ClickException(str(exc)) from None


def _checkpoint_step(run_dir: Path) -> int:
    ckpt = Path(run_dir) / "checkpoint.json"
    try:
        return int(json.loads(ckpt.read_text()).get("step", 0))
    except (OSError, ValueError, AttributeError):
        return 0
