"""Helpers shared by CLI commands."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console

    from envsched.pool.pool import TaskPool

#: extra -> the import names it provides that commands check for before doing any work
EXTRAS: dict[str, tuple[str, ...]] = {
    "bench": ("pyarrow", "matplotlib"),
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


def load_pool(path: Path) -> TaskPool:
    """Load a pool file, turning loader errors into clean CLI errors. An empty pool is an error too."""
    from envsched.pool.pool import TaskPool
    from envsched.pool.spec import TaskSpecError

    try:
        pool = TaskPool.from_file(path)
    except (TaskSpecError, FileNotFoundError, IsADirectoryError) as exc:
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
