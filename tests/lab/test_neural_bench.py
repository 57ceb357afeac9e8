"""``envsched bench --learner neural``: families plugged in through --families, the held-out split kept from
every sampler, determinism, and the quick run."""

import json
import sys
import types

import numpy as np
import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched_lab.families import build_family_pool
from envsched_lab.neural.learner import NeuralLearner
from envsched_lab.runner import BenchConfig, available_samplers, bench_split, run_benchmark, run_one

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

TINY = {"warmup_steps": 2, "warmup_batch": 4, "d_model": 16, "n_heads": 2, "n_layers": 1, "eval_every": 2,
        "train_eval_tasks": 20}
TINY_ARGS = [x for k, v in TINY.items() for x in ("--learner", f"{k}={v}")]


class _Pick:
    """A family defined here alone: answer with the digit at the queried position (or its double)."""

    def __init__(self, name, corpus, double=False):
        self.name, self.corpus, self.double = name, corpus, double
        self.tools = [{"name": "read", "description": f"Return the {corpus} record."}]

    def generate(self, rng, tier):
        xs = rng.integers(0, 5, size=2 + tier)
        k = int(rng.integers(len(xs)))
        ans = str(int(xs[k]) * (2 if self.double else 1))
        return {"instruction": f"Answer from the {self.corpus} record.", "tools": self.tools, "difficulty": tier,
                "verifier": {"checks": ["reply equals the looked-up value"]},
                "prompt": f"{'d' if self.double else 'p'}{k}:" + "".join(map(str, xs)), "answer": ans,
                "pattern": "lookup"}  # a primitive shared across corpora: the family can be held out


class _Graded(_Pick):
    """Graded reward: 1 for the answer, 0.5 for a reply of the right length."""

    def generate(self, rng, tier):
        task = super().generate(rng, tier)
        task["target"] = task.pop("answer")
        return task

    def score(self, task, completion):
        return 1.0 if completion == task["target"] else 0.5 if len(completion) == len(task["target"]) else 0.0


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))
    mod = types.ModuleType("neural_test_families")
    mod.FAMILIES = [_Pick("a/pick", "a"), _Pick("a/double", "a", True), _Graded("a/graded", "a"),
                    _Pick("b/pick", "b"), _Pick("b/double", "b", True), _Pick("b/other", "b")]
    monkeypatch.setitem(sys.modules, "neural_test_families", mod)


REF = "neural_test_families:FAMILIES"


def test_a_family_defined_in_the_test_plugs_in_through_families(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["bench", "--learner", "neural", *TINY_ARGS, "--families", REF, "--samplers",
                                   "uniform,plr", "--seeds", "2", "--steps", "4", "--batch-size", "4",
                                   "--group-size", "4", "--workers", "1", "--no-plots", "--json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert set(summary["samplers"]) == {"uniform", "plr"}
    for key in ("heldout_score@4", "envs_covered", "batch_variance", "signal_per_episode", "heldout_expected@4",
                "heldout_initial"):
        assert summary["samplers"]["uniform"][key]["n"] == 2, key
    assert summary["samplers"]["plr"]["paired_vs_uniform@4"]["n"] == 2
    assert summary["config"]["learner_kind"] == "neural" and summary["config"]["families"] == REF
    split = json.loads((out / "split.json").read_text())
    assert split["tasks"] == 6 * 3 * 20 and split["learner"] == "neural" and len(split["heldout_envs"]) == 1
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["rollouts"] for r in recs} == {16 * k for k in range(1, 5)}
    assert all(r["cum_cost"] >= r["cum_episodes"] for r in recs)  # cost: generated tokens, EOS included
    assert [r["evaluated"] for r in recs if r["sampler"] == "uniform" and r["seed"] == 0] == [False, True, False,
                                                                                              True]


def test_bad_learner_input_is_refused(tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["bench", "--families", REF, "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "--learner neural" in res.output
    res = runner.invoke(cli, ["bench", "--learner", "neurall", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "unknown learner 'neurall'" in res.output
    res = runner.invoke(cli, ["bench", "--learner", "neural", "--families", "nowhere:X", "--out",
                              str(tmp_path / "x"), "--samplers", "uniform"])
    assert res.exit_code != 0 and "cannot import family module 'nowhere'" in res.output
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="unknown neural learner option"):
        BenchConfig(samplers=["uniform"], learner_kind="neural", learner={"depth": 3}).validate()


def test_no_heldout_task_is_ever_drawn_by_any_sampler(monkeypatch):
    fp = build_family_pool(REF)
    psplit = bench_split(fp.pool, None, fp.prompts)  # the split run_one makes for the neural learner
    held = set(psplit.heldout_positions.tolist())
    assert held and psplit.heldout_env_positions.size and psplit.heldout_task_positions.size
    drawn: list[int] = []
    original = NeuralLearner.rollout

    def spy(self, positions, n):
        drawn.extend(int(p) for p in positions)
        return original(self, positions, n)

    monkeypatch.setattr(NeuralLearner, "rollout", spy)
    names = list(available_samplers())
    assert "uniform-ds" in names and "envsched" in names
    for name in names:
        before = len(drawn)
        run_one(fp.pool, name, 0, steps=4, batch_size=6, group_size=2, learner=TINY, learner_kind="neural",
                families=REF)
        assert len(drawn) - before == 4 * 6, name
        assert not held & set(drawn[before:]), name
    assert len(set(drawn)) > 30


def test_same_command_same_summary(tmp_path):
    def run(d):
        # warmed up enough that groups get mixed rewards, so GRPO updates really happen
        learner = {**TINY, "warmup_steps": 60, "warmup_batch": 16, "warmup_lr": 1e-2}
        cfg = BenchConfig(samplers=["uniform", "mopps"], seeds=[0, 1], steps=4, batch_size=4, group_size=4,
                          learner=learner, learner_kind="neural", families=REF, coldstart_runs=0,
                          score_steps=[2, 4], target_step=2)
        s = run_benchmark(cfg, tmp_path / d, pool=build_family_pool(REF).pool, workers=1, plots=False)
        return json.dumps({k: v for k, v in s.items() if k != "written"}, sort_keys=True, default=float)

    first = run("a")  # warms up and writes the warm-up cache
    second = run("b")  # reads it
    assert first == second
    recs = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert len({r["heldout_initial"] for r in recs if "heldout_initial" in r}) == 2  # seeds differ
    assert sum(r["signal_groups"] for r in recs) >= 4


def test_quick_run_completes(tmp_path):
    res = CliRunner().invoke(cli, ["bench", "--learner", "neural", "--quick", *TINY_ARGS, "--families", REF,
                                   "--steps", "2", "--batch-size", "4", "--group-size", "2", "--workers", "1",
                                   "--no-plots", "--out", str(tmp_path / "q")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "q" / "summary.json").read_text())
    assert list(summary["samplers"]) == ["uniform", "mopps", "plr", "envsched"]
    assert all(d["seeds"] == [0, 1] for d in summary["samplers"].values())
    assert np.isfinite(summary["samplers"]["envsched"]["heldout_score@2"]["mean"])
