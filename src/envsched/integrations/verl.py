# Over 700 lines: one module per trainer, as for TRL; verl's v0 sampler, v1 replay buffer, v1 trainer and task
# runner share its import guard, config readers and checkpoint folders.
"""verl integration: envsched chooses verl's prompts and learns from every finished group.

verl 0.9.1's trainer is the v1 ``PPOTrainer`` (``trainer.use_v1=true``, the default); its v0 ``RayPPOTrainer``
is deprecated ("will be removed in v0.9.0"). envsched plugs into the v1 trainer two ways:

**Your own Python entrypoint**: :class:`EnvSchedPPOTrainer` is verl's v1 sync trainer (``PPOTrainerSync``)
with :class:`EnvSchedReplayBuffer` built in and, optionally, a ready envsched sampler
(``EnvSchedPPOTrainer(config, task_sampler=...)``: a ``DurableSampler`` on a store, say). Run it with verl's own
``run_ppo(config, task_runner_class=envsched_task_runner(make_task_sampler))``, which does what verl's
``main_ppo`` does with this trainer class.

**verl's command line** (``python -m verl.trainer.main_ppo``):
``trainer.v1.sampler.custom_sampler.path=pkg://envsched.integrations.verl``,
``trainer.v1.sampler.custom_sampler.name=EnvSchedReplayBuffer`` and ``trainer.v1.sampler.sampler_kwargs``
(``sampler``, ``seed``, ``group_size``, ``pool``, ``key_field``, ``reward_range``, ``options``). verl itself warns
there that its ``load_extern_type`` (which reads any ``custom_sampler``) is deprecated; the Python entrypoint
does not go through it.

Either way the buffer replaces the trainer's training loader with one drawing from an
:class:`EnvSchedVerlSampler` and reports every finished (or failed) prompt group to the sampler on each poll,
before any eviction.

**Checkpoints**: ``envsched_sampler.json`` (the sampler's state, including its reward scale) goes into every
``global_step_N`` folder and is restored on every resume path -- including resumes at an epoch boundary, where
verl 0.9.1 skips its own ``data.pt``. A checkpoint folder without the file is refused.

**Refused config**: on verl >= 0.8, ``create_rl_sampler`` no longer reads ``data.sampler``; a
``data.sampler.class_path`` naming envsched would silently train without it, so every envsched entry point
(:func:`check_verl_config`) raises with the supported way instead.

**Legacy trainers**: :class:`EnvSchedRayPPOTrainer` (a ``RayPPOTrainer`` subclass, ``trainer.use_v1=false``,
``train_sampler=EnvSchedVerlSampler(train_dataset, task_sampler=...)``, fed right after ``compute_advantage``)
is kept for runs that stay on verl's deprecated v0 trainer, and verl warns when one is built. verl 0.7.1
(``data.sampler.class_path: pkg://envsched.integrations.verl``, ``class_name: EnvSchedVerlSampler``) is
accepted there; not tested in CI.

Rewards: a row's reward is ``rm_scores.sum(-1)`` (v1) or ``token_level_scores.sum(-1)`` (v0), of any scale:
they pass through :class:`~envsched.integrations._rewards.RewardScale` (``reward_range=`` given, else learned),
NaN/inf reach the sampler as ``None`` and are counted in ``metrics()["envsched/rewards_nonfinite"]``.
Costs are response tokens.

verl is imported lazily: importing this module does not import verl.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

import envsched.validation as _check
from envsched.errors import StateError
from envsched.integrations._checkpoint import SAMPLER_STATE_FILE, read_state_file, write_state_file
from envsched.integrations._rewards import RewardScale
from envsched.pool.pool import TaskPool
from envsched.pool.spec import task_key
from envsched.samplers.base import TaskSampler
from envsched.validation import check_int

# EnvSchedPPOTrainer, EnvSchedReplayBuffer and EnvSchedRayPPOTrainer subclass verl's classes: built on first
# access (__getattr__)
__all__ = ["SAMPLER_STATE_FILE", "VERL_STATE_FORMAT", "EnvSchedPPOTrainerMixin", "EnvSchedVerlSampler",
           "check_verl_config", "envsched_task_runner", "groups_from_batch", "load_sampler_state",
           "save_sampler_state"]

#: File written into every verl ``global_step_N`` checkpoint folder.
VERL_STATE_FORMAT = "envsched.verl/2"
_FILE_FORMAT = "envsched.verl.checkpoint/1"


def _verl_version() -> tuple[int, ...] | None:
    """The installed verl's version as a tuple (without importing verl), ``None`` when not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("verl")
    except PackageNotFoundError:
        return None
    parts = []
    for p in v.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


_VERSION = _verl_version()
_Base: Any = Sampler
if _VERSION is not None and _VERSION < (0, 8):  # legacy 0.7.x: satisfy create_rl_sampler's isinstance check
    try:
        from verl.experimental.dataset.sampler import AbstractCurriculumSampler as _Base
    except Exception:
        _Base = Sampler


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    getter = getattr(cfg, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:
            return default
    return getattr(cfg, key, default)


_RIGHT_WAY = ("with verl >= 0.8 use the v1 trainer: envsched.integrations.verl.EnvSchedPPOTrainer(config, "
              "task_sampler=...) from your own entrypoint, or trainer.v1.sampler.custom_sampler.path=pkg://"
              "envsched.integrations.verl and trainer.v1.sampler.custom_sampler.name=EnvSchedReplayBuffer on "
              "verl's command line (see docs/trainers.md)")


def check_verl_config(config: Any, version: tuple[int, ...] | None = None) -> None:
    """Refuse a ``data.sampler.class_path`` naming envsched on verl >= 0.8 (``version`` defaults to the
    installed verl's): verl 0.8+ ignores ``data.sampler``, so that config would train without envsched and
    without an error. ``config`` is verl's full config (or anything with ``data.sampler``)."""
    version = version if version is not None else _VERSION
    data = _cfg_get(config, "data", None)
    sampler_cfg = _cfg_get(data if data is not None else config, "sampler", None)
    class_path = _cfg_get(sampler_cfg, "class_path", None)
    class_name = _cfg_get(sampler_cfg, "class_name", None)
    names_envsched = "envsched" in str(class_path or "") or str(class_name or "") == "EnvSchedVerlSampler"
    if names_envsched and version is not None and version >= (0, 8):
        v = ".".join(map(str, version))
        raise ValueError(f"data.sampler.class_path={class_path!r} is ignored by verl {v} (create_rl_sampler no "
                         "longer reads data.sampler, so this run would train without envsched); remove it and "
                         f"{_RIGHT_WAY}")


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


Group = tuple[str, list[float], list[float] | None]


def _row_keys(ntb: Mapping[str, Any], n: int, key_field: str) -> list[str]:
    if key_field in ntb:
        keys: list[str | None] = [str(k) for k in ntb[key_field]]
    elif "extra_info" in ntb:
        keys = [_row_key(e, key_field) for e in ntb["extra_info"]]
    elif "index" in ntb:
        keys = [str(k) for k in ntb["index"]]
    else:
        raise ValueError(f"the batch names no task: no {key_field!r}, 'extra_info' or 'index' in non_tensor_batch")
    if len(keys) != n:
        raise ValueError(f"{len(keys)} task keys for {n} rows")
    if any(k is None for k in keys):
        bad = next(i for i, k in enumerate(keys) if k is None)
        raise ValueError(f"row {bad} of the batch has no task key (extra_info lacks {key_field!r} and 'index')")
    return [str(k) for k in keys]


def groups_from_batch(batch: Any, key_field: str = "task_id", score_key: str = "token_level_scores") -> list[Group]:
    """``(task key, rewards, costs)`` per prompt group of a verl ``DataProto`` batch, in batch order.

    Rows are grouped by ``non_tensor_batch["uid"]``; a row's task key is ``non_tensor_batch[key_field]`` when
    that column exists, else ``extra_info[key_field]`` (else ``extra_info["index"]``, else ``index``). The reward
    is ``batch[score_key].sum(-1)`` as a float (NaN/inf kept: the caller decides), the cost
    ``response_mask.sum(-1)`` when present. Raises ``ValueError`` when a group mixes tasks or a row has no key."""
    ntb = batch.non_tensor_batch
    tb = batch.batch
    uids = list(ntb["uid"])
    n = len(uids)
    keys = _row_keys(ntb, n, key_field)
    if score_key not in tb.keys():  # noqa: SIM118 (TensorDict has no `in`)
        raise ValueError(f"the batch has no {score_key!r}: feed it after the step's rewards are computed")
    scores = torch.as_tensor(tb[score_key]).detach().to("cpu", torch.float64).sum(-1).tolist()
    if len(scores) != n:
        raise ValueError(f"{len(scores)} reward rows for {n} uids")
    costs = None
    if "response_mask" in tb.keys():  # noqa: SIM118
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
        rewards = [float(scores[i]) for i in rows]
        out.append((keys[rows[0]], rewards, [float(costs[i]) for i in rows] if costs is not None else None))
    return out


class _DrawIterator(Iterator[int]):
    """One pass of the sampler. ``Stateful`` (its position in the pass), so torchdata's ``StatefulDataLoader``
    restores it instead of fast-forwarding through -- and drawing -- old rows."""

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
        try:
            self.pos = _check.whole(_check.mapping(state_dict, "").get("pos", 0), "pos")
        except StateError as exc:
            raise exc.within(owner="_DrawIterator") from None


class EnvSchedVerlSampler(_Base):
    """verl ``train_sampler`` drawing dataset rows from an envsched :class:`TaskSampler`.

    Args:
        data_source: the training dataset (verl's ``RLHFDataset``; any sized dataset whose rows carry
            ``extra_info``); one row per task.
        data_config: verl's ``config.data``; ``data.sampler.envsched`` configures the task sampler when
            ``task_sampler`` is not given (legacy 0.7.1 path), ``gen_batch_size``/``train_batch_size`` the draw
            size. A ``data.sampler.class_path`` naming envsched is refused on verl >= 0.8.
        task_sampler: a ready sampler over specs whose ids are the rows' keys.
        tasks: task specs (default: ``task_sampler.tasks``; with neither, specs ``{id, env, index}`` are built
            from the rows, or read from ``envsched.pool``).
        batch_size: tasks per ``sample`` call (default: the config's batch size, else 1); one pass of the
            sampler is the largest multiple of it that fits the dataset, so no drawn row is dropped by verl's
            ``drop_last`` loader.
        key_field: the ``extra_info`` field holding a row's task key.
        reward_range: the range of verl's scores (``None``: learned, see
            :class:`~envsched.integrations._rewards.RewardScale`).
    """

    def __init__(self, data_source: Sized, data_config: Any = None, *, task_sampler: TaskSampler | None = None,
                 tasks: Sequence[Any] | None = None, batch_size: int | None = None,
                 key_field: str | None = None, reward_range: Sequence[float] | None = None) -> None:
        if data_config is not None:
            check_verl_config({"sampler": _cfg_get(data_config, "sampler")})
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
            if reward_range is None and _cfg_get(es_cfg, "reward_range") is not None:
                reward_range = list(_cfg_get(es_cfg, "reward_range"))
        for m in ("sample", "update", "state_dict", "load_state_dict"):
            if not callable(getattr(task_sampler, m, None)):
                raise TypeError(f"task_sampler must be an envsched TaskSampler; {type(task_sampler).__name__} "
                                f"has no {m}()")
        self.task_sampler = task_sampler
        self.reward_scale = RewardScale.for_sampler(task_sampler, reward_range)
        specs = list(tasks) if tasks is not None else list(getattr(task_sampler, "tasks", []) or [])
        self._spec_of: dict[str, Any] = {task_key(s): s for s in specs}
        missing = [k for k in self._spec_of if k not in self._row_of]
        if missing:
            raise ValueError(f"{len(missing)} task(s) have no dataset row (by extra_info[{self.key_field!r}]), "
                             f"e.g. {missing[:3]}")
        if batch_size is None:
            batch_size = _cfg_get(data_config, "gen_batch_size") or _cfg_get(data_config, "train_batch_size") or 1
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self._queue: deque[int] = deque()
        # drawn groups whose feedback has not come: task key -> count (at most one entry per task)
        self._unreported: dict[str, int] = {}
        self._loaded_nonce: str | None = None  # the state last loaded, while nothing changed since
        self.reported_groups = 0

    # ------------------------------------------------------------------ torch Sampler
    def __len__(self) -> int:
        n = len(self.data_source)
        return (n // self.batch_size) * self.batch_size or n

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
            for k in keys:
                self._unreported[k] = self._unreported.get(k, 0) + 1
            self._loaded_nonce = None
        return self._queue.popleft()

    @property
    def unreported(self) -> dict[str, int]:
        """Groups drawn whose feedback has not come yet, per task key (a copy). Kept as counts per task, so it
        never holds more entries than there are tasks, however many batches are reported partly or out of
        order; a checkpoint stores it and a resume discards those dispatches in the task sampler."""
        return dict(self._unreported)

    def row_of(self, key: str) -> int:
        """The dataset row of task ``key``."""
        return self._row_of[key]

    # ------------------------------------------------------------------ feedback
    def report_groups(self, groups: Sequence[Group]) -> None:
        """Report ``(task key, rewards, costs)`` groups: rewards of any scale pass through :attr:`reward_scale`
        (NaN/inf become ``None``, counted); checks every key before reporting any group."""
        for key, _, _ in groups:
            if key not in self._spec_of and key not in self._row_of:
                raise KeyError(f"the batch reports task {key!r}, unknown to this sampler")
        for key, rewards, costs in groups:
            self._loaded_nonce = None
            self.task_sampler.update(self._spec_of.get(key, key), self.reward_scale.map(rewards), costs)
            self.reported_groups += 1
            c = self._unreported.get(key, 0)
            if c > 1:
                self._unreported[key] = c - 1
            elif c == 1:
                del self._unreported[key]

    def update(self, batch: Any, score_key: str = "token_level_scores") -> None:
        """Report every prompt group of a finished step's ``DataProto`` (see :func:`groups_from_batch`)."""
        self.report_groups(groups_from_batch(batch, self.key_field, score_key))

    def metrics(self) -> dict[str, float]:
        """The task sampler's metrics and the reward scale's counters, prefixed ``envsched/``."""
        m = getattr(self.task_sampler, "metrics", None)
        out = {f"envsched/{k}": float(v) for k, v in m().items()} if callable(m) else {}
        out.update({f"envsched/{k}": float(v) for k, v in self.reward_scale.metrics().items()})
        return out

    # ------------------------------------------------------------------ checkpoints (torchdata Stateful)
    def state_dict(self) -> dict[str, Any]:
        return {"format": VERL_STATE_FORMAT, "nonce": uuid.uuid4().hex, "sampler": self.task_sampler.state_dict(),
                "reward_scale": self.reward_scale.state_dict(), "queue": list(self._queue),
                "unreported": [[k for k, c in self._unreported.items() for _ in range(c)]],
                "reported_groups": self.reported_groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output, then release the dispatches of batches whose feedback never came.
        Loading the state just loaded again (verl's ``data.pt`` after ``envsched_sampler.json``) changes nothing.
        ``ValueError`` (nothing changed) if it does not fit."""
        if not isinstance(state_dict, Mapping) or state_dict.get("format") != VERL_STATE_FORMAT:
            raise ValueError("not an EnvSchedVerlSampler state")
        if state_dict.get("nonce") is not None and state_dict.get("nonce") == self._loaded_nonce:
            return
        try:  # every plain field checked before the sampler's own state is loaded
            raw_queue = _check.sequence(state_dict.get("queue", []), "queue")
            queue = _check.int_array(raw_queue, "queue", low=-(2**62), high=2**62).tolist()
            reported_groups = _check.whole(state_dict.get("reported_groups", 0), "reported_groups")
            unreported = _check.sequence(state_dict.get("unreported", []), "unreported")
            for i, keys in enumerate(unreported):
                _check.sequence(keys, f"unreported[{i}]")
            _check.mapping(state_dict, "", keys=("reward_scale", "sampler"))
        except StateError as exc:
            raise exc.within(owner="EnvSchedVerlSampler") from None
        if any(not 0 <= i < len(self.data_source) for i in queue):
            raise ValueError("state queues rows outside the dataset")
        scale = RewardScale(self.reward_scale.target, self.reward_scale.source if self.reward_scale.fixed else None)
        scale.load_state_dict(state_dict["reward_scale"])
        self.task_sampler.load_state_dict(state_dict["sampler"])
        self.reward_scale = scale
        self._queue = deque(queue)
        discard = getattr(self.task_sampler, "discard", None)
        for keys in unreported:
            for k in keys:
                if callable(discard):
                    with contextlib.suppress(KeyError, ValueError):
                        discard(self._spec_of.get(k, k))
        self._unreported = {}
        self.reported_groups = reported_groups
        self._loaded_nonce = state_dict.get("nonce")


# ---------------------------------------------------------------------------------------------- checkpoints
def save_sampler_state(sampler: EnvSchedVerlSampler, folder: str, global_step: int) -> str:
    """Write ``folder/envsched_sampler.json`` (atomically) and return its path."""
    os.makedirs(folder, exist_ok=True)
    return write_state_file(folder, {"format": _FILE_FORMAT, "global_step": int(global_step),
                                     "state": sampler.state_dict()})


def load_sampler_state(sampler: EnvSchedVerlSampler, folder: str) -> None:
    """Restore ``sampler`` from ``folder/envsched_sampler.json``: ``FileNotFoundError`` when the checkpoint has
    none (written without envsched: its draws cannot resume), ``ValueError`` when it does not fit."""
    path, state = read_state_file(folder)
    if not isinstance(state, dict) or state.get("format") != _FILE_FORMAT:
        raise ValueError(f"{path}: not an envsched verl checkpoint file")
    sampler.load_state_dict(state["state"])


def _resume_folder(config: Any, global_steps: int) -> str | None:
    """The ``global_step_N`` folder verl resumed from (``None`` when it did not resume), by verl's own rule."""
    trainer = config.trainer
    if trainer.resume_mode == "disable" or global_steps <= 0:
        return None
    if trainer.resume_mode == "resume_path":
        folder = str(trainer.resume_from_path)
    else:
        folder = os.path.join(str(trainer.default_local_dir), f"global_step_{global_steps}")
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)


def _checkpoint_folder(config: Any, global_steps: int) -> str:
    return os.path.join(str(config.trainer.default_local_dir), f"global_step_{global_steps}")


# ---------------------------------------------------------------------------------------------- v0 trainer
class EnvSchedPPOTrainerMixin:
    """The envsched part of :class:`EnvSchedRayPPOTrainer` (put it before ``RayPPOTrainer``, or before a
    subclass of it, in the bases). ``train_sampler`` must be an :class:`EnvSchedVerlSampler`."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        check_verl_config(config)
        sampler = kwargs.get("train_sampler")
        if not isinstance(sampler, EnvSchedVerlSampler):
            raise TypeError(f"train_sampler must be an EnvSchedVerlSampler, got {type(sampler).__name__}: build it "
                            "with EnvSchedVerlSampler(train_dataset, task_sampler=...)")
        self._envsched_fed_step: int | None = None
        super().__init__(config, *args, **kwargs)

    @property
    def envsched_sampler(self) -> EnvSchedVerlSampler:
        return self.train_dataloader.sampler

    def envsched_feed(self, batch: Any) -> None:
        """Report this step's batch to the sampler, once per step (the first of ``_update_critic`` /
        ``_update_actor`` calls it, right after ``compute_advantage``)."""
        step = int(getattr(self, "global_steps", 0))
        if self._envsched_fed_step == step:
            return
        self.envsched_sampler.update(batch)
        self._envsched_fed_step = step

    def _update_critic(self, batch: Any) -> Any:
        self.envsched_feed(batch)
        return super()._update_critic(batch)

    def _update_actor(self, batch: Any) -> Any:
        self.envsched_feed(batch)
        return super()._update_actor(batch)

    def _save_checkpoint(self) -> None:
        super()._save_checkpoint()
        save_sampler_state(self.envsched_sampler, _checkpoint_folder(self.config, self.global_steps),
                           self.global_steps)

    def _load_checkpoint(self) -> Any:
        out = super()._load_checkpoint()
        folder = _resume_folder(self.config, int(getattr(self, "global_steps", 0)))
        if folder is not None:
            load_sampler_state(self.envsched_sampler, folder)
        return out


# ---------------------------------------------------------------------------------------------- v1 trainer
def _make_replay_buffer_class() -> type:
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    class _EnvSchedReplayBuffer(ReplayBuffer):
        """verl v1 ``ReplayBuffer`` drawing prompts from an envsched sampler and reporting every finished group.

        Configure with ``trainer.v1.sampler.custom_sampler.{path: pkg://envsched.integrations.verl, name:
        EnvSchedReplayBuffer}`` and ``trainer.v1.sampler.sampler_kwargs``: ``sampler`` (an
        ``envsched.samplers.registry`` name), ``seed``, ``group_size``, ``pool`` (task specs file), ``key_field``,
        ``reward_range``, ``options``. Sync trainer mode only (the default).
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if self.trainer_mode != "sync":
                raise ValueError(f"EnvSchedReplayBuffer supports trainer.v1.trainer_mode=sync, got "
                                 f"{self.trainer_mode!r}")
            trainer = getattr(self.refill_fn, "__self__", None)
            if trainer is None:
                raise TypeError("EnvSchedReplayBuffer must be built by verl's v1 trainer (refill_fn is not a "
                                "trainer method)")
            check_verl_config(trainer.config)
            self.trainer = trainer
            self.envsched_sampler: EnvSchedVerlSampler | None = None
            # a ready task sampler (EnvSchedPPOTrainer's task_sampler=); None: built from sampler_kwargs
            self.envsched_task_sampler: TaskSampler | None = None
            # prompt uid -> task key, for prompts fetched and not yet reported (removed when reported)
            self._uid_key: dict[str, str] = {}
            _patch_v1_trainer(trainer, self)

        def _sync_metadata_from_transfer_queue(self) -> None:
            super()._sync_metadata_from_transfer_queue()
            self.envsched_report("train")

        def envsched_report(self, partition_id: str) -> None:
            """Report every terminal (finished or failed) prompt group not reported yet -- before eviction."""
            import transfer_queue as tq

            if self.envsched_sampler is None:
                return
            terminal = self.finished_keys[partition_id] | self.failure_keys[partition_id]
            terminal = {u for u in terminal if u in self._uid_key}  # reported uids have left _uid_key
            if not terminal:
                return
            traj = sorted(k for k in self.partitions[partition_id] if k.split("_")[0] in terminal)
            scores: dict[str, float] = {}
            if traj:
                data = tq.kv_batch_get(keys=traj, partition_id=partition_id, select_fields=["rm_scores"])
                for k, v in zip(traj, list(data["rm_scores"]), strict=True):
                    scores[k] = float(torch.as_tensor(v).to(torch.float64).sum().item())
            n = int(self.trainer.config.actor_rollout_ref.rollout.n)
            groups: list[Group] = []
            for uid in sorted(terminal, key=lambda u: self.prompt_global_steps[partition_id].get(u, 0)):
                keys = [k for k in traj if k.split("_")[0] == uid]
                rewards: list[float | None] = [scores[k] for k in keys]
                costs = [float(self.partitions[partition_id][k].get("response_len", 0)) for k in keys]
                rewards += [None] * max(0, n - len(keys))  # failed sessions: unscored rollouts
                costs += [0.0] * max(0, n - len(costs))
                groups.append((self._uid_key[uid], rewards, costs))  # type: ignore[arg-type]
            self.envsched_sampler.report_groups(groups)
            for uid in terminal:
                del self._uid_key[uid]

        def metrics(self) -> dict[str, float]:
            return self.envsched_sampler.metrics() if self.envsched_sampler is not None else {}

    _EnvSchedReplayBuffer.__name__ = _EnvSchedReplayBuffer.__qualname__ = "EnvSchedReplayBuffer"
    _EnvSchedReplayBuffer.__module__ = __name__
    return _EnvSchedReplayBuffer


def _patch_v1_trainer(trainer: Any, buffer: Any) -> None:
    """Wire the buffer's sampler into a v1 trainer instance: its training loader draws from the sampler, each
    fetched prompt's uid is mapped to its task, and checkpoints carry the sampler state."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    init_dataloader = trainer._init_dataloader
    fetch = trainer._fetch_one_gen_batch
    save = trainer._save_checkpoint
    load = trainer._load_checkpoint
    kw = dict(buffer.sampler_kwargs or {})

    def _init_dataloader() -> None:
        init_dataloader()
        old = trainer.train_dataloader
        data_cfg = trainer.config.data
        batch = int(_cfg_get(data_cfg, "gen_batch_size") or _cfg_get(data_cfg, "train_batch_size"))
        if buffer.envsched_task_sampler is not None:
            reward_range = kw.get("reward_range")
            sampler = EnvSchedVerlSampler(old.dataset, task_sampler=buffer.envsched_task_sampler, batch_size=batch,
                                          key_field=kw.get("key_field"),
                                          reward_range=list(reward_range) if reward_range is not None else None)
        else:
            sampler = EnvSchedVerlSampler(old.dataset, {"sampler": {"envsched": kw}}, batch_size=batch)
        trainer.train_dataloader = StatefulDataLoader(dataset=old.dataset, batch_size=old.batch_size,
                                                      num_workers=old.num_workers, drop_last=True,
                                                      collate_fn=old.collate_fn, sampler=sampler)
        trainer.train_dataloader_it = None
        buffer.envsched_sampler = sampler

    def _fetch_one_gen_batch() -> Any:
        batch = fetch()
        sampler = buffer.envsched_sampler
        uids = list(batch["uid"])
        extra = batch.get("extra_info", None) if hasattr(batch, "get") else None
        extras = list(extra) if extra is not None else [None] * len(uids)
        for uid, e in zip(uids, extras, strict=True):
            k = _row_key(getattr(e, "data", e), sampler.key_field)
            if k is None:
                raise ValueError(f"prompt {uid} has no task key (extra_info lacks {sampler.key_field!r}/'index')")
            buffer._uid_key[str(uid)] = k
        return batch

    def _save_checkpoint() -> None:
        save()
        save_sampler_state(buffer.envsched_sampler, _checkpoint_folder(trainer.config, trainer.global_steps),
                           trainer.global_steps)

    def _load_checkpoint() -> Any:
        out = load()
        folder = _resume_folder(trainer.config, int(getattr(trainer, "global_steps", 0)))
        if folder is not None:
            load_sampler_state(buffer.envsched_sampler, folder)
        return out

    trainer._init_dataloader = _init_dataloader
    trainer._fetch_one_gen_batch = _fetch_one_gen_batch
    trainer._save_checkpoint = _save_checkpoint
    trainer._load_checkpoint = _load_checkpoint


def _make_v1_trainer_class() -> type:
    from verl.trainer.ppo.v1 import PPOTrainerSync

    class _EnvSchedPPOTrainer(PPOTrainerSync):
        """verl's v1 sync trainer (``PPOTrainerSync``) drawing its prompts from envsched.

        Args:
            config: verl's full ``ppo_trainer`` config (``trainer.v1.trainer_mode`` must be ``sync``);
                ``trainer.v1.sampler.sampler_kwargs`` configures the sampler as for the command line (``sampler``,
                ``seed``, ``group_size``, ``pool``, ``key_field``, ``reward_range``, ``options``).
            task_sampler: a ready envsched sampler over specs whose ids are the dataset rows' keys
                (``extra_info.task_id``); ``None`` builds one from ``sampler_kwargs``.

        Its replay buffer is an :class:`EnvSchedReplayBuffer`, built directly (not through verl's
        ``custom_sampler`` loader): a ``custom_sampler`` naming another class is refused.
        """

        def __init__(self, config: Any, task_sampler: TaskSampler | None = None) -> None:
            if task_sampler is not None:
                for m in ("sample", "update", "state_dict", "load_state_dict"):
                    if not callable(getattr(task_sampler, m, None)):
                        raise TypeError(f"task_sampler must be an envsched TaskSampler; "
                                        f"{type(task_sampler).__name__} has no {m}()")
            self._envsched_task_sampler = task_sampler
            super().__init__(config)

        def _build_replay_buffer(self) -> Any:
            sampler_config = self.config.trainer.v1.sampler
            custom = sampler_config.get("custom_sampler", None)
            if custom is not None and custom.get("path") and custom.get("name") and (
                    custom.get("name") != "EnvSchedReplayBuffer" or "envsched" not in str(custom.get("path"))):
                raise ValueError(f"trainer.v1.sampler.custom_sampler names {custom.get('path')}:"
                                 f"{custom.get('name')}, but EnvSchedPPOTrainer builds its own replay buffer "
                                 "(EnvSchedReplayBuffer): remove custom_sampler")
            buffer = __getattr__("EnvSchedReplayBuffer")(
                trainer_mode=self.trainer_mode, trainer_config=self.config.trainer.v1.get(self.trainer_mode, {}),
                max_off_policy_threshold=sampler_config.max_off_policy_threshold,
                max_off_policy_strategy=sampler_config.max_off_policy_strategy,
                sampler_kwargs=sampler_config.sampler_kwargs, refill_fn=self._add_prompts_to_generate)
            buffer.envsched_task_sampler = self._envsched_task_sampler
            return buffer

    _EnvSchedPPOTrainer.__name__ = _EnvSchedPPOTrainer.__qualname__ = "EnvSchedPPOTrainer"
    _EnvSchedPPOTrainer.__module__ = __name__
    return _EnvSchedPPOTrainer


def envsched_task_runner(make_task_sampler: Callable[[Any], TaskSampler] | None = None) -> Any:
    """A Ray actor class for verl's ``run_ppo(config, task_runner_class=...)``: verl's own v1 task runner
    (``TaskRunnerV1``: TransferQueue, the agent loop manager, ``fit``) with :class:`EnvSchedPPOTrainer` as the
    trainer. ``make_task_sampler(config)`` builds the task sampler inside the runner's process (``None``: the
    trainer builds it from ``trainer.v1.sampler.sampler_kwargs``); it is pickled into that process, so it must
    be a module-level function or a picklable callable.

    ``TaskRunnerV1.run`` looks up its trainer class with ``verl.trainer.ppo.v1.get_trainer_cls``; the runner
    answers that lookup with :class:`EnvSchedPPOTrainer` during its own ``run`` (in its own process). Raises
    ``RuntimeError`` naming the supported version when the installed verl's runner no longer does that."""
    import inspect

    import ray
    from verl.trainer.main_ppo import TaskRunnerV1

    base = TaskRunnerV1.__ray_actor_class__
    if "get_trainer_cls(" not in inspect.getsource(base.run):
        raise RuntimeError(f"verl {'.'.join(map(str, _VERSION or ()))}'s TaskRunnerV1.run no longer looks its trainer "
                           "up with get_trainer_cls; envsched_task_runner supports verl 0.9.1")

    class EnvSchedTaskRunner(base):  # type: ignore[misc, valid-type]
        """verl's ``TaskRunnerV1`` whose trainer is :class:`EnvSchedPPOTrainer`."""

        def run(self, config: Any) -> Any:
            import verl.trainer.ppo.v1 as v1

            trainer_cls = __getattr__("EnvSchedPPOTrainer")
            lookup = v1.get_trainer_cls

            def build(config: Any) -> Any:
                task_sampler = make_task_sampler(config) if make_task_sampler is not None else None
                return trainer_cls(config, task_sampler=task_sampler)

            def get_trainer_cls(name: str) -> Any:
                if name != "sync":
                    raise ValueError(f"EnvSchedPPOTrainer supports trainer.v1.trainer_mode=sync, got {name!r}")
                return build

            v1.get_trainer_cls = get_trainer_cls
            try:
                return super().run(config)
            finally:
                v1.get_trainer_cls = lookup

    return ray.remote(EnvSchedTaskRunner)


_LAZY: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``EnvSchedPPOTrainer``, ``EnvSchedReplayBuffer`` and ``EnvSchedRayPPOTrainer`` subclass verl's classes:
    built (importing verl) on first access."""
    if name == "EnvSchedPPOTrainer":
        if name not in _LAZY:
            _LAZY[name] = _make_v1_trainer_class()
        return _LAZY[name]
    if name == "EnvSchedRayPPOTrainer":
        if name not in _LAZY:
            from verl.trainer.ppo.ray_trainer import RayPPOTrainer

            cls = type("EnvSchedRayPPOTrainer", (EnvSchedPPOTrainerMixin, RayPPOTrainer),
                       {"__module__": __name__, "__doc__": "verl's deprecated v0 ``RayPPOTrainer`` drawing from an "
                        "envsched sampler (verl warns when one is built; the v1 trainer is "
                        ":class:`EnvSchedPPOTrainer`); see :class:`EnvSchedPPOTrainerMixin` and the module "
                        "docstring."})
            _LAZY[name] = cls
        return _LAZY[name]
    if name == "EnvSchedReplayBuffer":
        if name not in _LAZY:
            _LAZY[name] = _make_replay_buffer_class()
        return _LAZY[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
