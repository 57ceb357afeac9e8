"""The method's configs and exceptions use envsched.errors: a refused value is an InvalidValueError naming the
field (still a ValueError), numpy numbers are accepted and stored as Python ones, and every exception class of
the method derives from EnvSchedError with its built-in base kept."""

from __future__ import annotations

import json

import numpy as np
import pytest

from envsched.errors import EnvSchedError, InvalidValueError
from envsched.method.config import GraphConfig, SchedulerConfig
from envsched.method.graph.io import GraphFileError
from envsched.method.graph.llm_abstraction import LLMAbstractionError, LLMAbstractor


@pytest.mark.parametrize("value, kind", [("6", "str"), (True, "bool"), (2.5, "float"), (np.bool_(True), "bool")])
def test_graph_config_refuses_a_non_integer_naming_the_field(value, kind):
    with pytest.raises(InvalidValueError, match=f"k_within must be an integer, got {kind}") as exc:
        GraphConfig(k_within=value)
    assert exc.value.name == "k_within" and exc.value.value is value
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, EnvSchedError)


def test_graph_config_names_the_first_of_several_problems_and_lists_all():
    with pytest.raises(InvalidValueError) as exc:
        GraphConfig(k_cross=0, ann_m=0)
    assert exc.value.name == "k_cross" and exc.value.value == 0
    assert "k_cross must be >= 1" in str(exc.value) and "ann_m must be >= 1" in str(exc.value)
    with pytest.raises(InvalidValueError, match="min_bandwidth must be a finite number") as exc:
        GraphConfig(min_bandwidth=float("nan"))
    assert exc.value.name == "min_bandwidth"


def test_numpy_numbers_are_accepted_and_stored_as_python_numbers():
    g = GraphConfig(k_within=np.int64(3), k_cross=np.int32(5))
    assert (g.k_within, g.k_cross) == (3, 5) and type(g.k_within) is int and type(g.k_cross) is int
    c = SchedulerConfig(batch_size=np.int64(32), long_half_life=np.float32(4.0))
    assert type(c.batch_size) is int and type(c.long_half_life) is float and c.long_half_life == 4.0
    json.dumps(c.to_dict())  # JSON-ready
    json.dumps(g.to_dict())
    assert c == SchedulerConfig(batch_size=32, long_half_life=4.0)


@pytest.mark.parametrize("field, value, message", [
    ("batch_size", "64", "batch_size must be an integer >= 1, got '64'"),
    ("batch_size", True, "batch_size must be an integer >= 1, got True"),
    ("rollouts_per_task", 2.0, "rollouts_per_task must be an integer >= 1, got 2.0"),
    ("long_half_life", True, r"long_half_life must be a number in \(0.0, inf\], got True"),
    ("similarity_penalty", 1.5, r"similarity_penalty must be a number in \[0.0, 1.0\], got 1.5"),
    ("variance_clip", (0.0, True), "variance_clip must be"),
    ("mode", "half", "mode must be one of"),
    ("exploitation_rule", "thompson", "exploitation_rule='thompson' changes no batch here"),  # unread by the default
])
def test_scheduler_config_refuses_naming_the_field(field, value, message):
    with pytest.raises(InvalidValueError, match=message) as exc:
        SchedulerConfig(**{field: value})
    assert exc.value.name == field and str(exc.value).startswith("invalid SchedulerConfig: ")


def test_method_exceptions_derive_from_envsched_error_and_keep_their_base():
    assert issubclass(GraphFileError, EnvSchedError) and issubclass(GraphFileError, ValueError)
    assert issubclass(LLMAbstractionError, EnvSchedError) and issubclass(LLMAbstractionError, RuntimeError)


@pytest.mark.parametrize("kw, message", [
    ({"timeout": True}, "timeout must be a positive number of seconds"),
    ({"timeout": 0}, "timeout must be a positive number of seconds"),
    ({"max_response_bytes": 2.0}, "max_response_bytes must be a positive integer"),
    ({"max_json_depth": False}, "max_json_depth must be a positive integer"),
])
def test_llm_abstractor_limits_are_checked_as_shared_values(kw, message):
    pytest.importorskip("jsonschema")
    with pytest.raises(InvalidValueError, match=message) as exc:
        LLMAbstractor("http://localhost:1", "m", **kw)
    assert exc.value.name == next(iter(kw))
