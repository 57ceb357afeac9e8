"""At least 50 SIGKILLs of a process using a durable store, many of them inside a SQLite checkpoint: after
each one the store opens and resumes, and every acknowledged call is in the log."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from envsched.store import DurableSampler, HistoryStore

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_kill_worker", HERE / "_kill_worker.py")
kw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kw)

KILLS = 50


@pytest.mark.hostile_budget(60)  # many inputs (or a deadline the test waits out) in one call
def test_fifty_sigkills_including_checkpoints_all_resume(tmp_path: Path) -> None:
    store, acks = tmp_path / "history.sqlite", tmp_path / "acks.txt"
    proc = subprocess.run([sys.executable, str(HERE / "_kill_worker.py"), str(store), str(acks), str(KILLS),
                           "20261203"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "worker failed" not in proc.stderr, proc.stderr[-3000:]
    words = proc.stdout.split()
    assert words[:2] == ["killed", str(KILLS)], proc.stdout
    in_checkpoint = int(words[3])
    assert in_checkpoint >= 10, f"only {in_checkpoint} kills landed inside a checkpoint"

    lines = acks.read_text(encoding="utf-8").splitlines()
    starts = [line for line in lines if line.startswith("start ")]
    # a worker killed at a random instant may die while still resuming (before it says "start"); every worker
    # killed inside a checkpoint had resumed; one that could not resume would have exited on its own and the
    # supervisor would have failed above
    assert len(starts) >= KILLS // 2
    acked = [line.split(" ") for line in lines if line.startswith("ack ") and len(line.split(" ")) == 4]
    assert len(acked) >= 100
    events = HistoryStore(store).events()
    for _, seq, kind, what in acked:
        ev = events[int(seq) - 1]
        assert ev.kind == kind
        assert (",".join(ev.payload["keys"]) if kind == "sample" else ev.payload["key"]) == what
    resumed = DurableSampler(kw.make_sampler(), store, snapshot_every=kw.SNAPSHOT_EVERY, use_snapshots=False)
    assert resumed.seq == len(events) >= int(acked[-1][1])
