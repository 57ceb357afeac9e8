"""Stage 3 of EnvSched, batch scheduling: which pairs the next batch rolls out.

- ``batch``: cold start, coverage and exploitation phases, caps, similarity penalty, filters;
- ``policy``: the presets as scheduling policies (``PaperPolicy``, ``AdaptivePolicy``): the batch's inputs and trace;
- ``identifier_filter``: the interface through which the scheduler takes an environment's identifier filter
  (BFCL multi-turn's is :mod:`envsched.envs.bfcl_identifier_filter`).
"""

from envsched.method.scheduling.batch import Pick, SchedulingContext, build_batch, representative_scores
from envsched.method.scheduling.identifier_filter import IdentifierFilter, IdentifierVerdict, Trajectory
from envsched.method.scheduling.policy import (
    AdaptivePolicy,
    BatchInputs,
    PaperPolicy,
    PolicyTrace,
    SchedulingPolicy,
    make_policy,
)

__all__ = [
    "AdaptivePolicy",
    "BatchInputs",
    "IdentifierFilter",
    "IdentifierVerdict",
    "PaperPolicy",
    "Pick",
    "PolicyTrace",
    "SchedulingContext",
    "SchedulingPolicy",
    "Trajectory",
    "build_batch",
    "make_policy",
    "representative_scores",
]
