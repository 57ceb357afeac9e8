"""envsched: environment-aware task scheduling for reinforcement learning of LLM agents.

Everything a user needs is importable from the top level (``from envsched import EnvSchedSampler``). The
names are loaded lazily, on first access, so that ``import envsched`` and ``envsched --help`` stay fast:
importing the package loads no numpy, scipy or scikit-learn until a name that needs them is used.

When to use what:

Task pools
    ``TaskPool``: load and validate (environment, task) specs from JSONL/JSON or a list; every sampler
    takes one. ``TaskSpecError``: what a malformed pool raises (names file, line and field).
    ``default_pool``: the bundled 2,550-task / 51-environment pool that ``envsched run`` uses, built on
    first use and cached.

Samplers (RFC 013 ``TaskSampler``: ``sample(n)``, ``update(task, rewards, costs)``, ``metrics()``,
``state_dict()``, ``load_state_dict()``)
    ``EnvSchedSampler`` + ``SchedulerConfig``: the paper's scheduler, to get more learning signal and
    environment coverage per rollout; configure it with ``SchedulerConfig``. ``UniformSampler``: the
    baseline, a fresh permutation per epoch. ``CurriculumSampler``: RFC 013's signal-only curriculum by
    difficulty. ``SequentialSampler``: evaluation order, tasks crossed with seeds. ``make_sampler`` /
    ``available_samplers``: build a sampler by its CLI name. ``BaseSampler`` / ``TaskSampler``: to write
    your own sampler / to type against the protocol. ``check_sampler``: check that your sampler keeps
    every rule of the shared semantics (as Gymnasium's ``check_env`` does for environments);
    ``SamplerCheckError``: what it raises, naming the rule broken.

EnvSched's graph
    ``build_graph`` + ``GraphConfig``: build the dual-relation graph once and pass it to several
    ``EnvSchedSampler`` instances (seeds, ablations) instead of rebuilding it in each.
    ``DualRelationGraph``: the graph itself (neighbours, similarities; ``save``/``load``).

Durable state
    ``DurableSampler``: wrap any sampler so every draw and update is committed to a SQLite file (or a
    PostgreSQL URL) and the same line rebuilds it exactly after a crash. ``HistoryStore``: read or check
    such a store directly (what ``envsched store`` does). ``StoreError``: what a damaged or mismatched
    store raises.

Evaluation
    ``EvalHarness``: evaluate a checkpoint (a policy behind an OpenAI-compatible endpoint) on a split
    crossed with seeds, with retries and resume. ``ChatCompletionsPolicy``: that policy.
    ``EvalResult``: what a run returns. ``compare_eval_results``: compare two evaluations (fixed and
    regressed tasks, metric changes). ``pass_at_k``: the unbiased pass@k estimator.
    ``EvalSchedule``: evaluate every N optimizer steps during training.

Simulation (exercising a sampler without a trainer; not a benchmark)
    ``StochasticRewardSource``: seeded simulated rollouts, ``rollout(task, group_size) -> (rewards,
    costs)``. ``run_schedule``: the loop ``envsched run`` drives (sample, roll out, update, checkpoint).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from envsched._version import __version__

#: public name -> module that defines it (imported on first access)
_LAZY: dict[str, str] = {
    "TaskPool": "envsched.pool",
    "TaskSpecError": "envsched.pool",
    "EnvSchedError": "envsched.errors",
    "InvalidValueError": "envsched.errors",
    "default_pool": "envsched.envs.default_pool",
    "BaseSampler": "envsched.samplers",
    "TaskSampler": "envsched.samplers",
    "UniformSampler": "envsched.samplers",
    "CurriculumSampler": "envsched.samplers",
    "SequentialSampler": "envsched.samplers",
    "make_sampler": "envsched.samplers.registry",
    "available_samplers": "envsched.samplers.registry",
    "check_sampler": "envsched.testing",
    "SamplerCheckError": "envsched.testing",
    "EnvSchedSampler": "envsched.method.sampler",
    "SchedulerConfig": "envsched.method.config",
    "GraphConfig": "envsched.method.config",
    "build_graph": "envsched.method.graph.build",
    "DualRelationGraph": "envsched.method.graph.dual_graph",
    "DurableSampler": "envsched.store",
    "HistoryStore": "envsched.store",
    "StoreError": "envsched.store",
    "EvalHarness": "envsched.evaluation",
    "EvalResult": "envsched.evaluation",
    "EvalSchedule": "envsched.evaluation",
    "ChatCompletionsPolicy": "envsched.evaluation",
    "compare_eval_results": "envsched.evaluation",
    "pass_at_k": "envsched.evaluation",
    "StochasticRewardSource": "envsched.simulation.rewards",
    "run_schedule": "envsched.simulation.loop",
}

__all__ = [
    "BaseSampler",
    "ChatCompletionsPolicy",
    "CurriculumSampler",
    "DualRelationGraph",
    "DurableSampler",
    "EnvSchedError",
    "EnvSchedSampler",
    "EvalHarness",
    "EvalResult",
    "EvalSchedule",
    "GraphConfig",
    "HistoryStore",
    "InvalidValueError",
    "SamplerCheckError",
    "SchedulerConfig",
    "SequentialSampler",
    "StochasticRewardSource",
    "StoreError",
    "TaskPool",
    "TaskSampler",
    "TaskSpecError",
    "UniformSampler",
    "__version__",
    "available_samplers",
    "build_graph",
    "check_sampler",
    "compare_eval_results",
    "default_pool",
    "make_sampler",
    "pass_at_k",
    "run_schedule",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names come from __getattr__
    from envsched.envs.default_pool import default_pool
    from envsched.errors import EnvSchedError, InvalidValueError
    from envsched.evaluation import (
        ChatCompletionsPolicy,
        EvalHarness,
        EvalResult,
        EvalSchedule,
        compare_eval_results,
        pass_at_k,
    )
    from envsched.method.config import GraphConfig, SchedulerConfig
    from envsched.method.graph.build import build_graph
    from envsched.method.graph.dual_graph import DualRelationGraph
    from envsched.method.sampler import EnvSchedSampler
    from envsched.pool import TaskPool, TaskSpecError
    from envsched.samplers import BaseSampler, CurriculumSampler, SequentialSampler, TaskSampler, UniformSampler
    from envsched.samplers.registry import available_samplers, make_sampler
    from envsched.simulation.loop import run_schedule
    from envsched.simulation.rewards import StochasticRewardSource
    from envsched.store import DurableSampler, HistoryStore, StoreError
    from envsched.testing import SamplerCheckError, check_sampler


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first access (PEP 562), then keep it in this module."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'envsched' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
