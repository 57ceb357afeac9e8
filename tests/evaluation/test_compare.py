"""compare_eval_results: fixed, regressed, left_out and the significance of metric changes."""

from __future__ import annotations

import math

import pytest

from envsched.evaluation import EvalResult, compare_eval_results


def _result(per_task, **scores):
    return EvalResult(scores=scores, per_task={k: {"outcome": v} for k, v in per_task.items()}, by_env={},
                      by_group={}, by_difficulty={}, reproducible=True, reproducibility={}, config={})


def test_fixed_regressed_left_out(tmp_path):
    before = _result({"a": "fail", "b": "pass", "c": "pass", "d": "unscored", "e": "fail", "gone": "pass"},
                     success_rate=0.40, success_rate_se=0.05, mean_reward=0.5, mean_reward_se=0.0)
    after = _result({"a": "pass", "b": "fail", "c": "pass", "d": "pass", "e": "infra_error", "new": "pass"},
                    success_rate=0.60, success_rate_se=0.05, mean_reward=0.5, mean_reward_se=0.0)
    before.save(tmp_path / "before" / "result.json")
    cmp = compare_eval_results(tmp_path / "before", after)  # a folder, a result object
    assert cmp.fixed == ["a"] and cmp.regressed == ["b"]
    assert cmp.unchanged_pass == ["c"] and cmp.unchanged_fail == []
    assert cmp.left_out == {"d": "not scored (before: unscored)", "e": "not scored (after: infra_error)",
                            "gone": "missing after", "new": "missing before"}
    sr = cmp.deltas["success_rate"]
    se = math.sqrt(0.05**2 + 0.05**2)
    assert sr["delta"] == pytest.approx(0.2) and sr["se"] == pytest.approx(se)
    assert sr["z"] == pytest.approx(0.2 / se) and sr["significant"] is True  # z = 2.83
    assert cmp.deltas["mean_reward"]["note"] == "no change"
    assert cmp.deltas["mean_turns"]["note"].startswith("not comparable")
    small = compare_eval_results(before, _result({}, success_rate=0.45, success_rate_se=0.05))
    assert small.deltas["success_rate"]["significant"] is False
    assert set(small.left_out) == set(before.per_task)


def test_compare_rejects_other_files(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not an envsched evaluation result"):
        compare_eval_results(p, p)
    with pytest.raises(TypeError):
        compare_eval_results(3, 4)
