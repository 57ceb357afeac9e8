"""A plain training loop around an envsched sampler: draw a batch, roll it out, report every group, checkpoint.

No trainer: the loop you write around your own rollout code. The rollouts here come from envsched's seeded
simulation of a policy (:class:`envsched.simulation.rewards.StochasticRewardSource`, the one ``envsched run``
drives: latent skills per environment and tool, graded rewards, skills that grow from groups with signal);
replace :func:`rollout` with yours. After each step the sampler's state (and the simulation's) goes to
``OUT/checkpoint.json``, written atomically; ``--resume`` continues from it and makes the draws the
uninterrupted run would have made. Runs anywhere, in seconds; the pool is ``examples/tiny_pool.jsonl`` (found
next to this script, from any folder).

    python examples/plain_loop.py --steps 20 --out runs/plain_loop
    python examples/plain_loop.py --steps 30 --out runs/plain_loop --resume
    python examples/plain_loop.py --smoke --out runs/plain_loop_smoke    # 3 steps of 4 tasks
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def rollout(source: Any, task: dict[str, Any], group_size: int) -> tuple[list[float | None], list[float]]:
    """``group_size`` rollouts of ``task``: one reward per rollout (``None`` when it could not be scored) and
    one cost per rollout (tokens, say). Here: the simulated policy; in a real run, your policy and verifier."""
    return source.rollout(task, group_size)


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", type=Path, default=HERE / "tiny_pool.jsonl")
    ap.add_argument("--sampler", default="envsched", help="a name from `envsched run --list-samplers`")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=8, help="tasks (GRPO groups) per step")
    ap.add_argument("--group-size", type=int, default=8, help="rollouts per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/plain_loop"))
    ap.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    ap.add_argument("--smoke", action="store_true", help="the smallest run: 3 steps of 4 tasks x 4 rollouts")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.batch_size, args.group_size = 3, 4, 4

    from envsched.pool.pool import TaskPool
    from envsched.samplers.registry import make_sampler
    from envsched.simulation.rewards import StochasticRewardSource

    checkpoint = args.out / "checkpoint.json"
    config = {"pool": str(args.pool), "sampler": args.sampler, "batch_size": args.batch_size,
              "group_size": args.group_size, "seed": args.seed}
    if args.resume:  # the run's own settings; only --steps may change
        state = json.loads(checkpoint.read_text())
        config = state["config"]
        args.pool, args.sampler, args.seed = Path(config["pool"]), config["sampler"], config["seed"]
        args.batch_size, args.group_size = config["batch_size"], config["group_size"]

    # --8<-- [start:loop]
    pool = TaskPool.from_file(args.pool)
    sampler = make_sampler(args.sampler, pool, seed=args.seed, group_size=args.group_size)
    source = StochasticRewardSource(pool, seed=args.seed)
    step = 0
    if args.resume:
        sampler.load_state_dict(state["sampler"])
        source.load_state_dict(state["rollouts"])
        step = state["step"]
    args.out.mkdir(parents=True, exist_ok=True)
    while step < args.steps:
        step += 1
        batch = sampler.sample(args.batch_size)  # the tasks to train on this step
        signal = 0
        for task in batch:
            rewards, costs = rollout(source, task, args.group_size)
            sampler.update(task, rewards, costs)  # every group, before any filtering
            scored = [r for r in rewards if r is not None]
            signal += len(set(scored)) > 1
        write_atomically(checkpoint, {"step": step, "config": config, "sampler": sampler.state_dict(),
                                      "rollouts": source.state_dict()})
        print(f"step {step}: {len({t['env'] for t in batch})} environments, {signal}/{len(batch)} groups with "
              "signal", flush=True)
    # --8<-- [end:loop]
    metrics = sampler.metrics()
    summary = {"steps": step, "groups": int(metrics["groups"]), "signal_groups": int(metrics["signal_groups"]),
               "signal_groups_per_episode": round(float(metrics["signal_groups_per_episode"]), 4),
               "checkpoint": str(checkpoint)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
