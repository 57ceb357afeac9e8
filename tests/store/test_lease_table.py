"""One table of lease cases, run against every keeper of leases: a DurableSampler's store, the sampler host
over a plain sampler, and the sampler host over a DurableSampler. The rules live once
(:func:`envsched.store.leases.resolve_lease`); this table shows the three answer every case the same way."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from envsched.distributed import SamplerHost
from envsched.pool import TaskPool
from envsched.samplers import UniformSampler
from envsched.store import DurableSampler
from envsched.store.leases import (
    LeaseConflictError,
    LeaseDecision,
    LeaseExpiredError,
    LeaseOutcome,
    LeaseRecord,
    UnknownLeaseError,
    resolve_lease,
)

POOL = TaskPool([{"id": f"t{i}", "env": f"e{i % 2}"} for i in range(6)])
MADE_UP = "f" * 32


class StoreDriver:
    """Leases kept by a DurableSampler's store (the caller issues the ids, as a host does)."""

    def __init__(self, path: Path) -> None:
        self.d = DurableSampler(UniformSampler(POOL, seed=3), path / "h.sqlite", group_size=2)

    def draw(self, n: int, worker: str) -> list[tuple[str, Any]]:
        ids = [secrets.token_hex(16) for _ in range(n)]
        return list(zip(ids, self.d.sample(n, leases=ids), strict=True))

    def update(self, task: Any, rewards: list[float], lease: str) -> Any:
        return self.d.update(task, rewards, lease=lease)

    def discard(self, task: Any, lease: str) -> None:
        self.d.discard(task, lease=lease)

    def reclaim(self, task: Any, lease: str, worker: str) -> None:
        self.d.discard(task, lease=lease, reclaimed=True, reason="lease expired")

    def status(self, lease: str) -> str:
        return self.d.lease_status(lease)

    def groups(self) -> int:
        return int(self.d.metrics()["groups"])


class HostDriver:
    """Leases kept by the sampler host (issued by it); over a plain sampler or a DurableSampler."""

    def __init__(self, path: Path, durable: bool) -> None:
        sampler = (DurableSampler(UniformSampler(POOL, seed=3), path / "h.sqlite", group_size=2) if durable
                   else UniformSampler(POOL, seed=3))
        self.host = SamplerHost(sampler, lease_timeout_s=60, group_size=2)

    def draw(self, n: int, worker: str) -> list[tuple[str, Any]]:
        return self.host.sample(n, worker=worker)

    def update(self, task: Any, rewards: list[float], lease: str) -> Any:
        return self.host.update(task, rewards, lease=lease)

    def discard(self, task: Any, lease: str) -> None:
        self.host.discard(task, lease=lease)

    def reclaim(self, task: Any, lease: str, worker: str) -> None:
        assert self.host.release_worker(worker) == [lease]

    def status(self, lease: str) -> str:
        status = self.host.lease_status(lease)
        return "open" if status == "live" else status  # the host says "live" for the store's "open"

    def groups(self) -> int:
        return int(self.host.metrics()["groups"])


DRIVERS = {"store": lambda p: StoreDriver(p), "host": lambda p: HostDriver(p, durable=False),
           "durable-host": lambda p: HostDriver(p, durable=True)}

# Each case: steps on two drawn groups (0: worker "w", 1: worker "v"), then what the last step answers (a value
# or (error class, message pattern)), the status of group 0's or 1's lease afterwards, and the groups counted.
# A step: ("update", group, rewards[, lease of another group or MADE_UP]), ("discard", group), ("reclaim", group).
CASES: dict[str, tuple[list[tuple[Any, ...]], Any, tuple[int, str], int]] = {
    "update an open lease": ([("update", 0, [1.0, 0.0])], "applied", (0, "applied"), 1),
    "retry with the same rewards": ([("update", 0, [1.0, 0.0]), ("update", 0, [1.0, 0.0])], "already_applied",
                                    (0, "applied"), 1),
    "second update with other rewards": ([("update", 0, [1.0, 0.0]), ("update", 0, [0.0, 0.0])],
                                         (LeaseConflictError, "already used by an update"), (0, "applied"), 1),
    "update after a discard": ([("discard", 0), ("update", 0, [1.0, 0.0])],
                               (LeaseExpiredError, "was already discarded"), (0, "discarded"), 0),
    "discard twice": ([("discard", 0), ("discard", 0)], (LeaseExpiredError, "was already discarded"),
                      (0, "discarded"), 0),
    "discard after an update": ([("update", 0, [1.0, 1.0]), ("discard", 0)],
                                (LeaseExpiredError, "already reported by an update"), (0, "applied"), 1),
    "update after a reclaim": ([("reclaim", 1), ("update", 1, [1.0, 0.0])],
                               (LeaseExpiredError, "was reclaimed"), (1, "reclaimed"), 0),
    "discard after a reclaim": ([("reclaim", 1), ("discard", 1)], (LeaseExpiredError, "was reclaimed"),
                                (1, "reclaimed"), 0),
    "a lease never issued": ([("update", 0, [1.0, 0.0], MADE_UP)], (UnknownLeaseError, "unknown lease"),
                             (0, "open"), 0),
    "the lease of another task": ([("update", 0, [1.0, 0.0], 1)], (UnknownLeaseError, "belongs to task"),
                                  (1, "open"), 0),
    "the other group is untouched": ([("update", 0, [1.0, 0.0]), ("update", 1, [0.0, 1.0])], "applied",
                                     (1, "applied"), 2),
}


@pytest.mark.parametrize("keeper", sorted(DRIVERS))
@pytest.mark.parametrize("case", list(CASES))
def test_every_keeper_answers_every_lease_case_the_same(tmp_path: Path, keeper: str, case: str) -> None:
    steps, expected, (which, status), groups = CASES[case]
    driver = DRIVERS[keeper](tmp_path)
    drawn = driver.draw(1, "w") + driver.draw(1, "v")
    assert drawn[0][1]["id"] != drawn[1][1]["id"]
    results: list[Any] = []
    for i, step in enumerate(steps):
        kind, g = step[0], step[1]
        lease, task = drawn[g]
        last = i == len(steps) - 1
        try:
            if kind == "update":
                named = step[3] if len(step) > 3 else None
                use = MADE_UP if named == MADE_UP else (drawn[named][0] if named is not None else lease)
                results.append(driver.update(task, step[2], use))
            elif kind == "discard":
                results.append(driver.discard(task, lease))
            else:
                results.append(driver.reclaim(task, lease, "w" if g == 0 else "v"))
        except (LeaseExpiredError, UnknownLeaseError) as exc:
            assert last, f"step {i} of {case!r} raised {exc!r}"
            assert isinstance(expected, tuple), f"{case!r}: expected {expected!r}, got {exc!r}"
            assert type(exc) is expected[0], f"{case!r}: {exc!r}"
            assert expected[1] in str(exc)
            break
    else:
        assert not isinstance(expected, tuple), f"{case!r}: expected {expected!r}, got {results[-1]!r}"
        assert results[-1] == expected
    assert driver.status(drawn[which][0]) == status
    assert driver.status(MADE_UP) == "unknown"
    assert driver.groups() == groups


def test_the_rules_themselves() -> None:
    """resolve_lease, the one place the rules are written."""
    same = LeaseRecord("k", LeaseOutcome.UPDATE, " (event 3)", lambda: ([1.0, 0.0], None))
    assert resolve_lease("L", "k", "update", LeaseRecord("k")) is LeaseDecision.APPLY
    assert resolve_lease("L", "k", "update", same, group=([1, 0], None)) is LeaseDecision.ALREADY_APPLIED
    with pytest.raises(LeaseConflictError, match=r"used by an update \(event 3\) with rewards \[1.0, 0.0\]"):
        resolve_lease("L", "k", "update", same, group=([1, 1], None))
    unreadable = LeaseRecord("k", LeaseOutcome.UPDATE, "", lambda: None)
    with pytest.raises(LeaseConflictError, match="with unreadable"):
        resolve_lease("L", "k", "update", unreadable, group=([1, 0], None))
    with pytest.raises(LeaseExpiredError, match=r"reclaimed after 5 s without an update"):
        resolve_lease("L", "k", "update", LeaseRecord(None, LeaseOutcome.RECLAIM), expired="after 5 s")
    with pytest.raises(UnknownLeaseError, match="'L' for task 'k': nobody issued it"):
        resolve_lease("L", "k", "discard", None, never_issued="nobody issued it")
    assert [o.status for o in LeaseOutcome] == ["applied", "discarded", "reclaimed"]
    assert LeaseOutcome.from_status("reclaimed") is LeaseOutcome.RECLAIM and LeaseOutcome.from_status("open") is None
