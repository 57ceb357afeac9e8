"""Symmetric tuning: every sampler with knobs gets the same budget, on a pool and seeds no reported run uses.

The protocol (docs/benchmark-learner.md, section 5):

* **Tuning pool**: the reasoning-gym datasets of ``DEFAULT_DATASETS`` but ``arc_1d`` (50; its generator hangs
  with seed 1) generated with seed 1 (other task instances than any reported pool; 8 of the datasets are in
  no reported pool), 50 tasks each (2,500 tasks), held-out split with ``split_seed = 1``. BFCL has no task
  outside the reported pool, so the tuning pool has none.
* **Tuning seeds**: :data:`TUNING_SEEDS` (1000, 1001); reported runs use seeds 0-4.
* **Budget**: ``trials`` configurations per sampler (trial 0 = the sampler's defaults, the others drawn at
  random from :func:`tuning_space`: :data:`TUNING_SPACES`, and for EnvSched's presets the tuning ranges declared
  with their knobs), each run for ``steps`` steps on every tuning seed.
* **Objective**: the Monte-Carlo held-out score at the last step (4 sampled rollouts per held-out task), the
  mean over tuning seeds; never an exact quantity of the learner (expected rewards or variances).

The winner of each sampler is written to a JSON file (default: the packaged ``tuned.json``), which
``envsched bench`` applies to every reported run unless told otherwise.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from envsched.pool.pool import TaskPool
from envsched_lab.variants import bench_samplers

__all__ = ["TUNED_FILE", "TUNING_SEEDS", "TUNING_SPACES", "load_tuned", "tune", "tuning_pool",
           "tuning_space", "with_ablations"]

#: Tuning seeds, disjoint from every reported seed (0-4).
TUNING_SEEDS = (1000, 1001)
#: Where ``envsched bench --tune`` writes by default and what ``envsched bench`` reads.
TUNED_FILE = Path(__file__).with_name("tuned.json")
def without_hanging_datasets(datasets: Sequence[str]) -> list[str]:
    """``datasets`` but ``arc_1d``, whose generator never returns for some seeds
    in reasoning-gym 0.1.25 (``task_recolor_blocks_from_palette`` loops forever looking for a tenth colour among
    nine when a grid has more than nine blocks; it does with seed 1)."""
    return [d for d in datasets if d != "arc_1d"]


#: The split of the tuning pool.
TUNING_SPLIT = {"split_seed": 1}

# Each knob: ("float", low, high, log) or ("choice", [values]). The ranges bracket each method's published
# default (shared/reference/task-selection-methods.md) by a factor of about 3 either way where it is a scale.
TUNING_SPACES: dict[str, dict[str, tuple[Any, ...]]] = {
    "curriculum": {"key": ("choice", ["difficulty", "group", "id"]), "decay": ("float", 0.5, 0.99, False)},
    "mopps": {"forgetting": ("float", 0.0, 1.0, False), "candidate_ratio": ("float", 2.0, 16.0, True)},
    "greso": {"target_zero_variance": ("float", 0.1, 0.5, False), "floor": ("float", 0.005, 0.1, True)},
    # PLR: rho (level_replay_rho) 1.0 in the code's default: every level is played once before any replay
    "plr": {"temperature": ("float", 0.03, 1.0, True), "staleness_coef": ("float", 0.0, 0.5, False),
            "min_seen_fraction": ("choice", [1.0, 0.0])},
    # DPS scripts: lambda 0.5 (Countdown, Geometry3k) and 0.7 (MATH), candidates 8x and 32x
    "dps": {"transition_decay": ("float", 0.3, 1.0, False), "candidate_ratio": ("float", 2.0, 32.0, True)},
    # SEC: alpha 0.5 in every reported run (code default 0.1), tau 1.0 / 0.4 / 0.2 by domain
    # SEC: the code's update gives unplayed arms a zero advantage (zero_fill_unplayed); the paper's text updates
    # only the arms played
    "sec": {"learning_rate": ("float", 0.1, 1.0, True), "temperature": ("float", 0.1, 2.0, True),
            "zero_fill_unplayed": ("choice", [True, False])},
}


def tuning_space(sampler: str) -> dict[str, tuple[Any, ...]]:
    """The knobs tuned for ``sampler`` (empty: nothing to tune). EnvSched's two presets tune what their knobs'
    declarations say (``envsched.method.config.scheduler_tuning_space``: the paper's four open knobs, plus the default's
    own rules for ``envsched``, less those its switches leave unread)."""
    if sampler in ("envsched", "envsched-paper"):
        from envsched.method.config import SchedulerConfig, scheduler_tuning_space

        return scheduler_tuning_space(SchedulerConfig.paper() if sampler == "envsched-paper" else SchedulerConfig())
    return dict(TUNING_SPACES.get(sampler, {}))


def _draw(space: Mapping[str, tuple[Any, ...]], rng: np.random.Generator) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, spec in space.items():
        if spec[0] == "choice":
            out[name] = spec[1][int(rng.integers(len(spec[1])))]
        else:
            _, lo, hi, log = spec
            v = math.exp(rng.uniform(math.log(lo), math.log(hi))) if log else rng.uniform(lo, hi)
            out[name] = round(float(v), 4)
    return out


def tuning_pool(cache: bool = True) -> TaskPool:
    """The tuning pool (module docstring), cached as JSONL in the benchmark cache."""
    from envsched.envs.reasoning_gym import DEFAULT_DATASETS, build_reasoning_gym_pool, rg_version
    from envsched_lab.runner import bench_cache_dir

    path = bench_cache_dir() / f"tuning-pool-rg{rg_version()}-seed1-v2.jsonl"
    if cache and path.exists():
        try:
            return TaskPool.from_file(path)
        except Exception:  # a damaged cache is rebuilt
            pass
    specs = build_reasoning_gym_pool(without_hanging_datasets(DEFAULT_DATASETS), tasks_per_dataset=50, seed=1)
    pool = TaskPool(specs, name="tuning")
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(t) + "\n" for t in pool))
        os.replace(tmp, path)
    return pool


def with_ablations(tuned: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``tuned`` plus, for each EnvSched ablation without values of its own, the tuned values of ``envsched``
    (an ablation is the default with one mechanism removed, not the untuned default)."""
    from envsched_lab.variants import ENVSCHED_ABLATIONS

    out = {k: dict(v) for k, v in tuned.items()}
    if "envsched" in out:
        for name in ENVSCHED_ABLATIONS:
            out.setdefault(name, dict(out["envsched"]))
    return out


def load_tuned(path: str | os.PathLike[str] | None = None) -> dict[str, dict[str, Any]]:
    """Sampler -> tuned options from a file written by :func:`tune` (``{}`` when there is none)."""
    p = Path(path) if path is not None else TUNED_FILE
    if not p.exists():
        if path is not None:
            raise FileNotFoundError(f"tuned-parameters file {p} does not exist")
        return {}
    try:
        data = json.loads(p.read_text())
        return {name: dict(entry["params"]) for name, entry in data["samplers"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{p} is not a tuned-parameters file written by 'envsched bench --tune': {exc}") from None


def tune(samplers: Sequence[str], *, pool: TaskPool | None = None, trials: int = 8, steps: int = 60,
         seeds: Sequence[int] = TUNING_SEEDS, batch_size: int = 64, group_size: int = 8,
         learner: Mapping[str, Any] | None = None, eval_rollouts: int = 4, workers: int = 1,
         out: str | os.PathLike[str] | None = None,
         progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run the protocol for ``samplers`` and write the result to ``out`` (default :data:`TUNED_FILE`).

    Samplers without knobs are recorded with empty parameters. Other samplers already in ``out`` under the
    same protocol are kept. Returns the written document.
    """
    from envsched_lab.runner import run_one

    if trials < 1 or steps < 1 or not seeds:
        raise ValueError("tuning needs trials >= 1, steps >= 1 and at least one seed")
    names = bench_samplers()
    unknown = [name for name in samplers if name not in names]
    if unknown:
        raise ValueError(f"unknown sampler(s) {unknown}; choose from: {', '.join(names)}")
    pool = pool if pool is not None else tuning_pool()
    plan: list[tuple[str, int, dict[str, Any]]] = []
    for name in samplers:
        space = tuning_space(name)
        rng = np.random.default_rng(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
        configs = [{}] + [_draw(space, rng) for _ in range(trials - 1)] if space else [{}]
        plan += [(name, k, c) for k, c in enumerate(configs)]
    jobs = [(name, k, c, seed) for name, k, c in plan for seed in seeds]
    total = len(jobs) * steps
    done = 0
    results: dict[tuple[str, int], list[float]] = {}

    def run(job: tuple[str, int, dict[str, Any], int]) -> float:
        name, _k, c, seed = job
        recs = run_one(pool, name, seed, steps=steps, batch_size=batch_size, group_size=group_size,
                       learner=learner, sampler_options=c, split=TUNING_SPLIT, eval_rollouts=eval_rollouts)
        return float(recs[-1]["heldout_sampled"])

    if workers > 1:
        import multiprocessing as mp

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        from envsched_lab.runner import bench_split, envsched_graph

        if any(j[0].startswith("envsched") for j in jobs):
            envsched_graph(bench_split(pool, TUNING_SPLIT).train)
        from concurrent.futures import ProcessPoolExecutor  # non-daemonic workers: BFCL replays start processes

        _TUNE_WORKER["run"] = run
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as executor:
            for job, value in zip(jobs, executor.map(_tune_job, jobs), strict=True):
                results.setdefault((job[0], job[1]), []).append(value)
                done += steps
                if progress:
                    progress(done, total)
    else:
        for job in jobs:
            results.setdefault((job[0], job[1]), []).append(run(job))
            done += steps
            if progress:
                progress(done, total)
    doc: dict[str, Any] = {
        "format": "envsched.tuned/1",
        "protocol": {"pool": "reasoning-gym DEFAULT_DATASETS but arc_1d, x 50, seed 1", "split": TUNING_SPLIT,
                     "seeds": list(seeds), "trials": trials, "steps": steps, "batch_size": batch_size,
                     "group_size": group_size, "learner": dict(learner or {}),
                     "objective": f"mean held-out reward of {eval_rollouts} sampled rollouts per held-out task "
                                  f"at step {steps}, mean over seeds"},
        "samplers": {},
    }
    for name in samplers:
        trials_ = [(k, c, float(np.mean(results[(name, k)]))) for n, k, c in plan if n == name]
        best = max(trials_, key=lambda x: (x[2], -x[0]))
        doc["samplers"][name] = {"params": best[1], "objective": best[2], "trial": best[0],
                                 "trials": [{"params": c, "objective": v} for _k, c, v in trials_]}
    path = Path(out) if out is not None else TUNED_FILE
    if path.exists():  # samplers tuned earlier under the same protocol are kept (tuning one sampler at a time)
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
        if isinstance(old, dict) and old.get("protocol") == doc["protocol"]:
            doc["samplers"] = {**{k: v for k, v in old.get("samplers", {}).items() if k not in doc["samplers"]},
                               **doc["samplers"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
    return doc


_TUNE_WORKER: dict[str, Any] = {}


def _tune_job(job: tuple[str, int, dict[str, Any], int]) -> float:
    return _TUNE_WORKER["run"](job)
