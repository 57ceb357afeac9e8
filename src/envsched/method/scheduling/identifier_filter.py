"""The identifier filter's interface (paper appendix C): how the scheduler learns that a task's reward depends
on a guessed identifier.

A task whose high reward comes from an action the agent could not have known (an account number that appears
nowhere it could have read) teaches guessing, not tool use. Which actions count, and whether removing one
lowers the reward, is for the environment to decide: only it can replay a trajectory. So the scheduler takes
any object with ``check(task, trajectory) -> IdentifierVerdict`` (:class:`IdentifierFilter`); BFCL multi-turn's
implementation is :class:`envsched.envs.bfcl_identifier_filter.BfclIdentifierFilter`, beside BFCL's
environments. Give a filter to :class:`~envsched.method.sampler.EnvSchedSampler` as ``identifier_filter`` and
report high-reward trajectories with :meth:`EnvSchedSampler.submit_trajectory
<envsched.method.sampler.EnvSchedSampler.submit_trajectory>`; a flagged task leaves exploitation (it stays
eligible for coverage).

The data both sides share -- :class:`~envsched.envs.base.Trajectory`, :class:`~envsched.envs.base.IdentifierVerdict`
and :class:`~envsched.envs.base.SuspiciousAction` -- is defined with the environments that produce it and
importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from envsched.envs.base import IdentifierVerdict, SuspiciousAction, Trajectory

__all__ = ["IdentifierFilter", "IdentifierVerdict", "SuspiciousAction", "Trajectory"]


@runtime_checkable
class IdentifierFilter(Protocol):
    """What the scheduler needs of an identifier filter: an environment that can replay saved trajectories
    decides whether a task is flagged. ``check`` is called with the task's spec and a trajectory whose reward
    reached ``SchedulerConfig.identifier_min_reward``; a verdict with ``flagged=True`` takes the task out of
    exploitation, its ``reason`` recorded (:meth:`EnvSchedSampler.identifier_flags
    <envsched.method.sampler.EnvSchedSampler.identifier_flags>`)."""

    def check(self, task: Mapping[str, Any], trajectory: Trajectory) -> IdentifierVerdict:
        ...
