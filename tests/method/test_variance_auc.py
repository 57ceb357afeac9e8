"""benchmarks/variance_auc.py: the held-out variance-prediction pieces on constructed cases, and the pinned AUCs
on the recorded GPT-4o tau-bench outcomes when ``shared/data/tau-bench`` is present."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("variance_auc", ROOT / "benchmarks" / "variance_auc.py")
va = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(va)
DATA = va.DEFAULT_DATA if va.DEFAULT_DATA.exists() else None


def test_graph_prediction_is_the_weighted_mean_of_the_neighbours_only():
    v = np.array([0.0, 0.25, 0.1, 0.2])
    index = np.array([[1, 2], [0, -1], [-1, -1], [0, 1]])
    weight = np.array([[0.75, 0.25], [1.0, 0.0], [0.0, 0.0], [0.5, 0.5]])
    pred = va.graph_prediction(index, weight, v)
    assert pred == pytest.approx([0.75 * 0.25 + 0.25 * 0.1, 0.0, v.mean(), 0.125])


def test_knn_never_uses_the_task_itself():
    x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    v = np.array([0.0, 0.25, 0.2, 0.05])
    assert va.knn_prediction(x, v, k=1) == pytest.approx([0.25, 0.0, 0.05, 0.2])


def test_outcomes_and_specs_carry_no_reward(tmp_path):
    eps = [{"task_id": t, "trial": k, "reward": float((t + k) % 2 if t else 1.0),
            "info": {"task": {"user_id": f"u{t}", "instruction": f"do thing {t}",
                              "actions": [{"name": "get_user_details", "kwargs": {"user_id": f"u{t}"}},
                                          {"name": "cancel_reservation", "kwargs": {"reservation_id": "R1"}}],
                              "outputs": []}}} for t in range(3) for k in range(4)]
    path = tmp_path / "eps.json"
    path.write_text(json.dumps(eps))
    tasks, rewards = va.load_outcomes(path)
    assert rewards.shape == (3, 4) and rewards[0].tolist() == [1.0] * 4 and rewards[1].tolist() == [1, 0, 1, 0]
    specs = va.task_specs(tasks, structure=True)
    assert "reward" not in json.dumps(specs)
    assert specs[1]["tools"] == [{"name": "cancel_reservation", "description": "cancel reservation"},
                                 {"name": "get_user_details", "description": "get user details"}]
    assert "seq_get_user_details_then_cancel_reservation" in specs[1]["initial_state"]["structure"]
    assert "n_writes_1" in specs[1]["initial_state"]["structure"]
    path.write_text(json.dumps(eps[:-1]))
    with pytest.raises(ValueError, match="different trial counts"):
        va.load_outcomes(path)


@pytest.mark.skipif(DATA is None, reason="shared/data/tau-bench is not present")
def test_tau_bench_aucs_are_what_the_docs_report():
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import normalize

    from envsched.method.config import GraphConfig
    from envsched.method.graph.build import build_graph
    from envsched.pool.pool import TaskPool

    tasks, rewards = va.load_outcomes(DATA)
    y = (rewards.min(axis=1) != rewards.max(axis=1)).astype(int)
    v = va.group_variance(rewards)
    assert (len(y), int(y.sum())) == (50, 26)
    got = {}
    for name, structure in (("tfidf", False), ("structure", True)):
        feats = normalize(build_graph(TaskPool(va.task_specs(tasks, structure=structure)), GraphConfig()).full_features)
        env, knn = va.predictions(feats, v, GraphConfig())
        got[name] = (round(roc_auc_score(y, env), 3), round(roc_auc_score(y, knn), 3))
    assert got == {"tfidf": (0.686, 0.687), "structure": (0.668, 0.668)}


@pytest.mark.slow
@pytest.mark.skipif(DATA is None, reason="shared/data/tau-bench is not present")
def test_tau_bench_halves_are_what_the_docs_report():
    """docs/envsched-sampler.md ("Prediction for every task"): 200 halves, seed 0."""
    tasks, rewards = va.load_outcomes(DATA)
    halves, handover = va.halves_evaluation(tasks, rewards, halves=200, seed=0)
    got = {k: (v["auc"], v.get("above_knn"), v["spearman"]) for k, v in halves["predictors"].items()}
    assert got == {"default": (0.641, 0.555, 0.309), "paper": (0.642, 0.565, 0.31),
                   "reference-substitute": (0.641, 0.555, 0.309), "no-graph": (0.5, 0.085, None),
                   "knn": (0.628, None, 0.272)}
    got = {k: (v["auc"], v.get("above_own")) for k, v in handover["predictors"].items()}
    assert got == {"default": (0.713, 0.865), "paper": (0.718, 0.895), "own": (0.651, None),
                   "neighbours": (0.639, 0.475)}
