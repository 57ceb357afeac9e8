"""ACEBench agent tasks (ACEBench/ACEBench, MIT): pool builder reading task files from a folder you name.

Reads ``data_agent_multi_step.json`` and ``data_agent_multi_turn.json`` (JSON lines) and their
``possible_answer/`` files from either a checkout of the upstream repository (``data_all/data_en/``) or a
folder holding them directly (as ``shared/data/acebench``).

Static fields, from the files:

- ``instruction``: the question (multi-turn: the user simulator's brief); ``group``: ``multi_step`` or
  ``multi_turn``.
- ``tools``: the task's own function schemas (``function``: name, description, parameters).
- ``initial_state``: the task's ``initial_config``.
- ``verifier.checks``: the end state per class and attribute (``ground_truth``) and the milestone call
  path (``mile_stone``); ``verifier.code`` is empty (ACEBench's environment classes are code, not data).
- ``env``: one of the task's ``involved_classes``, the rarest first by :data:`ENV_PRECEDENCE` (Travel <
  ReminderApi < FoodPlatform < MessageApi < BaseApi, the involvement counts of the 50 English agent tasks),
  so every task is in exactly one environment: Travel 10, ReminderApi 14, FoodPlatform 18, MessageApi 8.

**Gap: no episodes.** ACEBench's agent episodes need an LLM user simulator, and replaying the milestone
paths reaches the recorded end state in only 27 of the 50 tasks, so the end states are not a reliable
reward source offline; envsched uses ACEBench for static pool features only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["ACEBENCH_FILES", "ENV_PRECEDENCE", "build_acebench_pool"]

ACEBENCH_FILES: dict[str, str] = {
    "multi_step": "data_agent_multi_step.json",
    "multi_turn": "data_agent_multi_turn.json",
}
ENV_PRECEDENCE: tuple[str, ...] = ("Travel", "ReminderApi", "FoodPlatform", "MessageApi", "BaseApi")
_ALIASES = {"reminderpi": "ReminderApi", "reminderapi": "ReminderApi", "baseapi": "BaseApi",
            "messageapi": "MessageApi", "foodplatform": "FoodPlatform", "travel": "Travel"}


def _folder(data_dir: str | Path) -> Path:
    root = Path(data_dir)
    if not root.exists():
        raise FileNotFoundError(f"ACEBench folder not found: {root}")
    if not root.is_dir():
        raise NotADirectoryError(f"ACEBench data must be a folder (a checkout of ACEBench/ACEBench or a folder "
                                 f"with data_agent_*.json), got a file: {root}")
    for cand in (root, root / "data_all" / "data_en", root / "data_en"):
        if any((cand / f).is_file() for f in ACEBENCH_FILES.values()):
            return cand
    raise FileNotFoundError(f"no ACEBench agent task file under {root}: expected "
                            f"{' or '.join(ACEBENCH_FILES.values())} there or in data_all/data_en/")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}, line {lineno}: invalid JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or "id" not in obj:
                raise ValueError(f"{path}, line {lineno}: expected a JSON object with an 'id'")
            out.append(obj)
    return out


def _canon(name: str) -> str:
    return _ALIASES.get(name.lower(), name)


def _env_of(involved: Iterable[str]) -> str:
    names = {_canon(n) for n in involved}
    for name in ENV_PRECEDENCE:
        if name in names:
            return name
    return sorted(names)[0] if names else "unknown"


def _state_checks(ground_truth: Any) -> list[str]:
    checks = []
    for block in ground_truth if isinstance(ground_truth, list) else [ground_truth]:
        if not isinstance(block, Mapping):
            continue
        for cls, state in block.items():
            if isinstance(state, Mapping):
                for attr, value in state.items():
                    checks.append(f"end state: {cls}.{attr} == {json.dumps(value, ensure_ascii=False)}")
            else:
                checks.append(f"end state: {cls} == {json.dumps(state, ensure_ascii=False)}")
    return checks


def build_acebench_pool(data_dir: str | Path, subsets: Iterable[str] | None = None, *, split: str = "train",
                        on_progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """ACEBench English agent tasks as envsched task specs.

    Args:
        data_dir: a checkout of ACEBench/ACEBench, or a folder with the ``data_agent_*.json`` files and
            ``possible_answer/``.
        subsets: ``multi_step`` and/or ``multi_turn`` (default both; asking for a missing file is an error).
        split: the ``split`` of every spec.
        on_progress: called as ``on_progress(done, total)`` after each task.
    """
    folder = _folder(data_dir)
    wanted = list(subsets) if subsets is not None else [s for s, f in ACEBENCH_FILES.items()
                                                        if (folder / f).is_file()]
    loaded = []
    for subset in wanted:
        if subset not in ACEBENCH_FILES:
            raise ValueError(f"unknown ACEBench subset {subset!r}; choose from {', '.join(ACEBENCH_FILES)}")
        qpath = folder / ACEBENCH_FILES[subset]
        apath = folder / "possible_answer" / ACEBENCH_FILES[subset]
        for p in (qpath, apath):
            if not p.is_file():
                raise FileNotFoundError(f"ACEBench {subset}: missing file {p}")
        questions = _read_jsonl(qpath)
        answers = {a["id"]: a for a in _read_jsonl(apath)}
        missing = [q["id"] for q in questions if q["id"] not in answers]
        if missing:
            raise ValueError(f"{apath}: no possible answer for {len(missing)} task(s), e.g. {missing[0]!r}")
        loaded.append((subset, questions, answers))
    total = sum(len(q) for _, q, _ in loaded)
    specs: list[dict[str, Any]] = []
    for subset, questions, answers in loaded:
        for q in questions:
            ans = answers[q["id"]]
            milestones = [str(m) for m in ans.get("mile_stone") or []]
            tools = [{"name": f["name"], "description": f.get("description", ""),
                      "parameters": f.get("parameters", {})}
                     for f in q.get("function") or [] if isinstance(f, Mapping) and f.get("name")]
            checks = _state_checks(ans.get("ground_truth"))
            checks += [f"milestone {i + 1}: {m}" for i, m in enumerate(milestones)]
            involved = [str(c) for c in q.get("involved_classes") or []]
            specs.append({
                "id": f"acebench/{q['id']}",
                "env": _env_of(involved),
                "split": split,
                "index": len(specs),
                "group": subset,
                "difficulty": len(milestones),
                "instruction": str(q.get("question", "")),
                "tools": tools,
                "initial_state": q.get("initial_config") or {},
                "verifier": {"checks": checks, "code": ""},
                "acebench": {"task_id": q["id"], "subset": subset, "involved_classes": involved},
            })
            if on_progress is not None:
                on_progress(len(specs), total)
    return specs
