"""examples/trl_grpo.py: the real TRL GRPOTrainer on CPU, 2 steps, then a resume from its first checkpoint."""

import json

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.slow


def test_trl_grpo_example_trains_checkpoints_and_resumes(run_example, tmp_path):
    s = run_example("trl_grpo", ["--smoke", "--out", "run"], tmp_path)
    # 2 steps of 2 groups x 4 completions, every group reported; the prefetched chunk is still outstanding
    assert (s["steps"], s["groups"], s["episodes"]) == (2, 4, 16)
    assert s["outstanding_groups"] == 2 and s["checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    state = json.loads((tmp_path / "run" / "train" / "checkpoint-1" / "envsched_sampler.json").read_text())
    assert state["global_step"] == 1 and state["sampler"]["counters"]["groups"] == 2
    assert len(state["pending"]) == 1  # the prefetched chunk, drawn and not yet trained on
    r = run_example("trl_grpo", ["--steps", "3", "--save-steps", "1", "--out", "run",
                                 "--resume", "run/train/checkpoint-2"], tmp_path)
    assert (r["steps"], r["groups"]) == (3, 6)  # 4 restored from checkpoint-2, then one more step
