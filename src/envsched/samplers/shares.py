"""Per-source shares: a trainer fixes how much of each batch comes from each environment.

RFC 013 leaves per-environment mixing to the trainer (prime-rl's per-env ``ratio``, slime's data sources,
a recipe's fixed mixture); a sampler then selects *within* each source. :class:`SharesSampler` does that:
it holds one :class:`~envsched.samplers.base.TaskSampler` per source (any sampler: uniform, the curriculum,
EnvSched over that source's tasks) and splits every ``sample(n)`` into per-source quotas that follow the
fixed shares exactly, instead of letting a scheduler's own environment preferences fight the mixture.

Quotas are deterministic and carry their rounding: source ``s`` with share ``p_s`` (normalised) is owed
``carry_s + n * p_s`` items; each gets the integer part, the remaining items go to the largest fractional
parts (ties: the order of ``shares``), and the rest carries to the next batch. So every batch has exactly
``n`` tasks, and after any number of batches each source's cumulative count differs from its exact
share of all draws by less than one task. Feedback is routed to the source the task came from.

The wrapper is itself a TaskSampler (``sample``/``update``/``metrics``/``state_dict``/``load_state_dict``,
RFC counters as attributes, ``tasks``), so it plugs into envsched's trainer integrations.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import envsched.validation as _check
from envsched.errors import StateError
from envsched.pool.pool import TaskPool
from envsched.pool.spec import task_key
from envsched.samplers.base import MAX_BATCH, BaseSampler, TaskSampler
from envsched.validation import is_int, is_number

__all__ = ["SHARES_STATE_FORMAT", "SharesSampler", "allocate_quotas"]

SHARES_STATE_FORMAT = "envsched.shares/1"
_COUNTERS = ("groups", "signal_groups", "episodes", "unscored_episodes", "cost", "dispatched_groups",
             "discarded_groups", "outstanding_groups")
#: A carried rounding remainder lies in (-1, 1); the slack covers the 1e-9 rounding guard and float error.
_CARRY_BOUND = 1.0 + 1e-6


def allocate_quotas(n: int, shares: Mapping[str, float], carry: Mapping[str, float] | None = None,
                    ) -> tuple[dict[str, int], dict[str, float]]:
    """Split ``n`` items by ``shares`` (normalised) with carried rounding; returns ``(quotas, new_carry)``.

    Largest-remainder rounding of ``carry_s + n * share_s``; ties go to the earlier source in ``shares``.
    ``sum(quotas) == n`` always, and the carried remainders always sum to zero and lie in [-1, 1] (a carry
    outside that range, which this function never returns, is refused with ``ValueError``: it would make the
    rounding loop run for as many steps as the carry is large).
    """
    total = float(sum(shares.values()))
    carry = carry or {}
    for s, c in carry.items():
        if not is_number(c) or not abs(c) <= _CARRY_BOUND:
            raise ValueError(f"carry of source {s!r} must be a number in [-1, 1] (a rounding remainder), "
                             f"got {c!r:.40}")
    owed = {s: carry.get(s, 0.0) + n * (w / total) for s, w in shares.items()}
    quotas = {s: max(0, math.floor(v + 1e-9)) for s, v in owed.items()}
    left = n - sum(quotas.values())
    order = sorted(shares, key=lambda s: (-(owed[s] - quotas[s]), list(shares).index(s)))
    if left > 0:
        eligible = [s for s in order if shares[s] > 0]
        for i in range(left):
            quotas[eligible[i % len(eligible)]] += 1
    elif left < 0:  # only after a carry pushed floors above n (cannot happen with valid carries; kept safe)
        for s in reversed(order):
            while left < 0 and quotas[s] > 0:
                quotas[s] -= 1
                left += 1
    new_carry = {s: owed[s] - quotas[s] for s in shares}
    return quotas, new_carry


class SharesSampler:
    """A TaskSampler that respects fixed per-source shares, selecting within each source by its own sampler.

    Args:
        samplers: ``{source: TaskSampler}``, one sampler per source (environment).
        shares: ``{source: weight}``, non-negative, positive sum; normalised. Same keys as ``samplers``.
        source_of: maps a task spec to its source, for routing ``update`` (default: the spec's ``env``).

    Build it from one pool with :meth:`from_pool`.
    """

    def __init__(self, samplers: Mapping[str, TaskSampler], shares: Mapping[str, float], *,
                 source_of: Callable[[Any], str] | None = None) -> None:
        if not isinstance(samplers, Mapping) or not samplers:
            raise ValueError("samplers must be a non-empty mapping {source: TaskSampler}")
        if not isinstance(shares, Mapping):
            raise ValueError(f"shares must be a mapping {{source: weight}}, got {type(shares).__name__}")
        if set(shares) != set(samplers):
            missing, extra = sorted(set(samplers) - set(shares)), sorted(set(shares) - set(samplers))
            raise ValueError(f"shares and samplers must name the same sources; no share for {missing}, "
                             f"no sampler for {extra}")
        for s, w in shares.items():
            if not is_number(w) or not math.isfinite(w) or w < 0:
                raise ValueError(f"share of source {s!r} must be a finite number >= 0, got {w!r}")
        if sum(shares.values()) <= 0:
            raise ValueError("shares must have a positive sum")
        for s, smp in samplers.items():
            for m in ("sample", "update", "state_dict", "load_state_dict"):
                if not callable(getattr(smp, m, None)):
                    raise TypeError(f"sampler of source {s!r} ({type(smp).__name__}) has no {m}(): not a TaskSampler")
        self.sources: list[str] = list(shares)
        self.samplers: dict[str, TaskSampler] = {s: samplers[s] for s in self.sources}
        total = float(sum(shares.values()))
        self.shares: dict[str, float] = {s: float(shares[s]) / total for s in self.sources}
        self.source_of = source_of or _env_of
        self._source_by_key = _sources_by_key(self.samplers)
        self._carry: dict[str, float] = dict.fromkeys(self.sources, 0.0)
        self._drawn: dict[str, int] = dict.fromkeys(self.sources, 0)
        self._last_quotas: dict[str, int] = dict.fromkeys(self.sources, 0)

    @classmethod
    def from_pool(cls, tasks: TaskPool | Sequence[Any], shares: Mapping[str, float],
                  make_sampler: Callable[[list[Any], str], TaskSampler], *, key: str = "env") -> SharesSampler:
        """Split ``tasks`` by their ``key`` field (default ``env``) and build one sampler per source with
        ``make_sampler(source_tasks, source)``. Every source in ``shares`` must have tasks, and every task's
        source must have a share (use share 0 to keep a source's tasks out of training)."""
        by_source: dict[str, list[Any]] = {}
        for t in tasks:
            src = t.get(key) if isinstance(t, Mapping) else getattr(t, key, None)
            if src is None:
                raise ValueError(f"task {task_key(t)!r} has no {key!r} field to assign it a source")
            by_source.setdefault(str(src), []).append(t)
        if not isinstance(shares, Mapping):
            raise ValueError(f"shares must be a mapping {{source: weight}}, got {type(shares).__name__}")
        no_share = sorted(set(by_source) - set(shares))
        no_tasks = sorted(set(shares) - set(by_source))
        if no_share or no_tasks:
            raise ValueError(f"shares must cover exactly the pool's sources ({sorted(by_source)}); "
                             f"without a share: {no_share}; without tasks: {no_tasks}")
        samplers = {s: make_sampler(by_source[s], s) for s in shares}

        def source_of(t: Any) -> str:
            return str(t.get(key) if isinstance(t, Mapping) else getattr(t, key, None))

        return cls(samplers, shares, source_of=source_of)

    # ------------------------------------------------------------------ introspection
    @property
    def tasks(self) -> list[Any]:
        """Every source's tasks (from each sampler's ``tasks``), in source order."""
        out: list[Any] = []
        for s, smp in self.samplers.items():
            tasks = getattr(smp, "tasks", None)
            if tasks is None:
                raise AttributeError(f"sampler of source {s!r} has no .tasks")
            out.extend(tasks)
        return out

    @property
    def unwrapped(self) -> SharesSampler:
        """This sampler: a composite is the innermost sampler that answers for all its sources (each source's
        own sampler is ``samplers[source]``, with its own ``unwrapped``)."""
        return self

    @property
    def reward_range(self) -> tuple[float, float]:
        """The reward range every source's sampler declares (``AttributeError`` when they differ or declare none)."""
        ranges = {tuple(map(float, r)) for r in (getattr(smp, "reward_range", None) for smp in self.samplers.values())
                  if r is not None}
        if len(ranges) != 1:
            raise AttributeError(f"the sources' samplers declare {len(ranges)} reward ranges "
                                 f"({sorted(ranges)[:4]}); SharesSampler has no single reward_range")
        low, high = next(iter(ranges))
        return low, high

    def outstanding(self) -> dict[str, int]:
        """Outstanding dispatches per task key, over every source (each source's ``outstanding()``)."""
        out: dict[str, int] = {}
        for s, smp in self.samplers.items():
            if not callable(getattr(smp, "outstanding", None)):
                raise AttributeError(f"sampler of source {s!r} ({type(smp).__name__}) has no outstanding()")
            out.update(smp.outstanding())
        return out

    def source_of_task(self, task: Any) -> str:
        """The source a task (a spec, or its key) belongs to: the source whose sampler holds its key, else
        ``source_of(task)`` for a spec. ``KeyError`` naming the task when neither knows it."""
        if isinstance(task, str):
            if task in self._source_by_key:
                return self._source_by_key[task]
            raise KeyError(f"unknown task {task!r:.200}: no source's sampler holds it")
        key = task_key(task)  # KeyError for a spec without an id
        if key in self._source_by_key:
            return self._source_by_key[key]
        src = self.source_of(task)
        if src not in self.samplers:
            raise KeyError(f"task {key!r} belongs to source {src!r}, which has no share (sources: {self.sources})")
        return src

    def quotas(self, n: int) -> dict[str, int]:
        """The quotas the next ``sample(n)`` would use (no state changes)."""
        return allocate_quotas(self._check_n(n), self.shares, self._carry)[0]

    @property
    def drawn(self) -> dict[str, int]:
        """Tasks drawn per source so far."""
        return dict(self._drawn)

    def _counter(self, name: str) -> float:
        total = 0.0
        for smp in self.samplers.values():
            v = getattr(smp, name, None)
            if v is None and callable(getattr(smp, "metrics", None)):
                v = smp.metrics().get(name, 0.0)
            total += float(v or 0.0)
        return total

    @property
    def groups(self) -> int:
        return int(self._counter("groups"))

    @property
    def signal_groups(self) -> int:
        return int(self._counter("signal_groups"))

    @property
    def episodes(self) -> int:
        return int(self._counter("episodes"))

    @property
    def cost(self) -> float:
        return self._counter("cost")

    @property
    def signal_groups_per_episode(self) -> float:
        return self.signal_groups / self.episodes if self.episodes else 0.0

    @property
    def signal_groups_per_cost(self) -> float:
        return self.signal_groups / self.cost if self.cost > 0 else 0.0

    @property
    def zero_signal_fraction(self) -> float:
        return 1.0 - self.signal_groups / self.groups if self.groups else 0.0

    # ------------------------------------------------------------------ the protocol
    def _check_n(self, n: Any) -> int:
        if not is_int(n) or n <= 0:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        if n > MAX_BATCH:
            raise ValueError(f"n={n} exceeds the batch limit MAX_BATCH={MAX_BATCH}")
        return int(n)

    def sample(self, n: int) -> list[Any]:
        """``n`` tasks: each source's quota, drawn from its sampler, concatenated in source order.

        Raises ``ValueError`` (no state changed) if ``n`` is invalid or a quota is one a source's sampler
        refuses (more than its ``max_sample_size()``, or what its ``check_sample_size`` refuses): every quota
        is checked before any source draws. Each envsched sampler's ``sample`` is atomic; a source sampler of
        another kind is put back from a state taken before the batch if a later source fails. (An envsched
        source that fails after its quota was checked -- an internal error, not a refusal -- leaves the
        sources drawn before it with their draws: a state taken before every batch would cost as much as
        a checkpoint.)"""
        n = self._check_n(n)
        quotas, carry = allocate_quotas(n, self.shares, self._carry)
        drawing = [s for s in self.sources if quotas[s]]
        for s in drawing:
            q, smp = quotas[s], self.samplers[s]
            limit_fn = getattr(smp, "max_sample_size", None)
            limit = limit_fn() if callable(limit_fn) else None
            if limit is not None and q > limit:
                raise ValueError(f"n={n} exceeds what source {s!r} can draw: it owes {q} tasks in this batch but its "
                                 f"sampler draws at most {limit} per batch; use a smaller n or a sampler that "
                                 "repeats tasks")
            check = getattr(smp, "check_sample_size", None)
            if callable(check):
                try:
                    check(q)
                except ValueError as exc:
                    raise ValueError(f"source {s!r} cannot draw its quota of {q} tasks in this batch of {n}: "
                                     f"{exc}") from None
        backups = {s: copy.deepcopy(self.samplers[s].state_dict()) for s in drawing[:-1]
                   if not isinstance(self.samplers[s], BaseSampler)}
        out: list[Any] = []
        done: list[str] = []
        try:
            for s in drawing:
                q = quotas[s]
                got = self.samplers[s].sample(q)
                done.append(s)
                if len(got) != q:
                    raise RuntimeError(f"sampler of source {s!r} returned {len(got)} tasks for a quota of {q}")
                out.extend(got)
        except BaseException:
            for s in done:
                if s in backups:
                    self.samplers[s].load_state_dict(backups[s])
            raise
        for s in drawing:
            self._drawn[s] += quotas[s]
        self._carry, self._last_quotas = carry, quotas
        return out

    def update(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None) -> None:
        """Route one group's feedback to the sampler of the task's source (:meth:`source_of_task`)."""
        self.samplers[self.source_of_task(task)].update(task, rewards, costs)

    def discard(self, task: Any) -> None:
        """Release an outstanding dispatch in the task's source sampler (if that sampler supports it)."""
        src = self.source_of_task(task)
        smp = self.samplers[src]
        if not callable(getattr(smp, "discard", None)):
            raise ValueError(f"source {src!r} has no sampler supporting discard()")
        smp.discard(task)

    def metrics(self) -> dict[str, float]:
        """Summed RFC counters and rates, then per source ``{source}/{metric}`` plus its ``share/target``,
        ``share/drawn`` (realised share of all draws) and ``quota/last``."""
        m: dict[str, float] = {name: float(self._counter(name)) for name in _COUNTERS}
        m["signal_groups_per_episode"] = self.signal_groups_per_episode
        m["signal_groups_per_cost"] = self.signal_groups_per_cost
        m["zero_signal_fraction"] = self.zero_signal_fraction
        total_drawn = sum(self._drawn.values())
        for s, smp in self.samplers.items():
            if callable(getattr(smp, "metrics", None)):
                for k, v in smp.metrics().items():
                    m[f"{s}/{k}"] = float(v)
            m[f"{s}/share/target"] = self.shares[s]
            m[f"{s}/share/drawn"] = self._drawn[s] / total_drawn if total_drawn else 0.0
            m[f"{s}/quota/last"] = float(self._last_quotas[s])
        return m

    def state_dict(self) -> dict[str, Any]:
        """Shares, carried rounding, per-source draw counts and every source sampler's state."""
        return {"format": SHARES_STATE_FORMAT, "sources": list(self.sources), "shares": dict(self.shares),
                "carry": dict(self._carry), "drawn": dict(self._drawn), "last_quotas": dict(self._last_quotas),
                "samplers": {s: smp.state_dict() for s, smp in self.samplers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. ``ValueError`` (nothing changed) if it was written for other
        sources or shares, or a source sampler refuses its state."""
        if not isinstance(state, Mapping) or state.get("format") != SHARES_STATE_FORMAT:
            found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"not a SharesSampler state (format {str(found)[:60]!r}, expected "
                             f"{SHARES_STATE_FORMAT!r})")
        try:
            carry, drawn, last, inner = self._validated_state(state)
        except StateError as exc:
            raise exc.within(owner="SharesSampler") from None
        backup = {s: copy.deepcopy(smp.state_dict()) for s, smp in self.samplers.items()}
        done: list[str] = []
        try:
            for s in self.sources:
                self.samplers[s].load_state_dict(inner[s])
                done.append(s)
        except Exception as exc:
            for s in done:
                self.samplers[s].load_state_dict(backup[s])
            if isinstance(exc, StateError):
                raise exc.within(f"samplers[{self.sources[len(done)]!r}].", "SharesSampler") from None
            raise
        self._carry, self._drawn, self._last_quotas = carry, drawn, last

    def _validated_state(self, state: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, int], dict[str, int],
                                                                   dict[str, Any]]:
        """Every field of a saved state, checked against what this sampler can reach; nothing assigned."""
        sources = _check.sequence(state.get("sources"), "sources")
        if sources != self.sources:
            raise ValueError(f"state is for sources {str(sources)[:200]}, this sampler has {self.sources}")
        saved = _check.mapping(state.get("shares"), "shares", keys=tuple(self.sources))
        for s in self.sources:
            w = _check.finite(saved[s], f"shares[{s!r}]", low=0.0, high=1.0)
            if not math.isclose(w, self.shares[s], abs_tol=1e-12):
                raise ValueError(f"state was saved with shares {dict(saved)}, this sampler has {self.shares}")
        raw_carry = _check.mapping(state.get("carry"), "carry", keys=tuple(self.sources))
        carry = {s: _check.finite(raw_carry[s], f"carry[{s!r}]", low=-_CARRY_BOUND, high=_CARRY_BOUND)
                 for s in self.sources}
        if abs(math.fsum(carry.values())) > 1e-6:
            raise StateError("carry", f"remainders must sum to 0 (they move quota between sources), "
                                             f"got a sum of {math.fsum(carry.values())!r}")
        for s in self.sources:
            if self.shares[s] == 0 and carry[s] != 0:
                raise StateError(f"carry[{s!r}]", f"must be 0 for a source with share 0, got {carry[s]!r}")
        raw_drawn = _check.mapping(state.get("drawn"), "drawn", keys=tuple(self.sources))
        drawn = {s: _check.whole(raw_drawn[s], f"drawn[{s!r}]") for s in self.sources}
        raw_last = _check.mapping(state.get("last_quotas", {}), "last_quotas")
        last = {s: _check.whole(raw_last.get(s, 0), f"last_quotas[{s!r}]", high=min(drawn[s], MAX_BATCH))
                for s in self.sources}
        raw_inner = _check.mapping(state.get("samplers"), "samplers", keys=tuple(self.sources))
        return carry, drawn, last, {s: raw_inner[s] for s in self.sources}

    def __repr__(self) -> str:
        parts = ", ".join(f"{s}={self.shares[s]:.3g}:{type(self.samplers[s]).__name__}" for s in self.sources)
        return f"SharesSampler({parts})"


def _sources_by_key(samplers: Mapping[str, Any]) -> dict[str, str]:
    """``{task key: source}`` over the sources whose sampler lists its ``tasks``; a key in two sources is refused."""
    out: dict[str, str] = {}
    for s, smp in samplers.items():
        for t in getattr(smp, "tasks", None) or ():
            k = task_key(t)
            if out.setdefault(k, s) != s:
                raise ValueError(f"task {k!r} is in the samplers of sources {out[k]!r} and {s!r}: a task must "
                                 "belong to one source")
    return out


def _env_of(task: Any) -> str:
    env = task.get("env") if isinstance(task, Mapping) else getattr(task, "env", None)
    if env is None:
        raise ValueError(f"task {task_key(task)!r} has no 'env': pass source_of= to route it")
    return str(env)
