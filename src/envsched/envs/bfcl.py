"""BFCL multi-turn (PyPI ``bfcl-eval``, Apache-2.0): task pool and in-process episodes.

BFCL's multi-turn categories (``multi_turn_base``, ``multi_turn_miss_func``, ``multi_turn_miss_param``,
``multi_turn_long_context``; 200 questions each in ``bfcl-eval`` 2026.3.23) run against eight executable
Python classes (file system, math, messaging, posting, tickets, trading, travel, vehicle control) and are
scored by the package's own ``multi_turn_checker`` (per-turn state and execution-response checks against a
replay of the ground-truth calls). Everything here reads the installed package; nothing is copied.

Install without the gigabytes of optional ML dependencies (CUDA torch etc.) that the full install pulls::

    pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0

**Environment of a task.** Every task is in exactly one environment: one of its ``involved_classes``.
BFCL pairs one of four main backends (file system, trading, travel, vehicle control; 200 tasks each) with at
most one auxiliary API (math, tickets, posting, messaging). A task belongs to the involved class that the
fewest multi-turn tasks involve, by the fixed precedence :data:`ENV_PRECEDENCE` (MathAPI < TicketAPI <
TwitterAPI < MessageAPI < GorillaFileSystem < TradingBot < TravelAPI < VehicleControlAPI, from the 800
tasks of ``bfcl-eval`` 2026.3.23): a paired task goes to its auxiliary API, a single-class task to its
class. So every class is an environment and sizes stay balanced (52 to 160 tasks); the task's ``tools``
still list the operations of all its involved classes.

**Episode protocol** (:class:`BFCLEnvironment`), as BFCL's own inference loop: an episode has the task's
user turns; within a turn the policy takes any number of steps, each a list of call strings in BFCL's
syntax (``"cd(folder='document')"``), executed with the package's ``execute_multi_turn_func_call`` against
class instances created from the task's initial configuration and kept for the episode. A step that is an
empty list, ``None`` or a text reply (``str``) ends the current turn; the observation is then the next user
turn, and after the last turn ``StepResult(done=True, reward=final_reward())``. More than
``max_steps_per_turn`` (BFCL's ``MAXIMUM_STEP_LIMIT``, 20) steps in a turn force-terminates the episode,
which BFCL scores 0. ``final_reward()`` runs ``multi_turn_checker`` on the calls of the episode: 1.0 or
0.0, or ``None`` when the checker itself fails (the reason is in :attr:`BFCLEnvironment.last_check`).

Security: BFCL's executor ``eval``s call strings. Before anything reaches it, each call is parsed and only a
plain call of a documented function of the task's involved classes, with literal arguments, is let through;
others get an error result and are left out of the record the checker re-executes. As in BFCL, a function
held out by ``miss_func`` is not shown before its turn but executes if called.

Bounded work: a call string is at most :data:`MAX_CALL_CHARS` characters, a step at most
:data:`MAX_CALLS_PER_STEP` calls, literal arguments at most :data:`MAX_LITERAL_DEPTH` levels deep with
:data:`MAX_LITERAL_ITEMS` items in all and integers of magnitude below :data:`MAX_LITERAL_INT` (others are
refused with an error result, as above). Calls run in a worker process (one per episode, reused by later
episodes when it ends cleanly), each under ``call_timeout_s`` seconds and ``call_memory_mb`` MiB of extra
address space and under the deadline :meth:`BFCLEnvironment.set_deadline` sets (the evaluation harness
sets its episode deadline). A call that exceeds its budget is killed and ends the episode, scored 0: the
policy's failure (``info["terminated"]`` says why), never an infrastructure failure. The final check, which
replays every call, runs under the same deadline: when the deadline passes during it, the check is killed and
:class:`BFCLDeadlineExceeded` (an :class:`~envsched.envs.base.InfrastructureError`) is raised from the step
that ended the episode, so an episode never runs past its deadline and is not scored by a cut-off check.
"""

from __future__ import annotations

import ast
import copy
import decimal
import json
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from envsched.envs._bfcl_package import (
    BFCL_INSTALL,
    BFCL_VERSION,
    MULTI_TURN_CATEGORIES,
    _bfcl,
    _entry,
    _func_docs,
    bfcl_available,
)
from envsched.envs._bfcl_worker import _CallWorker
from envsched.envs.base import Environment, InfrastructureError, StepResult
from envsched.envs.bfcl_pool import ENV_PRECEDENCE, build_bfcl_pool, ground_truth_calls
from envsched.validation import check_int, check_number, is_int

__all__ = [
    "BFCL_INSTALL",
    "BFCL_VERSION",
    "ENV_PRECEDENCE",
    "MAX_CALLS_PER_STEP",
    "MAX_CALL_CHARS",
    "MAX_LITERAL_DEPTH",
    "MAX_LITERAL_INT",
    "MAX_LITERAL_ITEMS",
    "MULTI_TURN_CATEGORIES",
    "BFCLDeadlineExceeded",
    "BFCLEnvironment",
    "bfcl_available",
    "build_bfcl_pool",
    "ground_truth_calls",
    "replay_reward",
]

#: Limits on what one step may ask BFCL to execute (see the module docstring).
MAX_CALL_CHARS = 100_000
MAX_CALLS_PER_STEP = 64
MAX_LITERAL_DEPTH = 16
MAX_LITERAL_ITEMS = 10_000
MAX_LITERAL_INT = 2**63
_FORBIDDEN = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})


# ---------------------------------------------------------------------------------------------- call checks
def _literal_problem(node: ast.AST) -> str | None:
    """Why a call argument is not a bounded literal (see the limits), else ``None``."""
    stack: list[tuple[ast.AST, int]] = [(node, 1)]
    items = 0
    while stack:
        n, depth = stack.pop()
        items += 1
        if depth > MAX_LITERAL_DEPTH:
            return f"literal arguments may nest at most {MAX_LITERAL_DEPTH} levels"
        if items > MAX_LITERAL_ITEMS:
            return f"literal arguments may hold at most {MAX_LITERAL_ITEMS} items"
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub | ast.UAdd):
            if not (isinstance(n.operand, ast.Constant) and isinstance(n.operand.value, int | float)):
                return "a sign may only precede a number"
            stack.append((n.operand, depth))
        elif isinstance(n, ast.Constant):
            v = n.value
            if is_int(v, numpy=False) and abs(v) >= MAX_LITERAL_INT:
                return f"integer arguments must be smaller than 2**63 in magnitude (got {len(str(abs(v)))} digits)"
        elif isinstance(n, ast.List | ast.Tuple | ast.Set):
            stack.extend((e, depth + 1) for e in n.elts)
        elif isinstance(n, ast.Dict):
            if any(k is None for k in n.keys):
                return "**unpacking is not allowed in a literal"
            stack.extend((e, depth + 1) for e in [*n.keys, *n.values] if e is not None)
        else:
            return "arguments must be literals (strings, numbers, lists, dicts, booleans, None)"
    return None


def _safe_call(call: Any, allowed: set[str]) -> str | None:
    """``None`` if ``call`` may be executed; else why not."""
    if not isinstance(call, str) or not call.strip():
        return f"a call must be a non-empty string, got {call!r:.80}"
    if len(call) > MAX_CALL_CHARS:
        return f"the call is {len(call)} characters long, more than the limit of {MAX_CALL_CHARS}"
    try:
        node = ast.parse(call.strip(), mode="eval").body
    except SyntaxError as exc:
        return f"invalid call syntax: {exc.msg}"
    except (MemoryError, RecursionError, ValueError):
        return "invalid call syntax: the call is nested too deeply"
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return "not a plain function call"
    if node.func.id not in allowed:
        return f"no such function available: {node.func.id}"
    if node.func.id in _FORBIDDEN:
        return f"Function call {node.func.id} is not allowed."
    for kw in node.keywords:
        if kw.arg is None:
            return "**kwargs is not allowed"
    for arg in [*node.args, *(kw.value for kw in node.keywords)]:
        why = _literal_problem(arg)
        if why is not None:
            return why
    try:
        for arg in [*node.args, *(kw.value for kw in node.keywords)]:
            ast.literal_eval(arg)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return "arguments must be literals (strings, numbers, lists, dicts, booleans, None)"
    return None


# ---------------------------------------------------------------------------------------------- episodes
class BFCLDeadlineExceeded(InfrastructureError):
    """The episode deadline (:meth:`BFCLEnvironment.set_deadline`) passed during BFCL's final check: the
    episode is not scored (a timeout of the infrastructure, as the evaluation harness treats its own)."""


class BFCLEnvironment(Environment):
    """Runs BFCL multi-turn episodes in process against fresh instances of the package's classes.

    See the module docstring for the step protocol. ``reset`` returns a dict: ``turn`` (0-based),
    ``num_turns``, ``messages`` (the user messages of the turn), ``tools`` (the function docs available
    now) and ``new_tools`` (docs added at this turn, ``miss_func``). A call step returns
    ``{"turn", "results"}`` (one execution result string per call); an end-of-turn step returns the next
    turn's observation (with ``done=True`` and the reward after the last turn).

    Not thread-safe per instance; use one instance per concurrent episode.
    """

    name = "bfcl"

    def __init__(self, *, max_steps_per_turn: int | None = None, call_timeout_s: float = 2.0,
                 call_memory_mb: int = 1024, check_timeout_s: float = 60.0) -> None:
        self._b = _bfcl()
        self.max_steps_per_turn = (check_int(max_steps_per_turn, "max_steps_per_turn", low=1)
                                   if max_steps_per_turn is not None else int(self._b.max_steps))
        check_number(call_timeout_s, "call_timeout_s", low=0, low_open=True, finite=False)
        check_number(check_timeout_s, "check_timeout_s", low=0, low_open=True, finite=False)
        check_int(call_memory_mb, "call_memory_mb", low=1)
        #: Seconds one call may run, MiB of memory it may add, seconds the final check may run.
        self.call_timeout_s = float(call_timeout_s)
        self.call_memory_mb = int(call_memory_mb)
        self.check_timeout_s = float(check_timeout_s)
        self._deadline: float | None = None
        self._worker: _CallWorker | None = None
        self._entry: dict[str, Any] | None = None
        self._model_name = ""
        self._finalizer: weakref.finalize | None = None
        self._decimal = decimal.Context()
        self._calls: list[list[list[str]]] = []
        self._turn = 0
        self._steps_in_turn = 0
        self._done = False
        self._terminated: str | None = None
        self._available: set[str] = set()
        self._executable: set[str] = set()
        self._reward: float | None = None
        self._scored = False
        #: The last checker verdict: ``{"valid": bool, ...}`` or ``{"error": ...}`` when it could not score.
        self.last_check: dict[str, Any] = {}

    # ------------------------------------------------------------------ protocol
    def reset(self, task: Mapping[str, Any] | str, seed: int | None = None) -> dict[str, Any]:
        """Start an episode of ``task`` (a spec from :func:`build_bfcl_pool` or a BFCL entry id).

        ``seed`` is accepted for the interface and unused: BFCL episodes are deterministic.
        """
        entry = _entry(task)
        self._cleanup()
        self._entry = entry
        self._model_name = f"envsched_{uuid.uuid4().hex}"
        self._worker = _CallWorker.get(self.call_memory_mb * 2**20)
        # An abandoned episode's worker is stopped when this object is garbage-collected.
        self._finalizer = weakref.finalize(self, _CallWorker.kill, self._worker)
        self._finalizer.atexit = False
        status, why = self._worker.request(("begin", entry, self._model_name), 60.0)
        if status != "ok":
            self._cleanup()
            raise RuntimeError(f"BFCL call worker failed to start the episode: {why}")
        self._decimal = decimal.Context()
        self._calls = [[] for _ in entry["question"]]
        self._turn = 0
        self._steps_in_turn = 0
        self._done = False
        self._terminated = None
        self._reward = None
        self._scored = False
        self.last_check = {}
        missed = {n for names in (entry.get("missed_function") or {}).values() for n in names}
        # What the policy is shown excludes the held-out functions of ``miss_func`` until their turn ...
        self._available = {d["name"] for c in entry["involved_classes"] for d in _func_docs(c)} - missed
        # ... but, as in BFCL's executor, every documented function of the involved classes executes
        # (the ground truth of multi_turn_miss_func_49 calls a held-out function two turns early).
        self._executable = {d["name"] for c in entry["involved_classes"] for d in _func_docs(c)}
        return self._turn_observation()

    def step(self, action: Sequence[str] | str | None) -> StepResult:
        """One step of the current turn: a list of call strings, or end of turn (``[]``/``None``/text)."""
        if self._entry is None:
            raise RuntimeError("call reset(task) before step()")
        if self._done:
            raise RuntimeError("the episode is over; call reset(task) to start another")
        if action is None or isinstance(action, str) or (isinstance(action, Sequence) and len(action) == 0):
            return self._end_turn()
        if not isinstance(action, Sequence) or not all(isinstance(c, str) for c in action):
            raise TypeError("a BFCL action is a list of call strings (or [] / None / a text reply to end the turn)")
        if len(action) > MAX_CALLS_PER_STEP:
            return self._terminate(f"a step of {len(action)} calls, more than the limit of {MAX_CALLS_PER_STEP}")
        self._steps_in_turn += 1
        if self._steps_in_turn > self.max_steps_per_turn:
            self._done = True
            self._terminated = f"force-terminated: more than {self.max_steps_per_turn} steps in turn {self._turn}"
            reward = self.final_reward()
            return StepResult(observation={"turn": self._turn, "results": []}, reward=reward, done=True,
                              info={"terminated": self._terminated})
        results: list[str | None] = [None] * len(action)
        runnable: list[str] = []
        positions: list[int] = []
        for i, call in enumerate(action):
            why = _safe_call(call, self._executable)
            if why is None:
                runnable.append(call.strip())
                positions.append(i)
            else:
                results[i] = f"Error during execution: {why}"
        if runnable:
            self._calls[self._turn].append(runnable)
            for pos, call in zip(positions, runnable, strict=True):
                status, out = self._run_call(call)
                if status == "budget":
                    return self._terminate(f"call {call[:80]!r}: {out}")
                if status != "ok":
                    raise RuntimeError(f"BFCL failed executing {call[:80]!r}: {out}")
                results[pos] = out[0] if len(out) == 1 else json.dumps(out)
        return StepResult(observation={"turn": self._turn, "results": results}, done=False,
                          info={"rejected": len(action) - len(runnable)})

    def set_deadline(self, deadline: float | None) -> None:
        """Bound every later call by ``deadline`` (a :func:`time.monotonic` instant; ``None``: no deadline).
        A call still running at the deadline is killed and the episode ends, scored 0."""
        self._deadline = deadline

    def _run_call(self, call: str) -> tuple[str, Any]:
        assert self._worker is not None
        timeout, what = self.call_timeout_s, None
        if self._deadline is not None and self._deadline - time.monotonic() < timeout:
            timeout, what = self._deadline - time.monotonic(), "the episode deadline passed during the call"
        if timeout <= 0:
            return "budget", "the episode deadline passed before the call"
        status, out = self._worker.request(("call", call, self._long_context()), timeout)
        if status == "budget" and what is not None and out.startswith("the call took longer"):
            out = what
        return status, out

    def _terminate(self, reason: str) -> StepResult:
        """End the episode as the policy's failure (a call over its budget, a step over the limits)."""
        self._done = True
        self._terminated = f"terminated: {reason}"
        reward = self.final_reward()
        return StepResult(observation={"turn": self._turn, "results": []}, reward=reward, done=True,
                          info={"terminated": self._terminated})

    def final_reward(self) -> float | None:
        """BFCL's ``multi_turn_checker`` verdict on the episode's calls: 1.0, 0.0, or None if it failed."""
        if self._entry is None:
            raise RuntimeError("call reset(task) first")
        if self._scored:
            return self._reward
        self._scored = True
        if self._terminated is not None or self._turn < len(self._entry["question"]):
            reason = self._terminated or (f"episode ended after {self._turn} of "
                                          f"{len(self._entry['question'])} turns")
            self.last_check = {"valid": False, "error_type": "multi_turn:force_terminated",
                               "error_message": reason}
            self._reward = 0.0
            return self._reward
        try:
            self._reward, self.last_check = self._remote_check()
        finally:
            self._cleanup()
        return self._reward

    def _remote_check(self) -> tuple[float | None, dict[str, Any]]:
        """BFCL's checker, run in the worker (it re-executes the calls) under ``check_timeout_s`` plus one
        call budget per call it replays."""
        assert self._entry is not None
        if self._worker is None:
            return None, {"error": "the episode's worker is gone"}
        replayed = sum(len(step) for turn in self._calls for step in turn)
        replayed += sum(len(t) for t in self._entry["ground_truth"])
        budget = self.check_timeout_s + self.call_timeout_s * replayed
        cut_by_deadline = False
        if self._deadline is not None and self._deadline - time.monotonic() <= budget:
            budget, cut_by_deadline = self._deadline - time.monotonic(), True
        if budget <= 0:
            status, out = "budget", "the call took longer than its budget"
        else:
            status, out = self._worker.request(("check", self._calls), budget)
        if status == "ok":
            return out[0], out[1]
        if cut_by_deadline and status == "budget" and out.startswith("the call took longer"):
            why = (f"the episode deadline passed during BFCL's final check (it replays the episode's {replayed} "
                   "calls and the ground truth's)")
            self.last_check = {"error": why, "timeout": True}
            raise BFCLDeadlineExceeded(why)
        return None, {"error": f"the checker could not score the episode: {out}"}

    def close(self) -> None:
        self._cleanup()

    # ------------------------------------------------------------------ helpers
    @property
    def calls(self) -> list[list[list[str]]]:
        """The executed calls so far: per turn, per step, the call strings."""
        return copy.deepcopy(self._calls)

    def trajectory(self) -> Any:
        """The finished episode as a :class:`~envsched.envs.base.Trajectory`, what the identifier filter reads
        (each turn's executed calls in order, and the final reward), for
        ``EnvSchedSampler.submit_trajectory(task, env.trajectory())``. ``None`` when the checker could not
        score the episode; ``RuntimeError`` before the episode is over."""
        from envsched.envs.base import Trajectory

        if self._entry is None or not self._done:
            raise RuntimeError("trajectory() needs a finished episode (reset, then step until done)")
        reward = self.final_reward()
        if reward is None:
            return None
        return Trajectory(calls_per_turn=[[c for step in turn for c in step] for turn in self._calls],
                          reward=float(reward), meta={"task_id": self._entry["id"]})

    def _long_context(self) -> bool:
        assert self._entry is not None
        return "long_context" in self._entry["id"] or "composite" in self._entry["id"]

    def _turn_observation(self) -> dict[str, Any]:
        assert self._entry is not None
        entry = self._entry
        messages = list(entry["question"][self._turn])
        new_names = list((entry.get("missed_function") or {}).get(str(self._turn), []))
        if new_names:
            self._available |= set(new_names)
            if not messages:
                messages = [{"role": "user", "content": self._b.added_functions_prompt}]
        docs = [d for c in entry["involved_classes"] for d in _func_docs(c)]
        return {
            "turn": self._turn,
            "num_turns": len(entry["question"]),
            "messages": messages,
            "tools": [d for d in docs if d["name"] in self._available],
            "new_tools": [d for d in docs if d["name"] in new_names],
        }

    def _end_turn(self) -> StepResult:
        assert self._entry is not None
        self._turn += 1
        self._steps_in_turn = 0
        if self._turn >= len(self._entry["question"]):
            self._done = True
            reward = self.final_reward()
            return StepResult(observation=None, reward=reward, done=True, info={"check": self.last_check})
        return StepResult(observation=self._turn_observation(), done=False)

    def _cleanup(self) -> None:
        """End the episode's use of its worker: a worker that finished cleanly goes back to the idle list
        (its next episode starts with ``begin``, which drops this episode's instances); a dead one is gone."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._worker is not None:
            self._worker.release()
            self._worker = None


def replay_reward(task: Mapping[str, Any] | str, calls_per_turn: Sequence[Sequence[Any]],
                  *, return_info: bool = False) -> float | tuple[float | None, dict[str, Any]] | None:
    """Run a whole trajectory through :class:`BFCLEnvironment` and return its final reward.

    ``calls_per_turn[t]`` holds turn ``t``'s calls: either a flat list of call strings (one step) or a
    list of steps, each a list of call strings. Missing turns count as not taken (BFCL scores the
    episode 0). With ``return_info=True`` returns ``(reward, checker verdict)``.
    """
    entry = _entry(task)
    if len(calls_per_turn) > len(entry["question"]):
        raise ValueError(f"{len(calls_per_turn)} turns of calls for a task with {len(entry['question'])} turns")
    env = BFCLEnvironment(max_steps_per_turn=10**9)
    try:
        env.reset(entry["id"])
        result: StepResult | None = None
        for t in range(len(entry["question"])):
            turn = calls_per_turn[t] if t < len(calls_per_turn) else None
            if turn is None:
                break
            steps = [turn] if all(isinstance(c, str) for c in turn) else list(turn)
            for step in steps:
                if step:
                    env.step(list(step))
            result = env.step([])
        reward = result.reward if result is not None and result.done else env.final_reward()
        return (reward, dict(env.last_check)) if return_info else reward
    finally:
        env.close()
