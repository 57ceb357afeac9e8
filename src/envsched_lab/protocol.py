"""The evaluation protocol (``docs/evaluation-protocol.md``) as code: ``envsched bench --protocol OUT``.

It runs what the committed protocol fixes and nothing else:

1. **untuned**: every sampler of the primary family, EnvSched, the negative controls and the descriptive
   samplers at their defaults, on every evaluation seed. Each seed gets its own pool instance (the neural
   learner's families generated with that seed) and its own split (split seed = the seed).
2. **tuning**: EnvSched and every primary baseline with knobs get the same number of random-search trials
   (trial 0 = its defaults), each at the reported horizon on the tuning seeds, on pools and splits generated
   from those seeds. The objective is the sampled held-out score at the last step.
3. **tuned**: the best trial of each tuned sampler on the evaluation seeds; samplers without knobs (uniform)
   reuse their untuned runs. The negative controls and the descriptive samplers are run untuned only.
4. **report**: EnvSched against each baseline on the primary endpoint (paired, Holm, TOST within the margin),
   the negative controls as a separate family, and the secondary endpoints (paired intervals, uncorrected).

Every finished run is a file under ``OUT/runs``, so an interrupted protocol resumes where it stopped. A
``--pilot`` runs a few samplers on development seeds and reports the minimum detectable effect at the
protocol's number of seeds; its runs never enter the evaluation.

A round may fix its whole configuration (:data:`FIXED_ROUNDS`: rounds 4 and 5, the v2 pool):
``ProtocolConfig.for_round`` then returns it and refuses any other value, and :func:`protocol_plan` states its runs
and their CPU cost without running anything. On the v2 pool the primary endpoint is the held-out score at an early
step (``endpoint = "heldout@40"``), the held-out score at ``secondary_steps`` and the steps to reach uniform's best
score within ``target_step`` steps (same seed) are secondary, and the trivial baselines of each seed are reported
beside them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import multiprocessing as mp
import os
import platform
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from envsched.validation import check_bool, check_int, check_number
from envsched_lab.stats import compare, describe, minimum_detectable_effect, paired

__all__ = ["DEV_SEEDS", "EVALUATION_ROUNDS", "EVAL_SEEDS", "FIXED_ROUNDS", "ROUND4_TUNING_SEEDS", "TUNING_SEEDS",
           "ProtocolConfig", "check_fixed_round", "load_config", "protocol_plan", "protocol_report", "round4_config",
           "round5_config",
           "round_of", "run_pilot", "run_protocol"]

#: Disjoint seed ranges (docs/evaluation-protocol.md, section 5).
DEV_SEEDS = range(0, 1000)
TUNING_SEEDS = (1000, 1001)
#: Each evaluation round's seeds (docs/evaluation-protocol.md, "Evaluation rounds"): a round evaluates the default
#: of its date on seeds no earlier round used, so no evaluation seed is seen twice.
EVALUATION_ROUNDS: dict[int, tuple[int, ...]] = {1: tuple(range(5000, 5040)), 2: tuple(range(5040, 5080)),
                                                 3: tuple(range(5080, 5120)), 4: tuple(range(5120, 5160)),
                                                 5: tuple(range(5160, 5200))}
#: Round 4's tuning seeds (docs/evaluation-protocol.md, "Round 4 (v2)"): four seeds per trial, so that a trial's
#: objective has a standard error below the equivalence margin.
ROUND4_TUNING_SEEDS = (1000, 1001, 1002, 1003)
#: The first round's seeds (``ProtocolConfig()``); ``envsched bench --protocol`` runs the latest round.
EVAL_SEEDS = EVALUATION_ROUNDS[1]

#: Secondary endpoints: record key at the last step (``last``) or summarised over the run (``mean``/``auc``).
SECONDARY = {
    "heldout_b": ("last", "held-out score, held-out families (new environments)"),
    "heldout_a": ("last", "held-out score, held-out tasks of training families"),
    "heldout_expected": ("last", "expected held-out success of one sampled answer"),
    "score": ("last", "training-pool score"),
    "heldout_auc": ("auc", "area under the held-out curve (mean over evaluation points)"),
    "envs_covered": ("mean", "environments per batch"),
    "batch_variance": ("mean", "batch reward variance"),
    "signal_per_episode": ("last", "signal groups per episode"),
}


@dataclass(frozen=True)
class ProtocolConfig:
    """What the protocol runs (defaults: the committed protocol)."""

    learner: str = "neural"
    method: str = "envsched"
    primary: tuple[str, ...] = ("uniform", "plr", "mopps", "dps", "sec")
    controls: tuple[str, ...] = ("envsched-shuffled-graph", "envsched-noise-features")
    descriptive: tuple[str, ...] = ("envsched-paper",)
    eval_seeds: tuple[int, ...] = EVAL_SEEDS
    tuning_seeds: tuple[int, ...] = TUNING_SEEDS
    trials: int = 8
    steps: int = 200
    batch_size: int = 32
    group_size: int = 8
    margin: float = 2.0
    alpha: float = 0.05
    endpoint: str = "heldout"
    eval_rollouts: int = 4
    families: str | None = None
    tune: bool = True
    learner_options: dict[str, Any] = field(default_factory=dict)
    #: ``None``: the neural learner's task families (``families``) or the simulated learner's pool; ``"v2"``:
    #: the v2 pool (``envsched_lab.families.v2``), one instance and split per seed.
    pool: str | None = None
    #: Steps whose held-out score is a secondary endpoint (``heldout@T``), beside the primary ``endpoint``.
    secondary_steps: tuple[int, ...] = ()
    #: With a value: a secondary endpoint, the steps a run needs to reach uniform's best held-out score within
    #: this many steps on the same seed (``steps_to_target``; a run that never reaches it is left out).
    target_step: int | None = None

    def __post_init__(self) -> None:
        from envsched_lab.runner import SAMPLER_NAMES

        for name in (self.method, *self.primary, *self.controls, *self.descriptive):
            if name not in SAMPLER_NAMES:
                raise ValueError(f"protocol: unknown sampler {name!r}")
        seeds = (*self.eval_seeds, *self.tuning_seeds)
        if len(set(seeds)) != len(seeds):
            raise ValueError("protocol: evaluation and tuning seeds must be distinct")
        if set(self.eval_seeds) & set(DEV_SEEDS) or set(self.tuning_seeds) & set(DEV_SEEDS):
            raise ValueError("protocol: development seeds (0-999) are never evaluation or tuning seeds")
        for name in ("trials", "steps", "batch_size", "group_size", "eval_rollouts"):
            # a numpy integer is stored as the int it is (the digest is the config's JSON)
            object.__setattr__(self, name, check_int(getattr(self, name), f"protocol: {name}", low=1))
        if len(self.eval_seeds) < 2:
            raise ValueError("protocol: at least 2 evaluation seeds")
        check_number(self.margin, "protocol: the equivalence margin", low=0, low_open=True)
        check_number(self.alpha, "protocol: alpha", low=0, high=1, low_open=True, high_open=True)
        check_bool(self.tune, "protocol: tune")
        for name in ("margin", "alpha"):
            if not isinstance(getattr(self, name), int | float):
                object.__setattr__(self, name, float(getattr(self, name)))
        if self.pool not in (None, "v2"):
            raise ValueError(f"protocol: pool {self.pool!r} is not one of None (the task families) and 'v2'")
        if self.pool == "v2" and (self.learner != "neural" or self.families is not None):
            raise ValueError("protocol: the v2 pool is the neural learner's and generates its own tasks (families "
                             "must be None)")
        steps = [*([self.endpoint_step] if self.endpoint_step is not None else []), *self.secondary_steps,
                 *([self.target_step] if self.target_step is not None else [])]
        for t in steps:
            check_int(t, "protocol: an endpoint's step", low=1, high=self.steps)
        object.__setattr__(self, "secondary_steps", tuple(int(t) for t in self.secondary_steps))

    @property
    def endpoint_step(self) -> int | None:
        """The step of the primary endpoint (``endpoint = "heldout@T"``); ``None`` for the last step."""
        name, sep, step = self.endpoint.partition("@")
        if name != "heldout" or (sep and not step.isdigit()):
            raise ValueError(f"protocol: endpoint {self.endpoint!r} is not 'heldout' or 'heldout@STEP'")
        return int(step) if sep else None

    @property
    def tuning_objective(self) -> str:
        """The run summary's key a tuning trial is judged by: the sampled held-out score at the last step when the
        primary endpoint is the last step's (``eval_rollouts`` sampled answers per held-out task), the primary
        endpoint itself otherwise (the v2 pool's score is already the expected success of one sampled answer)."""
        return "heldout_sampled" if self.endpoint_step is None else self.endpoint

    @property
    def samplers(self) -> tuple[str, ...]:
        out: list[str] = []
        for name in (self.method, *self.primary, *self.controls, *self.descriptive):
            if name not in out:
                out.append(name)
        return tuple(out)

    def digest(self) -> str:
        """A digest of the configuration; the fields added for the v2 pool count only where set, so a folder of
        an earlier round keeps its digest."""
        raw = asdict(self)
        for name, default in _LATER_FIELDS.items():
            if raw[name] == default:
                del raw[name]
        return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ProtocolConfig:
        """Inverse of ``dataclasses.asdict`` after a JSON round trip (lists back to tuples)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})

    @classmethod
    def for_round(cls, round_: int, **overrides: Any) -> ProtocolConfig:
        """The protocol with evaluation round ``round_``'s seeds (:data:`EVALUATION_ROUNDS`); a round whose whole
        configuration is fixed (:data:`FIXED_ROUNDS`) takes no override."""
        if round_ not in EVALUATION_ROUNDS:
            raise ValueError(f"protocol: evaluation round {round_!r} is not one of {sorted(EVALUATION_ROUNDS)}")
        if round_ in FIXED_ROUNDS:
            if overrides:
                raise ValueError(f"protocol: evaluation round {round_}'s configuration is fixed "
                                 f"(docs/evaluation-protocol.md); it takes no {', '.join(sorted(overrides))}")
            return FIXED_ROUNDS[round_]()
        return cls(eval_seeds=EVALUATION_ROUNDS[round_], **overrides)


#: Fields added after rounds 1-3 ran, with their defaults (left out of the digest while at them).
_LATER_FIELDS: dict[str, Any] = {"pool": None, "secondary_steps": (), "target_step": None}


def round4_config() -> ProtocolConfig:
    """Round 4 as committed (docs/evaluation-protocol.md, "Round 4 (v2)"): EnvSched's default on the v2 pool with
    the configuration its gate passed with (the neural learner's ``V2_LEARNER``, 120 steps, batches of 64 x 8),
    the held-out score at step 40 primary and at step 120 secondary, against uniform, PLR, MoPPS, DPS, SEC and
    GRESO; its no-graph ablation and the two graph controls as the second family; the paper preset and both
    oracles reported beside them; six tuning trials on four tuning seeds per tuned sampler."""
    from envsched_lab.families.v2 import V2_LEARNER, V2_POOL

    return ProtocolConfig(
        learner="neural", method="envsched", primary=("uniform", "plr", "mopps", "dps", "sec", "greso"),
        controls=("envsched-no-graph", "envsched-shuffled-graph", "envsched-noise-features"),
        descriptive=("envsched-paper", "oracle-variance", "oracle-coverage"), eval_seeds=EVALUATION_ROUNDS[4],
        tuning_seeds=ROUND4_TUNING_SEEDS, trials=6, steps=120, batch_size=64, group_size=8, margin=2.0, alpha=0.05,
        endpoint="heldout@40", families=None, tune=True, learner_options=dict(V2_LEARNER), pool=V2_POOL,
        secondary_steps=(120,), target_step=120)


def round5_config() -> ProtocolConfig:
    """Round 5 as committed (docs/evaluation-protocol.md, "Round 5 (v2)"): the default with the paper's fixed split
    and coverage ranking, on round 4's pool, learner, endpoints, margin and statistics, on fresh seeds, untuned
    only. Against uniform, PLR, MoPPS, DPS and SEC (the primary family; GRESO, worse than the default in round 4,
    is left out); its no-graph ablation and the former default with both adaptive rules (``envsched-adaptive``,
    round 4's default) as the second family; the gate's two oracles reported beside them."""
    return replace(
        round4_config(), primary=("uniform", "plr", "mopps", "dps", "sec"),
        controls=("envsched-no-graph", "envsched-adaptive"), descriptive=("oracle-variance", "oracle-coverage"),
        eval_seeds=EVALUATION_ROUNDS[5], tune=False)


#: Rounds whose whole configuration is fixed: ``round -> its configuration``.
FIXED_ROUNDS: dict[int, Callable[[], ProtocolConfig]] = {4: round4_config, 5: round5_config}


def load_config(out_dir: str | os.PathLike[str]) -> ProtocolConfig | None:
    """The configuration a protocol folder was started with (``protocol-config.json``), to resume or report it
    again; ``None`` for a folder without one."""
    path = Path(out_dir) / "protocol-config.json"
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())["config"]
        config = ProtocolConfig.from_dict(raw)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a protocol configuration: {exc}") from None
    return config


# ------------------------------------------------------------------------------------------------ one run
def _pool_for(config: ProtocolConfig, seed: int) -> Any:
    if config.learner == "neural":
        from envsched_lab.families import DEFAULT_FAMILIES_REF, build_family_pool

        return build_family_pool(config.families or DEFAULT_FAMILIES_REF, seed=seed).pool
    from envsched_lab.pools import load_bench_pool

    return load_bench_pool("default")[0]


def _summarise_run(records: Sequence[Mapping[str, Any]], config: ProtocolConfig | None = None) -> dict[str, Any]:
    last = records[-1]
    out: dict[str, float] = {}
    for key, (how, _) in SECONDARY.items():
        if how == "last":
            out[key] = float(last.get(key, math.nan))
        elif how == "mean":
            out[key] = float(np.mean([r[key] for r in records]))
    held = [float(r["heldout"]) for r in records if math.isfinite(float(r.get("heldout", math.nan)))]
    out["heldout_auc"] = float(np.mean(held)) if held else math.nan
    for key in ("heldout", "heldout_sampled", "heldout_initial", "rollouts", "cum_cost"):
        out[key] = float(last.get(key, records[0].get(key, math.nan)))
    if config is None or config.pool is None:
        return out
    # the v2 pool: the held-out score at the endpoints' steps, the curve (steps to uniform's best), the greedy
    # score beside the expected one, and the seed's trivial baselines
    for t in sorted({t for t in (config.endpoint_step, *config.secondary_steps) if t is not None}):
        rec = records[t - 1]
        if int(rec["step"]) != t or not rec.get("evaluated", True):
            raise ValueError(f"protocol: the held-out score was not evaluated at step {t}")
        out[f"heldout@{t}"] = float(rec["heldout"])
    out["heldout_greedy"] = float(last.get("heldout_greedy", math.nan))
    out["heldout_curve"] = [[0, float(records[0]["heldout_initial"])]] + \
        [[int(r["step"]), float(r["heldout"])] for r in records if r.get("evaluated")]
    for key in ("baseline_constant", "baseline_env_mode"):
        out[key] = float(records[0].get(key, math.nan))
    return out


def _run_job(job: Mapping[str, Any]) -> dict[str, Any]:
    from envsched_lab.runner import run_one

    cfg = ProtocolConfig.from_dict(job["config"])
    seed = int(job["seed"])
    started = time.process_time()
    sampled = cfg.eval_rollouts if job["phase"] == "tuning" and cfg.tuning_objective == "heldout_sampled" else 0
    if cfg.pool is not None:
        from envsched_lab.runner import v2_inputs

        pool, psplit, groups = v2_inputs(seed)
        records = run_one(pool, job["sampler"], seed, steps=cfg.steps, batch_size=cfg.batch_size,
                          group_size=cfg.group_size, learner=cfg.learner_options, sampler_options=job["options"],
                          split=psplit, eval_rollouts=sampled, learner_kind="neural", families=cfg.pool,
                          family_seed=seed, groups=groups,
                          score_steps=[t for t in (cfg.endpoint_step, *cfg.secondary_steps) if t is not None])
    else:
        records = run_one(_pool_for(cfg, seed), job["sampler"], seed, steps=cfg.steps, batch_size=cfg.batch_size,
                          group_size=cfg.group_size, learner=cfg.learner_options, sampler_options=job["options"],
                          split={"split_seed": seed}, eval_rollouts=sampled, learner_kind=cfg.learner,
                          families=cfg.families if cfg.learner == "neural" else None,
                          family_seed=seed if cfg.learner == "neural" else 0)
    return {**{k: job[k] for k in ("phase", "sampler", "seed", "options", "trial")},
            "summary": _summarise_run(records, cfg), "cpu_s": round(time.process_time() - started, 2),
            "commit": _commit()}


def _commit() -> str:
    """The git commit of the running code ("" outside a git checkout)."""
    commit = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
    return commit


def _job_path(out: Path, job: Mapping[str, Any]) -> Path:
    tag = f"{job['sampler']}__t{job['trial']}" if job["phase"] == "tuning" else job["sampler"]
    return out / "runs" / job["phase"] / f"{tag}__{job['seed']}.json"


def _execute(out: Path, jobs: Sequence[dict[str, Any]], workers: int,
             progress: Callable[[int, int], None] | None) -> list[dict[str, Any]]:
    """Run the jobs not already on disk; return every job's result (from disk or fresh)."""
    todo = [j for j in jobs if not _job_path(out, j).exists()]
    done = len(jobs) - len(todo)
    if progress:
        progress(done, len(jobs))

    def finish(result: dict[str, Any]) -> None:
        nonlocal done
        path = _job_path(out, result)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result, indent=1, default=float))
        os.replace(tmp, path)
        done += 1
        if progress:
            progress(done, len(jobs))

    if workers <= 1:
        for job in todo:
            finish(_checked_run(job, _run_job))
    elif todo:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as executor:
            futures = {executor.submit(_run_job, job): job for job in todo}
            pending = set(futures)
            try:
                while pending:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        finish(_checked_run(futures[fut], lambda _job, fut=fut: fut.result()))
            except BaseException:
                # stop at the first failure: the queued runs are cancelled (the running ones finish and are
                # dropped), the finished ones are on disk, and a rerun resumes from them
                executor.shutdown(wait=True, cancel_futures=True)
                raise
    return [json.loads(_job_path(out, j).read_text()) for j in jobs]


def _checked_run(job: Mapping[str, Any], run: Callable[[Mapping[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """``run(job)``, with a failure re-raised as a ``RuntimeError`` that names the run."""
    try:
        return run(job)
    except Exception as exc:
        raise RuntimeError(f"protocol run failed: {job['phase']} {job['sampler']} seed {job['seed']} trial "
                           f"{job['trial']}: {type(exc).__name__}: {exc}") from exc


def _job(config: ProtocolConfig, phase: str, sampler: str, seed: int, options: Mapping[str, Any] | None = None,
         trial: int = 0) -> dict[str, Any]:
    return {"config": asdict(config), "phase": phase, "sampler": sampler, "seed": int(seed),
            "options": dict(options or {}), "trial": trial}


# ------------------------------------------------------------------------------------------------ phases
def _tuning_plan(config: ProtocolConfig) -> dict[str, list[dict[str, Any]]]:
    """Sampler -> its trials' options (trial 0: defaults), drawn as ``envsched bench --tune`` draws them."""
    from envsched_lab.tuning import _draw, tuning_space

    plan: dict[str, list[dict[str, Any]]] = {}
    for name in (config.method, *config.primary):
        space = tuning_space(name)
        if not space:
            continue
        rng = np.random.default_rng(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
        plan[name] = [{}] + [_draw(space, rng) for _ in range(config.trials - 1)]
    return plan


def round_of(config: ProtocolConfig) -> int | None:
    """The evaluation round whose seeds ``config`` evaluates (:data:`EVALUATION_ROUNDS`); ``None`` for other seeds."""
    return next((r for r, seeds in EVALUATION_ROUNDS.items() if tuple(config.eval_seeds) == seeds), None)


def check_fixed_round(config: ProtocolConfig) -> None:
    """``ValueError`` when ``config`` evaluates any seed of a round whose configuration is fixed
    (:data:`FIXED_ROUNDS`) with another configuration than that round's."""
    for r, make in FIXED_ROUNDS.items():
        if set(config.eval_seeds) & set(EVALUATION_ROUNDS[r]) and config.digest() != make().digest():
            raise ValueError(f"protocol: evaluation round {r}'s seeds run only with round {r}'s configuration "
                             f"(docs/evaluation-protocol.md; ProtocolConfig.for_round({r}))")


#: CPU seconds of one v2 run at 120 steps x 64 x 8 with the seed's pre-training cached, per sampler, measured on
#: development seeds (docs/evaluation-protocol.md, "Round 4 (v2)"); a sampler not listed counts as the largest.
V2_RUN_CPU_S: dict[str, float] = {
    "envsched": 16.6, "uniform": 14.0, "plr": 15.3, "mopps": 15.3, "dps": 15.7, "sec": 12.9, "greso": 14.2,
    "envsched-no-graph": 17.3, "envsched-shuffled-graph": 17.1, "envsched-noise-features": 17.5,
    "envsched-paper": 17.5, "oracle-variance": 23.3, "oracle-coverage": 12.9, "envsched-adaptive": 16.6}
#: CPU seconds of one seed's pre-training on the v2 pool (once per seed, cached for every sampler of that seed).
V2_PRETRAIN_CPU_S = 90.0
#: CPU seconds of one run on the task families at 200 steps x 32 x 8 (section 7: 11.5 s measured in round 1).
V1_RUN_CPU_S = 14.0


def protocol_plan(config: ProtocolConfig, out_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """What :func:`run_protocol` would run for ``config``, without running or writing anything: the runs of each
    phase, the seeds' pre-trainings and an estimate of the CPU time from the measured per-run costs (scaled by
    the rollouts per run), and, for an existing ``out_dir``, how many runs it already holds."""
    rollouts = config.steps * config.batch_size * config.group_size
    if config.pool is not None:
        scale = rollouts / (120 * 64 * 8)
        worst = max(V2_RUN_CPU_S.values(), default=30.0)
        cost = {s: scale * V2_RUN_CPU_S.get(s, worst) for s in config.samplers}
        pretrain = V2_PRETRAIN_CPU_S * (len(config.eval_seeds) + (len(config.tuning_seeds) if config.tune else 0))
    else:
        cost = {s: V1_RUN_CPU_S * rollouts / (200 * 32 * 8) for s in config.samplers}
        pretrain = 0.0
    plan = _tuning_plan(config) if config.tune else {}
    jobs = [_job(config, "untuned", s, seed) for s in config.samplers for seed in config.eval_seeds]
    jobs += [_job(config, "tuning", s, seed, opts, k) for s, options in plan.items()
             for k, opts in enumerate(options) for seed in config.tuning_seeds]
    jobs += [_job(config, "tuned", s, seed) for s in plan for seed in config.eval_seeds]
    done = sum(_job_path(Path(out_dir), j).exists() for j in jobs) if out_dir is not None else 0
    runs = {phase: sum(j["phase"] == phase for j in jobs) for phase in ("untuned", "tuning", "tuned")}
    run_cpu = float(sum(cost[j["sampler"]] for j in jobs))
    return {"round": round_of(config), "digest": config.digest(), "method": config.method,
            "samplers": list(config.samplers),
            "primary": list(config.primary), "controls": list(config.controls),
            "descriptive": list(config.descriptive), "tuned": list(plan), "trials": config.trials,
            "eval_seeds": [config.eval_seeds[0], config.eval_seeds[-1], len(config.eval_seeds)],
            "tuning_seeds": list(config.tuning_seeds), "runs": runs, "total_runs": len(jobs), "done": done,
            "run_cpu_s": {s: round(c, 1) for s, c in cost.items()}, "pretrain_cpu_s": pretrain,
            "cpu_seconds": run_cpu + pretrain, "cpu_hours": (run_cpu + pretrain) / 3600}


def run_protocol(config: ProtocolConfig, out_dir: str | os.PathLike[str], *, workers: int = 1,
                 progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the protocol into ``out_dir`` and write ``protocol-report.json`` and ``.md``. The folder's
    ``protocol-config.json`` keeps the configuration and its round; a fixed round's seeds run only with that
    round's configuration."""
    check_fixed_round(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_file = out / "protocol-config.json"
    if cfg_file.exists():
        old = json.loads(cfg_file.read_text())
        if old.get("digest") != config.digest():
            raise FileExistsError(f"{out} holds a protocol run with another configuration; use another folder")
    else:
        cfg_file.write_text(json.dumps({"digest": config.digest(), "round": round_of(config),
                                        "config": asdict(config)}, indent=2))

    def tick(phase: str) -> Callable[[int, int], None] | None:
        return (lambda d, t: progress(phase, d, t)) if progress else None

    untuned = _execute(out, [_job(config, "untuned", s, seed) for s in config.samplers
                             for seed in config.eval_seeds], workers, tick("untuned"))
    tuned_params: dict[str, dict[str, Any]] = {}
    tuned: list[dict[str, Any]] = []
    if config.tune:
        plan = _tuning_plan(config)
        trials = _execute(out, [_job(config, "tuning", s, seed, opts, k) for s, options in plan.items()
                                for k, opts in enumerate(options) for seed in config.tuning_seeds],
                          workers, tick("tuning"))
        for name, options in plan.items():
            objective = [float(np.mean([r["summary"][config.tuning_objective] for r in trials
                                        if r["sampler"] == name and r["trial"] == k])) for k in range(len(options))]
            best = int(np.argmax(objective))  # first best: ties keep the earlier trial (the defaults first)
            tuned_params[name] = {"params": options[best], "trial": best, "objective": objective[best],
                                  "trials": [{"params": o, "objective": v}
                                             for o, v in zip(options, objective, strict=True)]}
        tuned = _execute(out, [_job(config, "tuned", s, seed, tuned_params[s]["params"])
                               for s in tuned_params for seed in config.eval_seeds], workers, tick("tuned"))
    report = protocol_report(config, untuned, tuned, tuned_params, tuning=trials if config.tune else ())
    (out / "protocol-report.json").write_text(json.dumps(report, indent=2, default=float))
    (out / "protocol-report.md").write_text(report_markdown(report))
    from envsched_lab.report import has_module

    if has_module("matplotlib"):
        plot_report(report, out / "protocol-report.png")
    return report


def plot_report(report: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """A forest plot of the report: EnvSched minus each baseline and control, mean and 95 % interval, untuned
    and tuned side by side, with the equivalence band of +-margin shaded (needs matplotlib: the ``bench``
    extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = report["config"]
    margin = float(cfg["margin"])
    untuned = report["untuned"]
    tuned = (report.get("tuned") or {}).get("primary", {})
    rows = [(b, "primary") for b in untuned["primary"]] + [(b, "controls") for b in untuned["controls"]]
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.4))
    ax.axvspan(-margin, margin, color="0.92", zorder=0, label=f"equivalence margin (+-{margin:g})")
    ax.axvline(0.0, color="0.4", lw=0.8, zorder=1)
    for i, (name, fam) in enumerate(rows):
        y = len(rows) - 1 - i
        for comp, dy, colour, label in ((untuned[fam][name], 0.12, "tab:blue", "untuned"),
                                        (tuned.get(name), -0.12, "tab:orange", "tuned")):
            if comp is None:
                continue
            ax.errorbar(comp["mean"], y + dy, xerr=[[comp["mean"] - comp["low"]], [comp["high"] - comp["mean"]]],
                        fmt="o", color=colour, ms=4, capsize=3, label=label if i == 0 else None, zorder=2)
            ax.annotate(comp["verdict"], (comp["high"], y + dy), xytext=(4, -3), textcoords="offset points",
                        fontsize=7, color=colour)
    ax.set_yticks(range(len(rows)), [f"{cfg['method']} - {name}" for name, _ in reversed(rows)])
    ax.set_xlabel(f"held-out score difference (x100), paired by seed, n = {len(cfg['eval_seeds'])}")
    ax.set_title("Evaluation protocol: EnvSched minus each sampler (95 % intervals)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _values(results: Sequence[Mapping[str, Any]], sampler: str, key: str) -> dict[int, float]:
    return {int(r["seed"]): float(r["summary"][key]) for r in results if r["sampler"] == sampler}


def _mean(values: Mapping[int, float]) -> float:
    return float(np.nanmean(list(values.values()))) if values else math.nan


def _family(config: ProtocolConfig, results: Sequence[Mapping[str, Any]], baselines: Sequence[str],
            key: str) -> dict[str, Any]:
    method = _values(results, config.method, key)
    others = {b: _values(results, b, key) for b in baselines}
    return {b: c.to_dict() for b, c in compare(method, others, margin=config.margin, alpha=config.alpha).items()}


def protocol_report(config: ProtocolConfig, untuned: Sequence[Mapping[str, Any]],
                    tuned: Sequence[Mapping[str, Any]], tuned_params: Mapping[str, Any], *,
                    tuning: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The report's document: verdicts per family and phase, secondary endpoints, means per sampler.

    ``run_commits`` are the commits recorded by the runs themselves (a run written before runs recorded one
    counts as ``"unrecorded"``); ``commit`` is the code that wrote the report, which may be later than the
    runs when a finished folder is reported again. ``cpu_seconds`` covers every run, tuning trials included.
    """
    spec = _secondary(config)
    untuned, tuned = (_with_steps_to_target(config, untuned, untuned),
                      _with_steps_to_target(config, tuned, untuned))
    by_sampler = {r["sampler"]: r for r in tuned}
    tuned_all = list(tuned) + [r for r in untuned if r["sampler"] not in by_sampler]
    mean_keys = (config.endpoint, *spec, *(("target_reached",) if config.target_step is not None else ()))

    def phase(results: Sequence[Mapping[str, Any]], with_controls: bool) -> dict[str, Any]:
        secondary = {}
        baselines = [*config.primary, *config.controls] if with_controls else list(config.primary)
        for key, (_, label) in spec.items():
            comp = _family(config, results, baselines, key)
            secondary[key] = {"label": label,
                              **{b: {k: c[k] for k in ("n", "mean", "low", "high")} for b, c in comp.items()}}
        names = config.samplers if with_controls else (config.method, *config.primary)
        means = {s: {k: _mean(_values(results, s, k)) for k in mean_keys} for s in names}
        return {"primary": _family(config, results, config.primary, config.endpoint),
                "controls": _family(config, results, config.controls, config.endpoint) if with_controls else {},
                "secondary": secondary, "means": means}

    runs = [*untuned, *tuning, *tuned]
    cpu = [float(r.get("cpu_s", 0.0)) for r in runs]
    run_commits = sorted({str(r.get("commit") or "unrecorded") for r in runs})
    doc = {"format": "envsched.protocol/1", "config": asdict(config), "commit": _commit(),
           "run_commits": run_commits,
           "python": platform.python_version(), "cpu_seconds": float(np.sum(cpu)),
           "untuned": phase(untuned, True), "tuned": phase(tuned_all, False) if tuned else None,
           "tuned_params": dict(tuned_params),
           "tuned_minus_untuned": {s: _tuned_gain(untuned, tuned, s, config.endpoint) for s in tuned_params}}
    if config.pool is not None:
        doc.update(_beside(config, untuned))
    return doc


def _secondary(config: ProtocolConfig) -> dict[str, tuple[str, str]]:
    """The secondary endpoints of ``config``: :data:`SECONDARY` for the task families; on the v2 pool the held-out
    score at ``secondary_steps`` and the steps to uniform's best come first, and the greedy held-out score takes
    the place of the expected one (which is the v2 pool's primary score)."""
    if config.pool is None and not config.secondary_steps and config.target_step is None:
        return dict(SECONDARY)
    out = {f"heldout@{t}": ("step", f"held-out score at step {t}") for t in config.secondary_steps}
    if config.target_step is not None:
        out["steps_to_target"] = ("target", f"steps to reach uniform's best held-out score within "
                                            f"{config.target_step} steps (same seed; a run that misses it is left out)")
    for key, value in SECONDARY.items():
        if key == "heldout_expected" and config.pool is not None:
            out["heldout_greedy"] = ("last", "greedy held-out success at the last step")
        else:
            out[key] = value
    return out


def _with_steps_to_target(config: ProtocolConfig, results: Sequence[Mapping[str, Any]],
                          reference: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``results`` with ``steps_to_target`` (the first evaluated step whose held-out score reaches uniform's best
    within ``target_step`` steps on the same seed, from uniform's run in ``reference``; NaN when never reached or
    without uniform's run) and ``target_reached`` (1 or 0) added to each summary."""
    if config.target_step is None:
        return list(results)
    goal = {int(r["seed"]): max(h for t, h in r["summary"]["heldout_curve"] if 0 < t <= config.target_step)
            for r in reference if r["sampler"] == "uniform"}
    out = []
    for r in results:
        g = goal.get(int(r["seed"]), math.nan)
        hit = next((t for t, h in r["summary"]["heldout_curve"] if t > 0 and h >= g - 1e-12), None) \
            if math.isfinite(g) else None
        reached = math.nan if not math.isfinite(g) else float(hit is not None)
        out.append({**r, "summary": {**r["summary"], "steps_to_target": math.nan if hit is None else float(hit),
                                     "target_reached": reached}})
    return out


def _beside(config: ProtocolConfig, untuned: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a v2 report shows beside the verdicts: each seed's trivial baselines (best constant answer, each
    environment's most common training answer) and each oracle minus uniform on the primary endpoint (paired,
    untuned; the positive controls of the gate, reported, never tested)."""
    from envsched_lab.report import paired_difference

    per_seed: dict[str, dict[str, float]] = {}
    for r in untuned:
        per_seed.setdefault(str(r["seed"]), {k: float(r["summary"].get(k, math.nan))
                                             for k in ("baseline_constant", "baseline_env_mode")})
    uniform = _values(untuned, "uniform", config.endpoint)
    return {"baselines": {"constant": _mean({int(k): v["baseline_constant"] for k, v in per_seed.items()}),
                          "env_mode": _mean({int(k): v["baseline_env_mode"] for k, v in per_seed.items()}),
                          "per_seed": per_seed},
            "positive_controls": {s: paired_difference(_values(untuned, s, config.endpoint), uniform)
                                  for s in config.samplers if s.startswith("oracle-")}}


def _tuned_gain(untuned: Sequence[Mapping[str, Any]], tuned: Sequence[Mapping[str, Any]],
                sampler: str, key: str = "heldout") -> dict[str, Any]:
    """Tuned minus untuned ``key`` (the primary endpoint) of ``sampler``, paired by seed (the report's paired
    difference)."""
    from envsched_lab.report import paired_difference

    return paired_difference(_values(tuned, sampler, key), _values(untuned, sampler, key))


def report_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown (what the README quotes)."""

    cfg = report["config"]
    if cfg.get("pool") is not None:
        return _markdown_v2(report)
    lines = [f"# Evaluation protocol report ({cfg['learner']} learner)", "",
             f"Runs at commit {', '.join(f'`{c}`' for c in report.get('run_commits') or ['unrecorded'])}; "
             f"report written at `{report['commit'] or 'unknown'}`; {len(cfg['eval_seeds'])} evaluation seeds "
             f"({cfg['eval_seeds'][0]}-{cfg['eval_seeds'][-1]}); budget {cfg['steps']} x {cfg['batch_size']} x "
             f"{cfg['group_size']} rollouts; margin +-{cfg['margin']:g}; CPU {report['cpu_seconds'] / 60:.0f} min.",
             ""]
    for name in ("untuned", "tuned"):
        ph = report.get(name)
        if not ph:
            continue
        lines += [f"## {name.capitalize()}", "", "| comparison | n | EnvSched - other | 95 % interval | Holm p | "
                  "TOST Holm p | verdict |", "|---|---|---|---|---|---|---|"]
        lines += _comparison_rows(cfg["method"], ph)
        lines += ["| sampler | held-out | held-out families | envs/batch | batch variance |", "|---|---|---|---|---|"]
        for s, m in ph["means"].items():
            lines.append(f"| {s} | {m['heldout']:.2f} | {m['heldout_b']:.2f} | {m['envs_covered']:.2f} | "
                         f"{m['batch_variance']:.4f} |")
        lines.append("")
    if report.get("tuned_minus_untuned"):
        lines += ["## Tuned minus untuned (held-out score)", ""]
        for s, g in report["tuned_minus_untuned"].items():
            lines.append(f"- {s}: {g.get('mean', math.nan):+.2f} [{g.get('low', math.nan):+.2f}, "
                         f"{g.get('high', math.nan):+.2f}]")
    return "\n".join(lines) + "\n"


def _comparison_rows(method: str, phase: Mapping[str, Any]) -> list[str]:
    """A phase's comparison table rows (primary, then controls) and the sentences that describe its primary
    verdicts: the part of the v1 and v2 reports that is the same."""
    from envsched_lab.stats import Comparison

    rows = [f"| {method} vs {c['baseline']} | {c['n']} | {c['mean']:+.2f} | [{c['low']:+.2f}, {c['high']:+.2f}] | "
            f"{c['p_holm']:.3g} | {c['p_equivalence_holm']:.3g} | {c['verdict']} |"
            for fam in ("primary", "controls") for c in phase[fam].values()]
    return [*rows, "", *describe([Comparison(**c) for c in phase["primary"].values()]), ""]


def _markdown_v2(report: Mapping[str, Any]) -> str:
    """A v2 report as Markdown: the verdicts on the primary endpoint (an early step), the secondary steps, the
    steps to uniform's best, the positive controls and the trivial baselines."""

    cfg = report["config"]
    end = cfg["endpoint"]
    steps = [f"heldout@{t}" for t in cfg.get("secondary_steps") or ()]
    seeds = cfg["eval_seeds"]
    lines = [f"# Evaluation protocol report ({cfg['learner']} learner, {cfg['pool']} pool)", "",
             f"Runs at commit {', '.join(f'`{c}`' for c in report.get('run_commits') or ['unrecorded'])}; "
             f"report written at `{report['commit'] or 'unknown'}`; {len(seeds)} evaluation seeds "
             f"({seeds[0]}-{seeds[-1]}); budget {cfg['steps']} x {cfg['batch_size']} x {cfg['group_size']} rollouts; "
             f"primary endpoint {end}; margin +-{cfg['margin']:g}; CPU {report['cpu_seconds'] / 60:.0f} min.", ""]
    for name in ("untuned", "tuned"):
        ph = report.get(name)
        if not ph:
            continue
        lines += [f"## {name.capitalize()}", "", f"| comparison ({end}) | n | EnvSched - other | 95 % interval | "
                  "Holm p | TOST Holm p | verdict |", "|---|---|---|---|---|---|---|"]
        lines += _comparison_rows(cfg["method"], ph)
        keys = [k for k in (*steps, "steps_to_target") if k in ph["secondary"]]
        if keys:
            lines += ["| secondary (paired, unadjusted) | " + " | ".join(ph["secondary"][k]["label"] for k in keys)
                      + " |", "|---|" + "---|" * len(keys)]
            for b in ph["primary"]:
                cells = [ph["secondary"][k].get(b) for k in keys]
                lines.append(f"| {cfg['method']} - {b} | " + " | ".join(
                    f"{c['mean']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] (n={c['n']})" if c else "-"
                    for c in cells) + " |")
            lines.append("")
        lines += [f"| sampler | {end} | " + " | ".join(steps) + " | steps to uniform's best (share reached) | "
                  "envs/batch | batch variance |", "|---|---|" + "---|" * len(steps) + "---|---|---|"]
        for s, m in ph["means"].items():
            lines.append(f"| {s} | {m[end]:.2f} | " + " | ".join(f"{m[k]:.2f}" for k in steps)
                         + f" | {m.get('steps_to_target', math.nan):.0f} ({m.get('target_reached', math.nan):.2f}) | "
                           f"{m['envs_covered']:.2f} | {m['batch_variance']:.4f} |")
        lines.append("")
    if report.get("positive_controls"):
        lines += [f"## Beside the verdicts (untuned, {end}; reported, never tested)", ""]
        for s, g in report["positive_controls"].items():
            lines.append(f"- {s} - uniform: {g.get('mean', math.nan):+.2f} [{g.get('low', math.nan):+.2f}, "
                         f"{g.get('high', math.nan):+.2f}]")
        b = report.get("baselines") or {}
        lines += [f"- best constant answer: {b.get('constant', math.nan):.2f}; each environment's most common "
                  f"training answer: {b.get('env_mode', math.nan):.2f} (mean over seeds)", ""]
    if report.get("tuned_minus_untuned"):
        lines += [f"## Tuned minus untuned ({end})", ""]
        for s, g in report["tuned_minus_untuned"].items():
            lines.append(f"- {s}: {g.get('mean', math.nan):+.2f} [{g.get('low', math.nan):+.2f}, "
                         f"{g.get('high', math.nan):+.2f}]")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ pilot
def run_pilot(out_dir: str | os.PathLike[str], *, samplers: Sequence[str] = ("uniform", "plr", "envsched"),
              seeds: Sequence[int] = (0, 1, 2, 3, 4), config: ProtocolConfig | None = None, workers: int = 1,
              progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Development-seed pilot: the standard deviation of paired differences of the primary endpoint and the
    minimum detectable effect at the protocol's number of evaluation seeds (power 0.8)."""
    config = config or ProtocolConfig()
    if not set(seeds) <= set(DEV_SEEDS):
        raise ValueError("the pilot runs on development seeds (0-999) only")
    out = Path(out_dir)
    results = _execute(out, [_job(config, "pilot", s, seed) for s in samplers for seed in seeds], workers, progress)
    n_eval = len(config.eval_seeds)
    pairs: dict[str, Any] = {}
    for i, a in enumerate(samplers):
        for b in samplers[i + 1:]:
            x, y, _ = paired(_values(results, a, config.endpoint), _values(results, b, config.endpoint))
            sd = float(np.std(x - y, ddof=1)) if x.size > 1 else math.nan
            pairs[f"{a} - {b}"] = {"n": int(x.size), "mean": float(np.mean(x - y)), "sd": sd,
                                   "mde_at_eval_seeds": minimum_detectable_effect(sd, n_eval)
                                   if math.isfinite(sd) else math.nan}
    doc = {"seeds": list(seeds), "samplers": list(samplers), "eval_seeds": n_eval, "pairs": pairs,
           "means": {s: float(np.mean(list(_values(results, s, config.endpoint).values()))) for s in samplers}}
    (out / "pilot.json").write_text(json.dumps(doc, indent=2, default=float))
    return doc
