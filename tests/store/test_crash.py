"""SIGKILL a process running a durable sampler at random points, many times: nothing acknowledged is lost,
and the resumed sampler continues exactly like one that never crashed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from envsched.store import DurableSampler, HistoryStore

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_store_workers", HERE / "_store_workers.py")
workers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workers)

KILLS = {"sqlite": 60, "postgresql": 30}
POSTGRES_URL = os.environ.get("ENVSCHED_TEST_POSTGRES_URL")


def _read_acks(path: Path) -> tuple[int, list[tuple[int, str, str]]]:
    starts, acks = 0, []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split(" ")
        if parts[0] == "start":
            starts += 1
        elif parts[0] == "ack" and len(parts) == 4:  # a line cut by the kill is not an acknowledgement
            acks.append((int(parts[1]), parts[2], parts[3]))
    return starts, acks


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """``(backend, store, table prefix)``: a SQLite file, or fresh tables on the test PostgreSQL server."""
    if request.param == "sqlite":
        yield "sqlite", str(tmp_path / "history.sqlite"), "envsched"
        return
    if not POSTGRES_URL:
        pytest.skip("ENVSCHED_TEST_POSTGRES_URL is not set (CI runs .ci/postgres.sh)")
    prefix = f"crash_{uuid.uuid4().hex[:10]}"
    yield "postgresql", POSTGRES_URL, prefix
    store = HistoryStore(POSTGRES_URL, table_prefix=prefix)
    store.drop()
    store.close()


def test_sigkill_at_random_points_loses_no_acknowledged_update(tmp_path: Path, target: tuple[str, str, str]) -> None:
    backend, store_path, prefix = target
    kills = KILLS[backend]
    ack_path = tmp_path / "acks.txt"
    proc = subprocess.run([sys.executable, str(HERE / "_store_workers.py"), "crash", store_path,
                           str(ack_path), str(kills), "20261202", prefix], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split()
    assert words[:2] == ["killed", str(kills)], proc.stdout  # every worker died of SIGKILL, mid-run
    in_snapshot = int(words[3])
    assert in_snapshot >= kills // 6, f"only {in_snapshot} of {kills} kills landed inside a snapshot save"
    print(f"{backend}: {kills} kills, {in_snapshot} inside a snapshot save")

    starts, acks = _read_acks(ack_path)
    assert starts >= kills // 2, "too few workers got as far as rebuilding the sampler"
    assert len(acks) >= 100, "too little work between kills to test anything"
    events = HistoryStore(store_path, table_prefix=prefix).events()
    assert len(events) >= max(seq for seq, _, _ in acks)

    # every acknowledged call is in the log, at the number it was acknowledged with
    for seq, kind, what in acks:
        ev = events[seq - 1]
        assert ev.seq == seq and ev.kind == kind
        if kind == "sample":
            assert ",".join(ev.payload["keys"]) == what
        else:
            assert ev.payload["key"] == what
    acked_updates = [(seq, what) for seq, kind, what in acks if kind == "update"]
    assert len(acked_updates) >= 30

    # the uncrashed reference: the same deterministic workload, run once without interruption
    reference = DurableSampler(workers.make_sampler(), tmp_path / "reference.sqlite",
                               snapshot_every=workers.SNAPSHOT_EVERY)
    for _ in range(len(events)):
        workers.step(reference)
    assert [(e.kind, e.payload) for e in reference.store.events()] == [(e.kind, e.payload) for e in events]

    # resume the crashed run: same state (counters, statistics, outstanding groups, RNG) and same next draws
    resumed = DurableSampler(workers.make_sampler(), HistoryStore(store_path, table_prefix=prefix),
                             snapshot_every=workers.SNAPSHOT_EVERY)
    assert resumed.sampler.state_dict() == reference.sampler.state_dict()
    assert resumed.sampler.groups == sum(1 for e in events if e.kind == "update")
    for _ in range(40):
        assert workers.step(resumed) == workers.step(reference)
    assert resumed.sample(5) == reference.sample(5)

    # and a full replay from the initial state (no snapshots) reproduces every logged draw
    replayed = DurableSampler(workers.make_sampler(), HistoryStore(store_path, table_prefix=prefix),
                              use_snapshots=False)
    assert replayed.replayed_events == resumed.seq
    assert replayed.sampler.state_dict() == resumed.sampler.state_dict()
