"""TRL's OpenEnv harness with EnvSched choosing the tasks: asynchronous GRPO on CPU, in a few minutes.

The real ``AsyncGRPOTrainer`` (TRL 1.16.0) runs its OpenEnv harness (``trl.experimental.async_grpo.openenv_harness``
with OpenEnv's ``MCPHarnessAdapter``: TRL samples each turn, the adapter calls the session's tools) through
:class:`envsched.integrations.trl_async.EnvSchedAsyncGRPOTrainer` with ``harness_session_factory=``: every episode
group runs the task ``EnvSchedSampler`` drew, on envsched's OpenEnv server (``python -m
envsched.envs.openenv_server``), through :class:`envsched.integrations.openenv_harness.OpenEnvTaskSessionFactory`.
The policy is the test suite's tiny random Llama (``tests/_tiny_llm.py``, built locally, no download) served by
:class:`envsched.integrations.standin.StandInVLLMServer` (a stand-in for ``vllm serve`` for tests and examples,
not a training server). The reward is the environment's score of the episode (reasoning-gym, in [0, 1]; a random
model earns about 0) plus a digit-share shaping term.

Run from the repository root (install: ``pip install -e '.[trl,openenv]'``)::

    HF_HUB_OFFLINE=1 nice python examples/async_grpo_openenv_harness.py --steps 8 --out runs/async_harness
    python examples/async_grpo_openenv_harness.py --smoke --out runs/async_harness_smoke    # 2 steps

Without ``--env-url`` the example serves the pool itself (the OpenEnv server in a thread, on 127.0.0.1); with
``--env-url http://127.0.0.1:8765`` it uses a server started as the docs say, with the pool the example writes to
``OUT/pool.jsonl`` (``ENVSCHED_OPENENV_POOL=OUT/pool.jsonl python -m envsched.envs.openenv_server``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ENVS = ["chain_sum", "basic_arithmetic", "leg_counting"]


def to_row(task):
    """The row TRL logs as the rollout's prompt (the model sees the OpenEnv session's own messages)."""
    return {"prompt": [{"role": "user", "content": str(task["instruction"])[:80]}]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-steps", type=int, default=4)
    ap.add_argument("--out", default="runs/async_harness")
    ap.add_argument("--env-url", help="a running envsched OpenEnv server serving OUT/pool.jsonl")
    ap.add_argument("--resume", help="a checkpoint-N folder of an earlier run")
    ap.add_argument("--smoke", action="store_true", help="the smallest run: 2 steps, a checkpoint after each")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.save_steps = 2, 1

    from openenv.core.harness import MCPHarnessAdapter
    from trl.chat_template_utils import qwen3_chat_template
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from envsched.envs.openenv_server import ServerThread, make_app
    from envsched.envs.reasoning_gym import build_reasoning_gym_pool
    from envsched.integrations.openenv_harness import OpenEnvTaskSessionFactory
    from envsched.integrations.standin import StandInVLLMServer, StandInWeightTransfer, digit_share
    from envsched.integrations.trl_async import EnvSchedAsyncGRPOTrainer
    from envsched.method.sampler import EnvSchedSampler
    from envsched.pool.pool import TaskPool

    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pool = list(build_reasoning_gym_pool(ENVS, tasks_per_dataset=4, num_tiers=2, seed=0))
    (out / "pool.jsonl").write_text("".join(json.dumps(t) + "\n" for t in pool))
    model_dir = out / "model"
    if args.resume:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
    else:
        spec = importlib.util.spec_from_file_location(
            "tiny_llm", Path(__file__).resolve().parents[1] / "tests" / "_tiny_llm.py")
        tiny = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tiny)
        tok = tiny.build_tiny_llm(pool, model_dir)
        tok.chat_template = qwen3_chat_template  # TRL renders the session's messages and tools with it
        tok.save_pretrained(model_dir)
    env_server = None
    env_url = args.env_url
    if env_url is None:
        env_server = ServerThread(make_app(TaskPool(pool), max_concurrent_envs=32)).start()
        env_url = env_server.url
    episodes = out / ("episodes-resume.jsonl" if args.resume else "episodes.jsonl")  # one line per episode
    episodes.unlink(missing_ok=True)
    try:
        # the chat template's tool preamble alone is longer than the tiny model's 256 positions: serve 1024
        with StandInVLLMServer(str(model_dir), max_model_len=1024) as server:
            cfg = AsyncGRPOConfig(output_dir=str(out / "train"), report_to="none", use_cpu=True, bf16=False,
                                  max_steps=args.steps, save_strategy="steps", save_steps=args.save_steps,
                                  logging_steps=1, num_generations=4, per_device_train_batch_size=8,
                                  max_completion_length=8, max_staleness=1, token_budget=0, learning_rate=1e-3,
                                  vllm_server_base_url=server.url, disable_tqdm=True, max_inflight_tasks=8,
                                  max_tool_calling_iterations=2)
            trainer = EnvSchedAsyncGRPOTrainer(
                str(model_dir), reward_funcs=[digit_share], args=cfg, processing_class=tok,
                task_sampler=EnvSchedSampler(pool, seed=0), task_to_row=to_row,
                weight_transfer=StandInWeightTransfer(server),
                harness_session_factory=functools.partial(OpenEnvTaskSessionFactory, env_url,
                                                          log_path=str(episodes)),
                harness_adapter=MCPHarnessAdapter())
            trainer.train(resume_from_checkpoint=args.resume)
    finally:
        if env_server is not None:
            env_server.stop()
    m = trainer.envsched_metrics()
    logged = [json.loads(line) for line in episodes.read_text().splitlines()] if episodes.exists() else []
    ran = [e for e in logged if e["event"] == "reset"]
    verified = [e for e in logged if e["event"] == "verify"]
    drawn = dict(trainer.envsched_draw_log)
    keys = ["groups_drawn", "groups_updated", "groups_discarded_stale", "groups_unresolved", "draws_replayed",
            "episodes", "signal_groups"]
    summary = {k: m[k] for k in keys} | {
        "episodes_started": len(ran),
        "episodes_on_the_drawn_task": sum(drawn.get(e["seed"]) == e["task_id"] for e in ran),
        "episodes_verified": len(verified),
        "mean_env_reward": round(sum(e["env_reward"] or 0.0 for e in verified) / max(1, len(verified)), 4),
        "top_tasks": collections.Counter(e["task_id"] for e in ran).most_common(3),
        "wall_s": round(time.time() - t0, 1)}
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
