"""BFCL multi-turn questions as envsched task specs (:func:`build_bfcl_pool`): the environment of a task (see
:mod:`envsched.envs.bfcl`, "Environment of a task"), its tools, instruction, verifier checks and the source of
the methods its ground truth calls."""

from __future__ import annotations

import ast
import copy
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from envsched.envs._bfcl_package import MULTI_TURN_CATEGORIES, _bfcl, _entry, _func_docs, _load_category, _norm_category

__all__ = ["ENV_PRECEDENCE", "build_bfcl_pool", "ground_truth_calls"]

#: Which involved class a task belongs to: the first of these that the task involves (rarest first).
ENV_PRECEDENCE: tuple[str, ...] = (
    "MathAPI",
    "TicketAPI",
    "TwitterAPI",
    "MessageAPI",
    "GorillaFileSystem",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)


def _env_of(involved: Sequence[str]) -> str:
    for name in ENV_PRECEDENCE:
        if name in involved:
            return name
    return sorted(involved)[0]


def _call_name(call: str) -> str:
    node = ast.parse(call.strip(), mode="eval").body
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id
    raise ValueError(f"not a plain function call: {call!r}")


def _method_owner(involved: Sequence[str]) -> dict[str, str]:
    """method name -> class, with the executor's rule (a later involved class overrides an earlier one)."""
    owner: dict[str, str] = {}
    for cls in involved:
        for m in _bfcl().public_methods(cls):
            owner[m] = cls
    return owner


@functools.cache
def _method_source(class_name: str, method: str) -> str:
    fn = getattr(_bfcl().cls(class_name), method)
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):  # pragma: no cover
        return f"# source of {class_name}.{method} unavailable\n"


def _tools(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    missed: dict[str, int] = {}
    for turn, names in (entry.get("missed_function") or {}).items():
        for n in names:
            missed[n] = int(turn)
    tools = []
    for cls in entry["involved_classes"]:
        for doc in _func_docs(cls):
            tool: dict[str, Any] = {"name": doc["name"], "description": doc.get("description", ""),
                                    "class": cls, "parameters": doc.get("parameters", {})}
            if doc["name"] in missed:
                tool["available_from_turn"] = missed[doc["name"]]
            tools.append(tool)
    return tools


def _turn_text(messages: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(str(m.get("content", "")) for m in messages)


def _spec(entry: Mapping[str, Any], category: str, split: str, index: int) -> dict[str, Any]:
    involved = list(entry["involved_classes"])
    gt: list[list[str]] = entry["ground_truth"]
    owner = _method_owner(involved)
    lines = []
    for t, msgs in enumerate(entry["question"]):
        if msgs:
            lines.append(f"[turn {t + 1}] {_turn_text(msgs)}")
        else:
            lines.append(f"[turn {t + 1}] (user) {_bfcl().added_functions_prompt}")
    checks: list[str] = []
    used: dict[tuple[str, str], None] = {}
    for t, calls in enumerate(gt):
        if not calls:
            checks.append(f"after turn {t + 1}: no call is expected (the request cannot be done yet); the "
                          "state is checked again at the next turn")
            continue
        for call in calls:
            checks.append(f"after turn {t + 1}: {call}")
            name = _call_name(call)
            if name in owner:
                used[(owner[name], name)] = None
        classes = ", ".join(c for c in involved if c not in _bfcl().stateless)
        if classes:
            checks.append(f"after turn {t + 1}: state of {classes} equals the ground truth's")
        checks.append(f"after turn {t + 1}: execution results include every ground-truth call's result")
    code_parts = [f"# {cls}.{m}\n{_method_source(cls, m)}" for cls, m in used]
    n_calls = sum(len(c) for c in gt)
    return {
        "id": f"bfcl/{entry['id']}",
        "env": _env_of(involved),
        "split": split,
        "index": index,
        "group": category,
        "difficulty": n_calls,
        "instruction": "\n".join(lines),
        "tools": _tools(entry),
        "initial_state": copy.deepcopy(entry.get("initial_config", {})),
        "verifier": {"checks": checks, "code": "\n".join(code_parts)},
        "bfcl": {
            "entry_id": entry["id"],
            "category": category,
            "involved_classes": involved,
            "num_turns": len(entry["question"]),
            "excluded_function": list(entry.get("excluded_function", [])),
            "version": _bfcl().version,
        },
    }


def build_bfcl_pool(categories: Iterable[str] | None = None, *, split: str = "train",
                    limit: int | None = None,
                    on_progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """BFCL multi-turn questions as envsched task specs (one per question, in package order).

    Args:
        categories: multi-turn categories (``"base"`` or ``"multi_turn_base"``...); default all four.
        split: the ``split`` given to every spec; ``index`` numbers the specs 0..N-1 in order.
        limit: keep only the first ``limit`` questions of each category (for quick pools).
        on_progress: called as ``on_progress(done, total)`` after each task.

    Each spec has ``env`` (see the module doc for the rule), ``group`` (the category), ``difficulty``
    (number of ground-truth calls), ``instruction`` (the user turns), ``tools`` (BFCL's function docs of
    all involved classes, with ``parameters``; a held-out function of ``miss_func`` carries
    ``available_from_turn``), ``initial_state`` (BFCL's ``initial_config``), ``verifier`` (per-turn checks
    from the ground truth; ``code``: source of the methods the ground truth calls) and ``bfcl``
    (``entry_id``, ``category``, ``involved_classes``... what the episode runner needs).

    Raises :class:`EnvironmentUnavailable` (with the pip command) when bfcl-eval is not installed.
    """
    if isinstance(categories, str):
        raise TypeError("categories must be a list of category names, not a single string")
    cats = [_norm_category(c) for c in (categories if categories is not None else MULTI_TURN_CATEGORIES)]
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    chosen = [(cat, entry) for cat in dict.fromkeys(cats)
              for entry in (_load_category(cat)[:limit] if limit is not None else _load_category(cat))]
    specs: list[dict[str, Any]] = []
    for cat, entry in chosen:
        specs.append(_spec(entry, cat, split, len(specs)))
        if on_progress is not None:
            on_progress(len(specs), len(chosen))
    return specs


def ground_truth_calls(task: Mapping[str, Any] | str) -> list[list[str]]:
    """The ground-truth calls of a BFCL task, one list per user turn (a task spec or a BFCL entry id)."""
    return copy.deepcopy(_entry(task)["ground_truth"])
