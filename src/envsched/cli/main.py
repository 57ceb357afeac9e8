"""The ``envsched`` command line: a thin layer over the library.

Subcommands are imported only when they run (or when their own ``--help`` is asked for), so that
``envsched --help`` answers without loading numpy, scikit-learn or the environments.
"""

from __future__ import annotations

import importlib

import click

from envsched._version import __version__

#: command name -> ("module:attribute", one-line help shown by `envsched --help`), in display order
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("envsched.cli.run:run", "Run the scheduling loop on a pool (default: the bundled pool)."),
    "pool": ("envsched.cli.pool:pool", "Inspect, build and analyse task pools."),
    "explain": ("envsched.cli.explain:explain", "Why EnvSched selected each task (from run --explain FILE)."),
    "store": ("envsched.cli.store:store", "Inspect and verify history stores (from run --store PATH)."),
    "bench": ("envsched_lab.cli:bench", "Compare samplers at a matched rollout budget."),
    "eval": ("envsched.cli.eval:eval_cmd", "Evaluate a checkpoint on an environment's split."),
    "dashboard": ("envsched.cli.dashboard:dashboard", "Live web page over a run's store (read-only, 127.0.0.1)."),
    "report": ("envsched.cli.report:report", "The dashboard's views as one self-contained HTML file."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, _, attr = COMMANDS[cmd_name][0].partition(":")
        command = getattr(importlib.import_module(module_name), attr)
        if not isinstance(command, click.Command):  # pragma: no cover - a wiring mistake
            raise TypeError(f"{COMMANDS[cmd_name][0]} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands with the short help kept here, without importing them."""
        rows = [(name, help_) for name, (_, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="envsched")
def cli() -> None:
    """envsched: environment-aware task scheduling for RL of LLM agents.

    It decides which (environment, task) pairs each training batch rolls out, learns from the rewards
    that come back, and evaluates checkpoints. Start with `envsched run` (a scheduling run on the bundled
    pool) or `envsched pool inspect FILE`.
    """


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
