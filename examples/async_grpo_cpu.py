"""TRL's asynchronous GRPO trainer drawing its tasks from EnvSched, on CPU, in a few minutes.

The real ``AsyncGRPOTrainer`` (TRL 1.16.0) and its rollout worker (a spawned child process) train the test
suite's tiny random Llama (``tests/_tiny_llm.py``; built locally, no download) on a 12-task reasoning-gym pool,
through :class:`envsched.integrations.trl_async.EnvSchedAsyncGRPOTrainer`. Generation goes to
:class:`envsched.integrations.standin.StandInVLLMServer`, a stand-in for ``vllm serve`` that serves the same
model with transformers on 127.0.0.1 (it speaks the part of vLLM's HTTP API the worker uses; it is for tests
and examples, not for training). The reward is the reasoning-gym score of the first number in the completion
plus a small digit-share shaping term (a random model scores 0, and groups of all-equal rewards are withheld by
``--zero-signal-filter``). A checkpoint is written every ``--save-steps``; ``--resume`` continues one.

Run from the repository root (install: ``pip install -e '.[trl]'``)::

    HF_HUB_OFFLINE=1 nice python examples/async_grpo_cpu.py --steps 12 --out runs/async_grpo_cpu
    python examples/async_grpo_cpu.py --smoke --out runs/async_grpo_cpu_smoke    # 2 steps
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ENVS = ["chain_sum", "basic_arithmetic", "leg_counting"]


def reward(completions, task_json, **kwargs):
    """Reasoning-gym score of the first number in each completion, plus 0.1 x its digit share. Module-level:
    the rollout worker runs in a spawned process, so reward functions must be picklable."""
    from envsched.envs.reasoning_gym import score_task_answer
    from envsched.integrations.standin import digit_share

    shaping = digit_share(completions)
    out = []
    for c, spec, s in zip(completions, task_json, shaping, strict=True):
        text = "".join(str(m.get("content") or "") for m in c) if isinstance(c, list) else str(c)
        answer = (re.findall(r"-?\d+", text) or [""])[0]
        out.append(score_task_answer(json.loads(spec), answer) + 0.1 * s)
    return out


def to_row(task):
    """Training row of a task: a chat prompt (the first 80 characters; the tiny model has 256 positions) and
    the task spec for the reward function (``task_id`` is added by the trainer)."""
    return {"prompt": [{"role": "user", "content": str(task["instruction"])[:80]}], "task_json": json.dumps(task)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-steps", type=int, default=6)
    ap.add_argument("--out", default="runs/async_grpo_cpu")
    ap.add_argument("--resume", help="a checkpoint-N folder of an earlier run")
    ap.add_argument("--zero-signal-filter", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="the smallest run: 2 steps, a checkpoint after each")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.save_steps = 2, 1

    from trl.chat_template_utils import qwen3_chat_template
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from envsched.envs.reasoning_gym import build_reasoning_gym_pool
    from envsched.integrations.standin import StandInVLLMServer, StandInWeightTransfer
    from envsched.integrations.trl_async import EnvSchedAsyncGRPOTrainer
    from envsched.method.sampler import EnvSchedSampler

    t0 = time.time()
    out = Path(args.out)
    pool = list(build_reasoning_gym_pool(ENVS, tasks_per_dataset=4, num_tiers=2, seed=0))
    model_dir = out / "model"
    spec = importlib.util.spec_from_file_location("tiny_llm", Path(__file__).resolve().parents[1] / "tests" /
                                                  "_tiny_llm.py")
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    if args.resume:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
    else:
        tok = tiny.build_tiny_llm(pool, model_dir)
        tok.chat_template = qwen3_chat_template  # the async worker renders chat prompts and parses replies
        tok.save_pretrained(model_dir)
    with StandInVLLMServer(str(model_dir)) as server:
        cfg = AsyncGRPOConfig(output_dir=str(out / "train"), report_to="none", use_cpu=True, bf16=False,
                              max_steps=args.steps, save_strategy="steps", save_steps=args.save_steps,
                              logging_steps=1, num_generations=4, per_device_train_batch_size=8,
                              max_completion_length=8, max_staleness=1, token_budget=0, learning_rate=1e-3,
                              vllm_server_base_url=server.url, disable_tqdm=True)
        trainer = EnvSchedAsyncGRPOTrainer(str(model_dir), reward_funcs=[reward], args=cfg, processing_class=tok,
                                           task_sampler=EnvSchedSampler(pool, seed=0), task_to_row=to_row,
                                           zero_signal_filter=args.zero_signal_filter,
                                           weight_transfer=StandInWeightTransfer(server))
        trainer.train(resume_from_checkpoint=args.resume)
    m = trainer.envsched_metrics()
    keys = ["groups_drawn", "groups_updated", "groups_discarded_stale", "groups_unresolved", "zero_signal_dropped",
            "zero_signal_dropped_share", "signal_groups", "episodes", "draws_replayed"]
    summary = {k: m[k] for k in keys} | {"wall_s": round(time.time() - t0, 1)}
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
