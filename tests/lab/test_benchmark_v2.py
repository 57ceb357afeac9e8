"""Invariants of benchmark v2: the learner's GRPO dynamics, the held-out split, paired statistics."""

import json
import math

import numpy as np
import pytest

from envsched.pool.pool import TaskPool
from envsched_lab.learner import LearnerModel
from envsched_lab.report import paired_difference
from envsched_lab.runner import BenchConfig, make_bench_sampler, run_benchmark, run_one
from envsched_lab.split import SplitConfig, split_pool


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))


def _pool(n_env=6, per_env=10, corpora=("a", "b")):
    specs = []
    for e in range(n_env):
        corpus = corpora[e % len(corpora)]
        for i in range(per_env):
            specs.append({"id": f"{corpus}{e}/t{i}", "env": f"{corpus}/env{e}", "pattern": f"p{i % 3}",
                          "tools": [{"name": f"op{i % 4}"}, {"name": "common"}],
                          "verifier": {"checks": ["c1", "c2", "c3"][: 1 + i % 3]}})
    return TaskPool(specs)


def _signal_group():
    return [0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]


def test_no_signal_no_learning_even_with_interference():
    pool = _pool()
    m = LearnerModel(pool, {"forgetting": 0.0, "interference": 1.0, "transfer": 0.5}, seed=3)
    before = m.competence().copy()
    pos = np.arange(12)
    flat = np.tile([[1.0] * 8, [0.0] * 8, [0.5] * 8], (4, 1))
    assert m.train(pos, flat) == 0.0
    assert np.array_equal(m.competence(), before)


def test_zero_signal_groups_dilute_the_same_update():
    pool = _pool()
    cfg = {"forgetting": 0.0, "transfer": 0.0, "sharing": 0.0}  # every move lands on the task's own phi
    alone, diluted = LearnerModel(pool, cfg, seed=1), LearnerModel(pool, cfg, seed=1)
    c0 = alone.competence()[0]
    alone.train([0], [_signal_group()])
    diluted.train([0, 1, 2, 3], [_signal_group(), [1.0] * 8, [0.0] * 8, [1.0] * 8])
    move_alone = alone.competence()[0] - c0
    move_diluted = diluted.competence()[0] - c0
    assert move_alone == pytest.approx(0.02 * 64 * 0.5)  # lr * batch_reference / 1 group * std
    assert move_diluted == pytest.approx(move_alone / 4)
    # v1 (no batch normalisation): the zero-signal groups cost nothing
    v1a = LearnerModel(pool, {**cfg, "batch_normalise": False}, seed=1)
    v1b = LearnerModel(pool, {**cfg, "batch_normalise": False}, seed=1)
    v1a.train([0], [_signal_group()])
    v1b.train([0, 1, 2, 3], [_signal_group(), [1.0] * 8, [0.0] * 8, [1.0] * 8])
    assert v1a.competence()[0] == pytest.approx(v1b.competence()[0]) == pytest.approx(c0 + 0.02 * 0.5)


def test_interference_can_lower_a_related_skill():
    # A trains its pattern "pa"; E couples "pa" with environment "o" and its tool "w"; D uses only "o", "w" and
    # its own pattern, so D moves through the coupling alone (transfer), never directly.
    specs = [
        {"id": "A", "env": "s", "pattern": "pa", "tools": [{"name": "x"}], "verifier": {"checks": ["c"]}},
        {"id": "E", "env": "o", "pattern": "pa", "tools": [{"name": "w"}], "verifier": {"checks": ["c"]}},
        {"id": "D", "env": "o", "pattern": "pd", "tools": [{"name": "w"}], "verifier": {"checks": ["c"]}},
    ]
    pool = TaskPool(specs)
    moves = {}
    for interference in (0.0, 1.0):
        m = LearnerModel(pool, {"forgetting": 0.0, "transfer": 0.5, "interference": interference}, seed=0)
        c = m.competence().copy()
        m.train([0], [_signal_group()])
        moves[interference] = m.competence() - c
    assert moves[0.0][0] > 0 and moves[1.0][0] > 0  # the trained task itself still improves
    assert moves[0.0][2] > 0  # helped through the coupling when no pair conflicts
    assert moves[1.0][2] < 0  # hurt when every coupling conflicts
    assert moves[1.0][2] == pytest.approx(-moves[0.0][2])


def test_reasoning_gym_difficulty_follows_the_tier():
    specs = [{"id": f"rg{i}", "env": f"reasoning_gym/d{i % 5}", "group": f"d{i % 5}",
              "reasoning_gym": {"dataset": f"d{i % 5}", "tier": i % 5}, "difficulty": i % 5,
              "verifier": {"checks": ["answer"]}} for i in range(400)]
    pool = TaskPool(specs)
    tiers = np.array([i % 5 for i in range(400)], dtype=float)
    with_tier = LearnerModel(pool, {"tier_share": 0.5}, seed=0)
    v1 = LearnerModel(pool, {"tier_share": 0.0}, seed=0)
    assert np.corrcoef(tiers, with_tier.difficulty)[0, 1] > 0.5
    assert abs(np.corrcoef(tiers, v1.difficulty)[0, 1]) < 0.2
    assert np.corrcoef(tiers, with_tier.expected_reward())[0, 1] < -0.3


def test_split_is_seeded_disjoint_and_stratified():
    pool = _pool(n_env=10, per_env=10)
    a, b = split_pool(pool), split_pool(pool, {"split_seed": 0})
    assert np.array_equal(a.train_positions, b.train_positions) and a.heldout_envs == b.heldout_envs
    c = split_pool(pool, SplitConfig(split_seed=5))
    assert c.heldout_envs != a.heldout_envs or not np.array_equal(c.train_positions, a.train_positions)
    every = np.concatenate([a.train_positions, a.heldout_task_positions, a.heldout_env_positions])
    assert sorted(every.tolist()) == list(range(len(pool)))  # a partition of the pool
    assert len(a.heldout_envs) == 2  # round(0.15 * 10), one from each corpus of 5 environments
    assert {e.split("/")[0] for e in a.heldout_envs} == {"a", "b"}
    assert len(a.heldout_task_positions) == 8 * 2  # 20 % of the 10 tasks of each of 8 training environments
    assert set(a.train.ids).isdisjoint({pool[int(i)]["id"] for i in a.heldout_positions})
    with pytest.raises(ValueError, match="heldout_env_share"):
        SplitConfig(heldout_env_share=1.5)
    with pytest.raises(ValueError, match="unknown split option"):
        SplitConfig.from_dict({"seed": 1})


@pytest.mark.parametrize("name", ["uniform", "uniform-ds", "curriculum", "mopps", "greso", "plr", "dps", "sec",
                                  "envsched", "envsched-paper", "envsched-coverage-only"])
def test_heldout_tasks_are_never_drawn(name, monkeypatch):
    pool = _pool()
    split = split_pool(pool)
    drawn: list[int] = []
    original = LearnerModel.rollout

    def recording(self, positions, n, rng=None):
        if rng is None:  # training rollouts (the Monte-Carlo evaluation passes its own generator)
            drawn.extend(int(p) for p in positions)
        return original(self, positions, n, rng)

    monkeypatch.setattr(LearnerModel, "rollout", recording)
    recs = run_one(pool, name, 0, steps=12, batch_size=8, group_size=4, eval_rollouts=2)
    assert len(drawn) >= 12 * 8 - 8  # post-filter samplers still roll out every round
    assert set(drawn) <= set(split.train_positions.tolist())
    assert not set(drawn) & set(split.heldout_positions.tolist())
    assert not math.isnan(recs[-1]["heldout"]) and not math.isnan(recs[-1]["heldout_sampled"])
    sampler = make_bench_sampler(name, split.train, seed=0, batch_size=8, group_size=4)
    assert len(sampler.tasks) == len(split.train)


def test_run_one_is_seeded():
    pool = _pool()
    a = run_one(pool, "mopps", 4, steps=6, batch_size=6, group_size=4)
    b = run_one(pool, "mopps", 4, steps=6, batch_size=6, group_size=4)
    c = run_one(pool, "mopps", 5, steps=6, batch_size=6, group_size=4)
    assert a == b
    assert [r["heldout"] for r in a] != [r["heldout"] for r in c]


def test_paired_interval_by_hand():
    a = {0: 1.0, 1: 3.0, 2: 5.0, 9: 7.0}  # seed 9 has no partner and is left out
    b = {0: 0.0, 1: 1.0, 2: 1.0}
    p = paired_difference(a, b)
    # differences 1, 2, 4: mean 7/3, sd sqrt(7/3), t(0.975, 2) = 4.302653
    half = 4.302653 * math.sqrt(7 / 3) / math.sqrt(3)
    assert p["n"] == 3
    assert p["mean"] == pytest.approx(7 / 3)
    assert p["low"] == pytest.approx(7 / 3 - half, abs=1e-5) and p["high"] == pytest.approx(7 / 3 + half, abs=1e-5)
    assert p["significant"] is False
    q = paired_difference({0: 2.0, 1: 2.1, 2: 1.9}, {0: 0.0, 1: 0.0, 2: 0.0})
    assert q["significant"] is True and q["low"] > 0
    one = paired_difference({0: 1.0}, {0: 0.0})
    assert one["n"] == 1 and math.isnan(one["low"]) and one["significant"] is False


def test_summary_has_heldout_paired_and_cost_figures(tmp_path, monkeypatch):
    pool = _pool()
    cfg = BenchConfig(samplers=["uniform", "plr"], seeds=[0, 1, 2], steps=5, batch_size=6, group_size=4,
                      coldstart_runs=0, score_steps=[3, 5], target_step=3)
    # without the bench extra: no Parquet, no plots, no traceback
    import envsched_lab.report as report

    monkeypatch.setattr(report, "has_module", lambda name: False)
    summary = run_benchmark(cfg, tmp_path / "run", pool=pool, workers=1, plots=True)
    assert not (tmp_path / "run" / "metrics.parquet").exists()
    assert "metrics.parquet" not in summary["written"] and "plots" not in summary
    plr = summary["samplers"]["plr"]
    for key in ("heldout_score@5", "heldout_a@5", "heldout_b@5", "score@5"):
        assert plr[key]["n"] == 3
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    diffs = [next(r["heldout"] for r in recs if r["sampler"] == "plr" and r["seed"] == s and r["step"] == 5)
             - next(r["heldout"] for r in recs if r["sampler"] == "uniform" and r["seed"] == s and r["step"] == 5)
             for s in (0, 1, 2)]
    assert plr["paired_vs_uniform@5"]["mean"] == pytest.approx(np.mean(diffs))
    assert plr["paired_vs_best@5"]["other"] == "uniform"
    assert plr["cost"]["mean"] > 0
    split = json.loads((tmp_path / "run" / "split.json").read_text())
    assert split["heldout_envs"] and 0 <= split["sharing_degree"]["heldout_envs"] <= 1
    text = (tmp_path / "run" / "summary.md").read_text()
    assert "Held-out score" in text and "uniform in held-out score at step 5" in text


def test_matrix_writes_cells_verdicts_and_heat_map(tmp_path):
    from envsched_lab.matrix import MatrixPreset, matrix_cells, run_matrix

    pool_file = tmp_path / "pool.jsonl"
    _pool().to_jsonl(pool_file)
    preset = MatrixPreset(pools=(str(pool_file),), samplers=("uniform", "plr"), seeds=3, steps=4,
                          vary_on_every_pool=False, axes={"reward": ("binary",), "batch_size": (4,)})
    cells = matrix_cells(preset)
    assert [c["reward"] for c in cells] == ["graded", "binary", "graded"]
    assert [c["batch_size"] for c in cells] == [64, 64, 4]
    # the default batch (64) is larger than this pool's training part: centre the matrix on batch 8
    preset = MatrixPreset(pools=(str(pool_file),), samplers=("uniform", "plr"), seeds=3, steps=4,
                          vary_on_every_pool=False, axes={"reward": ("binary",), "sharing": (0.0,)},
                          base={"batch_size": 8, "reward": "graded", "sharing": 0.5, "feature_noise": 0.0})
    doc = run_matrix(preset, tmp_path / "m", workers=1)
    assert len(doc["cells"]) == 3
    for cell in doc["cells"]:
        assert set(cell["verdict"]) == {"uniform", "plr"}
        assert set(cell["verdict"].values()) <= {"win", "not detected", "loss"}
        # the two samplers' paired differences to each other are opposite
        a = cell["samplers"]["uniform"]["paired_vs_best"]["mean"]
        b = cell["samplers"]["plr"]["paired_vs_best"]["mean"]
        assert a == pytest.approx(-b)
    tally = doc["tally"]
    assert sum(tally["uniform"].values()) == 3
    assert (tmp_path / "m" / "matrix.png").stat().st_size > 1000
    text = (tmp_path / "m" / "matrix.md").read_text()
    assert "| setting |" in text and "binary" in text
    saved = json.loads((tmp_path / "m" / "matrix.json").read_text())
    assert saved["cells"][1]["setting"]["reward"] == "binary"


def test_tuning_gives_every_sampler_the_same_budget(tmp_path):
    from envsched_lab.tuning import TUNING_SEEDS, load_tuned, tune, tuning_space

    assert set(TUNING_SEEDS).isdisjoint(range(5))  # never a reported seed
    assert tuning_space("uniform") == {}
    assert set(tuning_space("plr")) == {"temperature", "staleness_coef", "min_seen_fraction"}
    from envsched.method.config import SchedulerConfig

    # the default tunes the paper's knobs it reads (decline_penalty and prior_strength act only in the paper's)
    unread = SchedulerConfig().unread_fields()
    assert set(tuning_space("envsched-paper")) - set(unread) <= set(tuning_space("envsched"))
    assert not set(unread) & set(tuning_space("envsched"))
    out = tmp_path / "tuned.json"
    doc = tune(["plr", "mopps", "uniform"], pool=_pool(), trials=3, steps=3, seeds=(1000, 1001), batch_size=6,
               group_size=4, eval_rollouts=2, out=out)
    plr, mopps, uni = (doc["samplers"][k] for k in ("plr", "mopps", "uniform"))
    assert len(plr["trials"]) == len(mopps["trials"]) == 3 and len(uni["trials"]) == 1
    assert plr["trials"][0]["params"] == {}  # trial 0: the sampler's defaults
    for entry in (plr, mopps):
        best = max(t["objective"] for t in entry["trials"])
        assert entry["objective"] == best
        assert entry["params"] == entry["trials"][entry["trial"]]["params"]
        for t in entry["trials"][1:]:
            lo, hi = 0.03, 1.0
            if "temperature" in t["params"]:
                assert lo <= t["params"]["temperature"] <= hi
    assert doc["protocol"]["split"] == {"split_seed": 1} and doc["protocol"]["seeds"] == [1000, 1001]
    assert load_tuned(out)["plr"] == plr["params"]
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a tuned-parameters file"):
        load_tuned(bad)


def test_parallel_workers_run_real_bfcl_replays(tmp_path, monkeypatch):
    # BFCL replays run their calls in a worker process of their own: the benchmark's workers must be allowed
    # to start one (multiprocessing.Pool's daemonic workers are not).
    pytest.importorskip("bfcl_eval")
    import envsched_lab.learner as learner
    from envsched.envs.builders import build_corpus

    monkeypatch.setattr(learner, "_BFCL_MEMO", {})  # nothing memoised in this process either
    pool = TaskPool(build_corpus("bfcl", categories=["base"], limit=16))
    cfg = BenchConfig(samplers=["uniform", "plr"], seeds=[0, 1], steps=2, batch_size=4, group_size=2,
                      coldstart_runs=0, score_steps=[2], target_step=2, split={"heldout_env_share": 0.0})
    # parallel first, on an empty BFCL memo, so the workers really execute the calls
    parallel = run_benchmark(cfg, tmp_path / "parallel", pool=pool, workers=2, plots=False)
    serial = run_benchmark(cfg, tmp_path / "serial", pool=pool, workers=1, plots=False)
    assert serial["samplers"]["plr"]["heldout_score@2"] == parallel["samplers"]["plr"]["heldout_score@2"]
    assert sorted((tmp_path / "serial" / "metrics.jsonl").read_text().splitlines()) == \
        sorted((tmp_path / "parallel" / "metrics.jsonl").read_text().splitlines())
