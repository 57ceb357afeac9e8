"""Fault test of the shared sampler: a real Ray cluster on 127.0.0.1 and a real PostgreSQL server.

The store is reached through a TCP relay on 127.0.0.1 that the test can cut, which is a store outage as the
host sees it (connections refused and dropped) without stopping a server other tests share. One run goes
through, in order: a worker killed holding groups, a worker paused past its lease, the host killed, the
store cut, the host killed while the store is cut, and an update that committed but whose reply was lost,
retried after a host restart. At the end: groups = acknowledged updates, no lease consumed twice (so no
duplicate events), and ``envsched store verify`` passes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from envsched.pool import TaskPool
from envsched.store import DurableSampler, HistoryStore

URL = os.environ.get("ENVSCHED_TEST_POSTGRES_URL")
pytestmark = [pytest.mark.skipif(not URL, reason="ENVSCHED_TEST_POSTGRES_URL is not set (CI runs .ci/postgres.sh)"),
              pytest.mark.slow]  # Ray and killed processes: outside the fast lane

GROUP = 2
LEASE_S = 3.0


class Relay:
    """A TCP relay 127.0.0.1:port -> PostgreSQL that can be cut (listener closed, live connections dropped)
    and restored on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self._answering = False
        self.refused = 0
        self.up()

    def up(self) -> None:
        self._stop()
        self._answering = False
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.port))
        srv.listen(64)
        self._server = srv
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()

    def down(self, *, answer: bool = False) -> None:
        """Cut the store off. ``answer``: keep listening and close every new connection at once (a connection
        attempt fails as when nothing listens), counting the attempts in ``refused``."""
        self._stop()
        if answer:
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("127.0.0.1", self.port))
            srv.listen(64)
            self._server, self._answering = srv, True
            threading.Thread(target=self._accept, args=(srv,), daemon=True).start()

    def _stop(self) -> None:
        srv, self._server = self._server, None
        if srv is not None:
            with contextlib.suppress(OSError):
                srv.shutdown(socket.SHUT_RDWR)
            srv.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
                c.close()
            self._conns.clear()

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return
            if self._answering:
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def relay_store() -> Iterator[tuple[Relay, str, str]]:
    from sqlalchemy.engine import make_url

    url = make_url(URL)
    relay = Relay((url.host or "127.0.0.1", int(url.port or 5432)))
    relayed = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    prefix = f"f_{uuid.uuid4().hex[:10]}"
    yield relay, relayed, prefix
    relay.down()
    store = HistoryStore(URL, table_prefix=prefix)
    store.drop()
    store.close()


def _pool() -> TaskPool:
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 3}", "difficulty": i % 4} for i in range(40)])


def _wait_for_new_incarnation(remote: Any, before: str, ray: Any, limit_s: float = 90) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ray.exceptions.RayActorError):
            if remote.ping() != before:
                return
        time.sleep(0.2)
    raise AssertionError("the host did not come back")


def test_shared_sampler_under_faults(ray_cluster: Any, relay_store: tuple[Relay, str, str]) -> None:
    from click.testing import CliRunner

    from envsched.cli.store import store as store_cli
    from envsched.distributed import LeaseExpiredError, RemoteSampler, launch_sampler
    from envsched.samplers import CurriculumSampler

    ray = ray_cluster
    relay, relayed_url, prefix = relay_store
    pool = _pool()

    def factory() -> DurableSampler:
        return DurableSampler(CurriculumSampler(pool, group_size=GROUP, seed=11),
                              HistoryStore(relayed_url, table_prefix=prefix, busy_timeout_s=2),
                              group_size=GROUP, snapshot_every=50)

    name = f"envsched-faults-{uuid.uuid4().hex[:6]}"
    remote = launch_sampler(factory, lease_timeout_s=LEASE_S, group_size=GROUP, name=name, max_restarts=-1,
                            store_retry_s=120)

    @ray.remote(num_cpus=0.25, max_retries=0)
    def worker(rounds: int, seed: int, hold_s: float = 0.0) -> dict[str, Any]:
        """Draw 2 groups per round, report them in one update_many; returns the acknowledged leases."""
        sampler = RemoteSampler.connect(name, worker=f"w{seed}", retry_s=90)
        acked: list[str] = []
        for r in range(rounds):
            tasks = sampler.sample(2)
            held = sampler.held_leases()  # the sampler may draw a task twice in one batch: oldest lease first
            leases = [held[t["id"]].pop(0) for t in tasks]
            if hold_s:
                time.sleep(hold_s)
            results = sampler.update_many([(t, [float((seed + r + i) % 2), 1.0]) for i, t in enumerate(tasks)])
            acked += [lid for lid, res in zip(leases, results, strict=True) if res in ("applied", "already_applied")]
            time.sleep(0.05)
        return {"acked": acked}

    @ray.remote(num_cpus=0.25, max_retries=0)
    def dies() -> None:
        RemoteSampler.connect(name, worker="doomed").sample(3)
        os._exit(1)  # the worker dies holding three groups

    @ray.remote(num_cpus=0.25, max_retries=0)
    def pauses() -> dict[str, Any]:
        sampler = RemoteSampler.connect(name, worker="paused", retry_s=90)
        tasks = sampler.sample(2)
        time.sleep(LEASE_S + 2.0)  # paused past the lease: its groups are reclaimed and may be drawn again
        refused = 0
        for t in tasks:
            try:
                sampler.update(t, [1.0, 1.0])
            except LeaseExpiredError:
                refused += 1
        return {"refused": refused}

    acked: list[str] = []
    counts: dict[str, int] = {}

    # 1. worker kill and worker pause, while two workers run
    runs = [worker.remote(8, s) for s in (1, 2)]
    paused = pauses.remote()
    with pytest.raises(ray.exceptions.RayError):
        ray.get(dies.remote())
    counts["late_updates_refused"] = ray.get(paused)["refused"]
    for r in ray.get(runs):
        acked += r["acked"]

    # 2. host kill while workers run: their calls ride through the restart
    runs = [worker.remote(6, s) for s in (3, 4)]
    time.sleep(0.5)
    before = remote.ping()
    ray.kill(remote.actor, no_restart=False)
    _wait_for_new_incarnation(remote, before, ray)
    for r in ray.get(runs):
        acked += r["acked"]

    # 3. store outage while workers run: calls fail with StoreError and are retried until it is back
    runs = [worker.remote(6, s) for s in (5, 6)]
    time.sleep(0.5)
    relay.down()
    time.sleep(3.0)
    relay.up()
    for r in ray.get(runs):
        acked += r["acked"]

    # 4. host kill during a store outage: the restarted host retries the store with backoff
    runs = [worker.remote(6, s) for s in (7, 8)]
    time.sleep(0.5)
    before = remote.ping()
    relay.down(answer=True)
    ray.kill(remote.actor, no_restart=False)
    # the outage lasts until the restarted host has tried the store (however long a loaded machine takes to
    # restart it; attempts counted from 0.5 s after the kill are the new host's, which retries), and 2 s more
    time.sleep(0.5)
    attempts, deadline = relay.refused, time.monotonic() + 90
    while relay.refused == attempts and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)
    relay.up()
    _wait_for_new_incarnation(remote, before, ray)
    for r in ray.get(runs):
        acked += r["acked"]
    counts["store_retries_after_restart"] = int(remote.metrics()["store_retries"])

    # 5. an update that committed but whose reply was lost, retried after a host restart
    (lease, task), = remote.sample_leased(1)
    remote.actor.update.remote(task, [1.0, 0.0], None, lease)  # sent; the reply is never read
    direct = HistoryStore(URL, table_prefix=prefix)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with direct.transaction() as tx:
            row = direct.lease(tx, lease)
        if row is not None and row[3] == "update":
            break
        time.sleep(0.05)
    before = remote.ping()
    ray.kill(remote.actor, no_restart=False)
    _wait_for_new_incarnation(remote, before, ray)
    assert remote.lease_status(lease) == "applied"
    assert remote.update(task, [1.0, 0.0], lease=lease) == "already_applied"
    acked.append(lease)

    # every lease of the killed and the paused workers is reclaimed by now (or after one more lease period)
    time.sleep(LEASE_S + 0.5)
    remote.reclaim_expired()
    m = remote.metrics()
    events = direct.events()
    updates = [e for e in events if e.kind == "update"]
    update_leases = [e.payload["lease"] for e in updates]
    counts.update(groups=int(m["groups"]), acknowledged=len(acked), update_events=len(updates),
                  reclaimed=int(m["reclaimed_groups"]), outstanding=int(m["outstanding_groups"]),
                  events=len(events))
    print("fault test counts:", json.dumps(counts))
    assert len(set(acked)) == len(acked)
    assert m["groups"] == len(acked) == len(updates)  # nothing acknowledged lost, nothing counted twice
    assert sorted(update_leases) == sorted(acked)  # no duplicate update events, none unacknowledged
    assert counts["late_updates_refused"] == 2
    assert m["reclaimed_groups"] >= 5  # the dead worker's 3 and the paused worker's 2
    assert m["outstanding_groups"] == 0 and m["leases"] == 0
    assert counts["store_retries_after_restart"] >= 1
    direct.close()
    # the store verifies: snapshot rebuild = full replay, and the lease index matches the events
    res = CliRunner().invoke(store_cli, ["verify", URL, "--prefix", prefix, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["ok"] and out["events"] == len(events) and out["metrics"]["groups"] == len(acked)
