"""Helpers shared by CLI commands."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from envsched.pool.pool import TaskPool
from envsched.pool.spec import TaskSpecError


def load_pool(path: Path) -> TaskPool:
    """Load a pool file, turning loader errors into clean CLI errors."""
    try:
        return TaskPool.from_file(path)
    except (TaskSpecError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None


def load_pool_or_default(path: Path | None, console: Console) -> TaskPool:
    """The pool in ``path``, or the bundled default pool (built on first use and cached)."""
    if path is not None:
        return load_pool(path)
    from envsched.pool.default import default_pool

    with console.status("loading the bundled pool (built on first use, then cached)..."):
        return default_pool()
