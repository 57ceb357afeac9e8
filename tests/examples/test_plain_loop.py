"""examples/plain_loop.py: the smallest run, then a resume that makes the uninterrupted run's draws."""

import pytest

pytestmark = pytest.mark.slow  # spawns processes: outside the fast lane


def test_plain_loop_runs_and_resumes_like_an_uninterrupted_run(run_example, tmp_path):
    short = run_example("plain_loop", ["--smoke", "--out", "a"], tmp_path)
    assert short["steps"] == 3 and short["groups"] == 12  # 3 steps x 4 tasks
    resumed = run_example("plain_loop", ["--steps", "6", "--out", "a", "--resume"], tmp_path)
    whole = run_example("plain_loop", ["--steps", "6", "--batch-size", "4", "--group-size", "4", "--out", "b"],
                        tmp_path)
    assert resumed["groups"] == whole["groups"] == 24
    assert (resumed["signal_groups"], resumed["signal_groups_per_episode"]) == \
           (whole["signal_groups"], whole["signal_groups_per_episode"])
    assert (tmp_path / "a" / "checkpoint.json").read_text() == (tmp_path / "b" / "checkpoint.json").read_text()
