"""tau2-bench (sierra-research/tau2-bench, MIT): pool builder reading task files from a folder you name.

Reads each domain's ``tasks.json`` (``tasks_small.json`` for telecom when the full file is absent), its
``split_tasks.json`` and its policy (``policy.md``; telecom: ``main_policy.md`` plus
``tech_support_manual.md``) from either a checkout of the upstream repository (``data/tau2/domains/<d>/``)
or a folder holding the domain folders directly (``<dir>/<d>/``, as ``shared/data/tau2-bench``).

Static fields, all taken from what the files contain (tau2's tool code is not in them):

- ``env``: the domain (``airline``, ``retail``, ``telecom``); ``group``: the domain too.
- ``instruction``: the user scenario (reason for call, known and unknown info, the user's instructions) and,
  for telecom, the ticket.
- ``tools``: the domain's operations, i.e. every tool name that any task of the domain uses in its expected
  actions (telecom: also the agent-side initialization actions), with the argument names and JSON types
  seen there, who calls it (agent or user) and the policy lines that mention it.
- ``initial_state``: the task's ``initial_state`` (initialization data and actions) and the domain.
- ``verifier.checks``: expected actions with arguments, information to communicate, environment
  assertions, natural-language assertions (these need an LLM judge upstream) and the reward basis;
  ``verifier.code`` is empty (the evaluator is code of the tau2 package, not data).
- ``tau2``: domain, task id, upstream split, policy text.

**Gap: no episodes.** Upstream scores an episode by replaying the expected actions on a copy of the domain
database and comparing hashes, with an LLM user simulator driving the conversation. tau2-bench is not on
PyPI and its database-backed runnable ports there carry no licence, so envsched builds pools from tau2 but
runs no tau2 episodes.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["TAU2_DOMAINS", "build_tau2_pool", "find_tau2_domains"]

TAU2_DOMAINS: tuple[str, ...] = ("airline", "retail", "telecom")
_POLICY_FILES = ("policy.md", "main_policy.md", "tech_support_manual.md")


def _domain_dir(root: Path, domain: str) -> Path | None:
    for cand in (root / domain, root / "data" / "tau2" / "domains" / domain, root / "domains" / domain,
                 root / "tau2" / "domains" / domain):
        if (cand / "tasks.json").is_file() or (cand / "tasks_small.json").is_file():
            return cand
    return None


def find_tau2_domains(data_dir: str | Path) -> dict[str, Path]:
    """Domain name -> folder with its task files, for every tau2 domain found under ``data_dir``."""
    root = Path(data_dir)
    if not root.exists():
        raise FileNotFoundError(f"tau2-bench folder not found: {root}")
    if not root.is_dir():
        raise NotADirectoryError(f"tau2-bench data must be a folder (a checkout of sierra-research/tau2-bench "
                                 f"or a folder of domain folders), got a file: {root}")
    return {d: p for d in TAU2_DOMAINS if (p := _domain_dir(root, d)) is not None}


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None


def _policy(folder: Path) -> str:
    parts = [(folder / f).read_text(encoding="utf-8") for f in _POLICY_FILES if (folder / f).is_file()]
    return "\n\n".join(parts)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _fmt_args(args: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in (args or {}).items())


def _scenario_text(task: Mapping[str, Any]) -> str:
    scenario = task.get("user_scenario") or {}
    instr = scenario.get("instructions")
    lines: list[str] = []
    if isinstance(instr, str):
        lines.append(instr)
    elif isinstance(instr, Mapping):
        for key, label in (("reason_for_call", "Reason for call"), ("known_info", "Known info"),
                           ("unknown_info", "Unknown info"), ("task_instructions", "User instructions")):
            if instr.get(key):
                lines.append(f"{label}: {str(instr[key]).strip()}")
    if scenario.get("persona"):
        lines.append(f"Persona: {scenario['persona']}")
    if task.get("ticket"):
        lines.append(f"Ticket: {task['ticket']}")
    return "\n".join(lines)


def _checks(task: Mapping[str, Any]) -> list[str]:
    crit = task.get("evaluation_criteria") or {}
    checks: list[str] = []
    for act in crit.get("actions") or []:
        who = "user" if act.get("requestor") == "user" else "agent"
        checks.append(f"expected {who} action: {act.get('name')}({_fmt_args(act.get('arguments'))})")
    for out in crit.get("communicate_info") or []:
        checks.append(f"the agent communicates: {out}")
    for a in crit.get("env_assertions") or []:
        checks.append(f"environment assertion ({a.get('env_type', 'env')}): {a.get('func_name')}("
                      f"{_fmt_args(a.get('arguments'))}) is {a.get('assert_value', True)}")
    for a in crit.get("nl_assertions") or []:
        checks.append(f"natural-language assertion (LLM judge): {a}")
    basis = crit.get("reward_basis") or []
    if basis:
        checks.append("reward basis: " + ", ".join(map(str, basis)))
    return checks


def _tools(domain: str, tasks: list[Mapping[str, Any]], policy: str) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}

    def add(name: str | None, args: Mapping[str, Any] | None, who: str) -> None:
        if not name:
            return
        tool = seen.setdefault(name, {"name": name, "callers": set(), "args": {}})
        tool["callers"].add(who)
        for k, v in (args or {}).items():
            tool["args"].setdefault(k, set()).add(_json_type(v))

    for task in tasks:
        for act in (task.get("evaluation_criteria") or {}).get("actions") or []:
            add(act.get("name"), act.get("arguments"), "user" if act.get("requestor") == "user" else "agent")
        for act in ((task.get("initial_state") or {}).get("initialization_actions") or []):
            if act.get("env_type") == "assistant":
                add(act.get("func_name"), act.get("arguments"), "agent")
    policy_lines = [ln.strip(" -*#\t") for ln in policy.splitlines() if ln.strip()]
    out = []
    for name in sorted(seen):
        t = seen[name]
        words = re.compile(rf"\b{re.escape(name)}\b|\b{re.escape(name.replace('_', ' '))}\b", re.IGNORECASE)
        mentions = [ln for ln in policy_lines if words.search(ln)][:3]
        callers = " and ".join(sorted(t["callers"]))
        desc = (f"tau2 {domain} operation {name}, called by the {callers}; arguments seen in the tasks' "
                f"expected actions: {', '.join(sorted(t['args'])) or 'none'}.")
        if mentions:
            desc += " Policy: " + " / ".join(mentions)
        out.append({
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": {
                k: {"type": sorted(v)[0] if len(v) == 1 else sorted(v)} for k, v in sorted(t["args"].items())}},
            "caller": sorted(t["callers"]),
        })
    return out


def build_tau2_pool(data_dir: str | Path, domains: Iterable[str] | None = None, *, split: str | None = "train",
                    on_progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """tau2-bench tasks as envsched task specs (one environment per domain).

    Args:
        data_dir: a checkout of sierra-research/tau2-bench, or a folder of domain folders.
        domains: which domains (default: every domain found; asking for a missing one is an error).
        split: the ``split`` of every spec, or ``None`` to use upstream's ``split_tasks.json`` (``train``
            or ``test``; ``base`` for a task in neither).
        on_progress: called as ``on_progress(done, total)`` after each task.

    Raises ``FileNotFoundError``/``NotADirectoryError`` for a bad folder and ``ValueError`` naming the file
    for malformed task files or an unknown domain.
    """
    found = find_tau2_domains(data_dir)
    wanted = list(domains) if domains is not None else [d for d in TAU2_DOMAINS if d in found]
    for d in wanted:
        if d not in TAU2_DOMAINS:
            raise ValueError(f"unknown tau2 domain {d!r}; choose from {', '.join(TAU2_DOMAINS)}")
        if d not in found:
            raise FileNotFoundError(f"tau2 domain {d!r}: no tasks.json or tasks_small.json under {data_dir} "
                                    f"(looked in {d}/, data/tau2/domains/{d}/, domains/{d}/)")
    if not wanted:
        raise FileNotFoundError(f"no tau2-bench domain found under {data_dir}: expected <domain>/tasks.json or "
                                "data/tau2/domains/<domain>/tasks.json for airline, retail or telecom")
    loaded: list[tuple[str, Path, list[dict[str, Any]], dict[str, str], str]] = []
    for d in wanted:
        folder = found[d]
        path = folder / "tasks.json" if (folder / "tasks.json").is_file() else folder / "tasks_small.json"
        tasks = _load_json(path)
        if not isinstance(tasks, list) or not all(isinstance(t, Mapping) and "id" in t for t in tasks):
            raise ValueError(f"{path}: expected a JSON list of task objects, each with an 'id'")
        upstream: dict[str, str] = {}
        split_file = folder / "split_tasks.json"
        if split_file.is_file():
            splits = _load_json(split_file)
            for name in ("test", "train"):  # train wins if a file ever lists a task in both
                for tid in splits.get(name, []) if isinstance(splits, Mapping) else []:
                    upstream[str(tid)] = name
        loaded.append((d, path, tasks, upstream, _policy(folder)))
    total = sum(len(t) for _, _, t, _, _ in loaded)
    specs: list[dict[str, Any]] = []
    for d, path, tasks, upstream, policy in loaded:
        tools = _tools(d, tasks, policy)
        for task in tasks:
            tid = str(task["id"])
            up = upstream.get(tid, "base")
            crit = task.get("evaluation_criteria") or {}
            specs.append({
                "id": f"tau2/{d}/{tid}",
                "env": d,
                "split": split if split is not None else up,
                "index": len(specs),
                "group": d,
                "difficulty": len(crit.get("actions") or []),
                "instruction": _scenario_text(task),
                "tools": copy.deepcopy(tools),
                "initial_state": {"domain": d, "initial_state": task.get("initial_state")},
                "verifier": {"checks": _checks(task), "code": ""},
                "tau2": {"domain": d, "task_id": tid, "upstream_split": up, "file": path.name,
                         "purpose": (task.get("description") or {}).get("purpose"), "policy": policy},
            })
            if on_progress is not None:
                on_progress(len(specs), total)
    return specs
