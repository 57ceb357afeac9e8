"""The RFC 013 ``TaskSampler`` protocol, its shared semantics and the simple samplers."""

from envsched.samplers.base import BaseSampler, GroupResult, TaskSampler
from envsched.samplers.simple import CurriculumSampler, SequentialSampler, UniformSampler
from envsched.samplers.wrappers import SamplerWrapper

__all__ = [
    "BaseSampler",
    "CurriculumSampler",
    "GroupResult",
    "SamplerWrapper",
    "SequentialSampler",
    "TaskSampler",
    "UniformSampler",
]
