"""``envsched_lab.protocol`` on a tiny neural setting: phases, resume, per-seed pools and splits, the report."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest

from envsched_lab import protocol as proto
from envsched_lab.protocol import ProtocolConfig, run_pilot, run_protocol

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

TINY = {"warmup_steps": 2, "warmup_batch": 4, "d_model": 16, "n_heads": 2, "n_layers": 1, "eval_every": 2,
        "train_eval_tasks": 20}


class _Lookup:
    def __init__(self, name: str, corpus: str) -> None:
        self.name, self.corpus = name, corpus
        self.tools = [{"name": "read", "description": f"Return the {corpus} record."}]

    def generate(self, rng, tier):
        xs = rng.integers(0, 5, size=2 + tier)
        k = int(rng.integers(len(xs)))
        return {"instruction": f"Answer from the {self.corpus} record.", "tools": self.tools, "difficulty": tier,
                "verifier": {"checks": ["reply equals the looked-up value"]},
                "prompt": f"p{k}:" + "".join(map(str, xs)), "answer": str(int(xs[k]))}


REF = "protocol_test_families:FAMILIES"


def _install_families(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(cache))
    mod = types.ModuleType("protocol_test_families")
    mod.FAMILIES = [_Lookup(f"{c}/f{i}", c) for c in ("a", "b") for i in range(3)]
    monkeypatch.setitem(sys.modules, "protocol_test_families", mod)


@pytest.fixture(autouse=True)
def _families(tmp_path, monkeypatch):
    _install_families(monkeypatch, tmp_path / "cache")


def _config(**kw) -> ProtocolConfig:
    base = dict(primary=("uniform", "plr"), controls=("envsched-shuffled-graph",), descriptive=(),
                eval_seeds=(5000, 5001, 5002), tuning_seeds=(1000,), trials=2, steps=2, batch_size=6,
                group_size=2, families=REF, learner_options=TINY, eval_rollouts=1)
    return ProtocolConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, dict]:
    """One protocol run of :func:`_config` to the end (its folder and report), which the tests below read and
    resume but never change: running it costs most of this module's time."""
    root = tmp_path_factory.mktemp("protocol")
    with pytest.MonkeyPatch.context() as mp:
        _install_families(mp, root / "cache")
        report = run_protocol(_config(), root / "p")
    return root, report


def test_protocol_runs_every_phase_and_resumes(finished) -> None:
    tmp_path, report = finished
    cfg = _config()
    runs = sorted(p.relative_to(tmp_path / "p" / "runs").as_posix() for p in (tmp_path / "p" / "runs").rglob("*.json"))
    # untuned: 4 samplers x 3 seeds; tuning: plr and envsched have knobs (2 trials x 1 seed); tuned: 2 x 3
    assert sum(r.startswith("untuned/") for r in runs) == 12
    assert sum(r.startswith("tuning/") for r in runs) == 4
    # tuned: plr and envsched x 3 seeds (controls and descriptive samplers run untuned only)
    assert sum(r.startswith("tuned/") for r in runs) == 6 and "tuned/plr__5001.json" in runs
    assert report["tuned"]["controls"] == {} and set(report["tuned"]["primary"]) == {"uniform", "plr"}
    prim = report["untuned"]["primary"]
    assert set(prim) == {"uniform", "plr"} and all(c["n"] == 3 for c in prim.values())
    assert set(report["untuned"]["controls"]) == {"envsched-shuffled-graph"}
    assert report["tuned_params"]["plr"]["trial"] in (0, 1)
    md = (tmp_path / "p" / "protocol-report.md").read_text()
    assert "envsched vs uniform" in md and "Tuned minus untuned" in md
    # each evaluation seed ran on its own pool instance
    a = json.loads((tmp_path / "p" / "runs" / "untuned" / "uniform__5000.json").read_text())
    b = json.loads((tmp_path / "p" / "runs" / "untuned" / "uniform__5001.json").read_text())
    assert a["seed"] == 5000 and b["seed"] == 5001
    # each run records the commit that ran it; the report names those commits apart from its own, and its CPU
    # figure covers every run, tuning trials included
    head = proto._commit()
    assert a["commit"] == head and report["run_commits"] == [head or "unrecorded"]
    every = [json.loads(p.read_text()) for p in (tmp_path / "p" / "runs").rglob("*.json")]
    assert report["cpu_seconds"] == pytest.approx(sum(r["cpu_s"] for r in every))
    assert f"Runs at commit `{head or 'unrecorded'}`" in md
    # the forest plot is a PNG (matplotlib is in the test extras)
    assert (tmp_path / "p" / "protocol-report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # resume: nothing reruns, same report
    calls = []
    original = proto._run_job
    proto._run_job = lambda job: calls.append(job) or original(job)
    try:
        again = run_protocol(cfg, tmp_path / "p")
    finally:
        proto._run_job = original
    assert calls == [] and again["untuned"]["primary"] == prim
    # another configuration in the same folder is refused
    with pytest.raises(FileExistsError, match="another configuration"):
        run_protocol(_config(margin=1.0), tmp_path / "p")


def test_protocol_config_keeps_seed_ranges_apart() -> None:
    with pytest.raises(ValueError, match="development seeds"):
        _config(eval_seeds=(3, 4))
    with pytest.raises(ValueError, match="distinct"):
        _config(eval_seeds=(5000, 1000), tuning_seeds=(1000,))
    with pytest.raises(ValueError, match="unknown sampler"):
        _config(primary=("nope",))
    with pytest.raises(ValueError, match="margin"):
        _config(margin=0.0)


def test_the_committed_protocol_is_what_the_code_runs() -> None:
    cfg = ProtocolConfig()
    doc = (Path(__file__).resolve().parents[2] / "docs" / "evaluation-protocol.md").read_text()
    assert cfg.eval_seeds == tuple(range(5000, 5040)) and "5000-5039" in doc
    assert proto.EVALUATION_ROUNDS[2] == tuple(range(5040, 5080)) and "| 2 | 5040-5079 |" in doc
    assert proto.EVALUATION_ROUNDS[3] == tuple(range(5080, 5120)) and "| 3 | 5080-5119 |" in doc
    assert "Status: in force" in doc and "DRAFT" not in doc
    assert cfg.primary == ("uniform", "plr", "mopps", "dps", "sec")
    assert cfg.margin == 2.0 and "2.0 points" in doc
    assert cfg.trials == 8 and "8 random-search trials" in doc
    assert cfg.tuning_seeds == (1000, 1001) and "1000-1001" in doc


def test_pilot_refuses_evaluation_seeds_and_reports_the_mde(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="development seeds"):
        run_pilot(tmp_path, seeds=(5000, 5001), config=_config())
    doc = run_pilot(tmp_path, samplers=("uniform", "plr"), seeds=(0, 1, 2), config=_config())
    pair = doc["pairs"]["uniform - plr"]
    assert pair["n"] == 3 and doc["eval_seeds"] == 3
    assert pair["mde_at_eval_seeds"] >= 0 or pair["sd"] != pair["sd"]


def test_cli_protocol_refuses_what_the_protocol_fixes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from envsched.cli.main import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["bench", "--pilot"])
    assert res.exit_code != 0 and "--pilot is part of --protocol" in res.output
    res = runner.invoke(cli, ["bench", "--protocol", str(tmp_path / "p"), "--seeds", "3"])
    assert res.exit_code != 0 and "drop --quick" in res.output
    assert not (tmp_path / "p").exists()


def test_evaluation_rounds_have_disjoint_fresh_seeds_and_a_folder_keeps_its_round(finished, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from envsched.cli.main import cli

    rounds = proto.EVALUATION_ROUNDS
    assert ProtocolConfig.for_round(1).eval_seeds == tuple(range(5000, 5040)) == ProtocolConfig().eval_seeds
    assert ProtocolConfig.for_round(2).eval_seeds == tuple(range(5040, 5080))
    assert not set(rounds[1]) & set(rounds[2]) and not (set(rounds[1]) | set(rounds[2])) & set(rounds[3])
    with pytest.raises(ValueError, match="evaluation round 9"):
        ProtocolConfig.for_round(9)
    # a folder started with one configuration resumes it from the CLI, whatever the latest round is
    folder = finished[0] / "p"
    assert proto.load_config(folder) == _config()
    calls = []
    original = proto._run_job
    proto._run_job = lambda job: calls.append(job) or original(job)
    try:
        res = CliRunner().invoke(cli, ["bench", "--protocol", str(folder), "--json"])
    finally:
        proto._run_job = original
    assert res.exit_code == 0, res.output
    assert calls == [] and json.loads(res.stdout)["config"]["eval_seeds"] == [5000, 5001, 5002]
    res = CliRunner().invoke(cli, ["bench", "--protocol", str(folder), "--round", "2"])
    assert res.exit_code != 0 and "another evaluation round" in res.output
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "protocol-config.json").write_text('{"config": {"margin": "x"}}')
    res = CliRunner().invoke(cli, ["bench", "--protocol", str(tmp_path / "bad")])
    assert res.exit_code != 0 and "is not a protocol configuration" in res.output


def _flaky_run(job: dict) -> dict:
    """A protocol run that fails for seed 5001 and is instant otherwise (forked workers inherit it)."""
    if job["seed"] == 5001:
        raise FloatingPointError("boom in the learner")
    time.sleep(0.2)
    return {**{k: job[k] for k in ("phase", "sampler", "seed", "options", "trial")}, "summary": {}, "cpu_s": 0.0}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_run_stops_the_protocol_at_once_names_the_run_and_keeps_the_finished_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    """Before this, one failing run made the worker pool finish every queued run and then lose them all."""
    monkeypatch.setattr(proto, "_run_job", _flaky_run)
    jobs = [proto._job(_config(), "untuned", sampler, seed) for seed in (5000, 5001, 5002)
            for sampler in ("uniform", "plr", "mopps", "dps", "sec", "envsched")]
    with pytest.raises(RuntimeError, match=r"untuned \w+ seed 5001 trial 0: FloatingPointError: boom"):
        proto._execute(tmp_path, jobs, workers, None)
    written = {p.name for p in (tmp_path / "runs" / "untuned").glob("*.json")}
    assert "uniform__5000.json" in written and not any("5001" in w for w in written)
    assert len(written) < len(jobs) - 6  # the queued runs after the failure were not run


def test_run_one_scores_the_learner_at_the_requested_steps() -> None:
    """A learner that evaluates every so many updates was scored at an endpoint's step only when its own schedule
    fell there: a filtering sampler's run (fewer updates than steps) read a stale held-out score at step 40."""
    from envsched_lab.families import build_family_pool
    from envsched_lab.runner import run_one

    pool = build_family_pool(REF, seed=0).pool
    kw = dict(steps=5, batch_size=6, group_size=2, learner={**TINY, "eval_every": 50}, learner_kind="neural",
              families=REF, family_seed=0, split={"split_seed": 0})
    plain = run_one(pool, "uniform", 0, **kw)
    scored = run_one(pool, "uniform", 0, score_steps=[3], **kw)
    assert not plain[2]["evaluated"] and scored[2]["evaluated"]
    assert [r["evaluated"] for r in scored] == [False, False, True, False, True]
    # scoring reads the learner's state only: the run itself is the same
    assert [r["mean_reward"] for r in plain] == [r["mean_reward"] for r in scored]
    assert plain[-1]["heldout"] == scored[-1]["heldout"]


def test_a_v2_protocol_run_reads_its_endpoint_steps_for_a_filtering_sampler_too(tmp_path: Path) -> None:
    """The v2 path of a protocol run on a development seed, tiny learner: the endpoint steps are scored for GRESO
    (which updates less often than every step) as for uniform, with the seed's trivial baselines."""
    import dataclasses

    cfg = dataclasses.replace(proto.round4_config(), eval_seeds=(7000, 7001), tuning_seeds=(1000,), steps=20,
                              batch_size=8, group_size=2, endpoint="heldout@10", secondary_steps=(20,), target_step=20,
                              primary=("uniform", "greso"), controls=(), descriptive=(),
                              learner_options={**proto.round4_config().learner_options, **TINY, "max_len": 24,
                                               "eval_every": 7})
    doc = run_pilot(tmp_path, samplers=("uniform", "greso"), seeds=(0,), config=cfg)
    assert doc["pairs"]["uniform - greso"]["n"] == 1
    for name in ("uniform", "greso"):
        run = json.loads((tmp_path / "runs" / "pilot" / f"{name}__0.json").read_text())["summary"]
        assert {"heldout@10", "heldout@20", "heldout_curve", "baseline_constant"} <= set(run)
        steps = [t for t, _ in run["heldout_curve"]]
        assert 10 in steps and 20 in steps and steps[0] == 0
        assert run["heldout@10"] == dict(map(tuple, run["heldout_curve"]))[10]
