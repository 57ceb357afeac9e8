"""The benchmark's samplers: every name of the sampler registry (each record and its variants, e.g. EnvSched's
ablations) plus EnvSched's negative controls, which only the benchmark can build (they need its graph). One
table, read by the runner, the report and the tuning without an import between runner and report."""

from __future__ import annotations

from typing import Any

from envsched.samplers import registry

__all__ = ["ENVSCHED_ABLATIONS", "ENVSCHED_CLASS", "ENVSCHED_CONTROLS", "ENVSCHED_VARIANTS", "bench_samplers",
           "resolve_bench"]

#: The class of EnvSched's records: the benchmark gives it the cached graph and its batch size.
ENVSCHED_CLASS = "envsched.method.sampler:EnvSchedSampler"

#: Negative controls (docs/evaluation-protocol.md): EnvSched's default on a graph without its information
#: (:mod:`envsched.method.graph.controls`), seeded by the run's seed. Benchmark name -> (control kind,
#: description); each is a variant of the registry's ``envsched``.
_CONTROLS: dict[str, tuple[str, str]] = {
    "envsched-shuffled-graph": ("shuffled", "EnvSched negative control: random neighbours with the graph's degrees "
                                            "and weights"),
    "envsched-noise-features": ("noise_features", "EnvSched negative control: graph rebuilt from noise features "
                                                  "of the same shape"),
}
_CONTROL_BASE = "envsched"

#: Benchmark name -> control kind.
ENVSCHED_CONTROLS: dict[str, str] = {name: kind for name, (kind, _) in _CONTROLS.items()}


def bench_samplers() -> dict[str, str]:
    """Every benchmark sampler name and its description: the registry's (records and variants), then the
    controls."""
    out = registry.benchmark_samplers()
    out.update({name: desc for name, (_, desc) in _CONTROLS.items()})
    return out


def resolve_bench(name: str) -> tuple[registry.SamplerRecord, registry.SamplerVariant | None, str | None]:
    """The registry record and variant a benchmark name builds, and its control kind (``None``: not a
    control). ``ValueError`` lists the benchmark's names."""
    if name in _CONTROLS:
        record, variant = registry.resolve(_CONTROL_BASE)
        return record, variant, _CONTROLS[name][0]
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
    out.update({name: {} for name in _CONTROLS})
    return out


#: Benchmark name -> SchedulerConfig overrides, for every EnvSched name (from the registry) and control.
ENVSCHED_VARIANTS: dict[str, dict[str, Any]] = _envsched_variants()

#: EnvSched's ablations: the default configuration with one mechanism switched off.
ENVSCHED_ABLATIONS = tuple(name for name, overrides in ENVSCHED_VARIANTS.items() if overrides)
