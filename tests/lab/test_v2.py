"""The v2 pool, its split, the positive-control oracles, the trivial baselines, the gate and ``--pool v2``."""

import json
import math
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.pool.pool import TaskPool
from envsched_lab.families import FamilyPool
from envsched_lab.families.v2 import (
    CONVENTION,
    LENGTHS,
    SKILLS,
    STAGES,
    SURFACES,
    build_v2_pool,
    env_name,
    prompt_of,
)
from envsched_lab.gate import GATE, gate
from envsched_lab.oracles import OracleCoverageSampler, OracleVarianceSampler, TrainingView
from envsched_lab.runner import v2_inputs
from envsched_lab.trivial import constant_baselines

TINY = {"warmup_steps": 2, "warmup_batch": 8, "d_model": 16, "n_heads": 2, "n_layers": 1, "eval_every": 2,
        "train_eval_tasks": 20}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))


# ------------------------------------------------------------------------------------------------ the pool
def test_pool_regime_sizes_and_distinct_prompts():
    v2 = build_v2_pool(3)
    pool = v2.pool
    sizes = Counter(pool.envs[c] for c in pool.env_codes)
    assert len(sizes) == len(SKILLS) * len(SURFACES) == 60
    assert min(sizes.values()) >= 16 and max(sizes.values()) <= 50
    assert len(set(v2.fpool.prompts)) == len(pool)  # no prompt twice, so none shared by training and held-out
    for i, task in enumerate(v2.fpool.tasks):
        skill, surface = SKILLS[v2.skill_of[i]], SURFACES[v2.surface_of[i]]
        assert skill.answer_of(task["record"]) == task["value"]
        assert v2.fpool.prompts[i] == prompt_of(skill, surface, task["record"])
        assert v2.fpool.answers[i] == surface.answer(task["value"], skill.width)
        assert len(task["record"]) == LENGTHS[v2.tier_of[i]] and pool[i]["difficulty"] == v2.tier_of[i]
        assert v2.fpool.prompts[i] not in pool[i]["instruction"]


def test_answers_balanced_no_constant_beats_chance_in_any_environment():
    v2 = build_v2_pool(4)
    codes = np.asarray(v2.pool.env_codes)
    for e in np.unique(codes):
        idx = np.flatnonzero(codes == e)
        skill = SKILLS[v2.skill_of[idx[0]]]
        counts = Counter(v2.fpool.answers[i] for i in idx)
        # every value of the skill's answer set the same number of times, give or take one
        per = len(idx) / len(skill.answers)
        assert max(counts.values()) == math.ceil(per)
        assert len(counts) == min(len(idx), len(skill.answers))
        # so the best constant's share is chance (rounded up to a whole task)
        assert max(counts.values()) / len(idx) <= math.ceil(per) / len(idx)
        assert len(skill.answers) >= 8


def test_keywords_are_readable_and_specs_describe_the_skill_in_the_surface_vocabulary():
    for surface in SURFACES:
        assert len(set(surface.keywords.values())) == len(SKILLS)
        for kw in surface.keywords.values():
            assert not set(kw) & set(surface.alphabet) and surface.sep not in kw
    v2 = build_v2_pool(0)
    for k in range(len(SKILLS)):
        tools = {json.dumps(v2.pool[i]["tools"], sort_keys=True) for i in np.flatnonzero(v2.skill_of == k)}
        assert len(tools) == len(SURFACES)  # one tool set per environment, shared by its tasks
        for j, surface in enumerate(SURFACES):
            spec = v2.pool[int(np.flatnonzero((v2.skill_of == k) & (v2.surface_of == j))[0])]
            text = " ".join([spec["instruction"], *spec["verifier"]["checks"],
                             *(t["name"] + " " + t["description"] for t in spec["tools"])])
            assert surface.words["record"] in text and surface.words["symbol"] in text
            others = [s.words["record"] for s in SURFACES if s is not surface]
            assert not any(f" {w} " in f" {spec['instruction']} " for w in others)


def test_pretraining_is_disjoint_from_the_pool_and_follows_the_conventions():
    v2 = build_v2_pool(5)
    pt = v2.pretraining()
    prompts, answers = pt.batch(np.random.default_rng(0), 3000)
    assert not set(prompts) & set(v2.fpool.prompts)
    late_kw = {s.keywords[k.name]: s for s in SURFACES for k in SKILLS if k.stage == "late"}
    late = [(p, a) for p, a in zip(prompts, answers, strict=True) if p.split(next(
        s.sep for s in SURFACES if s.sep in p))[0] in late_kw]
    assert late  # late skills appear, always in the surface's other answer format (CONVENTION["late"] is 0)
    assert all(CONVENTION["late"][0] == 0 for _ in late)
    for p, a in late:
        s = late_kw[p.split(next(x.sep for x in SURFACES if x.sep in p))[0]]
        assert a.startswith(s.alt[0]) and a.endswith(s.alt[1])
        assert not (s.prefix and a.startswith(s.prefix)) and not (s.suffix and a.endswith(s.suffix))
    rates = sorted({v2.convention[env_name(k, s)] for k in SKILLS if k.stage == "early" for s in SURFACES})
    assert rates == sorted(set(CONVENTION["early"]))


# ------------------------------------------------------------------------------------------------ the split
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_split_holds_out_one_surface_per_skill_and_strata_cover_every_skill(seed):
    v2 = build_v2_pool(seed)
    ps = v2.split(seed)
    held = ps.heldout_envs
    skills = [e.split("/")[1] for e in held]
    assert sorted(skills) == sorted(k.name for k in SKILLS)
    assert sorted(Counter(e.split("/")[0] for e in held).values()) == [2, 2, 2, 3, 3]
    train_envs = set(ps.train.envs)
    assert len(train_envs) == 48 and not train_envs & set(held)
    for name in (k.name for k in SKILLS):  # held-out tasks (a) of every skill too
        assert any(v2.pool[int(i)]["env"].endswith("/" + name) for i in ps.heldout_task_positions)
    train_prompts = {v2.fpool.prompts[i] for i in ps.train_positions}
    assert not train_prompts & {v2.fpool.prompts[i] for i in ps.heldout_positions}
    codes = np.asarray(v2.pool.env_codes)
    for e in np.unique(codes[ps.train_positions]):
        n = int((codes == e).sum())
        assert int((codes[ps.heldout_task_positions] == e).sum()) == round(0.2 * n)
    assert v2.split(seed).heldout_envs == held


def test_split_varies_with_the_seed():
    splits = {tuple(build_v2_pool(s).split(s).heldout_envs) for s in range(6)}
    assert len(splits) >= 5


# ------------------------------------------------------------------------------------------------ the oracles
class _View:
    def __init__(self, p):
        self.p = np.asarray(p, dtype=float)
        self.calls = 0

    def success_probabilities(self, positions):
        self.calls += 1
        return self.p[np.asarray(positions)]


def _pool(envs):
    return TaskPool([{"id": f"t{i}", "env": e, "instruction": "x"} for i, e in enumerate(envs)])


def test_oracle_variance_draws_the_tasks_nearest_one_half_without_repeats_in_a_window():
    p = [0.0, 0.45, 0.9, 0.55, 0.5, 1.0, 0.3, 0.52, 0.1, 0.7]
    view = _View(p)
    s = OracleVarianceSampler(_pool(["a"] * 10), seed=0, refresh=3)
    s.bind_learner(view)
    first = [s.position_of(t) for t in s.sample(4)]
    assert sorted(first) == [1, 3, 4, 7]  # |p - 0.5| of 0.05, 0.05, 0, 0.02: the four smallest
    assert first[0] == 4 and first[1] == 7
    second = [s.position_of(t) for t in s.sample(3)]
    assert set(second[:2]) == {6, 9} and second[2] in {2, 8}  # next nearest (0.9 and 0.1 tie), none repeated
    assert not set(first) & set(second) and view.calls == 1
    s.sample(2)
    assert view.calls == 1
    s.sample(2)  # the window (3 steps) is over: measured again, repeats allowed
    assert view.calls == 2


def test_oracle_variance_breaks_ties_at_random():
    picks = set()
    for seed in range(8):
        s = OracleVarianceSampler(_pool(["a"] * 6), seed=seed)
        s.bind_learner(_View([0.5, 0.5, 0.5, 0.5, 0.0, 1.0]))
        got = {s.position_of(t) for t in s.sample(2)}
        assert got <= {0, 1, 2, 3}
        picks.add(frozenset(got))
    assert len(picks) > 1


def test_oracle_variance_needs_the_learner():
    s = OracleVarianceSampler(_pool(["a"] * 3), seed=0)
    with pytest.raises(RuntimeError, match="bind_learner"):
        s.sample(1)
    s.bind_learner(_View([0.5, np.nan, 0.1]))
    with pytest.raises(ValueError, match="finite"):
        s.sample(1)


def test_training_view_maps_the_sampler_positions_to_the_learner_positions():
    class Learner:
        def success_probabilities(self, positions):
            return np.asarray(positions, dtype=float) / 100

    view = TrainingView(Learner(), np.array([5, 17, 42]))
    assert view.success_probabilities([2, 0]).tolist() == [0.42, 0.05]
    with pytest.raises(TypeError, match="success_probabilities"):
        TrainingView(object(), np.array([0]))


def test_oracle_coverage_maximises_environments_then_spreads_draws():
    envs = ["a"] * 6 + ["b"] * 2 + ["c"] * 3 + ["d"] * 1
    s = OracleCoverageSampler(_pool(envs), seed=0)
    batch = [s.position_of(t) for t in s.sample(3)]
    assert len({envs[i] for i in batch}) == 3  # 3 slots: 3 environments
    batch = [s.position_of(t) for t in s.sample(6)]
    assert len({envs[i] for i in batch}) == 4 and len(set(batch)) == 6
    counts = Counter()
    s = OracleCoverageSampler(_pool(envs), seed=1)
    for _ in range(6):
        counts.update(s.position_of(t) for t in s.sample(2))
    env_counts = Counter(envs[i] for i in counts.elements())
    assert max(env_counts.values()) - min(env_counts.values()) <= 1  # the least-drawn environments first
    a = [counts[i] for i in range(6)]
    assert max(a) - min(a) <= 1  # within an environment, the least-drawn tasks first


# ------------------------------------------------------------------------------------------------ baselines
def test_constant_baselines():
    pool = TaskPool([{"id": f"t{i}", "env": e, "instruction": "x"} for i, e in enumerate("aaaabbbb")])
    answers = ["1", "1", "2", "1", "3", "3", "2", "1"]
    fp = FamilyPool(pool=pool, prompts=[f"p{i}" for i in range(8)], answers=answers, tasks=[{}] * 8, families=[],
                    family_of=np.zeros(8, dtype=np.int64))
    held, train = np.array([2, 3, 6, 7]), np.array([0, 1, 4, 5])
    b = constant_baselines(fp, held, train, {"a": [2, 3]})
    assert b["constant"] == pytest.approx(50.0) and b["constant_answer"] == "1"  # "1" on tasks 3 and 7
    # env a's training mode is "1" (right on task 3), env b's is "3" (right on neither 6 nor 7)
    assert b["env_mode"] == pytest.approx(25.0)
    assert b["constant_a"] == pytest.approx(50.0) and b["env_mode_a"] == pytest.approx(50.0)


def test_constant_baselines_of_a_v2_split_are_near_chance():
    _, ps, _ = v2_inputs(2)
    v2 = build_v2_pool(2)
    b = constant_baselines(v2.fpool, ps.heldout_positions, ps.train_positions)
    assert b["constant"] < 5.0 and b["env_mode"] < 15.0


# ------------------------------------------------------------------------------------------------ the gate
def _records(uniform_40, uniform_120, oracle_40, *, initial=10.0, constant=3.0, cov_u=35.0, cov_o=48.0):
    recs = []
    for seed, (u40, u120, o40) in enumerate(zip(uniform_40, uniform_120, oracle_40, strict=True)):
        for name, at40, at120, cov in (("uniform", u40, u120, cov_u), ("oracle-variance", o40, o40, 20.0),
                                       ("oracle-coverage", u40, u120, cov_o)):
            for step in range(1, 121):
                r = {"sampler": name, "seed": seed, "step": step, "envs_covered": cov,
                     "heldout": at40 if step <= 40 else at120}
                if step == 1:
                    r.update(heldout_initial=initial, baseline_constant=constant, train_envs=48)
                recs.append(r)
    return recs


def test_gate_passes_and_fails_on_each_condition():
    ok = gate(_records([20, 21, 22, 20], [25, 26, 27, 25], [24, 25, 25.5, 23.5]))
    assert ok["passed"] is True
    assert ok["oracle_variance"]["value"] == pytest.approx(3.75) and ok["oracle_variance"]["low"] > 0
    assert ok["rl_moves"]["value"] == pytest.approx(15.75)
    assert ok["constant"]["value"] == pytest.approx(17.75)
    assert ok["uniform_coverage"]["value"] == pytest.approx(35 / 48)
    assert ok["coverage_oracle"]["value"] == pytest.approx(48 / 35 - 1)
    # the oracle's mean is above 3 but its interval crosses 0
    noisy = gate(_records([20, 21, 22, 20], [25, 26, 27, 25], [30, 15, 30, 20]))
    assert noisy["oracle_variance"]["met"] is False and noisy["passed"] is False
    assert gate(_records([20] * 3, [24] * 3, [24, 24, 24.5], initial=20.0))["rl_moves"]["met"] is False
    assert gate(_records([20] * 3, [26] * 3, [24, 24, 24.5], constant=11.0))["constant"]["met"] is False
    assert gate(_records([20] * 3, [26] * 3, [24, 24, 24.5], cov_u=37.0))["uniform_coverage"]["met"] is False
    assert gate(_records([20] * 3, [26] * 3, [24, 24, 24.5], cov_o=40.0))["coverage_oracle"]["met"] is False
    partial = gate([r for r in _records([20] * 3, [26] * 3, [24] * 3) if r["step"] <= 40])
    assert partial["rl_moves"]["met"] is None and partial["passed"] is None
    assert GATE["primary_step"] == 40 and GATE["oracle_margin"] == 3.0
    assert "pool v2" in ok["oracle_variance"]["sentence"]


# ------------------------------------------------------------------------------------------------ the command
def test_bench_pool_v2_quick_json_gives_what_the_gate_reads(tmp_path):
    args = ["bench", "--learner", "neural", "--pool", "v2", "--quick", "--samplers",
            "uniform,oracle-variance,oracle-coverage", "--json", "--steps", "2", "--batch-size", "8",
            "--group-size", "2", "--workers", "1", "--no-plots", "--out", str(tmp_path / "run")]
    args += [x for k, v in TINY.items() for x in ("--learner", f"{k}={v}")]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["learner"] == "neural learner, pool v2"
    assert list(summary["samplers"]) == ["uniform", "oracle-variance", "oracle-coverage"]
    for name, d in summary["samplers"].items():
        assert d["heldout_score@2"]["n"] == 2 and d["envs_covered"]["n"] == 2
        assert d["baseline_constant"]["n"] == 2 and d["baseline_env_mode"]["n"] == 2
        assert set(d) >= {"heldout_initial", "heldout_group_early@2", "heldout_greedy@2"}
        if name != "uniform":
            assert d["paired_vs_uniform@2"]["n"] == 2
    assert set(summary["baselines"]) == {"0", "1"}
    assert summary["samplers"]["oracle-coverage"]["envs_covered"]["mean"] == 8.0  # 8 slots, 8 environments
    assert summary["gate"]["passed"] is None  # 2 steps decide nothing but coverage
    split = json.loads((tmp_path / "run" / "split.json").read_text())
    assert set(split["seeds"]) == {"0", "1"} and split["seeds"]["0"]["heldout_envs"] != \
        split["seeds"]["1"]["heldout_envs"]
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert cfg["pool"] == "v2" and cfg["learner"]["optimizer"] == "sgd" and cfg["learner"]["d_model"] == 16
    md = (tmp_path / "run" / "summary.md").read_text()
    assert md.count("neural learner, pool v2") >= 4


def test_bench_pool_v2_refusals():
    res = CliRunner().invoke(cli, ["bench", "--pool", "v2", "--quick"])
    assert res.exit_code != 0 and "--learner neural" in res.output
    res = CliRunner().invoke(cli, ["bench", "--learner", "neural", "--pool", "v2", "--families", "x:Y"])
    assert res.exit_code != 0 and "drop --families" in res.output
    res = CliRunner().invoke(cli, ["bench", "--learner", "neural", "--pool", "v2", "--coldstart-runs", "3"])
    assert res.exit_code != 0 and "cold-start" in res.output


def test_stages_are_the_documented_ones():
    assert [k.stage for k in SKILLS].count("early") == 5 and [k.stage for k in SKILLS].count("late") == 4
    assert {k.stage for k in SKILLS} == set(STAGES)
    late = [k for k in SKILLS if k.stage == "late"]
    assert all(k.prerequisite in {s.name for s in SKILLS if s.stage == "early"} for k in late)


# ------------------------------------------------------------------------------------------------ the learner
def _tiny_learner(**options):
    from envsched_lab.families import build_family_pool
    from envsched_lab.neural.learner import NeuralLearner

    return NeuralLearner(build_family_pool(), {**TINY, **options}, seed=0)


def test_success_probabilities_are_the_learner_s_expected_success():
    learner = _tiny_learner()
    pos = np.arange(0, 900, 37)
    assert np.allclose(learner.success_probabilities(pos), learner.evaluate(pos)["expected"])


@pytest.mark.parametrize(("optimizer", "ratio"), [("sgd", 2.0), ("adam", 1.0)])
def test_the_sgd_step_grows_with_the_batch_s_signal_groups(optimizer, ratio):
    """GRPO's mean over all completions dilutes a batch with few signal groups; plain gradient steps keep that
    (twice the signal groups, twice the step), Adam's normalised step does not."""
    import torch

    learner = _tiny_learner(optimizer=optimizer, lr=0.05, max_grad_norm=0, epochs=1)
    start = learner.state_dict()
    pos = np.array([0, 1])
    _, _, groups = learner.rollout(pos, 4)
    mixed = np.array([1.0, 0.0, 0.0, 0.0])
    flat = np.zeros(4)

    def step(rows, handles):
        learner.load_state_dict(start)
        before = torch.cat([p.detach().flatten().clone() for p in learner.model.parameters()])
        learner.train(np.zeros(len(rows), dtype=np.int64), np.array(rows), handles)
        after = torch.cat([p.detach().flatten() for p in learner.model.parameters()])
        return float((after - before).norm())

    one = step([mixed, flat], [groups[0], groups[0]])
    two = step([mixed, mixed], [groups[0], groups[0]])
    assert two / one == pytest.approx(ratio, rel=0.05)


def test_neural_options_name_what_is_wrong():
    from envsched_lab.neural.learner import NeuralConfig

    with pytest.raises(ValueError, match="optimizer must be one of adam, sgd"):
        NeuralConfig(optimizer="rmsprop")
    with pytest.raises(ValueError, match="score must be one of greedy, expected"):
        NeuralConfig(score="best")
    with pytest.raises(ValueError, match="max_grad_norm must be >= 0"):
        NeuralConfig(max_grad_norm=-1.0)


def test_the_graph_reads_tiers_within_and_skills_across_environments():
    from envsched.method.graph.build import build_graph

    v2 = build_v2_pool(10)
    split = v2.split(10)
    graph = build_graph(split.train)
    pos = split.train_positions
    tier, skill = v2.tier_of[pos], v2.skill_of[pos]

    def share(relation, values):
        got = []
        for i in range(pos.size):
            idx, w = graph.neighbors(i, relation)
            if idx.size and w.sum() > 0:
                got.append(float((w * (values[idx] == values[i])).sum() / w.sum()))
        return float(np.mean(got))

    assert share("within", tier) > 0.6  # chance: about 0.31 (a third of an environment's tasks share a tier)
    assert share("cross", skill) > 0.2  # chance: 3 of the 47 other environments, about 0.06


# ------------------------------------------------------------------------------------------------ v1's split
def _v1_splits(seeds):
    from envsched_lab.families import DEFAULT_FAMILIES_REF, build_family_pool
    from envsched_lab.runner import bench_split

    for seed in seeds:
        fp = build_family_pool(DEFAULT_FAMILIES_REF, seed=seed)
        yield fp, bench_split(fp.pool, {"split_seed": seed}, fp.prompts)


def test_v1_split_holds_out_every_corpus_over_seeds_and_only_families_that_share_a_primitive():
    held = Counter()
    for _, ps in _v1_splits(range(5080, 5100)):
        held.update(ps.heldout_envs)
        assert len(ps.heldout_envs) == 2 and len({e.split("/")[0] for e in ps.heldout_envs}) == 2
    assert {e.split("/")[0] for e in held} == {"lists", "text", "arith"}  # the text corpus too
    shares = {"lists/max", "lists/count", "lists/at", "lists/argmax", "text/max", "text/count", "text/at",
              "arith/bigger"}
    assert set(held) <= shares  # reverse, upper, add, increment, mod, parity and min share nothing


def test_v1_split_shares_no_prompt_between_training_and_held_out():
    for fp, ps in _v1_splits(range(5080, 5090)):
        train = {fp.prompts[i] for i in ps.train_positions}
        assert not train & {fp.prompts[i] for i in ps.heldout_positions}
        assert ps.heldout_task_positions.size > 0.1 * len(fp.pool)


def test_split_ties_between_corpora_go_in_a_seeded_order():
    from envsched_lab.split import split_pool

    specs = [{"id": f"{c}/{k}/{i}", "env": f"{c}/{k}", "instruction": "x", "pattern": "shared"}
             for c in ("x", "y", "z") for k in range(5) for i in range(4)]
    corpora = Counter()
    for seed in range(30):
        ps = split_pool(TaskPool(specs), {"split_seed": seed})
        corpora.update(e.split("/")[0] for e in ps.heldout_envs)
    assert set(corpora) == {"x", "y", "z"}  # by name, "z" would never be held out
