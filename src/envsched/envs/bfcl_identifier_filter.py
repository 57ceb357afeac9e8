"""The identifier filter for BFCL multi-turn tasks (paper appendix C): tasks whose reward depends on a guess.

A high-reward trajectory is suspicious when one of its actions uses an identifier the agent could not have
known -- a value that appears nowhere in the task's instruction, its initial state, or the outputs of earlier
tool calls of the same trajectory (a guessed account number that happened to exist, a memorised file name).
Such a task teaches guessing, not tool use. :class:`BfclIdentifierFilter` replays the saved trajectory without
the suspicious action; only if that *lowers the reward* does the action matter, and only then is the task
flagged. BFCL's environments can replay a trajectory deterministically from the task's initial configuration,
which is what the filter needs.

The scheduler takes any filter through its interface,
:class:`~envsched.method.scheduling.identifier_filter.IdentifierFilter` (a ``check(task, trajectory)`` that
returns an :class:`~envsched.envs.base.IdentifierVerdict`); give this one to
:class:`~envsched.method.sampler.EnvSchedSampler` as ``identifier_filter`` and report high-reward trajectories
with :meth:`EnvSchedSampler.submit_trajectory <envsched.method.sampler.EnvSchedSampler.submit_trajectory>`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envsched.envs.base import IdentifierVerdict, SuspiciousAction, Trajectory
from envsched.envs.bfcl import BFCLEnvironment, replay_reward
from envsched.validation import is_int

__all__ = ["BfclIdentifierFilter", "bfcl_transcript", "call_identifiers", "known_identifiers"]


# ---------------------------------------------------------------------------------------------- identifiers


def _literal_values(node: ast.AST) -> list[Any]:
    out: list[Any] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and not isinstance(sub.value, bool) and sub.value is not None:
            out.append(sub.value)
    return out


_DATE_TIME = re.compile(r"^(\d{4}-\d{1,2}-\d{1,2}([ T]\d{1,2}:\d{2}(:\d{2})?)?|\d{1,2}/\d{1,2}(/\d{2,4})?|"
                        r"\d{1,2}/\d{4}|\d{1,2}:\d{2}(:\d{2})?)$")


def _is_identifier(value: str) -> bool:
    """An opaque id: no spaces, >= 4 characters, digits mixed with letters or ``_-:@``, or a run of >= 5
    digits -- but not a date, time or decimal amount. Words, codes such as ``LAX`` or ``USD``, enum values
    and amounts are knowledge or derivations, not identifiers."""
    s = value.strip()
    if len(s) < 4 or " " in s or _DATE_TIME.match(s):
        return False
    if re.fullmatch(r"-?\d+\.\d+", s):
        return False
    has_digit = any(c.isdigit() for c in s)
    if not has_digit:
        return False
    if s.isdigit():
        return len(s) >= 5
    return any(c.isalpha() or c in "_-:@" for c in s)


def call_identifiers(call: str) -> list[str]:
    """Identifier-like literal arguments of a call string (see :func:`_is_identifier`); integers count
    when they have at least 5 digits. Unparseable calls have none."""
    try:
        tree = ast.parse(call.strip(), mode="eval")
    except SyntaxError:
        return []
    out = []
    for v in _literal_values(tree):
        if isinstance(v, str) and _is_identifier(v):
            out.append(v.strip())
        elif is_int(v) and len(str(abs(v))) >= 5:
            out.append(str(v))
    return sorted(set(out))


def _flatten_text(obj: Any) -> str:
    if isinstance(obj, str):
        return obj
    try:
        return json.dumps(obj, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(obj)


def known_identifiers(*texts: Any) -> str:
    """The evidence an agent may take identifiers from, lower-cased into one searchable string (thousands
    separators between digits removed, so ``10,000`` matches ``10000``)."""
    text = "\n".join(_flatten_text(t) for t in texts).lower()
    return re.sub(r"(?<=\d),(?=\d{3})", "", text)


def _is_known(identifier: str, evidence: str) -> bool:
    """Whether the agent could have written ``identifier``: it occurs in the evidence, or every one of its
    letter and digit runs does (``US9148817941`` from "starts with 'US', numbered 9148817941")."""
    ident = identifier.lower()
    if ident in evidence:
        return True
    parts = re.findall(r"[a-z]+|\d+", ident)
    return bool(parts) and all(p in evidence for p in parts if not (p.isalpha() and len(p) <= 2))


# ---------------------------------------------------------------------------------------------- the filter
Replay = Callable[[Mapping[str, Any], list[list[str]]], float | None]
Execute = Callable[[Mapping[str, Any], list[list[str]]], tuple[list[Any], list[list[str]]]]


class BfclIdentifierFilter:
    """The identifier filter for BFCL multi-turn tasks (built by :func:`envsched.envs.bfcl.build_bfcl_pool`).

    For a trajectory (calls per user turn) with reward at least ``min_reward``: execute it turn by turn in a
    :class:`~envsched.envs.bfcl.BFCLEnvironment` to collect what the agent saw (the user messages of each
    turn and every call's output); a call is suspicious when one of its identifier-like literal arguments
    (:func:`call_identifiers`) appears in none of: the user messages so far, the initial state, the outputs
    of earlier calls. Each suspicious call is then removed and the trajectory replayed with
    :func:`envsched.envs.bfcl.replay_reward`; if the reward drops by more than ``tolerance``, the task is
    flagged.

    Args:
        replay: ``replay(task, calls_per_turn) -> reward | None``; default
            :func:`envsched.envs.bfcl.replay_reward`.
        execute: ``execute(task, calls_per_turn) -> (messages per turn, outputs per turn)``; default
            :func:`bfcl_transcript`.
        min_reward: only trajectories whose replayed reward is at least this are checked.
        tolerance: a reward drop must exceed this to count.
    """

    def __init__(self, replay: Replay | None = None, execute: Execute | None = None, *, min_reward: float = 1.0,
                 tolerance: float = 1e-9) -> None:
        self.replay = replay if replay is not None else replay_reward
        self.execute = execute if execute is not None else bfcl_transcript
        self.min_reward = min_reward
        self.tolerance = tolerance

    def suspicious_actions(self, task: Mapping[str, Any], calls_per_turn: list[list[str]]) -> list[SuspiciousAction]:
        """Calls using identifiers found nowhere in the user turns so far, the initial state or earlier outputs."""
        messages, outputs = self.execute(task, calls_per_turn)
        evidence_parts: list[Any] = [task.get("initial_state", {})]
        found = []
        for t, calls in enumerate(calls_per_turn):
            if t < len(messages):
                evidence_parts.append(messages[t])
            for j, call in enumerate(calls):
                evidence = known_identifiers(*evidence_parts)
                unknown = [x for x in call_identifiers(call) if not _is_known(x, evidence)]
                if unknown:
                    found.append(SuspiciousAction(turn=t, index=j, call=call, identifiers=unknown))
                if t < len(outputs) and j < len(outputs[t]):
                    evidence_parts.append(outputs[t][j])
        return found

    def check(self, task: Mapping[str, Any], trajectory: Trajectory) -> IdentifierVerdict:
        """Replay, find suspicious calls, remove each and replay again; flag if a removal lowers the reward."""
        calls = [list(c) for c in trajectory.calls_per_turn]
        reward = self.replay(task, calls)
        if reward is None:
            return IdentifierVerdict(False, None, [], "the environment cannot score this trajectory")
        if reward < self.min_reward - self.tolerance:
            return IdentifierVerdict(False, reward, [], f"replayed reward {reward:.3g} is below {self.min_reward}")
        suspicious = self.suspicious_actions(task, calls)
        flagged_by: list[SuspiciousAction] = []
        for s in suspicious:
            without = [list(c) for c in calls]
            del without[s.turn][s.index]
            s.reward_without = self.replay(task, without)
            if s.reward_without is not None and s.reward_without < reward - self.tolerance:
                flagged_by.append(s)
        if flagged_by:
            s = flagged_by[0]
            reason = (f"turn {s.turn} call {s.call!r} uses {', '.join(s.identifiers)} (not in the user turns, "
                      f"initial state or earlier outputs); without it the reward falls {reward:.3g} -> "
                      f"{s.reward_without:.3g}")
            return IdentifierVerdict(True, reward, suspicious, reason)
        return IdentifierVerdict(False, reward, suspicious,
                                 "no suspicious action" if not suspicious else "removing the suspicious actions "
                                 "does not lower the reward")


def bfcl_transcript(task: Mapping[str, Any],
                    calls_per_turn: Sequence[Sequence[str]]) -> tuple[list[Any], list[list[str]]]:
    """Execute ``calls_per_turn`` in a fresh :class:`~envsched.envs.bfcl.BFCLEnvironment`, one call per step:
    the user messages of each turn and the output of every call."""
    env = BFCLEnvironment(max_steps_per_turn=10**9)
    messages: list[Any] = []
    outputs: list[list[str]] = []
    try:
        obs = env.reset(task)
        for calls in calls_per_turn:
            if obs is None:
                break
            messages.append(obs.get("messages", []))
            outs = []
            for call in calls:
                res = env.step([call])
                outs.append(str(res.observation["results"][0]))
            outputs.append(outs)
            obs = env.step([]).observation
    finally:
        env.close()
    return messages, outputs
