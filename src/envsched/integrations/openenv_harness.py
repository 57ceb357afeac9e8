"""TRL's OpenEnv harness, driven by an envsched :class:`TaskSampler`: multi-turn OpenEnv episodes on the tasks
the sampler draws, with ``AsyncGRPOTrainer``.

Targets TRL 1.16.0 (``trl.experimental.async_grpo.openenv_harness``) with ``openenv`` 0.10.0
(``openenv.core.harness``). TRL's ``HarnessRolloutWorker`` runs its rollout loop ``_HarnessRolloutLoop`` in the
spawned child: each rollout opens a session with ``factory.create(task, seed=group_id, episode_id=...)`` of an
OpenEnv ``ResourceSessionFactory``, plays the episode (with a ``harness_adapter`` such as ``MCPHarnessAdapter``,
TRL samples every turn from the vLLM server and the adapter calls the session's tools), and scores it with
``session.verify(...)``'s environment reward. Left alone, the loop walks the dataset in order and hands the
factory the dataset row's ``prompt`` as the task, so the factory (not the trainer) picks the task.

With ``EnvSchedAsyncGRPOTrainer(..., harness_session_factory=...)`` (see :mod:`envsched.integrations.trl_async`):

* :class:`EnvSchedHarnessRolloutLoop` draws every group from the trainer's sampler (the same draw channel as the
  plain path), and the trainer sends the drawn **task spec** along with the row; its ``_generate_one`` passes
  that spec as the ``task`` of ``factory.create`` (TRL passes the ``prompt`` argument there unchanged,
  :func:`check_harness_hooks` guards it), so every rollout of a group runs the task the sampler chose, with the
  same ``seed`` (the group id: TRL's rule that a group's rollouts select the same task);
* feedback, stale discards, zero-signal filtering, metrics and checkpoints are the plain path's (the group
  header is sent by the same ``_score_group``): each episode group's rewards reach ``sampler.update`` once its
  last row has passed TRL's staleness check, a group TRL drops as stale is released with ``discard``, an
  unscorable episode (a session that failed) reaches the sampler as ``None``.

:class:`OpenEnvTaskSessionFactory` is a ``ResourceSessionFactory`` for envsched's own OpenEnv server
(:mod:`envsched.envs.openenv_server`): ``create(task, seed, episode_id)`` opens a WebSocket session and sends
``reset(split=task["split"], index=task["index"], seed=seed, episode_id=episode_id)`` (a task without
``split``/``index`` is looked up by ``id`` in the server's Task API), checks that the environment started the
task asked for, and exposes the environment's action as one ``answer`` tool; ``verify`` forwards the
environment's reward, after submitting the last assistant message as the answer when the episode is not over
(one-turn question/answer environments: a reply without a tool call is the answer).

The row's ``prompt`` (``task_to_row``) is what TRL logs as the rollout's prompt; the model sees the session's
``initial_messages()``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from openenv.core.env_server.mcp_types import Tool
from openenv.core.harness import ResourceSession, ResourceSessionFactory, ToolResult, VerifyResult
from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker, _HarnessRolloutLoop

from envsched.envs.openenv import InvalidActionError, OpenEnvEnvironment, TaskAPIClient
from envsched.integrations._async_rollout import EnvSchedRolloutLoop, EnvSchedRolloutWorker
from envsched.integrations._trl_hooks import check_hooks

__all__ = [
    "ANSWER_TOOL",
    "EnvSchedHarnessRolloutLoop",
    "EnvSchedHarnessRolloutWorker",
    "OpenEnvTaskSession",
    "OpenEnvTaskSessionFactory",
    "check_harness_hooks",
]

#: Private hooks of TRL's harness this module relies on: class -> {name: parameter names after self}.
_HOOKS: dict[type, dict[str, tuple[str, ...] | None]] = {
    _HarnessRolloutLoop: {"_generate_one": ("prompt", "tool_dict", "tools", "group_id"),
                          "_run_session": ("prompt", "group_id"),
                          "__init__": ("harness_session_factory", "harness_adapter", "rollout_reward_fn",
                                       "lossless_capture", "loop_kwargs")},
    HarnessRolloutWorker: {"_loop_cls": None},
}
#: Source fragments the task routing depends on: (class, method, fragment, why).
_SOURCE_CHECKS = [
    (_HarnessRolloutLoop, "_generate_one", "self._run_session, prompt, group_id",
     "the rollout's prompt argument reaches the session"),
    (_HarnessRolloutLoop, "_run_session", "seed = group_id", "a group's rollouts share the seed"),
    (_HarnessRolloutLoop, "_run_session", "self._factory.create(prompt, seed=seed",
     "the prompt argument is the factory's task"),
]


def check_harness_hooks() -> None:
    """Refuse a TRL whose OpenEnv harness differs from what this module relies on (``_HOOKS``,
    ``_SOURCE_CHECKS``): ``RuntimeError`` naming the installed and the supported versions
    (:func:`~envsched.integrations._trl_hooks.check_hooks`)."""
    check_hooks("envsched.integrations.openenv_harness", _HOOKS, _SOURCE_CHECKS, subject="'s OpenEnv harness")


# ---------------------------------------------------------------------------------------------- TRL side
class EnvSchedHarnessRolloutLoop(EnvSchedRolloutLoop, _HarnessRolloutLoop):
    """TRL's harness rollout loop (in the spawned child) drawing its groups from the trainer's sampler: the drawn
    task spec is the ``task`` every rollout of the group creates its session with."""

    async def _generate_one(self, prompt: Any, tool_dict: Any, tools: Any, group_id: int = 0) -> Any:
        try:
            task = self._es_tasks[group_id]
        except KeyError:
            raise RuntimeError(f"envsched: group {group_id} has no drawn task spec (the trainer did not send it: "
                               "build the trainer with harness_session_factory=)") from None
        return await super()._generate_one(task, tool_dict, tools, group_id)

    async def _score_group(self, group: Any) -> list[Any]:
        try:
            return await super()._score_group(group)
        finally:
            self._es_tasks.pop(int(group.group_id), None)


class EnvSchedHarnessRolloutWorker(EnvSchedRolloutWorker, HarnessRolloutWorker):
    """TRL's ``HarnessRolloutWorker`` running :class:`EnvSchedHarnessRolloutLoop` (and draining on stop like
    :class:`~envsched.integrations.trl_async.EnvSchedRolloutWorker`); the trainer builds it in place of TRL's
    worker when given ``harness_session_factory=`` (its ``harness_rollout_worker_class``)."""

    _loop_cls = EnvSchedHarnessRolloutLoop


# ---------------------------------------------------------------------------------------------- OpenEnv side
ANSWER_TOOL = Tool(name="answer", description="Submit your final answer to the task; this ends the episode.",
                   input_schema={"type": "object", "properties": {"answer": {"type": "string",
                                                                              "description": "the answer"}},
                                 "required": ["answer"]})


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


class OpenEnvTaskSession(ResourceSession):
    """One episode of a task on envsched's OpenEnv server (see the module docstring); built by
    :class:`OpenEnvTaskSessionFactory`. ``task_id`` is the id of the task the environment started (from its
    ``reset`` observation)."""

    def __init__(self, env: OpenEnvEnvironment, task: Mapping[str, Any], seed: int | None,
                 system_prompt: str | None = None, answer_from_final_message: bool = True,
                 episode_id: str | None = None, log: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.env = env
        self.task = task
        self.seed = seed
        self.episode_id = episode_id
        self._log = log
        self.answer_from_final_message = answer_from_final_message
        obs = env.reset(task, seed)
        if not isinstance(obs, Mapping):
            env.close()
            raise TypeError(f"the environment's reset observation is a {type(obs).__name__}, not a mapping")
        self.task_id = obs.get("task_id")
        if task.get("id") is not None and self.task_id != task["id"]:
            env.close()
            raise RuntimeError(f"the environment started task {self.task_id!r}, not the drawn task {task['id']!r} "
                               "(its split/index differ on this server)")
        self._messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
            [{"role": "user", "content": str(obs.get("prompt") or "")}]
        self.answered_by: str | None = None
        self._closed = False
        if log is not None:
            log({"event": "reset", "task_id": self.task_id, "requested": task.get("id"), "seed": seed,
                 "episode_id": episode_id})

    def initial_messages(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self._messages]

    def list_tools(self) -> list[Tool]:
        return [ANSWER_TOOL]

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name != ANSWER_TOOL.name:
            return ToolResult(data=f"unknown tool {name!r}; the only tool is 'answer'", error="unknown tool")
        if self.env.final_reward() is not None or self.answered_by is not None:
            return ToolResult(data="the episode is over", done=True, error="episode over")
        answer = arguments.get("answer")
        if not isinstance(answer, str):
            return ToolResult(data="'answer' must be a string", error="bad arguments")
        try:
            step = self.env.step(answer)
        except InvalidActionError as exc:  # the policy's fault: tell the model, the episode goes on
            return ToolResult(data=str(exc), error="invalid action")
        self.answered_by = "tool"
        return ToolResult(data={"feedback": step.observation.get("feedback") if isinstance(step.observation,
                                                                                             Mapping) else None,
                                "reward": step.reward, "done": step.done},
                          done=bool(step.done), metadata={"reward": step.reward})

    def verify(self, transcript: list[dict[str, Any]], final_state: Any | None = None) -> VerifyResult:
        if self._closed and self.answered_by is None:
            raise RuntimeError("the session was closed before it was verified (the rollout worker is stopping)")
        if self.answered_by is None and self.answer_from_final_message:
            replies = [m for m in transcript if isinstance(m, Mapping) and m.get("role") == "assistant"]
            self.env.step(_text(replies[-1].get("content")) if replies else "")
            self.answered_by = "final_message"
        reward = self.env.final_reward()
        if self._log is not None:
            self._log({"event": "verify", "task_id": self.task_id, "seed": self.seed, "episode_id": self.episode_id,
                       "env_reward": reward, "answered_by": self.answered_by})
        return VerifyResult(env_reward=reward, done=self.answered_by is not None,
                            metrics={"task_id": self.task_id, "answered_by": self.answered_by,
                                     "steps": self.env.steps})

    def close(self) -> None:
        self._closed = True
        self.env.close()


class OpenEnvTaskSessionFactory(ResourceSessionFactory):
    """An OpenEnv ``ResourceSessionFactory`` for envsched's OpenEnv server: ``create(task, seed, episode_id)``
    starts an episode of ``task`` (a task spec; its ``split``/``index`` select it, or else its ``id`` looked up in
    the server's Task API) with ``seed``.

    Args:
        base_url: the server (``http://127.0.0.1:8765`` etc.).
        env_name: its Task API name (needed only for tasks without ``split``/``index``; default ``envsched_pool``).
        system_prompt: an optional system message before the task's prompt.
        answer_from_final_message: ``verify`` submits the last assistant message as the answer when the model did
            not call the ``answer`` tool (default True).
        log_path: append one JSON line per started episode (``{"event": "reset", "task_id"`` as the environment
            reported it, ``"requested"`` id, ``"seed"``, ``"episode_id"}``) and one per verified episode
            (``{"event": "verify", ..., "env_reward", "answered_by"}``): a record of what the environment ran.
        sampling: TRL's loop-owning mode passes its sampling policy; unused (this factory serves white-box
            harnesses such as ``MCPHarnessAdapter``).
        connect_timeout_s, message_timeout_s: WebSocket timeouts (see :class:`OpenEnvEnvironment`).

    Picklable through ``functools.partial`` (TRL pickles it into the rollout child).
    """

    def __init__(self, base_url: str, env_name: str | None = None, *, system_prompt: str | None = None,
                 answer_from_final_message: bool = True, log_path: str | None = None, sampling: Any = None,
                 connect_timeout_s: float = 10.0, message_timeout_s: float = 60.0) -> None:
        self.base_url = base_url
        self.env_name = env_name or "envsched_pool"
        self.system_prompt = system_prompt
        self.answer_from_final_message = bool(answer_from_final_message)
        self.log_path = log_path
        self.sampling = sampling
        self.connect_timeout_s = connect_timeout_s
        self.message_timeout_s = message_timeout_s
        self._lock = threading.Lock()
        self._where: dict[str, tuple[str, int]] | None = None

    def _select(self, task: Any) -> Mapping[str, Any]:
        if not isinstance(task, Mapping):
            raise TypeError(f"a task spec (a mapping) is needed, got {type(task).__name__}: build the trainer with "
                            "harness_session_factory= so the sampler's task reaches the factory")
        if task.get("split") is not None and task.get("index") is not None:
            return task
        if task.get("id") is None:
            raise ValueError("a task without split/index needs an id to be looked up in the Task API")
        with self._lock:
            if self._where is None:
                client = TaskAPIClient(self.base_url, self.env_name)
                self._where = {t["id"]: (s["name"] if isinstance(s, Mapping) else str(s), int(t["index"]))
                               for s in client.list_splits()
                               for t in client.iter_tasks(s["name"] if isinstance(s, Mapping) else str(s))}
        try:
            split, index = self._where[task["id"]]
        except KeyError:
            raise LookupError(f"task {task['id']!r} is not served by {self.base_url}") from None
        return {**task, "split": split, "index": index}

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> OpenEnvTaskSession:
        selected = self._select(task)
        env = OpenEnvEnvironment(self.base_url, self.env_name, connect_timeout_s=self.connect_timeout_s,
                                 message_timeout_s=self.message_timeout_s,
                                 reset_kwargs={"episode_id": episode_id} if episode_id is not None else None)
        return OpenEnvTaskSession(env, selected, seed, self.system_prompt, self.answer_from_final_message,
                                  episode_id, self._write_log if self.log_path else None)

    def _write_log(self, entry: dict[str, Any]) -> None:
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())  # one write per line: whole lines across threads
        finally:
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
