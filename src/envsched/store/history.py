"""``HistoryStore``: an append-only log of a sampler's dispatches and updates, in SQLite or PostgreSQL.

The store keeps, under one table prefix, the metadata, the hash-chained events, the sampler's state
snapshots and the lease index; what each table and event payload holds, the format's version and its in-place
upgrades are described in :mod:`envsched.store.schema`, and every read is in :mod:`envsched.store.queries`.
This module writes: creation (tables, metadata and the initial snapshot, all or nothing), events with the
chain's head, snapshots, leases and the upgrades, and it verifies what it reads (the chain, the head, the
log's end, the metadata).

Every write is one transaction taken under an exclusive lock (SQLite ``BEGIN IMMEDIATE`` in WAL mode with
``synchronous=FULL``, :mod:`envsched.store.sqlite`; PostgreSQL a transaction-scoped advisory lock,
:mod:`envsched.store.postgresql`), so several processes may share one store: each catches up with the
others' events before it appends its own (see :class:`~envsched.store.durable.DurableSampler`).

A path (or ``sqlite:///path``) opens SQLite through the standard library; a ``postgresql://`` URL opens
PostgreSQL through SQLAlchemy and psycopg (``pip install 'envsched[postgres]'``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from envsched.errors import redact_url
from envsched.store.errors import StoreCorruptError, StoreError, StoreMismatchError
from envsched.store.leases import OUTCOMES
from envsched.store.postgresql import PostgresBackend
from envsched.store.queries import StoreQueries, Transaction
from envsched.store.schema import (
    EVENT_KINDS,
    HEAD_KEY,
    STORE_FORMAT,
    Event,
    Snapshot,
    Tables,
    canonical_json,
    chain_digest,
    genesis_digest,
    head_value,
    loads_stored,
    parse_head,
    validate_meta,
)
from envsched.store.sqlite import SqliteBackend

__all__ = [
    "STORE_FORMAT",
    "Event",
    "HistoryStore",
    "Snapshot",
    "StoreCorruptError",
    "StoreError",
    "StoreMismatchError",
    "canonical_json",
]

# the SQLite backend and the chain rule under the names code outside the store reaches them by here
_SqliteBackend = SqliteBackend
_chain = chain_digest


class HistoryStore:
    """An append-only, hash-chained log of sampler events with periodic state snapshots.

    Open one with :meth:`open`; hand it to :class:`~envsched.store.durable.DurableSampler`, which does
    all the writing. Reading (:meth:`header`, :meth:`events`, :meth:`snapshot_seqs`) is safe at any time.

    Args:
        target: a file path (SQLite), ``sqlite:///path``, or a ``postgresql://`` /
            ``postgresql+psycopg://`` URL.
        table_prefix: prefix of the table names, so that several stores can share one PostgreSQL
            database (lower-case letters, digits, ``_``; at most 40 characters).
        busy_timeout_s: how long a writer waits for another process's transaction (SQLite).
        synchronous: SQLite ``synchronous`` pragma: ``FULL`` (default) makes every committed update survive
            a power loss, not only a process crash.
        read_only: open the store so that nothing can be written (SQLite ``mode=ro`` and ``query_only``;
            PostgreSQL ``SET TRANSACTION READ ONLY``): for inspection (``envsched store verify``). A
            :class:`~envsched.store.durable.DurableSampler` on a read-only store can rebuild and be read, not
            sample or update.

    Attributes:
        tables: the store's :class:`~envsched.store.schema.Tables` (``t_meta``, ``t_events``, ``t_snap`` and
            ``t_leases`` are their names).
        queries: the :class:`~envsched.store.queries.StoreQueries` every read of this store runs; with
            :meth:`transaction` they read anything the store holds.
    """

    def __init__(self, target: str | os.PathLike[str], *, table_prefix: str = "envsched",
                 busy_timeout_s: float = 60.0, synchronous: str = "FULL", check: bool = True,
                 read_only: bool = False) -> None:
        self.tables = Tables(table_prefix)
        self.table_prefix = table_prefix
        self.t_meta, self.t_events, self.t_snap, self.t_leases = self.tables.names()
        self._lock = threading.RLock()
        self.read_only = bool(read_only)
        text = os.fspath(target)
        if text.startswith(("postgresql://", "postgresql+", "postgres://")):
            self._backend: Any = PostgresBackend(text, prefix=table_prefix, connect_timeout_s=busy_timeout_s,
                                                 read_only=self.read_only)
        elif "://" in text and not text.startswith("sqlite:///"):
            raise ValueError(f"unsupported store URL {redact_url(text)!r}: give a file path, sqlite:///path or a "
                             "postgresql:// URL")
        else:
            path = Path(text[len("sqlite:///"):] if text.startswith("sqlite:///") else text)
            if path.exists() and path.is_dir():
                raise ValueError(f"store path {path} is a directory; give a file path such as {path}/history.sqlite")
            if self.read_only and not path.exists():
                raise StoreError(f"store file {path} does not exist (opened read-only: nothing is created)")
            if path.exists() and not path.is_file():
                raise ValueError(f"store path {path} is not a regular file (a named pipe, device or socket): a "
                                 "SQLite store is a regular file")
            self._backend = SqliteBackend(path, busy_timeout_s=busy_timeout_s, synchronous=synchronous,
                                          read_only=self.read_only)
        self.queries = StoreQueries(self.tables, self._backend.kind)
        self.where: str = self._backend.where
        if self.kind == "postgresql":
            self.where = f"{self.where} (tables {table_prefix}_*)"
        if check and self.kind == "sqlite" and self._backend.exists():
            names = self._backend.inspect()  # read-only: a damaged or foreign file is never modified
            if names and self.t_meta not in names:
                raise StoreCorruptError(f"store {self.where} is an SQLite database but not an envsched store "
                                        f"(no table {self.t_meta}; it has {sorted(names)[:5]})")
            if names:
                self.header()  # validates the metadata
        if self.kind == "sqlite" and not self.read_only:
            self._backend.clean_stale_init_files()  # left by a process killed while creating this store

    @classmethod
    def open(cls, target: str | os.PathLike[str], **kwargs: Any) -> HistoryStore:
        """Open (not yet create) a store at ``target``; see the class for the arguments. A store is created
        by the first :class:`~envsched.store.durable.DurableSampler` that uses it."""
        return cls(target, **kwargs)

    @property
    def kind(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._backend.kind

    def __repr__(self) -> str:
        return f"<HistoryStore {self.kind} {self.where} prefix={self.table_prefix!r}>"

    def close(self) -> None:
        """Close the connection(s); the store can be used again later (it reconnects)."""
        self._backend.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ metadata
    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """An exclusive write transaction (the store's lock is held until it ends); a read-only store's
        transactions only read."""
        with self._lock, self._backend.transaction() as tx:
            yield tx

    def _table_exists(self, tx: Transaction) -> bool:
        if self.kind == "sqlite":
            names = self.queries.table_names(tx)
            if names and self.t_meta not in names:
                raise StoreCorruptError(f"store {self.where} is an SQLite database but not an envsched store "
                                        f"(no table {self.t_meta}; it has {sorted(names)[:5]})")
            return self.t_meta in names
        return self.queries.table_exists(tx, self.t_meta)

    def _read_meta(self, tx: Transaction) -> dict[str, Any] | None:
        if not self._table_exists(tx):
            return None
        rows = self.queries.meta_rows(tx)
        if not rows:
            if self.kind == "sqlite":
                raise StoreCorruptError(f"store {self.where} has an empty {self.t_meta} table: damaged or "
                                        "truncated")
            return None
        meta: dict[str, Any] = {}
        for key, value in rows:
            meta[key] = loads_stored(value, f"store {self.where}: metadata {str(key)[:80]!r}")
        validate_meta(meta, self.where)
        self._check_schema(tx)
        return meta

    def _check_schema(self, tx: Transaction) -> None:
        """Refuse a store whose tables carry triggers or rules: the store's writes would run code (statements)
        that nobody wrote into envsched -- an edited store. Views named like its tables are refused too."""
        extra = self.queries.foreign_objects(tx)
        if extra:
            kind, name = extra[0]
            raise StoreCorruptError(f"store {self.where} has a {kind} {str(name)[:60]!r} on its tables, which "
                                    "envsched never creates: the store was edited; refusing to use it (a store is "
                                    "data, never code)")

    def header(self) -> dict[str, Any] | None:
        """The store's metadata, or ``None`` while no sampler has created it. The task list is left out
        (see :meth:`tasks`)."""
        if self.kind == "sqlite" and not self._backend.exists():
            return None
        with self.transaction() as tx:
            meta = self._read_meta(tx)
        if meta is not None:
            meta.pop("tasks", None)
        return meta

    def tasks(self) -> list[Any]:
        """The task list the store was created with."""
        with self.transaction() as tx:
            meta = self._read_meta(tx)
        if meta is None:
            raise StoreError(f"store {self.where} has not been created yet")
        tasks = meta.get("tasks")
        if not isinstance(tasks, list):
            raise StoreCorruptError(f"store {self.where}: metadata 'tasks' is not a list (damaged store)")
        return tasks

    def initialize(self, meta: Mapping[str, Any], initial_state: Mapping[str, Any]) -> bool:
        """Create the tables, the metadata and snapshot 0 (all or nothing). Returns ``False`` when the store
        already existed (then nothing is written). Called by :class:`DurableSampler`."""
        full = {**meta, "format": STORE_FORMAT, "store_id": uuid.uuid4().hex, "created_at": time.time(),
                "lease_table": True}
        state_json = canonical_json(initial_state, allow_nan=True)

        def init(tx: Transaction) -> None:
            for stmt in self.tables.create_statements():
                tx.execute(stmt)
            for key, value in full.items():
                tx.execute(f"INSERT INTO {self.t_meta} (key, value) VALUES (:k, :v)",
                           {"k": key, "v": canonical_json(value)})
            tx.execute(f"INSERT INTO {self.t_snap} (seq, state, digest, created) VALUES (0, :s, :d, :c)",
                       {"s": state_json, "d": genesis_digest(full["store_id"]), "c": time.time()})

        with self._lock:
            if self.kind == "sqlite" and not self._backend.exists() and self._backend.create_atomically(init):
                return True
            with self._backend.transaction() as tx:
                if self._read_meta(tx) is not None:
                    return False
                init(tx)
                return True

    # ------------------------------------------------------------------ events and snapshots
    def last_event(self, tx: Transaction) -> tuple[int, str | None]:
        """``(seq, digest)`` of the last event (``(0, None)`` when there is none)."""
        return self.queries.last_event(tx)

    def append(self, tx: Transaction, seq: int, prev_digest: str, kind: str, payload: Mapping[str, Any]) -> str:
        """Append event ``seq`` inside a transaction; returns its digest."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        text = canonical_json(payload)
        digest = chain_digest(prev_digest, kind, text)
        tx.execute(f"INSERT INTO {self.t_events} (seq, kind, payload, digest, created) "
                   "VALUES (:s, :k, :p, :d, :c)", {"s": seq, "k": kind, "p": text, "d": digest, "c": time.time()})
        self._write_head(tx, seq, digest)
        return digest

    def _write_head(self, tx: Transaction, seq: int, digest: str) -> None:
        """Record the chain's head (last seq and digest) in the same transaction as the event, so that
        a lost tail of the log (the last events deleted or truncated away) is detected on open."""
        tx.execute(f"INSERT INTO {self.t_meta} (key, value) VALUES ('{HEAD_KEY}', :v) "
                   "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   {"v": canonical_json(head_value(seq, digest))})

    def check_head(self, tx: Transaction, seq: int, digest: str) -> None:
        """Raise :class:`StoreCorruptError` unless the verified log, which ends at ``(seq, digest)``, ends
        where the recorded head says (stores written before the head was recorded have none: skipped)."""
        row = self.queries.meta_text(tx, HEAD_KEY)
        if row is None:
            return
        head_seq, head_digest = parse_head(row[0], self.where)
        if head_seq != seq or head_digest != digest:
            if head_seq > seq:
                raise StoreCorruptError(
                    f"store {self.where}: the event log ends at event {seq}, but the store recorded event "
                    f"{head_seq} as its last: {head_seq - seq} event(s) at the end of the log were lost "
                    "(deleted or truncated); restore the store from a backup")
            raise StoreCorruptError(f"store {self.where}: the event log ends at event {seq}, which does not "
                                    f"match the recorded head (event {head_seq}): the log was edited")

    @staticmethod
    def chain_event(prev_digest: str, kind: str, payload: Mapping[str, Any]) -> tuple[str, str]:
        """The JSON text and the chained digest of an event (without writing it)."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        text = canonical_json(payload)
        return text, chain_digest(prev_digest, kind, text)

    def append_many(self, tx: Transaction, rows: list[tuple[int, str, str, str]]) -> None:
        """Insert ``(seq, kind, payload_text, digest)`` rows (see :meth:`chain_event`) in a few statements."""
        now = time.time()
        for i in range(0, len(rows), 200):
            chunk = rows[i:i + 200]
            params: dict[str, Any] = {"c": now}
            values = []
            for j, (seq, kind, text, digest) in enumerate(chunk):
                params.update({f"s{j}": seq, f"k{j}": kind, f"p{j}": text, f"d{j}": digest})
                values.append(f"(:s{j}, :k{j}, :p{j}, :d{j}, :c)")
            tx.execute(f"INSERT INTO {self.t_events} (seq, kind, payload, digest, created) VALUES "
                       + ", ".join(values), params)
        if rows:
            self._write_head(tx, rows[-1][0], rows[-1][3])

    def read_events(self, tx: Transaction, after: int, prev_digest: str, *, limit: int | None = None) -> list[Event]:
        """Events with ``seq > after`` in order, checking seq continuity and the hash chain."""
        out: list[Event] = []
        expected, prev = after + 1, prev_digest
        for seq, kind, payload, digest in self.queries.event_rows(tx, after, limit):
            seq = int(seq)
            if seq != expected:
                raise StoreCorruptError(f"store {self.where}: event {expected} is missing (next is {seq}); "
                                        "the log is damaged or truncated")
            if not isinstance(payload, str) or chain_digest(prev, str(kind), payload) != digest:
                raise StoreCorruptError(f"store {self.where}: event {seq} fails its integrity check (its "
                                        "digest does not match the chain): the log was damaged or edited")
            if kind not in EVENT_KINDS:
                raise StoreCorruptError(f"store {self.where}: event {seq} has unknown kind {kind!r}")
            data = loads_stored(payload, f"store {self.where}: event {seq} payload")
            if not isinstance(data, dict):
                raise StoreCorruptError(f"store {self.where}: event {seq} payload is not an object")
            out.append(Event(seq, str(kind), data, str(digest)))
            expected, prev = seq + 1, str(digest)
        return out

    def event_payload(self, tx: Transaction, seq: int) -> dict[str, Any] | None:
        """The decoded payload of event ``seq`` (``None`` if there is none); the caller has verified the chain."""
        row = self.queries.payload_text(tx, seq)
        if row is None:
            return None
        data = loads_stored(row[0], f"store {self.where}: event {seq} payload")
        return data if isinstance(data, dict) else None

    def check_tail(self, tx: Transaction, seq: int) -> None:
        """Raise :class:`StoreCorruptError` when a snapshot or a lease row refers to an event after ``seq``, the
        verified end of the log: events were cut off the end (even if the head was rewritten to match)."""
        refs = self.queries.tail_references(tx, leases=self.has_lease_table(tx))
        for what, value in zip(("a snapshot", "a lease", "a consumed lease"), refs, strict=True):
            if value is not None and int(value) > seq:
                raise StoreCorruptError(f"store {self.where}: the event log ends at event {seq}, but {what} refers "
                                        f"to event {int(value)}: events at the end of the log were removed; "
                                        "restore the store from a backup")

    def digest_at(self, tx: Transaction, seq: int) -> str | None:
        return self.queries.digest_at(tx, seq)

    def write_snapshot(self, tx: Transaction, seq: int, digest: str, state: Mapping[str, Any], *,
                       keep: int = 3) -> None:
        """Store ``state`` as the snapshot after event ``seq``; keep snapshot 0 and the ``keep`` latest."""
        tx.execute(f"DELETE FROM {self.t_snap} WHERE seq = :s", {"s": seq})
        tx.execute(f"INSERT INTO {self.t_snap} (seq, state, digest, created) VALUES (:s, :st, :d, :c)",
                   {"s": seq, "st": canonical_json(state, allow_nan=True), "d": digest, "c": time.time()})
        newest_first = [s for s in reversed(self.queries.snapshot_seqs(tx)) if s > 0]
        for old in newest_first[keep:]:
            tx.execute(f"DELETE FROM {self.t_snap} WHERE seq = :s", {"s": old})

    def read_snapshot(self, tx: Transaction, *, latest: bool, at_most: int | None = None) -> Snapshot:
        """Snapshot 0 (``latest=False``) or the latest one with ``seq <= at_most``."""
        row = self.queries.snapshot_row(tx, latest=latest, at_most=at_most)
        if row is None:
            raise StoreCorruptError(f"store {self.where}: the initial snapshot is missing (damaged store)")
        seq, state, digest = row
        data = loads_stored(state, f"store {self.where}: snapshot after event {seq}")
        if not isinstance(data, dict):
            raise StoreCorruptError(f"store {self.where}: snapshot after event {seq} is not an object")
        return Snapshot(int(seq), data, str(digest))

    # ------------------------------------------------------------------ leases (an index of the events)
    def ensure_lease_table(self, tx: Transaction) -> None:
        """Create the lease table in a store written before leases existed (a no-op otherwise): the
        ``lease_table`` upgrade of :data:`~envsched.store.schema.UPGRADES`."""
        tx.execute(self.tables.lease_table_statement())

    def issue_leases(self, tx: Transaction, seq: int, leases: list[tuple[str, str]]) -> None:
        """Record ``(lease, key)`` pairs issued by ``sample`` event ``seq``. A lease id already in the store
        raises ``ValueError`` (ids are never reused)."""
        if not leases:
            return
        ids = [lid for lid, _ in leases]
        taken = self.existing_leases(tx, ids)
        if taken:
            raise ValueError(f"lease id {sorted(taken)[0]!r} was already issued in store {self.where}: lease "
                             "ids are never reused")
        for i in range(0, len(leases), 300):
            chunk = leases[i:i + 300]
            params: dict[str, Any] = {"s": seq}
            values = []
            for j, (lid, key) in enumerate(chunk):
                params.update({f"l{j}": lid, f"k{j}": key})
                values.append(f"(:l{j}, :k{j}, :s)")
            tx.execute(f"INSERT INTO {self.t_leases} (lease, key, issued_seq) VALUES " + ", ".join(values), params)

    def existing_leases(self, tx: Transaction, ids: list[str]) -> set[str]:
        """The ids among ``ids`` that this store already issued (lease ids are never reused)."""
        return self.queries.issued(tx, ids)

    def lease(self, tx: Transaction, lease: str) -> tuple[str, int, int | None, str | None] | None:
        """``(key, issued_seq, closed_seq, outcome)`` of a lease, or ``None`` if the store never issued it
        (``outcome`` is ``None`` while the lease is open)."""
        row = self.queries.lease_row(tx, lease)
        if row is None:
            return None
        key, issued, closed, outcome = row
        return str(key), int(issued), None if closed is None else int(closed), outcome

    def close_lease(self, tx: Transaction, lease: str, seq: int, outcome: str) -> None:
        """Mark an open lease consumed by event ``seq`` (``outcome``: update, discard or reclaim)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown lease outcome {outcome!r}")
        tx.execute(f"UPDATE {self.t_leases} SET closed_seq = :s, outcome = :o WHERE lease = :l "
                   "AND closed_seq IS NULL", {"s": seq, "o": outcome, "l": lease})

    def leases_bulk(self, tx: Transaction, ids: list[str]) -> dict[str, tuple[str, int, int | None, str | None]]:
        """:meth:`lease` for many ids at once (ids the store never issued are absent)."""
        return {str(lid): (str(key), int(issued), None if closed is None else int(closed), outcome)
                for lid, key, issued, closed, outcome in self.queries.lease_rows(tx, ids)}

    def close_leases(self, tx: Transaction, rows: list[tuple[str, int, str]]) -> None:
        """:meth:`close_lease` for ``(lease, seq, outcome)`` rows, in a few statements."""
        for lid, _, outcome in rows:
            if outcome not in OUTCOMES:
                raise ValueError(f"unknown lease outcome {outcome!r} for lease {lid}")
        if len(rows) == 1:
            self.close_lease(tx, *rows[0])
            return
        for i in range(0, len(rows), 300):
            chunk = rows[i:i + 300]
            params: dict[str, Any] = {}
            values = []
            for j, (lid, seq, outcome) in enumerate(chunk):
                params.update({f"l{j}": lid, f"s{j}": int(seq), f"o{j}": outcome})
                values.append(f"(:l{j}, :s{j}, :o{j})")
            tx.execute("WITH v(l, s, o) AS (VALUES " + ", ".join(values) + f") UPDATE {self.t_leases} "
                       f"SET closed_seq = v.s, outcome = v.o FROM v WHERE {self.t_leases}.lease = v.l "
                       f"AND {self.t_leases}.closed_seq IS NULL", params)

    def open_leases(self, tx: Transaction) -> list[tuple[str, str]]:
        """``(lease, key)`` of every lease not yet consumed, oldest first."""
        return self.queries.open_leases(tx)

    def lease_counts(self, tx: Transaction) -> dict[str, int]:
        """Leases by state: ``open``, ``update``, ``discard``, ``reclaim``."""
        return self.queries.lease_counts(tx)

    def all_leases(self, tx: Transaction) -> dict[str, tuple[str, int, int | None, str | None]]:
        """Every lease row (for the consistency check of a full replay)."""
        return {str(r[0]): (str(r[1]), int(r[2]), None if r[3] is None else int(r[3]), r[4])
                for r in self.queries.all_lease_rows(tx)}

    def events_name_leases(self, tx: Transaction) -> bool:
        """Whether any event's payload carries a lease id."""
        return self.queries.events_name_leases(tx)

    def has_lease_table(self, tx: Transaction) -> bool:
        return self.queries.table_exists(tx, self.t_leases)

    # ------------------------------------------------------------------ reading for people
    def events(self) -> list[Event]:
        """All events, verified (for inspection and tests)."""
        with self.transaction() as tx:
            meta = self._read_meta(tx)
            if meta is None:
                return []
            events = self.read_events(tx, 0, genesis_digest(meta["store_id"]))
            last = events[-1] if events else None
            self.check_head(tx, last.seq if last else 0, last.digest if last else genesis_digest(meta["store_id"]))
            return events

    def count_events(self) -> int:
        """Number of logged events."""
        with self.transaction() as tx:
            if self._read_meta(tx) is None:
                return 0
            return self.last_event(tx)[0]

    def snapshot_seqs(self) -> list[int]:
        """Event numbers after which a snapshot is stored."""
        with self.transaction() as tx:
            if self._read_meta(tx) is None:
                return []
            return self.queries.snapshot_seqs(tx)

    def pending_upgrades(self) -> list[str]:
        """The names of the format's in-place upgrades this store still lacks (the next writer makes them;
        see :data:`~envsched.store.schema.UPGRADES`); empty for a store not created yet."""
        with self.transaction() as tx:
            meta = self._read_meta(tx)
            return [] if meta is None else [u.name for u in self.queries.pending_upgrades(tx, meta)]

    def drop(self) -> None:
        """Delete the store's tables (PostgreSQL) or file (SQLite). Irreversible; for tests and cleanup."""
        if self.read_only:
            raise StoreError(f"store {self.where} is opened read-only: it cannot be dropped")
        if self.kind == "sqlite":
            self.close()
            for extra in ("", "-wal", "-shm"):
                Path(str(self._backend.path) + extra).unlink(missing_ok=True)
            return
        with self._backend.transaction() as tx:
            for t in (self.t_leases, self.t_events, self.t_snap, self.t_meta):
                tx.execute(f"DROP TABLE IF EXISTS {t}")
