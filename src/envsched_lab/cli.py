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

from envsched.cli.common import (
    MAX_BATCH_SIZE,
    MAX_BENCH_SEEDS,
    MAX_BENCH_STEPS,
    MAX_COLDSTART_RUNS,
    MAX_GROUP_SIZE,
    MAX_TRIALS,
    MAX_WORKERS,
    int_range,
    require_extra,
)

QUICK = {"seeds": 3, "steps": 30, "coldstart_runs": 10, "coldstart_steps": 7,
         "samplers": ["uniform", "uniform-ds", "curriculum", "mopps", "greso", "plr", "dps", "sec", "envsched",
                      "envsched-paper"]}
#: ``--learner neural`` settings (docs/benchmark.md, "The neural learner": sized for 2 CPU cores).
NEURAL = {"seeds": 5, "steps": 200, "batch_size": 32, "coldstart_runs": 0}
NEURAL_QUICK = {"seeds": 2, "steps": 40, "samplers": ["uniform", "mopps", "plr", "envsched"]}
#: ``--learner neural --pool v2`` (docs/benchmark.md, "The v2 pool"): the paper's batch of 64 and horizons 40/120.
V2 = {"seeds": 10, "steps": 120, "batch_size": 64, "coldstart_runs": 0,
      "samplers": ["uniform", "oracle-variance", "oracle-coverage"]}
V2_QUICK = {"seeds": 2, "steps": 40, "samplers": ["uniform", "oracle-variance", "oracle-coverage"]}


def _split_learner(items: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """``--learner`` values: a bare name picks the learner (``model``, ``neural``); KEY=VALUE items are its options."""
    from envsched_lab.learners import LEARNERS

    kinds = [x for x in items if "=" not in x]
    if len(set(kinds)) > 1:
        raise click.BadParameter(f"one learner at a time, got {sorted(set(kinds))}", param_hint="--learner")
    if kinds and kinds[0] not in LEARNERS:
        raise click.BadParameter(f"unknown learner {kinds[0]!r}; choose from {', '.join(LEARNERS)} (options are "
                                 f"KEY=VALUE)", param_hint="--learner")
    return (kinds[0] if kinds else "model"), tuple(x for x in items if "=" in x)


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


class _SamplersOption(click.Option):
    """``--samplers``, whose help counts the benchmark samplers when it is shown (the count comes from the
    registry of benchmark samplers, so that a new sampler changes it; `bench`'s import stays light)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from envsched_lab.runner import DEFAULT_SAMPLERS, available_samplers

        avail = available_samplers()
        self.help = (f"Comma-separated samplers (default: all {sum(s in avail for s in DEFAULT_SAMPLERS)}; "
                     f"--quick runs {sum(s in avail for s in QUICK['samplers'])} of them, --learner neural --quick "
                     f"{sum(s in avail for s in NEURAL_QUICK['samplers'])}; see --list-samplers).")
        return super().get_help_record(ctx)


@click.command("bench")
@click.option("--samplers", cls=_SamplersOption, default=None, help="Comma-separated samplers (default: all).")
@click.option("--seeds", default=None, type=int_range(1, MAX_BENCH_SEEDS), help="Number of seeds (0..N-1). Default 5.")
@click.option("--steps", default=None, type=int_range(1, MAX_BENCH_STEPS), help="Budget steps per run. Default 200.")
@click.option("--batch-size", default=None, type=int_range(1, MAX_BATCH_SIZE),
              help="Groups (environment-task pairs) per step. Default 64 (32 with --learner neural).")
@click.option("--group-size", default=8, show_default=True, type=int_range(2, MAX_GROUP_SIZE),
              help="Rollouts per group.")
@click.option("--pool", "pool_arg", default="default", show_default=True,
              help="'default' (the 2,550-task benchmark pool), 'reasoning-gym' (generated fallback) or a pool file; "
                   "with --learner neural: 'v2' (60 environments of skills x surfaces, one instance per seed).")
@click.option("--learner", "learner_opts", multiple=True, metavar="NAME|KEY=VALUE",
              help="The learner: 'model' (default: the simulated learner) or 'neural' (GRPO on a small "
                   "transformer, CPU); KEY=VALUE items are its options, e.g. --learner sharing=0 or "
                   "--learner neural --learner d_model=96 (repeatable).")
@click.option("--families", default=None, metavar="MODULE:ATTR",
              help="--learner neural: the list of task families to generate the pool from "
                   "(default envsched_lab.families:DEFAULT_FAMILIES).")
@click.option("--sampler-option", "sampler_opts", multiple=True, metavar="SAMPLER.KEY=VALUE",
              help="Option of one sampler, e.g. --sampler-option mopps.forgetting=1.0 (repeatable).")
@click.option("--coldstart-runs", default=None, type=int_range(0, MAX_COLDSTART_RUNS),
              help="Cold-start runs for the Table 4 figures (default 100; 0 to skip).")
@click.option("--coldstart-steps", default=None, type=int_range(1, MAX_BENCH_STEPS),
              help="Steps per cold-start run (10).")
@click.option("--coldstart-samplers", default="envsched,envsched-paper,uniform", show_default=True,
              help="Samplers given cold-start runs.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory (default bench-runs/<timestamp>); an existing one with the same settings is resumed.")
@click.option("--workers", default=None, type=int_range(1, MAX_WORKERS),
              help="Worker processes (default: CPU count).")
@click.option("--ray", "use_ray", is_flag=True, help="Run the (sampler, seed) jobs as Ray tasks (local Ray).")
@click.option("--ray-address", default=None, help="Ray cluster address (implies --ray).")
@click.option("--quick", is_flag=True,
              help="Small setting: 10 samplers x 3 seeds x 30 steps, 10 cold starts (a few minutes on 2 cores).")
@click.option("--matrix", type=click.Choice(["quick", "full"]), default=None,
              help="Run the sensitivity matrix instead (batch size, reward, sharing, misleading features, pool "
                   "mixes): one table and one heat map of win / not detected / loss per cell.")
@click.option("--tune", is_flag=True,
              help="Run the symmetric tuning protocol (tuning pool and seeds, same budget per sampler) and write "
                   "the tuned values (--tuned-file, default: the packaged tuned.json).")
@click.option("--trials", default=8, show_default=True, type=int_range(1, MAX_TRIALS),
              help="--tune: configurations tried per sampler (the first is its defaults).")
@click.option("--tuned-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Tuned sampler options to apply (default: the packaged tuned.json); with --tune, where to write.")
@click.option("--untuned", is_flag=True, help="Run every sampler with its defaults, ignoring tuned values.")
@click.option("--split", "split_opts", multiple=True, metavar="KEY=VALUE",
              help="Held-out split option: split_seed, heldout_env_share (0.15), heldout_task_share (0.2).")
@click.option("--data-dir", "data_dirs", multiple=True, metavar="CORPUS=DIR",
              help="--matrix: tau2=DIR and/or acebench=DIR, added to the small-environments pool mix.")
@click.option("--protocol", "protocol_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run the pre-registered evaluation protocol (docs/evaluation-protocol.md) into this folder and "
                   "write protocol-report.md/json (the neural learner unless --learner model); resumes.")
@click.option("--round", "protocol_round", type=click.IntRange(1, 100), default=None,
              help="With --protocol: the evaluation round (docs/evaluation-protocol.md: each round has its own "
                   "fresh seeds; default: the latest for a new folder, the folder's own for an existing one).")
@click.option("--pilot", is_flag=True,
              help="With --protocol: the development-seed pilot (uniform, plr, envsched on seeds 0-4) and the "
                   "minimum detectable effect at the protocol's seeds, instead of the evaluation.")
@click.option("--dry-run", is_flag=True,
              help="With --protocol: print the round's plan (samplers, seeds, runs per phase, runs already in the "
                   "folder) and its CPU estimate; runs and writes nothing.")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--list-samplers", is_flag=True, help="List the benchmark samplers and exit.")
def bench(samplers: str | None, seeds: int | None, steps: int | None, batch_size: int | None, group_size: int,
          pool_arg: str, learner_opts: tuple[str, ...], families: str | None, sampler_opts: tuple[str, ...],
          coldstart_runs: int | None,
          coldstart_steps: int | None, coldstart_samplers: str, out_dir: Path | None, workers: int | None,
          use_ray: bool, ray_address: str | None, quick: bool, matrix: str | None, tune: bool, trials: int,
          tuned_file: Path | None, untuned: bool, split_opts: tuple[str, ...], data_dirs: tuple[str, ...],
          protocol_dir: Path | None, protocol_round: int | None, pilot: bool, dry_run: bool, no_plots: bool,
          as_json: bool, list_samplers: bool) -> None:
    """Run samplers against the learner model at a matched rollout budget and report what each one gets
    out of it. Samplers draw from the training part of the pool; the learner is scored on held-out tasks
    and held-out environments they never see (the held-out score judges them, with paired differences to
    uniform over seeds), next to the training-pool score, within-task reward variance, environment and tool
    coverage, signal groups per episode and per unit cost, exploitation hit rate (cold starts) and the
    rollouts and cost needed to reach uniform's best 120-step held-out score. Writes metrics (JSONL,
    Parquet), summary.md/json and PNG plots to the run directory; rerunning into the same directory resumes.

    \b
    Examples:
      envsched bench --quick
      envsched bench --learner neural --quick
      envsched bench --out bench-runs/full
      envsched bench --matrix quick --out bench-runs/matrix
      envsched bench --tune --trials 8
      envsched bench --protocol protocol-runs --workers 2
    """
    require_extra("lab", "envsched bench (the benchmark lab)")
    from envsched_lab.pools import load_bench_pool
    from envsched_lab.report import missing_bench_outputs
    from envsched_lab.runner import DEFAULT_SAMPLERS, BenchConfig, available_samplers, run_benchmark
    from envsched_lab.tuning import load_tuned

    console = Console(stderr=as_json)
    if pilot and protocol_dir is None:
        raise click.UsageError("--pilot is part of --protocol: add --protocol FOLDER")
    if protocol_round is not None and protocol_dir is None:
        raise click.UsageError("--round is part of --protocol: add --protocol FOLDER")
    if dry_run and (protocol_dir is None or pilot):
        raise click.UsageError("--dry-run plans a --protocol evaluation: add --protocol FOLDER (without --pilot)")
    if protocol_dir is not None:
        if quick or tune or matrix or samplers or seeds or steps:
            raise click.UsageError("--protocol runs what docs/evaluation-protocol.md fixes: drop --quick, --tune, "
                                   "--matrix, --samplers, --seeds and --steps")
        kind = "neural" if not any("=" not in x for x in learner_opts) else _split_learner(learner_opts)[0]
        # what the command line sets of the configuration (a fixed round refuses each of them)
        given = [name for name, set_ in (("--learner model", kind != "neural"),
                                         ("--learner KEY=VALUE", any("=" in x for x in learner_opts)),
                                         ("--families", families is not None),
                                         (f"--pool {pool_arg}", pool_arg not in ("default", "v2"))) if set_]
        _run_protocol(console, protocol_dir, kind, families, workers or 1, pilot, as_json, protocol_round,
                      pool_arg == "v2", given, dry_run)
        return
    learner_kind, learner_opts = _split_learner(learner_opts)
    neural = learner_kind == "neural"
    v2 = pool_arg == "v2"
    if families is not None and not neural:
        raise click.UsageError("--families sets the neural learner's tasks: add --learner neural")
    if neural and (tune or matrix):
        raise click.UsageError("--tune and --matrix run the simulated learner; drop --learner neural")
    if v2 and not neural:
        raise click.UsageError("the v2 pool is the neural learner's: add --learner neural")
    if v2 and families is not None:
        raise click.UsageError("--pool v2 generates its own tasks: drop --families")
    if neural and pool_arg not in ("default", "v2"):
        raise click.UsageError("--learner neural generates its pool from task families (--families) or is the v2 "
                               "pool (--pool v2); it takes no pool file")
    if batch_size is None:
        batch_size = V2["batch_size"] if v2 else NEURAL["batch_size"] if neural else 64
    if list_samplers:
        for name, desc in available_samplers().items():
            console.print(f"[bold]{name}[/bold]: {desc}")
        return
    if tune and matrix:
        raise click.UsageError("--tune and --matrix are separate jobs: run one, then the other")
    if not tune:
        for line in missing_bench_outputs(plots=not no_plots):  # "[lab]" in the command is not markup
            Console(stderr=True).print(line, style="yellow", markup=False)
    quick_set: dict[str, Any] = V2_QUICK if v2 else NEURAL_QUICK if neural else QUICK
    names = [s.strip() for s in samplers.split(",") if s.strip()] if samplers else \
        (list(quick_set["samplers"]) if quick else list(V2["samplers"]) if v2 else list(DEFAULT_SAMPLERS))
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
    if tune:
        from envsched_lab.tuning import tuning_space

        _run_tuning(console, names if samplers else [n for n in DEFAULT_SAMPLERS if n in avail and tuning_space(n)],
                    trials, steps, batch_size, group_size, _parse_kv(learner_opts, "--learner"), tuned_file, workers,
                    as_json)
        return
    try:
        # the packaged tuned values were tuned on the simulated learner: the neural learner runs every sampler
        # at its defaults unless a tuned file is named
        tuned = {} if untuned or (neural and tuned_file is None) else load_tuned(tuned_file)
    except (FileNotFoundError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--tuned-file") from None
    from envsched_lab.tuning import with_ablations

    for sname, params in with_ablations(tuned).items():
        per_sampler[sname] = {**params, **per_sampler.get(sname, {})}
    if matrix:
        _run_matrix(console, matrix, names if samplers else None, per_sampler, out_dir, workers, data_dirs,
                    no_plots, as_json)
        return
    cold_names = [s.strip() for s in coldstart_samplers.split(",") if s.strip() and s.strip() in avail]
    learner_dict = _parse_kv(learner_opts, "--learner")
    if v2:
        from envsched_lab.families.v2 import V2_LEARNER, V2_POOL

        families = V2_POOL
        default_runs = 0
        if coldstart_runs:
            raise click.UsageError("cold-start runs are not part of the v2 benchmark: drop --coldstart-runs")
        learner_dict = {**V2_LEARNER, **learner_dict}
    elif neural:
        from envsched_lab.families import DEFAULT_FAMILIES_REF

        families = families or DEFAULT_FAMILIES_REF
        default_runs = NEURAL["coldstart_runs"]
    else:
        default_runs = QUICK["coldstart_runs"] if quick else 100
    base = V2 if v2 else NEURAL if neural else {"seeds": 5, "steps": 200}
    cfg = BenchConfig(
        samplers=names,
        seeds=list(range(seeds if seeds is not None else (quick_set["seeds"] if quick else base["seeds"]))),
        steps=steps if steps is not None else (quick_set["steps"] if quick else base["steps"]),
        batch_size=batch_size, group_size=group_size,
        learner=learner_dict, sampler_options=per_sampler,
        learner_kind=learner_kind, families=families,
        coldstart_runs=coldstart_runs if coldstart_runs is not None else default_runs,
        coldstart_steps=coldstart_steps if coldstart_steps is not None else (QUICK["coldstart_steps"] if quick else 10),
        coldstart_samplers=cold_names, pool=pool_arg, split=_parse_kv(split_opts, "--split"),
    )
    cfg.score_steps = sorted({min(t, cfg.steps) for t in ((40, 120) if v2 else (40, 120, 200))})
    cfg.target_step = min(120, cfg.steps)
    try:
        cfg.validate()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    with console.status("loading the pool..."):
        try:
            if v2:
                from envsched_lab.families.v2 import build_v2_pool

                pool = build_v2_pool(cfg.seeds[0]).pool
                source = "v2 (envsched_lab.families.v2; one instance and split per seed, the first shown)"
            elif neural:
                from envsched_lab.families import build_family_pool

                pool, source = build_family_pool(families or "").pool, f"families {families}"
            else:
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

        on_progress = _reporter(prog, bar, "sampler steps")

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
    console.print(f"\nwritten to {out_dir}: {', '.join(summary.get('written', []))}")


def _fits_unbroken(head: list[str], rows: list[list[str]], width: int) -> bool:
    """Whether a table fits ``width`` columns with no word split: every column at least as wide as its longest
    word (header or cell), plus the separators between columns."""
    longest = [max(len(w) for text in (h, *(r[i] for r in rows)) for w in str(text).split() or [""])
               for i, h in enumerate(head)]
    return sum(longest) + 3 * (len(head) - 1) <= width


def _print_summary(console: Console, summary: dict[str, Any], cfg: Any) -> None:
    """The summary tables; a vertical layout (one block per sampler) when a table would split a word to fit the
    terminal."""
    from envsched_lab.report import summary_tables

    console.print(f"[bold]rollout efficiency[/bold] ({summary.get('learner', '')}): {len(cfg.seeds)} seeds x "
                  f"{cfg.steps} steps x {cfg.batch_size} groups x {cfg.group_size} rollouts", markup=True)
    for title, head, rows in summary_tables(summary, cfg):
        if _fits_unbroken(head, rows, console.width):
            table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
            for h in head:
                table.add_column(h, justify="left" if h == "sampler" else "right")
            for r in rows:
                table.add_row(*r)
            console.print(table)
        else:
            console.print(f"\n[bold]{title}[/bold]")
            for r in rows:
                console.print(f"[bold]{r[0]}[/bold]")
                for h, v in zip(head[1:], r[1:], strict=True):
                    console.print(f"  {h}: {v}")
    for s, t in summary["coldstart"].items():
        rows = t["table"]
        if rows:
            last = rows[min(6, len(rows) - 1)]
            console.print(f"cold start {s} ({t['runs']} runs, {summary.get('learner', '')}): hit rate step 1 "
                          f"{100 * rows[0]['hit_rate']:.1f}% -> "
                          f"step {last['step']} {100 * last['hit_rate']:.1f}% (low {100 * last['hit_rate_low']:.1f}%, "
                          f"high {100 * last['hit_rate_high']:.1f}%)")
    for line in summary.get("significant", []):
        console.print(line)
    label = summary.get("learner", "")
    for v in summary.get("goals", {}).values():
        console.print(f"{'[green]met[/green]' if v['met'] else '[red]not met[/red]'}: {v['sentence']} ({label})")
    if summary.get("gate"):
        from envsched_lab.report import gate_lines

        for line in gate_lines(summary["gate"]):
            console.print(line, markup=False)


def _progress(console: Console, transient: bool) -> Progress:
    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=transient)


def _reporter(prog: Progress, bar: Any, what: str) -> Any:
    """Progress callback: the bar on a terminal; a line on stderr every 5 % when piped or logged."""
    import sys
    import time

    started = time.perf_counter()
    last = [-1]

    def report(done: int, total: int) -> None:
        prog.update(bar, completed=done, total=total)
        if prog.console.is_terminal or not total:
            return
        pct = int(100 * done / total) // 5 * 5
        if pct > last[0]:
            last[0] = pct
            print(f"{done}/{total} {what} ({pct}%, {time.perf_counter() - started:.0f} s)", file=sys.stderr,
                  flush=True)

    return report


def _run_tuning(console: Console, names: list[str], trials: int, steps: int | None, batch_size: int,
                group_size: int, learner: dict[str, Any], out: Path | None, workers: int | None,
                as_json: bool) -> None:
    from envsched_lab.tuning import TUNED_FILE, tune, tuning_pool, tuning_space

    with console.status("building the tuning pool..."):
        pool = tuning_pool()
    console.print(f"tuning pool: {len(pool)} tasks, {len(pool.envs)} environments; samplers: {', '.join(names)}; "
                  f"{trials} trials each")
    for n in names:
        console.print(f"  {n}: {', '.join(tuning_space(n)) or 'no knobs'}")
    with _progress(console, as_json) as prog:
        bar = prog.add_task("tuning steps", total=None)
        doc = tune(names, pool=pool, trials=trials, steps=steps or 60, batch_size=batch_size, group_size=group_size,
                   learner=learner, workers=workers or os.cpu_count() or 1, out=out,
                   progress=_reporter(prog, bar, "tuning steps"))
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for n, e in doc["samplers"].items():
        console.print(f"{n}: objective {e['objective']:.2f} with {e['params'] or 'its defaults'}")
    console.print(f"written: {out or TUNED_FILE}")


def _run_matrix(console: Console, preset: str, names: list[str] | None, options: dict[str, dict[str, Any]],
                out_dir: Path | None, workers: int | None, data_dirs: tuple[str, ...], no_plots: bool,
                as_json: bool) -> None:
    from envsched_lab.matrix import MATRIX_PRESETS, matrix_cells, run_matrix

    dirs: dict[str, str] = {}
    for item in data_dirs:
        key, sep, value = item.partition("=")
        if not sep or key not in ("tau2", "acebench"):
            raise click.BadParameter(f"--data-dir takes tau2=DIR or acebench=DIR, got {item!r}",
                                     param_hint="--data-dir")
        if not Path(value).expanduser().is_dir():
            raise click.BadParameter(f"{value} is not a folder", param_hint="--data-dir")
        dirs[key] = str(Path(value).expanduser())
    if out_dir is None:
        import time

        out_dir = Path("bench-runs") / f"matrix-{preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    p = MATRIX_PRESETS[preset]
    console.print(f"matrix {preset}: {len(matrix_cells(p))} cells x {len(names or p.samplers)} samplers x "
                  f"{p.seeds} seeds x {p.steps} steps; run dir: {out_dir}")
    if not dirs:
        console.print("[yellow]no --data-dir: the small-environments mix has no tau2/ACEBench tasks[/yellow]")
    with _progress(console, as_json) as prog:
        bar = prog.add_task("sampler steps", total=None)

        def on_cell(k: int, n: int, entry: dict[str, Any]) -> None:
            v = ", ".join(f"{s} {x}" for s, x in entry["verdict"].items())
            prog.console.print(f"cell {k}/{n} {entry['setting']}: {v}")

        doc = run_matrix(preset, out_dir, samplers=names, sampler_options=options, workers=workers or os.cpu_count()
                         or 1, data_dirs=dirs, plots=not no_plots,
                         progress=_reporter(prog, bar, "sampler steps"), on_cell=on_cell)
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=float))
        return
    for s, t in doc["tally"].items():
        console.print(f"{s}: {t['win']} wins, {t['tie']} ties, {t['loss']} losses over {len(doc['cells'])} cells")
    console.print(f"written to {out_dir}: matrix.md, matrix.json" + ("" if no_plots else ", matrix.png")
                  + f" ({doc['wall_seconds']:.0f} s)")


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """A protocol plan (``envsched_lab.protocol.protocol_plan``) as lines of text: what runs, and the arithmetic of
    its CPU estimate."""
    runs = plan["runs"]
    first, last, n = plan["eval_seeds"]
    untuned_cpu = sum(plan["run_cpu_s"][s] for s in plan["samplers"]) * n
    lines = [f"evaluation round {plan['round'] if plan['round'] is not None else '(none)'}; configuration digest "
             f"{plan['digest']}",
             f"primary: {plan['method']} vs {', '.join(plan['primary'])}",
             f"controls: {', '.join(plan['controls']) or '-'}; descriptive: {', '.join(plan['descriptive']) or '-'}",
             f"evaluation seeds {first}-{last} ({n}); tuning seeds {', '.join(map(str, plan['tuning_seeds']))}; "
             f"{plan['trials']} trials for {', '.join(plan['tuned']) or 'no sampler'}",
             f"runs: {runs['untuned']} untuned + {runs['tuning']} tuning + {runs['tuned']} tuned = "
             f"{plan['total_runs']} ({plan['done']} already in the folder)",
             f"CPU estimate: untuned {untuned_cpu / 3600:.2f} h + tuning and tuned "
             f"{(plan['cpu_seconds'] - plan['pretrain_cpu_s'] - untuned_cpu) / 3600:.2f} h + pre-training "
             f"{plan['pretrain_cpu_s'] / 3600:.2f} h = {plan['cpu_hours']:.2f} CPU hours "
             f"(per run: {', '.join(f'{s} {c:g} s' for s, c in plan['run_cpu_s'].items())})"]
    return lines


def _run_protocol(console: Console, out: Path, learner: str, families: str | None, workers: int, pilot: bool,
                  as_json: bool, round_: int | None = None, v2: bool = False, given: list[str] | None = None,
                  dry_run: bool = False) -> None:
    from envsched_lab.protocol import (
        EVALUATION_ROUNDS,
        FIXED_ROUNDS,
        ProtocolConfig,
        check_fixed_round,
        load_config,
        protocol_plan,
        run_pilot,
        run_protocol,
    )

    try:
        stored = None if pilot else load_config(out)
        if stored is not None:
            check_fixed_round(stored)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if stored is not None:
        if round_ is not None and stored.eval_seeds != EVALUATION_ROUNDS.get(round_):
            raise click.ClickException(f"{out} holds another evaluation round (seeds {stored.eval_seeds[0]}-"
                                       f"{stored.eval_seeds[-1]}); use another folder for round {round_}")
        config = stored  # resume (or report again) what the folder was started with
    else:
        chosen = round_ if round_ is not None else max(EVALUATION_ROUNDS)
        if chosen in FIXED_ROUNDS and given:
            raise click.UsageError(f"evaluation round {chosen}'s configuration is fixed (docs/evaluation-protocol.md): "
                                   f"drop {', '.join(given)}" + ("" if round_ is not None else
                                                               " (or name an earlier round with --round)"))
        if chosen not in FIXED_ROUNDS and v2:
            raise click.UsageError(f"the v2 pool is that of rounds {', '.join(map(str, FIXED_ROUNDS))}: drop --pool "
                                   f"v2 or add --round {max(FIXED_ROUNDS)}")
        options: dict[str, Any] = {} if chosen in FIXED_ROUNDS else \
            {"learner": learner, "families": families} if learner == "neural" else \
            {"learner": "model", "batch_size": 64}
        try:
            config = ProtocolConfig.for_round(chosen, **options)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    if dry_run:
        plan = protocol_plan(config, out if out.is_dir() else None)
        if as_json:
            click.echo(json.dumps(plan, indent=2, default=float))
            return
        for line in plan_lines(plan):
            console.print(line, markup=False)
        return
    last: dict[str, int] = {}

    def progress(phase: str, done: int, total: int) -> None:
        if last.get(phase) != done:
            last[phase] = done
            console.print(f"protocol {phase}: {done}/{total} runs", markup=False)

    if pilot:
        doc = run_pilot(out, config=config, workers=workers, progress=lambda d, t: progress("pilot", d, t))
        if as_json:
            click.echo(json.dumps(doc, indent=2, default=float))
            return
        for name, pair in doc["pairs"].items():
            console.print(f"{name}: mean {pair['mean']:+.2f}, sd of paired differences {pair['sd']:.2f}, minimum "
                          f"detectable effect at {doc['eval_seeds']} seeds {pair['mde_at_eval_seeds']:.2f}",
                          markup=False)
        return
    report = run_protocol(config, out, workers=workers, progress=progress)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=float))
    else:
        click.echo((out / "protocol-report.md").read_text())
