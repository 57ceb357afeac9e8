"""The ``TaskSampler`` protocol of OpenEnv RFC 013 and the semantics every envsched sampler shares.

A trainer uses a sampler through two hooks (RFC 013, latest revision):

1. it draws the tasks of the next batch with :meth:`TaskSampler.sample` -- one task per GRPO group;
2. it calls :meth:`TaskSampler.update` once per group with the reward of every rollout of that group,
   *before* any dynamic-sampling filter drops all-pass or all-fail groups.

A reward of ``None`` is a rollout the environment could not score (its own failure). It counts in
``groups``, ``episodes`` and ``cost``, and in nothing estimated from rewards -- never as zero.

:class:`BaseSampler` implements the shared part once: input validation (bad input raises and changes no
state), the RFC's counters, dispatch bookkeeping for asynchronous trainers, ``metrics()``, and
``state_dict()``/``load_state_dict()`` with the random generator's state, so that a restored sampler
continues with exactly the same draws. A loaded state is untrusted: every field is checked (see
:mod:`envsched.validation`) before anything is assigned, and ``sample`` is atomic (if it raises, the
random generator and every state are as before). A concrete sampler implements :meth:`BaseSampler._select`
and, if it learns from rewards, :meth:`BaseSampler._observe`.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

import envsched.validation as _check
from envsched.errors import StateError
from envsched.pool.pool import TaskPool
from envsched.pool.spec import task_key
from envsched.validation import is_int, is_number

__all__ = ["EQUAL_VARIANCE", "MAX_BATCH", "MIN_SIGNAL_ROLLOUTS", "STATE_FORMAT", "BaseSampler", "GroupResult",
           "TaskSampler", "canonical_param", "group_mean_variance", "is_signal_group", "rebuildable",
           "tasks_fingerprint"]

STATE_FORMAT = "envsched.sampler/1"
#: Largest value an integer counter may hold in a loaded state (and largest ``n`` of one ``sample`` call
#: for samplers that may repeat tasks within a batch: :data:`MAX_BATCH`).
_MAX_COUNT = _check.MAX_COUNT
#: The most tasks one ``sample(n)`` call may return when the sampler may repeat tasks within a batch
#: (otherwise the pool's size is the limit); checked before anything is allocated.
MAX_BATCH = 1_000_000
_RANGE_TOLERANCE = 1e-9

#: A *signal group* -- a group GRPO gets a gradient from -- has at least this many scored rewards, and they are not
#: all equal (:func:`is_signal_group`).
MIN_SIGNAL_ROLLOUTS = 2
#: Scored rewards, mapped to [0, 1] by the sampler's reward range, count as all equal when their population
#: variance is at most this: the floating-point noise of equal rewards is about 1e-17, and two rewards 2e-6 of the
#: range apart have variance 1e-12, a difference no advantage normalisation turns into a gradient worth the name.
EQUAL_VARIANCE = 1e-12


def group_mean_variance(scored01: Sequence[float]) -> tuple[float, float]:
    """Mean and population variance of a non-empty group of scored rewards already mapped to [0, 1], in exactly
    rounded sums (``math.fsum``): the one computation behind :attr:`GroupResult.has_signal` and EnvSched's
    observation statistics, so that both see the same variance."""
    vals = [float(r) for r in scored01]
    m = math.fsum(vals) / len(vals)
    return m, max(0.0, math.fsum((r - m) ** 2 for r in vals) / len(vals))


def is_signal_group(n_scored: Any, variance01: Any) -> Any:
    """Whether a group is a *signal group*: at least :data:`MIN_SIGNAL_ROLLOUTS` scored rewards whose population
    variance on the [0, 1] scale (:func:`group_mean_variance`) is above :data:`EQUAL_VARIANCE`. Elementwise over
    arrays (NaN, the variance of a group without scored rewards, is no signal). The one definition every reader
    uses: the ``signal_groups`` counters of every sampler and the signal counts of EnvSched's history."""
    if isinstance(n_scored, int | float) and isinstance(variance01, int | float):
        return n_scored >= MIN_SIGNAL_ROLLOUTS and variance01 > EQUAL_VARIANCE
    return (np.asarray(n_scored) >= MIN_SIGNAL_ROLLOUTS) & (np.nan_to_num(np.asarray(variance01, dtype=float))
                                                           > EQUAL_VARIANCE)


@runtime_checkable
class TaskSampler(Protocol):
    """RFC 013's sampler protocol (latest revision). Any object with these methods plugs into envsched's
    trainers, evaluation and benchmark."""

    def sample(self, n: int) -> list[Any]:
        """Return ``n`` task specs for the next ``n`` prompts (one per GRPO group)."""
        ...

    def update(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None) -> None:
        """Report the rewards (and optional per-rollout costs) of every rollout of one group."""
        ...

    def metrics(self) -> dict[str, float]:
        """Counters and derived rates, for logging."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: save it with the model and optimizer."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` of a sampler over the same tasks."""
        ...


class GroupResult:
    """One validated group, as :meth:`BaseSampler._observe` receives it.

    Attributes:
        position: the task's position in the sampler's task list.
        rewards: every rollout's reward as given (``None`` for an unscored rollout).
        scored: the scored rewards only, as a float array (``None`` never appears here).
        costs: per-rollout costs, or ``None`` if the trainer gave none.
        has_signal: whether the group is a signal group (:func:`is_signal_group`: at least two scored rollouts
            whose rewards, on the reward range mapped to [0, 1], are not all equal).
        reward_range: the sampler's reward range, which maps the rewards to [0, 1].
    """

    __slots__ = ("_mean_variance", "costs", "has_signal", "position", "reward_range", "rewards", "scored")

    def __init__(self, position: int, rewards: list[float | None], costs: np.ndarray | None,
                 reward_range: tuple[float, float] = (0.0, 1.0)) -> None:
        self.position = position
        self.rewards = rewards
        scored = [r for r in rewards if r is not None]
        self.scored = np.asarray(scored, dtype=float)
        self.costs = costs
        self.reward_range = reward_range
        self._mean_variance: tuple[float, float] | None = None
        # equal scored rewards have no variance above the tolerance: only unequal ones need it computed
        self.has_signal = (len(scored) >= MIN_SIGNAL_ROLLOUTS and min(scored) != max(scored)  # plain floats
                           and is_signal_group(len(scored), self.mean_variance01[1]))

    @property
    def mean_variance01(self) -> tuple[float, float]:
        """Mean and population variance of the scored rewards mapped to [0, 1] (:func:`group_mean_variance`;
        computed once; ``(nan, nan)`` when none is scored)."""
        if self._mean_variance is None:
            if not self.scored.size:
                self._mean_variance = (math.nan, math.nan)
            else:
                low, high = self.reward_range
                span = high - low
                self._mean_variance = group_mean_variance([(r - low) / span for r in self.scored.tolist()])
        return self._mean_variance

    @property
    def variance(self) -> float:
        """Population variance of the scored rewards (``nan`` when none is scored)."""
        return float(np.var(self.scored)) if self.scored.size else math.nan


def tasks_fingerprint(tasks: Sequence[Any], reward_range: tuple[float, float]) -> str:
    """SHA-256 of the task specs and the reward range; equals :meth:`TaskPool.fingerprint` for the same pool."""
    if isinstance(tasks, TaskPool) and tuple(tasks.reward_range) == tuple(reward_range):
        return tasks.fingerprint()
    h = hashlib.sha256()
    h.update(json.dumps([float(reward_range[0]), float(reward_range[1])]).encode())
    for s in tasks:
        h.update(json.dumps(s, sort_keys=True, separators=(",", ":"), default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def canonical_param(value: Any) -> Any:
    """A JSON form of a constructor argument; objects that JSON cannot hold become ``{"__object__": type}``."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int) or (hasattr(value, "dtype") and getattr(value, "ndim", None) == 0
                                  and str(value.dtype).startswith(("int", "uint"))):
        return int(value)
    if isinstance(value, float) or (hasattr(value, "dtype") and getattr(value, "ndim", None) == 0):
        f = float(value)
        return f if math.isfinite(f) else {"__float__": repr(f)}
    if isinstance(value, list | tuple):
        return [canonical_param(v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: canonical_param(v) for k, v in sorted(value.items())}
    if hasattr(value, "tolist") and hasattr(value, "shape"):
        return canonical_param(value.tolist())
    t = type(value)
    return {"__object__": f"{t.__module__}.{t.__qualname__}"}


def rebuildable(value: Any) -> bool:
    """Whether a :func:`canonical_param` form holds only plain data (no object, no non-finite float)."""
    if isinstance(value, dict):
        return "__object__" not in value and "__float__" not in value and all(rebuildable(v) for v in value.values())
    if isinstance(value, list):
        return all(rebuildable(v) for v in value)
    return True


class BaseSampler(ABC):
    """Shared semantics of every envsched sampler.

    Args:
        tasks: a :class:`~envsched.pool.TaskPool` or a sequence of task specs. Each spec is identified by
            its ``id`` (else ``"{split}/{index}"``); keys must be unique.
        seed: seed of the sampler's random generator (``numpy.random.PCG64``).
        reward_range: the declared reward scale; defaults to the pool's, else ``(0, 1)``.
        require_dispatch: refuse an ``update`` for a task that has no outstanding dispatch (it was never
            drawn by :meth:`sample`, or its group was already reported). Turn off to feed a sampler
            rewards of tasks it did not choose (e.g. replaying another sampler's log).
    """

    #: Largest ``n`` relative to the pool: subclasses drawing distinct tasks per batch keep ``True``.
    distinct_per_batch: ClassVar[bool] = True

    def __init__(self, tasks: TaskPool | Sequence[Any], *, seed: int | None = 0,
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True) -> None:
        if isinstance(tasks, TaskPool):
            self.tasks: list[Any] = list(tasks)
            pool_range = tasks.reward_range
        else:
            if isinstance(tasks, str | bytes | Mapping) or not hasattr(tasks, "__iter__"):
                raise TypeError(f"tasks must be a TaskPool or a sequence of task specs, got {type(tasks).__name__}")
            self.tasks = list(tasks)
            pool_range = (0.0, 1.0)
        if not self.tasks:
            raise ValueError("a sampler needs at least one task; the task list is empty")
        self._keys: list[str] = []
        self._pos: dict[str, int] = {}
        for i, t in enumerate(self.tasks):
            k = task_key(t)
            if k in self._pos:
                raise ValueError(f"duplicate task key {k!r} at positions {self._pos[k]} and {i}")
            self._pos[k] = i
            self._keys.append(k)
        low, high = reward_range if reward_range is not None else pool_range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"reward_range must be two finite numbers with low < high, got {(low, high)!r}")
        self.reward_range: tuple[float, float] = (float(low), float(high))
        if seed is not None and not (is_int(seed) and seed >= 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        self.seed = seed
        self.require_dispatch = require_dispatch
        self._rng = np.random.default_rng(seed)
        self._counters: dict[str, float] = dict.fromkeys(
            ("groups", "signal_groups", "episodes", "unscored_episodes", "cost", "dispatched_groups",
             "discarded_groups"), 0)
        self._counters["cost"] = 0.0
        self._outstanding: dict[int, int] = {}
        self._last_batch: list[int] = []

    # ------------------------------------------------------------------ introspection
    def get_params(self) -> dict[str, Any]:
        """Constructor configuration (scikit-learn style), without the task list."""
        params = {}
        for name in inspect.signature(type(self).__init__).parameters:
            if name in ("self", "tasks") or not hasattr(self, name):
                continue
            params[name] = getattr(self, name)
        return params

    def to_record(self) -> dict[str, Any]:
        """The sampler's construction record, as a history store keeps it: its class (``"module:qualname"``),
        :meth:`get_params` as plain JSON (``params_rebuildable``: whether JSON holds all of it), the task
        list's fingerprint and size and the reward range. :meth:`from_record` builds the sampler back."""
        cls = type(self)
        canon = {k: canonical_param(v) for k, v in sorted(self.get_params().items())}
        return {
            "sampler_class": f"{cls.__module__}:{cls.__qualname__}",
            "sampler_params": canon,
            "params_rebuildable": rebuildable(canon),
            "pool_fingerprint": tasks_fingerprint(self.tasks, tuple(self.reward_range)),
            "num_tasks": len(self.tasks),
            "reward_range": [float(x) for x in self.reward_range],
        }

    @classmethod
    def from_record(cls, tasks: TaskPool | Sequence[Any], record: Mapping[str, Any], **resources: Any) -> BaseSampler:
        """A sampler over ``tasks`` constructed as :meth:`to_record`'s ``record`` says (its state is the initial
        one). ``resources`` are what a record never chooses -- files, graphs, process counts -- given by the
        caller; a sampler that needs none ignores them. A subclass whose constructor takes more than plain
        parameters overrides this (or its registry record names a ``restore`` hook)."""
        return cls(tasks, **dict(record["sampler_params"]))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({len(self.tasks)} tasks, {args})"

    @property
    def keys(self) -> list[str]:
        """Task keys in the sampler's order."""
        return list(self._keys)

    def position_of(self, task: Any) -> int:
        """Position of a task (a spec or a key) in the sampler's task list; ``KeyError`` if unknown."""
        key = task if isinstance(task, str) else task_key(task)
        try:
            return self._pos[key]
        except KeyError:
            raise KeyError(f"unknown task {key!r}: not in this sampler's {len(self.tasks)} tasks") from None

    def env_of(self, position: int) -> str | None:
        """Environment of the task at ``position`` (``None`` when the spec names none)."""
        t = self.tasks[position]
        return t.get("env") if isinstance(t, Mapping) else getattr(t, "env", None)

    # ------------------------------------------------------------------ counters (RFC 013 attributes)
    @property
    def groups(self) -> int:
        return int(self._counters["groups"])

    @property
    def signal_groups(self) -> int:
        return int(self._counters["signal_groups"])

    @property
    def episodes(self) -> int:
        return int(self._counters["episodes"])

    @property
    def unscored_episodes(self) -> int:
        return int(self._counters["unscored_episodes"])

    @property
    def cost(self) -> float:
        return float(self._counters["cost"])

    @property
    def signal_groups_per_episode(self) -> float:
        return self.signal_groups / self.episodes if self.episodes else 0.0

    @property
    def signal_groups_per_cost(self) -> float:
        """Signal groups per unit of reported cost (0.0 while no cost was reported)."""
        return self.signal_groups / self.cost if self.cost > 0 else 0.0

    @property
    def zero_signal_fraction(self) -> float:
        """Share of reported groups without signal. Misleading alone: log it with the two rates above."""
        return 1.0 - self.signal_groups / self.groups if self.groups else 0.0

    @property
    def outstanding_groups(self) -> int:
        """Groups drawn by :meth:`sample` whose :meth:`update` has not arrived (nor been discarded)."""
        return sum(self._outstanding.values())

    @property
    def unwrapped(self) -> BaseSampler:
        """This sampler (Gymnasium's ``Env.unwrapped``): a wrapper answers with the sampler it wraps, so
        ``sampler.unwrapped`` reaches the innermost sampler whether or not anything wraps it."""
        return self

    def outstanding(self) -> dict[str, int]:
        """Outstanding dispatches per task key."""
        return {self._keys[p]: c for p, c in self._outstanding.items()}

    # ------------------------------------------------------------------ the protocol
    def sample(self, n: int) -> list[Any]:
        """Return the next ``n`` task specs (one per GRPO group). Raises ``ValueError`` if ``n`` is not a
        positive integer or exceeds what the sampler can draw, with no state changed."""
        n = self.check_sample_size(n)
        # atomic: if selection fails, the generator and the subclass's state are put back as they were
        rng_state = self._rng.bit_generator.state
        checkpoint = self._select_checkpoint()
        try:
            positions = [int(p) for p in self._select(n)]
            size = len(self.tasks)
            if len(positions) > n or any(not 0 <= p < size for p in positions):
                raise RuntimeError(f"{type(self).__name__}._select returned {len(positions)} positions for n={n} "
                                   f"(at most n, each in [0, {size})): {positions[:8]}")
        except BaseException:
            self._rng.bit_generator.state = rng_state
            self._select_rollback(checkpoint)
            raise
        # nothing a subclass writes runs after _select (whose last step may commit), so nothing below can fail
        emitted = [self.tasks[p] for p in positions]
        for p in positions:
            self._outstanding[p] = self._outstanding.get(p, 0) + 1
        self._counters["dispatched_groups"] += len(positions)
        self._last_batch = positions
        return emitted

    def check_sample_size(self, n: Any) -> int:
        """``n`` as an int if :meth:`sample` would accept it, else the ``ValueError`` it would raise; draws
        nothing (a wrapper checks every part of a batch before drawing any)."""
        if not is_int(n):
            raise ValueError(f"n must be a positive integer, got {n!r}")
        n = int(n)
        if n <= 0:
            raise ValueError(f"n must be a positive integer, got {n}")
        limit = self.max_sample_size()
        if limit is None:
            limit = MAX_BATCH
        if n > limit:
            why = "distinct tasks available" if self.distinct_per_batch else "the batch limit MAX_BATCH"
            raise ValueError(f"n={n} exceeds what {type(self).__name__} can draw in one batch ({limit}: {why})")
        return n

    def update(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None) -> None:
        """Report one group: every rollout's reward (``None`` = unscored) and optionally its cost.

        Raises ``KeyError`` for a task the sampler does not know and ``ValueError`` for bad rewards or
        costs or an update without an outstanding dispatch; on error no state changes.
        """
        group = self._validate_update(task, rewards, costs)
        pos = group.position
        if self._outstanding.get(pos, 0) > 0:
            self._release(pos)
        self._counters["groups"] += 1
        self._counters["signal_groups"] += int(group.has_signal)
        self._counters["episodes"] += len(group.rewards)
        self._counters["unscored_episodes"] += sum(r is None for r in group.rewards)
        if group.costs is not None:
            self._counters["cost"] += float(group.costs.sum())
        self._observe(group)

    def discard(self, task: Any) -> None:
        """Release one outstanding dispatch of ``task`` without reporting rewards (a dropped group)."""
        pos = self.position_of(task)
        if self._outstanding.get(pos, 0) == 0:
            raise ValueError(f"task {self._keys[pos]!r} has no outstanding dispatch to discard")
        self._release(pos)
        self._counters["discarded_groups"] += 1
        self._on_discard(pos)

    def metrics(self) -> dict[str, float]:
        """RFC 013 counters and rates, plus dispatch bookkeeping and sampler-specific figures."""
        m: dict[str, float] = {
            "groups": float(self.groups),
            "signal_groups": float(self.signal_groups),
            "episodes": float(self.episodes),
            "unscored_episodes": float(self.unscored_episodes),
            "cost": self.cost,
            "signal_groups_per_episode": self.signal_groups_per_episode,
            "signal_groups_per_cost": self.signal_groups_per_cost,
            "zero_signal_fraction": self.zero_signal_fraction,
            "dispatched_groups": float(self._counters["dispatched_groups"]),
            "discarded_groups": float(self._counters["discarded_groups"]),
            "outstanding_groups": float(self.outstanding_groups),
            "last_batch_size": float(len(self._last_batch)),
            "last_batch_envs": float(len({self.env_of(p) for p in self._last_batch})),
        }
        m.update(self._extra_metrics())
        return m

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot: counters, outstanding dispatches, RNG state and sampler state."""
        return {
            "format": STATE_FORMAT,
            "sampler": type(self).__name__,
            "tasks_sha256": self._keys_digest(),
            "num_tasks": len(self.tasks),
            "counters": dict(self._counters),
            "outstanding": {self._keys[p]: c for p, c in self._outstanding.items()},
            "last_batch": [self._keys[p] for p in self._last_batch],
            "rng": copy.deepcopy(self._rng.bit_generator.state),
            "extra": self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. Raises ``ValueError`` (state and random generator unchanged)
        if it was written by another sampler class, for another task list, or is malformed: every field is
        checked against what this sampler can reach (types, finiteness, ranges, lengths) before anything is
        assigned; a :class:`~envsched.errors.StateError` names the offending field."""
        if not isinstance(state, Mapping):
            raise ValueError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unsupported sampler state format {str(state.get('format'))[:60]!r} "
                             f"(expected {STATE_FORMAT!r})")
        if state.get("sampler") != type(self).__name__:
            raise ValueError(f"state was saved by {str(state.get('sampler'))[:60]!r}, cannot load into "
                             f"{type(self).__name__}")
        if state.get("tasks_sha256") != self._keys_digest():
            raise ValueError(f"state was saved for another task list ({str(state.get('num_tasks'))[:20]} tasks, "
                             f"digest {str(state.get('tasks_sha256'))[:12]}...) than this sampler's "
                             f"{len(self.tasks)} tasks (digest {self._keys_digest()[:12]}...)")
        owner = type(self).__name__
        try:
            counters, outstanding, last_batch, rng = self._validated_base_state(state)
            extra = _check.mapping(state.get("extra", {}), "extra")
        except StateError as exc:
            raise exc.within(owner=owner) from None
        saved_attributes = dict(self.__dict__)
        try:
            # the validated base fields a hook may check its own fields against (removed again below)
            self._incoming_last_batch = list(last_batch)
            self._load_extra_state(dict(extra))  # validates before it changes anything
            del self._incoming_last_batch
        except Exception as exc:
            # all or nothing, even for a subclass hook that assigned some attributes before refusing (a hook
            # builds new objects and assigns them; it never edits the sampler's arrays in place)
            self.__dict__.clear()
            self.__dict__.update(saved_attributes)
            if isinstance(exc, StateError):
                raise exc.within("extra.", owner) from None
            if isinstance(exc, ValueError):
                raise
            raise ValueError(f"malformed {owner} state 'extra': {type(exc).__name__}: {exc}") from None
        self._counters = counters
        self._outstanding = outstanding
        self._last_batch = last_batch
        self._rng = rng

    def _validated_base_state(self, state: Mapping[str, Any]) -> tuple[dict[str, float], dict[int, int], list[int],
                                                                        np.random.Generator]:
        """Every base field of ``state``, converted and checked (types, ranges, finiteness, the counters'
        relations), nothing assigned. Raises :class:`~envsched.errors.StateError`."""
        _check.whole(state.get("num_tasks"), "num_tasks", low=len(self.tasks), high=len(self.tasks))
        raw = _check.mapping(state.get("counters"), "counters", keys=tuple(self._counters))
        unknown = sorted(map(str, set(raw) - set(self._counters)))
        if unknown:
            raise StateError("counters", f"has unknown counters {unknown[:5]}")
        counters: dict[str, float] = {}
        for k in self._counters:
            if k == "cost":
                counters[k] = _check.finite(raw[k], "counters.cost", low=0.0)
            else:
                counters[k] = _check.whole(raw[k], f"counters.{k}", high=_MAX_COUNT)
        # what the sampler can reach: a group has at least one rollout, and a dispatch ends at most once
        for small, big in (("signal_groups", "groups"), ("groups", "episodes"), ("unscored_episodes", "episodes")):
            if counters[small] > counters[big]:
                raise StateError(f"counters.{small}", f"({counters[small]}) cannot exceed counters.{big} "
                                                             f"({counters[big]})")
        raw_out = _check.mapping(state.get("outstanding"), "outstanding")
        outstanding: dict[int, int] = {}
        for key, c in raw_out.items():
            if key not in self._pos:
                raise StateError("outstanding", f"names task {str(key)[:60]!r}, which is not in this "
                                                       "sampler's tasks")
            field = f"outstanding[{str(key)[:60]!r}]"
            if not isinstance(c, int):  # a dispatch count is written as an integer, never 2.0
                raise StateError(field, f"must be an integer count in [0, {_MAX_COUNT}], got {c!r:.40}")
            c = _check.whole(c, field, high=_MAX_COUNT)
            if c > 0:
                outstanding[self._pos[key]] = c
        if counters["discarded_groups"] + sum(outstanding.values()) > counters["dispatched_groups"]:
            raise StateError("outstanding", "and counters.discarded_groups exceed "
                                                   f"counters.dispatched_groups ({counters['dispatched_groups']})")
        limit = self.max_sample_size() or MAX_BATCH
        raw_last = _check.sequence(state.get("last_batch", []), "last_batch", max_length=limit)
        for i, k in enumerate(raw_last):
            if not isinstance(k, str) or k not in self._pos:
                raise StateError(f"last_batch[{i}]", f"must be a task key of this sampler, got {str(k)[:60]!r}")
        last_batch = [self._pos[k] for k in raw_last]
        if self.distinct_per_batch and len(set(last_batch)) != len(last_batch):
            raise StateError("last_batch", f"repeats a task, which {type(self).__name__} never does")
        if len(last_batch) > counters["dispatched_groups"]:
            raise StateError("last_batch", "is longer than counters.dispatched_groups")
        if "rng" not in state:
            raise StateError("rng", "is missing (the random generator state)")
        rng = _check.rng_from_state(state["rng"], "rng", bit_generator=self._rng.bit_generator.state["bit_generator"])
        return counters, outstanding, last_batch, rng

    # ------------------------------------------------------------------ hooks for subclasses
    def max_sample_size(self) -> int | None:
        """Largest ``n`` one call to :meth:`sample` accepts: the pool's size when a batch holds distinct
        tasks, else :data:`MAX_BATCH`."""
        return len(self.tasks) if self.distinct_per_batch else MAX_BATCH

    @abstractmethod
    def _select(self, n: int) -> list[int]:
        """Called by :meth:`sample` with a validated ``n``: return ``n`` task positions (fewer only at the end of
        a finite enumeration, as :class:`~envsched.samplers.simple.SequentialSampler` does); the trainer gets
        ``tasks[p]`` for each. It is the last step of :meth:`sample` that a subclass writes, so a ``_select``
        that changes state either commits last, after everything that can raise, or restores the state in
        :meth:`_select_rollback`: either way a ``sample`` that raises changes nothing."""

    def _select_checkpoint(self) -> Any:
        """Called by :meth:`sample` before :meth:`_select`: whatever :meth:`_select_rollback` needs to undo a
        selection that raised (the random generator is restored by the base class). A subclass whose
        ``_select`` changes its state before it can fail returns that state here (cheaply: the scalars and
        the arrays it replaces); one that computes first and commits last returns nothing."""
        return None

    def _select_rollback(self, checkpoint: Any) -> None:  # noqa: B027 - optional hook
        """Undo a failed :meth:`_select` with what :meth:`_select_checkpoint` returned."""

    def _observe(self, group: GroupResult) -> None:  # noqa: B027 - optional hook
        """Called by :meth:`update` after validation and counting; learning samplers override it."""

    def _on_discard(self, position: int) -> None:  # noqa: B027 - optional hook
        """Called by :meth:`discard` after a dispatch of ``position`` was released."""

    def _extra_metrics(self) -> dict[str, float]:
        return {}

    def _extra_state(self) -> dict[str, Any]:
        """Subclass state for :meth:`state_dict` (JSON-serialisable)."""
        return {}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore :meth:`_extra_state`'s output; validate fully before changing anything (check with
        :mod:`envsched.validation`, raising its ``StateError`` with the field's name relative to
        ``extra``), then assign new objects: never edit the sampler's arrays in place."""

    # ------------------------------------------------------------------ internals
    def _release(self, pos: int) -> None:
        c = self._outstanding[pos] - 1
        if c:
            self._outstanding[pos] = c
        else:
            del self._outstanding[pos]

    def _keys_digest(self) -> str:
        """SHA-256 of the task keys in order (what a state names its pool by); computed once, as the keys
        never change after construction (a pool of 100,000 tasks took about 0.05 s per dump and per load)."""
        digest = self.__dict__.get("_keys_digest_cache")
        if digest is None:
            h = hashlib.sha256()
            for k in self._keys:
                h.update(k.encode())
                h.update(b"\0")
            digest = self._keys_digest_cache = h.hexdigest()
        return digest

    def _validate_update(self, task: Any, rewards: Any, costs: Any) -> GroupResult:
        pos = self.position_of(task)
        key = self._keys[pos]
        if isinstance(rewards, str | bytes | Mapping) or not isinstance(rewards, Sequence | np.ndarray):
            raise ValueError(f"rewards for task {key!r} must be a sequence of numbers or None, "
                             f"got {type(rewards).__name__}")
        if len(rewards) == 0:
            raise ValueError(f"rewards for task {key!r} are empty: a group has at least one rollout")
        low, high = self.reward_range
        lo, hi = low - _RANGE_TOLERANCE, high + _RANGE_TOLERANCE
        clean: list[float | None] = []
        # the common case, plain floats inside the range (NaN and inf fail the comparison), in one pass;
        # anything else goes through the checks below, which name the offending reward
        if all(type(r) is float and lo <= r <= hi for r in rewards):
            clean = [min(max(r, low), high) for r in rewards]
        else:
            for i, r in enumerate(rewards):
                if r is None:
                    clean.append(None)
                    continue
                if not is_number(r):
                    raise ValueError(f"rewards[{i}] for task {key!r} must be a number or None, got {r!r}")
                r = float(r)
                if not math.isfinite(r):
                    raise ValueError(f"rewards[{i}] for task {key!r} is {r}: rewards must be finite "
                                     "(use None for a rollout the environment could not score)")
                if r < lo or r > hi:
                    raise ValueError(f"rewards[{i}] for task {key!r} is {r}, outside the declared reward range "
                                     f"[{low}, {high}]")
                clean.append(min(max(r, low), high))
        cost_arr: np.ndarray | None = None
        if costs is not None:
            if isinstance(costs, str | bytes | Mapping) or not isinstance(costs, Sequence | np.ndarray):
                raise ValueError(f"costs for task {key!r} must be a sequence of numbers, got {type(costs).__name__}")
            if len(costs) != len(clean):
                raise ValueError(f"costs for task {key!r} have {len(costs)} entries for {len(clean)} rewards: "
                                 "give one cost per rollout")
            vals = []
            for i, c in enumerate(costs):
                if not is_number(c):
                    raise ValueError(f"costs[{i}] for task {key!r} must be a number, got {c!r}")
                c = float(c)
                if not math.isfinite(c) or c < 0:
                    raise ValueError(f"costs[{i}] for task {key!r} is {c}: costs must be finite and >= 0")
                vals.append(c)
            cost_arr = np.asarray(vals, dtype=float)
            if not math.isfinite(self._counters["cost"] + sum(vals)):
                raise ValueError(f"costs for task {key!r} sum to more than a float can count: the cost counter "
                                 "would become infinite (report costs in a larger unit)")
        if self.require_dispatch and self._outstanding.get(pos, 0) == 0:
            raise ValueError(f"update for task {key!r} without an outstanding dispatch: it was not drawn by "
                             "sample(), or its group was already reported")
        return GroupResult(pos, clean, cost_arr, self.reward_range)
