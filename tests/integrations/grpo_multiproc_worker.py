"""Worker for test_trl_grpo.py's two-process run (launched with torch.distributed.run on CPU, gloo).

argv: model_dir out_dir. Each rank writes ``rank{r}.json`` with its sampler's draws and updates and the
task ids / prompts its reward function saw, so the test can check that both ranks drew and learned the
same thing from gathered rewards whose groups span the two processes.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from transformers import AutoTokenizer
from trl import GRPOConfig

from envsched.envs.reasoning_gym import build_reasoning_gym_pool
from envsched.integrations.trl import EnvSchedGRPOTrainer
from envsched.samplers.simple import CurriculumSampler


class Recording(CurriculumSampler):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.draws, self.updates = [], []

    def sample(self, n):
        out = super().sample(n)
        self.draws.append([t["id"] for t in out])
        return out

    def update(self, task, rewards, costs=None):
        super().update(task, rewards, costs)
        self.updates.append([task["id"], list(rewards), list(costs)])


def main() -> None:
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    pool = build_reasoning_gym_pool(["chain_sum", "basic_arithmetic", "leg_counting"], tasks_per_dataset=4,
                                    num_tiers=2, seed=0)
    sampler = Recording(pool, group_size=4, key="group", success_threshold=0.3, seed=3)
    seen: list[list[str]] = []
    holder = {}

    def shaped(prompts, completions, task_id, **kw):
        res = []
        for i, (p, c, t) in enumerate(zip(prompts, completions, task_id, strict=True)):
            seen.append([t, p == holder["trainer"].task_for(t)["instruction"]])
            # rank 1 holds rollouts 2..3 of each group: its second one is unscored
            res.append(None if (rank == 1 and i % 2 == 1) else sum(ch.isdigit() for ch in c) / max(len(c), 1))
        return res

    args = GRPOConfig(output_dir=out_dir, use_cpu=True, bf16=False, beta=0.0, report_to="none", seed=0,
                      max_steps=3, save_strategy="no", logging_steps=1, num_generations=4,
                      per_device_train_batch_size=2, max_completion_length=6, disable_tqdm=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = EnvSchedGRPOTrainer(model=model_dir, reward_funcs=[shaped], args=args, processing_class=tok,
                                  task_sampler=sampler)
    holder["trainer"] = trainer
    trainer.train()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"world": trainer.accelerator.num_processes, "draws": sampler.draws, "updates": sampler.updates,
                   "pending": trainer.pending_chunks, "seen": seen}, f)
    # Tear the gloo process group down before the interpreter exits: left to exit-time destructors, its
    # threads can abort the process ("terminate called without an active exception").
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        trainer.accelerator.wait_for_everyone()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
