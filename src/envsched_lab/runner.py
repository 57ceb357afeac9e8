"""The rollout-efficiency benchmark: samplers x seeds at a matched rollout budget, against the learner model.

**Budget.** Every sampler spends exactly ``batch_size * group_size`` rollouts per benchmark step (default
64 x 8 = 512). For samplers that train on every group (uniform, curriculum, MoPPS, PLR, DPS, SEC, EnvSched) a step
is one generation round and one GRPO update. For post-filtering samplers (DAPO dynamic sampling, GRESO's
residual filter; ``sampler.post_filter``) a step is one generation round of ``batch_size`` groups: kept
(mixed) groups go to a buffer, and a GRPO update happens when the buffer holds ``batch_size`` groups (the
extras are dropped, as DAPO does) or after ``max_gen_rounds`` rounds. Dropped groups are reported to the
sampler with ``update`` first, so they count in its ``episodes``/``cost`` and in signal per episode. All
curves are therefore plotted against rollouts spent, and "after t steps" means "after t x 512 rollouts".

**Per-step record** (one JSON object per (sampler, seed, step)): rollouts spent, GRPO updates, the
batch's mean within-task reward variance (population variance over each group, averaged over groups),
mean reward, environments and tools covered, signal groups (mixed groups) in the batch and cumulated,
signal groups per episode and per unit cost (cumulated), the learner score after the step, and for
samplers that mark exploitation picks (EnvSched), the exploitation picks and hits (mixed groups) of the
batch.

**Cold-start runs** (the paper's Table 4 form): ``coldstart_runs`` fresh runs of ``coldstart_steps`` steps
per sampler, each with its own learner and sampler seed; runs are split at the median of their step-1
batch variance into a low and a high initial-variance group.

**Resume.** The run directory keeps one file per finished (sampler, seed) run and per finished cold-start
block (sampler); a restarted ``run_benchmark`` with the same configuration skips them. An interrupted
(sampler, seed) run restarts from its first step: the resume granularity is one whole run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envsched.method.graph.cache import cached_graph
from envsched.pool.pool import TaskPool
from envsched.samplers import registry
from envsched.samplers.base import BaseSampler, GroupResult
from envsched_lab.cache import bench_cache_dir
from envsched_lab.families.v2 import V2_POOL, build_v2_pool
from envsched_lab.learner import LearnerConfig, LearnerModel, sharing_degree, task_structure
from envsched_lab.learners import LEARNERS, Learner, make_learner, validate_learner_options
from envsched_lab.oracles import LAB_SAMPLERS, TrainingView, make_lab_sampler
from envsched_lab.split import PoolSplit, SplitConfig, split_pool
from envsched_lab.variants import ENVSCHED_ABLATIONS, ENVSCHED_CLASS, bench_samplers, resolve_bench

__all__ = ["ENVSCHED_ABLATIONS", "LEARNERS", "SAMPLER_NAMES", "BenchConfig", "available_samplers",
           "bench_cache_dir", "make_bench_sampler", "run_benchmark", "run_one"]

DEFAULT_SAMPLERS = ("uniform", "uniform-ds", "curriculum", "mopps", "greso", "plr", "dps", "sec", "envsched",
                    "envsched-paper",
                    "envsched-coverage-only", "envsched-exploitation-only", "envsched-no-graph",
                    "envsched-former-default")

#: Every benchmark sampler name, when this module was imported (:func:`available_samplers` reads the registry
#: now).
SAMPLER_NAMES = tuple(bench_samplers())


def available_samplers() -> dict[str, str]:
    """Benchmark sampler names and what they are: the sampler registry's names (records and variants) and
    EnvSched's negative controls (:mod:`envsched_lab.variants`)."""
    return bench_samplers()


def envsched_graph(pool: TaskPool) -> Any:
    """EnvSched's graph for ``pool`` (the library's cache, :func:`envsched.method.graph.cache.cached_graph`)."""
    return cached_graph(pool)


def _memo_path(pool: TaskPool) -> Path:
    try:
        from envsched.envs.bfcl import BFCL_VERSION
    except Exception:
        BFCL_VERSION = "none"
    return bench_cache_dir() / f"bfcl-memo-{BFCL_VERSION}.json"


def make_bench_sampler(name: str, pool: TaskPool, *, seed: int, batch_size: int = 64,
                       group_size: int = 8, options: Mapping[str, Any] | None = None) -> BaseSampler:
    """Build the benchmark sampler ``name`` over ``pool`` with the registry's factory (``ValueError`` lists
    the known names). EnvSched's records get the benchmark's batch size, its cached graph (or a control's
    graph) and a configuration in which knobs its switches leave unread are reset (:func:`_envsched_options`)."""
    if name in LAB_SAMPLERS:
        return make_lab_sampler(name, pool, seed=seed, group_size=group_size, options=dict(options or {}))
    record, variant, control = resolve_bench(name)
    opts = {**record.options, **(variant.options if variant is not None else {}), **dict(options or {})}
    config = None
    if record.sampler_class == ENVSCHED_CLASS:
        opts, config = _envsched_options(name, pool, seed, batch_size, group_size, opts, control,
                                         dict(options or {}))
    sampler = registry.lookup(record.factory)(pool, seed=seed, group_size=group_size, **opts)
    if config is not None and sampler.config != config:  # pragma: no cover - the factory's preset rules changed
        raise RuntimeError(f"{record.factory} built {name!r} with another SchedulerConfig than the benchmark's")
    return sampler


def _envsched_options(name: str, pool: TaskPool, seed: int, batch_size: int, group_size: int,
                      opts: dict[str, Any], control: str | None, given: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The factory options of an EnvSched benchmark sampler: its ``SchedulerConfig`` fields as the preset's
    configuration with the benchmark's batch size and group size, the variant's overrides and ``given``
    applied -- knobs the configuration's switches leave unread reset to their defaults (a tuned draw sets knobs
    jointly: values of knobs the drawn configuration does not read change no batch) -- plus the graph; and that
    configuration."""
    import dataclasses

    from envsched.method.config import SchedulerConfig

    preset = opts.pop("preset", "adaptive")
    base = SchedulerConfig.paper() if preset == "paper" else SchedulerConfig()
    known = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for sampler {name!r}")
    fields_ = {"batch_size": batch_size, "rollouts_per_task": group_size, **opts}
    cfg = SchedulerConfig.without_unread({**base.to_dict(), **{k: v for k, v in fields_.items() if k in known}})
    # the factory builds the preset with these fields on top: exactly ``cfg``
    out: dict[str, Any] = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
                           if getattr(cfg, f.name) != getattr(base, f.name) or f.name == "rollouts_per_task"}
    graph = envsched_graph(pool)
    if control is not None:
        from envsched.method.graph.controls import noise_feature_graph, shuffled_graph

        graph = shuffled_graph(graph, seed) if control == "shuffled" else noise_feature_graph(graph, pool, seed)
    return {**out, "preset": preset, "graph": graph}, cfg


@dataclass
class BenchConfig:
    """What a benchmark run does (saved as ``config.json``; a resumed run must match it)."""

    samplers: list[str] = field(default_factory=lambda: list(DEFAULT_SAMPLERS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    steps: int = 200
    batch_size: int = 64
    group_size: int = 8
    learner: dict[str, Any] = field(default_factory=dict)
    sampler_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    coldstart_runs: int = 100
    coldstart_steps: int = 10
    coldstart_samplers: list[str] = field(default_factory=lambda: ["envsched", "envsched-paper", "uniform"])
    score_steps: list[int] = field(default_factory=lambda: [40, 120, 200])
    target_step: int = 120
    pool: str = "default"
    split: dict[str, Any] = field(default_factory=dict)
    """:class:`~envsched_lab.split.SplitConfig` fields (default: the documented held-out split)."""
    eval_rollouts: int = 0
    """Sampled rollouts per held-out task for a Monte-Carlo held-out score at the last step (tuning)."""
    learner_kind: str = "model"
    """``model`` (the simulated learner; ``learner`` holds LearnerConfig fields) or ``neural`` (GRPO on a small
    transformer; ``learner`` holds NeuralConfig fields)."""
    families: str | None = None
    """``MODULE:ATTR`` of the task families the neural learner's pool was generated from."""

    def validate(self) -> None:
        names = available_samplers()
        for name in set(self.samplers) | set(self.coldstart_samplers):
            if name not in names:
                raise ValueError(f"unknown sampler {name!r}; choose from: {', '.join(names)}")
        if not self.samplers:
            raise ValueError("no sampler to run")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"seeds must be distinct non-negative integers, got {self.seeds}")
        for k in ("steps", "batch_size", "group_size"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if self.coldstart_runs < 0 or self.coldstart_steps < 1:
            raise ValueError("coldstart_runs must be >= 0 and coldstart_steps >= 1")
        validate_learner_options(self.learner_kind, self.learner)
        if self.families is not None and self.learner_kind != "neural":
            raise ValueError("families are read by the neural learner only (--learner neural)")
        SplitConfig.from_dict(self.split)
        if self.eval_rollouts < 0:
            raise ValueError(f"eval_rollouts must be >= 0, got {self.eval_rollouts}")
        if self.pool == V2_POOL:
            if self.learner_kind != "neural":
                raise ValueError("the v2 pool is the neural learner's (--learner neural --pool v2)")
            if self.families not in (None, V2_POOL):
                raise ValueError("the v2 pool generates its own tasks: drop --families")
            extra = sorted(set(self.split) - {"heldout_task_share"})
            if extra:
                raise ValueError(f"the v2 split holds out one surface of every skill and a share of each training "
                                 f"environment's tasks (heldout_task_share); it takes no {extra}")
            if self.coldstart_runs:
                raise ValueError("cold-start runs are not part of the v2 benchmark: set coldstart_runs to 0")

    def digest(self, pool_fingerprint: str) -> str:
        cfg = asdict(self)
        for k, default in (("learner_kind", "model"), ("families", None)):
            if cfg[k] == default:  # runs written before these fields existed keep their digest (resume)
                del cfg[k]
        blob = json.dumps({"config": cfg, "pool": pool_fingerprint}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- one run
def _exploitation_mask(sampler: Any, n: int) -> np.ndarray | None:
    """Which groups of the last batch the sampler chose for exploitation (``None``: no such notion)."""
    for attr in ("last_phases", "last_picks"):
        picks = getattr(sampler, attr, None)
        if picks is None:
            continue
        if callable(picks):
            picks = picks()
        phases = [p if isinstance(p, str) else p.get("phase") if isinstance(p, Mapping)
                  else getattr(p, "phase", None) for p in picks]
        if len(phases) == n:
            return np.array([ph == "exploitation" for ph in phases])
    return None


_STRUCTURES: dict[str, _Structure] = {}


class _Structure:
    """Per-task environment and tool sets of a pool, for coverage figures."""

    def __init__(self, pool: TaskPool) -> None:
        self.env = np.asarray(pool.env_codes)
        names: dict[str, int] = {}
        self.tools: list[np.ndarray] = []
        for t in pool:
            tools, _, _, _ = task_structure(t)
            self.tools.append(np.array([names.setdefault(x, len(names)) for x in tools], dtype=np.int64))

    @classmethod
    def of(cls, pool: TaskPool) -> _Structure:
        """The structure of ``pool``, memoised per pool fingerprint."""
        fp = pool.fingerprint()
        if fp not in _STRUCTURES:
            _STRUCTURES[fp] = cls(pool)
        return _STRUCTURES[fp]

    def coverage(self, pos: np.ndarray) -> tuple[int, int]:
        tools = {int(x) for p in pos for x in self.tools[p]}
        return len(set(self.env[pos].tolist())), len(tools)


_SPLITS: dict[tuple[str, str], PoolSplit] = {}


def bench_split(pool: TaskPool, split: Mapping[str, Any] | SplitConfig | None,
                prompts: Sequence[str] | None = None) -> PoolSplit:
    """The held-out split of ``pool`` (memoised per pool, split configuration and prompts): with the learner's
    ``prompts``, no held-out prompt is a training prompt (:func:`~envsched_lab.split.split_pool`)."""
    cfg = split if isinstance(split, SplitConfig) else SplitConfig.from_dict(split)
    digest = "" if prompts is None else hashlib.sha256("\0".join(prompts).encode()).hexdigest()
    key = (pool.fingerprint(), json.dumps(asdict(cfg), sort_keys=True), digest)
    if key not in _SPLITS:
        _SPLITS[key] = split_pool(pool, cfg, prompts=prompts)
    return _SPLITS[key]


def learner_prompts(learner_kind: str, families: str | None, family_seed: int = 0) -> list[str] | None:
    """What the learner reads of each task (the neural learner's family prompts; ``None`` for the simulated
    learner), which the held-out split keeps apart."""
    if learner_kind != "neural" or families == V2_POOL:
        return None
    from envsched_lab.families import DEFAULT_FAMILIES_REF, build_family_pool

    return build_family_pool(families or DEFAULT_FAMILIES_REF, seed=family_seed).prompts


def run_one(pool: TaskPool, sampler_name: str, seed: int, *, steps: int, batch_size: int = 64, group_size: int = 8,
            learner: Mapping[str, Any] | None = None, sampler_options: Mapping[str, Any] | None = None,
            learner_seed: int | None = None, on_step: Callable[[int], None] | None = None,
            structure: _Structure | None = None, split: Mapping[str, Any] | SplitConfig | PoolSplit | None = None,
            eval_rollouts: int = 0, learner_kind: str = "model",
            families: str | None = None, family_seed: int = 0,
            groups: Mapping[str, np.ndarray] | None = None,
            score_steps: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Run one sampler for ``steps`` budget steps against a fresh learner; returns the per-step records.

    The learner is built over the whole ``pool``; the sampler only over the training part of its held-out
    split (``split``: a :class:`~envsched_lab.split.SplitConfig` or its fields; shares of 0 hold nothing
    out). The learner is seeded with ``learner_seed`` (default ``seed``), so samplers run with the same seed
    face the same initial learner and task difficulties. ``eval_rollouts > 0`` adds, at the last step, a
    Monte-Carlo held-out score (``heldout_sampled``) from that many sampled rollouts per held-out task.
    ``learner_kind`` picks the learner (:mod:`envsched_lab.learners`; ``families``: the neural learner's, and
    ``family_seed`` the seed its pool was generated with). ``split`` may also be a finished
    :class:`~envsched_lab.split.PoolSplit` of ``pool`` (the v2 pool's, :func:`~envsched_lab.families.v2.split_v2`).

    A sampler with a ``bind_learner`` method (the lab's oracles, :mod:`envsched_lab.oracles`) is given a
    :class:`~envsched_lab.oracles.TrainingView` of the learner before its first draw. A learner with answers
    (the neural one) adds the trivial baselines of the held-out sets to the first record
    (``baseline_constant``, ``baseline_env_mode`` and their ``_a``/``_b`` parts; :mod:`envsched_lab.trivial`).
    ``groups`` (name -> positions among the held-out tasks) adds the learner's score over each group to every
    record (``heldout_group_NAME``), for learners that can break their scores down. The learner is scored at
    every step of ``score_steps`` and at the last, besides its own schedule (a learner that evaluates every so
    many updates may update less often than every step: a filtering sampler's).
    """
    psplit = split if isinstance(split, PoolSplit) else \
        bench_split(pool, split, learner_prompts(learner_kind, families, family_seed))
    if psplit.pool is not pool and psplit.pool.fingerprint() != pool.fingerprint():
        raise ValueError("the split given to run_one is a split of another pool")
    model: Learner = make_learner(learner_kind, pool, learner, families=families, family_seed=family_seed,
                                  seed=seed if learner_seed is None else learner_seed)
    sampler = make_bench_sampler(sampler_name, psplit.train, seed=seed, batch_size=batch_size,
                                 group_size=group_size, options=sampler_options)
    to_full = psplit.train_positions
    bind = getattr(sampler, "bind_learner", None)
    if callable(bind):
        bind(TrainingView(model, to_full))
    held_a, held_b, held = psplit.heldout_task_positions, psplit.heldout_env_positions, psplit.heldout_positions
    baselines: dict[str, Any] = {}
    fpool = getattr(model, "fpool", None)
    if fpool is not None:
        from envsched_lab.trivial import constant_baselines

        b = constant_baselines(fpool, held, to_full, {"a": held_a, "b": held_b})
        baselines = {f"baseline_{k}": v for k, v in b.items()}
    breakdown = getattr(model, "breakdown", None) if groups else None
    structure = structure or _Structure.of(psplit.train)
    post_filter = bool(getattr(sampler, "post_filter", False))
    keep = getattr(sampler, "keep_group", None)
    max_rounds = int(getattr(sampler, "max_gen_rounds", 10))
    buf_pos: list[int] = []
    buf_rew: list[np.ndarray] = []
    buf_grp: list[Any] = []
    rounds = updates = 0
    cum_signal = 0
    cum_episodes = 0
    cum_cost = 0.0
    records: list[dict[str, Any]] = []
    score_at = {int(t) for t in score_steps}
    # the policy before any update (scores read the learner's state only; no random stream moves)
    initial = model.scores(to_full, held_a, held_b)
    initial_groups = breakdown(groups) if breakdown is not None else {}
    for step in range(1, steps + 1):
        tasks = sampler.sample(batch_size)
        train_pos = np.array([sampler.position_of(t) for t in tasks], dtype=np.int64)
        pos = to_full[train_pos]
        rewards, costs, handles = model.rollout(pos, group_size)
        exploit = _exploitation_mask(sampler, len(tasks))
        mixed = np.zeros(len(tasks), dtype=bool)
        reward_range = tuple(getattr(sampler, "reward_range", (0.0, 1.0)))
        for b, task in enumerate(tasks):
            row = rewards[b]
            vals = [None if math.isnan(x) else float(x) for x in row]
            sampler.update(task, vals, costs[b].tolist())
            mixed[b] = GroupResult(0, vals, None, reward_range).has_signal
        with np.errstate(invalid="ignore"):
            group_var = np.nanvar(rewards, axis=1)
        if post_filter:
            rounds += 1
            for b in range(len(tasks)):
                if (keep(rewards[b].tolist()) if keep is not None else mixed[b]):
                    buf_pos.append(int(pos[b]))
                    buf_rew.append(rewards[b])
                    buf_grp.append(handles[b])
            if len(buf_pos) >= batch_size or rounds >= max_rounds:
                if buf_pos:
                    model.train(np.array(buf_pos[:batch_size]), np.nan_to_num(np.array(buf_rew[:batch_size])),
                                buf_grp[:batch_size])
                    updates += 1
                buf_pos, buf_rew, buf_grp, rounds = [], [], [], 0
        else:
            model.train(pos, _fill_nan(rewards), handles)
            updates += 1
        envs, tools = structure.coverage(train_pos)
        cum_signal += int(mixed.sum())
        cum_episodes += int(rewards.size)
        cum_cost += float(costs.sum())
        rec = {
            "sampler": sampler_name, "seed": seed, "step": step,
            "rollouts": step * batch_size * group_size, "updates": updates,
            "batch_variance": float(np.nanmean(group_var)), "mean_reward": float(np.nanmean(rewards)),
            "envs_covered": envs, "tools_covered": tools, "signal_groups": int(mixed.sum()),
            "cum_signal_groups": cum_signal, "cum_episodes": cum_episodes, "cum_cost": cum_cost,
            "signal_per_episode": cum_signal / cum_episodes, "signal_per_cost": cum_signal / cum_cost,
            **model.scores(to_full, held_a, held_b, last=step == steps or step in score_at),
            "exploit_picks": int(exploit.sum()) if exploit is not None else -1,
            **({"grad_norm": float(np.mean(norms))} if (norms := getattr(model, "last_grad_norms", None)) else {}),
            "exploit_hits": int((exploit & mixed).sum()) if exploit is not None else -1,
        }
        if breakdown is not None:
            rec.update({f"heldout_group_{k}": v for k, v in breakdown(groups).items()})
        if step == 1:
            rec["heldout_initial"], rec["score_initial"] = initial["heldout"], initial["score"]
            rec["train_envs"] = len(psplit.train.envs)
            rec.update(baselines)
            if breakdown is not None:
                rec.update({f"heldout_group_{k}_initial": v for k, v in initial_groups.items()})
        if eval_rollouts > 0 and step == steps and held.size:
            rec["heldout_sampled"] = model.sampled_score(held, eval_rollouts,
                                                         np.random.default_rng([int(seed), 77]))
        records.append(rec)
        if on_step is not None:
            on_step(step)
    return records


def _fill_nan(rewards: np.ndarray) -> np.ndarray:
    """Unscored rollouts take their group's mean (no advantage), so they move nothing in training."""
    if not np.isnan(rewards).any():
        return rewards
    out = rewards.copy()
    with np.errstate(invalid="ignore"):
        means = np.nan_to_num(np.nanmean(out, axis=1))
    r, c = np.nonzero(np.isnan(out))
    out[r, c] = means[r]
    return out


def run_coldstart(pool: TaskPool, sampler_name: str, runs: int, steps: int, *, batch_size: int, group_size: int,
                  learner: Mapping[str, Any] | None = None, sampler_options: Mapping[str, Any] | None = None,
                  on_step: Callable[[int], None] | None = None, structure: _Structure | None = None,
                  split: Mapping[str, Any] | None = None, learner_kind: str = "model",
                  families: str | None = None) -> list[dict[str, Any]]:
    """``runs`` cold-start runs of ``steps`` steps (learner and sampler seeds ``10_000 + run``)."""
    out = []
    structure = structure or _Structure.of(bench_split(pool, split, learner_prompts(learner_kind, families)).train)
    for r in range(runs):
        recs = run_one(pool, sampler_name, 10_000 + r, steps=steps, batch_size=batch_size, group_size=group_size,
                       learner=learner, sampler_options=sampler_options, on_step=on_step, structure=structure,
                       split=split, learner_kind=learner_kind, families=families)
        for rec in recs:
            rec["run"] = r
        out.extend(recs)
    return out


# ---------------------------------------------------------------------------------------------- parallel driver
_WORKER: dict[str, Any] = {}


def _init_worker(pool: TaskPool, queue: Any) -> None:
    _WORKER["pool"] = pool
    _WORKER["queue"] = queue

    with contextlib.suppress(Exception):
        os.nice(0)


def _job(job: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    pool = _WORKER["pool"]
    queue = _WORKER.get("queue")

    def tick(_step: int) -> None:
        if queue is not None:
            queue.put(1)

    return job, _execute(pool, job, tick)


def _execute(pool: TaskPool, job: Mapping[str, Any], tick: Callable[[int], None] | None) -> list[dict[str, Any]]:
    from envsched_lab.learner import load_bfcl_memo, save_bfcl_memo

    memo = _memo_path(pool)
    with contextlib.suppress(OSError):
        load_bfcl_memo(memo)
    try:
        return _execute_job(pool, job, tick)
    finally:
        with contextlib.suppress(OSError):
            save_bfcl_memo(memo)


def v2_inputs(seed: int, split: Mapping[str, Any] | None = None) -> tuple[TaskPool, PoolSplit, dict[str, np.ndarray]]:
    """The v2 pool of ``seed``, its split (split seed = ``seed``) and the held-out tasks of each stage (the
    groups a v2 run's records break the held-out score into: ``heldout_group_early``, ...)."""
    v2 = build_v2_pool(seed)
    psplit = v2.split(seed, **dict(split or {}))
    stage = v2.stage_of()
    held = psplit.heldout_positions
    groups = {name: held[stage[held] == name] for name in ("early", "late", "unlearnable")}
    return v2.pool, psplit, groups


def v2_fingerprint(seeds: Sequence[int]) -> str:
    """One fingerprint for the v2 pools of ``seeds`` (a run directory's configuration digest reads it)."""
    h = hashlib.sha256()
    for seed in seeds:
        h.update(build_v2_pool(int(seed)).pool.fingerprint().encode())
    return h.hexdigest()


def _execute_job(pool: TaskPool, job: Mapping[str, Any], tick: Callable[[int], None] | None) -> list[dict[str, Any]]:
    cfg = job["config"]
    opts = cfg["sampler_options"].get(job["sampler"], {})
    if job["kind"] == "run" and cfg.get("pool") == V2_POOL:
        v2pool, psplit, groups = v2_inputs(job["seed"], cfg.get("split"))
        return run_one(v2pool, job["sampler"], job["seed"], steps=cfg["steps"], batch_size=cfg["batch_size"],
                       group_size=cfg["group_size"], learner=cfg["learner"], sampler_options=opts, on_step=tick,
                       split=psplit, eval_rollouts=cfg.get("eval_rollouts", 0), learner_kind="neural",
                       families=V2_POOL, family_seed=job["seed"], groups=groups,
                       score_steps=cfg.get("score_steps", ()))
    if job["kind"] == "run":
        return run_one(pool, job["sampler"], job["seed"], steps=cfg["steps"], batch_size=cfg["batch_size"],
                       group_size=cfg["group_size"], learner=cfg["learner"], sampler_options=opts, on_step=tick,
                       split=cfg.get("split"), eval_rollouts=cfg.get("eval_rollouts", 0),
                       learner_kind=cfg.get("learner_kind", "model"), families=cfg.get("families"))
    return run_coldstart(pool, job["sampler"], cfg["coldstart_runs"], cfg["coldstart_steps"],
                         batch_size=cfg["batch_size"], group_size=cfg["group_size"], learner=cfg["learner"],
                         sampler_options=opts, on_step=tick, split=cfg.get("split"),
                         learner_kind=cfg.get("learner_kind", "model"), families=cfg.get("families"))


def _job_file(run_dir: Path, job: Mapping[str, Any]) -> Path:
    if job["kind"] == "run":
        return run_dir / "runs" / f"{job['sampler']}__seed{job['seed']}.jsonl"
    return run_dir / "runs" / f"{job['sampler']}__coldstart.jsonl"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _job_units(job: Mapping[str, Any]) -> int:
    cfg = job["config"]
    return cfg["steps"] if job["kind"] == "run" else cfg["coldstart_runs"] * cfg["coldstart_steps"]


def run_benchmark(config: BenchConfig, run_dir: str | os.PathLike[str], *, pool: TaskPool,
                  pool_source: str = "", workers: int | None = None, ray_address: str | None = None,
                  use_ray: bool = False, progress: Callable[[int, int], None] | None = None,
                  plots: bool = True) -> dict[str, Any]:
    """Run (or resume) a benchmark into ``run_dir`` and return its summary.

    ``progress(done_units, total_units)`` is called as steps finish (units: sampler steps).
    Raises ``FileExistsError`` when ``run_dir`` holds a run with another configuration or pool.
    """
    config.validate()
    run_path = Path(run_dir)
    run_path.mkdir(parents=True, exist_ok=True)
    v2 = config.pool == V2_POOL
    fingerprint = v2_fingerprint(config.seeds) if v2 else pool.fingerprint()
    digest = config.digest(fingerprint)
    cfg_file = run_path / "config.json"
    if cfg_file.exists():
        old = json.loads(cfg_file.read_text())
        if old.get("digest") != digest:
            raise FileExistsError(f"{run_path} holds a benchmark run with another configuration or pool "
                                  f"(digest {old.get('digest')} != {digest}); use another directory")
    else:
        _write_atomic(cfg_file, json.dumps({"digest": digest, "config": asdict(config), "pool_source": pool_source,
                                            "pool_fingerprint": fingerprint, "pool_tasks": len(pool),
                                            "pool_envs": len(pool.envs)}, indent=2))
    cfg_dict = asdict(config)
    jobs: list[dict[str, Any]] = []
    for name in config.samplers:
        for seed in config.seeds:
            jobs.append({"kind": "run", "sampler": name, "seed": seed, "config": cfg_dict})
    if config.coldstart_runs > 0:
        for name in config.coldstart_samplers:
            jobs.append({"kind": "coldstart", "sampler": name, "seed": -1, "config": cfg_dict})
    total = sum(_job_units(j) for j in jobs)
    todo = [j for j in jobs if not _job_file(run_path, j).exists()]
    split_file = run_path / "split.json"
    if v2 and not split_file.exists():
        _write_atomic(split_file, json.dumps(_v2_split_info(config), indent=2))
    psplit = None if v2 else bench_split(pool, config.split, learner_prompts(config.learner_kind, config.families))
    if not split_file.exists():
        info = psplit.describe()
        info["learner"] = config.learner_kind
    if not split_file.exists() and config.learner_kind == "model":
        model = LearnerModel(pool, LearnerConfig.from_dict(config.learner), seed=config.seeds[0])
        info["sharing_degree"] = {
            "heldout_envs": sharing_degree(model, psplit.train_positions, psplit.heldout_env_positions),
            "heldout_tasks": sharing_degree(model, psplit.train_positions, psplit.heldout_task_positions),
            "per_env": {e: sharing_degree(model, psplit.train_positions,
                                          [i for i in psplit.heldout_env_positions if model.envs[i] == e])
                        for e in psplit.heldout_envs},
        }
    if not split_file.exists():
        _write_atomic(split_file, json.dumps(info, indent=2))
    if psplit is not None and any(j["sampler"].startswith("envsched") for j in todo):
        envsched_graph(psplit.train)  # once, before the workers fork
    done_units = total - sum(_job_units(j) for j in todo)
    # Long jobs first (EnvSched variants and cold starts) for better packing.
    todo.sort(key=lambda j: (j["kind"] != "coldstart", not j["sampler"].startswith("envsched")))
    if progress:
        progress(done_units, total)

    def finish(job: Mapping[str, Any], recs: list[dict[str, Any]]) -> None:
        _write_atomic(_job_file(run_path, job), "".join(json.dumps(r) + "\n" for r in recs))

    if todo:
        if use_ray or ray_address:
            done_units = _run_ray(todo, pool, ray_address, finish, progress, done_units, total)
        elif (workers or 1) <= 1:
            for job in todo:
                def tick(_s: int) -> None:
                    nonlocal done_units
                    done_units += 1
                    if progress:
                        progress(done_units, total)
                finish(job, _execute(pool, job, tick))
        else:
            # Not multiprocessing.Pool: its workers are daemonic and may not start processes, and a BFCL replay
            # runs its calls in a worker process of its own (envsched.envs.bfcl).
            from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
            queue = ctx.Queue()
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                     initargs=(pool, queue)) as executor:
                futures = {executor.submit(_job, job) for job in todo}
                while futures:
                    done, futures = wait(futures, timeout=0.2, return_when=FIRST_COMPLETED)
                    while not queue.empty():
                        queue.get_nowait()
                        done_units += 1
                    for fut in done:
                        job, recs = fut.result()
                        finish(job, recs)
                    if progress:
                        progress(min(done_units, total), total)
    from envsched_lab.report import write_report

    return write_report(run_path, config, plots=plots)


def _v2_split_info(config: BenchConfig) -> dict[str, Any]:
    """``split.json`` of a v2 run: each seed's pool and split (its own held-out surfaces and tasks)."""
    from envsched_lab.families.v2 import SKILLS, SURFACES

    seeds = {}
    for seed in config.seeds:
        pool, psplit, groups = v2_inputs(seed, config.split)
        info = psplit.describe()
        info["pool_fingerprint"] = pool.fingerprint()
        info["heldout_by_stage"] = {k: int(v.size) for k, v in groups.items()}
        seeds[str(seed)] = info
    return {"pool": V2_POOL, "learner": config.learner_kind, "skills": [s.name for s in SKILLS],
            "surfaces": [s.name for s in SURFACES], "seeds": seeds}


def _run_ray(todo: Sequence[dict[str, Any]], pool: TaskPool, address: str | None,
             finish: Callable[[Mapping[str, Any], list[dict[str, Any]]], None],
             progress: Callable[[int, int], None] | None, done_units: int, total: int) -> int:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray: pip install 'envsched[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address or None, ignore_reinit_error=True, log_to_driver=False)
    pool_ref = ray.put(list(pool))

    @ray.remote
    def remote_job(specs: list[dict[str, Any]], job: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return job, _execute(TaskPool(specs), job, None)

    refs = [remote_job.remote(pool_ref, j) for j in todo]
    while refs:
        ready, refs = ray.wait(refs, num_returns=1)
        job, recs = ray.get(ready[0])
        finish(job, recs)
        done_units += _job_units(job)
        if progress:
            progress(done_units, total)
    return done_units


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t
