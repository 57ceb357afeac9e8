"""A module-level environment for CPU tests of the asynchronous TRL trainer's ``environment_factory`` path
(the rollout worker runs in a spawned process, so the factory must be picklable by reference)."""

from __future__ import annotations

from typing import Any


class ResetLog:
    """An environment that only records the task each rollout was reset with: one line (the ``task_id``) per
    ``reset`` appended to ``path``. No tools, no reward, no observation."""

    def __init__(self, path: str) -> None:
        self.path = path

    def reset(self, task_id: str, **row: Any) -> None:
        with open(self.path, "a") as f:
            f.write(task_id + "\n")
