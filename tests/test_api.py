"""The public API at the top level: every name a README example needs, loaded lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

import envsched

NEEDED = ["EnvSchedSampler", "SchedulerConfig", "GraphConfig", "build_graph", "DualRelationGraph", "DurableSampler",
          "HistoryStore", "EvalHarness", "EvalResult", "EvalSchedule", "ChatCompletionsPolicy",
          "compare_eval_results", "pass_at_k", "TaskPool", "TaskSpecError", "UniformSampler", "CurriculumSampler",
          "SequentialSampler", "BaseSampler", "TaskSampler", "StochasticRewardSource", "make_sampler",
          "available_samplers", "default_pool", "run_schedule", "StoreError"]


@pytest.mark.parametrize("name", NEEDED)
def test_name_is_public_documented_and_the_real_object(name):
    assert name in envsched.__all__ and name in dir(envsched)
    obj = getattr(envsched, name)
    module = envsched._LAZY[name]
    assert obj is getattr(__import__(module, fromlist=[name]), name)
    assert (obj.__doc__ or "").strip(), f"{name} has no docstring"
    # the package docstring says when to use it
    assert f"``{name}``" in envsched.__doc__


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'EnvSchedSamplr'"):
        envsched.EnvSchedSamplr  # noqa: B018


@pytest.mark.slow
def test_import_is_lazy_and_the_issue_line_works():
    code = ("import sys, envsched\nheavy = [m for m in ('numpy', 'sklearn', 'scipy', 'envsched.method') "
            "if m in sys.modules]\nprint(heavy)\n"
            "from envsched import EnvSchedSampler, DurableSampler, build_graph, EvalHarness\n"
            "print(EnvSchedSampler.__name__, DurableSampler.__name__, build_graph.__name__, EvalHarness.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.splitlines() == ["[]", "EnvSchedSampler DurableSampler build_graph EvalHarness"]
