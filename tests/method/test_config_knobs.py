"""Each SchedulerConfig knob is declared once (its Knob in the field's metadata), and the validation, the
refusal of unread knobs, the tuning space and the docs' knob table are generated from those declarations."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import numpy as np
import pytest

from envsched.errors import InvalidValueError
from envsched.method import config as cfg
from envsched.method.config import (
    KNOB_READERS,
    KNOBS,
    SchedulerConfig,
    UnreadKnobError,
    knob_table,
    scheduler_tuning_space,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "envsched-sampler.md"


def _bad_values(check):
    """Values the declared check must refuse, derived from the declaration itself."""
    if isinstance(check, cfg._Int):
        return [check.low - 1, 1.5, True, "3"]
    if isinstance(check, cfg._Number):
        out = [float("nan"), True, "0.5"]
        if np.isfinite(check.low):
            out.append(check.low - 1.0 if not check.low_open else check.low)
        if np.isfinite(check.high):
            out.append(check.high + 1.0 if not check.high_open else check.high)
        return out
    if isinstance(check, cfg._Choice):
        return ["not-a-choice", None]
    if isinstance(check, cfg._Flag):
        return [1, "True", None]
    if isinstance(check, cfg._Clip):
        return [(0.0, check.high + 0.1), (0.2, 0.1), (0.0,), "0,1"]
    raise AssertionError(f"no bad values for {check!r}")


def test_every_field_is_declared_and_its_default_passes_its_own_check():
    fields = [f.name for f in dataclasses.fields(SchedulerConfig)]
    assert list(KNOBS) == fields and len(fields) == 44
    for name, knob in KNOBS.items():
        knob.check(getattr(SchedulerConfig(), name), name)
        assert knob.check.describe()
        assert (knob.read_when is None) == (name not in KNOB_READERS) and (knob.read_when is None) == (not knob.reader)


@pytest.mark.parametrize("name", list(KNOBS))
def test_the_generated_validation_refuses_what_the_declaration_excludes(name):
    for value in _bad_values(KNOBS[name].check):
        with pytest.raises(InvalidValueError) as exc:
            SchedulerConfig(**{name: value})
        assert exc.value.name == name, (name, value)
        assert not isinstance(exc.value, UnreadKnobError)


def test_the_refusal_of_unread_knobs_is_typed_and_lists_every_knob():
    with pytest.raises(UnreadKnobError) as exc:
        SchedulerConfig(adaptive_share=False, yield_half_life=4.0, coverage_share_floor=0.2)
    assert exc.value.name == "yield_half_life" and exc.value.value == 4.0
    assert set(exc.value.unread) == {"yield_half_life", "coverage_share_floor"}
    assert exc.value.unread["yield_half_life"] == KNOB_READERS["yield_half_life"]
    assert isinstance(exc.value, ValueError)
    # it crosses a process boundary whole (the lab runs configs in process pools)
    back = pickle.loads(pickle.dumps(exc.value))
    assert type(back) is UnreadKnobError and str(back) == str(exc.value)
    assert (back.name, back.value, back.unread) == (exc.value.name, exc.value.value, exc.value.unread)
    # without_unread resets exactly those (and still refuses an invalid value, which is no UnreadKnobError)
    c = SchedulerConfig.without_unread({"adaptive_share": False, "yield_half_life": 4.0, "coverage_share_floor": 0.2,
                                        "decline_penalty": 0.3})
    assert (c.yield_half_life, c.coverage_share_floor, c.decline_penalty) == (8.0, 0.0625, 0.3)
    with pytest.raises(InvalidValueError) as bad:
        SchedulerConfig.without_unread({"adaptive_share": False, "yield_half_life": -4.0})
    assert not isinstance(bad.value, UnreadKnobError) and bad.value.name == "yield_half_life"


def test_the_tuning_spaces_are_the_ones_committed_tuning_runs_drew_from():
    # the order is the draw order: a different order would draw different trials from the same seeds
    paper = {"exposure_power": ("float", 0.0, 0.5, False), "similarity_penalty": ("float", 0.0, 0.5, False),
             "decline_penalty": ("float", 0.0, 0.5, False), "prior_strength": ("float", 0.25, 4.0, True)}
    default = {**paper, "coverage_share": ("float", 0.125, 0.5, False),
               "coverage_share_floor": ("float", 0.0, 0.5, False), "yield_half_life": ("float", 2.0, 32.0, True),
               "ucb_quantile": ("float", 0.6, 0.99, False), "env_size_power": ("float", 0.0, 1.0, False),
               "signal_prior_ess": ("float", 1.0, 16.0, True), "caps_on_decline_only": ("choice", [True, False]),
               "adaptive_share": ("choice", [True, False]), "adaptive_coverage": ("choice", [True, False])}
    assert list(scheduler_tuning_space(SchedulerConfig.paper()).items()) == list(paper.items())
    # round 4 tuned the default of its day, both adaptive rules on (the lab's envsched-adaptive)
    adaptive = SchedulerConfig(adaptive_share=True, adaptive_coverage=True)
    assert list(scheduler_tuning_space(adaptive).items()) == list(default.items())
    # the default leaves both off, so their switches are searched and their own knobs are not
    unread = {"coverage_share_floor", "yield_half_life", "ucb_quantile", "env_size_power", "signal_prior_ess"}
    assert list(scheduler_tuning_space(SchedulerConfig()).items()) == [
        (k, v) for k, v in default.items() if k not in unread]
    # exploitation_rule is declared tunable, and enters where the switches read it
    signal = SchedulerConfig(exploitation_score="signal_probability")
    assert scheduler_tuning_space(signal)["exploitation_rule"] == ("choice", ["mean", "thompson", "upper_quantile"])
    # the returned specs are copies: changing one changes no declaration
    scheduler_tuning_space(SchedulerConfig())["adaptive_share"][1].append(None)
    assert scheduler_tuning_space(SchedulerConfig())["adaptive_share"] == ("choice", [True, False])
    # every range holds admissible values of its knob
    for name, knob in KNOBS.items():
        if knob.tuning is not None:
            values = knob.tuning[1] if knob.tuning[0] == "choice" else knob.tuning[1:3]
            for v in values:
                knob.check(v, name)


def test_the_docs_knob_table_is_the_generated_one():
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("<!-- knob-table:")
    start = text.index("\n", start) + 1
    end = text.index("<!-- /knob-table -->")
    assert text[start:end] == knob_table(), ("docs/envsched-sampler.md's knob table is stale: replace it with "
                                             "envsched.method.config.knob_table()")
    assert knob_table().count("\n| `") == len(KNOBS)


def test_the_no_slot_rule_is_checked_beside_other_problems():
    with pytest.raises(InvalidValueError) as exc:
        SchedulerConfig(coverage_share=1.0, ucb_quantile=2.0)
    assert "ucb_quantile must be a number in [0.5, 1.0)" in str(exc.value)
    assert "leaves no exploitation slot" in str(exc.value)
    with pytest.raises(InvalidValueError, match=r"ucb_quantile must be < 1 \(the 1-quantile"):
        SchedulerConfig(ucb_quantile=1.0)


def test_every_removed_field_is_removed_by_a_migration():
    from envsched.method.config import FORMER_FIELDS
    from envsched.method.migrations import CONFIG_MIGRATIONS

    assert {f for m in CONFIG_MIGRATIONS for f in m.removes} == FORMER_FIELDS
