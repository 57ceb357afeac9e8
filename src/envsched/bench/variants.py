"""EnvSched's benchmark variants (its configurations and ablations), shared by the runner, the report and
tuning without an import between runner and report."""

from __future__ import annotations

from typing import Any

__all__ = ["ENVSCHED_ABLATIONS", "ENVSCHED_CONTROLS", "ENVSCHED_VARIANTS"]

#: Benchmark name -> SchedulerConfig overrides.
ENVSCHED_VARIANTS: dict[str, dict[str, Any]] = {
    "envsched": {},
    "envsched-paper": {},
    "envsched-coverage-only": {"mode": "coverage_only"},
    "envsched-exploitation-only": {"mode": "exploitation_only"},
    "envsched-no-within": {"use_within_edges": False},
    "envsched-no-cross": {"use_cross_edges": False},
}

#: Negative controls (docs/evaluation-protocol.md): EnvSched's default on a graph without its information
#: (:mod:`envsched.method.graph.controls`), seeded by the run's seed. Benchmark name -> control kind.
ENVSCHED_CONTROLS: dict[str, str] = {
    "envsched-shuffled-graph": "shuffled",
    "envsched-noise-features": "noise_features",
}
for _name in ENVSCHED_CONTROLS:
    ENVSCHED_VARIANTS[_name] = {}

#: EnvSched's ablations: the default configuration with one mechanism switched off.
ENVSCHED_ABLATIONS = tuple(name for name, overrides in ENVSCHED_VARIANTS.items() if overrides)
