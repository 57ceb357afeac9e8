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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envsched.validation import check_bool, check_int, check_number
from envsched_lab.stats import compare, describe, minimum_detectable_effect, paired

__all__ = ["DEV_SEEDS", "EVALUATION_ROUNDS", "EVAL_SEEDS", "TUNING_SEEDS", "ProtocolConfig", "load_config",
           "protocol_report", "run_pilot", "run_protocol"]

#: Disjoint seed ranges (docs/evaluation-protocol.md, section 5).
DEV_SEEDS = range(0, 1000)
TUNING_SEEDS = (1000, 1001)
#: Each evaluation round's seeds (docs/evaluation-protocol.md, "Evaluation rounds"): a round evaluates the default
#: of its date on seeds no earlier round used, so no evaluation seed is seen twice.
EVALUATION_ROUNDS: dict[int, tuple[int, ...]] = {1: tuple(range(5000, 5040)), 2: tuple(range(5040, 5080)),
                                                 3: tuple(range(5080, 5120))}
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

    @property
    def samplers(self) -> tuple[str, ...]:
        out: list[str] = []
        for name in (self.method, *self.primary, *self.controls, *self.descriptive):
            if name not in out:
                out.append(name)
        return tuple(out)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ProtocolConfig:
        """Inverse of ``dataclasses.asdict`` after a JSON round trip (lists back to tuples)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})

    @classmethod
    def for_round(cls, round_: int, **overrides: Any) -> ProtocolConfig:
        """The protocol with evaluation round ``round_``'s seeds (:data:`EVALUATION_ROUNDS`)."""
        if round_ not in EVALUATION_ROUNDS:
            raise ValueError(f"protocol: evaluation round {round_!r} is not one of {sorted(EVALUATION_ROUNDS)}")
        return cls(eval_seeds=EVALUATION_ROUNDS[round_], **overrides)


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


def _summarise_run(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
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
    return out


def _run_job(job: Mapping[str, Any]) -> dict[str, Any]:
    from envsched_lab.runner import run_one

    cfg = ProtocolConfig.from_dict(job["config"])
    seed = int(job["seed"])
    started = time.process_time()
    records = run_one(_pool_for(cfg, seed), job["sampler"], seed, steps=cfg.steps, batch_size=cfg.batch_size,
                      group_size=cfg.group_size, learner=cfg.learner_options, sampler_options=job["options"],
                      split={"split_seed": seed}, eval_rollouts=cfg.eval_rollouts if job["phase"] == "tuning" else 0,
                      learner_kind=cfg.learner, families=cfg.families if cfg.learner == "neural" else None,
                      family_seed=seed if cfg.learner == "neural" else 0)
    return {**{k: job[k] for k in ("phase", "sampler", "seed", "options", "trial")},
            "summary": _summarise_run(records), "cpu_s": round(time.process_time() - started, 2),
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


def run_protocol(config: ProtocolConfig, out_dir: str | os.PathLike[str], *, workers: int = 1,
                 progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the protocol into ``out_dir`` and write ``protocol-report.json`` and ``.md``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_file = out / "protocol-config.json"
    if cfg_file.exists():
        old = json.loads(cfg_file.read_text())
        if old.get("digest") != config.digest():
            raise FileExistsError(f"{out} holds a protocol run with another configuration; use another folder")
    else:
        cfg_file.write_text(json.dumps({"digest": config.digest(), "config": asdict(config)}, indent=2))

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
            objective = [float(np.mean([r["summary"]["heldout_sampled"] for r in trials
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
    by_sampler = {r["sampler"]: r for r in tuned}
    tuned_all = list(tuned) + [r for r in untuned if r["sampler"] not in by_sampler]

    def phase(results: Sequence[Mapping[str, Any]], with_controls: bool) -> dict[str, Any]:
        secondary = {}
        baselines = [*config.primary, *config.controls] if with_controls else list(config.primary)
        for key, (_, label) in SECONDARY.items():
            comp = _family(config, results, baselines, key)
            secondary[key] = {"label": label,
                              **{b: {k: c[k] for k in ("n", "mean", "low", "high")} for b, c in comp.items()}}
        names = config.samplers if with_controls else (config.method, *config.primary)
        means = {s: {k: _mean(_values(results, s, k)) for k in (config.endpoint, *SECONDARY)} for s in names}
        return {"primary": _family(config, results, config.primary, config.endpoint),
                "controls": _family(config, results, config.controls, config.endpoint) if with_controls else {},
                "secondary": secondary, "means": means}

    runs = [*untuned, *tuning, *tuned]
    cpu = [float(r.get("cpu_s", 0.0)) for r in runs]
    run_commits = sorted({str(r.get("commit") or "unrecorded") for r in runs})
    return {"format": "envsched.protocol/1", "config": asdict(config), "commit": _commit(),
            "run_commits": run_commits,
            "python": platform.python_version(), "cpu_seconds": float(np.sum(cpu)),
            "untuned": phase(untuned, True), "tuned": phase(tuned_all, False) if tuned else None,
            "tuned_params": dict(tuned_params),
            "tuned_minus_untuned": {s: _tuned_gain(untuned, tuned, s) for s in tuned_params}}


def _tuned_gain(untuned: Sequence[Mapping[str, Any]], tuned: Sequence[Mapping[str, Any]],
                sampler: str) -> dict[str, Any]:
    """Tuned minus untuned held-out score of ``sampler``, paired by seed (the report's paired difference)."""
    from envsched_lab.report import paired_difference

    return paired_difference(_values(tuned, sampler, "heldout"), _values(untuned, sampler, "heldout"))


def report_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown (what the README quotes)."""
    from envsched_lab.stats import Comparison

    cfg = report["config"]
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
        for fam in ("primary", "controls"):
            for c in ph[fam].values():
                lines.append(f"| {cfg['method']} vs {c['baseline']} | {c['n']} | {c['mean']:+.2f} | "
                             f"[{c['low']:+.2f}, {c['high']:+.2f}] | {c['p_holm']:.3g} | "
                             f"{c['p_equivalence_holm']:.3g} | {c['verdict']} |")
        lines += ["", *describe([Comparison(**c) for c in ph["primary"].values()]), ""]
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
