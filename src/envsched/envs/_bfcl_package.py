"""The installed bfcl-eval package (:mod:`envsched.envs.bfcl`): its pieces imported once, the release this code
was written against, and the multi-turn categories' entries (question file joined with its possible answers).
Pool building (:mod:`envsched.envs.bfcl_pool`), the call worker (:mod:`envsched.envs._bfcl_worker`) and the
environment read BFCL through here."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envsched.envs.base import EnvironmentUnavailable

__all__ = ["BFCL_INSTALL", "BFCL_VERSION", "MULTI_TURN_CATEGORIES", "bfcl_available"]

#: The bfcl-eval release this module was written and tested against.
BFCL_VERSION = "2026.3.23"
#: The documented install: data and environment classes only, without the optional ML stack.
BFCL_INSTALL = f"pip install --no-deps bfcl-eval=={BFCL_VERSION} mpmath==1.3.0"
#: BFCL's multi-turn categories, in the package's order.
MULTI_TURN_CATEGORIES: tuple[str, ...] = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)


class _Bfcl:
    """The pieces of bfcl-eval this module uses, imported once."""

    def __init__(self) -> None:
        try:
            import bfcl_eval
            from bfcl_eval.constants import default_prompts
            from bfcl_eval.constants import executable_backend_config as backend
            from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
            from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
        except ImportError as exc:  # pragma: no cover - exercised where bfcl-eval is absent
            raise EnvironmentUnavailable(
                f"BFCL multi-turn needs the bfcl-eval package, which could not be imported ({exc}). Install "
                f"its data and environment classes without the optional ML dependencies: {BFCL_INSTALL}"
            ) from exc
        self.root = Path(bfcl_eval.__file__).resolve().parent
        self.data = self.root / "data"
        self.answers = self.data / "possible_answer"
        self.func_docs = self.data / "multi_turn_func_doc"
        self.doc_files: dict[str, str] = dict(backend.MULTI_TURN_FUNC_DOC_FILE_MAPPING)
        self.class_modules: dict[str, str] = dict(backend.CLASS_FILE_PATH_MAPPING)
        self.stateless = set(backend.STATELESS_CLASSES)
        self.utils = multi_turn_utils
        self.execute = multi_turn_utils.execute_multi_turn_func_call
        self.checker = multi_turn_checker
        self.max_steps = int(getattr(default_prompts, "MAXIMUM_STEP_LIMIT", 20))
        self.added_functions_prompt = str(getattr(
            default_prompts, "DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC",
            "I have updated some more functions you can choose from. What about now?"))
        try:
            from importlib.metadata import version
            self.version = version("bfcl-eval")
        except Exception:  # pragma: no cover
            self.version = "unknown"
        self._classes: dict[str, type] = {}

    def cls(self, name: str) -> type:
        if name not in self._classes:
            if name not in self.class_modules:
                raise KeyError(f"unknown BFCL class {name!r}")
            self._classes[name] = getattr(importlib.import_module(self.class_modules[name]), name)
        return self._classes[name]

    def public_methods(self, name: str) -> set[str]:
        return {n for n, _ in inspect.getmembers(self.cls(name), inspect.isfunction) if not n.startswith("_")}


@functools.cache
def _bfcl() -> _Bfcl:
    return _Bfcl()


def bfcl_available() -> bool:
    """True when bfcl-eval's multi-turn data, classes and checker import."""
    try:
        _bfcl()
    except EnvironmentUnavailable:
        return False
    return True


def _norm_category(category: str) -> str:
    name = category if category.startswith("multi_turn_") else f"multi_turn_{category}"
    if name not in MULTI_TURN_CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; choose from "
                         f"{', '.join(MULTI_TURN_CATEGORIES)} (the 'multi_turn_' prefix is optional)")
    return name


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@functools.cache
def _load_category(category: str) -> tuple[dict[str, Any], ...]:
    """The category's entries (question file joined with its possible answers), in file order."""
    b = _bfcl()
    prefix = _file_prefix()
    questions = _read_jsonl(b.data / f"{prefix}_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(b.answers / f"{prefix}_{category}.json")}
    out = []
    for q in questions:
        if q["id"] not in answers:
            raise RuntimeError(f"bfcl-eval data: no possible answer for {q['id']!r}")
        out.append({**q, "ground_truth": answers[q["id"]]})
    return tuple(out)


@functools.cache
def _file_prefix() -> str:
    b = _bfcl()
    found = sorted(p.name.split("_multi_turn_base")[0] for p in b.data.glob("*_multi_turn_base.json"))
    if not found:
        raise EnvironmentUnavailable(f"bfcl-eval at {b.root} has no multi-turn data files; reinstall: "
                                     f"{BFCL_INSTALL}")
    return found[-1]


@functools.cache
def _entries_by_id() -> dict[str, dict[str, Any]]:
    return {e["id"]: e for c in MULTI_TURN_CATEGORIES for e in _load_category(c)}


@functools.cache
def _func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    b = _bfcl()
    return tuple(_read_jsonl(b.func_docs / b.doc_files[class_name]))


def _entry(task: Mapping[str, Any] | str) -> dict[str, Any]:
    """The bfcl-eval entry of a task spec (its ``bfcl.entry_id``) or of a BFCL entry id."""
    if isinstance(task, str):
        entry_id = task
    else:
        meta = task.get("bfcl")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("entry_id"), str):
            raise ValueError(f"task {task.get('id')!r} is not a BFCL task: it has no 'bfcl.entry_id' "
                             "(build it with envsched.envs.bfcl.build_bfcl_pool)")
        entry_id = meta["entry_id"]
    try:
        return _entries_by_id()[entry_id]
    except KeyError:
        raise KeyError(f"no BFCL multi-turn entry {entry_id!r} in bfcl-eval {_bfcl().version}") from None
