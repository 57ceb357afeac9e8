"""The one registry of samplers: every part of envsched that names a sampler reads it.

Each :class:`SamplerRecord` says what a sampler is called, what it is (one line), which factory builds it,
which class that factory builds and which named variants (configurations) it has. The CLI (``envsched run``
and ``envsched bench``), the benchmark lab (which adds EnvSched's ablation variants and its controls), and the
history store (:meth:`envsched.store.DurableSampler.resume`, which constructs only the classes named here)
read this table; adding a sampler is its code in one file plus one :func:`register_sampler` call.

Records may point at code of a higher layer (EnvSched lives in ``envsched.method``) by ``"module:attr"``
strings; they are imported only when used, so this module imports no sampler.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - types only
    from envsched.pool.pool import TaskPool
    from envsched.samplers.base import BaseSampler

__all__ = ["BUILTIN_SAMPLERS", "SAMPLERS", "UNLISTED_CLASSES", "SamplerRecord", "SamplerVariant",
           "available_samplers", "benchmark_samplers", "builtin_classes", "lookup", "make_sampler",
           "register_sampler", "resolve", "sampler_classes"]

SamplerFactory = Callable[..., "BaseSampler"]


@dataclass(frozen=True)
class SamplerVariant:
    """A named configuration of a registered sampler: ``options`` its factory receives before the caller's.

    ``make_sampler(variant.name, pool)`` builds it; the benchmark runs it as a sampler of its own."""

    name: str
    description: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SamplerRecord:
    """One registered sampler.

    Attributes:
        name: what the CLI, the benchmark and the docs call it.
        description: one line, shown by ``--list-samplers``.
        factory: ``"module:callable"`` taking ``(pool, *, seed, group_size, **options)``.
        sampler_class: ``"module:qualname"`` of the class ``factory`` builds: the class a history store may
            name and :meth:`~envsched.store.DurableSampler.resume` may construct (``""``: not resumable by
            name; wrap it yourself).
        variants: named configurations (see :class:`SamplerVariant`).
        restore: ``"module:callable"`` that restores the sampler from its construction record, when the class
            cannot do it with :meth:`~envsched.samplers.base.BaseSampler.from_record` (same signature:
            ``(cls, tasks, record, **resources)``); ``""``: the class's own ``from_record``.
        benchmark_only: a sampler only the benchmark's loop can drive (a post-filter); ``envsched run`` and
            :func:`available_samplers` leave it out.
        options: options the factory always receives (before a variant's and the caller's), e.g. a preset.
    """

    name: str
    description: str
    factory: str
    sampler_class: str = ""
    variants: tuple[SamplerVariant, ...] = ()
    restore: str = ""
    benchmark_only: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)


_ENVSCHED = "envsched.method.sampler:EnvSchedSampler"
#: EnvSched's resume logic (its graph is a resource the caller gives, or rebuilt and checked against the
#: recorded fingerprint). It reads a store's record, so it lives with the store, which this module names by a
#: string (the store is a higher layer); the two records below name it as their ``restore``.
_ENVSCHED_RESTORE = "envsched.store.resume_envsched:envsched_from_record"

SAMPLERS: dict[str, SamplerRecord] = {}

#: Classes a store may name that no registry factory builds by name (they need arguments a pool and a seed
#: do not give): resumable from a store, not listed. ``"module:qualname"`` -> restore hook (``""``: none).
UNLISTED_CLASSES: dict[str, str] = {"envsched.samplers.simple:SequentialSampler": ""}


def register_sampler(name: str, description: str, target: str, *, sampler_class: str = "",
                     variants: tuple[SamplerVariant, ...] = (), restore: str = "",
                     benchmark_only: bool = False, options: Mapping[str, Any] | None = None) -> SamplerRecord:
    """Register the sampler built by ``target`` (``"module:callable"``) under ``name`` (see
    :class:`SamplerRecord` for the other fields) and return its record. A name already registered (a sampler
    or a variant) is replaced only by a record of that name."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a sampler name must be a non-empty string, got {name!r}")
    for text, what in ((target, "target"), *((s, k) for s, k in ((sampler_class, "sampler_class"),
                                                                   (restore, "restore")) if s)):
        if not isinstance(text, str) or text.count(":") != 1 or text.startswith(":") or text.endswith(":"):
            raise ValueError(f"{what} must be 'module:attribute', got {text!r}")
    record = SamplerRecord(name, description, target, sampler_class, tuple(variants), restore, benchmark_only,
                           dict(options or {}))
    taken = {v.name: r.name for r in SAMPLERS.values() if r.name != name for v in r.variants}
    for n in (name, *(v.name for v in record.variants)):
        if n in taken or (n != name and n in SAMPLERS):
            raise ValueError(f"sampler name {n!r} is already registered")
    SAMPLERS[name] = record
    return record


def _import(target: str) -> Any:
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def lookup(target: str) -> Any:
    """The object a ``"module:qualname"`` string of a record names (imported now)."""
    return _import(target)


def resolve(name: str) -> tuple[SamplerRecord, SamplerVariant | None]:
    """The record registered as ``name``, or the record and variant of the variant ``name``;
    ``ValueError`` lists the known names."""
    if name in SAMPLERS:
        return SAMPLERS[name], None
    for record in SAMPLERS.values():
        for variant in record.variants:
            if variant.name == name:
                return record, variant
    raise ValueError(f"unknown sampler {name!r}; choose one of: {', '.join(sorted(benchmark_samplers()))}")


def available_samplers() -> dict[str, str]:
    """Registered sampler names and their descriptions (what ``envsched run`` drives: no variants, no
    benchmark-only sampler)."""
    return {name: r.description for name, r in SAMPLERS.items() if not r.benchmark_only}


def benchmark_samplers() -> dict[str, str]:
    """Every name :func:`make_sampler` builds -- each record followed by its variants -- and its description."""
    out: dict[str, str] = {}
    for r in SAMPLERS.values():
        out[r.name] = r.description
        out.update({v.name: v.description for v in r.variants})
    return out


def sampler_classes() -> dict[str, str]:
    """``"module:qualname"`` of every registered sampler class (a history store may name these and no other
    class), with the ``restore`` hook of its record (``""``: the class's own ``from_record``)."""
    out = dict(UNLISTED_CLASSES)
    out.update({r.sampler_class: r.restore for r in SAMPLERS.values() if r.sampler_class})
    return out


def make_sampler(name: str, pool: TaskPool, *, seed: int = 0, group_size: int = 8, **options: Any) -> BaseSampler:
    """Build the sampler (or variant) registered as ``name``: the record's options, then the variant's, then
    ``options``, each overriding the one before. ``ValueError`` lists the known names."""
    record, variant = resolve(name)
    factory: SamplerFactory = _import(record.factory)
    merged = {**record.options, **(variant.options if variant is not None else {}), **options}
    return factory(pool, seed=seed, group_size=group_size, **merged)


# ---------------------------------------------------------------------------------------------- the samplers
def _uniform(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    from envsched.samplers.simple import UniformSampler

    return UniformSampler(pool, seed=seed, **options)


def _uniform_ds(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    from envsched.samplers.baselines import DynamicSamplingSampler

    return DynamicSamplingSampler(pool, seed=seed, **options)


def _curriculum(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    from envsched.samplers.simple import CurriculumSampler

    return CurriculumSampler(pool, group_size=group_size, seed=seed, **options)


def _mopps(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    from envsched.samplers.baselines import MoPPSSampler

    return MoPPSSampler(pool, seed=seed, **options)


def _greso(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    from envsched.samplers.baselines import GRESOSampler

    return GRESOSampler(pool, seed=seed, **options)


def _plr(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    from envsched.samplers.baselines import PLRSampler

    return PLRSampler(pool, seed=seed, **options)


def _dps(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    from envsched.samplers.dps import DPSSampler

    return DPSSampler(pool, seed=seed, **options)


def _sec(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    from envsched.samplers.sec import SECSampler

    return SECSampler(pool, seed=seed, **options)


_HERE = "envsched.samplers.registry"
register_sampler("uniform", "uniform without replacement per epoch (the baseline)", f"{_HERE}:_uniform",
                 sampler_class="envsched.samplers.simple:UniformSampler")
register_sampler("uniform-ds", "uniform + DAPO dynamic sampling (drop all-pass/all-fail groups, refill; dropped "
                 "rollouts spent)", f"{_HERE}:_uniform_ds",
                 sampler_class="envsched.samplers.baselines:DynamicSamplingSampler", benchmark_only=True)
register_sampler("curriculum", "RFC 013 signal-only curriculum keyed by difficulty", f"{_HERE}:_curriculum",
                 sampler_class="envsched.samplers.simple:CurriculumSampler")
register_sampler("mopps", "MoPPS: Beta posterior per task, Thompson sampling toward p = 0.5", f"{_HERE}:_mopps",
                 sampler_class="envsched.samplers.baselines:MoPPSSampler")
register_sampler("greso", "GRESO: skip tasks with a run of zero-variance groups, exploration floor",
                 f"{_HERE}:_greso", sampler_class="envsched.samplers.baselines:GRESOSampler")
register_sampler("plr", "prioritized level replay: rank prioritisation with staleness, every task played once "
                 "before any replay (the authors' code)", f"{_HERE}:_plr",
                 sampler_class="envsched.samplers.baselines:PLRSampler",
                 variants=(SamplerVariant("plr-early-replay", "PLR replaying from the first step (replay "
                                          "probability |seen| / |all| at once, the paper's rule without the code's "
                                          "sweep of every task first)", {"min_seen_fraction": 0.0}),))
register_sampler("dps", "DPS: per-task HMM of the solving state, top tasks predicted partially solved",
                 f"{_HERE}:_dps", sampler_class="envsched.samplers.dps:DPSSampler")
register_sampler("sec", "SEC: Boltzmann bandit over environments, TD(0) values of mean |advantage| (unplayed "
                 "environments decay, as the authors' code does)", f"{_HERE}:_sec",
                 sampler_class="envsched.samplers.sec:SECSampler",
                 variants=(SamplerVariant("sec-played-arms", "SEC updating only the environments played in a step "
                                          "(the usual bandit rule) instead of decaying the others",
                                          {"zero_fill_unplayed": False}),))
register_sampler(
    "envsched", "EnvSched, the default: 50/50 batches of coverage (least-selected environments first, quotas) and "
    "exploitation by each task's predicted reward variance (every task predicted from its graph neighbours and "
    "its own history); caps on decline",
    "envsched.method.sampler:make_envsched_sampler",
    sampler_class=_ENVSCHED, restore=_ENVSCHED_RESTORE)
register_sampler("envsched-paper", "EnvSched, the paper preset: variance prediction, 50/50 coverage-aware batches",
                 "envsched.method.sampler:make_envsched_sampler", options={"preset": "paper"},
                 sampler_class=_ENVSCHED, restore=_ENVSCHED_RESTORE)


#: The records envsched registers itself: their classes' arguments name no file, address or process count.
BUILTIN_SAMPLERS: frozenset[str] = frozenset(SAMPLERS)


def builtin_classes() -> frozenset[str]:
    """``"module:qualname"`` of envsched's own sampler classes (see :data:`BUILTIN_SAMPLERS`)."""
    return frozenset([*UNLISTED_CLASSES, *(SAMPLERS[n].sampler_class for n in BUILTIN_SAMPLERS
                                          if n in SAMPLERS and SAMPLERS[n].sampler_class)])
