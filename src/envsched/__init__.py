"""envsched: environment-aware task scheduling for reinforcement learning of LLM agents.

The core API is RFC 013's :class:`~envsched.samplers.TaskSampler` protocol; :class:`~envsched.pool.TaskPool`
holds the (environment, task) pairs a sampler chooses from.
"""

from envsched.pool import TaskPool, TaskSpecError
from envsched.samplers import (
    BaseSampler,
    CurriculumSampler,
    SequentialSampler,
    TaskSampler,
    UniformSampler,
)

__version__ = "0.1.0"

__all__ = [
    "BaseSampler",
    "CurriculumSampler",
    "SequentialSampler",
    "TaskPool",
    "TaskSampler",
    "TaskSpecError",
    "UniformSampler",
    "__version__",
]
