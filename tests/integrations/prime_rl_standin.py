"""A stand-in for the part of prime-rl's orchestrator that envsched's orchestrator entrypoint plugs into, for tests
and the CPU smoke run of ``examples/prime_rl_orchestrator.py``.

prime-rl cannot be installed here: it needs Python 3.12, vLLM and GPUs, and is not on PyPI. This module, its own
code, registers the module ``prime_rl.orchestrator.orchestrator`` with the names
:func:`envsched.integrations.prime_rl.orchestrator_main` uses (``TrainSource``, ``main``), and follows the call
order of prime-rl ``main`` @ 559b447 (docs/trainers.md): ``TrainSource(train_envs)`` builds one curriculum per
env whose ``sampler`` is a plain attribute holding the env's finite ``tasks``; a resume loads the checkpoint into
the train source right after building it; draws are one task at a time, ``--in-flight`` groups ahead of their
results; each finished group goes to ``TrainSource.on_result`` (the curriculum's ``sampler.observe`` before any
gate), in the order the groups finish, not the order drawn; the checkpoint holds ``train_source.state_dict()``.
The rollouts are envsched's simulated policy (:class:`envsched.simulation.rewards.StochasticRewardSource`, the
one ``envsched run`` drives) turned into real verifiers 0.4.0 ``Episode`` objects.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.configs.agent import AgentConfig


class StandardSampler:
    """prime-rl's default sampler's shape: cycles a finite taskset; ``tasks`` holds it."""

    def __init__(self, tasks: list[Any]) -> None:
        self.tasks = tuple(tasks)
        self.cursor = 0

    def __next__(self) -> Any:
        task = self.tasks[self.cursor % len(self.tasks)]
        self.cursor += 1
        return task

    def observe(self, group: list[Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])

    def metrics(self) -> dict[str, float]:
        return {}


class Curriculum:
    def __init__(self, tasks: list[Any]) -> None:
        self.sampler: Any = StandardSampler(tasks)

    def on_result(self, group: list[Any]) -> bool:
        keys = {e.task.key for e in group}
        if len(keys) != 1 or None in keys:
            raise ValueError(f"a finalized group must hold one task key, got {keys}")
        self.sampler.observe(group)
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict(), "gates": {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])


class TrainSource:
    def __init__(self, train_envs: list[tuple[str, list[Any], float]]) -> None:
        self.rng = random.Random(42)
        self.curricula = {name: Curriculum(tasks) for name, tasks, _ in train_envs}
        self.env_names = [name for name, _, _ in train_envs]
        self.weights = [ratio for _, _, ratio in train_envs]

    def next_task(self, *, step: int) -> tuple[str, Any]:
        env = self.rng.choices(self.env_names, weights=self.weights, k=1)[0]
        return env, next(self.curricula[env].sampler)

    def on_result(self, group: list[Any]) -> bool:
        return self.curricula[group[0].env.name].on_result(group)

    def metrics(self) -> dict[str, float]:
        return {f"curriculum/{env}/sampler/{k}": float(v) for env, c in self.curricula.items()
                for k, v in c.sampler.metrics().items()}

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "envs": {n: c.state_dict() for n, c in self.curricula.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        for name, curriculum in self.curricula.items():
            curriculum.load_state_dict(state["envs"][name])


def vf_tasks(pool_file: str | Path) -> dict[str, list[Any]]:
    """The pool's task specs as verifiers Tasks (``TaskData.id`` = the spec's id), per environment."""
    out: dict[str, list[Any]] = defaultdict(list)
    for line in Path(pool_file).read_text().splitlines():
        if line.strip():
            spec = json.loads(line)
            tasks = out[spec["env"]]
            tasks.append(vf.Task(vf.TaskData(idx=len(tasks), id=spec["id"], prompt=spec["instruction"])))
    return dict(out)


def episode(task: Any, env: str, reward: float | None, out_tokens: int) -> Any:
    """A verifiers Episode of one rollout of ``task`` (``reward`` None: the reward function did not run)."""
    tt = vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash)
    rewards = {"correct": None if reward is None else vf.Reward(score=reward, weight=1.0)}
    trace = vf.Trace(task=tt, agent=vf.AgentInfo(config=AgentConfig(), trainable=True), rewards=rewards, ok=True,
                     is_completed=True, calls=[vf.ModelCall(usage=vf.Usage(prompt_tokens=3,
                                                                           completion_tokens=out_tokens))])
    return vf.Episode(task=tt, traces=[trace], ok=True, group=vf.GroupInfo(id="g"), env=vf.EnvInfo(id=env, name=env))


def main() -> dict[str, Any]:
    """The orchestrator loop, from ``sys.argv``: ``--pool FILE --steps N --groups G --rollouts R --in-flight K
    --out DIR [--resume-step S] [--ckpt-interval I]``. Returns (and prints) a JSON summary."""
    from envsched.pool.pool import TaskPool
    from envsched.simulation.rewards import StochasticRewardSource

    ap = argparse.ArgumentParser(prog="prime-rl orchestrator (stand-in)")
    ap.add_argument("--pool", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--groups", type=int, default=4, help="groups per training step")
    ap.add_argument("--rollouts", type=int, default=4, help="episodes per group")
    ap.add_argument("--in-flight", type=int, default=6, help="groups drawn ahead of their results")
    ap.add_argument("--ckpt-interval", type=int, default=2)
    ap.add_argument("--resume-step", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(sys.argv[1:])
    module = sys.modules["prime_rl.orchestrator.orchestrator"]  # its TrainSource, as the entrypoint left it
    envs = vf_tasks(args.pool)
    spec_of = {(env, t.key): json.loads(line) for env, tasks in envs.items() for t, line in
               zip(tasks, [ln for ln in Path(args.pool).read_text().splitlines() if ln.strip() and
                           json.loads(ln)["env"] == env], strict=True)}
    source = StochasticRewardSource(TaskPool.from_file(args.pool), seed=0)
    train_source = module.TrainSource([(env, tasks, 1.0) for env, tasks in sorted(envs.items())])
    out = Path(args.out)
    step = 0
    if args.resume_step is not None:
        state = pickle.loads((out / f"step_{args.resume_step}" / "orchestrator.pkl").read_bytes())
        train_source.load_state_dict(state["train_source"])
        source.load_state_dict(state["rollouts"])  # the simulated policy, as it was
        step = args.resume_step
    drawn: list[list[str]] = []
    in_flight: list[tuple[str, Any]] = []
    while step < args.steps:
        step += 1
        finished = []
        while len(finished) < args.groups:
            while len(in_flight) < args.in_flight:
                in_flight.append(train_source.next_task(step=step))
            env, task = in_flight.pop(len(in_flight) // 2)  # groups finish out of draw order
            spec = spec_of[(env, task.key)]
            rewards, costs = source.rollout(spec, args.rollouts)
            group = [episode(task, env, r, int(c)) for r, c in zip(rewards, costs, strict=True)]
            train_source.on_result(group)
            finished.append(str(spec["id"]))
        drawn.append(finished)
        if args.ckpt_interval and step % args.ckpt_interval == 0:
            folder = out / f"step_{step}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "orchestrator.pkl").write_bytes(pickle.dumps({
                "step": step, "train_source": train_source.state_dict(), "rollouts": source.state_dict()}))
    summary = {"steps": step, "trained": drawn, "samplers": {env: type(c.sampler).__name__
                                                             for env, c in train_source.curricula.items()},
               "metrics": train_source.metrics()}
    print(json.dumps(summary))
    return summary


def install() -> types.ModuleType:
    """Register this stand-in as ``prime_rl.orchestrator.orchestrator`` (and its parent packages)."""
    package, sub = types.ModuleType("prime_rl"), types.ModuleType("prime_rl.orchestrator")
    module = types.ModuleType("prime_rl.orchestrator.orchestrator")
    module.TrainSource, module.main = TrainSource, main
    package.orchestrator, sub.orchestrator = sub, module
    sys.modules.update({"prime_rl": package, "prime_rl.orchestrator": sub,
                        "prime_rl.orchestrator.orchestrator": module})
    return module
