"""Sampler overhead inside a real TRL GRPO step: wall time of ``sample`` + ``update`` as a share of the step.

Runs ``EnvSchedGRPOTrainer`` (TRL 1.16.0) on CPU with the model of ``tests/integrations/test_trl_grpo.py``
(2-layer random Llama, hidden size 32, byte-level BPE trained locally; 12-task reasoning-gym pool over three
environments) and the sampler under test, timing every ``sample`` and ``update`` call the trainer makes
(``time.perf_counter``) against the wall time of ``trainer.train()``. The first ``--warmup`` steps are a
separate run that is not counted (model load, first-call compilation). Goal: under 1 %.

``--pool default`` draws from the bundled 2,550-task pool instead (``envsched.envs.default_pool``, its
real dual-relation graph built once before the runs); the model, which has 256 positions, then sees the
first ``--prompt-chars`` characters of each task's instruction (the sampler's work does not depend on it).

    HF_HUB_OFFLINE=1 nice .venv/bin/python benchmarks/trl_sampler_overhead.py --steps 20 --sampler envsched
    HF_HUB_OFFLINE=1 nice .venv/bin/python benchmarks/trl_sampler_overhead.py --steps 20 --pool default

``--trainer async`` runs ``EnvSchedAsyncGRPOTrainer`` (TRL's ``AsyncGRPOTrainer``) instead, against the CPU
stand-in vLLM server (``envsched.integrations.standin``) serving the same model: the sampler's time is every
``sample``/``update``/``discard`` call plus the integration's own bookkeeping (rows, headers, reward mapping;
``trainer.envsched_timings()``), against the wall time of ``trainer.train()``. Draws are served on a thread while
the trainer steps, so their share is an upper bound on what the sampler takes from a step; the rollout child's
wait for a draw (a local round trip that blocks its event loop) is reported separately (``draw_wait_ms``).

    HF_HUB_OFFLINE=1 nice .venv/bin/python benchmarks/trl_sampler_overhead.py --trainer async --steps 20
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from trl import GRPOConfig

from envsched.envs.reasoning_gym import build_reasoning_gym_pool
from envsched.integrations.trl import EnvSchedGRPOTrainer

ENVS = ["chain_sum", "basic_arithmetic", "leg_counting"]


def tiny_model(pool: list, out: str) -> tuple[str, Any]:
    """The test suite's CPU model (``tests/_tiny_llm.py``): random 2-layer Llama, locally trained BPE tokenizer."""
    spec = importlib.util.spec_from_file_location("envsched_tests_tiny_llm",
                                                  Path(__file__).resolve().parents[1] / "tests" / "_tiny_llm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return out, module.build_tiny_llm(pool, out)


def make_sampler(name: str, pool: list, group_size: int, graph: Any = None):
    """The sampler under test, with its sample/update wrapped in wall-time accumulators."""
    if name == "envsched":
        from envsched.method.sampler import EnvSchedSampler

        sampler = EnvSchedSampler(pool, graph, seed=3)
    elif name == "curriculum":
        from envsched.samplers.simple import CurriculumSampler

        sampler = CurriculumSampler(pool, group_size=group_size, key="group", seed=3)
    else:
        from envsched.samplers.simple import UniformSampler

        sampler = UniformSampler(pool, seed=3)
    timing = {"sample_s": 0.0, "update_s": 0.0, "sample_calls": 0, "update_calls": 0}
    sample, update, discard = sampler.sample, sampler.update, sampler.discard

    def timed_sample(n):
        t = time.perf_counter()
        try:
            return sample(n)
        finally:
            timing["sample_s"] += time.perf_counter() - t
            timing["sample_calls"] += 1

    def timed_update(task, rewards, costs=None):
        t = time.perf_counter()
        try:
            return update(task, rewards, costs)
        finally:
            timing["update_s"] += time.perf_counter() - t
            timing["update_calls"] += 1

    def timed_discard(task):
        t = time.perf_counter()
        try:
            return discard(task)
        finally:
            timing["update_s"] += time.perf_counter() - t
            timing["update_calls"] += 1

    sampler.sample, sampler.update, sampler.discard = timed_sample, timed_update, timed_discard
    return sampler, timing


def run_async(model_dir: str, tok, pool: list, args: argparse.Namespace, steps: int, out: str,
              graph: Any = None) -> dict:
    """One ``EnvSchedAsyncGRPOTrainer`` run against the stand-in server; the sampler's share of its wall time."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from envsched.integrations.standin import StandInVLLMServer, StandInWeightTransfer, digit_share
    from envsched.integrations.trl_async import EnvSchedAsyncGRPOTrainer

    sampler, timing = make_sampler(args.sampler, pool, args.num_generations, graph)

    def to_row(task):
        return {"prompt": [{"role": "user", "content": str(task["instruction"])[: args.prompt_chars]}]}

    with StandInVLLMServer(model_dir) as server:
        cfg = AsyncGRPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", seed=0, max_steps=steps,
                              save_strategy="no", logging_steps=1, num_generations=args.num_generations,
                              per_device_train_batch_size=args.num_generations * args.tasks_per_step,
                              max_completion_length=args.max_completion_length, disable_tqdm=True,
                              token_budget=0, vllm_server_base_url=server.url)
        trainer = EnvSchedAsyncGRPOTrainer(model_dir, reward_funcs=[digit_share], args=cfg, processing_class=tok,
                                           task_sampler=sampler, task_to_row=to_row,
                                           weight_transfer=StandInWeightTransfer(server))
        t = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t
    own = trainer.envsched_timings()
    sampler_s = own["draw_s"] + own["feedback_s"]
    waits = [h["envsched/draw_wait_s"] for h in trainer.state.log_history if "envsched/draw_wait_s" in h]
    return {**timing, "trainer": "async", "steps": steps, "train_s": train_s, "step_s": train_s / steps,
            "sampler_calls_s": timing["sample_s"] + timing["update_s"], "sampler_s": sampler_s,
            "integration_draw_s": own["draw_s"], "integration_feedback_s": own["feedback_s"],
            "sampler_ms_per_step": 1000 * sampler_s / steps, "share_percent": 100 * sampler_s / train_s,
            "draw_wait_ms": 1000 * sum(waits) / len(waits) if waits else None,
            "groups": trainer.envsched_metrics()}


def run(model_dir: str, tok, pool: list, args: argparse.Namespace, steps: int, out: str, graph: Any = None) -> dict:
    sampler, timing = make_sampler(args.sampler, pool, args.num_generations, graph)

    def digits(completions, **kw):
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    cfg = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, beta=0.0, report_to="none", seed=0, max_steps=steps,
                     save_strategy="no", logging_steps=1, num_generations=args.num_generations,
                     per_device_train_batch_size=args.num_generations * args.tasks_per_step,
                     max_completion_length=args.max_completion_length, disable_tqdm=True)
    def to_row(task):
        return {"prompt": str(task["instruction"])[: args.prompt_chars], "env": task["env"]}

    trainer = EnvSchedGRPOTrainer(model=model_dir, reward_funcs=[digits], args=cfg, processing_class=tok,
                                  task_sampler=sampler, task_to_row=to_row)
    t = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t
    sampler_s = timing["sample_s"] + timing["update_s"]
    return {**timing, "steps": steps, "train_s": train_s, "step_s": train_s / steps, "sampler_s": sampler_s,
            "sampler_ms_per_step": 1000 * sampler_s / steps, "share_percent": 100 * sampler_s / train_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--sampler", choices=["envsched", "curriculum", "uniform"], default="envsched")
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--tasks-per-step", type=int, default=2)
    ap.add_argument("--max-completion-length", type=int, default=8)
    ap.add_argument("--pool", choices=["small", "default"], default="small",
                    help="small: 12 reasoning-gym tasks; default: the bundled 2,550-task pool")
    ap.add_argument("--prompt-chars", type=int, default=200, help="instruction characters the model sees")
    ap.add_argument("--trainer", choices=["sync", "async"], default="sync",
                    help="sync: GRPOTrainer; async: AsyncGRPOTrainer against the CPU stand-in vLLM server")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    graph = None
    if args.pool == "small":
        pool = list(build_reasoning_gym_pool(ENVS, tasks_per_dataset=4, num_tiers=2, seed=0))
    else:
        from envsched.envs.default_pool import default_pool
        from envsched.method.config import GraphConfig
        from envsched.method.graph.build import build_graph

        full = default_pool()
        pool = list(full)
        if args.sampler == "envsched":
            graph = build_graph(full, GraphConfig())  # once, shared by the warm-up and the counted run
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, tok = tiny_model(pool, os.path.join(tmp, "model"))
        runner = run
        if args.trainer == "async":
            from trl.chat_template_utils import qwen3_chat_template

            tok.chat_template = qwen3_chat_template  # the async worker renders chat prompts and parses replies
            tok.save_pretrained(model_dir)
            runner = run_async
        if args.warmup:
            runner(model_dir, tok, pool, args, args.warmup, os.path.join(tmp, "warmup"), graph)
        result = runner(model_dir, tok, pool, args, args.steps, os.path.join(tmp, "run"), graph)
    result.update(trainer=args.trainer, pool=args.pool, pool_tasks=len(pool),
                  sampler=args.sampler, num_generations=args.num_generations, tasks_per_step=args.tasks_per_step,
                  max_completion_length=args.max_completion_length, torch_threads=torch.get_num_threads())
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
