"""The identifier filter wired into a real TRL GRPO run (CPU, tiny random Llama): reward functions queue
trajectories with ``trainer.record_trajectory`` and the trainer hands them to ``EnvSchedSampler.submit_trajectory``
at feedback time, after the group updates."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from trl import GRPOConfig  # noqa: E402

from envsched.envs.reasoning_gym import build_reasoning_gym_pool  # noqa: E402
from envsched.integrations.trl import EnvSchedGRPOTrainer  # noqa: E402
from envsched.method.config import SchedulerConfig  # noqa: E402
from envsched.method.graph.synthetic import graph_from_arrays  # noqa: E402
from envsched.method.sampler import EnvSchedSampler  # noqa: E402
from envsched.method.scheduling.identifier_filter import IdentifierVerdict, Trajectory  # noqa: E402

G = 4


class _FlagHard:
    """A hook that flags the difficulty-1 tasks (so the test knows which tasks must end up flagged)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def check(self, task, trajectory):
        self.seen.append((task["id"], trajectory.reward))
        flagged = task["difficulty"] == 1
        return IdentifierVerdict(flagged, trajectory.reward, [], "difficulty 1" if flagged else None)


def test_reward_function_trajectories_reach_the_identifier_filter(tmp_path, tiny_llm):
    pool = build_reasoning_gym_pool(["chain_sum", "leg_counting"], tasks_per_dataset=4, num_tiers=2, seed=0)
    model_dir = tmp_path / "model"
    hf_tok = tiny_llm(pool, model_dir, filler_lines=30, hidden_size=16, layers=1, heads=2, kv_heads=1)

    hook = _FlagHard()
    ids, envs = [t["id"] for t in pool], [t["env"] for t in pool]
    graph = graph_from_arrays(ids, envs, [[j for j in range(len(pool)) if j != i and envs[j] == envs[i]]
                                         for i in range(len(pool))], [[] for _ in pool])
    sampler = EnvSchedSampler(pool, graph, SchedulerConfig(batch_size=2), seed=0, identifier_filter=hook)
    holder: dict = {}
    recorded: list[str] = []

    def reward(completions, task_id, **kw):
        out = [float(i % 2) for i in range(len(completions))]  # mixed groups
        for i, (c, tid) in enumerate(zip(completions, task_id, strict=True)):
            if i % G == 0:  # one full-marks trajectory per group, as an environment would save it
                holder["trainer"].record_trajectory(tid, Trajectory([[c]], reward=1.0))
                recorded.append(tid)
        return out

    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, beta=0.0, report_to="none",
                      seed=0, max_steps=2, save_strategy="no", logging_steps=1, learning_rate=1e-3,
                      num_generations=G, per_device_train_batch_size=G * 2, max_completion_length=4,
                      disable_tqdm=True)
    trainer = EnvSchedGRPOTrainer(model=str(model_dir), reward_funcs=[reward], args=args, processing_class=hf_tok,
                                  task_sampler=sampler)
    holder["trainer"] = trainer
    with pytest.raises(KeyError, match="unknown task id"):
        trainer.record_trajectory("nope", Trajectory([["x"]], 1.0))
    trainer.train()
    assert len(recorded) == 4  # 2 steps x 2 groups
    assert [tid for tid, _ in hook.seen] == recorded and all(r == 1.0 for _, r in hook.seen)
    hard = {tid for tid in recorded if trainer.task_for(tid)["difficulty"] == 1}
    assert hard and hard != set(recorded)  # the run drew both kinds, so the next line can fail
    assert set(sampler.identifier_flags()) == hard
    assert not trainer._es_trajectories  # the queue was handed over
