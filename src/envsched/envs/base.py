"""The environment runner interface: how envsched runs an episode of a task in a real environment.

An :class:`Environment` hosts the tasks of one or more environments. A runner resets it on a task spec
(optionally with a seed), steps it with the policy's actions (a tool call, a list of calls or a text
answer, as the environment documents) and reads the final reward from the environment's own verifier.
A final reward of ``None`` means the environment could not score the episode (its own failure, RFC 013);
a failure of the infrastructure (connection lost, capacity reached, timeout) raises
:class:`InfrastructureError` instead, so that callers keep the two apart.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from envsched.errors import EnvSchedError

__all__ = ["Environment", "EnvironmentUnavailable", "IdentifierVerdict", "InfrastructureError", "StepResult",
           "SuspiciousAction", "Trajectory"]


class InfrastructureError(EnvSchedError, RuntimeError):
    """The environment's infrastructure failed (connection lost, capacity reached, timeout, server error).

    Not the policy's fault and not a score: evaluation reports it as ``infra_error_rate`` and retries it.
    """


class EnvironmentUnavailable(EnvSchedError, ImportError):
    """An optional environment package is not installed; the message says how to install it."""


@dataclass
class Trajectory:
    """A saved trajectory: the agent's actions, grouped by user turn, and the reward it earned.

    For BFCL each action is a Python-syntax function call string, e.g. ``"cd(folder='documents')"``.
    Environments produce it (e.g. ``BFCLEnvironment.trajectory()``) and an identifier filter reads it
    (:class:`envsched.method.scheduling.identifier_filter.IdentifierFilter`, the scheduler's interface); it
    lives here, in the lower layer, so that environments need not import the scheduler.
    """

    calls_per_turn: list[list[str]]
    reward: float
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class SuspiciousAction:
    """One action of a trajectory whose identifiers appear nowhere the agent could have seen them, and the
    reward of the trajectory replayed without it (``None`` until replayed, or if the replay cannot score)."""

    turn: int
    index: int
    call: str
    identifiers: list[str]
    reward_without: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "index": self.index, "call": self.call, "identifiers": self.identifiers,
                "reward_without": self.reward_without}


@dataclass
class IdentifierVerdict:
    """What an identifier filter concluded about one trajectory: whether the task is flagged, the replayed
    reward, the suspicious actions and why. Defined here, beside :class:`Trajectory`, so that an environment's
    filter (e.g. :class:`envsched.envs.bfcl_identifier_filter.BfclIdentifierFilter`) returns it without
    importing the scheduler that reads it."""

    flagged: bool
    reward: float | None
    suspicious: list[SuspiciousAction]
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"flagged": self.flagged, "reward": self.reward, "reason": self.reason,
                "suspicious": [s.as_dict() for s in self.suspicious]}


@dataclass
class StepResult:
    """What one step returns."""

    observation: Any
    reward: float | None = None
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment(ABC):
    """A runner over one kind of executable environment.

    Call order: :meth:`reset` once per episode, then :meth:`step` until ``done``, then
    :meth:`final_reward`. :meth:`close` releases resources; environments are context managers.
    """

    #: Short name used in CLI specs and records (``"bfcl"``, ``"reasoning_gym"``, ``"openenv"``...).
    name: str = "environment"

    @abstractmethod
    def reset(self, task: Mapping[str, Any], seed: int | None = None) -> Any:
        """Start an episode of ``task``; return the first observation (what the agent sees)."""

    @abstractmethod
    def step(self, action: Any) -> StepResult:
        """Apply one action of the policy."""

    @abstractmethod
    def final_reward(self) -> float | None:
        """The environment's own verdict on the episode, or ``None`` if it cannot score it."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (connections, processes)."""

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
