"""Read-only access to a history store, for the dashboard.

The dashboard must never write to a store a trainer is writing, nor slow it down, nor leave anything beside
it. This reader therefore opens SQLite through a ``mode=ro`` URI with ``PRAGMA query_only`` (in WAL mode a
reader never blocks the writer and takes no lock the writer waits on), one short-lived connection per read,
and PostgreSQL in ``READ ONLY`` transactions without the store's advisory lock. Each read is one short
transaction, so it sees one consistent, committed state of the log.

Nothing beside the store: a read-only SQLite connection to a WAL-mode database creates ``STORE-wal`` and
``STORE-shm`` when they do not exist, and cannot delete them when it closes. SQLite's documented way to read
such a database without them is the ``immutable`` URI parameter, which is right exactly when no connection
has the database open in WAL mode: such a connection keeps ``STORE-wal`` in place (it is deleted by the last
writer to close, after it copied everything into the file). So each read checks: the store is in WAL mode
and ``STORE-wal`` is absent -> ``immutable=1`` (the file holds every committed event); otherwise the ordinary
``mode=ro`` connection, which then uses the writer's files. One connection per read, closed right after, so
that a writer closing while the dashboard idles can delete its files as usual.

What it reads, and how it is checked, is the store's: the queries are
:class:`~envsched.store.queries.StoreQueries` (the tables and payload paths of :mod:`envsched.store.schema`),
run on this module's connections. Bounded work whatever the log holds: a read takes the next ``limit`` events
by position (never a range of sequence numbers), and the events of a store are numbered 1, 2, 3, ... without
gaps, so a gap, a number that is not an integer, an unknown kind or a malformed payload stops the read with a
:class:`DashboardError` naming the event and the field (the fast path checks the types the database reports;
when something is off, the same events are parsed in Python to name the first bad one); the events before it
are returned.

It reads only what the views need, extracted by the database itself (SQLite's JSON1 functions, PostgreSQL's
``jsonb``): per drawn group its task key; per update the number of rollouts and the scored rewards' count,
minimum, maximum, sum and sum of squares; per discard its reason. The hash chain is not checked here (that is
``envsched store verify``): the dashboard shows what was committed.

Store URLs are shown through :func:`envsched.errors.redact_url` (passwords and credential parameters become
``***``), in every message and in :attr:`StoreReader.where`, which the page title and the summary show.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envsched.errors import EnvSchedError, redact_secrets, redact_url
from envsched.store import postgresql
from envsched.store.errors import StoreCorruptError
from envsched.store.queries import StoreQueries
from envsched.store.schema import MalformedStoreData, Tables, loads_stored, quote, validate_meta

__all__ = ["DashboardError", "EventBatch", "StoreReader", "TaskTable"]

#: how many characters of an instruction the dashboard keeps (shown as text, never as markup)
INSTRUCTION_CHARS = 600


class DashboardError(EnvSchedError, RuntimeError):
    """The store cannot be read by the dashboard (missing, not an envsched store, damaged, unreachable)."""


class _Transaction:
    """One read's connection as a :class:`~envsched.store.queries.Transaction` (see :meth:`StoreReader._read`)."""

    def __init__(self, run: Callable[[str, Mapping[str, Any] | None, bool], list[tuple[Any, ...]]],
                 data: bool) -> None:
        self._run, self._data = run, data

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return self._run(sql, params, self._data)


class _Malformed(EnvSchedError):
    """Events ``(after, upto]`` hold a malformed one (``error``, which names it when ``error.seq`` is set)."""

    def __init__(self, after: int, upto: int, error: MalformedStoreData) -> None:
        super().__init__(str(error))
        self.after, self.upto, self.error = after, upto, error


@dataclass
class TaskTable:
    """The store's task list, reduced to what the views show: key, environment, start of the instruction."""

    keys: list[str]
    envs: list[str]
    instructions: list[str]


@dataclass
class EventBatch:
    """Events ``(after, upto]`` of the log, as columns.

    ``samples``: ``(seq, created, position in the draw, task key, drawn under a lease)`` per drawn group;
    ``updates``: ``(seq, created, key, lease, rollouts, scored, min, max, sum, sum of squares, cost)``;
    ``discards``: ``(seq, created, key, lease, reason, reclaimed)``; ``head``: the last committed event;
    ``leases``: ``lease -> issued_seq`` of the leases named by these updates and discards.
    """

    after: int
    upto: int
    head: int
    samples: list[tuple[Any, ...]]
    updates: list[tuple[Any, ...]]
    discards: list[tuple[Any, ...]]
    leases: dict[str, int]


def is_url(target: str) -> bool:
    return "://" in target and not target.startswith("sqlite:///")


class StoreReader:
    """A read-only view of the history store at ``target`` (a SQLite path, ``sqlite:///path`` or a
    ``postgresql://`` URL). Raises :class:`DashboardError` when it cannot be read; creates no file.

    ``tables`` are the store's :class:`~envsched.store.schema.Tables` and ``queries`` the
    :class:`~envsched.store.queries.StoreQueries` every read runs; ``use_sql_json=False`` parses the payloads
    in Python instead of extracting them in SQL (the reference the tests compare the two with)."""

    def __init__(self, target: str | os.PathLike[str], *, table_prefix: str = "envsched",
                 use_sql_json: bool = True) -> None:
        self.tables = Tables(table_prefix)  # ValueError for a prefix that is not one
        text = os.fspath(target)
        self.use_sql_json = use_sql_json
        self._lock = threading.Lock()
        self._engine: Any = None
        self._path: Path | None = None
        self._url = ""
        if text.startswith(("postgresql://", "postgresql+", "postgres://")):
            self.kind = "postgresql"
            self._open_postgres(text)
        elif is_url(text):
            raise DashboardError(f"unsupported store URL {redact_url(text)!r}: give a SQLite file path, "
                                 "sqlite:///path or a postgresql:// URL")
        else:
            self.kind = "sqlite"
            self._open_sqlite(Path(text[len("sqlite:///"):] if text.startswith("sqlite:///") else text))
        self.queries = StoreQueries(self.tables, self.kind)
        self.header = self._read_header()

    # ------------------------------------------------------------------ connections
    def _open_sqlite(self, path: Path) -> None:
        self.where = str(path)
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise DashboardError(f"store not found: {path} (no such file; a SQLite store is the file given to "
                                 "`envsched run --store PATH` or DurableSampler(sampler, PATH))") from None
        except OSError as exc:
            raise DashboardError(f"store {path}: cannot read it ({exc.strerror or exc})") from None
        if stat.S_ISDIR(mode):
            raise DashboardError(f"{path} is a directory; a SQLite store is a file")
        if not stat.S_ISREG(mode):
            raise DashboardError(f"{path} is not a regular file (a named pipe, device or socket): a SQLite store "
                                 "is a regular file")
        self._path = path.resolve()

    def _wal_mode(self) -> bool:
        """Whether the SQLite file says it is in WAL mode (file format bytes 18 and 19 are 2)."""
        assert self._path is not None
        try:
            with self._path.open("rb") as fh:
                head = fh.read(20)
        except OSError as exc:
            raise DashboardError(f"store {self.where}: cannot read it ({exc.strerror or exc})") from None
        return len(head) == 20 and head[:16] == b"SQLite format 3\x00" and head[18] == 2 and head[19] == 2

    def _sqlite_connect(self) -> sqlite3.Connection:
        """A new read-only connection for one read (see the module docstring for ``immutable``)."""
        assert self._path is not None
        uri = f"{self._path.as_uri()}?mode=ro"
        if self._wal_mode() and not os.path.exists(f"{self._path}-wal"):
            uri += "&immutable=1"  # no connection has it open in WAL mode: the file holds every commit
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=10.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise DashboardError(f"store {self.where}: cannot open it read-only ({exc})") from None
        try:
            conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            conn.close()
            raise DashboardError(f"store {self.where}: cannot open it read-only ({exc})") from None
        return conn

    def _open_postgres(self, url: str) -> None:
        self._url = url
        self.where = redact_url(url)
        try:
            self._engine, _ = postgresql.create_engine(url, connect_timeout_s=10, pool_size=1, max_overflow=1)
        except ImportError:  # pragma: no cover - depends on the environment
            raise DashboardError("a PostgreSQL store needs SQLAlchemy and psycopg: "
                                 "pip install 'envsched[postgres]'") from None
        except ValueError as exc:
            raise DashboardError(str(exc)) from None
        import sqlalchemy

        self._sa = sqlalchemy

    def _db_error(self, exc: BaseException) -> DashboardError:
        """A database error as one line naming the store (a connection's failure included)."""
        return DashboardError(f"store {self.where}: {postgresql.driver_message(exc, self._url)}")

    @contextlib.contextmanager
    def _read(self) -> Iterator[tuple[_Transaction, _Transaction]]:
        """One read-only transaction, as two :class:`~envsched.store.queries.Transaction` views of it: the
        first for the store's structure (a database error is a :class:`DashboardError` naming the store), the
        second for queries whose result depends on the events' contents (there a database error, such as
        SQLite's "malformed JSON", is :class:`~envsched.store.schema.MalformedStoreData`, which the caller
        turns into a message naming the event)."""
        with self._lock:
            if self._path is not None:
                conn = self._sqlite_connect()
                try:
                    try:
                        conn.execute("BEGIN")
                    except sqlite3.Error as exc:
                        raise self._db_error(exc) from None

                    def run(sql: str, params: Mapping[str, Any] | None, data: bool) -> list[tuple[Any, ...]]:
                        try:
                            return conn.execute(sql, dict(params or {})).fetchall()
                        except sqlite3.Error as exc:
                            if data:
                                raise MalformedStoreData(str(exc)) from None
                            raise self._db_error(exc) from None
                        except (OverflowError, RecursionError, MemoryError) as exc:
                            raise MalformedStoreData(f"{type(exc).__name__}: {exc}") from None

                    yield _Transaction(run, False), _Transaction(run, True)
                finally:
                    conn.close()  # also ends the transaction
                return
            sa = self._sa
            try:
                connection = self._engine.connect()
            except sa.exc.SQLAlchemyError as exc:
                raise DashboardError(f"store {self.where}: cannot connect to PostgreSQL "
                                     f"({postgresql.driver_message(exc, self._url)})") from None
            try:
                with connection.execution_options(isolation_level="REPEATABLE READ",
                                                  postgresql_readonly=True) as c, c.begin():

                    def run(sql: str, params: Mapping[str, Any] | None, data: bool) -> list[tuple[Any, ...]]:
                        try:
                            return [tuple(r) for r in c.execute(sa.text(sql), dict(params or {})).fetchall()]
                        except (sa.exc.DataError, sa.exc.ProgrammingError, sa.exc.InternalError) as exc:
                            if data:
                                raise MalformedStoreData(str(getattr(exc, "orig", exc))) from None
                            raise

                    yield _Transaction(run, False), _Transaction(run, True)
            except sa.exc.SQLAlchemyError as exc:
                raise self._db_error(exc) from None

    def close(self) -> None:
        """Release the database connections (a SQLite store holds none between reads)."""
        if self._engine is not None:
            self._engine.dispose()

    def _data_error(self, exc: StoreCorruptError) -> DashboardError:
        return DashboardError(f"store {self.where}: {redact_secrets(exc, self._url)}")

    # ------------------------------------------------------------------ metadata
    def _read_header(self) -> dict[str, Any]:
        """The metadata without the task list, checked as the store checks it
        (:func:`~envsched.store.schema.validate_meta`)."""
        with self._read() as (tx, _):
            if not self.queries.table_exists(tx, self.tables.meta):
                raise DashboardError(f"{self.where} is not an envsched history store (no table {self.tables.meta})")
            rows = self.queries.meta_rows(tx, tasks=False)
        try:
            meta = {str(key): loads_stored(value, f"store {self.where}: metadata {quote(key)}") for key, value in rows}
            validate_meta(meta, self.where)
        except StoreCorruptError as exc:
            raise DashboardError(str(exc)) from None
        return meta

    def tasks(self) -> TaskTable:
        """The task list the store was created with (key, environment, start of the instruction)."""
        with self._read() as (_, data):
            try:
                rows = self.queries.task_rows(data, INSTRUCTION_CHARS, sql_json=self.use_sql_json)
            except MalformedStoreData:  # the message says what the task list must be, whatever was off
                raise DashboardError(f"store {self.where}: metadata 'tasks' is not a JSON list of task objects "
                                     "(damaged store)") from None
        keys, envs, instr = [], [], []
        for ident, split, index, env, text in rows:
            if isinstance(ident, str):
                keys.append(ident)
            else:
                keys.append(f"{split}/{index}")
            envs.append(str(env) if env is not None else "(none)")
            instr.append(text if isinstance(text, str) else "")
        return TaskTable(keys, envs, instr)

    # ------------------------------------------------------------------ events
    def head(self) -> int:
        """The last committed event's ``seq`` (0 when there is none)."""
        with self._read() as (tx, _):
            return self.queries.max_seq(tx)

    def events(self, after: int, *, limit: int = 200_000) -> EventBatch:
        """The next events after ``after`` (at most ``limit`` of them), read in one transaction. The events
        before the first missing (a gap in the numbering) or malformed one are returned; when that one is next,
        :class:`DashboardError` names it and what is wrong with it."""
        try:
            return self._events(after, limit)
        except _Malformed as m:
            bad_seq, error = self._diagnose(m)
            if bad_seq is None or bad_seq <= after + 1:
                raise error from None
        return self._events(after, bad_seq - 1 - after)  # the events before the malformed one

    def _events(self, after: int, limit: int) -> EventBatch:
        q = self.queries
        with self._read() as (tx, data):
            top = q.max_seq(tx)
            upto, problem = q.numbered_events(tx, after, limit)
            if upto <= after:
                if problem is not None:
                    raise DashboardError(f"store {self.where}: {problem}")
                return EventBatch(after, after, top, [], [], [], {})
            try:
                samples, updates, discards = q.event_rows_by_kind(data, after, upto, sql_json=self.use_sql_json)
            except MalformedStoreData as exc:
                raise _Malformed(after, upto, exc) from None
            named = sorted({r[3] for r in updates if r[3] is not None} | {r[3] for r in discards if r[3] is not None})
            try:
                leases = q.issued_seqs(tx, named) if named else {}
            except MalformedStoreData as exc:
                raise self._data_error(exc) from None
        return EventBatch(after, upto, top, samples, updates, discards, leases)

    def _diagnose(self, m: _Malformed) -> tuple[int | None, DashboardError]:
        """The first malformed event of ``m``'s range and the error naming it and its field: named already when
        Python parsed the events, otherwise (the fast path found something off) by parsing them in Python now
        (``None`` and a general error if every event parses)."""
        if m.error.seq is None:
            try:
                with self._read() as (tx, _):
                    self.queries.event_rows_by_kind(tx, m.after, m.upto, sql_json=False)
            except MalformedStoreData as exc:
                if exc.seq is not None:
                    return exc.seq, self._data_error(exc)
                raise self._data_error(exc) from None
            return None, DashboardError(f"store {self.where}: events {m.after + 1} to {m.upto} cannot be read "
                                        f"({redact_secrets(m.error, self._url)})")
        return m.error.seq, self._data_error(m.error)

    def lease_counts(self) -> dict[str, int]:
        """Leases by state (``open``, ``update``, ``discard``, ``reclaim``); zeros for a store without leases."""
        with self._read() as (tx, _):
            try:
                return self.queries.lease_counts(tx, missing_table_ok=True)
            except MalformedStoreData as exc:
                raise self._data_error(exc) from None
