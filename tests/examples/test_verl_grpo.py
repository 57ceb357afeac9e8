"""examples/verl_grpo.py --smoke, both entries: verl's v1 trainer as the Python entrypoint builds it
(EnvSchedPPOTrainer) and as verl's command line does (custom_sampler), its real dataloader, prompt submission into
a real TransferQueue and replay-buffer poll, a checkpoint and a resume; the rollout and the actor workers stand in
(they need GPUs)."""

import json

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
pytestmark = pytest.mark.slow


def test_verl_example_smoke_runs_on_both_entries(run_example, tmp_path):
    drawn = {}
    for entry, trainer in (("python", "EnvSchedPPOTrainer"), ("command-line", "PPOTrainerSync")):
        s = run_example("verl_grpo", ["--smoke", "--entry", entry, "--out", entry], tmp_path)
        assert (s["trainer"], s["replay_buffer"], s["task_sampler"]) == (trainer, "EnvSchedReplayBuffer",
                                                                         "EnvSchedSampler")
        assert [len(d) for d in s["drawn"]] == [4, 4]  # data.train_batch_size prompts drawn by envsched per step
        assert s["groups_reported"] == [4, 8] and s["episodes"] == 32  # every group, n = 4 rollouts each
        assert s["resumed_at"] == 2 and s["resumed_groups"] == 8  # the sampler resumed from global_step_2
        state = json.loads((tmp_path / entry / "checkpoints" / "global_step_1" / "envsched_sampler.json").read_text())
        assert state["global_step"] == 1 and state["state"]["sampler"]["counters"]["groups"] == 4
        drawn[entry] = s["drawn"]
    # both entries build the same sampler (EnvSched, seed 0) over the same specs: the same draws
    assert drawn["python"] == drawn["command-line"]
