"""The store's schema module: table names, payload layout, the read-only queries (on SQLite and PostgreSQL),
the format's pending upgrades, and that no other module spells a table name or a payload path."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import envsched
from envsched.cli.main import cli
from envsched.pool import TaskPool
from envsched.pool.spec import task_key
from envsched.samplers import UniformSampler
from envsched.store import DurableSampler, HistoryStore, StoreError
from envsched.store.schema import (
    STORE_FORMAT,
    UPGRADES,
    Payload,
    Tables,
    discard_payload,
    sample_payload,
    update_payload,
)

URL = os.environ.get("ENVSCHED_TEST_POSTGRES_URL")


def _pool(n: int = 12) -> TaskPool:
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 3}", "instruction": f"do {i} " + "x" * 40} for i in range(n)]
                    + [{"id": "s7", "split": "train", "index": 7, "env": "e0"}])


def test_table_names_come_from_the_prefix_and_a_bad_prefix_is_refused(tmp_path: Path) -> None:
    tables = Tables("run_7")
    assert tables.names() == ("run_7_meta", "run_7_events", "run_7_snapshots", "run_7_leases")
    for bad in ("", "7run", "Run", "a-b", "a" * 41, None, "x; DROP TABLE y"):
        with pytest.raises(ValueError, match="table_prefix must match"):
            Tables(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="table_prefix must match"):
            HistoryStore(tmp_path / "h.sqlite", table_prefix=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "h.sqlite").exists()
    d = DurableSampler(UniformSampler(_pool(), seed=0), HistoryStore(tmp_path / "h.sqlite", table_prefix="run_7"))
    d.close()
    conn = sqlite3.connect(tmp_path / "h.sqlite")
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert names == set(tables.names())


def test_payload_builders_and_reader_agree() -> None:
    sample = Payload(sample_payload(2, ["a", "b"], ["l1", "l2"]))
    assert (sample.n, sample.task_keys, sample.leases) == (2, ["a", "b"], ["l1", "l2"])
    assert Payload(sample_payload(1, ["a"])).leases == [] and "leases" not in sample_payload(1, ["a"])
    update = Payload(update_payload("a", [1, None, 0.5], None, "l1"))
    assert (update.key, update.rewards, update.costs, update.lease) == ("a", [1.0, None, 0.5], None, "l1")
    assert update.logged_group() == ([1.0, None, 0.5], None)
    assert update_payload("a", [1], [2]) == {"key": "a", "rewards": [1.0], "costs": [2.0]}
    discard = Payload(discard_payload("a", "timeout", "l2", reclaimed=True))
    assert (discard.key, discard.reason, discard.lease, discard.reclaimed) == ("a", "timeout", "l2", True)
    assert discard_payload("a", None) == {"key": "a", "reason": None}
    assert Payload(discard_payload("a", None)).reclaimed is False
    with pytest.raises(KeyError, match="rewards"):  # a required field is read when asked
        _ = Payload({"key": "a"}).rewards


def _drive(store: HistoryStore) -> dict[str, Any]:
    """Leased and plain draws, updates with unscored rollouts and costs, a discard and a reclaim; returns what
    the queries must find."""
    d = DurableSampler(UniformSampler(_pool(), seed=4), store)
    plain = d.sample(2)
    d.update(plain[0], [1.0, None, 0.25], [0.5, 0.5, 1.0])
    d.update(plain[1], [None, None], None)
    leased = d.sample(3, leases=["la", "lb", "lc"])
    d.update(leased[0], [0.0, 0.75], lease="la")
    d.discard(leased[1], reason="tool crashed", lease="lb")
    d.discard(leased[2], reason="lease expired", lease="lc", reclaimed=True)
    keys = [task_key(t) for t in plain + leased]
    d.close()
    return {"keys": keys}


def _check_queries(store: HistoryStore, keys: list[str]) -> None:
    q, header = store.queries, store.header()
    assert header is not None
    with store.transaction() as tx:
        assert q.last_event(tx)[0] == 7
        samples = q.sample_rows(tx, 0, 7)
        assert [(r[0], r[2], r[3], bool(r[4])) for r in samples] == [
            (1, 0, keys[0], False), (1, 1, keys[1], False), (4, 0, keys[2], True), (4, 1, keys[3], True),
            (4, 2, keys[4], True)]
        updates = q.update_rows(tx, 0, 7)
        assert [(r[0], r[2], r[3], *r[4:]) for r in updates] == [
            (2, keys[0], None, 3, 2, 0.25, 1.0, 1.25, 1.0625, 2.0), (3, keys[1], None, 2, 0, None, None, 0.0, 0.0, 0.0),
            (5, keys[2], "la", 2, 2, 0.0, 0.75, 0.75, 0.5625, 0.0)]
        discards = q.discard_rows(tx, 0, 7)
        assert [(r[0], r[2], r[3], r[4], bool(r[5])) for r in discards] == [
            (6, keys[3], "lb", "tool crashed", False), (7, keys[4], "lc", "lease expired", True)]
        # the database's extraction equals the Python reference, row for row
        for name in ("sample_rows", "update_rows", "discard_rows"):
            fast, slow = getattr(q, name)(tx, 0, 7), getattr(q, name)(tx, 0, 7, sql_json=False)
            assert [tuple(r) for r in fast] == [tuple(r) for r in slow], name
        assert q.sample_rows(tx, 1, 3) == [] and len(q.update_rows(tx, 2, 3)) == 1  # (after, upto]
        assert [(r[0], r[1]) for r in q.event_heads(tx, 3, 2)] == [(4, "sample"), (5, "update")]
        assert [(r[0], r[1], json.loads(r[3])) for r in q.event_payload_rows(tx, 5, 6)] == [
            (6, "discard", {"key": keys[3], "reason": "tool crashed", "lease": "lb"})]
        tasks = q.task_rows(tx, 8)
        # (PostgreSQL's ->> gives every value as text)
        assert [tuple(map(str, r)) for r in tasks] == [tuple(map(str, r)) for r in q.task_rows(tx, 8, sql_json=False)]
        assert len(tasks) == 13 and tuple(tasks[4]) == ("t4", None, None, "e1", "do 4 xxx")
        assert tuple(map(str, tasks[-1])) == ("s7", "train", "7", "e0", "None")
        assert q.issued_seqs(tx, ["la", "lc", "never"]) == {"la": 4, "lc": 4}
        assert q.lease_counts(tx) == {"open": 0, "update": 1, "discard": 1, "reclaim": 1}
        assert q.open_leases(tx) == []
        assert q.snapshot_seqs(tx) == [0]
        assert q.events_name_leases(tx)
        assert q.pending_upgrades(tx, header) == []


def test_the_queries_read_what_was_logged_on_sqlite(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    keys = _drive(store)["keys"]
    _check_queries(HistoryStore(tmp_path / "h.sqlite", read_only=True), keys)


@pytest.fixture
def pg_prefix() -> Iterator[str]:
    if not URL:
        pytest.skip("ENVSCHED_TEST_POSTGRES_URL is not set (CI runs .ci/postgres.sh)")
    name = f"s_{uuid.uuid4().hex[:12]}"
    yield name
    store = HistoryStore(URL, table_prefix=name)
    store.drop()
    store.close()


def test_the_queries_read_what_was_logged_on_postgres(pg_prefix: str) -> None:
    assert URL is not None
    keys = _drive(HistoryStore(URL, table_prefix=pg_prefix))["keys"]
    store = HistoryStore(URL, table_prefix=pg_prefix, read_only=True)
    _check_queries(store, keys)
    with store.transaction() as tx:
        assert store.queries.table_exists(tx, store.t_leases)
        assert not store.queries.table_exists(tx, f"{pg_prefix}_nothing")
    store.close()


def test_lease_counts_of_a_store_without_a_lease_table(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    _drive(HistoryStore(path))
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TABLE envsched_leases")
    conn.close()
    store = HistoryStore(path, read_only=True)
    with store.transaction() as tx:
        assert store.queries.lease_counts(tx, missing_table_ok=True) == {"open": 0, "update": 0, "discard": 0,
                                                                         "reclaim": 0}
        with pytest.raises(StoreError, match="no such table"):
            store.queries.lease_counts(tx)


def test_pending_upgrades_of_an_old_store_until_a_writer_makes_them(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    d = DurableSampler(UniformSampler(_pool(), seed=1), path)
    assert d.store.pending_upgrades() == []  # a new store, even before its first event
    for t in d.sample(2):
        d.update(t, [1.0])
    d.close()
    conn = sqlite3.connect(path)  # what a store written before the head and the lease table looks like
    with conn:
        conn.execute("DROP TABLE envsched_leases")
        conn.execute("DELETE FROM envsched_meta WHERE key IN ('lease_table', 'head')")
    conn.close()
    assert HistoryStore(path, read_only=True).pending_upgrades() == [u.name for u in UPGRADES] == ["head",
                                                                                                   "lease_table"]
    res = CliRunner().invoke(cli, ["store", "info", str(path), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["upgrades_pending"] == ["head", "lease_table"] and info["format"] == STORE_FORMAT
    assert info["tables"] == ["envsched_meta", "envsched_events", "envsched_snapshots", "envsched_leases"]
    d = DurableSampler(UniformSampler(_pool(), seed=1), path)  # the next writer
    assert d.store.pending_upgrades() == ["head"]  # the table at once, the head with the next event
    d.update(d.sample(1)[0], [0.0])
    d.close()
    assert HistoryStore(path, read_only=True).pending_upgrades() == []


def test_a_dropped_lease_table_is_damage_not_a_pending_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    _drive(HistoryStore(path))
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TABLE envsched_leases")
    conn.close()
    assert HistoryStore(path, read_only=True).pending_upgrades() == []
    with pytest.raises(StoreError, match="lease table envsched_leases is missing"):
        DurableSampler.resume(HistoryStore(path, read_only=True))


#: Modules that still spell the store's table names or payload paths themselves, until they read through
#: envsched.store.schema (the dashboard's reader: its StoreQueries calls are listed in docs/durability.md).
PENDING = {"dashboard/reader.py"}
SPELLINGS = re.compile(r"\{[^}]*\}_(?:meta|events|snapshots|leases)\b"  # a table name built from a prefix
                       r"|envsched_(?:meta|events|snapshots|leases)\b"  # the default prefix's table names
                       r"|'\$\.\w+'"  # an SQLite JSON path
                       r"|->>? *'\w+'")  # a PostgreSQL jsonb field


def spellings(package: Path) -> dict[str, list[int]]:
    """``file -> lines`` of the table names and payload paths spelled outside ``store/schema.py``."""
    out: dict[str, list[int]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel == "store/schema.py":
            continue
        lines = [i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if SPELLINGS.search(line)]
        if lines:
            out[rel] = lines
    return out


def test_only_the_schema_spells_table_names_and_payload_paths() -> None:
    found = spellings(Path(envsched.__file__).resolve().parent)
    assert set(found) <= PENDING, {k: v for k, v in found.items() if k not in PENDING}


def test_the_spelling_check_finds_a_second_copy(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "schema.py").write_text("META = f'{p}_meta'\n")
    (tmp_path / "x.py").write_text("a = 1\nt = f'{prefix}_events'\n")
    (tmp_path / "y.py").write_text("q = \"SELECT json_extract(payload, '$.rewards')\"\n\nr = \"p::jsonb ->> 'key'\"\n")
    (tmp_path / "z.py").write_text("events = store.t_events\n")
    assert spellings(tmp_path) == {"x.py": [2], "y.py": [1, 3]}
