"""SIGKILL a process running a durable sampler at random points, many times: nothing acknowledged is lost,
and the resumed sampler continues exactly like one that never crashed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from envsched.store import DurableSampler, HistoryStore

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_store_workers", HERE / "_store_workers.py")
workers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workers)

KILLS = 60


def _read_acks(path: Path) -> tuple[int, list[tuple[int, str, str]]]:
    starts, acks = 0, []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split(" ")
        if parts[0] == "start":
            starts += 1
        elif parts[0] == "ack" and len(parts) == 4:  # a line cut by the kill is not an acknowledgement
            acks.append((int(parts[1]), parts[2], parts[3]))
    return starts, acks


def test_sigkill_at_random_points_loses_no_acknowledged_update(tmp_path: Path) -> None:
    store_path, ack_path = tmp_path / "history.sqlite", tmp_path / "acks.txt"
    proc = subprocess.run([sys.executable, str(HERE / "_store_workers.py"), "crash", str(store_path),
                           str(ack_path), str(KILLS), "20261202"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"killed {KILLS}" in proc.stdout, proc.stdout  # every worker died of SIGKILL, mid-run

    starts, acks = _read_acks(ack_path)
    assert starts >= KILLS // 2, "too few workers got as far as rebuilding the sampler"
    assert len(acks) >= 100, "too little work between kills to test anything"
    events = HistoryStore(store_path).events()
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
    resumed = DurableSampler(workers.make_sampler(), HistoryStore(store_path), snapshot_every=workers.SNAPSHOT_EVERY)
    assert resumed.sampler.state_dict() == reference.sampler.state_dict()
    assert resumed.sampler.groups == sum(1 for e in events if e.kind == "update")
    for _ in range(40):
        assert workers.step(resumed) == workers.step(reference)
    assert resumed.sample(5) == reference.sample(5)

    # and a full replay from the initial state (no snapshots) reproduces every logged draw
    replayed = DurableSampler(workers.make_sampler(), HistoryStore(store_path), use_snapshots=False)
    assert replayed.replayed_events == resumed.seq
    assert replayed.sampler.state_dict() == resumed.sampler.state_dict()
