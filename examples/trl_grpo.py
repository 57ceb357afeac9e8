"""TRL's GRPOTrainer drawing its tasks from EnvSched, on CPU, in about a minute.

The real ``GRPOTrainer`` (TRL 1.16.0), through :class:`envsched.integrations.trl.EnvSchedGRPOTrainer`, trains the
test suite's tiny random Llama (``tests/_tiny_llm.py``: 2 layers, hidden size 32, a byte-level tokenizer trained
on the pool; built locally, no download) on a 12-task reasoning-gym pool, drawing every GRPO group from
:class:`envsched.method.sampler.EnvSchedSampler` and reporting every scored group back to it. The reward is the
reasoning-gym score of the first number in the completion (a random model scores 0) plus a digit-share shaping
term, so that groups have signal. A checkpoint (with ``envsched_sampler.json``) is written every
``--save-steps``; ``--resume`` continues one with the draws the uninterrupted run would have made.

Run from the repository root (install: ``pip install -e '.[trl]'``)::

    python examples/trl_grpo.py --steps 8 --out runs/trl_grpo
    python examples/trl_grpo.py --steps 8 --out runs/trl_grpo --resume runs/trl_grpo/train/checkpoint-4
    python examples/trl_grpo.py --smoke --out runs/trl_grpo_smoke    # 2 steps

With a GPU and a real model, pass its folder as ``--model`` (and raise ``--max-completion-length``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
ENVS = ["chain_sum", "basic_arithmetic", "leg_counting"]


def first_number(text: str) -> str:
    return (re.findall(r"-?\d+", text) or [""])[0]


def tiny_model(pool: list[dict[str, Any]], folder: Path) -> None:
    """The test suite's tiny random Llama and its tokenizer, built into ``folder`` (once)."""
    if (folder / "config.json").is_file():
        return
    spec = importlib.util.spec_from_file_location("tiny_llm", ROOT / "tests" / "_tiny_llm.py")
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    tiny.build_tiny_llm(pool, folder)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-steps", type=int, default=4)
    ap.add_argument("--model", type=Path, default=None, help="a model folder (default: build the tiny model)")
    ap.add_argument("--max-completion-length", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("runs/trl_grpo"))
    ap.add_argument("--resume", help="a checkpoint-N folder of an earlier run")
    ap.add_argument("--smoke", action="store_true", help="the smallest run: 2 steps, a checkpoint after each")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.save_steps = 2, 1

    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from envsched.envs.reasoning_gym import build_reasoning_gym_pool, score_task_answer
    from envsched.integrations.standin import digit_share
    from envsched.integrations.trl import EnvSchedGRPOTrainer
    from envsched.method.sampler import EnvSchedSampler

    t0 = time.time()
    pool = build_reasoning_gym_pool(ENVS, tasks_per_dataset=4, num_tiers=2, seed=0)
    model = args.model or args.out / "model"
    if args.model is None:
        tiny_model(pool, model)
    tok = AutoTokenizer.from_pretrained(model)

    # --8<-- [start:trainer]
    sampler = EnvSchedSampler(pool, seed=0)

    def correct(completions: list[str], task_id: list[str], **kw: Any) -> list[float]:
        """Reward functions get every dataset column: ``task_id`` names the task each completion answers."""
        return [score_task_answer(trainer.task_for(t), first_number(c))
                for c, t in zip(completions, task_id, strict=True)]

    config = GRPOConfig(output_dir=str(args.out / "train"), use_cpu=True, bf16=False, beta=0.0, report_to="none",
                        max_steps=args.steps, save_strategy="steps", save_steps=args.save_steps, logging_steps=1,
                        num_generations=4, per_device_train_batch_size=8,  # 2 groups of 4 completions a step
                        max_completion_length=args.max_completion_length, learning_rate=5e-3, seed=0,
                        disable_tqdm=True)
    trainer = EnvSchedGRPOTrainer(model=str(model), reward_funcs=[correct, digit_share], args=config,
                                  processing_class=tok, task_sampler=sampler)
    trainer.train(resume_from_checkpoint=args.resume)
    # --8<-- [end:trainer]
    metrics = sampler.metrics()
    summary = {"steps": trainer.state.global_step, "groups": int(metrics["groups"]),
               "episodes": int(metrics["episodes"]), "signal_groups": int(metrics["signal_groups"]),
               "outstanding_groups": int(metrics["outstanding_groups"]),
               "checkpoints": sorted(p.name for p in (args.out / "train").glob("checkpoint-*")),
               "wall_s": round(time.time() - t0, 1)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
