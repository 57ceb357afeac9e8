"""examples/async_grpo_openenv_harness.py: TRL's OpenEnv harness on envsched's OpenEnv server, 2 steps."""

import pytest

pytest.importorskip("trl")
pytest.importorskip("openenv")
pytestmark = pytest.mark.slow


def test_openenv_harness_example_runs_every_episode_on_the_drawn_task(run_example, tmp_path):
    s = run_example("async_grpo_openenv_harness", ["--smoke", "--out", "run"], tmp_path, timeout_s=400)
    assert s["groups_updated"] >= 4
    assert s["groups_drawn"] == s["groups_updated"] + s["groups_discarded_stale"] + s["groups_unresolved"]
    assert s["episodes_started"] > 0 and s["episodes_on_the_drawn_task"] == s["episodes_started"]
    assert (tmp_path / "run" / "train" / "checkpoint-2" / "envsched_sampler.json").is_file()
