"""The RFC 013 ``TaskSampler`` protocol, its shared semantics and the simple samplers."""

from envsched.samplers.base import BaseSampler, GroupResult, TaskSampler
from envsched.samplers.simple import CurriculumSampler, SequentialSampler, UniformSampler

__all__ = [
    "BaseSampler",
    "CurriculumSampler",
    "GroupResult",
    "SequentialSampler",
    "TaskSampler",
    "UniformSampler",
]
