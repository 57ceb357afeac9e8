"""Module-level reward functions for CPU tests and examples of the asynchronous TRL trainer.

TRL's async rollout worker runs in a spawned process, so its reward functions must be picklable by reference
(module-level functions or ``functools.partial`` of them): these are. They measure nothing useful about a task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))


def digit_share(completions: Sequence[Any], task_id: Sequence[str] | None = None,
                constant_tasks: Sequence[str] = (), **kwargs: Any) -> list[float]:
    """Share of digit characters in each completion (0 for an empty one); a task in ``constant_tasks`` gets 0.5
    for every completion instead (a group without signal, for zero-signal filtering tests)."""
    out = []
    for i, c in enumerate(completions):
        if task_id is not None and task_id[i] in constant_tasks:
            out.append(0.5)
            continue
        text = _text(c)
        out.append(sum(ch.isdigit() for ch in text) / len(text) if text else 0.0)
    return out
