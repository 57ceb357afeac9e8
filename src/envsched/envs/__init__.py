"""Real environments and the pool builders that turn their corpora into envsched task specs."""

from envsched.envs.base import Environment, EnvironmentUnavailable, InfrastructureError, StepResult

__all__ = ["Environment", "EnvironmentUnavailable", "InfrastructureError", "StepResult"]
