"""The benchmark's configs check their fields with envsched.errors: a wrong type or range is an
InvalidValueError naming the field, and a valid config keeps the values it was given."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pytest

from envsched.errors import InvalidValueError
from envsched_lab.families import FamilyError, build_family_pool
from envsched_lab.learner import LearnerConfig
from envsched_lab.split import SplitConfig
from envsched_lab.stats import minimum_detectable_effect


@pytest.mark.parametrize(("field", "bad"), [
    ("batch_reference", "6"), ("batch_reference", True), ("batch_reference", 2.5), ("batch_reference", 0),
    ("max_checks", True), ("max_checks", "16"),
    ("sharing", True), ("sharing", "0.5"), ("sharing", 1.5), ("lr", math.nan), ("lr", -0.1),
    ("difficulty_mean", "1"), ("batch_normalise", 1), ("real_envs", "yes"),
])
def test_learner_config_refuses_a_wrong_type_naming_the_field(field: str, bad: object) -> None:
    with pytest.raises(InvalidValueError, match=f"^LearnerConfig.{field} must be ") as info:
        LearnerConfig(**{field: bad})
    assert info.value.name == f"LearnerConfig.{field}" and info.value.value is bad


def test_learner_config_keeps_python_values_and_turns_numpy_scalars_into_python_ones() -> None:
    cfg = LearnerConfig(lr=1, sharing=0.25, batch_reference=np.int64(32), transfer=np.float32(0.5))
    d = asdict(cfg)
    assert d["lr"] == 1 and type(d["lr"]) is int  # the recorded form of a config is unchanged
    assert d["batch_reference"] == 32 and type(d["batch_reference"]) is int
    assert d["transfer"] == 0.5 and type(d["transfer"]) is float


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"split_seed": True}, "split_seed"), ({"split_seed": "3"}, "split_seed"),
    ({"heldout_env_share": 1.0}, "heldout_env_share"), ({"heldout_task_share": "0.2"}, "heldout_task_share")])
def test_split_config_checks(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidValueError, match=f"^{field} must be "):
        SplitConfig(**kwargs)
    seed = SplitConfig(split_seed=np.int64(4)).split_seed
    assert seed == 4 and type(seed) is int


def test_stats_and_families_checks() -> None:
    with pytest.raises(InvalidValueError, match=r"^n must be an integer >= 2, got True$"):
        minimum_detectable_effect(1.0, True)
    with pytest.raises(InvalidValueError, match=r"^sd must be a finite number >= 0, got '1'$"):
        minimum_detectable_effect("1", 5)
    with pytest.raises(FamilyError, match=r"per_tier must be a positive int, got 2\.0"):
        build_family_pool("arith", per_tier=2.0)


@pytest.mark.parametrize(("field", "bad"), [("trials", 0), ("steps", "200"), ("batch_size", True), ("group_size", 2.5),
                                            ("margin", 0.0), ("alpha", 1.0), ("tune", 1)])
def test_protocol_config_checks(field: str, bad: object) -> None:
    from envsched_lab.protocol import ProtocolConfig

    with pytest.raises(InvalidValueError, match=r"^protocol: ") as info:
        ProtocolConfig(**{field: bad})
    assert field in info.value.name and info.value.value is bad
    assert ProtocolConfig(steps=np.int64(10)).digest() == ProtocolConfig(steps=10).digest()
