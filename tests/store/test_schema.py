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
    MalformedStoreData,
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


def _check_refusals(target: str, prefix: str) -> None:
    """The reads a watcher runs refuse values the format does not allow: the fast path (the database's JSON
    types) without naming the event, the Python parse naming the event and the field; the rest reads as before."""
    writer = HistoryStore(target, table_prefix=prefix, check=False)
    reader = HistoryStore(target, table_prefix=prefix, read_only=True, check=False)
    q, t = reader.queries, reader.tables

    def edit(sql: str, **params: Any) -> None:
        with writer.transaction() as tx:
            tx.execute(sql, params)

    edit(f"UPDATE {t.events} SET payload = :p WHERE seq = 3", p='{"key": "k", "rewards": [1, "x"]}')
    edit(f"UPDATE {t.events} SET payload = :p WHERE seq = 7", p='{"key": "k", "reason": null, "reclaimed": "yes"}')
    with reader.transaction() as tx:
        assert q.numbered_events(tx, 0, 100) == (7, None) and q.max_seq(tx) == 7
        with pytest.raises(MalformedStoreData) as fast:
            q.event_rows_by_kind(tx, 0, 7)
        assert fast.value.seq is None
        with pytest.raises(MalformedStoreData,
                           match=r"^event 3 \(update\): field 'rewards'\[1\] is a string \('x'\)") as slow:
            q.event_rows_by_kind(tx, 0, 7, sql_json=False)
        assert slow.value.seq == 3
        assert [r[0] for r in q.update_rows(tx, 3, 6)] == [5]  # the events around it read as before
        with pytest.raises(MalformedStoreData, match="discard event's field of the wrong type"):
            q.discard_rows(tx, 6, 7)
        with pytest.raises(MalformedStoreData, match=r"^event 7 \(discard\): field 'reclaimed' is a string"):
            q.discard_rows(tx, 6, 7, sql_json=False)
    edit(f"UPDATE {t.events} SET kind = 'evil' WHERE seq = 6")
    edit(f"UPDATE {t.events} SET seq = 9 WHERE seq = 7")
    with reader.transaction() as tx:
        assert q.numbered_events(tx, 0, 100) == (5, "event 6 has unknown kind 'evil' (a store logs sample, update, "
                                                    "discard)")
        assert q.numbered_events(tx, 6, 100) == (6, "event 7 is missing (the next event is 9): the log has a gap "
                                                    "(damaged store; `envsched store verify` checks it)")
        assert q.numbered_events(tx, 2, 2) == (4, None)  # bounded by position
        assert q.max_seq(tx) == 9
    edit(f"UPDATE {t.leases} SET outcome = 'boom' WHERE lease = 'lb'")
    edit(f"UPDATE {t.meta} SET value = :v WHERE key = 'tasks'", v='[{"id": "a"}, 2]')
    with reader.transaction() as tx:
        with pytest.raises(MalformedStoreData, match=r"^a lease has the outcome 'boom', expected update, discard or "
                                                     r"reclaim"):
            q.lease_counts(tx)
        for sql_json in (True, False):
            with pytest.raises(MalformedStoreData, match=r"^metadata 'tasks' is not a JSON list of task objects"):
                q.task_rows(tx, 10, sql_json=sql_json)
    writer.close()
    reader.close()


def test_the_queries_refuse_what_the_format_does_not_allow_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    _drive(HistoryStore(path))
    _check_refusals(str(path), "envsched")
    conn = sqlite3.connect(path)  # SQLite keeps what a column is given: a sequence number or lease event as text
    with conn:
        conn.execute("UPDATE envsched_events SET seq = 'nine' WHERE seq = 9")
        conn.execute("UPDATE envsched_leases SET issued_seq = 'x' WHERE lease = 'la'")
    conn.close()
    store = HistoryStore(path, read_only=True, check=False)
    with store.transaction() as tx:
        assert store.queries.max_seq(tx) == 6
        assert store.queries.numbered_events(tx, 6, 10) == (6, "the event after event 6 has the sequence number "
                                                               "'nine', which is not an integer (damaged store)")
        with pytest.raises(MalformedStoreData, match=r"^lease 'la' has the issuing event 'x', expected an event"):
            store.queries.issued_seqs(tx, ["la"])
    store.close()


def test_the_queries_refuse_what_the_format_does_not_allow_on_postgres(pg_prefix: str) -> None:
    assert URL is not None
    _drive(HistoryStore(URL, table_prefix=pg_prefix))
    _check_refusals(URL, pg_prefix)


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


#: The stored format's modules: the layout (schema.py) and the statements that read it (queries.py).
SCHEMA_MODULES = {"store/schema.py", "store/queries.py"}
SPELLINGS = re.compile(r"\{[^}]*\}_(?:meta|events|snapshots|leases)\b"  # a table name built from a prefix
                       r"|envsched_(?:meta|events|snapshots|leases)\b"  # the default prefix's table names
                       r"|'\$\.\w+'"  # an SQLite JSON path
                       r"|->>? *'\w+'")  # a PostgreSQL jsonb field


def spellings(package: Path) -> dict[str, list[int]]:
    """``file -> lines`` of the table names and payload paths spelled outside :data:`SCHEMA_MODULES`."""
    out: dict[str, list[int]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel in SCHEMA_MODULES:
            continue
        lines = [i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if SPELLINGS.search(line)]
        if lines:
            out[rel] = lines
    return out


def test_only_the_schema_spells_table_names_and_payload_paths() -> None:
    found = spellings(Path(envsched.__file__).resolve().parent)
    assert found == {}, found


def test_the_spelling_check_finds_a_second_copy(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "schema.py").write_text("META = f'{p}_meta'\n")
    (tmp_path / "store" / "queries.py").write_text("q = \"SELECT json_extract(payload, '$.key')\"\n")
    (tmp_path / "x.py").write_text("a = 1\nt = f'{prefix}_events'\n")
    (tmp_path / "y.py").write_text("q = \"SELECT json_extract(payload, '$.rewards')\"\n\nr = \"p::jsonb ->> 'key'\"\n")
    (tmp_path / "z.py").write_text("events = store.t_events\n")
    assert spellings(tmp_path) == {"x.py": [2], "y.py": [1, 3]}
