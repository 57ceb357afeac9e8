"""TRL integration, asynchronous: train with ``AsyncGRPOTrainer`` on tasks drawn from any envsched :class:`TaskSampler`.

Targets TRL 1.16.0 (``trl.experimental.async_grpo``, transformers 5.24.0). In that trainer, rollouts run ahead of
the policy in a spawned child process (``_AsyncRolloutLoop``), which walks the training dataset in order and
pushes scored samples onto a ``multiprocessing`` queue; the trainer drains the queue, drops samples more than
``max_staleness`` policy versions old, and trains on the rest. :class:`EnvSchedAsyncGRPOTrainer` wires RFC 013's
hooks into that pipeline:

* **Draw** -- the child's rollout loop is replaced by :class:`EnvSchedRolloutLoop`, whose ``_repeat_iterator``
  asks the parent for the next task whenever a rollout slot frees up (one request/reply over a
  ``multiprocessing.connection`` on 127.0.0.1, answered by a thread in the trainer process that hands out the
  tasks of ``sampler.sample(draw_batch)``, one per request, drawing the next batch when one is used up). The
  sampler stays in the trainer process: a batch is drawn only when needed, with all feedback received so far,
  and the sampler's state, its outstanding draws and the draw counter are one consistent snapshot at
  checkpoint time. (A
  :class:`~envsched.store.durable.DurableSampler` shared through SQLite would also work across the two processes,
  at the cost of a database round trip per draw and update; one child process does not need it.)
* **Feedback** -- after scoring a group, the child sends a small header (group id, each rollout's reward, each
  completion's length, how many training rows follow) on the sample queue just before the group's rows. The
  trainer reads that queue through :class:`FeedbackQueue`, which tracks each row as TRL consumes it: when the
  group's last row has come through, the group is reported with ``sampler.update(task, rewards, costs)`` if TRL
  kept any of its rows, or released with ``sampler.discard(task)`` if TRL dropped them all as too stale (the
  sampler estimates the current policy; evidence from a policy more than ``max_staleness`` versions old is
  outdated by the trainer's own rule). Groups complete late and out of order; each draw is resolved exactly
  once. The staleness verdict is TRL's own rule (``model_version - sample.model_version > max_staleness``),
  evaluated at the same moment TRL evaluates it (see :func:`check_async_trl_hooks`).
* **Zero-signal filtering** (``zero_signal_filter=True``, DAPO-style dynamic sampling): a group whose scored
  rewards are all equal (so every advantage is 0) is still reported to the sampler (update before the filter,
  as RFC 013 asks), and its rows are then withheld from the loss. ``envsched/zero_signal_dropped_share`` (groups
  dropped / groups updated), ``envsched/zero_signal_dropped`` and ``envsched/zero_signal_rows_dropped`` are logged.

Rewards: the worker sums its reward functions (weight 1 each); the sum passes through a
:class:`~envsched.integrations._rewards.RewardScale` onto the sampler's range (``reward_range=`` given, else
learned), NaN/inf reach the sampler as ``None``. Costs are completion tokens. A rollout that produced no
training row (an empty completion) reaches the sampler as ``None``.

Checkpoints: every ``checkpoint-N`` folder gets ``envsched_sampler.json``: the sampler's ``state_dict``, the draws
not yet resolved (in draw order, with their group ids), the draw counter and the reward scale.
``train(resume_from_checkpoint=...)`` restores it before the rollout worker starts and re-issues the unresolved
draws first, then continues drawing: a resumed run makes the draws the uninterrupted run made (exactly, for a
sampler whose draws do not depend on feedback timing; an adaptive sampler continues from the same state, but
in an asynchronous trainer feedback timing already differs between two uninterrupted runs).

Metrics: at every log, the sampler's ``metrics()`` and this integration's counters are added to TRL's logs as
``envsched/<name>`` (``groups_drawn``, ``groups_updated``, ``groups_discarded_stale``, ``groups_unresolved``, ...).

CPU: TRL trains with a FlashAttention-3 "tree attention" kernel fetched from the Hub (CUDA only). When the model
is not on a CUDA device, :func:`use_torch_tree_attention` registers the same attention computed with PyTorch's
``scaled_dot_product_attention`` under TRL's name, and :func:`trl_cpu_compat` lets the trainer be built without
CUDA or the ``vllm`` package (the worker only talks HTTP to the server; TRL's import guard is a packaging check;
the GPU-name lookup for MFU answers "unknown device"). Weight
sync needs a ``weight_transfer=`` then: :mod:`envsched.integrations.standin` has a CPU stand-in server and
transfer for tests and examples.

Usage::

    trainer = EnvSchedAsyncGRPOTrainer(model_path, reward_funcs=[my_reward], task_sampler=UniformSampler(pool),
                                       args=AsyncGRPOConfig(..., max_steps=100), processing_class=tok)
    trainer.train()

Reward functions receive the ``task_id`` column (and every column ``task_to_row`` adds). With an
``environment_factory``, ``reset(**row)`` receives the drawn task's row. With ``harness_session_factory=``, TRL's
OpenEnv harness worker runs multi-turn OpenEnv episodes instead, each session created with the drawn task spec
(:mod:`envsched.integrations.openenv_harness`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from datasets import Dataset
from transformers import AttentionInterface
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.experimental.async_grpo import async_grpo_trainer as _trainer_module
from trl.experimental.async_grpo import async_rollout_worker as _worker_module
from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer, RolloutQueueDataset
from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop
from trl.experimental.async_grpo.packing import TREE_ATTENTION

from envsched.integrations._async_rollout import (
    DRAW_TIMEOUT_S,
    EnvSchedRolloutLoop,
    EnvSchedRolloutWorker,
    GroupHeader,
)
from envsched.integrations._checkpoint import SAMPLER_STATE_FILE, read_state_file, write_state_file
from envsched.integrations._draw_server import CONNECT_TIMEOUT_S, DrawServer
from envsched.integrations._rewards import RewardScale
from envsched.integrations._trl_hooks import check_hooks
from envsched.integrations.trl import DEFAULT_LOG_SIZE, default_task_to_row
from envsched.pool.spec import task_key
from envsched.samplers.base import TaskSampler
from envsched.validation import check_int, is_number

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DRAW_TIMEOUT_S",
    "SAMPLER_STATE_FILE",
    "EnvSchedAsyncGRPOTrainer",
    "EnvSchedRolloutLoop",
    "EnvSchedRolloutWorker",
    "FeedbackQueue",
    "GroupHeader",
    "check_async_trl_hooks",
    "torch_tree_attention",
    "trl_cpu_compat",
    "use_torch_tree_attention",
]

logger = logging.getLogger(__name__)

_STATE_FORMAT = "envsched.trl_async/1"

#: Private hooks and attributes relied on: class -> {name: parameter names after self} (None: an attribute).
_HOOKS: dict[type, dict[str, tuple[str, ...] | None]] = {
    AsyncGRPOTrainer: {"_save_checkpoint": ("model", "trial"), "_inner_training_loop": ("args", "kwargs"),
                       "log": ("logs", "start_time"), "_get_output_dir": ("trial",)},
    _AsyncRolloutLoop: {"_repeat_iterator": (), "_score_group": ("group",)},
    AsyncRolloutWorker: {"_loop_cls": None, "__init__": ("queue_maxsize", "child_ready_timeout", "loop_kwargs")},
}
#: Source fragments whose presence the hooks depend on: (class, method, fragment, why); looked up at check time.
_SOURCE_CHECKS = [
    (RolloutQueueDataset, "__iter__", "sample = self.queue.get(timeout=", "the trainer reads rollouts with get"),
    (RolloutQueueDataset, "__iter__", "staleness = version - sample.model_version", "the staleness rule"),
    (RolloutQueueDataset, "__iter__", "if staleness > self.max_staleness:", "the staleness rule"),
    (AsyncGRPOTrainer, "get_train_dataloader", "rollout_queue=self.rollout_queue", "the trainer's queue attribute"),
    (AsyncGRPOTrainer, "__init__", "self.rollout_worker = AsyncRolloutWorker(", "the worker rebuilt to draw"),
    (_AsyncRolloutLoop, "_generate_loop", "group_id, row = next(work_iter)", "the draw point"),
    (_AsyncRolloutLoop, "_score_loop", "samples = await self._score_group(group)", "the scoring point"),
    (AsyncRolloutWorker, "start", "self._loop_kwargs", "the child's constructor arguments"),
    (AsyncRolloutWorker, "__init__", 'loop_kwargs["queue_maxsize"] = queue_maxsize',
     "the worker is rebuilt from its arguments"),
    (AsyncRolloutWorker, "__init__", "self._loop_kwargs = loop_kwargs", "the worker is rebuilt from its arguments"),
    (AsyncRolloutWorker, "__init__", "self._child_ready_timeout = child_ready_timeout",
     "the worker is rebuilt from its arguments"),
]


def check_async_trl_hooks() -> None:
    """Refuse a TRL whose private hooks differ from those this module relies on (see ``_HOOKS`` and
    ``_SOURCE_CHECKS``); raises ``RuntimeError`` naming the installed and the supported versions
    (:func:`~envsched.integrations._trl_hooks.check_hooks`)."""
    check_hooks("envsched.integrations.trl_async", _HOOKS, _SOURCE_CHECKS)


# ---------------------------------------------------------------------------------------------- CPU support
def torch_tree_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: Any, *, tree_kv_index: torch.Tensor, tree_cu_seqlens_q: torch.Tensor,
                         tree_cu_seqlens_k: torch.Tensor, tree_max_seqlen_q: int, tree_max_seqlen_k: int,
                         scaling: float | None = None, sliding_window: int | None = None,
                         softcap: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """TRL's tree attention (``packing.tree_attention``) with PyTorch's ``scaled_dot_product_attention`` instead
    of the FlashAttention-3 kernel: segment ``s`` (queries ``cu_q[s]:cu_q[s+1]``) attends to the packed K/V rows
    ``tree_kv_index[cu_k[s]:cu_k[s+1]]`` (its root-to-segment path) with FlashAttention's bottom-right causal
    alignment. Same inputs and output layout as TRL's function; one SDPA call per segment (slow, for CPU runs)."""
    if softcap:
        raise NotImplementedError("torch_tree_attention does not implement attention logit softcapping")
    q, k, v = (x.transpose(1, 2)[0] for x in (query, key, value))  # (tokens, heads, dim)
    k, v = k.index_select(0, tree_kv_index), v.index_select(0, tree_kv_index)
    rep = q.shape[1] // k.shape[1]
    cq, ck = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    outs = []
    for s in range(len(cq) - 1):
        qs = q[cq[s]:cq[s + 1]].transpose(0, 1)
        ks = k[ck[s]:ck[s + 1]].repeat_interleave(rep, dim=1).transpose(0, 1)
        vs = v[ck[s]:ck[s + 1]].repeat_interleave(rep, dim=1).transpose(0, 1)
        lq, lk = qs.shape[1], ks.shape[1]
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=lk - lq)
        if sliding_window:
            mask &= ~torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=lk - lq - sliding_window)
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scaling)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs, 0).unsqueeze(0), None


def use_torch_tree_attention() -> None:
    """Register :func:`torch_tree_attention` under TRL's tree-attention name (global, like TRL's own
    registration); the async trainer then trains on CPU."""
    AttentionInterface.register(TREE_ATTENTION, torch_tree_attention)


@contextlib.contextmanager
def trl_cpu_compat() -> Iterator[None]:
    """While active, TRL's async trainer can be constructed on a machine without CUDA or the ``vllm`` package:

    * the rollout worker is built without ``vllm`` installed (TRL checks ``is_vllm_available()``, but the worker
      only speaks HTTP to the server: the check is a packaging one);
    * the peak-FLOPs lookup (``torch.cuda.get_device_name``, which raises on a CPU-only torch) answers ``None``,
      TRL's own answer for an unknown device (MFU metrics off, throughput still logged).

    Each patch is applied only where it is needed (no vLLM installed / no CUDA) and undone on exit."""
    patches = []
    if not _worker_module.is_vllm_available():
        patches.append((_worker_module, "is_vllm_available", lambda *a, **k: True))
    if not torch.cuda.is_available():
        patches.append((_trainer_module, "get_peak_flops_per_device", lambda *a, **k: None))
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    for mod, name, value in patches:
        setattr(mod, name, value)
    try:
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


# ---------------------------------------------------------------------------------------------- trainer side
class _TaskFeed:
    """The trainer-side bookkeeping: draws, their resolution (update / discard), replay after resume."""

    def __init__(self, sampler: TaskSampler, tasks: dict[str, Any], row_of: Callable[[Any], dict[str, Any]],
                 scale: RewardScale, zero_signal_filter: bool, log_size: int, draw_batch: int = 1) -> None:
        self.sampler = sampler
        self.draw_batch = draw_batch
        self.batch: deque[tuple[int, str]] = deque()  # drawn in the current sample() batch, not yet issued
        self.tasks = tasks
        self.row_of = row_of
        self.scale = scale
        self.zero_signal_filter = zero_signal_filter
        self.lock = threading.RLock()
        self.unresolved: dict[int, str] = {}  # group id -> task key, in draw order
        self.replay: deque[tuple[int, str]] = deque()
        self.streaming: dict[int, dict[str, Any]] = {}  # groups whose header came, rows still arriving
        self.next_id = 0
        self.counts = {"groups_drawn": 0, "groups_updated": 0, "groups_discarded_stale": 0,
                       "zero_signal_dropped": 0, "zero_signal_rows_dropped": 0, "rows_stale": 0, "draws_replayed": 0}
        self.draw_log: deque[tuple[int, str]] = deque(maxlen=log_size)
        self.feedback_log: deque[dict[str, Any]] = deque(maxlen=log_size)
        self.draw_s = 0.0
        self.feedback_s = 0.0

    def draw(self) -> tuple[int, dict[str, Any]]:
        """The next group to generate: a draw saved at a checkpoint (re-issued first), else the next task of the
        current ``sample(draw_batch)`` batch, drawing a new batch when it is used up."""
        with self.lock:
            t0 = time.perf_counter()
            if self.replay:
                gid, key = self.replay.popleft()
                self.unresolved[gid] = key
                self.counts["draws_replayed"] += 1
            else:
                if not self.batch:
                    tasks = self.sampler.sample(self.draw_batch)
                    if len(tasks) != self.draw_batch:
                        raise RuntimeError(f"{type(self.sampler).__name__}.sample({self.draw_batch}) returned "
                                           f"{len(tasks)} tasks (an exhausted SequentialSampler? use wrap=True or "
                                           "a training sampler)")
                    keys = [task_key(t) for t in tasks]
                    unknown = [k for k in keys if k not in self.tasks]
                    if unknown:
                        raise KeyError(f"the sampler drew task {unknown[0]!r}, which is not in the trainer's task "
                                       "list")
                    for k in keys:  # drawn now: unresolved (outstanding in the sampler) until resolved
                        self.unresolved[self.next_id] = k
                        self.batch.append((self.next_id, k))
                        self.next_id += 1
                    self.counts["groups_drawn"] += len(keys)
                gid, key = self.batch.popleft()
            self.draw_log.append((gid, key))
            row = dict(self.row_of(key))
            self.draw_s += time.perf_counter() - t0
            return gid, row

    def on_header(self, header: GroupHeader) -> None:
        with self.lock:
            gid = header.group_id
            if gid not in self.unresolved or gid in self.streaming:
                raise RuntimeError(f"envsched: a scored group {gid} arrived that is not an unresolved draw "
                                   "(reported twice, or not drawn by this trainer)")
            scored = [r for r in header.rewards if r is not None]
            zero = bool(self.zero_signal_filter and (not scored or max(scored) == min(scored)))
            self.streaming[gid] = {"header": header, "left": header.rows, "kept": 0, "zero": zero}
            if header.rows == 0:
                self._resolve(gid)

    def on_row(self, group_id: int, stale: bool) -> bool:
        """Account for one row TRL is about to see; returns whether to hand it to TRL."""
        with self.lock:
            st = self.streaming.get(group_id)
            if st is None or st["left"] <= 0:
                raise RuntimeError(f"envsched: a row of group {group_id} arrived without its header")
            st["left"] -= 1
            deliver = True
            if stale:
                self.counts["rows_stale"] += 1  # TRL drops it and counts it itself
            else:
                st["kept"] += 1
                if st["zero"]:
                    self.counts["zero_signal_rows_dropped"] += 1
                    deliver = False
            if st["left"] == 0:
                self._resolve(group_id)
            return deliver

    def _resolve(self, gid: int) -> None:
        t0 = time.perf_counter()
        st = self.streaming.pop(gid)
        key = self.unresolved.pop(gid)
        task = self.tasks[key]
        header: GroupHeader = st["header"]
        if st["kept"] > 0 or header.rows == 0:
            rewards = self.scale.map(header.rewards)
            self.sampler.update(task, rewards, header.costs)
            self.counts["groups_updated"] += 1
            if st["zero"]:
                self.counts["zero_signal_dropped"] += 1
            self.feedback_log.append({"group_id": gid, "task_id": key, "outcome": "update", "rewards": rewards,
                                      "costs": list(header.costs), "raw_rewards": list(header.rewards),
                                      "zero_signal_dropped": st["zero"]})
        else:
            self.sampler.discard(task)
            self.counts["groups_discarded_stale"] += 1
            self.feedback_log.append({"group_id": gid, "task_id": key, "outcome": "discard"})
        self.feedback_s += time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        with self.lock:
            out: dict[str, float] = {}
            m = getattr(self.sampler, "metrics", None)
            if callable(m):
                for name, value in m().items():
                    if is_number(value, numpy=False):
                        out[name] = float(value)
            out.update({k: float(v) for k, v in self.counts.items()})
            out["groups_unresolved"] = float(len(self.unresolved))
            upd = self.counts["groups_updated"]
            out["zero_signal_dropped_share"] = self.counts["zero_signal_dropped"] / upd if upd else 0.0
            out.update(self.scale.metrics())
            return out

    def state(self) -> dict[str, Any]:
        with self.lock:
            pending = sorted([[gid, key] for gid, key in self.replay]
                             + [[gid, key] for gid, key in self.unresolved.items()])
            return {"sampler": self.sampler.state_dict(), "unresolved": pending, "next_id": self.next_id,
                    "counts": dict(self.counts), "reward_scale": self.scale.state_dict()}


class FeedbackQueue:
    """What the trainer reads rollouts from: wraps the child's sample queue, takes the :class:`GroupHeader` items
    off it, mirrors TRL's staleness verdict on each row and resolves each group with its sampler once its last
    row has passed. ``get``/``qsize`` behave like the wrapped queue's (``queue.Empty`` after ``timeout``)."""

    def __init__(self, inner: Any, feed: _TaskFeed, model_version: Callable[[], int], max_staleness: int) -> None:
        self.inner = inner
        self.feed = feed
        self.model_version = model_version
        self.max_staleness = max_staleness

    def qsize(self) -> int:
        return self.inner.qsize()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise queue.Empty
            item = self.inner.get(block, left)
            if isinstance(item, GroupHeader):
                self.feed.on_header(item)
                continue
            # TRL computes this same verdict right after get() returns, in this thread, before anything can
            # change the model version (check_async_trl_hooks guards the rule).
            stale = self.model_version() - item.model_version > self.max_staleness
            if self.feed.on_row(int(item.group_id), stale):
                return item


class EnvSchedAsyncGRPOTrainer(AsyncGRPOTrainer):
    """``trl.experimental.async_grpo.AsyncGRPOTrainer`` drawing its prompts from an envsched :class:`TaskSampler`
    (see the module docstring for how).

    Keyword args (the rest goes to ``AsyncGRPOTrainer``; ``args.max_steps`` must be set, draws have no epochs):
        task_sampler: any object with RFC 013's ``sample``/``update``/``discard``/``state_dict``/``load_state_dict``
            (``metrics`` is logged when present).
        tasks: the task specs (default ``task_sampler.tasks``).
        task_to_row: ``task -> dict`` of row columns (default :func:`~envsched.integrations.trl.default_task_to_row`);
            ``task_id`` (the task key) is added. Reward functions and ``reset`` receive these columns.
        reward_range: the range of the summed reward, mapped onto the sampler's ``reward_range`` (``None``: learned).
        zero_signal_filter: withhold groups whose scored rewards are all equal from the loss (after ``update``).
        log_size: entries :attr:`envsched_draw_log` and :attr:`envsched_feedback_log` keep (newest).
        draw_batch: tasks per ``sample()`` call (default: the groups of one optimizer step, as the synchronous
            integration draws). The rollout child takes them one at a time as slots free up; 1 draws each task
            as late as possible (with the freshest feedback), larger batches let a sampler compose a batch.
        cpu_attention: register :func:`torch_tree_attention` (default: when CUDA is not available).
        harness_session_factory: run multi-turn OpenEnv episodes with TRL's OpenEnv harness
            (``trl.experimental.async_grpo.openenv_harness``) instead of TRL's own turn loop: a picklable callable
            returning an OpenEnv ``ResourceSessionFactory`` (e.g. ``functools.partial(OpenEnvTaskSessionFactory,
            url)``, :mod:`envsched.integrations.openenv_harness`); each rollout's session is created with the task
            spec the sampler drew for its group. ``harness_adapter`` (e.g. ``MCPHarnessAdapter()``: TRL samples each
            turn), ``rollout_reward_fn`` and ``lossless_capture`` are passed to TRL's harness loop as they are.

    The rollout worker: TRL builds its ``AsyncRolloutWorker``, and the trainer builds :attr:`rollout_worker_class`
    (with ``harness_session_factory=``, :attr:`harness_rollout_worker_class`) in its place from the same
    arguments, adding the draw channel (and the harness's arguments).
    """

    #: The rollout worker built in place of TRL's: :class:`EnvSchedRolloutWorker` or a subclass of it (a
    #: subclass of this trainer may set its own).
    rollout_worker_class: type[EnvSchedRolloutWorker] = EnvSchedRolloutWorker
    #: The rollout worker built with ``harness_session_factory=``: a subclass of
    #: :class:`~envsched.integrations.openenv_harness.EnvSchedHarnessRolloutWorker`, or ``None`` for that class
    #: itself (imported only then: it needs the ``openenv`` extra).
    harness_rollout_worker_class: type[EnvSchedRolloutWorker] | None = None

    def __init__(self, model: str, reward_funcs: Any = None, args: Any = None, *, task_sampler: TaskSampler,
                 tasks: Sequence[Any] | None = None, task_to_row: Callable[[Any], dict[str, Any]] | None = None,
                 reward_range: Sequence[float] | None = None, zero_signal_filter: bool = False,
                 log_size: int = DEFAULT_LOG_SIZE, draw_batch: int | None = None,
                 cpu_attention: bool | None = None, harness_session_factory: Callable[..., Any] | None = None,
                 harness_adapter: Any = None, rollout_reward_fn: Callable[[Any], float | None] | None = None,
                 lossless_capture: bool = True, **kwargs: Any) -> None:
        check_async_trl_hooks()
        harness: dict[str, Any] | None = None
        worker_class, worker_base = self.rollout_worker_class, EnvSchedRolloutWorker
        if harness_session_factory is not None:
            from envsched.integrations.openenv_harness import EnvSchedHarnessRolloutWorker, check_harness_hooks

            check_harness_hooks()
            worker_class = self.harness_rollout_worker_class or EnvSchedHarnessRolloutWorker
            worker_base = EnvSchedHarnessRolloutWorker
            if not callable(harness_session_factory):
                raise TypeError("harness_session_factory must be a callable returning an OpenEnv "
                                "ResourceSessionFactory (e.g. functools.partial(OpenEnvTaskSessionFactory, url))")
            if kwargs.get("environment_factory") is not None or kwargs.get("tools"):
                raise ValueError("harness_session_factory: the OpenEnv sessions own the environment and its tools; "
                                 "do not pass environment_factory= or tools=")
            harness = {"harness_session_factory": harness_session_factory, "harness_adapter": harness_adapter,
                       "rollout_reward_fn": rollout_reward_fn, "lossless_capture": bool(lossless_capture)}
        elif harness_adapter is not None or rollout_reward_fn is not None:
            raise ValueError("harness_adapter= and rollout_reward_fn= belong to the OpenEnv harness: pass "
                             "harness_session_factory= too")
        if not (isinstance(worker_class, type) and issubclass(worker_class, worker_base)):
            attribute = "rollout_worker_class" if harness is None else "harness_rollout_worker_class"
            raise TypeError(f"{type(self).__name__}.{attribute} must be {worker_base.__name__} or a subclass of it, "
                            f"got {worker_class!r}")
        log_size = check_int(log_size, "log_size", low=0)
        if args is None or int(getattr(args, "max_steps", -1)) <= 0:
            raise ValueError("args.max_steps must be set (> 0): tasks are drawn from the sampler, there are no epochs")
        if draw_batch is None:
            draw_batch = max(1, args.per_device_train_batch_size * args.gradient_accumulation_steps
                             // args.num_generations)
        draw_batch = check_int(draw_batch, "draw_batch", low=1)  # tasks per sample() call
        for m in ("sample", "update", "discard", "state_dict", "load_state_dict"):
            if not callable(getattr(task_sampler, m, None)):
                raise TypeError(f"task_sampler must implement RFC 013's TaskSampler; "
                                f"{type(task_sampler).__name__} has no {m}()")
        if "train_dataset" in kwargs:
            raise ValueError("train_dataset is built from the tasks: pass tasks= / task_to_row= instead")
        if kwargs.get("rollout_worker") is not None:
            raise ValueError("rollout_worker: the trainer builds TRL's worker and swaps in the draw loop; for "
                             "TRL's OpenEnv HarnessRolloutWorker pass harness_session_factory= (and harness_adapter=, "
                             "rollout_reward_fn=) instead")
        if tasks is None:
            tasks = getattr(task_sampler, "tasks", None)
            if tasks is None:
                raise ValueError(f"{type(task_sampler).__name__} has no .tasks: pass tasks= (the task specs)")
        by_key: dict[str, Any] = {}
        for t in tasks:
            k = task_key(t)
            if k in by_key:
                raise ValueError(f"duplicate task key {k!r}")
            by_key[k] = t
        if not by_key:
            raise ValueError("the task list is empty")
        to_row = task_to_row or default_task_to_row
        rows: dict[str, dict[str, Any]] = {}
        for k, t in by_key.items():
            row = dict(to_row(t))
            if "prompt" not in row and kwargs.get("environment_factory") is None:
                raise ValueError(f"task_to_row returned no 'prompt' for task {k!r}")
            row["task_id"] = k
            rows[k] = row
        self._es_feed = _TaskFeed(task_sampler, by_key, rows.__getitem__,
                                  RewardScale.for_sampler(task_sampler, reward_range), bool(zero_signal_filter),
                                  log_size, draw_batch)
        self._es_reward_range = reward_range
        with trl_cpu_compat():
            super().__init__(model, reward_funcs, args, train_dataset=Dataset.from_list(list(rows.values())),
                             **kwargs)
        if cpu_attention is None:
            cpu_attention = self.accelerator.device.type != "cuda"
        if cpu_attention:
            use_torch_tree_attention()
        self._es_thread: threading.Thread | None = None
        self._es_send_task = harness is not None
        self._es_stop = threading.Event()
        self._es_channel = None
        if self.accelerator.num_processes != 1:
            raise NotImplementedError("EnvSchedAsyncGRPOTrainer is tested with one training process only")
        if self.accelerator.is_main_process:
            built = self.rollout_worker
            if type(built) is not AsyncRolloutWorker:
                raise ValueError(f"rollout_worker {type(built).__name__}: only TRL's default "
                                 "AsyncRolloutWorker can draw from the sampler")
            # TRL's worker is not started yet: build the drawing one from its arguments, with the draw channel
            loop_kwargs = dict(built._loop_kwargs)
            queue_maxsize = loop_kwargs.pop("queue_maxsize")
            loop_kwargs.update(harness or {})
            self._es_channel = DrawServer(self._es_reply)
            loop_kwargs["envsched_channel"] = (self._es_channel.address, self._es_channel.authkey)
            try:
                with trl_cpu_compat():
                    self.rollout_worker = worker_class(queue_maxsize=queue_maxsize,
                                                       child_ready_timeout=built._child_ready_timeout, **loop_kwargs)
            except BaseException:
                self._es_channel.close()
                raise
            self.rollout_queue = FeedbackQueue(self.rollout_worker.rollout_buffer, self._es_feed,
                                               lambda: self.model_version, int(self.args.max_staleness))

    # ------------------------------------------------------------------ public
    @property
    def task_sampler(self) -> TaskSampler:
        return self._es_feed.sampler

    def task_for(self, task_id: str) -> Any:
        """The task spec of ``task_id`` (reward functions receive the ``task_id`` column)."""
        try:
            return self._es_feed.tasks[task_id]
        except KeyError:
            raise KeyError(f"unknown task id {task_id!r}") from None

    @property
    def envsched_draw_log(self) -> list[tuple[int, str]]:
        """The newest ``log_size`` draws ``(group id, task id)`` in draw order, replays after a resume included."""
        with self._es_feed.lock:
            return list(self._es_feed.draw_log)

    @property
    def envsched_feedback_log(self) -> list[dict[str, Any]]:
        """The newest ``log_size`` resolved groups, in resolution order: ``{"group_id", "task_id", "outcome"
        ("update"/"discard"), ...}`` (updates add ``rewards``, ``costs``, ``raw_rewards``, ``zero_signal_dropped``)."""
        with self._es_feed.lock:
            return list(self._es_feed.feedback_log)

    @property
    def unresolved_draws(self) -> dict[int, str]:
        """Draws not yet updated or discarded, in draw order: group id -> task id (the sampler counts them as
        outstanding). After a resume this includes the saved draws not yet re-issued."""
        with self._es_feed.lock:
            return dict(sorted([*self._es_feed.replay, *self._es_feed.unresolved.items()]))

    def envsched_metrics(self) -> dict[str, float]:
        """The sampler's metrics, this integration's counters and the reward scale's counters."""
        return self._es_feed.metrics()

    def envsched_timings(self) -> dict[str, float]:
        """Seconds spent in the sampler so far: ``draw_s`` (``sample`` + row building), ``feedback_s``
        (``update``/``discard`` + reward mapping)."""
        return {"draw_s": self._es_feed.draw_s, "feedback_s": self._es_feed.feedback_s}

    # ------------------------------------------------------------------ draw server
    def _es_serve(self) -> None:
        """Answer the rollout child's draw requests until ``_es_stop`` is set (the draw server: every accept,
        handshake and read under a deadline; a connection that fails in any way is dropped and serving goes
        on)."""
        self._es_channel.serve_forever(self._es_stop)

    def _es_reply(self, request: Any) -> tuple[Any, ...]:
        """The reply to one draw request: ``("ok", group id, row[, task spec])`` or ``("error", reason)``."""
        try:
            gid, row = self._es_feed.draw()
            reply: tuple[Any, ...] = ("ok", gid, row)
            if self._es_send_task:  # the OpenEnv harness: the session factory gets the task spec
                reply += (self._es_feed.tasks[row["task_id"]],)
            return reply
        except Exception as e:
            logger.exception("envsched: drawing a task failed")
            return ("error", f"{type(e).__name__}: {e}")

    # ------------------------------------------------------------------ hooks
    def _inner_training_loop(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        checkpoint = kwargs.get("resume_from_checkpoint")
        if checkpoint is not None:
            self.load_sampler_state(checkpoint)
        if self._es_channel is not None:
            self._es_stop.clear()
            self._es_thread = threading.Thread(target=self._es_serve, name="envsched-draws", daemon=True)
            self._es_thread.start()
        try:
            return super()._inner_training_loop(*args, **kwargs)
        finally:
            self._es_stop.set()
            if self._es_thread is not None:
                self._es_thread.join(timeout=5)  # the server wakes every 0.1 s to see the stop request
                self._es_thread = None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.accelerator.is_main_process and self.model.training:
            for name, value in self._es_feed.metrics().items():
                if math.isfinite(value):
                    self._metrics["train"][f"envsched/{name}"] = [value]
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial):  # type: ignore[override]
        super()._save_checkpoint(model, trial)
        if not self.args.should_save:
            return
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        state = {"format": _STATE_FORMAT, "global_step": int(self.state.global_step),
                 "sampler_class": type(self._es_feed.sampler).__name__, **self._es_feed.state()}
        write_state_file(folder, state)

    def load_sampler_state(self, checkpoint: str) -> None:
        """Restore the sampler, the unresolved draws (re-issued first) and the draw counter from
        ``checkpoint/envsched_sampler.json``. ``FileNotFoundError`` without one, ``ValueError`` if it does not fit
        this trainer; nothing changes on error."""
        path, state = read_state_file(checkpoint)
        if not isinstance(state, Mapping) or state.get("format") != _STATE_FORMAT:
            found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"{path}: unsupported format {found!r} (expected {_STATE_FORMAT!r})")
        feed = self._es_feed
        try:
            pending = [(int(g), str(k)) for g, k in state["unresolved"]]
            next_id = int(state["next_id"])
            counts = {k: int(v) for k, v in dict(state.get("counts", {})).items()}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: malformed envsched state ({e})") from None
        unknown = [k for _, k in pending if k not in feed.tasks]
        if unknown:
            raise ValueError(f"{path}: unresolved draws name tasks this trainer does not have: {unknown[:3]}")
        if any(g < 0 or g >= next_id for g, _ in pending) or len({g for g, _ in pending}) != len(pending):
            raise ValueError(f"{path}: unresolved draw ids are not distinct ids below next_id={next_id}")
        scale = RewardScale(feed.scale.target, feed.scale.source if feed.scale.fixed else None)
        if "reward_scale" in state:
            scale.load_state_dict(state["reward_scale"])
        with feed.lock:
            feed.sampler.load_state_dict(state["sampler"])
            feed.scale = scale
            feed.unresolved.clear()
            feed.streaming.clear()
            feed.replay = deque(pending)
            feed.batch.clear()
            feed.next_id = next_id
            feed.counts.update({k: v for k, v in counts.items() if k in feed.counts})
