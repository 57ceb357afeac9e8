"""Samplers by name, for the CLI and the benchmark.

Each entry builds a sampler from a pool, a seed and the group size. Entries whose module needs an
optional part of envsched are imported only when used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from envsched.pool.pool import TaskPool
from envsched.samplers.base import BaseSampler

__all__ = ["SAMPLERS", "available_samplers", "make_sampler", "register_sampler"]

SamplerFactory = Callable[..., BaseSampler]

#: name -> (one-line description, "module:factory"); factories take (pool, *, seed, group_size, **options).
SAMPLERS: dict[str, tuple[str, str]] = {
    "uniform": ("uniform without replacement per epoch (the baseline)", "envsched.samplers.registry:_uniform"),
    "curriculum": ("RFC 013 signal-only curriculum keyed by difficulty", "envsched.samplers.registry:_curriculum"),
    "envsched": ("EnvSched, adaptive default: the paper's graph and batches plus an online coverage share, "
                 "signal-probability exploitation and caps on decline",
                 "envsched.method.sampler:make_envsched_sampler"),
    "envsched-paper": ("EnvSched, the paper preset: variance prediction, 50/50 coverage-aware batches",
                       "envsched.method.sampler:make_envsched_paper_sampler"),
    "mopps": ("MoPPS: Beta posterior per task, Thompson sampling toward p = 0.5", "envsched.samplers.registry:_mopps"),
    "greso": ("GRESO: skip tasks with a run of zero-variance groups, exploration floor",
              "envsched.samplers.registry:_greso"),
    "plr": ("prioritized level replay: rank prioritisation with staleness", "envsched.samplers.registry:_plr"),
    "dps": ("DPS: per-task HMM of the solving state, top tasks predicted partially solved",
            "envsched.samplers.registry:_dps"),
    "sec": ("SEC: Boltzmann bandit over environments, TD(0) values of mean |advantage|",
            "envsched.samplers.registry:_sec"),
}


def register_sampler(name: str, description: str, target: str) -> None:
    """Register ``target`` (``"module:callable"``) under ``name``."""
    SAMPLERS[name] = (description, target)


def available_samplers() -> dict[str, str]:
    """Registered sampler names and their descriptions."""
    return {name: desc for name, (desc, _) in SAMPLERS.items()}


def make_sampler(name: str, pool: TaskPool, *, seed: int = 0, group_size: int = 8, **options: Any) -> BaseSampler:
    """Build the sampler registered as ``name``. ``ValueError`` lists the known names."""
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; choose one of: {', '.join(sorted(SAMPLERS))}")
    module_name, _, attr = SAMPLERS[name][1].partition(":")
    factory: SamplerFactory = getattr(importlib.import_module(module_name), attr)
    return factory(pool, seed=seed, group_size=group_size, **options)


def _uniform(pool: TaskPool, *, seed: int, group_size: int, **options: Any) -> BaseSampler:
    from envsched.samplers.simple import UniformSampler

    return UniformSampler(pool, seed=seed, **options)


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
