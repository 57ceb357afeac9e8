"""The lab's samplers beyond the library's registry: EnvSched's ablation variants (a named configuration of
the registry's ``envsched`` record) and its negative controls (the default on a graph without its
information, :mod:`envsched.method.graph.controls`). They measure the method; a user chooses among the
registry's samplers (``envsched run --list-samplers``), so they live here and not in the library.

One table, read by the runner, the report and the tuning without an import between runner and report."""

from __future__ import annotations

from typing import Any

from envsched.method.config import FORMER_PIPELINE_DEFAULTS
from envsched.samplers import registry
from envsched.samplers.registry import SamplerVariant

__all__ = ["ENVSCHED_ABLATIONS", "ENVSCHED_CLASS", "ENVSCHED_CONTROLS", "ENVSCHED_LAB_VARIANTS",
           "ENVSCHED_VARIANTS", "bench_samplers", "resolve_bench"]

#: The class of EnvSched's records: the benchmark gives it the cached graph and its batch size.
ENVSCHED_CLASS = "envsched.method.sampler:EnvSchedSampler"
_BASE = "envsched"

#: EnvSched's variants: the default with one mechanism switched off (ablations), or one part of the paper's
#: pipeline the default leaves out added back (``with-*``), each measured against the default by the ablation
#: runner.
ENVSCHED_LAB_VARIANTS: tuple[SamplerVariant, ...] = (
    SamplerVariant("envsched-coverage-only", "EnvSched ablation: coverage only", {"mode": "coverage_only"}),
    SamplerVariant("envsched-exploitation-only", "EnvSched ablation: exploitation only",
                   {"mode": "exploitation_only"}),
    SamplerVariant("envsched-no-graph", "EnvSched ablation: no graph prior (neither relation propagates "
                   "history; an unseen task predicts the global reference)",
                   {"use_within_edges": False, "use_cross_edges": False}),
    SamplerVariant("envsched-no-within", "EnvSched ablation: no within-environment relation in the graph prior",
                   {"use_within_edges": False}),
    SamplerVariant("envsched-no-cross", "EnvSched ablation: no cross-environment relation in the graph prior",
                   {"use_cross_edges": False}),
    SamplerVariant("envsched-reference-neighbours", "EnvSched ablation: a neighbour without history counts with "
                   "the global reference (the paper's rule) instead of its environment's estimate",
                   {"unobserved_neighbours": "reference"}),
    SamplerVariant("envsched-env-pooling", "EnvSched variant: the within-environment relation as every other task "
                   "of the environment instead of the K_within nearest neighbours",
                   {"within_relation": "environment"}),
    SamplerVariant("envsched-with-calibration", "EnvSched variant: the default plus the paper's calibration "
                   "(percentile ranks and quantile mapping)", {"use_calibration": True}),
    SamplerVariant("envsched-with-decline", "EnvSched variant: the default plus the recent-decline term "
                   "(decline_penalty=0.25)", {"decline_penalty": 0.25}),
    SamplerVariant("envsched-former-default", "EnvSched variant: the paper's prediction pipeline on the "
                   "default's rules (graph prior, calibration and decline term on)", dict(FORMER_PIPELINE_DEFAULTS)),
    SamplerVariant("envsched-signal-score", "EnvSched variant: exploitation by the probability that a group has "
                   "signal (Beta posterior) instead of the predicted variance",
                   {"exploitation_score": "signal_probability"}),
    SamplerVariant("envsched-adaptive", "EnvSched variant: both adaptive coverage rules of ours on, the online "
                   "coverage share and the UCB coverage ranking (the default judged in round 4)",
                   {"adaptive_share": True, "adaptive_coverage": True}),
    SamplerVariant("envsched-fixed-share", "EnvSched variant: the UCB coverage ranking with the fixed share "
                   "(envsched-adaptive without its online share)", {"adaptive_share": False,
                                                                     "adaptive_coverage": True}),
    SamplerVariant("envsched-paper-coverage", "EnvSched variant: the online share with the paper's coverage "
                   "ranking (envsched-adaptive without its UCB ranking)", {"adaptive_share": True,
                                                                           "adaptive_coverage": False}),
    SamplerVariant("envsched-caps-always", "EnvSched ablation: concentration caps at every step, not only on "
                   "decline", {"caps_on_decline_only": False}),
)
_VARIANTS = {v.name: v for v in ENVSCHED_LAB_VARIANTS}

#: Negative controls (docs/evaluation-protocol.md): EnvSched's default on a graph without its information,
#: seeded by the run's seed. Benchmark name -> (control kind, description).
_CONTROLS: dict[str, tuple[str, str]] = {
    "envsched-shuffled-graph": ("shuffled", "EnvSched negative control: random neighbours with the graph's degrees "
                                            "and weights"),
    "envsched-noise-features": ("noise_features", "EnvSched negative control: graph rebuilt from noise features "
                                                  "of the same shape"),
}

#: Benchmark name -> control kind.
ENVSCHED_CONTROLS: dict[str, str] = {name: kind for name, (kind, _) in _CONTROLS.items()}


def bench_samplers() -> dict[str, str]:
    """Every benchmark sampler name and its description: the registry's (records and variants), then EnvSched's
    lab variants, then the controls, then the lab's positive controls (:mod:`envsched_lab.oracles`)."""
    from envsched_lab.oracles import LAB_SAMPLERS

    out = registry.benchmark_samplers()
    out.update({v.name: v.description for v in ENVSCHED_LAB_VARIANTS})
    out.update({name: desc for name, (_, desc) in _CONTROLS.items()})
    out.update({name: desc for name, (desc, _) in LAB_SAMPLERS.items()})
    return out


def resolve_bench(name: str) -> tuple[registry.SamplerRecord, registry.SamplerVariant | None, str | None]:
    """The registry record and variant a benchmark name builds, and its control kind (``None``: not a
    control). ``ValueError`` lists the benchmark's names (the lab's oracles are built by
    :func:`envsched_lab.oracles.make_lab_sampler`, not through the registry)."""
    if name in _CONTROLS:
        record, variant = registry.resolve(_BASE)
        return record, variant, _CONTROLS[name][0]
    if name in _VARIANTS:
        return registry.SAMPLERS[_BASE], _VARIANTS[name], None
    try:
        record, variant = registry.resolve(name)
    except ValueError:
        raise ValueError(f"unknown sampler {name!r}; choose from: {', '.join(bench_samplers())}") from None
    return record, variant, None


def _envsched_variants() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for record in registry.SAMPLERS.values():
        if record.sampler_class == ENVSCHED_CLASS:
            out[record.name] = {}
            out.update({v.name: dict(v.options) for v in record.variants})
    out.update({v.name: dict(v.options) for v in ENVSCHED_LAB_VARIANTS})
    out.update({name: {} for name in _CONTROLS})
    return out


#: Benchmark name -> SchedulerConfig overrides, for every EnvSched name (registry and lab) and control.
ENVSCHED_VARIANTS: dict[str, dict[str, Any]] = _envsched_variants()

#: EnvSched's ablations and variants: the default configuration with one mechanism changed.
ENVSCHED_ABLATIONS = tuple(name for name, overrides in ENVSCHED_VARIANTS.items() if overrides)
