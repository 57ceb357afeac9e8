"""The shared sampler: lease logic (plain host, fake clock) and the real thing on a local Ray cluster."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from envsched.distributed import LeaseExpiredError, SamplerHost
from envsched.pool import TaskPool
from envsched.samplers import CurriculumSampler, UniformSampler
from envsched.store import DurableSampler, HistoryStore

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane


def _pool(n: int = 12) -> TaskPool:
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 3}", "difficulty": i % 3} for i in range(n)])


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------------------------------- host, no Ray
def test_host_reclaims_expired_leases_and_refuses_late_updates() -> None:
    clock = FakeClock()
    host = SamplerHost(UniformSampler(_pool(), seed=1), lease_timeout_s=30, clock=clock, group_size=2)
    (l1, t1), (l2, t2) = host.sample(2, worker="w1")
    (l3, t3), = host.sample(1, worker="w2")
    host.update(t3, [1.0, 0.0], lease=l3)
    clock.now += 20
    assert host.renew([l2]) == 1  # w1 heartbeats one of its groups
    clock.now += 15  # l1 is 35 s old: expired; l2 was renewed 15 s ago
    m = host.metrics()
    assert m["reclaimed_groups"] == 1 and m["discarded_groups"] == 1 and m["outstanding_groups"] == 1
    assert host.sampler.outstanding() == {t2["id"]: 1}
    state = host.state_dict()
    with pytest.raises(LeaseExpiredError, match=f"task '{t1['id']}' .* was reclaimed after 30 s"):
        host.update(t1, [1.0, 1.0], lease=l1)
    assert host.state_dict() == state
    with pytest.raises(ValueError, match="have 3 entries, expected group_size=2"):
        host.update(t2, [1.0, 1.0, 0.0], lease=l2)
    with pytest.raises(ValueError, match="belongs to task"):
        host.update(t3, [1.0, 1.0], lease=l2)
    with pytest.raises(ValueError, match="unknown lease"):
        host.update(t2, [1.0, 1.0], lease="nope-1")
    assert host.state_dict() == state
    host.update(t2, [0.0, 1.0], lease=l2)
    assert host.metrics()["leases"] == 0


def test_host_release_worker_and_adoption_of_outstanding_groups() -> None:
    clock = FakeClock()
    sampler = CurriculumSampler(_pool(), group_size=2, seed=0)
    sampler.sample(3)  # outstanding before the host exists (e.g. rebuilt from a store)
    host = SamplerHost(sampler, lease_timeout_s=10, clock=clock)
    assert host.lease_summary() == {"(anonymous)": 3}
    host.sample(2, worker="w9")
    assert host.lease_summary() == {"(anonymous)": 3, "w9": 2} and host.leases("w8") == []
    w9 = [x["lease"] for x in host.leases("w9")]
    assert all(x["worker"] == "w9" for x in host.leases("w9"))
    assert len(w9) == 2 and sorted(host.release_worker("w9")) == sorted(w9)
    assert sampler.outstanding_groups == 3 and sampler.metrics()["discarded_groups"] == 2
    clock.now += 11
    assert len(host.reclaim_expired()) == 3
    assert sampler.outstanding_groups == 0 and sampler.metrics()["discarded_groups"] == 5


def test_host_over_a_durable_sampler_logs_reclaims(tmp_path: Path) -> None:
    clock = FakeClock()
    pool = _pool()
    host = SamplerHost(lambda: DurableSampler(UniformSampler(pool), tmp_path / "h.sqlite"), lease_timeout_s=5,
                       clock=clock)
    host.sample(2, worker="w")
    clock.now += 6
    host.reclaim_expired()
    events = HistoryStore(tmp_path / "h.sqlite").events()
    assert [e.kind for e in events] == ["sample", "discard", "discard"]
    assert events[1].payload["reason"] == "lease expired after 5 s"


# ---------------------------------------------------------------------------------------------- real Ray
def _work(ray: Any) -> Any:
    @ray.remote(num_cpus=0.25, max_retries=0)
    def work(remote: Any, rounds: int, worker: int) -> list[str]:
        seen = []
        for r in range(rounds):
            for t in remote.sample(2):
                remote.update(t, [float((worker + r) % 2), 1.0, None])
                seen.append(t["id"])
        return seen

    return work


def test_many_workers_share_one_sampler(ray_cluster: Any) -> None:
    from envsched.distributed import launch_sampler

    ray = ray_cluster
    pool = _pool()
    remote = launch_sampler(lambda: UniformSampler(pool, seed=4), lease_timeout_s=60, group_size=3)
    work = _work(ray)
    workers, rounds = 4, 10
    seen = ray.get([work.remote(remote, rounds, w) for w in range(workers)])
    m = remote.metrics()
    total = workers * rounds * 2
    assert m["groups"] == total and m["dispatched_groups"] == total and m["outstanding_groups"] == 0
    assert m["episodes"] == 3 * total and m["unscored_episodes"] == total and m["leases"] == 0
    # calls were serialised: the uniform sampler's epochs stayed intact (80 draws = 6 epochs of 12, then 8)
    counts = Counter(k for ks in seen for k in ks)
    assert sorted(set(counts.values())) == [6, 7] and sum(counts.values()) == total
    # bad input through the actor: a clear error and no change
    state = remote.state_dict()
    with pytest.raises(ValueError, match="must be finite"):
        t = remote.sample(1)[0]
        remote.update(t, [float("nan"), 1.0, 1.0])
    assert remote.metrics()["groups"] == total == remote.state_dict()["counters"]["groups"]
    assert remote.state_dict()["counters"] == {**state["counters"], "dispatched_groups": total + 1}


def test_dead_worker_groups_are_reclaimed_after_the_timeout(ray_cluster: Any) -> None:
    from envsched.distributed import RemoteSampler, launch_sampler

    ray = ray_cluster
    pool = _pool()
    # the creator keeps its handle (a named, non-detached actor lives as long as its creator's handle)
    owner = launch_sampler(lambda: UniformSampler(pool, seed=5), lease_timeout_s=1.0, name="envsched-test-leases")
    remote = RemoteSampler.connect("envsched-test-leases", worker="driver")  # found by name
    assert remote.worker == "driver" and owner.worker != "driver"

    @ray.remote(num_cpus=0.25, max_retries=0)
    def dies() -> None:
        RemoteSampler.connect("envsched-test-leases").sample(3)
        os._exit(1)  # the worker dies holding three groups

    with pytest.raises(ray.exceptions.RayError):
        ray.get(dies.remote())
    m = remote.metrics()
    assert m["outstanding_groups"] == 3 and m["leases"] == 3
    late = remote.sample(1)  # this worker is slow: its lease runs out too
    time.sleep(1.2)
    assert len(remote.reclaim_expired()) == 4
    m = remote.metrics()
    assert m["outstanding_groups"] == 0 and m["discarded_groups"] == 4 and m["reclaimed_groups"] == 4
    state = remote.state_dict()
    with pytest.raises(LeaseExpiredError, match="was reclaimed after 1 s"):
        remote.update(late[0], [1.0])
    assert remote.state_dict() == state
    assert len(remote.sample(12)) == 12  # reclaimed tasks can be drawn again


def test_durable_shared_sampler_survives_the_actor(ray_cluster: Any, tmp_path: Path) -> None:
    from envsched.distributed import launch_sampler

    ray = ray_cluster
    pool = _pool()
    path = str(tmp_path / "shared.sqlite")
    remote = launch_sampler(lambda: DurableSampler(CurriculumSampler(pool, group_size=2, seed=8), path),
                            lease_timeout_s=60, max_restarts=1)
    ray.get(_work(ray).remote(remote, 4, 0))
    held = remote.sample(2)  # outstanding when the actor dies
    first = remote.ping()
    ray.kill(remote.actor, no_restart=False)
    deadline = time.time() + 60
    while True:  # Ray restarts the actor; its factory rebuilds the sampler from the store
        try:
            if remote.ping() != first:
                break
        except (ray.exceptions.RayActorError, getattr(ray.exceptions, "ActorUnavailableError", OSError)):
            pass
        assert time.time() < deadline, "the actor was not restarted"
        time.sleep(0.2)
    m = remote.metrics()
    assert m["groups"] == 8 and m["outstanding_groups"] == 2 and m["leases"] == 2
    reference = CurriculumSampler(pool, group_size=2, seed=8)
    for e in HistoryStore(path).events():
        if e.kind == "sample":
            assert [t["id"] for t in reference.sample(e.payload["n"])] == e.payload["keys"]
        else:
            reference.update(e.payload["key"], e.payload["rewards"], e.payload["costs"])
    assert {k: v for k, v in remote.state_dict().items() if k != "durable"} == reference.state_dict()
    for t in held:
        remote.update(t, [1.0, 0.0])
    assert remote.metrics()["groups"] == 10


def test_a_dead_hosts_name_is_freed_by_release_name(ray_cluster: Any) -> None:
    from envsched.distributed import launch_sampler, release_name

    ray = ray_cluster
    pool = _pool()
    name = "envsched-test-reuse"
    first = launch_sampler(lambda: UniformSampler(pool, seed=1), name=name)
    pid = ray.get(first.actor.__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, 9)  # the host dies for good (max_restarts=0); Ray keeps its name
    time.sleep(1.0)
    with pytest.raises(ValueError, match=rf"release_name\('{name}'\)"):
        launch_sampler(lambda: UniformSampler(pool, seed=1), name=name)
    assert release_name(name) is True
    second = launch_sampler(lambda: UniformSampler(pool, seed=1), name=name)
    assert len(second.sample(2)) == 2
    assert release_name("envsched-test-no-such-host") is False


def test_restarts_without_a_store_are_refused(ray_cluster: Any) -> None:
    from envsched.distributed import launch_sampler

    pool = _pool()
    with pytest.raises(ValueError, match="max_restarts=-1 needs a durable sampler"):
        launch_sampler(lambda: UniformSampler(pool, seed=1), max_restarts=-1)


def test_a_lease_that_cannot_be_confirmed_is_dropped(ray_cluster: Any, tmp_path: Path) -> None:
    from envsched.distributed import LeaseUnconfirmedError, RemoteSampler, launch_sampler, release_name

    ray = ray_cluster
    pool = _pool()
    path = str(tmp_path / "h.sqlite")
    name = "envsched-test-unconfirmed"

    def factory() -> DurableSampler:
        return DurableSampler(UniformSampler(pool, seed=2), path)

    owner = launch_sampler(factory, lease_timeout_s=60, name=name)
    remote = RemoteSampler(owner.actor, worker="w")
    t = remote.sample(1)[0]
    lease = remote._leases[t["id"]][0]
    ray.kill(remote.actor, no_restart=True)  # the host is gone for good while the worker holds a group
    deadline = time.time() + 30
    while time.time() < deadline:  # ray.kill is asynchronous: wait until Ray reports the actor dead
        try:
            ray.get(remote.actor.ping.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            break
        time.sleep(0.1)
    with pytest.raises(Exception) as info:  # the type is checked below, after the lease book
        remote.update(t, [1.0])
    assert remote._leases == {}  # dropped: never sent again with a later draw of the same task
    assert isinstance(info.value, LeaseUnconfirmedError) and "could not be confirmed" in str(info.value)
    # the documented recovery: free the name, relaunch on the store; the store answers for this one lease
    release_name(name)
    again = launch_sampler(factory, lease_timeout_s=60, name=name)
    assert again.lease_status(lease) == "live"  # it never committed; the group is still leased
    assert again.update(t, [1.0], lease=lease) == "applied"  # the worker may still report it, once
    assert again.update(t, [1.0], lease=lease) == "already_applied"
    assert again.lease_status(lease) == "applied" and again.metrics()["groups"] == 1
    assert len([e for e in HistoryStore(path).events() if e.kind == "update"]) == 1
