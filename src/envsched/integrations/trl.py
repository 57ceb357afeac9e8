"""TRL integration: train with ``GRPOTrainer`` on tasks drawn from any envsched :class:`TaskSampler`.

Targets TRL 1.16.0 (transformers 5.24.0). The two RFC 013 hooks are wired where TRL's own code puts them:

* **Draw** -- :meth:`EnvSchedGRPOMixin._get_train_sampler` returns a :class:`TaskRepeatSampler`, a torch
  ``Sampler`` that asks the task sampler for ``generation_batch_size // num_generations`` tasks per
  generation batch (lazily, when the DataLoader reaches that batch) and yields them in TRL's repeat
  layout: each task ``num_generations`` times in a row (one GRPO group), the whole chunk
  ``num_iterations * steps_per_generation`` times. Every process holds an identical sampler and draws
  the same chunk; accelerate hands each process its slice.
* **Feedback** -- :meth:`EnvSchedGRPOMixin._calculate_rewards` runs right after TRL computed (and gathered
  across processes) every reward function's output, *before* advantages, ``frac_reward_zero_std`` and any
  filtering. It gathers the ``task_id`` column and the completion lengths the same way, checks that every
  group holds one task and that the groups are exactly the oldest drawn chunk, and calls
  ``sampler.update(task, rewards, costs)`` once per group. A rollout for which every (selected) reward
  function returned ``None`` (NaN in TRL) is passed as ``None``, never as 0. Costs are completion tokens.

Draws run ahead of feedback (accelerate prefetches one batch, so after step *k* the sampler has produced
*k + 1* chunks and received *k*): drawn chunks wait in a FIFO until their rewards arrive.

Logs: the trainer keeps the newest ``log_size`` (default :data:`DEFAULT_LOG_SIZE`) fed-back groups in
:attr:`EnvSchedGRPOMixin.envsched_feedback_log` and the newest ``log_size`` drawn chunks in
:attr:`EnvSchedGRPOMixin.envsched_draw_log`; older entries are dropped (oldest first) and only counted
(``envsched_feedback_logged`` / ``envsched_draws_logged``), so a run of any length holds at most
``log_size`` entries each. Neither log is read by the hooks or written to checkpoints: the sampler's own
counters (``groups``, ``episodes``, ``cost``, ...) cover the whole run.

Checkpoints: :meth:`EnvSchedGRPOMixin._save_checkpoint` writes ``envsched_sampler.json`` (the sampler's
``state_dict`` plus the chunks drawn but not yet trained on) into every ``checkpoint-N`` folder, and
``train(resume_from_checkpoint=...)`` restores it and replays those chunks first, so a resumed run makes
exactly the draws the uninterrupted run would have made. When the Trainer fast-forwards the resumed
epoch (``ignore_data_skip=False``, the default) the sampler yields placeholder rows for the skipped chunks
instead of drawing, so epoch boundaries (where the DataLoader does not prefetch) also stay where they were.
Exact resume needs checkpoints at generation-batch boundaries, which holds with TRL's defaults
(``num_iterations=1``, ``steps_per_generation=gradient_accumulation_steps``).

Usage::

    trainer = EnvSchedGRPOTrainer(model, reward_funcs=[my_reward], args=GRPOConfig(..., max_steps=100),
                                  task_sampler=UniformSampler(pool), processing_class=tok)
    trainer.train()

Reward functions receive the ``task_id`` column (and every column ``task_to_row`` adds);
:meth:`EnvSchedGRPOMixin.task_for` maps an id back to its task spec.

Rewards of any scale: the weighted sum passes through a :class:`~envsched.integrations._rewards.RewardScale`
(``reward_range=`` given, else learned from the rewards) before ``update``, so a finite reward never raises
mid-training; an infinite one reaches the sampler as ``None`` and is counted (``envsched/rewards_nonfinite``).
TRL itself turns a reward function's ``None`` into NaN, so NaN and ``None`` are the same here: unscored.

Guards: at construction :func:`check_trl_hooks` verifies that the private methods overridden here exist with
the signatures this module was written for (TRL 1.16.0 / transformers 5.24.0) and refuses otherwise, naming
the supported versions; and the sampler must see the reward GRPO trains on: with
``multi_objective_aggregation="normalize_then_sum"`` (GRPO trains on per-group normalised rewards) the trainer
refuses unless ``sampler_reward_funcs`` states explicitly which raw rewards the sampler gets.
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from torch.utils.data import Sampler
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from envsched.integrations._checkpoint import SAMPLER_STATE_FILE, read_state_file, write_state_file
from envsched.integrations._rewards import RewardScale
from envsched.integrations._trl_hooks import SUPPORTED_VERSIONS, check_hooks
from envsched.pool.spec import task_key
from envsched.samplers.base import TaskSampler
from envsched.validation import check_int

__all__ = [
    "DEFAULT_LOG_SIZE",
    "SAMPLER_STATE_FILE",
    "SUPPORTED_VERSIONS",
    "EnvSchedGRPOMixin",
    "EnvSchedGRPOTrainer",
    "TaskRepeatSampler",
    "check_trl_hooks",
    "default_task_to_row",
]

logger = logging.getLogger(__name__)

#: File written into every TRL ``checkpoint-N`` folder.
_STATE_FORMAT = "envsched.trl/1"

#: Entries each of the trainer's logs keeps by default (the newest; about 1 MiB for the feedback log).
DEFAULT_LOG_SIZE = 1024

#: Private hooks overridden here: name -> the parameter names (after ``self``) they must take.
_HOOKS: dict[str, tuple[str, ...]] = {
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_get_train_sampler": ("dataset",),
    "_save_checkpoint": ("model", "trial"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    "_init_training_state": ("max_steps", "num_update_steps_per_epoch", "num_train_epochs",
                             "resume_from_checkpoint", "trial"),
    "_get_output_dir": ("trial",),
}


def check_trl_hooks(trainer_cls: type) -> None:
    """Refuse a trainer class whose private hooks differ from those this module overrides.

    ``trainer_cls`` is the class the mixin sits on (``GRPOTrainer`` or a subclass). Each hook in ``_HOOKS``
    must exist on it with exactly those parameters, and ``_generate_and_score_completions`` must still call
    ``self._calculate_rewards(`` (where the feedback hook runs). Raises ``RuntimeError`` naming the installed
    and the supported TRL/transformers versions (:func:`~envsched.integrations._trl_hooks.check_hooks`)."""
    check_hooks("envsched.integrations.trl", {trainer_cls: _HOOKS},
                [(trainer_cls, "_generate_and_score_completions", "self._calculate_rewards(",
                  "where the feedback hook runs")])


def default_task_to_row(task: Any) -> dict[str, Any]:
    """Dataset row of a task spec: ``prompt`` from the spec's ``prompt`` (text or chat messages) or else
    its ``instruction``, plus ``env``. Pass your own ``task_to_row`` for other columns (answers,
    metadata); values must be Arrow-friendly (consistent types across rows)."""
    get = task.get if isinstance(task, Mapping) else (lambda k, d=None: getattr(task, k, d))
    prompt = get("prompt")
    if prompt is None:
        prompt = get("instruction")
    if prompt is None:
        raise ValueError(f"task {task_key(task)!r} has neither 'prompt' nor 'instruction': pass task_to_row= to "
                         "build the training prompt")
    return {"prompt": prompt, "env": get("env") or ""}


class TaskRepeatSampler(Sampler[int]):
    """A torch ``Sampler`` that draws tasks from a :class:`TaskSampler` and yields dataset rows in TRL's
    ``RepeatSampler`` layout.

    Per chunk: ``sample(batch_size)`` distinct-or-not tasks, mapped to dataset rows by ``row_of``; the chunk
    is yielded ``repeat_count`` times, each row ``mini_repeat_count`` times in a row. ``chunks_per_epoch``
    chunks make one pass (``__len__``); the next pass continues drawing, so an "epoch" is only TRL's
    bookkeeping. Chunks queued in :attr:`replay` are yielded before new draws (used on resume).

    Args:
        task_sampler: the task source.
        row_of: maps a drawn task to its row index in the training dataset.
        mini_repeat_count: ``num_generations``.
        batch_size: tasks per chunk (``generation_batch_size // num_generations``).
        repeat_count: ``num_iterations * steps_per_generation``.
        chunks_per_epoch: chunks per pass over the sampler.
        on_draw: called with the row indices of each freshly drawn chunk, before any of it is yielded.
    """

    def __init__(self, task_sampler: TaskSampler, row_of: Callable[[Any], int], *, mini_repeat_count: int,
                 batch_size: int, repeat_count: int = 1, chunks_per_epoch: int = 1,
                 on_draw: Callable[[list[int]], None] | None = None) -> None:
        mini_repeat_count = check_int(mini_repeat_count, "mini_repeat_count", low=1)
        batch_size = check_int(batch_size, "batch_size", low=1)
        repeat_count = check_int(repeat_count, "repeat_count", low=1)
        chunks_per_epoch = check_int(chunks_per_epoch, "chunks_per_epoch", low=1)
        self.task_sampler = task_sampler
        self.row_of = row_of
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.chunks_per_epoch = chunks_per_epoch
        self.on_draw = on_draw
        self.replay: deque[list[int]] = deque()
        #: Chunks at the start of the next pass that the trainer skips on resume: yielded as placeholder
        #: rows (row 0) without drawing, so the epoch layout matches the interrupted run.
        self.skip_chunks = 0

    def draw_chunk(self) -> list[int]:
        """Rows of the next chunk: a queued replay chunk, else a fresh ``sample(batch_size)``."""
        if self.replay:
            return list(self.replay.popleft())
        tasks = self.task_sampler.sample(self.batch_size)
        if len(tasks) != self.batch_size:
            raise RuntimeError(f"{type(self.task_sampler).__name__}.sample({self.batch_size}) returned "
                               f"{len(tasks)} tasks; a GRPO generation batch needs exactly {self.batch_size} "
                               "(an exhausted SequentialSampler? use wrap=True or a training sampler)")
        rows = [int(self.row_of(t)) for t in tasks]
        if self.on_draw is not None:
            self.on_draw(rows)
        return rows

    def __iter__(self) -> Iterator[int]:
        skip, self.skip_chunks = self.skip_chunks, 0
        for c in range(self.chunks_per_epoch):
            rows = [0] * self.batch_size if c < skip else self.draw_chunk()
            for _ in range(self.repeat_count):
                for r in rows:
                    for _ in range(self.mini_repeat_count):
                        yield r

    def __len__(self) -> int:
        return self.chunks_per_epoch * self.batch_size * self.mini_repeat_count * self.repeat_count


class EnvSchedGRPOMixin:
    """Mixin for ``trl.GRPOTrainer`` (or a subclass of it): put it first in the bases.

    Keyword args (the rest goes to ``GRPOTrainer``):
        task_sampler: any object with RFC 013's ``sample``/``update``/``state_dict``/``load_state_dict``
            (``metrics`` is logged when present). All processes must build it identically (same tasks,
            same seed): they draw in lockstep and receive the same gathered feedback.
        tasks: the task specs (default ``task_sampler.tasks``); the training dataset gets one row per
            task, in this order.
        task_to_row: ``task -> dict`` of dataset columns (default :func:`default_task_to_row`); the
            ``task_id`` column (the task key) is added.
        train_dataset: optional prebuilt dataset with a ``task_id`` column holding every task's key; if
            given, ``tasks``/``task_to_row`` only serve to look tasks up.
        sampler_reward_funcs: names of the reward functions whose weighted sum (``reward_weights``) the
            sampler receives (default: all, i.e. the reward GRPO trains on). Typically the correctness
            reward without format shaping. Required with ``multi_objective_aggregation="normalize_then_sum"``.
        reward_range: the range of that weighted sum; mapped onto the sampler's ``reward_range`` (``None``:
            learned from the rewards, see :class:`~envsched.integrations._rewards.RewardScale`).
        chunks_per_epoch: generation batches per DataLoader pass (default: enough to cover the tasks
            once). Only TRL's epoch bookkeeping; set ``max_steps`` to bound training.
        log_size: how many of the newest entries :attr:`envsched_feedback_log` (groups) and
            :attr:`envsched_draw_log` (chunks) keep (default :data:`DEFAULT_LOG_SIZE`; 0 keeps none).
            Older entries are dropped, oldest first, and only counted.
    """

    def __init__(self, *args: Any, task_sampler: TaskSampler, tasks: Sequence[Any] | None = None,
                 task_to_row: Callable[[Any], dict[str, Any]] | None = None,
                 sampler_reward_funcs: Sequence[str] | None = None, chunks_per_epoch: int | None = None,
                 reward_range: Sequence[float] | None = None, log_size: int = DEFAULT_LOG_SIZE,
                 **kwargs: Any) -> None:
        log_size = check_int(log_size, "log_size (entries each log keeps)", low=0)
        mro = type(self).__mro__
        check_trl_hooks(mro[mro.index(EnvSchedGRPOMixin) + 1])
        for m in ("sample", "update", "state_dict", "load_state_dict"):
            if not callable(getattr(task_sampler, m, None)):
                raise TypeError(f"task_sampler must implement RFC 013's TaskSampler; "
                                f"{type(task_sampler).__name__} has no {m}()")
        if tasks is None:
            tasks = getattr(task_sampler, "tasks", None)
            if tasks is None:
                raise ValueError(f"{type(task_sampler).__name__} has no .tasks: pass tasks= (the task specs)")
        tasks = list(tasks)
        if not tasks:
            raise ValueError("the task list is empty")
        self._es_sampler = task_sampler
        self._es_scale = RewardScale.for_sampler(task_sampler, reward_range)
        self._es_tasks: dict[str, Any] = {}
        for t in tasks:
            k = task_key(t)
            if k in self._es_tasks:
                raise ValueError(f"duplicate task key {k!r}")
            self._es_tasks[k] = t
        train_dataset = kwargs.pop("train_dataset", None)
        if train_dataset is None:
            to_row = task_to_row or default_task_to_row
            rows = []
            for k, t in self._es_tasks.items():
                row = dict(to_row(t))
                if "prompt" not in row:
                    raise ValueError(f"task_to_row returned no 'prompt' for task {k!r}")
                row["task_id"] = k
                rows.append(row)
            train_dataset = Dataset.from_list(rows)
        if "task_id" not in getattr(train_dataset, "column_names", ()):
            raise ValueError("train_dataset needs a 'task_id' column with each task's key")
        row_keys = list(train_dataset["task_id"])
        self._es_row_of_key: dict[str, int] = {}
        for i, k in enumerate(row_keys):
            self._es_row_of_key.setdefault(str(k), i)
        missing = [k for k in self._es_tasks if k not in self._es_row_of_key]
        if missing:
            raise ValueError(f"train_dataset has no row for {len(missing)} task(s), e.g. {missing[:3]}")
        self._es_row_keys = [str(k) for k in row_keys]
        self._es_pending: deque[list[str]] = deque()
        self._es_replay: deque[list[int]] = deque()
        self._es_torch_sampler: TaskRepeatSampler | None = None
        self._es_chunks_per_epoch = chunks_per_epoch
        self._es_feedback_log: deque[dict[str, Any]] = deque(maxlen=log_size)
        self._es_draw_log: deque[list[str]] = deque(maxlen=log_size)
        #: Groups ever appended to the feedback log / chunks ever appended to the draw log (kept or dropped).
        self.envsched_feedback_logged = 0
        self.envsched_draws_logged = 0
        self._es_steps_trained_in_epoch = 0
        self._es_trajectories: list[tuple[str, Any]] = []
        super().__init__(*args, train_dataset=train_dataset, **kwargs)
        names = list(self.reward_func_names)
        if sampler_reward_funcs is None:
            self._es_func_idx = list(range(len(names)))
        else:
            unknown = [n for n in sampler_reward_funcs if n not in names]
            if unknown or not sampler_reward_funcs:
                raise ValueError(f"sampler_reward_funcs {list(sampler_reward_funcs)!r}: unknown or empty; "
                                 f"reward functions are {names}")
            self._es_func_idx = [names.index(n) for n in sampler_reward_funcs]
        aggregation = getattr(self, "multi_objective_aggregation", "sum_then_normalize")
        if aggregation != "sum_then_normalize" and sampler_reward_funcs is None:
            raise ValueError(f"multi_objective_aggregation={aggregation!r}: GRPO trains on per-group normalised "
                             "rewards, not the weighted sum the sampler would see; pass sampler_reward_funcs=[...] "
                             "to choose explicitly which raw rewards the sampler learns from, or use "
                             "'sum_then_normalize'")

    # ------------------------------------------------------------------ public helpers
    @property
    def task_sampler(self) -> TaskSampler:
        return self._es_sampler

    def task_for(self, task_id: str) -> Any:
        """The task spec of ``task_id`` (for reward functions, which receive the ``task_id`` column)."""
        try:
            return self._es_tasks[task_id]
        except KeyError:
            raise KeyError(f"unknown task id {task_id!r}") from None

    def record_trajectory(self, task_id: str, trajectory: Any) -> None:
        """For a reward function whose rollouts yield trajectories (e.g. ``BFCLEnvironment.trajectory()``):
        queue one for the task sampler's identifier filter. At the next feedback the queues of all processes
        are gathered and each goes to ``task_sampler.submit_trajectory(task, trajectory)`` after the group
        updates, when the sampler has an ``identifier_filter`` (EnvSched); otherwise they are dropped."""
        self.task_for(str(task_id))  # unknown ids fail here, in the reward function that sent them
        self._es_trajectories.append((str(task_id), trajectory))

    @property
    def envsched_feedback_log(self) -> list[dict[str, Any]]:
        """The newest ``log_size`` fed-back groups, oldest first: ``{"step", "task_id", "rewards", "costs",
        "raw_rewards"}`` (``rewards`` as the sampler got them, ``raw_rewards`` before the reward scale). Older
        groups are dropped; ``envsched_feedback_logged - len(envsched_feedback_log)`` of them so far."""
        return list(self._es_feedback_log)

    @property
    def envsched_draw_log(self) -> list[list[str]]:
        """The newest ``log_size`` drawn chunks (task ids), in draw order, including replays after a resume.
        Older chunks are dropped; ``envsched_draws_logged - len(envsched_draw_log)`` of them so far."""
        return [list(c) for c in self._es_draw_log]

    @property
    def pending_chunks(self) -> list[list[str]]:
        """Chunks drawn whose rewards have not come back yet (oldest first)."""
        return [list(c) for c in self._es_pending]

    # ------------------------------------------------------------------ draw hook
    def _get_train_sampler(self, dataset: Any = None) -> Sampler:
        g = self.num_generations
        batch = self.args.generation_batch_size // g
        cpe = self._es_chunks_per_epoch or max(1, math.ceil(len(self._es_tasks) / batch))
        sampler = TaskRepeatSampler(
            self._es_sampler, self._es_row_for_task, mini_repeat_count=g, batch_size=batch,
            repeat_count=self.num_iterations * self.args.steps_per_generation, chunks_per_epoch=cpe,
            on_draw=self._es_on_draw)
        sampler.replay = self._es_replay  # shared: a resume queues chunks here
        self._es_torch_sampler = sampler
        return sampler

    def _es_row_for_task(self, task: Any) -> int:
        k = task if isinstance(task, str) else task_key(task)
        try:
            return self._es_row_of_key[k]
        except KeyError:
            raise KeyError(f"the sampler drew task {k!r}, which is not in the training dataset") from None

    def _es_on_draw(self, rows: list[int]) -> None:
        keys = [self._es_row_keys[r] for r in rows]
        self._es_pending.append(keys)
        self._es_log_draw(keys)

    def _es_log_draw(self, keys: list[str]) -> None:
        self._es_draw_log.append(list(keys))
        self.envsched_draws_logged += 1

    # ------------------------------------------------------------------ feedback hook
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[override]
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training:
            self._es_feedback(inputs, rewards_per_func, completion_ids_list)
        return rewards_per_func

    def _es_feedback(self, inputs: list[dict[str, Any]], rewards_per_func: torch.Tensor,
                     completion_ids_list: list[Any]) -> None:
        ids = [str(x) for x in gather_object([x["task_id"] for x in inputs])]
        lengths = [int(n) for n in gather_object([len(c) for c in completion_ids_list])]
        r = rewards_per_func.detach().to("cpu", torch.float64)
        if r.shape[0] != len(ids) or len(lengths) != len(ids):
            raise RuntimeError(f"envsched: {r.shape[0]} gathered rewards for {len(ids)} task ids and "
                               f"{len(lengths)} completions; the processes disagree on the batch")
        g = self.num_generations
        if len(ids) % g:
            raise RuntimeError(f"envsched: {len(ids)} rollouts is not a multiple of num_generations={g}")
        w = self.reward_weights.detach().to("cpu", torch.float64)
        sel = self._es_func_idx
        combined: list[float | None] = []
        for row in range(r.shape[0]):
            vals = [(float(r[row, i]), float(w[i])) for i in sel]
            scored = [(v, wi) for v, wi in vals if not math.isnan(v)]
            combined.append(sum(v * wi for v, wi in scored) if scored else None)
        group_ids = []
        for s in range(0, len(ids), g):
            gid = set(ids[s:s + g])
            if len(gid) != 1:
                raise RuntimeError(f"envsched: rollouts {s}..{s + g - 1} mix tasks {sorted(gid)}; the batch is not "
                                   "in TRL's repeat layout (a shuffled or custom dataloader?)")
            group_ids.append(ids[s])
        if not self._es_pending:
            raise RuntimeError(f"envsched: rewards arrived for tasks {group_ids[:3]}... but no drawn chunk is "
                               "pending (was the train dataloader built by this trainer?)")
        expected = self._es_pending[0]
        if group_ids != expected:
            raise RuntimeError(f"envsched: the scored groups {group_ids} are not the oldest drawn chunk {expected}")
        self._es_pending.popleft()
        step = int(self.state.global_step)
        for j, key in enumerate(group_ids):
            span = slice(j * g, (j + 1) * g)
            raw, costs = combined[span], [float(c) for c in lengths[span]]
            rewards = self._es_scale.map(raw)
            self._es_sampler.update(self._es_tasks[key], rewards, costs)
            self._es_feedback_log.append({"step": step, "task_id": key, "rewards": rewards, "costs": costs,
                                          "raw_rewards": raw})
            self.envsched_feedback_logged += 1
        trajectories = gather_object(self._es_trajectories) if self._es_trajectories or \
            self.accelerator.num_processes > 1 else []
        self._es_trajectories = []
        submit = getattr(self._es_sampler, "submit_trajectory", None)
        if callable(submit) and getattr(self._es_sampler, "identifier_filter", None) is not None:
            for key, trajectory in trajectories:
                submit(self._es_tasks[key], trajectory)
        for name, value in self.envsched_metrics().items():
            if math.isfinite(value):
                self._metrics["train"][f"envsched/{name}"].append(value)

    def envsched_metrics(self) -> dict[str, float]:
        """The sampler's metrics and the reward scale's counters (``rewards_nonfinite``, ...)."""
        out: dict[str, float] = {}
        metrics = getattr(self._es_sampler, "metrics", None)
        if callable(metrics):
            for name, value in metrics().items():
                if isinstance(value, int | float):
                    out[name] = float(value)
        out.update(self._es_scale.metrics())
        return out

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model, trial):  # type: ignore[override]
        super()._save_checkpoint(model, trial)
        if not self.args.should_save:
            return
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        state = {"format": _STATE_FORMAT, "global_step": int(self.state.global_step),
                 "sampler_class": type(self._es_sampler).__name__,
                 "sampler": self._es_sampler.state_dict(), "pending": [list(c) for c in self._es_pending],
                 "reward_scale": self._es_scale.state_dict()}
        write_state_file(folder, state)

    def _init_training_state(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        epochs_trained, steps_trained_in_current_epoch = super()._init_training_state(*args, **kwargs)
        self._es_steps_trained_in_epoch = int(steps_trained_in_current_epoch)
        return epochs_trained, steps_trained_in_current_epoch

    def _load_optimizer_and_scheduler(self, checkpoint):  # type: ignore[override]
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.load_sampler_state(checkpoint)

    def load_sampler_state(self, checkpoint: str) -> None:
        """Restore the sampler and the chunks to replay from ``checkpoint/envsched_sampler.json``
        (called by ``train(resume_from_checkpoint=...)``). Raises ``FileNotFoundError`` if the checkpoint
        has none and ``ValueError`` if it does not fit this trainer's tasks; nothing changes on error."""
        path, state = read_state_file(checkpoint)
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            found = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{path}: unsupported format {found!r} (expected {_STATE_FORMAT!r})")
        pending = state.get("pending", [])
        unknown = [k for c in pending for k in c if k not in self._es_row_of_key]
        if unknown:
            raise ValueError(f"{path}: pending chunks name tasks this trainer does not have: {unknown[:3]}")
        scale = RewardScale(self._es_scale.target, self._es_scale.source if self._es_scale.fixed else None)
        if "reward_scale" in state:
            scale.load_state_dict(state["reward_scale"])
        self._es_sampler.load_state_dict(state["sampler"])
        self._es_scale = scale
        self._es_pending.clear()
        self._es_replay.clear()
        for chunk in pending:
            self._es_pending.append(list(chunk))
            self._es_replay.append([self._es_row_of_key[k] for k in chunk])
        if self._es_torch_sampler is not None:
            # batches the Trainer fast-forwards past in the resumed epoch: whole chunks, not drawn again
            self._es_torch_sampler.skip_chunks = self._es_steps_trained_in_epoch // self._es_torch_sampler.repeat_count
        # replayed chunks are draws of the uninterrupted run: log them as draws of this run too
        for chunk in pending:
            self._es_log_draw(list(chunk))


class EnvSchedGRPOTrainer(EnvSchedGRPOMixin, GRPOTrainer):
    """``trl.GRPOTrainer`` drawing its prompts from an envsched :class:`TaskSampler`; see
    :class:`EnvSchedGRPOMixin` for the extra arguments and the module docstring for the hooks."""
