"""``envsched pool build CORPUS --out FILE``: build a task pool from a real corpus."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envsched.cli.common import MAX_SEED, MAX_TASKS, MAX_TASKS_PER_DATASET, MAX_TIERS, int_range, shown
from envsched.envs.base import EnvironmentUnavailable

CORPUS_CHOICES = ("bfcl", "reasoning_gym", "tau2", "acebench", "combined", "benchmark")


def _split_list(values: tuple[str, ...]) -> list[str] | None:
    out = [v.strip() for value in values for v in value.split(",") if v.strip()]
    return out or None


def _parse_data_dirs(values: tuple[str, ...], corpus: str) -> tuple[Path | None, dict[str, Path]]:
    single: Path | None = None
    named: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if sep and name in ("tau2", "acebench"):
            named[name] = Path(path)
        elif sep and name and "/" not in name:
            raise click.BadParameter(f"unknown corpus {name!r} in {value!r} (tau2 or acebench)",
                                     param_hint="--data-dir")
        else:
            if single is not None:
                raise click.BadParameter("give one DIR, or CORPUS=DIR for each folder corpus",
                                         param_hint="--data-dir")
            single = Path(value)
    if corpus in ("tau2", "acebench") and single is None:
        single = named.get(corpus)
    if corpus == "combined" and single is not None:
        raise click.BadParameter("for 'combined', name each folder: --data-dir tau2=DIR --data-dir acebench=DIR",
                                 param_hint="--data-dir")
    return single, named


@click.command("build")
@click.argument("corpus", type=click.Choice(CORPUS_CHOICES))
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the pool: FILE.jsonl (one spec a line) or FILE.json ({'tasks': [...]}).")
@click.option("--data-dir", "data_dirs", multiple=True, metavar="DIR|CORPUS=DIR",
              help="Folder of a folder corpus: a checkout of tau2-bench or ACEBench (tau2, acebench); for "
                   "combined give tau2=DIR and/or acebench=DIR.")
@click.option("--categories", multiple=True, help="bfcl: multi-turn categories (base, miss_func, miss_param, "
              "long_context; comma-separated or repeated). Default: all four.")
@click.option("--limit", type=int_range(0, MAX_TASKS), default=None, help="bfcl: first N questions per category.")
@click.option("--datasets", multiple=True, help="reasoning_gym: dataset names (comma-separated or repeated), "
              "or 'all'. Default: the 51 checked datasets.")
@click.option("--tasks-per-dataset", type=int_range(0, MAX_TASKS_PER_DATASET), default=50, show_default=True,
              help="reasoning_gym: tasks per dataset.")
@click.option("--tiers", type=int_range(1, MAX_TIERS), default=5, show_default=True,
              help="reasoning_gym: most difficulty tiers per dataset.")
@click.option("--seed", type=int_range(0, MAX_SEED), default=0, show_default=True,
              help="reasoning_gym / benchmark: base seed.")
@click.option("--split", default="train", show_default=True,
              help="The split of every task (tau2: 'upstream' keeps tau2's own train/test split).")
@click.option("--domains", multiple=True, help="tau2: domains (airline, retail, telecom). Default: all found.")
@click.option("--subsets", multiple=True, help="acebench: multi_step and/or multi_turn. Default: both.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (progress goes to stderr).")
def build(corpus: str, out: Path, data_dirs: tuple[str, ...], categories: tuple[str, ...], limit: int | None,
          datasets: tuple[str, ...], tasks_per_dataset: int, tiers: int, seed: int, split: str,
          domains: tuple[str, ...], subsets: tuple[str, ...], as_json: bool) -> None:
    """Build a task pool from a real corpus and write it to --out.

    CORPUS is one of: bfcl (BFCL multi-turn from bfcl-eval: 800 tasks, 8 environments), reasoning_gym
    (one environment per dataset, seeded, with difficulty tiers), tau2 and acebench (task files read from
    --data-dir), combined (every available corpus, environments named corpus/env), benchmark (the paper-size
    pool: 2,550 tasks over 51 environments, BFCL + 43 reasoning-gym datasets).

    \b
    Examples:
      envsched pool build bfcl --out bfcl.jsonl
      envsched pool build reasoning_gym --datasets chain_sum,gcd --tasks-per-dataset 100 --out rg.jsonl
      envsched pool build tau2 --data-dir ~/src/tau2-bench --out tau2.jsonl
      envsched pool build combined --data-dir tau2=~/src/tau2-bench --data-dir acebench=~/src/ACEBench --out all.jsonl
      envsched pool build benchmark --out benchmark.jsonl
    """
    if out.suffix.lower() not in (".jsonl", ".json"):
        raise click.BadParameter(f"{out}: the file name must end in .jsonl or .json", param_hint="--out")
    single, named = _parse_data_dirs(data_dirs, corpus)
    if corpus not in ("tau2", "acebench", "combined") and (single is not None or named):
        raise click.BadParameter(f"{corpus} takes no --data-dir", param_hint="--data-dir")
    if corpus in ("tau2", "acebench") and single is None:
        raise click.UsageError(f"{corpus} reads its task files from a folder: give --data-dir DIR "
                               "(a checkout of the upstream repository)")
    split_arg: str | None = None if split == "upstream" else split  # tau2 only; the others: train
    if split == "upstream":
        if corpus not in ("tau2", "combined"):
            raise click.BadParameter("'upstream' is tau2's own split; give a split name", param_hint="--split")
        split = "train"
    rg_opts: dict[str, Any] = {"tasks_per_dataset": tasks_per_dataset, "num_tiers": tiers, "seed": seed,
                               "split": split}
    ds = _split_list(datasets)
    if ds is not None:
        rg_opts["datasets"] = "all" if ds == ["all"] else ds
    opts: dict[str, dict[str, Any]] = {
        "bfcl": {"categories": _split_list(categories), "limit": limit, "split": split},
        "reasoning_gym": rg_opts,
        "tau2": {"domains": _split_list(domains), "split": split_arg},
        "acebench": {"subsets": _split_list(subsets), "split": split},
    }
    console = Console(stderr=True) if as_json else Console()
    started = time.perf_counter()
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=as_json) as progress:
            bars: dict[str, Any] = {}

            def on_progress(name: str, done: int, total: int) -> None:
                if name not in bars:
                    bars[name] = progress.add_task(name, total=total)
                progress.update(bars[name], completed=done, total=total)

            pool = _build(corpus, single, named, opts, seed, on_progress)
    except EnvironmentUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    except (FileNotFoundError, NotADirectoryError, ValueError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    seconds = time.perf_counter() - started
    _write(pool, out)
    summary = pool.summary()
    summary.update({"corpus": corpus, "out": str(out), "seconds": round(seconds, 2)})
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    table = Table(title=f"{corpus}: {summary['tasks']} tasks in {summary['environments']} environments")
    table.add_column("environment")
    table.add_column("tasks", justify="right")
    for env, count in sorted(summary["by_env"].items()):
        table.add_row(shown(env), str(count))
    console.print(table)
    missing = ", ".join(f"{k}: {v}" for k, v in summary["missing"].items() if v) or "none"
    console.print(f"static fields missing (tasks without): {missing}")
    console.print(f"wrote {shown(out)} in {seconds:.1f} s (fingerprint {summary['fingerprint'][:16]}...)")


def _build(corpus: str, single: Path | None, named: dict[str, Path], opts: dict[str, dict[str, Any]],
           seed: int, on_progress: Any) -> Any:
    from envsched.envs.builders import build_combined_pool
    from envsched.pool.pool import TaskPool

    if corpus == "benchmark":
        from envsched.envs.default_pool import benchmark_pool
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pool = benchmark_pool(seed=seed, on_progress=on_progress)
        for w in caught:
            click.echo(f"warning: {w.message}", err=True)
        return pool
    if corpus == "combined":
        from envsched.envs.bfcl import BFCL_INSTALL, bfcl_available

        if not bfcl_available():
            click.echo(f"warning: bfcl-eval is not installed, so BFCL is left out ({BFCL_INSTALL})", err=True)
        return build_combined_pool(None, data_dirs=named, options={k: _clean(v) for k, v in opts.items()},
                                   on_progress=on_progress)
    from envsched.envs.builders import build_corpus

    specs = build_corpus(corpus, data_dir=single, on_progress=lambda d, t: on_progress(corpus, d, t),
                         **_clean(opts[corpus]))
    return TaskPool(specs, name=corpus, source=f"<{corpus}>")


def _clean(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None or k == "split"}


def _write(pool: Any, out: Path) -> None:
    if out.suffix.lower() == ".jsonl":
        pool.to_jsonl(out)
        return
    import os
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name, suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"name": pool.name, "reward_range": list(pool.reward_range), "tasks": list(pool)}, fh,
                      ensure_ascii=False)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
