"""SchedulerConfig's sub-configurations: every field in exactly one group (or top level), the groups' defaults
are the config's, views are frozen values, ``from_parts`` builds the same config as the flat constructor, and
the flat format of ``to_dict`` / ``from_dict`` (what stores hold) is unchanged."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from envsched.errors import InvalidValueError
from envsched.method.config import (
    PAPER_PRESET,
    PAPER_RULES,
    SCHEDULER_GROUPS,
    SCHEDULER_TOP_FIELDS,
    AdaptiveConfig,
    CapsConfig,
    HistoryConfig,
    SchedulerConfig,
)

GOLDEN = Path(__file__).parent / "data" / "policy_golden.json"


def test_every_field_is_in_exactly_one_group_or_top_level_with_the_same_default():
    flat = [f.name for f in dataclasses.fields(SchedulerConfig)]
    grouped = [f.name for g in SCHEDULER_GROUPS.values() for f in dataclasses.fields(g)]
    assert len(flat) == 44 and sorted(grouped + list(SCHEDULER_TOP_FIELDS)) == sorted(flat)
    assert len(set(grouped)) == len(grouped) and not set(grouped) & set(SCHEDULER_TOP_FIELDS)
    default = SchedulerConfig()
    for name, group in SCHEDULER_GROUPS.items():
        assert getattr(default, name) == group()
        assert dataclasses.is_dataclass(group) and group.__dataclass_params__.frozen


def test_views_carry_the_configs_values_and_are_frozen():
    c = SchedulerConfig.paper(max_per_env_coverage=3, long_half_life=6.0, decline_penalty=0.4)
    assert c.caps.max_per_env_coverage == 3 and c.caps.env_quota_per_batch == 11
    assert c.history == HistoryConfig(long_half_life=6.0)
    assert c.exploitation.decline_penalty == 0.4
    assert c.adaptive == AdaptiveConfig(**{k: v for k, v in PAPER_PRESET.items() if k in PAPER_RULES})
    assert (c.exploitation.use_within_edges, c.exploitation.use_calibration) == (True, True)
    assert c.coverage.coverage_share == 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.caps.max_per_env_coverage = 5  # type: ignore[misc]


def test_from_parts_equals_the_flat_constructor():
    parts = SchedulerConfig.from_parts(caps=CapsConfig(max_per_env_coverage=3, similarity_penalty=0.5),
                                       history=HistoryConfig(long_half_life=6.0), batch_size=32)
    assert parts == SchedulerConfig(max_per_env_coverage=3, similarity_penalty=0.5, long_half_life=6.0, batch_size=32)
    # a flat field overrides its group's value; a missing group is its defaults
    assert SchedulerConfig.from_parts(caps=CapsConfig(max_per_env_coverage=3), max_per_env_coverage=2) == \
        SchedulerConfig(max_per_env_coverage=2)
    paper = SchedulerConfig.paper()
    # the paper preset is its rules (adaptive) and its prediction pipeline (exploitation)
    assert SchedulerConfig.from_parts(adaptive=paper.adaptive, exploitation=paper.exploitation) == paper
    assert SchedulerConfig.from_parts(adaptive=paper.adaptive).is_paper
    assert SchedulerConfig.from_parts(**{name: getattr(paper, name) for name in SCHEDULER_GROUPS},
                                      **{k: getattr(paper, k) for k in SCHEDULER_TOP_FIELDS}) == paper


def test_from_parts_validates_the_whole_config():
    with pytest.raises(InvalidValueError, match="max_per_env_coverage must be an integer >= 1") as exc:
        SchedulerConfig.from_parts(caps=CapsConfig(max_per_env_coverage=0))
    assert exc.value.name == "max_per_env_coverage"
    with pytest.raises(InvalidValueError, match=r"exploitation_rule='thompson' changes no batch here"):
        SchedulerConfig.from_parts(adaptive=AdaptiveConfig(exploitation_rule="thompson"))  # unread by the default
    with pytest.raises(InvalidValueError, match="caps must be a CapsConfig, got HistoryConfig"):
        SchedulerConfig.from_parts(caps=HistoryConfig())  # type: ignore[arg-type]


def test_the_flat_format_is_unchanged_and_old_configs_load():
    saved = json.loads(GOLDEN.read_text())["states"]
    # the stored "adaptive" state is a former default (signal-probability score with the graph prior). States
    # written before use_calibration existed load with the calibration on (the only behaviour then) and before
    # within_relation with the K_within neighbours; the former defaults that such a config stored unread
    # (decline_penalty=0.25 and that calibration, which the signal score never read) load as today's defaults;
    # before unobserved_neighbours, a neighbour without history counted with the global reference
    former = SchedulerConfig(use_within_edges=True, use_cross_edges=True, exploitation_score="signal_probability",
                             unobserved_neighbours="reference")
    for name, config, reset in (("adaptive", former, {"decline_penalty": 0.0, "use_calibration": False}),
                                ("paper", SchedulerConfig.paper(), {"use_calibration": True})):
        stored = saved[name]["state"]["extra"]["config"]  # written before the sub-configurations existed
        assert "use_calibration" not in stored and "within_relation" not in stored
        assert "unobserved_neighbours" not in stored
        assert stored["decline_penalty"] == 0.25
        assert config.to_dict() == {**stored, **reset, "within_relation": "neighbours",
                                    "unobserved_neighbours": "reference"}
        assert SchedulerConfig.from_dict(stored) == config
    # the reset touches only a former default that is unread: a read one, or another value, is kept (and an
    # unread value someone set is still refused)
    read = {**SchedulerConfig.paper().to_dict(), "adaptive_share": True}
    assert SchedulerConfig.from_dict(read).decline_penalty == 0.25
    with pytest.raises(ValueError, match=r"decline_penalty=0\.3 changes no batch"):
        SchedulerConfig.from_dict({**former.to_dict(), "decline_penalty": 0.3})
    # a stored config that says use_calibration=False keeps it
    assert not SchedulerConfig.from_dict(SchedulerConfig().to_dict()).use_calibration
    # a state from before the coverage share: the paper's rules with coverage_slots of batch_size
    old = {k: v for k, v in SchedulerConfig.paper().to_dict().items() if k not in PAPER_PRESET}
    old["coverage_slots"] = 16
    assert SchedulerConfig.from_dict(old) == SchedulerConfig.paper(coverage_share=0.25)
