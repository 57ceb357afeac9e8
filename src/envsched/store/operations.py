"""The logged calls of a :class:`~envsched.store.DurableSampler`, as named operation records.

A transaction of a durable sampler applies a list of operations -- :class:`SampleOp`, :class:`UpdateOp`,
:class:`DiscardOp`, or a :class:`RefusedOp` that stands for an item refused before it became an operation --
and logs one event for each one applied. Every operation answers four questions, in this order, for the
sampler ``d`` running it (``DurableSampler._run_many``):

1. :meth:`~Operation.check`: may it go on? (lease checks; an answer such as ``"already_applied"`` ends it);
2. :meth:`~Operation.apply`: the call on the wrapped sampler (bad input raises and changes nothing);
3. :meth:`~Operation.payload`: the event to log for the result (laid out by :mod:`envsched.store.schema`);
4. :meth:`~Operation.after`: what to record with the event (issued leases, a consumed lease).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from envsched.pool.spec import task_key
from envsched.store.leases import LeaseOutcome, UnknownLeaseError, logged_group
from envsched.store.schema import discard_payload, sample_payload, update_payload
from envsched.validation import is_int

__all__ = ["GO", "DiscardOp", "Operation", "RefusedOp", "SampleOp", "UpdateOp"]

GO: Any = object()  #: :meth:`Operation.check`'s answer: go on and apply the call


class Operation:
    """One call to apply and log (see the module docstring). ``kind`` is its event kind."""

    kind: ClassVar[str]

    def check(self, d: Any, tx: Any) -> Any:
        return GO

    def apply(self, d: Any) -> Any:  # pragma: no cover - every operation defines it
        raise NotImplementedError

    def payload(self, result: Any) -> dict[str, Any]:  # pragma: no cover - every operation defines it
        raise NotImplementedError

    def after(self, d: Any, tx: Any, seq: int) -> None:
        """Called once the operation's event ``seq`` is in the transaction."""


@dataclass
class SampleOp(Operation):
    """Draw ``n`` groups; with ``leases`` (one new id per group) they are issued with the draw."""

    n: Any
    leases: list[str] | None = None
    kind: ClassVar[str] = "sample"

    def __post_init__(self) -> None:
        leases, n = self.leases, self.n
        if leases is not None:
            valid_n = is_int(n) and n > 0
            if valid_n and (len(leases) != n or len(set(leases)) != len(leases)
                            or not all(isinstance(x, str) and x for x in leases)):
                raise ValueError(f"leases must be {n!r} distinct non-empty strings, one per drawn group")
        self._keys: list[str] = []

    def check(self, d: Any, tx: Any) -> Any:
        if self.leases is not None:
            taken = d.store.existing_leases(tx, self.leases)
            if taken:
                raise UnknownLeaseError(f"lease id {sorted(taken)[0]!r} was already issued in store "
                                        f"{d.store.where}: lease ids are never reused")
        return GO

    def apply(self, d: Any) -> list[Any]:
        tasks = d.sampler.sample(self.n)
        self._keys = [task_key(t) for t in tasks]
        return tasks

    def payload(self, result: Any) -> dict[str, Any]:
        return sample_payload(self.n, self._keys, self.leases)

    def after(self, d: Any, tx: Any, seq: int) -> None:
        if self.leases is not None:
            d.store.issue_leases(tx, seq, list(zip(self.leases, self._keys, strict=True)))


@dataclass
class UpdateOp(Operation):
    """Report one group; under ``lease`` it consumes the lease (a retry is answered, not applied)."""

    task: Any
    rewards: Sequence[float | None]
    costs: Sequence[float] | None = None
    lease: str | None = None
    kind: ClassVar[str] = "update"

    def check(self, d: Any, tx: Any) -> Any:
        if self.lease is None:
            return GO
        key = self.task if isinstance(self.task, str) else safe_key(self.task)
        return d._lease_check(tx, self.lease, key, "update", (self.rewards, self.costs))

    def apply(self, d: Any) -> str:
        d.sampler.update(self.task, self.rewards, self.costs)
        return "applied"

    def payload(self, result: Any) -> dict[str, Any]:
        key = self.task if isinstance(self.task, str) else task_key(self.task)
        return update_payload(key, self.rewards, self.costs, self.lease)

    def after(self, d: Any, tx: Any, seq: int) -> None:
        if self.lease is not None:
            d._close(self.lease, seq, LeaseOutcome.UPDATE)
            d._groups[self.lease] = logged_group(self.rewards, self.costs)


@dataclass
class DiscardOp(Operation):
    """Give one group back without rewards (``reclaimed``: its lease expired), consuming ``lease``."""

    task: Any
    reason: str | None = None
    lease: str | None = None
    reclaimed: bool = False
    kind: ClassVar[str] = "discard"

    def check(self, d: Any, tx: Any) -> Any:
        if self.lease is None:
            return GO
        key = self.task if isinstance(self.task, str) else safe_key(self.task)
        return d._lease_check(tx, self.lease, key, "discard")

    def apply(self, d: Any) -> None:
        d.sampler.discard(self.task)

    def payload(self, result: Any) -> dict[str, Any]:
        key = self.task if isinstance(self.task, str) else task_key(self.task)
        return discard_payload(key, self.reason, self.lease, self.reclaimed)

    def after(self, d: Any, tx: Any, seq: int) -> None:
        if self.lease is not None:
            d._close(self.lease, seq, LeaseOutcome.RECLAIM if self.reclaimed else LeaseOutcome.DISCARD)


@dataclass
class RefusedOp(Operation):
    """An item of a batch refused before it became an operation (a malformed tuple): applying it raises
    ``error``, which becomes that item's result."""

    error: BaseException
    kind: ClassVar[str] = "update"

    def apply(self, d: Any) -> Any:
        raise self.error


def safe_key(task: Any) -> str:
    """The task's key, or a short repr when it has none (for messages)."""
    try:
        return task_key(task)
    except KeyError:
        return repr(task)[:60]
