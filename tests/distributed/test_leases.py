"""Exact, unforgeable leases on the sampler host (no Ray: the host's plain-Python body, a fake clock).

Each test here reproduces one failure of issue 19 that the host had before leases were exact:
updates matched to another worker's dispatch, made-up lease ids accepted, a stalled worker's pre-restart
lease accepted after its group was reclaimed, a retried update counted twice, metrics lost on restart.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from envsched.distributed import LeaseExpiredError, SamplerHost, UnknownLeaseError
from envsched.pool import TaskPool
from envsched.samplers import CurriculumSampler, UniformSampler
from envsched.store import DurableSampler, HistoryStore, StoreError

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane


def _pool(n: int = 6) -> TaskPool:
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 2}", "difficulty": i % 3} for i in range(n)])


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _durable(path: Path, pool: TaskPool) -> DurableSampler:
    return DurableSampler(UniformSampler(pool, seed=3), path, group_size=2)


def _update_events(path: Path) -> list[Any]:
    return [e for e in HistoryStore(path).events() if e.kind == "update"]


@pytest.mark.parametrize("durable", [False, True])
def test_an_update_is_never_matched_to_another_workers_dispatch(tmp_path: Path, durable: bool) -> None:
    pool = _pool(1)  # one task: both workers hold a dispatch of it
    sampler = _durable(tmp_path / "h.sqlite", pool) if durable else UniformSampler(pool, seed=3)
    host = SamplerHost(sampler, lease_timeout_s=60, group_size=2)
    (la, t), = host.sample(1, worker="A")
    (lb, _), = host.sample(1, worker="B")
    first = host.update(t, [1.0, 0.0], lease=la)
    state = host.state_dict()
    # A reports again without a lease: before, this took B's live dispatch (the task's oldest lease) and was
    # accepted, and B's own update was then refused
    with pytest.raises(UnknownLeaseError, match="names no lease"):
        host.update(t, [1.0, 1.0])
    assert host.metrics()["groups"] == 1 and host.state_dict() == state
    second = host.update(t, [1.0, 0.0], lease=la)  # a retry naming its lease is recognised
    assert host.state_dict() == state
    assert (first, second) == ("applied", "already_applied")
    assert la != lb and len(la) == 32  # 128 random bits, hex
    # B's real update is still accepted, exactly once
    assert host.update(t, [0.0, 0.0], lease=lb) == "applied"
    assert host.metrics()["groups"] == 2 and host.metrics()["outstanding_groups"] == 0


@pytest.mark.parametrize("forged", ["deadbeef-99999", "0" * 32, "anon-0123456789abcdef", ""])
def test_a_made_up_lease_is_refused(tmp_path: Path, forged: str) -> None:
    pool = _pool()
    host = SamplerHost(lambda: _durable(tmp_path / "h.sqlite", pool), lease_timeout_s=60, group_size=2)
    (lease, t), = host.sample(1, worker="A")
    state = host.state_dict()
    with pytest.raises(UnknownLeaseError, match="lease"):
        host.update(t, [1.0, 0.0], lease=forged)
    with pytest.raises(UnknownLeaseError, match="lease"):
        host.discard(t, lease=forged)
    assert host.state_dict() == state and _update_events(tmp_path / "h.sqlite") == []
    host.update(t, [1.0, 0.0], lease=lease)


def test_a_pre_restart_lease_of_a_reclaimed_group_is_refused_after_the_restart(tmp_path: Path) -> None:
    path, pool, clock = tmp_path / "h.sqlite", _pool(2), FakeClock()

    def factory() -> DurableSampler:
        return _durable(path, pool)

    host = SamplerHost(factory, lease_timeout_s=30, clock=clock, group_size=2)
    pairs = host.sample(2, worker="stalled")
    # the host dies and comes back on its store: it adopts the open leases by their ids
    host = SamplerHost(factory, lease_timeout_s=30, clock=clock, group_size=2)
    clock.now += 31  # the stalled worker never reports: its groups are reclaimed and drawn again by B
    redrawn = host.sample(2, worker="B")
    state = host.state_dict()
    for lid, t in pairs:  # before, these were matched to B's new dispatches and accepted
        with pytest.raises(LeaseExpiredError, match="was reclaimed"):
            host.update(t, [1.0, 1.0], lease=lid)
    assert host.state_dict() == state
    assert host.metrics()["reclaimed_groups"] == 2
    for lid, t in redrawn:
        assert host.update(t, [0.0, 1.0], lease=lid) == "applied"
    assert len(_update_events(path)) == 2


def test_an_update_whose_reply_was_lost_is_recognised_after_a_restart(tmp_path: Path) -> None:
    path, pool = tmp_path / "h.sqlite", _pool(1)

    def factory() -> DurableSampler:
        return _durable(path, pool)

    host = SamplerHost(factory, lease_timeout_s=60, group_size=2)
    (lease, t), = host.sample(1, worker="A")
    (lb, _), = host.sample(1, worker="B")  # B holds another dispatch of the same task
    host.update(t, [1.0, 0.0], lease=lease)  # committed; the worker never saw the reply, and the host died
    host = SamplerHost(factory, lease_timeout_s=60, group_size=2)
    retry = host.update(t, [1.0, 0.0], lease=lease)  # A's retry: before, it took B's dispatch and counted twice
    assert len(_update_events(path)) == 1 and host.metrics()["groups"] == 1
    assert retry == "already_applied"
    assert host.lease_status(lease) == "applied" and host.lease_status(lb) == "live"  # one update's answer
    assert host.update(t, [0.0, 0.0], lease=lb) == "applied"
    assert DurableSampler.resume(path, use_snapshots=False).metrics()["groups"] == 2  # full replay agrees


def test_reclaimed_groups_survive_a_host_restart(tmp_path: Path) -> None:
    path, pool, clock = tmp_path / "h.sqlite", _pool(), FakeClock()

    def factory() -> DurableSampler:
        return _durable(path, pool)

    host = SamplerHost(factory, lease_timeout_s=10, clock=clock, group_size=2)
    pairs = host.sample(3, worker="dies")
    lid, t = pairs[0]
    host.discard(t, lease=lid)  # a worker's own discard is not a reclaim
    clock.now += 11
    assert len(host.reclaim_expired()) == 2
    before = host.metrics()
    assert before["reclaimed_groups"] == 2 and before["discarded_groups"] == 3
    host = SamplerHost(factory, lease_timeout_s=10, clock=clock, group_size=2)
    after = host.metrics()
    assert after["reclaimed_groups"] == 2 and after["discarded_groups"] == 3 and after["outstanding_groups"] == 0
    kinds = Counter(e.kind for e in HistoryStore(path).events())
    assert kinds == {"sample": 1, "discard": 3}


def test_outstanding_leases_are_rebuilt_from_the_store(tmp_path: Path) -> None:
    path, pool, clock = tmp_path / "h.sqlite", _pool(), FakeClock()

    def factory() -> DurableSampler:
        return _durable(path, pool)

    host = SamplerHost(factory, lease_timeout_s=10, clock=clock, group_size=2)
    pairs = host.sample(4, worker="w")
    host.update(pairs[0][1], [1.0, 1.0], lease=pairs[0][0])
    host = SamplerHost(factory, lease_timeout_s=10, clock=clock, group_size=2)
    m = host.metrics()
    assert m["leases"] == 3 and m["outstanding_groups"] == 3 and m["open_leases"] == 3
    for lid, t in pairs[1:]:
        assert host.update(t, [0.0, 1.0], lease=lid) == "applied"  # exact match after the restart
    assert host.metrics()["leases"] == 0


def test_update_many_applies_each_item_once_in_one_transaction(tmp_path: Path) -> None:
    path, pool = tmp_path / "h.sqlite", _pool()
    host = SamplerHost(lambda: _durable(path, pool), lease_timeout_s=60, group_size=2)
    pairs = host.sample(4, worker="w")
    client_items = [(t, [1.0, 0.0], None, lid) for lid, t in pairs[:3]]
    assert host.update_many(client_items) == ["applied"] * 3
    bad = [(pairs[3][1], [1.0, float("nan")], None, pairs[3][0]),  # bad input: refused, lease kept
           (pairs[0][1], [1.0, 0.0], None, pairs[0][0]),  # a retry: already applied
           (pairs[1][1], [1.0, 0.0], None, "f" * 32)]  # made up
    res = host.update_many(bad)
    assert isinstance(res[0], ValueError) and res[1] == "already_applied" and isinstance(res[2], UnknownLeaseError)
    assert host.update(pairs[3][1], [0.0, 0.0], lease=pairs[3][0]) == "applied"
    assert len(_update_events(path)) == 4


def test_the_local_client_holds_leases_like_a_remote_worker(tmp_path: Path) -> None:
    pool = _pool()
    host = SamplerHost(lambda: _durable(tmp_path / "h.sqlite", pool), lease_timeout_s=60, group_size=2)
    a, b = host.client("A"), host.client("B")
    ta = a.sample(3)
    assert b.held_leases() == {} and sum(len(v) for v in a.held_leases().values()) == 3
    with pytest.raises(UnknownLeaseError, match="without an outstanding dispatch"):
        b.update(ta[0], [1.0, 1.0])  # B holds no lease for A's group
    with pytest.raises(ValueError, match="must be finite"):
        a.update(ta[0], [1.0, float("nan")])  # bad input: A keeps the lease
    assert a.update(ta[0], [1.0, 1.0]) == "applied"
    assert a.update_many([(t, [0.0, 1.0]) for t in ta[1:]]) == ["applied", "applied"]
    assert a.held_leases() == {} and host.metrics()["groups"] == 3


def test_the_factory_is_retried_while_the_store_is_unreachable(tmp_path: Path) -> None:
    pool, calls = _pool(), []

    def factory() -> DurableSampler:
        calls.append(1)
        if len(calls) < 3:
            raise StoreError("store postgresql://x: cannot reach PostgreSQL (connection refused)")
        return _durable(tmp_path / "h.sqlite", pool)

    with pytest.warns(RuntimeWarning, match="store is unreachable"):
        host = SamplerHost(factory, lease_timeout_s=60)  # default: retried for up to 600 s
    assert len(calls) == 3 and host.metrics()["store_retries"] == 2
    calls.clear()
    with pytest.raises(StoreError, match="cannot reach"), pytest.warns(RuntimeWarning):
        SamplerHost(factory, lease_timeout_s=60, store_retry_s=0.2)  # gives up after the retry window


def test_a_plain_sampler_host_remembers_consumed_leases() -> None:
    clock = FakeClock()
    host = SamplerHost(CurriculumSampler(_pool(), group_size=2, seed=0), lease_timeout_s=5, clock=clock)
    (l1, t1), (l2, t2) = host.sample(2, worker="w")
    assert host.update(t1, [1.0, 0.0], lease=l1) == "applied"
    assert host.update(t1, [1.0, 0.0], lease=l1) == "already_applied"
    clock.now += 6
    with pytest.raises(LeaseExpiredError, match="reclaimed"):
        host.update(t2, [1.0, 0.0], lease=l2)
    assert host.lease_status(l1) == "applied" and host.lease_status(l2) == "reclaimed"
    assert host.metrics()["groups"] == 1 and host.metrics()["reclaimed_groups"] == 1


@pytest.mark.parametrize("durable", [False, True])
def test_update_and_sample_is_one_round_trip_and_one_transaction(tmp_path: Path, durable: bool) -> None:
    path, pool = tmp_path / "h.sqlite", _pool()
    sampler = _durable(path, pool) if durable else UniformSampler(pool, seed=3)
    host = SamplerHost(sampler, lease_timeout_s=60, group_size=2)
    worker = host.client("w")
    tasks = worker.sample(3)
    events_before = len(HistoryStore(path).events()) if durable else 0
    drawn = worker.update_and_sample([(t, [1.0, 0.0]) for t in tasks], 2)
    assert len(drawn) == 2 and sorted(worker.held_leases()) == sorted(t["id"] for t in drawn)
    m = host.metrics()
    assert m["groups"] == 3 and m["dispatched_groups"] == 5 and m["outstanding_groups"] == 2 and m["leases"] == 2
    if durable:  # 3 updates and 1 draw, logged in that order
        assert [e.kind for e in HistoryStore(path).events()[events_before:]] == ["update"] * 3 + ["sample"]
    with pytest.raises(ValueError, match="n must be a positive integer"):
        worker.update_and_sample([(t, [0.0, 0.0]) for t in drawn], 0)  # a bad draw: the updates still count
    assert host.metrics()["groups"] == 5 and worker.held_leases() == {}


def test_concurrent_callers_are_committed_together_and_counted_once(tmp_path: Path) -> None:
    import threading

    path, pool = tmp_path / "h.sqlite", _pool(40)
    host = SamplerHost(lambda: _durable(path, pool), lease_timeout_s=60, group_size=2)
    commits = []
    original = host.sampler.run_batch

    def counting(requests: Any) -> Any:
        commits.append(len(requests))
        return original(requests)

    host.sampler.run_batch = counting  # count the transactions the group commit makes
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        client = host.client(f"w{w}")
        try:
            tasks = client.sample(2)
            for _ in range(5):
                tasks = client.update_and_sample([(t, [1.0, 0.0]) for t in tasks], 2)
            client.update_many([(t, [0.0, 1.0]) for t in tasks])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    m = host.metrics()
    assert m["groups"] == 8 * 12 and m["dispatched_groups"] == 8 * 12 and m["outstanding_groups"] == 0
    assert m["leases"] == 0 and sum(commits) == 8 * 7 and len(commits) <= 8 * 7  # every call, in <= 56 commits
    assert len(_update_events(path)) == 8 * 12
    assert DurableSampler.resume(path, use_snapshots=False).metrics()["groups"] == 8 * 12
