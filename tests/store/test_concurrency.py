"""Many processes updating one shared sampler through one store (SQLite file; PostgreSQL when available)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from envsched.samplers import CurriculumSampler
from envsched.store import DurableSampler, HistoryStore

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_store_workers", HERE / "_store_workers.py")
workers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workers)

WRITERS = 8
ROUNDS = 12
PG_URL = os.environ.get("ENVSCHED_TEST_POSTGRES_URL")


def _run_writers(store: str, prefix: str, tmp_path: Path, rounds: int) -> list[tuple[int, int, str, list]]:
    acks = tmp_path / "acks.txt"
    procs = [subprocess.Popen([sys.executable, str(HERE / "_store_workers.py"), "writer", store, prefix,
                               str(acks), str(w), str(rounds), str(WRITERS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(WRITERS)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
    out = []
    for line in acks.read_text(encoding="utf-8").splitlines():
        w, seq, key, rewards = line.split(" ", 3)
        out.append((int(w), int(seq), key, json.loads(rewards)))
    return out


def _check_shared_history(store: HistoryStore, acks: list[tuple[int, int, str, list]], rounds: int) -> None:
    total_groups = WRITERS * rounds * 2
    assert len(acks) == total_groups
    events = store.events()
    assert len(events) == WRITERS * rounds * 3  # one sample of 2 and two updates per round and writer

    # every acknowledged update is in the log exactly where its writer saw it, with its rewards
    by_seq = {e.seq: e for e in events}
    for _, seq, key, rewards in acks:
        ev = by_seq[seq]
        assert ev.kind == "update" and ev.payload["key"] == key and ev.payload["rewards"] == rewards
    assert len({seq for _, seq, _, _ in acks}) == total_groups

    # the writers really interleaved: some writer's updates span another writer's
    spans = {}
    for w, seq, _, _ in acks:
        lo, hi = spans.get(w, (seq, seq))
        spans[w] = (min(lo, seq), max(hi, seq))
    ordered = sorted(spans.values())
    assert any(a[1] > b[0] for a, b in itertools.pairwise(ordered)), "writers ran one after another"

    # one linear history: the shared sampler equals one sampler that served every call in log order
    shared = DurableSampler(workers.make_sampler(), store, snapshot_every=workers.SNAPSHOT_EVERY)
    single = workers.make_sampler()
    draws = Counter()
    for e in events:
        if e.kind == "sample":
            got = [t["id"] for t in single.sample(e.payload["n"])]
            assert got == e.payload["keys"]
            draws.update(got)
        else:
            single.update(e.payload["key"], e.payload["rewards"], e.payload["costs"])
    assert shared.sampler.state_dict() == single.state_dict()
    m = shared.metrics()
    assert m["groups"] == total_groups and m["dispatched_groups"] == total_groups
    assert m["outstanding_groups"] == 0
    assert m["episodes"] == total_groups * workers.GROUP_SIZE
    assert m["unscored_episodes"] == sum(r is None for _, _, _, rs in acks for r in rs)
    assert sum(draws.values()) == total_groups
    # a full replay without snapshots agrees
    full = DurableSampler(workers.make_sampler(), store, use_snapshots=False)
    assert full.sampler.state_dict() == single.state_dict()
    assert isinstance(full.sampler, CurriculumSampler)


def test_eight_processes_share_one_sqlite_store(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    acks = _run_writers(str(path), "envsched", tmp_path, ROUNDS)
    _check_shared_history(HistoryStore(path), acks, ROUNDS)


@pytest.mark.skipif(not PG_URL, reason="ENVSCHED_TEST_POSTGRES_URL is not set (CI runs .ci/postgres.sh)")
def test_eight_processes_share_one_postgres_store(tmp_path: Path) -> None:
    prefix = f"t_conc_{uuid.uuid4().hex[:10]}"
    store = HistoryStore(PG_URL, table_prefix=prefix)
    try:
        acks = _run_writers(PG_URL, prefix, tmp_path, 6)
        _check_shared_history(store, acks, 6)
    finally:
        store.drop()
        store.close()


OPEN_ROUNDS = 8


def _open_at_once(store: str, prefixes: list[str]) -> dict[str, list[str]]:
    """Eight processes create each store at the same instant; returns the store ids each round saw."""
    procs = [subprocess.Popen([sys.executable, str(HERE / "_store_workers.py"), "opener", store, *prefixes],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(WRITERS)]
    for p in procs:  # each has imported envsched and made its first handle
        ready = p.stdout.readline()
        assert ready == "ready\n", f"{ready!r} {p.communicate(timeout=60)[1][-3000:]}"
    start = time.time() + 0.5  # every opener has its start before it comes
    for p in procs:
        p.stdin.write(f"{start!r}\n")
        p.stdin.flush()
    seen: dict[str, list[str]] = {p: [] for p in prefixes}
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        for line in out.splitlines():
            prefix, store_id = line.split()
            seen[prefix].append(store_id)
    return seen


def _check_one_store_each(seen: dict[str, list[str]]) -> None:
    for prefix, ids in seen.items():
        assert len(ids) == WRITERS, prefix
        assert len(set(ids)) == 1, f"{prefix}: writers created different stores {set(ids)}"


def test_simultaneous_creation_of_an_sqlite_store_makes_one_store(tmp_path: Path) -> None:
    prefixes = [f"race_{r}" for r in range(OPEN_ROUNDS)]
    seen = _open_at_once(str(tmp_path / "{prefix}.sqlite"), prefixes)
    _check_one_store_each(seen)
    for prefix in prefixes:
        store = HistoryStore(tmp_path / f"{prefix}.sqlite", table_prefix=prefix)
        assert store.events() == [] and store.snapshot_seqs() == [0]


@pytest.mark.skipif(not PG_URL, reason="ENVSCHED_TEST_POSTGRES_URL is not set (CI runs .ci/postgres.sh)")
def test_simultaneous_creation_of_a_postgres_store_makes_one_store() -> None:
    # regression: a writer that waited for the advisory lock used to miss the tables another had just
    # committed (stale catalog snapshot) and insert the metadata a second time
    prefixes = [f"t_race_{uuid.uuid4().hex[:10]}" for _ in range(OPEN_ROUNDS)]
    try:
        seen = _open_at_once(PG_URL, prefixes)
        _check_one_store_each(seen)
        for prefix in prefixes:
            store = HistoryStore(PG_URL, table_prefix=prefix)
            assert store.events() == [] and store.snapshot_seqs() == [0]
            store.close()
    finally:
        for prefix in prefixes:
            store = HistoryStore(PG_URL, table_prefix=prefix)
            store.drop()
            store.close()
