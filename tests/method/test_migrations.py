"""Stored configs of earlier versions (envsched.method.migrations): each numbered migration converts the format it
recognises and nothing else, a stored config reads as the configuration that version ran, and
``SchedulerConfig.from_dict`` reads the current format only, pointing an old one to ``read_config``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envsched.errors import InvalidValueError
from envsched.method.config import PAPER_PRESET, SchedulerConfig, UnreadKnobError
from envsched.method.migrations import CONFIG_MIGRATIONS, migrate_config, read_config

GOLDEN = Path(__file__).parent / "data" / "policy_golden.json"


def test_the_flat_format_is_unchanged_and_old_configs_load():
    saved = json.loads(GOLDEN.read_text())["states"]
    # the stored "adaptive" state is a former default (signal-probability score with the graph prior). States
    # written before use_calibration existed load with the calibration on (the only behaviour then) and before
    # within_relation with the K_within neighbours; the former defaults that such a config stored unread
    # (decline_penalty=0.25 and that calibration, which the signal score never read) load as today's defaults;
    # before unobserved_neighbours, a neighbour without history counted with the global reference
    # (and with the online share and the UCB coverage, which a stored config names, as every config stores all fields)
    former = SchedulerConfig(use_within_edges=True, use_cross_edges=True, exploitation_score="signal_probability",
                             unobserved_neighbours="reference", adaptive_share=True, adaptive_coverage=True)
    for name, config, reset in (("adaptive", former, {"decline_penalty": 0.0, "use_calibration": False}),
                                ("paper", SchedulerConfig.paper(), {"use_calibration": True})):
        stored = saved[name]["state"]["extra"]["config"]
        assert "use_calibration" not in stored and "within_relation" not in stored
        assert "unobserved_neighbours" not in stored
        assert stored["decline_penalty"] == 0.25
        assert config.to_dict() == {**stored, **reset, "within_relation": "neighbours",
                                    "unobserved_neighbours": "reference"}
        assert read_config(stored) == config
        assert stored["decline_penalty"] == 0.25  # the stored dict itself is not modified
    # the reset touches only a former default that is unread: a read one, or another value, is kept (and an
    # unread value someone set is still refused, as the typed error)
    read = {**SchedulerConfig.paper().to_dict(), "adaptive_share": True}
    assert read_config(read).decline_penalty == 0.25
    with pytest.raises(UnreadKnobError, match=r"decline_penalty=0\.3 changes no batch") as exc:
        read_config({**former.to_dict(), "decline_penalty": 0.3})
    assert exc.value.name == "decline_penalty" and set(exc.value.unread) == {"decline_penalty"}
    # a stored config that says use_calibration=False keeps it; a current config reads as itself
    assert not read_config(SchedulerConfig().to_dict()).use_calibration
    for config in (SchedulerConfig(), SchedulerConfig.paper(), former):
        assert migrate_config(config.to_dict()) == config.to_dict()


def test_a_config_of_the_coverage_slot_count_reads_as_the_paper_preset():
    old = {k: v for k, v in SchedulerConfig.paper().to_dict().items() if k not in PAPER_PRESET}
    old["coverage_slots"] = 16
    assert read_config(old) == SchedulerConfig.paper(coverage_share=0.25)
    old32 = {k: v for k, v in SchedulerConfig.paper(batch_size=32).to_dict().items()
             if k not in ("coverage_share", *PAPER_PRESET)}
    old32["coverage_slots"] = 8
    c = read_config(old32)
    assert c.is_paper and c.coverage_share == 0.25 and c.coverage_slots_for(32) == 8
    with pytest.raises(ValueError, match="coverage_slots of an old SchedulerConfig"):
        read_config({**old, "batch_size": 0})
    # from_dict reads the current format only, and says where an old one is read
    with pytest.raises(ValueError, match=r"unknown SchedulerConfig field\(s\): \['coverage_slots'\]; a config "
                                         r"stored by an earlier version is read with envsched.method.migrations"):
        SchedulerConfig.from_dict(old)
    with pytest.raises(ValueError, match=r"unknown SchedulerConfig field\(s\): \['nope'\]$"):
        read_config({"nope": 1})


def test_each_migration_recognises_only_its_format():
    versions = [m.version for m in CONFIG_MIGRATIONS]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    current = SchedulerConfig().to_dict()
    for m in CONFIG_MIGRATIONS[:3]:  # a current config has every field those migrations add
        assert not m.applies(current), m.change
    no_calibration = {k: v for k, v in current.items() if k != "use_calibration"}
    assert CONFIG_MIGRATIONS[1].applies(no_calibration)
    assert CONFIG_MIGRATIONS[1].apply(no_calibration)["use_calibration"] is True
    # without both relations a stored config never read unobserved_neighbours: it keeps its default
    off = {k: v for k, v in SchedulerConfig(use_within_edges=False, use_cross_edges=False).to_dict().items()
           if k != "unobserved_neighbours"}
    assert not CONFIG_MIGRATIONS[2].applies(off)
    assert read_config(off).unobserved_neighbours == "environment"


def test_a_bad_stored_value_is_refused_by_name():
    with pytest.raises(InvalidValueError) as exc:
        read_config({**SchedulerConfig().to_dict(), "batch_size": "64"})
    assert exc.value.name == "batch_size"
