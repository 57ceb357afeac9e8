"""The ``envsched`` command line: a thin layer over the library."""

from __future__ import annotations

import click

from envsched import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="envsched")
def cli() -> None:
    """envsched: environment-aware task scheduling for RL of LLM agents.

    It decides which (environment, task) pairs each training batch rolls out, learns from the rewards
    that come back, and evaluates checkpoints. Start with `envsched run` (a scheduling run on the bundled
    pool) or `envsched pool inspect FILE`.
    """


def _register() -> None:
    from envsched.cli.bench import bench
    from envsched.cli.eval import eval_cmd
    from envsched.cli.explain import explain
    from envsched.cli.pool import pool
    from envsched.cli.run import run
    from envsched.cli.store import store

    cli.add_command(eval_cmd)
    cli.add_command(pool)
    cli.add_command(run)
    cli.add_command(explain)
    cli.add_command(bench)
    cli.add_command(store)


_register()


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
