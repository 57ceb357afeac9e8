"""Stage 3 of EnvSched, batch scheduling: which pairs the next batch rolls out.

- ``batch``: cold start, coverage and exploitation phases, caps, similarity penalty, filters;
- ``identifier_filter``: the identifier filter over trajectories (and its BFCL multi-turn implementation).
"""

from envsched.method.scheduling.batch import Pick, SchedulingContext, build_batch, representative_scores
from envsched.method.scheduling.identifier_filter import (
    BfclIdentifierFilter,
    IdentifierFilter,
    IdentifierVerdict,
    Trajectory,
)

__all__ = [
    "BfclIdentifierFilter",
    "IdentifierFilter",
    "IdentifierVerdict",
    "Pick",
    "SchedulingContext",
    "Trajectory",
    "build_batch",
    "representative_scores",
]
