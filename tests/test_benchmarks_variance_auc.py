"""benchmarks/variance_auc.py and benchmarks/variance_auc_neural.py: the AUC they report is roc_auc_score's, a
perfect predictor scores 1, intervals resample whole tasks, no predictor reads the task's own outcome, and the
neural run logs, reads back and refuses evaluation seeds."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
VA = SimpleNamespace(**runpy.run_path(str(BENCH / "variance_auc.py"), run_name="variance_auc"))
VN = SimpleNamespace(**runpy.run_path(str(BENCH / "variance_auc_neural.py"), run_name="variance_auc_neural"))
TINY = ["warmup_steps=60", "warmup_batch=16", "warmup_lr=0.01", "d_model=16", "n_heads=2", "n_layers=1"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))


def test_auc_along_is_roc_auc_score_with_ties_and_nan_for_one_class():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=(7, 40))
    s = rng.integers(0, 4, size=(7, 40)).astype(float)  # many ties
    assert VA.auc_along(y, s) == pytest.approx([roc_auc_score(a, b) for a, b in zip(y, s, strict=True)], abs=1e-12)
    assert np.isnan(VA.auc_along(np.ones(5), np.arange(5.0)))


def test_perfect_and_reversed_predictors_and_task_resampling():
    y = np.array([0, 1] * 30)
    auc, lo, hi = VA.auc_with_interval(y, y.astype(float), np.arange(60) % 20)
    assert (auc, lo, hi) == (1.0, 1.0, 1.0)
    assert VA.auc_with_interval(y, -y.astype(float))[0] == 0.0
    d = VA.paired_difference(y, y.astype(float), -y.astype(float), np.arange(60) % 20)
    assert d == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="equal sizes"):
        VA.auc_with_interval(y, y.astype(float), np.r_[np.zeros(31), np.ones(29)])
    # resampling clusters takes a task's rows together, as often as the task is drawn
    pairs = np.repeat(np.arange(30), 2)
    _, rows = VA._resampled(60, pairs)
    assert rows(np.array([[3, 3, 7]])).tolist() == [[6, 7, 6, 7, 14, 15]]


def test_within_run_auc_is_the_mean_of_each_runs_auc():
    rng = np.random.default_rng(1)
    task = np.tile(np.arange(50), 3)
    run = np.repeat([0, 1, 2], 50)
    y = rng.integers(0, 2, size=150)
    score = y + rng.normal(0, 1, 150) + run  # the runs' levels differ: all rows at once would credit that
    w = VN.WithinRun(y, task, run)
    auc, lo, hi = w.interval(score)
    assert auc == pytest.approx(np.mean([roc_auc_score(y[run == r], score[run == r]) for r in range(3)]))
    assert lo < auc < hi
    assert w.interval(y.astype(float))[:1] == (1.0,)
    assert w.difference(score, score) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="every task"):
        VN.WithinRun(y[:-1], task[:-1], run[:-1])


@pytest.mark.slow
def test_no_predictor_reads_the_tasks_own_outcome():
    specs = VN.training_specs()
    pred = VN.Predictors(specs)
    rng = np.random.default_rng(2)
    v = rng.uniform(0, 0.25, len(specs))
    base, hist = pred(v), pred.history(v)
    assert set(base) == set(VN.METHODS)
    moved = set()
    for i in rng.choice(len(specs), 12, replace=False):
        w = v.copy()
        w[i] = 0.25 - w[i] + 0.1
        now = pred(w)
        for m, p in now.items():
            # the task's own outcome changes nothing of its own prediction (a change would be >= 0.1 / 47)
            assert p[i] == pytest.approx(base[m][i], abs=1e-12), (m, i)
            moved |= {m} if not np.array_equal(p, base[m]) else set()
        lagged = pred.history(w)
        assert lagged["history"][i] == w[i]  # history reads the task's own earlier outcome, by design
        assert lagged["envsched_lagged[difficulty]"][i] == hist["envsched_lagged[difficulty]"][i]
    assert moved == set(VN.METHODS)  # ... and every predictor does read other tasks' outcomes
    # the difficulty token puts a task's within-relation neighbours in its own tier far more often
    tier = np.array([s["difficulty"] for s in specs])

    def same_tier(name):
        idx = pred.graphs[name].within_index
        return float((tier[np.maximum(idx, 0)] == tier[:, None])[idx >= 0].mean())

    assert same_tier("difficulty") > same_tier("tfidf") + 0.3


def test_group_mean_of_the_others():
    v = np.array([1.0, 2.0, 3.0, 10.0])
    assert VN.group_mean_others(v, np.array(["a", "a", "a", "b"])).tolist() == [2.5, 2.0, 1.5, 2.0]


@pytest.mark.slow
def test_neural_run_end_to_end(tmp_path, capsys):
    args = ["--seeds", "0", "--steps", "6", "--checkpoints", "3", "6", "--batch-size", "8", "--group-size", "4",
            "--outcomes", str(tmp_path / "out")] + [x for t in TINY for x in ("--learner", t)]
    assert VN.main([*args, "--json", str(tmp_path / "a.json")]) == 0
    logged = json.loads((tmp_path / "out" / "seed0.json").read_text())
    assert logged["config"]["checkpoints"] == [3, 6] and list(logged["runs"][0]["rewards"]) == ["3", "6"]
    # The split that keeps held-out prompts out of training (run_one's): 625 of the default pool's 900 tasks train.
    assert len(logged["runs"][0]["task_ids"]) == 625
    a = json.loads((tmp_path / "a.json").read_text())
    assert {(r["table"], r["checkpoint"]) for r in a["rows"]} <= {("now", 3), ("now", 6), ("now", "pooled"),
                                                                  ("history", 6), ("history", "pooled")}
    assert ("now", "pooled") in {(r["table"], r["checkpoint"]) for r in a["rows"]}
    pooled = next(r for r in a["rows"] if r["checkpoint"] == "pooled" and r["table"] == "now")
    assert pooled["rows"] == 2 * 625 and 0 < pooled["signal_rate"] < 1
    for m in VN.METHODS:
        c = pooled[m]
        assert c["ci95"][0] <= c["auc"] <= c["ci95"][1]
    assert "| checkpoint | signal rate | envsched[tfidf]" in capsys.readouterr().out
    # read back, not logged again: the same rows
    assert VN.main([*args, "--json", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "b.json").read_text()) == a
    bad = list(args)
    bad[bad.index("--steps") + 1] = "7"  # another configuration than the logged one
    assert VN.main(bad) == 2
    assert VN.main(["--seeds", "5003", "--steps", "2", "--checkpoints", "1"]) == 2
    assert "evaluation seeds" in capsys.readouterr().err


def test_halves_predict_the_unseen_half_from_the_seen_one_only():
    """Two kinds of tasks told apart by their text: mixed outcomes and all-pass. Seeing half of each, the default's
    graph prior ranks the unseen mixed tasks first; without it every unseen task gets the same prediction."""
    words = {"mixed": "refund the damaged order and email the customer", "pass": "print the store opening hours"}
    specs, rows = [], []
    for kind, text in words.items():
        for i in range(8):
            specs.append({"id": f"{kind}{i}", "env": "shop", "instruction": f"{text} case {i}",
                          "tools": [{"name": f"{kind}_tool", "description": text}]})
            rows.append([1.0, 0.0, 0.0, 1.0] if kind == "mixed" else [1.0] * 4)
    ev = VA.HalvesEvaluation(specs)
    ev.run(np.asarray(rows), halves=6, rng=np.random.default_rng(0))
    halves, handover = ev.rows()
    got = halves["predictors"]
    assert got["default"]["auc"] == 1.0 and got["paper"]["auc"] == 1.0 and got["knn"]["auc"] == 1.0
    assert got["no-graph"]["auc"] == 0.5 and got["no-graph"]["spearman"] is None
    assert got["default"]["spearman"] == pytest.approx(1.0)  # ranks agree with the two variance levels
    assert len(ev.aucs["default"]) == 6 and ev.matrices == 1
    # the hand-over: trials 1-2 of the mixed tasks ([1, 0]) already disagree, as trials 3-4 do
    assert handover["predictors"]["own"]["auc"] == 1.0 and handover["predictors"]["default"]["auc"] == 1.0
    with pytest.raises(ValueError, match="at least 4 trials"):
        ev.run(np.asarray(rows)[:, :3], halves=1, rng=np.random.default_rng(0))


def test_sampler_prediction_reads_only_the_groups_it_is_given():
    texts = ["refund the damaged order and email the customer", "print the store opening hours"]
    specs = [{"id": f"t{i}", "env": "shop", "instruction": f"{texts[i // 6]} case {i}"} for i in range(12)]
    ev = VA.HalvesEvaluation(specs)
    config = VA.HALVES_CONFIGS["default"]
    assert VA.sampler_prediction(ev.pool, ev.graph, config, []).tolist() == [0.0] * 12  # nothing reported
    groups = [(0, [1.0, 0.0, 1.0, 0.0]), (6, [1.0] * 4)]
    got = VA.sampler_prediction(ev.pool, ev.graph, config, groups)
    assert np.array_equal(got, VA.sampler_prediction(ev.pool, ev.graph, config, groups))  # a fresh sampler each
    assert got.argmax() == 0 and got.argmin() == 6  # the observed tasks, mixed and all-pass
    assert got[1:6].min() > got[7:].max()  # unseen: the mixed task's kind above the all-pass task's
