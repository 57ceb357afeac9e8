"""The lease rules, once: how an update or a discard naming a lease is answered.

A lease is issued with one dispatched group and consumed exactly once, by an update, a discard or a
reclaim (:class:`LeaseOutcome`). Both places that keep leases -- a :class:`~envsched.store.DurableSampler`'s
store and the sampler host of :mod:`envsched.distributed.host` -- describe what they know of a lease as a
:class:`LeaseRecord` and let :func:`resolve_lease` decide:

* no record: the lease was never issued -> :class:`UnknownLeaseError`;
* a record of another task -> :class:`UnknownLeaseError`;
* open -> :attr:`LeaseDecision.APPLY`;
* consumed by an update, and this is an update with the same rewards and costs -> ``ALREADY_APPLIED`` (a
  retry whose reply was lost); with other rewards -> :class:`LeaseConflictError`;
* otherwise (reclaimed, discarded, or a discard after an update) -> :class:`LeaseExpiredError`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envsched.errors import EnvSchedError

__all__ = ["LeaseConflictError", "LeaseDecision", "LeaseExpiredError", "LeaseOutcome", "LeaseRecord",
           "UnknownLeaseError", "logged_group", "resolve_lease"]


class LeaseExpiredError(EnvSchedError, ValueError):
    """An update (or discard) named a lease whose group was already given back: reclaimed after its lease
    expired, or discarded. Its rewards are not counted (the task can be drawn again)."""


class LeaseConflictError(LeaseExpiredError):
    """An update named a lease that an update with *other* rewards (or costs) already consumed: it is not a
    retry of that update, and its rewards are refused (a retry with the same rewards is answered
    ``"already_applied"``). Nothing is changed."""


class UnknownLeaseError(EnvSchedError, ValueError):
    """An update (or discard) named a lease that was never issued (by this host or, for a durable sampler,
    in this store), or a lease of another task. Nothing is changed."""


class LeaseOutcome(enum.StrEnum):
    """How a lease was consumed; the value is what a store's lease table records."""

    UPDATE = "update"
    DISCARD = "discard"
    RECLAIM = "reclaim"

    @property
    def status(self) -> str:
        """The word ``lease_status`` answers for a lease consumed this way."""
        return _STATUS[self]

    @classmethod
    def from_status(cls, status: str) -> LeaseOutcome | None:
        """The outcome whose :attr:`status` is ``status`` (``None`` for ``"open"``, ``"unknown"``...)."""
        return next((o for o, s in _STATUS.items() if s == status), None)


_STATUS = {LeaseOutcome.UPDATE: "applied", LeaseOutcome.DISCARD: "discarded", LeaseOutcome.RECLAIM: "reclaimed"}

#: The outcomes, as recorded (for checking a value read from a store).
OUTCOMES: tuple[str, ...] = tuple(o.value for o in LeaseOutcome)


class LeaseDecision(enum.Enum):
    """What :func:`resolve_lease` tells the caller to do."""

    APPLY = "apply"  #: the lease is open: apply the call (it consumes the lease)
    ALREADY_APPLIED = "already_applied"  #: a retry of the update that consumed the lease: answer, change nothing


@dataclass(frozen=True)
class LeaseRecord:
    """What the keeper of a lease knows of it.

    Attributes:
        key: the task the lease was issued for (``None``: not known, e.g. a host that only has a status).
        outcome: how it was consumed (``None`` while open).
        closed_by: where it was consumed, for messages (``" (event 12)"``; ``""`` when not known).
        logged: a function returning the logged ``(rewards, costs)`` of the consuming update (``None`` when
            they cannot be read: a retry is then told from a conflict as unequal).
    """

    key: str | None
    outcome: LeaseOutcome | None = None
    closed_by: str = ""
    logged: Callable[[], Any] | None = None


def logged_group(rewards: Any, costs: Any) -> tuple[Any, Any]:
    """The logged form of a group's rewards and costs (as an update event records them), for comparing a
    retry with the update that consumed its lease; input that has no such form compares unequal."""
    try:
        r = [None if x is None else float(x) for x in rewards]
        c = None if costs is None else [float(x) for x in costs]
    except (TypeError, ValueError):
        return ("unreadable", repr(rewards)[:60])
    return r, c


def resolve_lease(lease: str, key: str, action: str, record: LeaseRecord | None, *,
                  group: tuple[Any, Any] | None = None, never_issued: str = "",
                  expired: str = "after its lease expired") -> LeaseDecision:
    """Answer an ``action`` (``"update"`` or ``"discard"``) of task ``key`` naming ``lease`` (module
    docstring). ``group``: the update's ``(rewards, costs)``; ``never_issued``: who never issued an unknown
    lease (``"store S never issued it"``); ``expired``: how a reclaimed lease expired, for its message.
    Raises :class:`UnknownLeaseError`, :class:`LeaseConflictError` or :class:`LeaseExpiredError`."""
    if record is None:
        raise UnknownLeaseError(f"unknown lease {lease!r} for task {key!r}: {never_issued}")
    if record.key is not None and record.key != key:
        raise UnknownLeaseError(f"lease {lease} belongs to task {record.key!r}, not {key!r}")
    outcome = record.outcome
    if outcome is None:
        return LeaseDecision.APPLY
    if outcome is LeaseOutcome.UPDATE and action == "update":
        if group is not None and record.logged is not None:
            mine = logged_group(*group)
            logged = record.logged()
            if logged != mine:
                got = ("unreadable" if logged is None
                       else f"rewards {str(logged[0])[:120]}, costs {str(logged[1])[:60]}")
                raise LeaseConflictError(f"lease {lease} of task {key!r} was already used by an update"
                                         f"{record.closed_by} with {got}; this update has rewards "
                                         f"{str(mine[0])[:120]}, costs {str(mine[1])[:60]}: it is not a retry of "
                                         "that update and is refused (a lease reports one group, once)")
        return LeaseDecision.ALREADY_APPLIED
    if outcome is LeaseOutcome.RECLAIM:
        raise LeaseExpiredError(f"the group of task {key!r} (lease {lease}) was reclaimed{record.closed_by} "
                                f"{expired} without an update; its rewards are refused (the task can be drawn "
                                "again)")
    what = "reported by an update" if outcome is LeaseOutcome.UPDATE else "discarded"
    raise LeaseExpiredError(f"the group of task {key!r} (lease {lease}) was already {what}{record.closed_by}; "
                            f"this {action} is refused")
