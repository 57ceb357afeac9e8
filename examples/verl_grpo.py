"""verl 0.9.1's v1 GRPO trainer with envsched choosing the prompts: your own Python entrypoint, or verl's command line.

verl 0.9.1's trainer is the v1 ``PPOTrainer`` (its v0 ``RayPPOTrainer`` is deprecated). Two ways in
(docs/trainers.md):

- ``--entry python``: your own entrypoint. verl's ``run_ppo(config, task_runner_class=...)`` with
  :func:`envsched.integrations.verl.envsched_task_runner`: verl's own task runner, whose trainer is
  :class:`~envsched.integrations.verl.EnvSchedPPOTrainer` around the sampler :func:`make_task_sampler` builds.
- ``--entry command-line``: ``python -m verl.trainer.main_ppo`` with :data:`ENVSCHED_OVERRIDES` (verl loads
  :class:`~envsched.integrations.verl.EnvSchedReplayBuffer` as its ``custom_sampler``).

The data is a parquet of verl RLHF rows, one per task of a 12-task reasoning-gym pool (``extra_info.task_id`` names
the task); the reward is :func:`compute_score` (verl's ``reward.custom_reward_function``): the reasoning-gym score of
the first number in the response.

A full run needs what verl's v1 trainer needs: GPUs for the actor (FSDP) and a rollout engine
(``--rollout vllm`` or ``sglang``, installed), and a local model folder (``--model``)::

    python examples/verl_grpo.py --entry python --model /models/Qwen2.5-0.5B-Instruct --gpus 1 --out runs/verl
    python examples/verl_grpo.py --entry command-line --model /models/Qwen2.5-0.5B-Instruct --gpus 1 --out runs/verl

``--smoke`` runs on CPU, without those, everything a run does before its GPU work, with verl's own code: the
composed config with the entry's overrides; the trainer as that entry builds it (``EnvSchedPPOTrainer`` with the
sampler given, or verl's ``get_trainer_cls`` with the buffer from ``custom_sampler``); its tokenizer (the test
suite's tiny model, built locally) and ``RLHFDataset`` loader; for each step, verl's prompt submission
(``_add_batch_to_generate``: envsched draws the prompts, verl registers them in a real TransferQueue on a local
Ray) and its replay-buffer poll (``replay_buffer.sample``, where envsched hears every finished group); a
checkpoint and a resume of the sampler from it. Two things stand in: the rollout (a stand-in agent loop manager
writes each prompt's ``n`` trajectories into TransferQueue, scored by :func:`compute_score` on answers of
envsched's simulated policy, :class:`~envsched.simulation.rewards.StochasticRewardSource`) and the actor worker
group (its ``save_checkpoint``/``load_checkpoint``). Not run: ``trainer.init()`` (worker groups, rollout servers)
and ``fit()``::

    python examples/verl_grpo.py --smoke --entry python --out runs/verl_smoke
    python examples/verl_grpo.py --smoke --entry command-line --out runs/verl_smoke_cli
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENVS = ["chain_sum", "basic_arithmetic", "leg_counting"]
N = 4  # rollouts per prompt (actor_rollout_ref.rollout.n), the GRPO group size

# --8<-- [start:command_line]
#: What verl's command line needs to draw from envsched (python -m verl.trainer.main_ppo ... these):
ENVSCHED_OVERRIDES = [
    "trainer.v1.sampler.custom_sampler.path=pkg://envsched.integrations.verl",
    "trainer.v1.sampler.custom_sampler.name=EnvSchedReplayBuffer",
    "+trainer.v1.sampler.sampler_kwargs.sampler=envsched",  # any name of `envsched run --list-samplers`
    "+trainer.v1.sampler.sampler_kwargs.seed=0",
    f"+trainer.v1.sampler.sampler_kwargs.group_size={N}",  # = actor_rollout_ref.rollout.n
]
# --8<-- [end:command_line]


def first_number(text: str) -> str:
    return (re.findall(r"-?\d+", text) or [""])[0]


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **kwargs: Any) -> float:
    """verl's custom reward function (``reward.custom_reward_function``): the task's reasoning-gym score of the
    first number in the response, in [0, 1]."""
    from envsched.envs.reasoning_gym import score_task_answer

    return score_task_answer(json.loads(extra_info["task"]), first_number(solution_str))


def write_data(out: Path) -> tuple[Path, Path]:
    """The pool (``pool.jsonl``, envsched task specs) and verl's training rows (``train.parquet``)."""
    import pandas as pd

    from envsched.envs.reasoning_gym import build_reasoning_gym_pool, regenerate_item

    pool = build_reasoning_gym_pool(ENVS, tasks_per_dataset=4, num_tiers=2, seed=0)
    out.mkdir(parents=True, exist_ok=True)
    pool_file, data_file = out / "pool.jsonl", out / "train.parquet"
    pool_file.write_text("".join(json.dumps(t) + "\n" for t in pool))
    rows = [{"data_source": t["env"], "prompt": [{"role": "user", "content": t["instruction"]}],
             "reward_model": {"style": "rule", "ground_truth": str(regenerate_item(t)["answer"])},
             "extra_info": {"task_id": t["id"], "index": i, "task": json.dumps(t)}} for i, t in enumerate(pool)]
    pd.DataFrame(rows).to_parquet(data_file)
    return pool_file, data_file


# --8<-- [start:make_task_sampler]
def make_task_sampler(pool_file: str, config: Any) -> Any:
    """The envsched sampler, built in verl's task-runner process (it receives this function pickled): any
    sampler over specs whose ids are the rows' ``extra_info.task_id`` -- here EnvSched from the registry."""
    from envsched.pool.pool import TaskPool
    from envsched.samplers.registry import make_sampler

    return make_sampler("envsched", TaskPool.from_file(pool_file), seed=0,
                        group_size=int(config.actor_rollout_ref.rollout.n))
# --8<-- [end:make_task_sampler]


def overrides(entry: str, args: argparse.Namespace, pool_file: Path, data_file: Path, model: Path) -> list[str]:
    """verl's config overrides of this run: the data, the model, GRPO, the sizes; on the command line,
    ENVSCHED_OVERRIDES and the pool's task specs (without them the sampler's specs are built from the rows: id,
    env, index). The Python entrypoint builds its replay buffer and sampler itself."""
    base = [f"data.train_files={data_file}", f"data.val_files={data_file}", "data.train_batch_size=4",
            "data.max_prompt_length=256", "data.max_response_length=16", "data.filter_overlong_prompts=false",
            "data.dataloader_num_workers=0", "algorithm.adv_estimator=grpo", f"actor_rollout_ref.rollout.n={N}",
            f"actor_rollout_ref.model.path={model}", f"actor_rollout_ref.rollout.name={args.rollout}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", f"trainer.n_gpus_per_node={args.gpus}",
            f"trainer.total_training_steps={args.steps}", f"trainer.save_freq={args.save_steps}",
            f"trainer.default_local_dir={args.out / 'checkpoints'}", "trainer.logger=[console]",
            "trainer.val_before_train=false", "trainer.test_freq=-1",
            f"reward.custom_reward_function.path={Path(__file__).resolve()}",
            "reward.custom_reward_function.name=compute_score"]
    if args.smoke:
        base += ["trainer.device=cpu", "trainer.resume_mode=disable"]
    if entry == "command-line":
        base += [*ENVSCHED_OVERRIDES, f"+trainer.v1.sampler.sampler_kwargs.pool={pool_file}"]
    return base


def compose_config(ov: list[str]) -> Any:
    import verl.trainer.config as verl_config
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.dirname(verl_config.__file__), version_base=None):
        return compose(config_name="ppo_trainer", overrides=ov)


# --8<-- [start:python_entry]
def run_python_entry(config: Any, pool_file: Path) -> None:
    """Your own entrypoint: what verl's main_ppo.main does, with envsched's task runner."""
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from envsched.integrations.verl import envsched_task_runner

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=envsched_task_runner(functools.partial(make_task_sampler, str(pool_file))))
# --8<-- [end:python_entry]


class StandInRollouts:
    """Stands in for verl's agent loop manager (``generate_sequences``): for each prompt, ``n`` trajectories of
    envsched's simulated policy -- the reference answer with the task's current success probability, else a wrong
    one -- scored by :func:`compute_score` and written to TransferQueue as verl's agent loop writes them (keys
    ``{uid}_{session}_0``, ``rm_scores``, tags ``status``/``response_len``/``global_steps``); then the prompt's
    status ``finished``."""

    def __init__(self, pool_file: Path, n: int, seed: int = 0) -> None:
        import numpy as np

        from envsched.pool.pool import TaskPool
        from envsched.simulation.rewards import StochasticRewardSource

        self.policy = StochasticRewardSource(TaskPool.from_file(pool_file), seed=seed)
        self.rng = np.random.default_rng(seed)
        self.n = n

    def generate_sequences(self, batch: Any) -> None:
        import torch
        import transfer_queue as tq
        from tensordict import TensorDict

        from envsched.envs.reasoning_gym import regenerate_item

        uids = [str(u) for u in batch["uid"]]
        step = int(batch["global_steps"]) if "global_steps" in batch.keys() else 0  # noqa: SIM118
        keys, scores, tags = [], [], []
        for uid, extra, source in zip(uids, list(batch["extra_info"]), list(batch["data_source"]), strict=True):
            extra = getattr(extra, "data", extra)
            task = json.loads(extra["task"])
            answer = str(regenerate_item(task)["answer"])
            p = self.policy.success_probability(task)
            for session in range(self.n):
                text = answer if self.rng.random() < p else "I do not know"
                keys.append(f"{uid}_{session}_0")
                scores.append(compute_score(str(source), text, answer, extra))
                tags.append({"status": "success", "response_len": len(text.split()), "global_steps": step})
        rm = torch.zeros(len(keys), 2)
        rm[:, -1] = torch.tensor(scores)
        tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict({"rm_scores": rm}, batch_size=[len(keys)]),
                        tags=tags)
        tq.kv_batch_put(keys=uids, partition_id="train", tags=[{"is_prompt": True, "status": "finished",
                                                                 "global_steps": step} for _ in uids])


class StandInWorkerGroup:
    """Stands in for verl's actor worker group in a checkpoint (the GPU workers save the model)."""

    def save_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        os.makedirs(local_path, exist_ok=True)

    def load_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        pass


def build_trainer(entry: str, config: Any, pool_file: Path) -> Any:
    """The trainer as the entry builds it: EnvSchedPPOTrainer around make_task_sampler's sampler, or verl's own
    lookup (``get_trainer_cls``) with the replay buffer from ``custom_sampler``."""
    if entry == "python":
        from envsched.integrations.verl import EnvSchedPPOTrainer

        return EnvSchedPPOTrainer(config, task_sampler=make_task_sampler(str(pool_file), config))
    from verl.trainer.ppo.v1 import get_trainer_cls

    return get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


def smoke(entry: str, args: argparse.Namespace, pool_file: Path, data_file: Path, model: Path) -> dict[str, Any]:
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    config = compose_config(overrides(entry, args, pool_file, data_file, model))
    trainer = build_trainer(entry, config, pool_file)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    buffer = trainer.replay_buffer
    trainer.agent_loop_manager = StandInRollouts(pool_file, N)
    trainer.actor_rollout_wg = StandInWorkerGroup()
    batch_size = int(config.data.train_batch_size)
    drawn, reported = [], []
    owner = not ray.is_initialized()
    if owner:  # TransferQueue's controller and storage actors each take a CPU slot
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        for step in range(1, args.steps + 1):
            trainer.global_steps = step
            trainer._add_batch_to_generate()  # verl: envsched draws the prompts, verl registers and submits them
            drawn.append(sorted(buffer._uid_key.values()))
            meta, _ = buffer.sample(global_steps=step, partition_id="train", batch_size=batch_size)  # verl's poll
            reported.append(buffer.envsched_sampler.reported_groups)
            tq.kv_clear(keys=meta.keys, partition_id="train")  # as fit() does after the step
            if step % args.save_steps == 0:
                trainer._save_checkpoint()
    finally:
        tq.close()
        if owner:
            ray.shutdown()
    saved_step = args.save_steps * (args.steps // args.save_steps)
    resumed_config = compose_config([
        *overrides(entry, args, pool_file, data_file, model), "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={args.out / 'checkpoints' / f'global_step_{saved_step}'}"])
    resumed = build_trainer(entry, resumed_config, pool_file)
    resumed._init_tokenizer()
    resumed._init_dataloader()
    resumed.actor_rollout_wg = StandInWorkerGroup()
    resumed._load_checkpoint()
    inner = buffer.envsched_sampler.task_sampler
    back = resumed.replay_buffer.envsched_sampler.task_sampler
    metrics = inner.metrics()
    return {"entry": entry, "trainer": type(trainer).__name__, "replay_buffer": type(buffer).__name__,
            "task_sampler": type(inner).__name__, "steps": args.steps, "drawn": drawn,
            "groups_reported": reported, "signal_groups": int(metrics["signal_groups"]),
            "episodes": int(metrics["episodes"]), "resumed_at": resumed.global_steps,
            "resumed_groups": int(back.metrics()["groups"])}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entry", choices=["python", "command-line"], default="python")
    ap.add_argument("--model", type=Path, help="a local Hugging Face model folder (a full run)")
    ap.add_argument("--rollout", default="vllm", help="verl's rollout engine (actor_rollout_ref.rollout.name)")
    ap.add_argument("--gpus", type=int, default=1, help="trainer.n_gpus_per_node")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-steps", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("runs/verl_grpo"))
    ap.add_argument("--smoke", action="store_true", help="CPU: everything before the GPU work (see above)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.save_steps = 2, 1
    elif args.model is None:
        ap.error("a full run needs --model (a local model folder); --smoke runs on CPU without one")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.out = args.out.resolve()
    t0 = time.time()
    pool_file, data_file = write_data(args.out)
    model = args.model
    if model is None:  # the smoke run's tokenizer: the test suite's tiny model, with a chat template
        from trl.chat_template_utils import qwen3_chat_template

        model = args.out / "model"
        spec = importlib.util.spec_from_file_location("tiny_llm", ROOT / "tests" / "_tiny_llm.py")
        tiny = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tiny)
        tok = tiny.build_tiny_llm([json.loads(x) for x in pool_file.read_text().splitlines()], model)
        tok.chat_template = qwen3_chat_template
        tok.save_pretrained(model)
    if args.smoke:
        summary = smoke(args.entry, args, pool_file, data_file, model) | {"wall_s": round(time.time() - t0, 1)}
        print(json.dumps(summary))
        return summary
    ov = overrides(args.entry, args, pool_file, data_file, model)
    if args.entry == "command-line":
        subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *ov], check=True)
    else:
        run_python_entry(compose_config(ov), pool_file)
    return {"entry": args.entry, "wall_s": round(time.time() - t0, 1)}


if __name__ == "__main__":
    main()
