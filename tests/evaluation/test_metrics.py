"""pass@k, standard errors and the outcome classes, against hand computations."""

from __future__ import annotations

import math

import pytest

from envsched.evaluation.metrics import binomial_se, mean_and_se, pass_at_k, per_task, score_records
from envsched.evaluation.records import EpisodeRecord


def test_pass_at_k_hand_computed():
    # n=5 samples, c=2 correct: pass@1 = c/n, pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # C(3,3)/C(5,3) = 1/10
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k: some draw of 4 always holds a correct one
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    for bad in ((3, 4, 1), (3, 1, 0), (3, 1, 4), (3.0, 1, 1), (-1, 0, 1)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_standard_errors_hand_computed():
    assert binomial_se(0.3, 100) == pytest.approx(math.sqrt(0.21 / 100))
    assert math.isnan(binomial_se(0.5, 0))
    mean, se = mean_and_se([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and se == pytest.approx(math.sqrt(5 / 3) / 2)  # std(ddof=1)=sqrt(5/3), / sqrt(4)
    assert math.isnan(mean_and_se([1.0])[1]) and math.isnan(mean_and_se([])[0])


def _r(task, sample, outcome, reward, **kw):
    return EpisodeRecord(task_id=task, seed=0, sample=sample, outcome=outcome, reward=reward, **kw)


def test_outcome_classes_are_kept_apart():
    recs = [
        _r("a", 0, "success", 1.0, turns=1, completion_tokens=10, group="g1", difficulty=0),
        _r("a", 1, "failure", 0.0, turns=3, completion_tokens=30, group="g1", difficulty=0),
        _r("a", 2, "success", 1.0, turns=2, completion_tokens=20, group="g1", difficulty=0),
        _r("b", 0, "policy_error", 0.0, turns=1, group="g2", difficulty=1),
        _r("b", 1, "limit", 0.5, turns=10, completion_tokens=40, group="g2", difficulty=1),
        _r("b", 2, "unscored", None, turns=1, completion_tokens=10, group="g2", difficulty=1),
        _r("c", 0, "infra_error", None, group="g2", difficulty=1),
        _r("c", 1, "error", None, group="g2", difficulty=1),
        _r("c", 2, "infra_error", None, group="g2", difficulty=1),
    ]
    s = score_records(recs, success_threshold=1.0, max_k=3)
    assert s["episodes"] == 9 and s["scored"] == 5 and s["successes"] == 2
    assert s["success_rate"] == pytest.approx(2 / 5)
    assert s["success_rate_se"] == pytest.approx(math.sqrt(0.4 * 0.6 / 5))
    assert s["mean_reward"] == pytest.approx((1 + 0 + 1 + 0 + 0.5) / 5)
    assert s["unscored_rate"] == pytest.approx(1 / 9)
    assert s["infra_error_rate"] == pytest.approx(2 / 9)
    assert s["error_rate"] == pytest.approx(2 / 9)  # policy_error + error
    assert s["mean_turns"] == pytest.approx((1 + 3 + 2 + 1 + 10 + 1 + 0) / 7)  # every episode that ran
    assert s["mean_completion_tokens"] == pytest.approx((10 + 30 + 20 + 40 + 10) / 5)
    # pass@k per (task, seed) problem: a has n=3, c=2; b has n=2 scored, c=0; c none scored
    assert s["pass@1"] == pytest.approx((2 / 3 + 0) / 2)
    assert s["pass@2"] == pytest.approx(((1 - math.comb(1, 2) / math.comb(3, 2)) + 0) / 2)
    assert s["pass@3"] == pytest.approx(1.0) and s["pass@3_problems"] == 1
    pt = per_task(recs)
    assert pt["a"]["outcome"] == "pass" and pt["b"]["outcome"] == "fail"
    assert pt["c"]["outcome"] == "infra_error" and pt["c"]["scored"] == 0


def test_record_validation():
    with pytest.raises(ValueError, match="outcome"):
        _r("a", 0, "great", 1.0)
    with pytest.raises(ValueError, match="needs a reward"):
        _r("a", 0, "success", None)
    with pytest.raises(ValueError, match="reward None"):
        _r("a", 0, "unscored", 0.0)


def test_wilson_interval_has_width_at_zero_and_one():
    from envsched.evaluation.metrics import wilson_interval

    def closed_form(c, n, z=1.959963984540054):  # Wilson (1927), written out independently of scipy
        p = c / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return centre - half, centre + half

    for c, n in ((0, 10), (10, 10), (3, 8), (1, 1)):
        lo, hi = wilson_interval(c, n)
        assert (lo, hi) == pytest.approx(closed_form(c, n), abs=1e-9)
        assert hi - lo > 0.1
    assert wilson_interval(0, 10)[0] == pytest.approx(0.0, abs=1e-12) and wilson_interval(0, 10)[1] > 0.27
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    for bad in ((-1, 3), (4, 3), (1.5, 3), (True, 3)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)
    recs = [EpisodeRecord(task_id=f"t{i}", seed=0, sample=0, outcome="success", reward=1.0) for i in range(5)]
    scores = score_records(recs)
    assert scores["success_rate"] == 1.0 and scores["success_rate_se"] == 0.0  # the RFC's SE: zero width
    lo, hi = scores["success_rate_ci"]
    assert hi == pytest.approx(1.0) and lo == pytest.approx(closed_form(5, 5)[0]) and lo < 0.6
