"""Round 4 of the evaluation protocol (the v2 pool) as committed: its seeds, its fixed configuration, the CLI's
refusals, the dry run's plan and estimate, and the v2 report's endpoints on constructed runs (nothing trains)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched_lab import protocol as proto
from envsched_lab.protocol import (
    DEV_SEEDS,
    EVALUATION_ROUNDS,
    ROUND4_TUNING_SEEDS,
    TUNING_SEEDS,
    ProtocolConfig,
    protocol_plan,
    protocol_report,
    report_markdown,
    round4_config,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "evaluation-protocol.md").read_text()
#: Seeds any v2 run has used before round 4 was fixed: the gate attempts (0-9, 10-19), the ablation (20-29), round
#: 4's cost measurement (30) and the design pilots (100-102).
USED_ON_V2 = set(range(0, 31)) | {100, 101, 102}


def test_round4_seeds_are_fresh_and_disjoint_from_every_other_seed() -> None:
    seeds = EVALUATION_ROUNDS[4]
    assert seeds == tuple(range(5120, 5160)) and "5120-5159" in DOC
    assert round4_config().eval_seeds == seeds
    earlier = {s for r, rs in EVALUATION_ROUNDS.items() if r != 4 for s in rs}
    assert not set(seeds) & earlier
    assert not set(seeds) & (set(DEV_SEEDS) | set(TUNING_SEEDS) | set(ROUND4_TUNING_SEEDS) | USED_ON_V2)
    assert all(5000 <= s <= 5999 for s in seeds)  # the evaluation range of section 5
    tuning = round4_config().tuning_seeds
    assert tuning == ROUND4_TUNING_SEEDS == (1000, 1001, 1002, 1003) and "1000-1003" in DOC
    assert not set(tuning) & (set(DEV_SEEDS) | earlier | set(seeds))


def test_round4_is_the_passed_gate_s_configuration() -> None:
    gate = json.loads((ROOT / "results" / "v2-gate-2-2026-12-06" / "config.json").read_text())["config"]
    cfg = round4_config()
    assert cfg.learner == "neural" and cfg.pool == gate["pool"] == "v2" and cfg.families is None
    assert cfg.learner_options == gate["learner"]
    assert (cfg.steps, cfg.batch_size, cfg.group_size) == (gate["steps"], gate["batch_size"], gate["group_size"])
    assert cfg.endpoint == "heldout@40" and cfg.endpoint_step == 40 and 40 in gate["score_steps"]
    assert cfg.secondary_steps == (120,) and cfg.target_step == gate["target_step"] == 120
    assert cfg.method == "envsched" and cfg.primary == ("uniform", "plr", "mopps", "dps", "sec", "greso")
    assert cfg.controls == ("envsched-no-graph", "envsched-shuffled-graph", "envsched-noise-features")
    assert cfg.descriptive == ("envsched-paper", "oracle-variance", "oracle-coverage")
    assert cfg.margin == 2.0 and cfg.alpha == 0.05 and cfg.trials == 6 and cfg.tune
    assert cfg.tuning_objective == "heldout@40"
    # the round's configuration is one value: a folder keeps it, and the digest names it
    assert ProtocolConfig.from_dict(json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg
    assert ProtocolConfig.for_round(4) == cfg and f"`{cfg.digest()}`" in DOC


def test_earlier_rounds_keep_their_configuration_and_digest() -> None:
    """The fields added for v2 leave a round 1-3 folder's digest as it was written."""
    for folder, round_ in (("protocol-2026-12-04", 1), ("protocol-round2-2026-12-04", 2),
                           ("protocol-round3-2026-12-04", 3)):
        stored = json.loads((ROOT / "results" / folder / "protocol-config.json").read_text())
        cfg = proto.load_config(ROOT / "results" / folder)
        assert cfg is not None and cfg.digest() == stored["digest"] and proto.round_of(cfg) == round_
        assert cfg.pool is None and cfg.endpoint_step is None and cfg.tuning_objective == "heldout_sampled"
    report = json.loads((ROOT / "results" / "protocol-round3-2026-12-04" / "protocol-report.json").read_text())
    assert report_markdown(report) == \
        (ROOT / "results" / "protocol-round3-2026-12-04" / "protocol-report.md").read_text()


def test_round4_refuses_any_other_configuration(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="round 4's configuration is fixed"):
        ProtocolConfig.for_round(4, trials=8)
    other = dataclasses.replace(round4_config(), trials=8)
    with pytest.raises(ValueError, match="round 4's seeds run only with round 4's configuration"):
        proto.run_protocol(other, tmp_path / "other")
    part = dataclasses.replace(round4_config(), eval_seeds=(5120, 5121), learner_options={"lr": 0.2})
    with pytest.raises(ValueError, match="round 4's seeds"):
        proto.check_fixed_round(part)
    assert not (tmp_path / "other").exists()
    with pytest.raises(ValueError, match="endpoint"):
        dataclasses.replace(round4_config(), endpoint="heldout@x")
    with pytest.raises(ValueError, match="step"):
        dataclasses.replace(round4_config(), endpoint="heldout@200")
    with pytest.raises(ValueError, match="v2 pool is the neural learner's"):
        dataclasses.replace(round4_config(), families="x:Y")

    runner = CliRunner()
    for extra, named in ((["--learner", "model"], "--learner model"),
                         (["--learner", "neural", "--learner", "lr=0.2"], "--learner KEY=VALUE"),
                         (["--families", "mod:FAMILIES"], "--families")):
        res = runner.invoke(cli, ["bench", "--protocol", str(tmp_path / "p"), "--round", "4", *extra, "--dry-run"])
        assert res.exit_code != 0 and "round 4's configuration is fixed" in res.output, res.output
        assert named in res.output
    res = runner.invoke(cli, ["bench", "--protocol", str(tmp_path / "p"), "--round", "3", "--pool", "v2"])
    assert res.exit_code != 0 and "the v2 pool is that of rounds 4, 5" in res.output
    assert not (tmp_path / "p").exists()
    # a folder whose stored configuration runs round 4's seeds with another configuration is not resumed
    (tmp_path / "forged").mkdir()
    (tmp_path / "forged" / "protocol-config.json").write_text(json.dumps(
        {"digest": other.digest(), "config": dataclasses.asdict(other)}))
    res = runner.invoke(cli, ["bench", "--protocol", str(tmp_path / "forged"), "--dry-run"])
    assert res.exit_code != 0 and "round 4's seeds run only with round 4's configuration" in res.output


def test_dry_run_states_the_plan_and_fits_the_cpu_budget(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["bench", "--protocol", str(tmp_path / "r4"), "--round", "4", "--dry-run",
                                   "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert not (tmp_path / "r4").exists()  # a dry run writes nothing
    assert plan["round"] == 4 and plan["digest"] == round4_config().digest()
    assert plan["tuned"] == ["envsched", "plr", "mopps", "dps", "sec", "greso"]  # uniform has no knobs
    assert plan["runs"] == {"untuned": 13 * 40, "tuning": 6 * 6 * 4, "tuned": 6 * 40}
    assert plan["total_runs"] == 904 and plan["done"] == 0
    assert plan["pretrain_cpu_s"] == pytest.approx(90.0 * 44)
    by_hand = 40 * sum(plan["run_cpu_s"][s] for s in plan["samplers"]) + 4 * 6 * sum(
        plan["run_cpu_s"][s] for s in plan["tuned"]) + 40 * sum(plan["run_cpu_s"][s] for s in plan["tuned"])
    assert plan["cpu_seconds"] == pytest.approx(by_hand + 90.0 * 44, rel=1e-3)
    assert 0 < plan["cpu_hours"] <= 8.0  # issue 39's budget for round 4
    assert set(plan["run_cpu_s"]) == set(round4_config().samplers)
    assert all(plan["run_cpu_s"][s] == proto.V2_RUN_CPU_S[s] for s in plan["samplers"])  # every one measured
    text = CliRunner().invoke(cli, ["bench", "--protocol", str(tmp_path / "r4"), "--round", "4", "--dry-run"])
    words = " ".join(text.output.split())  # the console wraps long lines
    assert text.exit_code == 0 and "904 (0 already in the folder)" in words
    assert f"= {plan['cpu_hours']:.2f} CPU hours" in words
    # a folder's finished runs count as done
    job = proto._job(round4_config(), "untuned", "uniform", 5120)
    path = proto._job_path(tmp_path / "r4", job)
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    assert protocol_plan(round4_config(), tmp_path / "r4")["done"] == 1


def _records(curve: dict[int, float], steps: int = 120, *, evaluated_every: int = 10) -> list[dict]:
    """Per-step records of a v2 run whose held-out score is ``curve`` at the evaluated steps (carried between)."""
    out, current = [], curve.get(0, 10.0)
    for step in range(1, steps + 1):
        evaluated = step % evaluated_every == 0
        current = curve.get(step, current) if evaluated else current
        out.append({"step": step, "evaluated": evaluated, "heldout": current, "heldout_greedy": current - 1,
                    "heldout_a": current, "heldout_b": current, "score": 20.0, "envs_covered": 35.0,
                    "batch_variance": 0.05, "signal_per_episode": 0.1, "heldout_initial": curve.get(0, 10.0),
                    "rollouts": 512 * step, "cum_cost": float(step), "baseline_constant": 2.5,
                    "baseline_env_mode": 6.0})
    return out


def test_v2_summary_reads_the_endpoint_steps_and_refuses_an_unevaluated_one() -> None:
    cfg = round4_config()
    s = proto._summarise_run(_records({0: 10.0, 40: 25.0, 120: 33.0}), cfg)
    assert s["heldout@40"] == 25.0 and s["heldout@120"] == 33.0 and s["heldout"] == 33.0
    assert s["heldout_greedy"] == 32.0 and s["baseline_constant"] == 2.5 and s["baseline_env_mode"] == 6.0
    assert s["heldout_curve"][0] == [0, 10.0] and [40, 25.0] in s["heldout_curve"] and len(s["heldout_curve"]) == 13
    with pytest.raises(ValueError, match="not evaluated at step 40"):
        proto._summarise_run(_records({0: 10.0}, evaluated_every=15), cfg)
    assert "heldout@40" not in proto._summarise_run(_records({0: 10.0}), ProtocolConfig())  # the families' form


def test_v2_report_pairs_step_40_and_counts_steps_to_uniform_s_best() -> None:
    cfg = dataclasses.replace(round4_config(), primary=("uniform",), controls=("envsched-no-graph",),
                              descriptive=("oracle-variance",), eval_seeds=(7000, 7001, 7002), tune=False)
    # uniform's best within 120 steps is 30 on every seed; envsched leads by 2, 3, 4 at step 40 and reaches 30 at
    # step 60 on seeds 7000 and 7001, never on 7002; the no-graph run reaches it at step 100 on every seed
    curves = {"uniform": [{40: 20.0 + k, 120: 30.0} for k in range(3)],
              "envsched": [{40: 22.0 + 2 * k, 60: 30.0, 120: 31.0} for k in range(2)] + [{40: 26.0, 120: 29.0}],
              "envsched-no-graph": [{40: 21.0 + k, 100: 30.0, 120: 30.0} for k in range(3)],
              "oracle-variance": [{40: 25.0 + k, 120: 32.0} for k in range(3)]}
    results = [{"phase": "untuned", "sampler": s, "seed": 7000 + k, "options": {}, "trial": 0, "cpu_s": 1.0,
                "summary": proto._summarise_run(_records({0: 10.0, **c}), cfg)}
               for s, cs in curves.items() for k, c in enumerate(cs)]
    report = protocol_report(cfg, results, [], {})
    prim = report["untuned"]["primary"]["uniform"]
    assert prim["n"] == 3 and prim["mean"] == pytest.approx(3.0)  # step 40, not the last step
    assert report["untuned"]["controls"]["envsched-no-graph"]["mean"] == pytest.approx(2.0)
    sec = report["untuned"]["secondary"]
    assert sec["heldout@120"]["uniform"]["mean"] == pytest.approx(1 / 3)
    # steps to target: envsched 60, 60, missed; uniform reaches its own best at 120; paired where both reached
    assert sec["steps_to_target"]["uniform"]["n"] == 2 and sec["steps_to_target"]["uniform"]["mean"] == -60.0
    means = report["untuned"]["means"]
    assert means["envsched"]["steps_to_target"] == 60.0 and means["envsched"]["target_reached"] == pytest.approx(2 / 3)
    assert means["envsched-no-graph"]["steps_to_target"] == 100.0 and means["uniform"]["target_reached"] == 1.0
    assert report["positive_controls"]["oracle-variance"]["mean"] == pytest.approx(5.0)
    assert report["baselines"]["constant"] == 2.5 and set(report["baselines"]["per_seed"]) == {"7000", "7001", "7002"}
    md = report_markdown(report)
    assert "primary endpoint heldout@40" in md and "envsched vs uniform | 3 | +3.00" in md
    assert "oracle-variance - uniform: +5.00" in md and "best constant answer: 2.50" in md
    assert "| envsched | 24.00 | 30.33 | 60 (0.67) |" in md
    assert not math.isnan(report["untuned"]["means"]["oracle-variance"]["heldout@40"])
