"""Held-out variance prediction on outcomes logged from the neural learner: does what other tasks' rollout groups
say predict whether a task's group has signal?

Data (:func:`envsched_lab.neural.probe.probe_run`): the benchmark's neural learner (``envsched bench --learner
neural``: the default task families, ``NeuralConfig`` defaults, the benchmark's held-out split) trained with the
uniform sampler for ``--steps`` (200) steps of 32 groups x 8 completions on development seeds (default 0-4; the
evaluation seeds 5000-5119 are refused). After 25, 50 and 75 % of the steps, a group of 8 completions of every
task of the training pool (624 tasks, 13 environments) is sampled from the current policy without updating it.
A task "has signal" at a checkpoint when its 8 rewards are mixed.

Predictors of signal, each from *other* tasks of the same run and checkpoint (leave-task-out), of their group
reward variance ``v``:

* ``envsched[F]``: EnvSched's within-environment propagation: the ``K_within`` = 6 within-relation neighbours
  of :func:`envsched.method.graph.build.build_graph` with their adaptive Gaussian weights (the task itself is
  never its own neighbour), on features ``F``;
* ``knn[F]``: unweighted mean ``v`` of the 6 most cosine-similar tasks (any environment) on ``F``;
* ``env_mean``: mean ``v`` of the other tasks of its environment; ``env_tier_mean``: of its environment and
  difficulty tier (the spec's ``difficulty``).

Features ``F``: ``tfidf`` (appendix D's six views, the default ``GraphConfig``) and ``difficulty`` (the same
views, the spec's ``difficulty`` added as a token of the initial-context view); ``tfidf,k16`` and
``difficulty,k16``: the same features with ``K_within`` = 16 (about the size of an environment's tier in this
pool). The specs of this pool hold an instruction drawn from three templates of its environment, the
environment's tools and checks, a category and the difficulty tier; the prompt the network reads is not in them
(no sampler can read it).

History (signal at checkpoint k+1): the task's own ``v`` at checkpoint k (``history``), the within-relation
propagation of the neighbours' ``v`` at checkpoint k (``envsched_lagged[F]``, what a scheduler holds then), the
mean of the two (``history+envsched_lagged[F]``) and the mean of the task's own and its environment's other tasks'
``v`` at checkpoint k (``history+env_mean_lagged``).

Scores: the AUC (``roc_auc_score``'s value) within each run -- one seed at one checkpoint: the tasks a scheduler
chooses among at that moment -- averaged over the runs of a checkpoint (5 seeds) or of all checkpoints
(``pooled``); 95 % percentile bootstrap intervals (2,000 resamples, seed 0) resampling tasks (a task's rows in
every run together) and paired differences on the same resamples, from the functions of
``benchmarks/variance_auc.py``. ``--json`` also holds, as ``all_rows``, the AUC over all rows at once (no
interval), which also credits a predictor for telling runs with more signal from runs with less.

Run: ``python benchmarks/variance_auc_neural.py [--seeds 0 1 2 3 4] [--steps 200] [--outcomes DIR] [--json OUT]``
(about a minute of CPU per seed; ``--outcomes DIR`` keeps the logged outcomes, one file per seed, and reads
them back when they exist).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

sys.path.insert(0, str(Path(__file__).resolve().parent))
from variance_auc import (
    auc_along,
    bootstrap_interval,
    graph_prediction,
    knn_prediction,
)

EVALUATION_SEEDS = range(5000, 5120)
#: The predictors of the contemporaneous table, in order (name, what it reads).
METHODS = ("envsched[tfidf]", "knn[tfidf]", "env_mean", "envsched[difficulty]", "knn[difficulty]",
           "envsched[tfidf,k16]", "envsched[difficulty,k16]", "env_tier_mean")
HISTORY = ("history", "envsched_lagged[tfidf]", "envsched_lagged[difficulty]", "history+envsched_lagged[difficulty]",
           "history+env_mean_lagged")
#: Paired differences reported (a - b), contemporaneous rows.
PAIRS = (("envsched[difficulty]", "envsched[tfidf]"), ("envsched[tfidf]", "knn[tfidf]"),
         ("envsched[tfidf]", "env_mean"), ("envsched[difficulty]", "env_mean"),
         ("envsched[difficulty]", "env_tier_mean"), ("envsched[difficulty,k16]", "envsched[tfidf]"),
         ("envsched[difficulty,k16]", "env_tier_mean"), ("env_tier_mean", "env_mean"),
         ("envsched[tfidf,k16]", "envsched[tfidf]"), ("envsched[difficulty,k16]", "envsched[tfidf,k16]"))
#: Paired differences on the history rows (checkpoints after the first).
HISTORY_PAIRS = (("history+envsched_lagged[difficulty]", "history"), ("envsched[difficulty]", "history"),
                 ("envsched_lagged[difficulty]", "history"),
                 ("history+env_mean_lagged", "history+envsched_lagged[difficulty]"))


def log_outcomes(seeds: list[int], *, steps: int = 200, checkpoints: list[int] | None = None,
                 batch_size: int = 32, group_size: int = 8, families: str | None = None,
                 learner: dict[str, Any] | None = None) -> dict[str, Any]:
    """Probed runs (JSON-able): the configuration and, per seed, every training task's group at each checkpoint."""
    from envsched_lab.neural.probe import probe_run

    bad = sorted(set(seeds) & set(EVALUATION_SEEDS))
    if bad:
        raise ValueError(f"seeds {bad} are evaluation seeds (5000-5119); use development seeds")
    checkpoints = checkpoints or [round(steps * q) for q in (0.25, 0.5, 0.75)]
    config = {"steps": steps, "checkpoints": checkpoints, "batch_size": batch_size, "group_size": group_size,
              "families": families, "learner": learner or {}, "sampler": "uniform"}
    runs = []
    for seed in seeds:
        out = probe_run(families, seed=seed, steps=steps, batch_size=batch_size, group_size=group_size,
                        checkpoints=checkpoints, learner=learner)
        runs.append({"seed": seed, "task_ids": out["task_ids"],
                     "rewards": {str(k): v.tolist() for k, v in sorted(out["rewards"].items())}})
    return {"config": config, "runs": runs}


def training_specs(families: str | None = None) -> list[dict[str, Any]]:
    """The specs of the benchmark's training pool (the split every sampler draws from), in pool order."""
    from envsched_lab.families import DEFAULT_FAMILIES_REF, build_family_pool
    from envsched_lab.runner import bench_split, learner_prompts

    ref = families or DEFAULT_FAMILIES_REF
    return [dict(t) for t in bench_split(build_family_pool(ref).pool, None, learner_prompts("neural", ref)).train]


def with_difficulty(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The specs with their ``difficulty`` as a token of the initial state (the initial-context view)."""
    return [{**s, "initial_state": {**(s.get("initial_state") or {}), "difficulty": f"tier_{s['difficulty']}"}}
            for s in specs]


def group_mean_others(v: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Mean ``v`` of the other members of each row's group (the mean of all others for a group of one)."""
    _, g = np.unique(groups, return_inverse=True)
    tot, cnt = np.bincount(g, v), np.bincount(g)
    alone = (v.sum() - v) / max(len(v) - 1, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt[g] > 1, (tot[g] - v) / (cnt[g] - 1), alone)


class Predictors:
    """The leave-task-out predictors over one pool's specs (graphs built once)."""

    def __init__(self, specs: list[dict[str, Any]]) -> None:
        from envsched.method.config import GraphConfig
        from envsched.method.graph.build import build_graph
        from envsched.pool.pool import TaskPool

        self.config = GraphConfig()
        harder = with_difficulty(specs)
        self.graphs = {name: build_graph(TaskPool(s), c) for name, s, c in (
            ("tfidf", specs, self.config), ("difficulty", harder, self.config),
            ("tfidf,k16", specs, GraphConfig(k_within=16)), ("difficulty,k16", harder, GraphConfig(k_within=16)))}
        self.env = np.array([s["env"] for s in specs])
        self.tier = np.array([f"{s['env']}|{s.get('difficulty')}" for s in specs])

    def envsched(self, features: str, v: np.ndarray) -> np.ndarray:
        g = self.graphs[features]
        return graph_prediction(g.within_index, g.within_weight, v)

    def __call__(self, v: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        for f, g in self.graphs.items():
            out[f"envsched[{f}]"] = self.envsched(f, v)
            out[f"knn[{f}]"] = knn_prediction(g.full_features, v, self.config.k_within)  # k16: unused
        out["env_mean"] = group_mean_others(v, self.env)
        out["env_tier_mean"] = group_mean_others(v, self.tier)
        return {m: out[m] for m in METHODS}

    def history(self, v_before: np.ndarray) -> dict[str, np.ndarray]:
        out = {"history": v_before}
        for f in ("tfidf", "difficulty"):
            out[f"envsched_lagged[{f}]"] = self.envsched(f, v_before)
        out["history+envsched_lagged[difficulty]"] = 0.5 * (v_before + out["envsched_lagged[difficulty]"])
        out["history+env_mean_lagged"] = 0.5 * (v_before + group_mean_others(v_before, self.env))
        return out


def signal(rewards: np.ndarray) -> np.ndarray:
    return (np.ptp(rewards, axis=1) > 0).astype(int)


def _cell(triple: tuple[float, float, float], key: str = "auc") -> dict[str, Any]:
    return {key: round(triple[0], 3), "ci95": [round(triple[1], 3), round(triple[2], 3)]}


class WithinRun:
    """AUC within each run (one stratum: a seed at a checkpoint), averaged over the runs, with bootstrap
    intervals that resample tasks (a task's rows in every run together). Every run holds every task once."""

    def __init__(self, y: np.ndarray, task: np.ndarray, run: np.ndarray) -> None:
        runs = np.unique(run)
        self.tasks = np.unique(task)
        self.members = np.full((len(runs), len(self.tasks)), -1, dtype=np.int64)
        for k, r in enumerate(runs):
            rows = np.flatnonzero(run == r)
            if sorted(task[rows].tolist()) != self.tasks.tolist():
                raise ValueError(f"run {r} does not hold every task exactly once")
            self.members[k, np.searchsorted(self.tasks, task[rows])] = rows
        self.y = y

    def auc(self, score: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Mean over runs of the AUC on the tasks ``c`` (``(..., tasks)`` resampled task positions)."""
        per_run = [auc_along(self.y[m[c]], score[m[c]]) for m in self.members]
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a resample where a run has one class only
            return np.nanmean(np.stack(per_run), axis=0)

    def interval(self, score: np.ndarray) -> tuple[float, float, float]:
        every = np.arange(len(self.tasks))
        return (float(self.auc(score, every)),
                *bootstrap_interval(lambda c, axis=-1: self.auc(score, c), every))

    def difference(self, a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
        every = np.arange(len(self.tasks))
        return (float(self.auc(a, every) - self.auc(b, every)),
                *bootstrap_interval(lambda c, axis=-1: self.auc(a, c) - self.auc(b, c), every))


def _cell(triple: tuple[float, float, float], key: str = "auc") -> dict[str, Any]:
    return {key: round(triple[0], 3), "ci95": [round(triple[1], 3), round(triple[2], 3)]}


def _score(y: np.ndarray, preds: dict[str, np.ndarray], task: np.ndarray, run: np.ndarray, names: tuple[str, ...],
           pairs: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """Within-run AUC (the table's figure) and, as ``all_rows``, the AUC over all rows at once (which also
    credits a predictor for telling runs with more signal from runs with less)."""
    within = WithinRun(y, task, run)
    row: dict[str, Any] = {"rows": len(y), "runs": len(np.unique(run)),
                           "signal_rate": round(float(y.mean()), 3), "all_rows": {}}
    for m in names:
        row[m] = _cell(within.interval(preds[m]))
        row["all_rows"][m] = round(float(roc_auc_score(y, preds[m])), 3)
    for a, b in pairs:
        row[f"{a} - {b}"] = _cell(within.difference(preds[a], preds[b]), "diff")
    return row


def evaluate_neural(outcomes: dict[str, Any], specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per checkpoint and a pooled row (contemporaneous predictors), then the history rows."""
    predictors = Predictors(specs)
    ids = [s["id"] for s in specs]
    checkpoints = sorted(int(k) for k in outcomes["runs"][0]["rewards"])
    rows: dict[str, list[dict[str, np.ndarray]]] = {"now": [], "history": []}
    for run in outcomes["runs"]:
        if run["task_ids"] != ids:
            raise ValueError(f"seed {run['seed']}: the logged tasks are not this training pool's")
        before = None
        for k in checkpoints:
            r = np.asarray(run["rewards"][str(k)], dtype=float)
            v, y = r.var(axis=1), signal(r)
            base = {"checkpoint": np.full(len(y), k), "task": np.arange(len(y)), "y": y,
                    "run": np.full(len(y), run["seed"] * 100_000 + k)}
            now = predictors(v)
            rows["now"].append({**base, **now})
            if before is not None:
                rows["history"].append({**base, **predictors.history(before), **now})
            before = v
    out = []
    for kind, names, pairs in (("now", METHODS, PAIRS), ("history", (*HISTORY, "envsched[difficulty]"),
                                                          HISTORY_PAIRS)):
        if not rows[kind]:
            continue
        cat = {key: np.concatenate([r[key] for r in rows[kind]]) for key in rows[kind][0]}
        for k in [*sorted(set(cat["checkpoint"].tolist())), None]:
            sel = np.ones(len(cat["y"]), dtype=bool) if k is None else cat["checkpoint"] == k
            y, task = cat["y"][sel], cat["task"][sel]
            if 0 < y.sum() < len(y):
                row = _score(y, {m: cat[m][sel] for m in names}, task, cat["run"][sel], names, pairs)
                out.append({"table": kind, "checkpoint": "pooled" if k is None else int(k), **row})
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """The two tables (AUC [95 % interval]) and the paired differences, as markdown."""
    def fmt(c: dict[str, Any]) -> str:
        v = c.get("auc", c.get("diff"))
        return f"{v:.3f} [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]"

    lines = []
    for kind, names in (("now", METHODS), ("history", (*HISTORY, "envsched[difficulty]"))):
        sub = [r for r in rows if r["table"] == kind]
        if not sub:
            continue
        lines += ["", f"| {'checkpoint' if kind == 'now' else 'predicting checkpoint'} | signal rate | "
                  + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
        lines += [f"| {r['checkpoint']} | {r['signal_rate']:.3f} | " + " | ".join(fmt(r[m]) for m in names) + " |"
                  for r in sub]
        diffs = [k for k in sub[0] if " - " in k]
        lines += ["", "| paired difference | " + " | ".join(str(r["checkpoint"]) for r in sub) + " |",
                  "|---" * (len(sub) + 1) + "|"]
        lines += [f"| {d} | " + " | ".join(fmt(r[d]) for r in sub) + " |" for d in diffs]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--checkpoints", type=int, nargs="+", default=None, help="default: 25, 50, 75 %% of --steps")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--families", default=None, help="MODULE:ATTR (default: the shipped families)")
    ap.add_argument("--learner", action="append", default=[], metavar="KEY=VALUE", help="NeuralConfig fields")
    ap.add_argument("--outcomes", type=Path, default=None,
                    help="a folder of logged outcomes, one file per seed: read when there (its configuration must "
                         "match), else logged and written")
    ap.add_argument("--json", type=Path, default=None, help="write the rows (and the configuration) here")
    args = ap.parse_args(argv)
    learner = {k: json.loads(v) for k, _, v in (x.partition("=") for x in args.learner)}
    checkpoints = args.checkpoints or [round(args.steps * q) for q in (0.25, 0.5, 0.75)]
    want = {"steps": args.steps, "checkpoints": checkpoints, "batch_size": args.batch_size,
            "group_size": args.group_size, "families": args.families, "learner": learner, "sampler": "uniform"}
    runs = []
    for seed in args.seeds:
        path = None if args.outcomes is None else args.outcomes / f"seed{seed}.json"
        if path is not None and path.exists():
            logged = json.loads(path.read_text())
            if logged["config"] != want:
                print(f"{path} holds another configuration: {logged['config']}", file=sys.stderr)
                return 2
        else:
            try:
                logged = log_outcomes([seed], steps=args.steps, checkpoints=checkpoints, batch_size=args.batch_size,
                                      group_size=args.group_size, families=args.families, learner=learner)
            except ValueError as exc:
                print(exc, file=sys.stderr)
                return 2
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(logged))
        runs += logged["runs"]
    outcomes = {"config": want, "runs": runs}
    rows = evaluate_neural(outcomes, training_specs(args.families))
    print(f"neural learner, uniform sampler, seeds {args.seeds}, {args.steps} steps, checkpoints {checkpoints}, "
          f"{len(outcomes['runs'][0]['task_ids'])} training tasks; AUC [95 % interval]")
    print(markdown(rows))
    if args.json is not None:
        args.json.write_text(json.dumps({"config": {**want, "seeds": args.seeds}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
