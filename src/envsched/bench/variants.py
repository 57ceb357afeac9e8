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
    # no graph: each task's own history, the global reference where it has none (no propagated prior)
    "envsched-no-graph": {"use_within_edges": False, "use_cross_edges": False},
    # the paper's calibration (percentile ranks and quantile mapping) and its recent-decline term
    "envsched-no-calibration": {"use_calibration": False},
    "envsched-no-decline": {"decline_penalty": 0.0},
    # the default with one of its own rules (docs/envsched-sampler.md) switched back to the paper's
    # the former default's score: the probability that a group has signal, from the Beta posterior
    "envsched-signal-score": {"exploitation_score": "signal_probability"},
    "envsched-fixed-share": {"adaptive_share": False},
    "envsched-paper-coverage": {"adaptive_coverage": False},
    "envsched-caps-always": {"caps_on_decline_only": False},
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
