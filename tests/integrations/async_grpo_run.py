"""The asynchronous TRL run of ``test_trl_async.py``, shared by the test (imported by path) and by the process
the test kills: ``python async_grpo_run.py MODEL_DIR OUT`` trains the same run in its own process, with its
own stand-in server, until it is killed (the test waits for ``checkpoint-2`` and sends SIGKILL)."""

from __future__ import annotations

import functools
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl.experimental.async_grpo import AsyncGRPOConfig

from envsched.envs.reasoning_gym import build_reasoning_gym_pool
from envsched.integrations.standin import ResetLog, StandInVLLMServer, StandInWeightTransfer, digit_share
from envsched.integrations.trl_async import EnvSchedAsyncGRPOTrainer
from envsched.samplers.simple import UniformSampler

G = 4
ENVS = ["chain_sum", "basic_arithmetic", "leg_counting"]
MAX_STEPS = 4


def make_pool() -> list:
    return list(build_reasoning_gym_pool(ENVS, tasks_per_dataset=4, num_tiers=2, seed=0))


def row(task):
    return {"prompt": [{"role": "user", "content": task["instruction"][:80]}]}


def delay(n: int) -> float:
    """Every 7th request waits 2 s: its group finishes after groups drawn later."""
    return 2.0 if n % 7 == 3 else 0.0


class Recording(UniformSampler):
    """A UniformSampler logging every call the trainer makes (draws depend on the RNG only, so a resumed run's
    draws can be compared with the uninterrupted run's)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls: list[tuple[str, str]] = []

    def sample(self, n):
        out = super().sample(n)
        self.calls += [("sample", t["id"]) for t in out]
        return out

    def update(self, task, rewards, costs=None):
        super().update(task, rewards, costs)
        self.calls.append(("update", task["id"]))

    def discard(self, task):
        super().discard(task)
        self.calls.append(("discard", task["id"]))


def make_trainer(pool, model_dir, tok, server, out):
    sampler = Recording(pool, seed=5)
    constant = tuple(t["id"] for t in pool[:4])  # these tasks' groups carry no signal
    args = AsyncGRPOConfig(output_dir=str(out), report_to="none", use_cpu=True, bf16=False, disable_tqdm=True,
                           max_steps=MAX_STEPS, save_strategy="steps", save_steps=2, logging_steps=1, seed=0,
                           num_generations=G, per_device_train_batch_size=2 * G, max_completion_length=6,
                           max_staleness=1, token_budget=0, vllm_server_base_url=server.url, learning_rate=1e-3)
    trainer = EnvSchedAsyncGRPOTrainer(
        model_dir, reward_funcs=[functools.partial(digit_share, constant_tasks=constant)], args=args,
        processing_class=tok, task_sampler=sampler, task_to_row=row, zero_signal_filter=True,
        weight_transfer=StandInWeightTransfer(server),
        environment_factory=functools.partial(ResetLog, os.path.join(str(out), "resets.txt")))
    return trainer, sampler


def main(model_dir: str, out: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    with StandInVLLMServer(model_dir, delay=delay) as server:
        trainer, _ = make_trainer(make_pool(), model_dir, tok, server, out)
        trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
