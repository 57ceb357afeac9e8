"""Helpers shared by CLI commands."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console

    from envsched.pool.pool import TaskPool

# ------------------------------------------------------------------------------------------ numeric bounds
# Upper bounds of the CLI's numeric options, sized for a 2-core, 24 GiB machine (docs/limits.md,
# "Command-line numbers"). A value beyond one is a one-line usage error naming the option and the range.
MAX_STEPS = 1_000_000           #: batches of `run` (a run file line each) and `run --log-every`
MAX_BENCH_STEPS = 100_000       #: budget steps of one benchmark run (every sampler x seed runs them)
MAX_BATCH_SIZE = 16_384         #: pairs per batch
MAX_GROUP_SIZE = 1_024          #: rollouts per pair (batch x group rewards are drawn each step)
MAX_SEED = 2**63 - 1            #: a seed (numpy's generators take 64-bit seeds)
MAX_BENCH_SEEDS = 100           #: seeds of a benchmark (each a full run per sampler)
MAX_EVAL_SEEDS = 1_000          #: seeds listed in `eval --seeds` (each one more pass over the tasks)
MAX_WORKERS = 64                #: worker processes
MAX_TRIALS = 1_000              #: tuning trials per sampler
MAX_COLDSTART_RUNS = 1_000      #: cold-start runs of the benchmark
MAX_TASKS = 10_000_000          #: task counts (--limit, --num-tasks, --num-episodes): 10x the largest tested pool
MAX_TASKS_PER_DATASET = 100_000  #: reasoning-gym tasks generated per dataset
MAX_TIERS = 100                 #: difficulty tiers
MAX_NEIGHBOURS = 1_024          #: K_within / K_cross (GraphConfig's bound; N x K x 20 bytes of arrays)
MAX_EXACT_NODES = 200_000       #: exact neighbour search (O(N^2) time, block x N scores in memory)
MAX_TOP = 1_000                 #: shared features shown per neighbour
MAX_SAMPLES_PER_TASK = 1_000    #: evaluation samples per task and seed
MAX_CONCURRENCY = 256           #: concurrent evaluation episodes (threads and open connections)
MAX_TURNS = 1_000               #: turns per evaluation episode
MAX_TOKENS = 1_048_576          #: tokens per model reply
MAX_TEMPERATURE = 10.0          #: sampling temperature
MAX_RETRIES = 100               #: retries of a failed model call
MAX_BACKOFF_S = 3_600.0         #: base backoff between retries, seconds
MAX_EPISODE_TIMEOUT_S = 86_400.0  #: one evaluation episode, seconds
MAX_THRESHOLD = 1e9             #: |success threshold| (rewards are finite numbers of modest size)
MAX_EXPLAIN_STEP = 1_000_000_000  #: a step number to explain


def int_range(low: int, high: int) -> click.IntRange:
    """An integer option bounded on both sides; click's error names the option and the range."""
    return click.IntRange(low, high)


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN and infinities (which compare false with any bound and
    would slip through a plain range)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number (the range is {self._describe_range()}).", param, ctx)
        return super().convert(number, param, ctx)


def float_range(low: float, high: float, *, min_open: bool = False) -> click.FloatRange:
    """A finite float option bounded on both sides."""
    return FiniteFloatRange(low, high, min_open=min_open)


# ----------------------------------------------------------------------------------------- terminal text
def visible(value: object) -> str:
    """``value`` as text safe for a terminal: every character that is not printable (control characters
    such as ESC, so ANSI escape sequences; bidi overrides and other format characters; line and paragraph
    separators) is shown as its Python escape (``\\x1b``, ``\\u202e``) instead of being sent raw.
    Task ids, environment names and other pool- or store-derived text pass through this before printing."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def shown(value: object) -> str:
    """:func:`visible` text with rich markup escaped, for ``console.print`` and rich table cells."""
    from rich.markup import escape

    return escape(visible(value))


#: extra -> the import names it provides that commands check for before doing any work
EXTRAS: dict[str, tuple[str, ...]] = {
    "lab": ("pyarrow", "matplotlib", "statsmodels", "torch"),
    "postgres": ("sqlalchemy", "psycopg"),
    "graph": ("hnswlib", "jsonschema"),
    "openenv": ("openenv", "websockets", "uvicorn"),
    "ray": ("ray",),
}


def pip_command(extra: str) -> str:
    """The exact command that installs ``extra`` (into the current interpreter's environment)."""
    return f"python -m pip install 'envsched[{extra}]' (in a clone: python -m pip install -e '.[{extra}]')"


def missing_modules(extra: str) -> list[str]:
    """The import names of ``extra`` that are not installed."""
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def require_extra(extra: str, what: str) -> None:
    """Fail in one line, before any work, when ``what`` needs the optional ``extra`` and it is missing.

    The message names the extra, the missing packages and the exact pip command.
    """
    missing = missing_modules(extra)
    if missing:
        raise click.ClickException(f"{what} needs the '{extra}' extra ({', '.join(missing)} not installed): "
                                   f"{pip_command(extra)}")


def is_url(target: str) -> bool:
    """Whether a store target is a database URL rather than a SQLite file path."""
    return "://" in target


def require_store_backend(target: str, what: str) -> None:
    """A PostgreSQL store needs the ``postgres`` extra: say so before touching anything."""
    if is_url(target) and target.split("://", 1)[0].split("+", 1)[0] in ("postgresql", "postgres"):
        require_extra("postgres", what)


def _probe_directory(folder: Path) -> str | None:
    """Why a new file cannot be created in the existing directory ``folder`` (``None`` when it can): tried
    for real with a temporary file that is removed at once, because permission bits say nothing for root
    (``os.access`` answers yes where the file system then refuses: a read-only mount, sysfs)."""
    import os
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".envsched-write-check-")
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(probe)
    return None


def output_path_problem(path: Path, *, directory: bool) -> str | None:
    """Why ``path`` cannot be written as an output file (``directory=False``) or an output directory
    (``directory=True``), or ``None`` when it can. Creates nothing: a missing path is judged by its nearest
    existing parent, which must be a directory in which a file can be created."""
    import os

    path = Path(path)
    if path.exists():
        if directory and not path.is_dir():
            return f"{path} exists and is not a directory"
        if not directory and path.is_dir():
            return f"{path} is a directory"
        if directory:
            problem = _probe_directory(path)
            return f"cannot create files in {path} ({problem})" if problem else None
        try:  # an existing file: opened for appending (its contents untouched), then closed
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        except OSError as exc:
            return f"cannot write to {path} ({exc.strerror or type(exc).__name__})"
        return None
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a directory"
    problem = _probe_directory(parent)
    return f"cannot create {path} in {parent} ({problem})" if problem else None


def check_output_paths(paths: list[tuple[str, Path | None, bool]]) -> None:
    """Fail in one line, before any work, when an output path cannot be written: ``(option, path, directory)``
    per output option (``path`` ``None``: not given). Nothing is created, so a refused command leaves nothing
    behind."""
    for option, path, directory in paths:
        if path is None:
            continue
        problem = output_path_problem(path, directory=directory)
        if problem is not None:
            raise click.ClickException(f"{option} {visible(path)}: {visible(problem)}; nothing was run")


def load_pool(path: Path) -> TaskPool:
    """Load a pool file, turning loader errors into clean CLI errors. An empty pool is an error too."""
    from envsched.pool.pool import TaskPool
    from envsched.pool.spec import TaskSpecError

    try:
        pool = TaskPool.from_file(path)
    except (TaskSpecError, FileNotFoundError, IsADirectoryError, ValueError) as exc:
        # ValueError: a malformed ENVSCHED_POOL_MAX_* limit (TaskSpecError is one too)
        raise click.ClickException(str(exc)) from None
    if len(pool) == 0:
        raise click.ClickException(f"{path} holds no task specs (an empty pool): expected one JSON task spec per "
                                   "line (.jsonl) or a JSON list of them (.json)")
    return pool


def echo_wrapped(lines: list[str] | str, *, err: bool = False) -> None:
    """Print ``lines``; on a terminal each is wrapped at spaces to the terminal's width (continuations indented),
    so that the terminal never cuts a line mid-word. Piped or logged, each line is printed whole."""
    import shutil
    import textwrap

    stream = sys.stderr if err else sys.stdout
    for line in [lines] if isinstance(lines, str) else lines:
        if stream.isatty():
            width = max(shutil.get_terminal_size().columns - 1, 20)
            for part in textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False) or [""]:
                click.echo(part, err=err)
        else:
            click.echo(line, err=err)


def note(message: str) -> None:
    """A progress message on stderr, shown whether or not stderr is a terminal (kept off stdout); wrapped to the
    terminal's width on a terminal."""
    echo_wrapped(f"envsched: {message}", err=True)


def load_pool_or_default(path: Path | None, console: Console | None = None) -> TaskPool:
    """The pool in ``path``, or the bundled default pool (built on first use and cached)."""
    if path is not None:
        return load_pool(path)
    from envsched.envs.default_pool import default_pool, default_pool_path

    cached = default_pool_path().exists()
    note("loading the bundled pool" if cached else
         "building the bundled pool from the installed task data (first use; cached afterwards)...")
    if console is not None and console.is_terminal and sys.stderr.isatty():
        with console.status("loading the bundled pool..."):
            return default_pool()
    return default_pool()
