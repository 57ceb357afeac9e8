"""The scheduling loop without a trainer: draw a batch, roll it out, report it, repeat.

This is what ``envsched run`` drives: one sampler, one reward source, ``steps`` batches of
``batch_size`` groups of ``group_size`` rollouts. It checkpoints to a run directory and resumes from it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envsched.samplers.base import GroupResult, TaskSampler
from envsched.simulation.rewards import RewardSource

__all__ = ["StepStats", "batch_statistics", "run_schedule"]


@dataclass
class StepStats:
    """Statistics of one scheduled batch (the paper's per-batch figures)."""

    step: int
    groups: int
    envs_covered: int
    tools_covered: int
    mean_reward: float
    mean_within_task_variance: float
    signal_groups: int
    unscored_episodes: int
    cost: float
    signal_groups_per_episode_total: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def batch_statistics(step: int, tasks: Sequence[Mapping[str, Any]], rewards: Sequence[Sequence[float | None]],
                     costs: Sequence[Sequence[float]], cumulative: Mapping[str, float],
                     reward_range: tuple[float, float] = (0.0, 1.0)) -> StepStats:
    """Summarise one batch: coverage of environments and tools, reward mean, within-task variance, and the signal
    groups as every sampler counts them (:attr:`~envsched.samplers.base.GroupResult.has_signal` on the sampler's
    ``reward_range``)."""
    variances, means = [], []
    signal = unscored = 0
    for group in rewards:
        scored = np.array([r for r in group if r is not None], dtype=float)
        unscored += len(group) - scored.size
        if scored.size:
            variances.append(float(np.var(scored)))
            means.append(float(scored.mean()))
            signal += int(GroupResult(0, list(group), None, reward_range).has_signal)
    tools = {t["name"] for task in tasks for t in (task.get("tools") or [])}
    return StepStats(
        step=step,
        groups=len(tasks),
        envs_covered=len({task.get("env") for task in tasks}),
        tools_covered=len(tools),
        mean_reward=float(np.mean(means)) if means else float("nan"),
        mean_within_task_variance=float(np.mean(variances)) if variances else float("nan"),
        signal_groups=signal,
        unscored_episodes=unscored,
        cost=float(sum(sum(c) for c in costs)),
        signal_groups_per_episode_total=float(cumulative.get("signal_groups_per_episode", 0.0)),
    )


def _write_json_atomic(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(obj, fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _config_differences(before: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """The fields that differ between two run configurations, e.g. ``sampler: 'uniform' then, 'plr' now``."""
    diffs = []
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            old = "(absent)" if key not in before else repr(before[key])
            new = "(absent)" if key not in now else repr(now[key])
            if key == "pool":
                old, new = old[:14] + "...'", new[:14] + "...'"
            diffs.append(f"{key}: {old} in the checkpoint, {new} now")
    return "; ".join(diffs)


def run_schedule(sampler: TaskSampler, source: RewardSource, *, steps: int, batch_size: int = 64,
                 group_size: int = 8, run_dir: str | os.PathLike[str] | None = None, resume: bool = False,
                 config: Mapping[str, Any] | None = None,
                 on_step: Callable[[StepStats], None] | None = None) -> list[StepStats]:
    """Drive ``sampler`` for ``steps`` batches against ``source``.

    With ``run_dir``, each step is appended to ``steps.jsonl`` and a checkpoint (sampler and reward-source
    state, ``checkpoint.json``) is written atomically after it; ``resume=True`` continues from the
    checkpoint (refusing one written with another ``config``). Returns the statistics of the steps run
    in this call (after those already in the run directory).
    """
    if steps < 1 or batch_size < 1 or group_size < 1:
        raise ValueError(f"steps, batch_size and group_size must be >= 1, got {steps}, {batch_size}, {group_size}")
    config = dict(config or {})
    start = 0
    steps_file = ckpt_file = None
    if run_dir is not None:
        run_path = Path(run_dir)
        run_path.mkdir(parents=True, exist_ok=True)
        steps_file, ckpt_file = run_path / "steps.jsonl", run_path / "checkpoint.json"
        if resume and ckpt_file.exists():
            ckpt = json.loads(ckpt_file.read_text())
            if ckpt.get("config") != config:
                raise ValueError(f"{ckpt_file} was written by a run with another configuration: "
                                 f"{_config_differences(ckpt.get('config') or {}, config)}")
            sampler.load_state_dict(ckpt["sampler"])
            if hasattr(source, "load_state_dict") and ckpt.get("source") is not None:
                source.load_state_dict(ckpt["source"])
            start = int(ckpt["step"])
            # Drop steps logged after the checkpoint (a crash between the two writes).
            if steps_file.exists():
                lines = [ln for ln in steps_file.read_text().splitlines() if ln.strip()]
                kept = [ln for ln in lines if json.loads(ln)["step"] <= start]
                steps_file.write_text("".join(ln + "\n" for ln in kept))
        elif not resume and (ckpt_file.exists() or steps_file.exists()):
            raise FileExistsError(f"{run_path} already holds a run: continue it with resume=True "
                                  "(`envsched run --resume`) or use another directory")
    out: list[StepStats] = []
    for step in range(start + 1, steps + 1):
        tasks = sampler.sample(batch_size)
        all_rewards, all_costs = [], []
        for task in tasks:
            rewards, costs = source.rollout(task, group_size)
            sampler.update(task, rewards, costs)
            all_rewards.append(rewards)
            all_costs.append(costs)
        stats = batch_statistics(step, tasks, all_rewards, all_costs, sampler.metrics(),
                                 tuple(getattr(sampler, "reward_range", (0.0, 1.0))))
        out.append(stats)
        if steps_file is not None and ckpt_file is not None:
            with steps_file.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(stats.as_dict()) + "\n")
            _write_json_atomic(ckpt_file, {
                "step": step, "config": config, "sampler": sampler.state_dict(),
                "source": source.state_dict() if hasattr(source, "state_dict") else None,
            })
        if on_step is not None:
            on_step(stats)
    return out
