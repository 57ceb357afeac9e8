import json

import numpy as np
import pytest
from click.testing import CliRunner

from envsched.pool.pool import TaskPool
from envsched_lab.runner import BenchConfig, run_benchmark, run_one


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))


def _pool(n_env=4, per_env=8):
    specs = []
    for e in range(n_env):
        for i in range(per_env):
            specs.append({"id": f"e{e}/t{i}", "env": f"env{e}", "difficulty": i % 3,
                          "tools": [{"name": f"op{i % 3}"}, {"name": "common"}],
                          "verifier": {"checks": ["c1", "c2", "c3"][: 1 + i % 3]}})
    return TaskPool(specs)


def _config(**kw):
    base = {"samplers": ["uniform", "mopps"], "seeds": [0, 1], "steps": 6, "batch_size": 4, "group_size": 4,
            "coldstart_runs": 3, "coldstart_steps": 2, "coldstart_samplers": ["uniform"], "score_steps": [3, 6],
            "target_step": 3}
    base.update(kw)
    return BenchConfig(**base)


def test_run_one_records_and_budget_accounting():
    pool = _pool()
    recs = run_one(pool, "uniform-ds", 0, steps=8, batch_size=4, group_size=4)
    assert [r["rollouts"] for r in recs] == [16 * (k + 1) for k in range(8)]  # every round spends B x n
    assert recs[-1]["cum_episodes"] == 8 * 16  # dropped groups counted as spent
    assert recs[-1]["updates"] <= 8
    assert recs[-1]["signal_per_episode"] == pytest.approx(recs[-1]["cum_signal_groups"] / (8 * 16))
    assert all(1 <= r["envs_covered"] <= 4 for r in recs)
    assert all(r["exploit_picks"] == -1 for r in recs)
    again = run_one(pool, "uniform-ds", 0, steps=8, batch_size=4, group_size=4)
    assert recs == again
    uni = run_one(pool, "uniform", 0, steps=8, batch_size=4, group_size=4)
    assert uni[-1]["updates"] == 8


def test_benchmark_writes_outputs_and_resumes(tmp_path):
    pool = _pool()
    cfg = _config()
    out = tmp_path / "run"
    summary = run_benchmark(cfg, out, pool=pool, workers=1, plots=False)
    files = sorted(p.name for p in (out / "runs").iterdir())
    assert files == ["mopps__seed0.jsonl", "mopps__seed1.jsonl", "uniform__coldstart.jsonl",
                     "uniform__seed0.jsonl", "uniform__seed1.jsonl"]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 2 * 6
    import pyarrow.parquet as pq

    assert pq.read_table(out / "metrics.parquet").num_rows == 24
    assert set(summary["samplers"]) == {"uniform", "mopps"}
    assert summary["samplers"]["uniform"]["score@6"]["n"] == 2
    assert len(summary["coldstart"]["uniform"]["table"]) == 2
    assert "| uniform |" in (out / "summary.md").read_text()
    # resume: a finished run is kept as is, a missing one is redone identically
    keep = out / "runs" / "uniform__seed0.jsonl"
    redo = out / "runs" / "mopps__seed1.jsonl"
    keep_mtime, redo_text = keep.stat().st_mtime_ns, redo.read_text()
    redo.unlink()
    ticks = []
    run_benchmark(cfg, out, pool=pool, workers=1, plots=False, progress=lambda d, t: ticks.append((d, t)))
    assert keep.stat().st_mtime_ns == keep_mtime
    assert redo.read_text() == redo_text
    total = 2 * 2 * 6 + 3 * 2
    assert ticks[0] == (total - 6, total) and ticks[-1][0] == total
    # another configuration into the same directory is refused
    with pytest.raises(FileExistsError, match="another configuration"):
        run_benchmark(_config(steps=7), out, pool=pool, workers=1, plots=False)


@pytest.mark.slow
def test_benchmark_parallel_matches_serial(tmp_path):
    pool = _pool()
    cfg = _config(coldstart_runs=0, samplers=["plr", "greso"])
    a = run_benchmark(cfg, tmp_path / "a", pool=pool, workers=1, plots=False)
    b = run_benchmark(cfg, tmp_path / "b", pool=pool, workers=2, plots=True)
    assert (tmp_path / "a" / "metrics.jsonl").read_text().splitlines() != []
    ra = sorted((tmp_path / "a" / "metrics.jsonl").read_text().splitlines())
    rb = sorted((tmp_path / "b" / "metrics.jsonl").read_text().splitlines())
    assert ra == rb
    assert a["samplers"]["plr"]["batch_variance"] == b["samplers"]["plr"]["batch_variance"]
    assert (tmp_path / "b" / "score_vs_rollouts.png").stat().st_size > 1000


def test_target_and_rollouts_to_target(tmp_path):
    pool = _pool()
    summary = run_benchmark(_config(coldstart_runs=0), tmp_path / "r", pool=pool, workers=1, plots=False)
    recs = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    best = [max(r["heldout"] for r in recs if r["sampler"] == "uniform" and r["seed"] == s and r["step"] <= 3)
            for s in (0, 1)]
    assert summary["target_metric"] == "heldout"
    assert summary["target_score"] == pytest.approx(np.mean(best))
    d = summary["samplers"]["uniform"]
    assert d["target_missed"] == 0  # paired by seed: uniform reaches its own best by step 3
    assert d["steps_to_target"]["mean"] <= 3
    m = summary["samplers"]["mopps"]
    assert m["rollouts_to_target"]["n"] + m["target_missed"] == 2


def test_cli_bench(tmp_path):
    from envsched.cli.main import cli

    pool_file = tmp_path / "pool.jsonl"
    _pool().to_jsonl(pool_file)
    out = tmp_path / "cli-run"
    args = ["bench", "--pool", str(pool_file), "--samplers", "uniform,plr", "--seeds", "1", "--steps", "4",
            "--batch-size", "4", "--group-size", "4", "--coldstart-runs", "0", "--workers", "1", "--no-plots",
            "--learner", "sharing=0", "--sampler-option", "plr.temperature=0.3", "--out", str(out), "--json",
            "--untuned"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output[res.output.index("{"):])
    assert summary["config"]["learner"] == {"sharing": 0}
    assert summary["config"]["sampler_options"] == {"plr": {"temperature": 0.3}}
    # tuned values from a file apply to their sampler; an explicit --sampler-option wins over them
    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({"samplers": {"plr": {"params": {"temperature": 0.7, "staleness_coef": 0.2}},
                                              "mopps": {"params": {"forgetting": 0.9}}}}))
    args2 = [a for a in args if a != "--untuned"]
    args2[args2.index(str(out))] = str(tmp_path / "cli-run2")
    res = CliRunner().invoke(cli, [*args2, "--tuned-file", str(tuned)])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output[res.output.index("{"):])
    assert summary["config"]["sampler_options"]["plr"] == {"temperature": 0.3, "staleness_coef": 0.2}
    missing = CliRunner().invoke(cli, [*args2, "--tuned-file", str(tmp_path / "none.json")])
    assert missing.exit_code != 0 and "none.json" in missing.output
    bad = CliRunner().invoke(cli, ["bench", "--pool", str(pool_file), "--samplers", "nope", "--out", str(out)])
    assert bad.exit_code != 0 and "nope" in bad.output


def test_cli_bench_names_the_missing_extra_in_one_line(tmp_path, monkeypatch):
    from envsched.cli.main import cli
    from envsched_lab import report

    monkeypatch.setattr(report, "has_module", lambda name: False)
    pool_file = tmp_path / "pool.jsonl"
    _pool().to_jsonl(pool_file)
    args = ["bench", "--pool", str(pool_file), "--samplers", "uniform", "--seeds", "1", "--steps", "2",
            "--batch-size", "4", "--group-size", "4", "--coldstart-runs", "0", "--workers", "1", "--untuned",
            "--out", str(tmp_path / "run")]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "pip install 'envsched[lab]'" in res.output
    assert not (tmp_path / "run" / "metrics.parquet").exists() and (tmp_path / "run" / "summary.json").exists()


def test_a_v2_bench_run_is_scored_at_the_report_steps(monkeypatch) -> None:
    """`envsched bench --pool v2` reports held-out scores at steps 40 and 120: the run is asked to score the learner
    there, so a sampler that updates less often than every step (GRESO) is not read at a stale evaluation."""
    from envsched_lab import runner

    seen: dict = {}
    monkeypatch.setattr(runner, "v2_inputs", lambda seed, split: ("pool", "split", "groups"))
    monkeypatch.setattr(runner, "run_one", lambda *a, **kw: seen.update(kw) or [])
    cfg = {"sampler_options": {}, "pool": runner.V2_POOL, "steps": 120, "batch_size": 64, "group_size": 8,
           "learner": {}, "score_steps": [40, 120]}
    runner._execute_job(None, {"kind": "run", "config": cfg, "sampler": "greso", "seed": 3}, None)
    assert list(seen["score_steps"]) == [40, 120]
