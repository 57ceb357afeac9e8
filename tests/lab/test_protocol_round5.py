"""Round 5 of the evaluation protocol (the v2 pool, untuned) as committed: its seeds, its configuration (round 4's
with the samplers, seeds and tuning this round names), the CLI's refusals and the dry run's plan (nothing trains)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.method.config import SchedulerConfig
from envsched_lab import protocol as proto
from envsched_lab.protocol import (
    DEV_SEEDS,
    EVALUATION_ROUNDS,
    TUNING_SEEDS,
    ProtocolConfig,
    round4_config,
    round5_config,
)
from envsched_lab.variants import ENVSCHED_VARIANTS

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "evaluation-protocol.md").read_text()


def test_round5_seeds_are_fresh() -> None:
    seeds = EVALUATION_ROUNDS[5]
    assert seeds == tuple(range(5160, 5200)) and "5160-5199" in DOC and round5_config().eval_seeds == seeds
    earlier = {s for r, rs in EVALUATION_ROUNDS.items() if r != 5 for s in rs}
    assert not set(seeds) & (earlier | set(DEV_SEEDS) | set(TUNING_SEEDS) | set(round4_config().tuning_seeds))
    assert max(EVALUATION_ROUNDS) == 5  # a new folder runs it by default


def test_round5_is_round4_with_its_own_samplers_seeds_and_no_tuning() -> None:
    cfg, r4 = round5_config(), round4_config()
    same = ("learner", "method", "steps", "batch_size", "group_size", "margin", "alpha", "endpoint", "eval_rollouts",
            "families", "learner_options", "pool", "secondary_steps", "target_step")
    assert all(getattr(cfg, f) == getattr(r4, f) for f in same)
    assert cfg.primary == ("uniform", "plr", "mopps", "dps", "sec") and not cfg.tune
    assert cfg.controls == ("envsched-no-graph", "envsched-adaptive")
    assert cfg.descriptive == ("oracle-variance", "oracle-coverage")
    assert ProtocolConfig.for_round(5) == cfg and f"`{cfg.digest()}`" in DOC and cfg.digest() != r4.digest()
    # what the round judges: the default against the former one, which is round 4's default (both adaptive rules)
    default = SchedulerConfig()
    assert not default.adaptive_share and not default.adaptive_coverage and default.caps_on_decline_only
    former = dataclasses.replace(default, **ENVSCHED_VARIANTS["envsched-adaptive"])
    assert former.adaptive_share and former.adaptive_coverage
    assert {f.name for f in dataclasses.fields(SchedulerConfig)
            if getattr(former, f.name) != getattr(default, f.name)} == {"adaptive_share", "adaptive_coverage"}


def test_round5_refuses_any_other_configuration(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="round 5's configuration is fixed"):
        ProtocolConfig.for_round(5, trials=8)
    other = dataclasses.replace(round5_config(), tune=True)
    with pytest.raises(ValueError, match="round 5's seeds run only with round 5's configuration"):
        proto.run_protocol(other, tmp_path / "other")
    assert not (tmp_path / "other").exists()
    res = CliRunner().invoke(cli, ["bench", "--protocol", str(tmp_path / "p"), "--learner", "model", "--dry-run"])
    assert res.exit_code != 0 and "round 5's configuration is fixed" in res.output
    assert not (tmp_path / "p").exists()


def test_round5_dry_run_states_the_plan(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["bench", "--protocol", str(tmp_path / "r5"), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["round"] == 5 and plan["digest"] == round5_config().digest() and not (tmp_path / "r5").exists()
    assert plan["runs"] == {"untuned": 10 * 40, "tuning": 0, "tuned": 0} and plan["tuned"] == []
    assert plan["pretrain_cpu_s"] == pytest.approx(90.0 * 40)
    assert all(plan["run_cpu_s"][s] == proto.V2_RUN_CPU_S[s] for s in plan["samplers"])
    assert plan["cpu_hours"] == pytest.approx(2.78, abs=0.01)  # the estimate docs/evaluation-protocol.md states
