"""RFC 013's three samplers: sequential (evaluation), uniform (the baseline) and the signal curriculum."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

import envsched.validation as _check
from envsched.errors import InvalidValueError, StateError
from envsched.pool.pool import TaskPool
from envsched.samplers.base import BaseSampler, GroupResult
from envsched.validation import check_int, check_number, is_int

__all__ = ["CurriculumSampler", "SequentialSampler", "UniformSampler"]


class SequentialSampler(BaseSampler):
    """Deterministic enumeration of ``tasks`` crossed with ``seeds``, for evaluation.

    Order: task-major -- ``(task0, seed0), (task0, seed1), ..., (task1, seed0), ...``. Each emitted spec is
    a copy of the task with its ``seed`` set (when ``seeds`` is given). When the enumeration is exhausted,
    ``sample(n)`` returns the remaining items (possibly fewer than ``n``, then ``[]``), unless
    ``wrap=True``, in which case it starts over. :attr:`exhausted` tells whether anything is left.
    ``update`` only moves the counters (RFC 013): it accepts any task of the pool, drawn or not, so a
    sampler iterated by OpenEnv's ``CollectRunner`` (which never calls ``sample``) can still be given its
    groups. The sampler is also an iterable over the whole enumeration (a valid ``tasks`` for
    ``CollectRunner``); iterating does not move the cursor of :meth:`sample`.
    """

    distinct_per_batch = False

    def __init__(self, tasks: TaskPool | Sequence[Any], seeds: Sequence[int] | None = None, *,
                 wrap: bool = False, reward_range: tuple[float, float] | None = None,
                 require_dispatch: bool = False) -> None:
        super().__init__(tasks, seed=0, reward_range=reward_range, require_dispatch=require_dispatch)
        if seeds is not None:
            seeds = list(seeds)
            if not seeds or not all(map(is_int, seeds)):
                raise InvalidValueError(f"seeds must be a non-empty list of integers, got {seeds!r}", name="seeds",
                                        value=seeds)
        self.seeds = seeds
        self.wrap = wrap
        self._cursor = 0

    def __len__(self) -> int:
        return len(self.tasks) * (len(self.seeds) if self.seeds else 1)

    @property
    def exhausted(self) -> bool:
        return not self.wrap and self._cursor >= len(self)

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self._item(i)

    def _item(self, i: int) -> Any:
        per = len(self.seeds) if self.seeds else 1
        task = self.tasks[i // per]
        if self.seeds is None:
            return task
        seed = int(self.seeds[i % per])
        return {**task, "seed": seed} if isinstance(task, Mapping) else task

    def _select(self, n: int) -> list[int]:
        total = len(self)
        per = len(self.seeds) if self.seeds else 1
        if self.wrap:
            idx = [(self._cursor + j) % total for j in range(n)]
            self._cursor = (self._cursor + n) % total
        else:
            idx = list(range(self._cursor, min(self._cursor + n, total)))
            self._cursor += len(idx)
        self._pending_items = idx
        return [i // per for i in idx]

    def sample(self, n: int) -> list[Any]:
        positions = super().sample(n)
        return [self._item(i) for i in self._pending_items][: len(positions)]

    def _select_checkpoint(self) -> Any:
        return self._cursor, getattr(self, "_pending_items", None)

    def _select_rollback(self, checkpoint: Any) -> None:
        self._cursor, self._pending_items = checkpoint

    def _extra_state(self) -> dict[str, Any]:
        return {"cursor": self._cursor}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        # with wrap the cursor is taken modulo the enumeration's length; without, it stops at the end
        top = len(self) - 1 if self.wrap else len(self)
        self._cursor = _check.whole(_check.mapping(extra, "", keys=("cursor",))["cursor"], "cursor", high=top)


class UniformSampler(BaseSampler):
    """Uniform sampling without replacement per epoch: the training baseline.

    Each epoch is a fresh random permutation of the tasks. When a batch crosses an epoch boundary, it
    takes the rest of the old epoch, then continues in a new permutation from which the tasks already in
    this batch are moved to the end, so a batch never holds a task twice. ``n`` can be at most the pool
    size.

    ``rng_seed`` is RFC 013's name for the generator's seed (``seed=`` is accepted as a keyword alias).
    Iterating the sampler draws one task at a time with :meth:`sample` without end, so it is a valid
    ``tasks`` for OpenEnv's ``CollectRunner`` (which takes one task per episode); bound it with
    ``itertools.islice`` elsewhere.
    """

    def __init__(self, tasks: TaskPool | Sequence[Any], rng_seed: int | None = 0, *,
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True,
                 seed: int | None = None) -> None:
        if seed is not None:
            if rng_seed not in (0, seed):
                raise ValueError(f"give the seed once: rng_seed={rng_seed!r} and seed={seed!r} disagree")
            rng_seed = seed
        super().__init__(tasks, seed=rng_seed, reward_range=reward_range, require_dispatch=require_dispatch)
        self.epoch = 0
        self._order: np.ndarray = np.empty(0, dtype=np.int64)
        self._cursor = 0

    def _new_epoch(self, avoid: set[int]) -> None:
        order = self._rng.permutation(len(self.tasks))
        if avoid:
            mask = np.isin(order, list(avoid))
            order = np.concatenate([order[~mask], order[mask]])
        self._order = order
        self._cursor = 0
        self.epoch += 1

    def _select(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            if self._cursor >= len(self._order):
                self._new_epoch(set(out))
            take = min(n - len(out), len(self._order) - self._cursor)
            out.extend(int(x) for x in self._order[self._cursor:self._cursor + take])
            self._cursor += take
        return out

    @property
    def rng_seed(self) -> int | None:
        """RFC 013's name for :attr:`seed`."""
        return self.seed

    def get_params(self) -> dict[str, Any]:
        """Constructor configuration; the seed is recorded once, as ``seed`` (stores and run files)."""
        params = super().get_params()
        params.pop("rng_seed", None)
        return params

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield self.sample(1)[0]

    def _extra_metrics(self) -> dict[str, float]:
        return {"epoch": float(self.epoch)}

    def _select_checkpoint(self) -> Any:
        return self._order, self._cursor, self.epoch  # _new_epoch replaces the order, never edits it

    def _select_rollback(self, checkpoint: Any) -> None:
        self._order, self._cursor, self.epoch = checkpoint

    def _extra_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "order": self._order.tolist(), "cursor": self._cursor}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        n = len(self.tasks)
        extra = _check.mapping(extra, "", keys=("epoch", "order", "cursor"))
        epoch = _check.whole(extra["epoch"], "epoch")
        raw = _check.sequence(extra["order"], "order")
        if len(raw) not in (0, n) or (len(raw) == 0) != (epoch == 0):
            raise StateError("order", f"must be empty before the first epoch and a permutation of the {n} "
                                             f"tasks after it (epoch {epoch}), got {len(raw)} entries")
        order = _check.int_array(raw, "order", high=n - 1)
        if order.size and np.unique(order).size != n:
            raise StateError("order", "is not a permutation of the tasks")
        cursor = _check.whole(extra["cursor"], "cursor", high=order.size)
        self._order, self._cursor, self.epoch = order, cursor, epoch


CurriculumKey = Literal["difficulty", "group", "id"]


class CurriculumSampler(BaseSampler):
    """RFC 013's signal-only curriculum.

    Statistics are kept per key ``k`` -- the task's ``difficulty`` tier, its ``group``, or its ``id``
    (a task without the chosen field is keyed by its id). After each group,
    ``s_k <- decay * s_k + successes`` and ``f_k <- decay * f_k + failures`` over the *scored* rollouts
    (success: ``reward >= success_threshold``). With ``p_k = (s_k + 1) / (s_k + f_k + 2)`` the key's weight
    is ``w_k = 1 - p_k**G - (1 - p_k)**G + epsilon``, ``G = group_size``: the probability that a group of
    binary rewards carries signal, floored so every key stays reachable. ``sample`` draws a key with
    probability proportional to ``w_k``, then a task uniformly without replacement within the key.
    No cost weighting (the RFC's latest revision removed it).
    """

    distinct_per_batch = False

    def __init__(self, tasks: TaskPool | Sequence[Any], group_size: int, key: CurriculumKey = "difficulty", *,
                 decay: float = 0.9, success_threshold: float = 1.0, epsilon: float = 0.05, seed: int | None = 0,
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True) -> None:
        super().__init__(tasks, seed=seed, reward_range=reward_range, require_dispatch=require_dispatch)
        group_size = check_int(group_size, "group_size", low=1)
        if key not in ("difficulty", "group", "id"):
            raise ValueError(f"key must be 'difficulty', 'group' or 'id', got {key!r}")
        check_number(decay, "decay", low=0, high=1, low_open=True)
        check_number(success_threshold, "success_threshold", finite=False)
        check_number(epsilon, "epsilon", low=0, low_open=True, finite=False)
        self.group_size = group_size
        self.key = key
        self.decay = decay
        self.success_threshold = success_threshold
        self.epsilon = epsilon
        key_of = []
        for i, t in enumerate(self.tasks):
            value = t.get(key) if isinstance(t, Mapping) else getattr(t, key, None)
            key_of.append(str(value) if value is not None else f"id:{self._keys[i]}")
        self.curriculum_keys: list[str] = sorted(set(key_of), key=_natural)
        kpos = {k: j for j, k in enumerate(self.curriculum_keys)}
        self._key_of = np.array([kpos[k] for k in key_of], dtype=np.int64)
        self._members = [np.flatnonzero(self._key_of == j) for j in range(len(self.curriculum_keys))]
        self._successes = np.zeros(len(self.curriculum_keys))
        self._failures = np.zeros(len(self.curriculum_keys))
        self._queues: list[list[int]] = [[] for _ in self.curriculum_keys]

    def success_probabilities(self) -> dict[str, float]:
        """``p_k`` per key (Beta(1, 1) prior: unseen keys at 0.5)."""
        p = (self._successes + 1) / (self._successes + self._failures + 2)
        return dict(zip(self.curriculum_keys, p.tolist(), strict=True))

    def weights(self) -> dict[str, float]:
        """Unnormalised ``w_k`` per key."""
        return dict(zip(self.curriculum_keys, self._weights().tolist(), strict=True))

    def _weights(self) -> np.ndarray:
        p = (self._successes + 1) / (self._successes + self._failures + 2)
        g = self.group_size
        return 1.0 - p**g - (1.0 - p) ** g + self.epsilon

    def _select(self, n: int) -> list[int]:
        w = self._weights()
        chosen_keys = self._rng.choice(len(w), size=n, p=w / w.sum())
        out = []
        queues: dict[int, list[int]] = {}  # working copies of the queues drawn from, committed at the end
        for k in chosen_keys.tolist():
            queue = queues.get(k)
            if queue is None:
                queue = queues[k] = list(self._queues[k])
            if not queue:
                queue.extend(int(x) for x in self._rng.permutation(self._members[k]))
            out.append(queue.pop())
        for k, queue in queues.items():
            self._queues[k] = queue
        return out

    def _observe(self, group: GroupResult) -> None:
        if group.scored.size == 0:  # an all-unscored group carries no evidence: no decay either
            return
        k = self._key_of[group.position]
        successes = float(np.sum(group.scored >= self.success_threshold))
        failures = float(group.scored.size) - successes
        self._successes[k] = self.decay * self._successes[k] + successes
        self._failures[k] = self.decay * self._failures[k] + failures

    def _extra_metrics(self) -> dict[str, float]:
        p = (self._successes + 1) / (self._successes + self._failures + 2)
        return {"curriculum_keys": float(len(self.curriculum_keys)), "mean_key_success_p": float(p.mean())}

    def _extra_state(self) -> dict[str, Any]:
        return {"keys": list(self.curriculum_keys), "successes": self._successes.tolist(),
                "failures": self._failures.tolist(), "queues": [list(q) for q in self._queues]}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        extra = _check.mapping(extra, "", keys=("keys", "successes", "failures", "queues"))
        k = len(self.curriculum_keys)
        keys = _check.sequence(extra["keys"], "keys")
        if keys != self.curriculum_keys:
            raise StateError("keys", f"differ from this sampler's curriculum keys ({k} keys by {self.key!r})")
        # decayed counts of scored rollouts: never negative, never more than a counter can hold
        s = _check.float_array(extra["successes"], "successes", length=k, low=0.0, high=_check.MAX_COUNT)
        f = _check.float_array(extra["failures"], "failures", length=k, low=0.0, high=_check.MAX_COUNT)
        raw_queues = _check.sequence(extra["queues"], "queues", length=k)
        queues = []
        for j, q in enumerate(raw_queues):
            members = self._members[j]
            arr = _check.int_array(q, f"queues[{j}]", max_length=members.size, high=len(self.tasks) - 1)
            if not np.isin(arr, members).all() or np.unique(arr).size != arr.size:
                raise StateError(f"queues[{j}]", f"must hold distinct tasks of key "
                                                        f"{self.curriculum_keys[j][:60]!r}")
            queues.append(arr.tolist())
        self._successes, self._failures, self._queues = s, f, queues


def _natural(value: str) -> tuple[int, float | str]:
    """Sort numeric keys numerically (tiers ``2 < 10``), then the rest alphabetically."""
    try:
        x = float(value)
        return (0, x) if math.isfinite(x) else (1, value)
    except ValueError:
        return (1, value)
