# Over 700 lines: one store on two backends whose schema, transactions and crafted-store checks must agree.
"""``HistoryStore``: an append-only log of a sampler's dispatches and updates, in SQLite or PostgreSQL.

The store holds three tables (names prefixed by ``table_prefix``, default ``envsched``):

``<p>_meta``       one row per key: the format, the sampler's class and configuration, the pool's
                   fingerprint, the task list itself (so a sampler can be rebuilt from the store alone),
                   and the store's random id (the start of the hash chain); ``head`` holds the last
                   event's ``seq`` and digest, rewritten with every event, so a lost tail is detected.
``<p>_events``     ``seq`` (1, 2, 3, ... without gaps), ``kind`` (``sample``, ``update``, ``discard``),
                   ``payload`` (JSON) and ``digest`` = SHA-256 of the previous digest, the kind and the
                   payload, so a damaged, reordered or foreign row is detected on replay.
``<p>_snapshots``  ``state_dict()`` of the sampler after event ``seq`` (``seq = 0``: its initial state),
                   bound to the event chain by that event's digest.
``<p>_leases``     one row per lease a sampler host issued (see :mod:`envsched.distributed`): the lease id,
                   its task key, the ``sample`` event that issued it, and -- once consumed -- the event that
                   consumed it and how (``update``, ``discard`` or ``reclaim``). It is an index of what the
                   events record (their payloads carry the lease ids, under the hash chain); a full replay
                   checks that the two agree. Stores written before leases existed get the table on first use.

Every write is one transaction taken under an exclusive lock (SQLite ``BEGIN IMMEDIATE`` in WAL mode with
``synchronous=FULL``; PostgreSQL a transaction-scoped advisory lock), so several processes may share one
store: each catches up with the others' events before it appends its own (see
:class:`~envsched.store.durable.DurableSampler`).

A path (or ``sqlite:///path``) opens SQLite through the standard library; a ``postgresql://`` URL opens
PostgreSQL through SQLAlchemy and psycopg (``pip install 'envsched[postgres]'``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envsched.errors import EnvSchedError, is_int, is_number
from envsched.store.leases import OUTCOMES

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

STORE_FORMAT = "envsched.store/1"
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
_EVENT_KINDS = ("sample", "update", "discard")


class StoreError(EnvSchedError, RuntimeError):
    """Base class of the store's errors."""


class StoreCorruptError(StoreError):
    """The store's file or tables are damaged, truncated, or not an envsched store."""


class StoreMismatchError(StoreError, ValueError):
    """The store was written for another pool, sampler class or configuration."""


@dataclass(frozen=True)
class Event:
    """One logged event: ``seq`` (1-based, gap-free), ``kind`` and the decoded ``payload``."""

    seq: int
    kind: str
    payload: dict[str, Any]
    digest: str


@dataclass(frozen=True)
class Snapshot:
    """A sampler ``state`` after event ``seq`` (0: before any event)."""

    seq: int
    state: dict[str, Any]
    digest: str


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def canonical_json(value: Any, *, allow_nan: bool = False) -> str:
    """Compact, key-sorted JSON (numpy scalars and arrays become numbers and lists). NaN and infinities are
    refused unless ``allow_nan`` (snapshots: a sampler state may hold NaN, e.g. the mean of no scored
    rewards; Python's json reads them back)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_to_jsonable, allow_nan=allow_nan)


def _chain(prev: str, kind: str, payload: str) -> str:
    h = hashlib.sha256()
    for part in (prev, kind, payload):
        h.update(part.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def genesis_digest(store_id: str) -> str:
    """Digest that precedes event 1 (derived from the store's random id)."""
    return hashlib.sha256(f"envsched-store:{store_id}".encode()).hexdigest()


def _loads(text: Any, what: str) -> Any:
    """``json.loads`` of a value read from a store: anything that is not JSON text of reasonable nesting is
    :class:`StoreCorruptError` naming ``what`` (never a ``RecursionError`` traceback)."""
    if not isinstance(text, str):
        raise StoreCorruptError(f"{what} is a {type(text).__name__}, not JSON text (damaged or crafted store)")
    try:
        return json.loads(text)
    except RecursionError:
        raise StoreCorruptError(f"{what} is JSON nested too deeply to read (damaged or crafted store)") from None
    except ValueError as exc:
        raise StoreCorruptError(f"{what} is not valid JSON ({str(exc)[:80]}; damaged store)") from None


def _finite_number(x: Any) -> bool:
    return is_number(x) and math.isfinite(x)


def _meta_problems(meta: Mapping[str, Any]) -> list[str]:
    """What is wrong with the optional metadata values (each a short phrase); empty when all is well."""
    out: list[str] = []
    gs = meta.get("group_size")
    if gs is not None and not (is_int(gs) and 1 <= gs <= 1_000_000):
        out.append(f"'group_size' is {str(gs)[:40]!r} ({type(gs).__name__}), expected a positive integer or null")
    if meta["num_tasks"] < 0:
        out.append(f"'num_tasks' is {meta['num_tasks']}, expected a count >= 0")
    rr = meta.get("reward_range")
    if rr is not None and not (isinstance(rr, list) and len(rr) == 2 and all(_finite_number(x) for x in rr)
                               and rr[0] < rr[1]):
        out.append(f"'reward_range' is {str(rr)[:60]!r}, expected [low, high] with finite low < high")
    if "params_rebuildable" in meta and not isinstance(meta["params_rebuildable"], bool):
        out.append("'params_rebuildable' is not true or false")
    tasks = meta.get("tasks")
    if tasks is not None:
        if not isinstance(tasks, list):
            out.append(f"'tasks' is a {type(tasks).__name__}, expected a list")
        elif len(tasks) != meta["num_tasks"]:
            out.append(f"'num_tasks' says {meta['num_tasks']} but the recorded task list has {len(tasks)} tasks")
    graph = meta.get("graph")
    if graph is not None:
        if not isinstance(graph, dict):
            out.append(f"'graph' is a {type(graph).__name__}, expected an object")
        elif not (isinstance(graph.get("fingerprint"), str) and isinstance(graph.get("config", {}), dict)
                  and isinstance(graph.get("path"), str | type(None))
                  and is_int(graph.get("num_nodes"))):
            out.append("'graph' lacks a fingerprint, or its config, path or num_nodes has the wrong type")
    if "lease_table" in meta and not isinstance(meta["lease_table"], bool):
        out.append("'lease_table' is not true or false")
    return out


# ---------------------------------------------------------------------------------------------- backends
class _Tx:
    """A running transaction: ``execute(sql, params)`` returns all rows (as tuples)."""

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        raise NotImplementedError


class _SqliteTx(_Tx):
    def __init__(self, conn: sqlite3.Connection, where: str) -> None:
        self.conn = conn
        self.where = where

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        try:
            return self.conn.execute(sql, dict(params or {})).fetchall()
        except sqlite3.DatabaseError as exc:
            raise _sqlite_error(exc, self.where) from exc


def _read_only_hint(msg: str, where: str) -> str | None:
    """Say so when SQLite failed because the store's file or folder is read-only."""
    if not any(w in msg for w in ("readonly", "read-only", "unable to open")):
        return None
    path = Path(where)
    if not os.access(path.parent, os.W_OK):
        return f"the folder {path.parent} is read-only"
    if path.exists() and not os.access(path, os.W_OK):
        return f"the file {path} is read-only"
    return None


def _sqlite_error(exc: sqlite3.Error, where: str) -> Exception:
    msg = str(exc)
    hint = _read_only_hint(msg, where)
    if hint is not None:
        return StoreError(f"store {where} cannot be written: {hint} ({msg}); SQLite needs to write the store and "
                          "create its -wal and -shm files next to it: copy it to a writable folder")
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg):
        return StoreError(f"store {where} is locked by another process for too long: {msg}")
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError
                                                                 | sqlite3.IntegrityError):
        return StoreCorruptError(f"store {where} is damaged or not an SQLite database ({msg}); "
                                 "restore it from a backup or start a new store")
    if "malformed" in msg or "not a database" in msg:
        return StoreCorruptError(f"store {where} is damaged ({msg})")
    return StoreError(f"store {where}: {msg}")


class _SqliteBackend:
    kind = "sqlite"

    def __init__(self, path: Path, *, busy_timeout_s: float, synchronous: str, read_only: bool = False) -> None:
        self.path = path
        self.where = str(path)
        self.busy_timeout_s = busy_timeout_s
        self.read_only = read_only
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"synchronous must be FULL, NORMAL or EXTRA, got {synchronous!r}")
        self.synchronous = synchronous.upper()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()

    def exists(self) -> bool:
        return self.path.exists()

    def inspect(self) -> set[str]:
        """Check, without writing to it, that an existing file is an intact SQLite database.

        Returns the names of its tables. Raises :class:`StoreCorruptError`
        for an empty, truncated, damaged or foreign file.
        """
        size = self.path.stat().st_size
        if size == 0:
            raise StoreCorruptError(f"store file {self.where} is empty (0 bytes): truncated or not an "
                                    "envsched store; refusing to treat it as a new store")
        with self.path.open("rb") as fh:
            head = fh.read(100)
        if len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
            raise StoreCorruptError(f"store file {self.where} is not an SQLite database (bad header; "
                                    f"{size} bytes): damaged, truncated or another kind of file")
        self._check_size(head, size)
        if self.read_only:
            ro = self._connect_read_only(self.path)
        else:
            try:
                ro = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                     timeout=self.busy_timeout_s)
            except sqlite3.Error as exc:
                raise _sqlite_error(exc, self.where) from exc
        try:
            rows = ro.execute("PRAGMA quick_check").fetchall()
            problems = [r[0] for r in rows if r[0] != "ok"]
            if problems:
                raise StoreCorruptError(f"store {self.where} is damaged: SQLite integrity check says "
                                        f"{'; '.join(problems[:3])}")
            names = {r[0] for r in ro.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.Error as exc:
            raise _sqlite_error(exc, self.where) from exc
        finally:
            ro.close()
        return names

    def _check_size(self, head: bytes, size: int) -> None:
        """Refuse a main file shorter than its header promises -- unless a write-ahead log is present.

        A process killed during a checkpoint can leave the header (page 1, copied back from the WAL)
        promising pages that are still only in the WAL; SQLite recovers that on open, so with a non-empty
        ``-wal`` file the decision is left to SQLite's own integrity check below.
        """
        wal = Path(str(self.path) + "-wal")
        with contextlib.suppress(OSError):
            if wal.stat().st_size > 0:
                return
        page_size = int.from_bytes(head[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages = int.from_bytes(head[28:32], "big")
        if pages and head[24:28] == head[92:96] and pages * page_size > size:
            raise StoreCorruptError(f"store file {self.where} is truncated: its header promises {pages} pages "
                                    f"of {page_size} bytes ({pages * page_size} bytes) but the file has {size}")

    def _connect(self, path: Path) -> sqlite3.Connection:
        if self.read_only:
            return self._connect_read_only(path)
        try:
            conn = sqlite3.connect(str(path), timeout=self.busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"store {self.where}: cannot switch SQLite to WAL mode (got {mode!r}); "
                                 "is the file on a network file system?")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
        except sqlite3.Error as exc:
            raise _sqlite_error(exc, self.where) from exc
        return conn

    def _connect_read_only(self, path: Path) -> sqlite3.Connection:
        """A connection that cannot write: SQLite's ``mode=ro`` URI plus ``query_only`` (no journal-mode switch,
        no schema change). A store closed cleanly (no ``-wal`` file: no process has it open) is also opened
        ``immutable``, so that SQLite creates no ``-wal``/``-shm`` file beside it; a store in use is read
        through its write-ahead log, as SQLite requires (its ``-shm`` file may then be created)."""
        query = "mode=ro" if Path(str(path) + "-wal").exists() else "mode=ro&immutable=1"
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True, timeout=self.busy_timeout_s,
                                   isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only=ON")
        except sqlite3.Error as exc:
            raise _sqlite_error(exc, self.where) from exc
        return conn

    def conn(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            if not self.path.exists():
                raise StoreError(f"store file {self.where} does not exist")
            self._conn = self._connect(self.path)
            self._pid = os.getpid()
        return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Tx]:
        conn = self.conn()
        try:
            conn.execute("BEGIN" if self.read_only else "BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _sqlite_error(exc, self.where) from exc
        try:
            yield _SqliteTx(conn, self.where)
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise _sqlite_error(exc, self.where) from exc

    def create_atomically(self, init: Any) -> bool:
        """Build a new database in a temporary file with ``init(tx)``, then link it into place.

        Returns ``False`` (and discards the temporary file) when another process created the store first.
        A crash at any point leaves either no store or a complete one, never a half-initialised file.
        """
        if self.read_only:
            raise StoreError(f"store {self.where} is opened read-only: it cannot be created")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.clean_stale_init_files()
        tmp = self.path.with_name(f".{self.path.name}.init-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            conn = self._connect(tmp)
            try:
                conn.execute("BEGIN IMMEDIATE")
                init(_SqliteTx(conn, self.where))
                conn.execute("COMMIT")
            finally:
                conn.close()
            for extra in ("-wal", "-shm"):
                Path(str(tmp) + extra).unlink(missing_ok=True)
            fd = os.open(str(tmp), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            _fsync_dir(self.path.parent)
            return True
        finally:
            tmp.unlink(missing_ok=True)
            for extra in ("-wal", "-shm"):
                Path(str(tmp) + extra).unlink(missing_ok=True)

    def clean_stale_init_files(self) -> list[Path]:
        """Remove the temporary files (``.NAME.init-PID-RANDOM`` and their -wal/-shm/-journal) that a process
        killed while creating this store left behind; files of a process still alive are kept (it may be
        creating the store right now). Returns what was removed."""
        removed: list[Path] = []
        pattern = re.compile(rf"^\.{re.escape(self.path.name)}\.init-(\d+)-[0-9a-f]{{8}}(-wal|-shm|-journal)?$")
        try:
            entries = list(self.path.parent.iterdir())
        except OSError:
            return removed
        for entry in entries:
            m = pattern.match(entry.name)
            if m is None or entry.is_symlink() or not entry.is_file():
                continue
            if _pid_alive(int(m.group(1))):
                continue
            with contextlib.suppress(OSError):
                entry.unlink()
                removed.append(entry)
        return removed

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        self._conn = None


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (on this machine)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(str(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _SqlAlchemyTx(_Tx):
    def __init__(self, conn: Any, text: Any, where: str) -> None:
        self.conn = conn
        self.text = text
        self.where = where

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        result = self.conn.execute(self.text(sql), dict(params or {}))
        return [tuple(r) for r in result.fetchall()] if result.returns_rows else []


class _PostgresBackend:
    kind = "postgresql"

    def __init__(self, url: str, *, prefix: str, connect_timeout_s: float, read_only: bool = False) -> None:
        self.read_only = read_only
        try:
            import sqlalchemy
        except ImportError:  # pragma: no cover - depends on the environment
            raise ImportError("a PostgreSQL store needs SQLAlchemy and psycopg: "
                              "pip install 'envsched[postgres]'") from None
        if url.startswith("postgresql://") or url.startswith("postgres://"):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        self._sa = sqlalchemy
        self.url = url
        self.where = sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
        self.engine = sqlalchemy.create_engine(url, pool_pre_ping=True, pool_size=1, max_overflow=2,
                                               connect_args={"connect_timeout": int(max(1, connect_timeout_s))})
        self.lock_key = int.from_bytes(hashlib.sha256(f"envsched:{prefix}".encode()).digest()[:8], "big",
                                       signed=True)
        self._pid = os.getpid()

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # never reuse a parent's pooled connections after fork
            self.engine.dispose(close=False)
            self._pid = os.getpid()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Tx]:
        self._check_pid()
        sa = self._sa
        try:
            with self.engine.begin() as conn:
                if self.read_only:  # the server refuses every write in this transaction
                    conn.execute(sa.text("SET TRANSACTION READ ONLY"))
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": self.lock_key})
                else:
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": self.lock_key})
                yield _SqlAlchemyTx(conn, sa.text, self.where)
        except sa.exc.OperationalError as exc:
            raise StoreError(f"store {self.where}: cannot reach PostgreSQL ({exc.orig})") from exc
        except sa.exc.DataError as exc:
            raise StoreCorruptError(f"store {self.where}: damaged data ({exc.orig})") from exc

    def close(self) -> None:
        self.engine.dispose()


# ---------------------------------------------------------------------------------------------- the store
class HistoryStore:
    """An append-only, hash-chained log of sampler events with periodic state snapshots.

    Open one with :meth:`open`; hand it to :class:`~envsched.store.durable.DurableSampler`, which does
    all the writing. Reading (:meth:`header`, :meth:`events`, :meth:`snapshots`) is safe at any time.

    Args:
        target: a file path (SQLite), ``sqlite:///path``, or a ``postgresql://`` /
            ``postgresql+psycopg://`` URL.
        table_prefix: prefix of the three table names, so that several stores can share one PostgreSQL
            database (lower-case letters, digits, ``_``; at most 40 characters).
        busy_timeout_s: how long a writer waits for another process's transaction (SQLite).
        synchronous: SQLite ``synchronous`` pragma: ``FULL`` (default) makes every committed update survive
            a power loss, not only a process crash.
        read_only: open the store so that nothing can be written (SQLite ``mode=ro`` and ``query_only``;
            PostgreSQL ``SET TRANSACTION READ ONLY``): for inspection (``envsched store verify``). A
            :class:`~envsched.store.durable.DurableSampler` on a read-only store can rebuild and be read, not
            sample or update.
    """

    def __init__(self, target: str | os.PathLike[str], *, table_prefix: str = "envsched",
                 busy_timeout_s: float = 60.0, synchronous: str = "FULL", check: bool = True,
                 read_only: bool = False) -> None:
        if not isinstance(table_prefix, str) or not _PREFIX_RE.match(table_prefix):
            raise ValueError(f"table_prefix must match {_PREFIX_RE.pattern}, got {table_prefix!r}")
        self.table_prefix = table_prefix
        self.t_meta = f"{table_prefix}_meta"
        self.t_events = f"{table_prefix}_events"
        self.t_snap = f"{table_prefix}_snapshots"
        self.t_leases = f"{table_prefix}_leases"
        self._lock = threading.RLock()
        self.read_only = bool(read_only)
        text = os.fspath(target)
        if text.startswith(("postgresql://", "postgresql+", "postgres://")):
            self._backend: Any = _PostgresBackend(text, prefix=table_prefix, connect_timeout_s=busy_timeout_s,
                                                  read_only=self.read_only)
        elif "://" in text and not text.startswith("sqlite:///"):
            raise ValueError(f"unsupported store URL {text!r}: give a file path, sqlite:///path or a "
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
            self._backend = _SqliteBackend(path, busy_timeout_s=busy_timeout_s, synchronous=synchronous,
                                           read_only=self.read_only)
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

    # ------------------------------------------------------------------ schema
    def _schema(self) -> list[str]:
        return [
            f"CREATE TABLE IF NOT EXISTS {self.t_meta} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.t_events} (seq BIGINT PRIMARY KEY, kind TEXT NOT NULL, "
            "payload TEXT NOT NULL, digest TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.t_snap} (seq BIGINT PRIMARY KEY, state TEXT NOT NULL, "
            "digest TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)",
            self._lease_schema(),
        ]

    def _lease_schema(self) -> str:
        return (f"CREATE TABLE IF NOT EXISTS {self.t_leases} (lease TEXT PRIMARY KEY, key TEXT NOT NULL, "
                "issued_seq BIGINT NOT NULL, closed_seq BIGINT, outcome TEXT)")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Tx]:
        """An exclusive write transaction (the store's lock is held until it ends)."""
        with self._lock, self._backend.transaction() as tx:
            yield tx

    def _table_exists(self, tx: _Tx) -> bool:
        if self.kind == "sqlite":
            rows = tx.execute("SELECT name FROM sqlite_master WHERE type='table'")
            names = {r[0] for r in rows}
            if names and self.t_meta not in names:
                raise StoreCorruptError(f"store {self.where} is an SQLite database but not an envsched store "
                                        f"(no table {self.t_meta}; it has {sorted(names)[:5]})")
            return self.t_meta in names
        # pg_class read through the statement's MVCC snapshot: to_regclass() would consult the catalog
        # snapshot, which can predate another writer's committed CREATE TABLE while we waited for the lock
        rows = tx.execute("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                          "ON n.oid = c.relnamespace WHERE c.relname = :t AND n.nspname = current_schema())",
                          {"t": self.t_meta})
        return bool(rows[0][0])

    def _read_meta(self, tx: _Tx) -> dict[str, Any] | None:
        if not self._table_exists(tx):
            return None
        rows = tx.execute(f"SELECT key, value FROM {self.t_meta}")
        if not rows:
            if self.kind == "sqlite":
                raise StoreCorruptError(f"store {self.where} has an empty {self.t_meta} table: damaged or "
                                        "truncated")
            return None
        meta: dict[str, Any] = {}
        for key, value in rows:
            meta[key] = _loads(value, f"store {self.where}: metadata {str(key)[:80]!r}")
        if meta.get("format") != STORE_FORMAT:
            raise StoreCorruptError(f"store {self.where} has format {meta.get('format')!r}, expected "
                                    f"{STORE_FORMAT!r}")
        for key in ("store_id", "sampler_class", "sampler_params", "pool_fingerprint", "num_tasks"):
            if key not in meta:
                raise StoreCorruptError(f"store {self.where}: metadata lacks {key!r} (damaged store)")
        self._check_meta_types(meta)
        self._check_schema(tx)
        return meta

    def _check_schema(self, tx: _Tx) -> None:
        """Refuse a store whose tables carry triggers or rules: the store's writes would run code (statements)
        that nobody wrote into envsched -- an edited store. Views named like its tables are refused too."""
        tables = (self.t_meta, self.t_events, self.t_snap, self.t_leases)
        if self.kind == "sqlite":
            rows = tx.execute("SELECT type, name, tbl_name FROM sqlite_master WHERE type IN ('trigger', 'view')")
            extra = [(t, n) for t, n, tbl in rows if tbl in tables or n in tables]
        else:
            rows = tx.execute(
                "SELECT 'trigger', t.tgname FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = "
                "t.tgrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE NOT t.tgisinternal AND "
                "n.nspname = current_schema() AND c.relname IN (:a, :b, :c, :d) UNION ALL "
                "SELECT 'rule', r.rulename FROM pg_catalog.pg_rules r WHERE r.schemaname = current_schema() "
                "AND r.tablename IN (:a, :b, :c, :d)", dict(zip("abcd", tables, strict=True)))
            extra = [(t, n) for t, n in rows]
        if extra:
            kind, name = extra[0]
            raise StoreCorruptError(f"store {self.where} has a {kind} {str(name)[:60]!r} on its tables, which "
                                    "envsched never creates: the store was edited; refusing to use it (a store is "
                                    "data, never code)")

    def _check_meta_types(self, meta: Mapping[str, Any]) -> None:
        """Refuse metadata of the wrong shape before anything reads it (a crafted store is data only)."""
        for key, kinds in (("store_id", str), ("sampler_class", str), ("sampler_params", dict),
                           ("pool_fingerprint", str), ("num_tasks", int)):
            value = meta[key]
            if not (is_int(value) if kinds is int else isinstance(value, kinds)):
                raise StoreCorruptError(f"store {self.where}: metadata {key!r} is a {type(value).__name__}, "
                                        f"expected {kinds.__name__} (damaged or crafted store)")
        problems = _meta_problems(meta)
        if problems:
            raise StoreCorruptError(f"store {self.where}: metadata {problems[0]} (damaged or crafted store)")
        head = meta.get("head")
        if head is not None and not (isinstance(head, dict) and is_int(head.get("seq")) and head["seq"] >= 0
                                     and isinstance(head.get("digest"), str)):
            raise StoreCorruptError(f"store {self.where}: metadata 'head' is malformed (damaged store)")

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

        def init(tx: _Tx) -> None:
            for stmt in self._schema():
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
    def last_event(self, tx: _Tx) -> tuple[int, str | None]:
        """``(seq, digest)`` of the last event (``(0, None)`` when there is none)."""
        rows = tx.execute(f"SELECT seq, digest FROM {self.t_events} ORDER BY seq DESC LIMIT 1")
        return (int(rows[0][0]), str(rows[0][1])) if rows else (0, None)

    def append(self, tx: _Tx, seq: int, prev_digest: str, kind: str, payload: Mapping[str, Any]) -> str:
        """Append event ``seq`` inside a transaction; returns its digest."""
        if kind not in _EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        text = canonical_json(payload)
        digest = _chain(prev_digest, kind, text)
        tx.execute(f"INSERT INTO {self.t_events} (seq, kind, payload, digest, created) "
                   "VALUES (:s, :k, :p, :d, :c)", {"s": seq, "k": kind, "p": text, "d": digest, "c": time.time()})
        self._write_head(tx, seq, digest)
        return digest

    def _write_head(self, tx: _Tx, seq: int, digest: str) -> None:
        """Record the chain's head (last seq and digest) in the same transaction as the event, so that
        a lost tail of the log (the last events deleted or truncated away) is detected on open."""
        tx.execute(f"INSERT INTO {self.t_meta} (key, value) VALUES ('head', :v) "
                   "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   {"v": canonical_json({"seq": int(seq), "digest": digest})})

    def check_head(self, tx: _Tx, seq: int, digest: str) -> None:
        """Raise :class:`StoreCorruptError` unless the verified log, which ends at ``(seq, digest)``, ends
        where the recorded head says (stores written before the head was recorded have none: skipped)."""
        rows = tx.execute(f"SELECT value FROM {self.t_meta} WHERE key = 'head'")
        if not rows:
            return
        try:
            head = _loads(rows[0][0], f"store {self.where}: metadata 'head'")
            head_seq, head_digest = int(head["seq"]), str(head["digest"])
        except (TypeError, ValueError, KeyError, StoreCorruptError):
            raise StoreCorruptError(f"store {self.where}: metadata 'head' is malformed (damaged store)") from None
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
        if kind not in _EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        text = canonical_json(payload)
        return text, _chain(prev_digest, kind, text)

    def append_many(self, tx: _Tx, rows: list[tuple[int, str, str, str]]) -> None:
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

    def read_events(self, tx: _Tx, after: int, prev_digest: str, *, limit: int | None = None) -> list[Event]:
        """Events with ``seq > after`` in order, checking seq continuity and the hash chain."""
        sql = f"SELECT seq, kind, payload, digest FROM {self.t_events} WHERE seq > :a ORDER BY seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        out: list[Event] = []
        expected, prev = after + 1, prev_digest
        for seq, kind, payload, digest in tx.execute(sql, {"a": after}):
            seq = int(seq)
            if seq != expected:
                raise StoreCorruptError(f"store {self.where}: event {expected} is missing (next is {seq}); "
                                        "the log is damaged or truncated")
            if not isinstance(payload, str) or _chain(prev, str(kind), payload) != digest:
                raise StoreCorruptError(f"store {self.where}: event {seq} fails its integrity check (its "
                                        "digest does not match the chain): the log was damaged or edited")
            if kind not in _EVENT_KINDS:
                raise StoreCorruptError(f"store {self.where}: event {seq} has unknown kind {kind!r}")
            data = _loads(payload, f"store {self.where}: event {seq} payload")
            if not isinstance(data, dict):
                raise StoreCorruptError(f"store {self.where}: event {seq} payload is not an object")
            out.append(Event(seq, str(kind), data, str(digest)))
            expected, prev = seq + 1, str(digest)
        return out

    def event_payload(self, tx: _Tx, seq: int) -> dict[str, Any] | None:
        """The decoded payload of event ``seq`` (``None`` if there is none); the caller has verified the chain."""
        rows = tx.execute(f"SELECT payload FROM {self.t_events} WHERE seq = :s", {"s": seq})
        if not rows:
            return None
        data = _loads(rows[0][0], f"store {self.where}: event {seq} payload")
        return data if isinstance(data, dict) else None

    def check_tail(self, tx: _Tx, seq: int) -> None:
        """Raise :class:`StoreCorruptError` when a snapshot or a lease row refers to an event after ``seq``, the
        verified end of the log: events were cut off the end (even if the head was rewritten to match)."""
        snap = tx.execute(f"SELECT MAX(seq) FROM {self.t_snap}")
        last_snap = snap[0][0] if snap else None
        lease = (tx.execute(f"SELECT MAX(issued_seq), MAX(closed_seq) FROM {self.t_leases}")
                 if self.has_lease_table(tx) else [(None, None)])
        for what, value in (("a snapshot", last_snap), ("a lease", lease[0][0]), ("a consumed lease", lease[0][1])):
            if value is not None and int(value) > seq:
                raise StoreCorruptError(f"store {self.where}: the event log ends at event {seq}, but {what} refers "
                                        f"to event {int(value)}: events at the end of the log were removed; "
                                        "restore the store from a backup")

    def digest_at(self, tx: _Tx, seq: int) -> str | None:
        rows = tx.execute(f"SELECT digest FROM {self.t_events} WHERE seq = :s", {"s": seq})
        return str(rows[0][0]) if rows else None

    def write_snapshot(self, tx: _Tx, seq: int, digest: str, state: Mapping[str, Any], *, keep: int = 3) -> None:
        """Store ``state`` as the snapshot after event ``seq``; keep snapshot 0 and the ``keep`` latest."""
        tx.execute(f"DELETE FROM {self.t_snap} WHERE seq = :s", {"s": seq})
        tx.execute(f"INSERT INTO {self.t_snap} (seq, state, digest, created) VALUES (:s, :st, :d, :c)",
                   {"s": seq, "st": canonical_json(state, allow_nan=True), "d": digest, "c": time.time()})
        rows = tx.execute(f"SELECT seq FROM {self.t_snap} WHERE seq > 0 ORDER BY seq DESC")
        for (old,) in rows[keep:]:
            tx.execute(f"DELETE FROM {self.t_snap} WHERE seq = :s", {"s": int(old)})

    def read_snapshot(self, tx: _Tx, *, latest: bool, at_most: int | None = None) -> Snapshot:
        """Snapshot 0 (``latest=False``) or the latest one with ``seq <= at_most``."""
        if latest:
            sql = f"SELECT seq, state, digest FROM {self.t_snap}"
            params: dict[str, Any] = {}
            if at_most is not None:
                sql += " WHERE seq <= :m"
                params["m"] = at_most
            rows = tx.execute(sql + " ORDER BY seq DESC LIMIT 1", params)
        else:
            rows = tx.execute(f"SELECT seq, state, digest FROM {self.t_snap} WHERE seq = 0")
        if not rows:
            raise StoreCorruptError(f"store {self.where}: the initial snapshot is missing (damaged store)")
        seq, state, digest = rows[0]
        data = _loads(state, f"store {self.where}: snapshot after event {seq}")
        if not isinstance(data, dict):
            raise StoreCorruptError(f"store {self.where}: snapshot after event {seq} is not an object")
        return Snapshot(int(seq), data, str(digest))

    # ------------------------------------------------------------------ leases (an index of the events)
    def ensure_lease_table(self, tx: _Tx) -> None:
        """Create the lease table in a store written before leases existed (a no-op otherwise)."""
        tx.execute(self._lease_schema())

    def issue_leases(self, tx: _Tx, seq: int, leases: list[tuple[str, str]]) -> None:
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

    def existing_leases(self, tx: _Tx, ids: list[str]) -> set[str]:
        """The ids among ``ids`` that this store already issued (lease ids are never reused)."""
        out: set[str] = set()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            names = {f"l{j}": v for j, v in enumerate(chunk)}
            marks = ", ".join(f":{k}" for k in names)
            out.update(str(r[0]) for r in tx.execute(f"SELECT lease FROM {self.t_leases} WHERE lease IN ({marks})",
                                                     names))
        return out

    def lease(self, tx: _Tx, lease: str) -> tuple[str, int, int | None, str | None] | None:
        """``(key, issued_seq, closed_seq, outcome)`` of a lease, or ``None`` if the store never issued it
        (``outcome`` is ``None`` while the lease is open)."""
        rows = tx.execute(f"SELECT key, issued_seq, closed_seq, outcome FROM {self.t_leases} WHERE lease = :l",
                          {"l": lease})
        if not rows:
            return None
        key, issued, closed, outcome = rows[0]
        return str(key), int(issued), None if closed is None else int(closed), outcome

    def close_lease(self, tx: _Tx, lease: str, seq: int, outcome: str) -> None:
        """Mark an open lease consumed by event ``seq`` (``outcome``: update, discard or reclaim)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown lease outcome {outcome!r}")
        tx.execute(f"UPDATE {self.t_leases} SET closed_seq = :s, outcome = :o WHERE lease = :l "
                   "AND closed_seq IS NULL", {"s": seq, "o": outcome, "l": lease})

    def leases_bulk(self, tx: _Tx, ids: list[str]) -> dict[str, tuple[str, int, int | None, str | None]]:
        """:meth:`lease` for many ids at once (ids the store never issued are absent)."""
        out: dict[str, tuple[str, int, int | None, str | None]] = {}
        for i in range(0, len(ids), 500):
            names = {f"l{j}": v for j, v in enumerate(ids[i:i + 500])}
            if not names:
                continue
            marks = ", ".join(f":{k}" for k in names)
            for lid, key, issued, closed, outcome in tx.execute(
                    f"SELECT lease, key, issued_seq, closed_seq, outcome FROM {self.t_leases} "
                    f"WHERE lease IN ({marks})", names):
                out[str(lid)] = (str(key), int(issued), None if closed is None else int(closed), outcome)
        return out

    def close_leases(self, tx: _Tx, rows: list[tuple[str, int, str]]) -> None:
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

    def open_leases(self, tx: _Tx) -> list[tuple[str, str]]:
        """``(lease, key)`` of every lease not yet consumed, oldest first."""
        return [(str(a), str(b)) for a, b in tx.execute(
            f"SELECT lease, key FROM {self.t_leases} WHERE closed_seq IS NULL ORDER BY issued_seq, lease")]

    def lease_counts(self, tx: _Tx) -> dict[str, int]:
        """Leases by state: ``open``, ``update``, ``discard``, ``reclaim``."""
        out = {"open": 0, "update": 0, "discard": 0, "reclaim": 0}
        for outcome, count in tx.execute(f"SELECT outcome, COUNT(*) FROM {self.t_leases} GROUP BY outcome"):
            out["open" if outcome is None else str(outcome)] = int(count)
        return out

    def all_leases(self, tx: _Tx) -> dict[str, tuple[str, int, int | None, str | None]]:
        """Every lease row (for the consistency check of a full replay)."""
        return {str(r[0]): (str(r[1]), int(r[2]), None if r[3] is None else int(r[3]), r[4])
                for r in tx.execute(f"SELECT lease, key, issued_seq, closed_seq, outcome FROM {self.t_leases}")}

    def events_name_leases(self, tx: _Tx) -> bool:
        """Whether any event's payload carries a lease id (``"lease":`` or ``"leases":`` as a key of the
        canonical JSON: inside a string value the quote would be escaped)."""
        rows = tx.execute(f"SELECT 1 FROM {self.t_events} WHERE payload LIKE :a OR payload LIKE :b LIMIT 1",
                          {"a": '%"lease":%', "b": '%"leases":%'})
        return bool(rows)

    def has_lease_table(self, tx: _Tx) -> bool:
        if self.kind == "sqlite":
            rows = tx.execute("SELECT name FROM sqlite_master WHERE type='table' AND name = :t",
                              {"t": self.t_leases})
            return bool(rows)
        rows = tx.execute("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                          "ON n.oid = c.relnamespace WHERE c.relname = :t AND n.nspname = current_schema())",
                          {"t": self.t_leases})
        return bool(rows[0][0])

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
            return [int(r[0]) for r in tx.execute(f"SELECT seq FROM {self.t_snap} ORDER BY seq")]

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

