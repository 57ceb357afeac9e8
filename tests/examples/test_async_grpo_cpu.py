"""examples/async_grpo_cpu.py: TRL's AsyncGRPOTrainer (its rollout child, the stand-in vLLM server) on CPU, 2 steps;
the reward function scores with reasoning-gym inside TRL's rollout child process."""

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.slow


def test_async_grpo_example_trains(run_example, tmp_path):
    s = run_example("async_grpo_cpu", ["--smoke", "--out", "run"], tmp_path, timeout_s=400)
    assert s["groups_updated"] >= 4  # 2 steps of 2 groups trained on
    assert s["groups_drawn"] == s["groups_updated"] + s["groups_discarded_stale"] + s["groups_unresolved"]
    assert s["episodes"] == 4 * s["groups_updated"]
    assert (tmp_path / "run" / "train" / "checkpoint-2" / "envsched_sampler.json").is_file()
