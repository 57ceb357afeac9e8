"""verl integration: an envsched sampler as verl's ``train_sampler``, fed back from each step's batch.

Targets **verl 0.7.1** (its curriculum API: ``verl/experimental/dataset/sampler.py``, removed in 0.8.0) and
works unchanged as the ``train_sampler`` of verl 0.8/0.9.1's v0 trainer. verl is not a dependency: when it
is installed, :class:`EnvSchedVerlSampler` subclasses its ``AbstractCurriculumSampler`` (so
``create_rl_sampler``'s ``isinstance`` check passes); otherwise it is a plain ``torch.utils.data.Sampler``.

**verl 0.7.1, no code** -- in the data config::

    data:
      dataloader_num_workers: 0          # verl asserts it for curriculum samplers
      sampler:
        class_path: pkg://envsched.integrations.verl
        class_name: EnvSchedVerlSampler
        envsched:                        # read by EnvSchedVerlSampler
          sampler: curriculum            # any name in envsched.samplers.registry
          group_size: 8                  # = actor_rollout_ref.rollout.n
          seed: 0
          pool: /path/pool.jsonl         # optional: task specs whose ids are the rows' keys
          key_field: task_id             # extra_info[key_field] (else extra_info.index) names a row's task
          options: {}                    # extra keyword arguments of the sampler

verl builds it as ``EnvSchedVerlSampler(data_source=dataset, data_config=config.data)``; its
``RayPPOTrainer.fit`` calls ``sampler.update(batch=batch)`` at the end of every step (after rewards,
advantages and the actor update). :meth:`EnvSchedVerlSampler.update` groups the rows by ``uid`` (one uid per
prompt, repeated ``rollout.n`` times), takes each row's reward as the sum of ``token_level_scores`` (NaN ->
``None``), its cost as the number of response tokens (``response_mask``), and calls ``update`` once per group.
With ``algorithm.filter_groups`` (DAPO) enabled, groups filtered in the step are absent from the batch and
never reach the sampler -- use the 0.9.1 v0 hook below, which runs before filtering is applied to the update.

**verl 0.9.1 (v0 trainer, ``trainer.use_v1=false``)** -- pass ``train_sampler=EnvSchedVerlSampler(dataset,
task_sampler=...)`` to ``RayPPOTrainer`` from a custom entrypoint and subclass it to call
``sampler.update(batch)`` in ``_update_actor(self, batch)`` (right after ``compute_advantage``).

Checkpoints: verl saves ``train_dataloader.state_dict()`` (torchdata ``StatefulDataLoader``), which includes
this sampler's :meth:`state_dict` (it and its iterator are ``Stateful``, so the loader never fast-forwards
through -- and draws -- old batches). verl writes the checkpoint *before* that step's ``update(batch)``;
:meth:`load_state_dict` therefore releases the dispatches of batches drawn but never fed back, and the
resumed sampler continues the saved draws without that last step's feedback.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from envsched.pool.pool import TaskPool
from envsched.pool.spec import task_key
from envsched.samplers.base import TaskSampler

__all__ = ["VERL_STATE_FORMAT", "EnvSchedVerlSampler", "groups_from_batch"]

VERL_STATE_FORMAT = "envsched.verl/1"

try:  # verl installed: satisfy create_rl_sampler's isinstance(sampler, AbstractSampler)
    from verl.experimental.dataset.sampler import AbstractCurriculumSampler as _Base
except Exception:
    _Base = Sampler  # type: ignore[assignment, misc]


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    getter = getattr(cfg, "get", None)
    if callable(getter):
        return getter(key, default)
    return getattr(cfg, key, default)


def _row_key(extra: Any, key_field: str) -> str | None:
    if isinstance(extra, Mapping):
        if extra.get(key_field) is not None:
            return str(extra[key_field])
        if extra.get("index") is not None:
            return str(extra["index"])
    return None


def _dataset_rows(data_source: Any, key_field: str) -> list[tuple[str, str]]:
    """``(key, env)`` of every dataset row: ``extra_info[key_field]`` (else ``extra_info.index``, else the
    position) and ``data_source``. Reads verl's ``RLHFDataset.dataframe`` columns when present."""
    df = getattr(data_source, "dataframe", None)
    n = len(data_source)
    if df is not None and hasattr(df, "column_names") and "extra_info" in df.column_names:
        extras = list(df["extra_info"])
        envs = list(df["data_source"]) if "data_source" in df.column_names else [""] * n
    else:
        rows = [data_source[i] for i in range(n)]
        extras = [r.get("extra_info") if isinstance(r, Mapping) else None for r in rows]
        envs = [str(r.get("data_source", "")) if isinstance(r, Mapping) else "" for r in rows]
    out = []
    for i, (extra, env) in enumerate(zip(extras, envs, strict=True)):
        key = _row_key(extra, key_field)
        out.append((key if key is not None else str(i), str(env)))
    return out


Group = tuple[str, list[float | None], list[float] | None]


def groups_from_batch(batch: Any, key_field: str = "task_id") -> list[Group]:
    """``(task key, rewards, costs)`` per prompt group of a verl ``DataProto`` batch, in batch order.

    Rows are grouped by ``non_tensor_batch["uid"]``; a row's task key is ``non_tensor_batch[key_field]`` when
    that column exists, else ``extra_info[key_field]`` (else ``extra_info["index"]``, else ``index``). The reward
    is ``token_level_scores.sum(-1)`` (``None`` where NaN), the cost ``response_mask.sum(-1)`` when present.
    Raises ``ValueError`` when a group mixes tasks or a row has no key."""
    ntb = batch.non_tensor_batch
    tb = batch.batch
    uids = list(ntb["uid"])
    n = len(uids)
    if key_field in ntb:
        keys = [str(k) for k in ntb[key_field]]
    elif "extra_info" in ntb:
        keys = [_row_key(e, key_field) for e in ntb["extra_info"]]
    elif "index" in ntb:
        keys = [str(k) for k in ntb["index"]]
    else:
        raise ValueError(f"the batch names no task: no {key_field!r}, 'extra_info' or 'index' in non_tensor_batch")
    if any(k is None for k in keys):
        bad = next(i for i, k in enumerate(keys) if k is None)
        raise ValueError(f"row {bad} of the batch has no task key (extra_info lacks {key_field!r} and 'index')")
    scores = torch.as_tensor(tb["token_level_scores"]).detach().to("cpu", torch.float64).sum(-1).tolist()
    if len(scores) != n:
        raise ValueError(f"{len(scores)} reward rows for {n} uids")
    costs = None
    if "response_mask" in tb:
        costs = torch.as_tensor(tb["response_mask"]).detach().to("cpu", torch.float64).sum(-1).tolist()
    order: list[str] = []
    members: dict[str, list[int]] = {}
    for i, u in enumerate(uids):
        if u not in members:
            members[u] = []
            order.append(u)
        members[u].append(i)
    out = []
    for u in order:
        rows = members[u]
        ks = {keys[i] for i in rows}
        if len(ks) != 1:
            raise ValueError(f"uid {u!r} groups rows of several tasks {sorted(ks)}")
        rewards = [None if math.isnan(scores[i]) else float(scores[i]) for i in rows]
        out.append((keys[rows[0]], rewards, [float(costs[i]) for i in rows] if costs is not None else None))
    return out


class _DrawIterator(Iterator[int]):
    """One pass of the sampler (``len(dataset)`` rows). ``Stateful`` (its position in the pass), so torchdata's
    ``StatefulDataLoader`` restores it instead of fast-forwarding through -- and drawing -- old rows."""

    def __init__(self, owner: EnvSchedVerlSampler) -> None:
        self.owner = owner
        self.pos = 0

    def __next__(self) -> int:
        if self.pos >= len(self.owner):
            raise StopIteration
        row = self.owner._next_row()
        self.pos += 1
        return row

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.pos = int(state_dict.get("pos", 0))


class EnvSchedVerlSampler(_Base):  # type: ignore[misc, valid-type]
    """verl ``train_sampler`` drawing dataset rows from an envsched :class:`TaskSampler`.

    Args:
        data_source: the training dataset (verl's ``RLHFDataset``; any sized dataset whose rows carry
            ``extra_info``); one row per task.
        data_config: verl's ``config.data``; ``data.sampler.envsched`` configures the task sampler when
            ``task_sampler`` is not given, and ``gen_batch_size``/``train_batch_size`` the draw size.
        task_sampler: a ready sampler over specs whose ids are the rows' keys.
        tasks: task specs (default: ``task_sampler.tasks``; with neither, specs ``{id, env, index}`` are built
            from the rows, or read from ``envsched.pool``).
        batch_size: tasks per ``sample`` call (default: the config's batch size, else 1).
        key_field: the ``extra_info`` field holding a row's task key.
    """

    def __init__(self, data_source: Sized, data_config: Any = None, *, task_sampler: TaskSampler | None = None,
                 tasks: Sequence[Any] | None = None, batch_size: int | None = None,
                 key_field: str | None = None) -> None:
        es_cfg = _cfg_get(_cfg_get(data_config, "sampler"), "envsched") or {}
        self.key_field = key_field or _cfg_get(es_cfg, "key_field", "task_id")
        self.data_source = data_source
        rows = _dataset_rows(data_source, self.key_field)
        self._row_of: dict[str, int] = {}
        for i, (k, _) in enumerate(rows):
            if k in self._row_of:
                raise ValueError(f"task key {k!r} names dataset rows {self._row_of[k]} and {i}: keys must be unique")
            self._row_of[k] = i
        if task_sampler is None:
            if tasks is None:
                pool_path = _cfg_get(es_cfg, "pool")
                tasks = (list(TaskPool.from_file(pool_path)) if pool_path
                         else [{"id": k, "env": env or "default", "index": i} for i, (k, env) in enumerate(rows)])
            from envsched.samplers.registry import make_sampler

            options = dict(_cfg_get(es_cfg, "options", {}) or {})
            task_sampler = make_sampler(str(_cfg_get(es_cfg, "sampler", "uniform")), list(tasks),
                                        seed=int(_cfg_get(es_cfg, "seed", 0)),
                                        group_size=int(_cfg_get(es_cfg, "group_size", 8)), **options)
        for m in ("sample", "update", "state_dict", "load_state_dict"):
            if not callable(getattr(task_sampler, m, None)):
                raise TypeError(f"task_sampler must be an envsched TaskSampler; {type(task_sampler).__name__} "
                                f"has no {m}()")
        self.task_sampler = task_sampler
        specs = list(tasks) if tasks is not None else list(getattr(task_sampler, "tasks", []) or [])
        self._spec_of: dict[str, Any] = {task_key(s): s for s in specs}
        missing = [k for k in self._spec_of if k not in self._row_of]
        if missing:
            raise ValueError(f"{len(missing)} task(s) have no dataset row (by extra_info[{self.key_field!r}]), "
                             f"e.g. {missing[:3]}")
        if batch_size is None:
            batch_size = _cfg_get(data_config, "gen_batch_size") or _cfg_get(data_config, "train_batch_size") or 1
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        self._queue: deque[int] = deque()
        self._unreported: deque[list[str]] = deque()  # drawn batches whose update() has not come

    # ------------------------------------------------------------------ torch Sampler
    def __len__(self) -> int:
        return len(self.data_source)

    def __iter__(self) -> Iterator[int]:
        return _DrawIterator(self)

    def _next_row(self) -> int:
        if not self._queue:
            drawn = self.task_sampler.sample(self.batch_size)
            if not drawn:
                raise StopIteration
            keys = [task_key(t) for t in drawn]
            for k, t in zip(keys, drawn, strict=True):
                if k not in self._row_of:
                    raise KeyError(f"the sampler drew task {k!r}, which has no dataset row")
                self._spec_of.setdefault(k, t)
            self._queue.extend(self._row_of[k] for k in keys)
            self._unreported.append(keys)
        return self._queue.popleft()

    # ------------------------------------------------------------------ feedback
    def update(self, batch: Any) -> None:
        """Report every prompt group of a finished step's ``DataProto`` (see :func:`groups_from_batch`)."""
        groups = groups_from_batch(batch, self.key_field)
        for key, _, _ in groups:
            if key not in self._spec_of and key not in self._row_of:
                raise KeyError(f"the batch reports task {key!r}, unknown to this sampler")
        for key, rewards, costs in groups:
            self.task_sampler.update(self._spec_of.get(key, key), rewards, costs)
        reported = [k for k, _, _ in groups]
        while self._unreported and set(self._unreported[0]) <= set(reported):
            self._unreported.popleft()

    def metrics(self) -> dict[str, float]:
        """The task sampler's metrics (for logging next to verl's)."""
        m = getattr(self.task_sampler, "metrics", None)
        return {f"envsched/{k}": float(v) for k, v in m().items()} if callable(m) else {}

    # ------------------------------------------------------------------ checkpoints (torchdata Stateful)
    def state_dict(self) -> dict[str, Any]:
        return {"format": VERL_STATE_FORMAT, "sampler": self.task_sampler.state_dict(), "queue": list(self._queue),
                "unreported": [list(b) for b in self._unreported]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output, then release the dispatches of batches whose feedback never came
        (verl checkpoints before the step's ``update``). ``ValueError`` (nothing changed) if it does not fit."""
        if not isinstance(state_dict, Mapping) or state_dict.get("format") != VERL_STATE_FORMAT:
            raise ValueError("not an EnvSchedVerlSampler state")
        queue = [int(i) for i in state_dict.get("queue", [])]
        if any(not 0 <= i < len(self) for i in queue):
            raise ValueError("state queues rows outside the dataset")
        self.task_sampler.load_state_dict(state_dict["sampler"])
        self._queue = deque(queue)
        discard = getattr(self.task_sampler, "discard", None)
        for keys in state_dict.get("unreported", []):
            for k in keys:
                if callable(discard):
                    with contextlib.suppress(KeyError, ValueError):
                        discard(self._spec_of.get(k, k))
        self._unreported = deque()
