"""The SQLite backend of the history store: one file, the standard library's ``sqlite3``.

Every write is one ``BEGIN IMMEDIATE`` transaction in WAL mode with ``synchronous=FULL`` (by default), so a
committed call survives a crash and several processes may share the file. A new store is built in a
temporary file and linked into place (:meth:`SqliteBackend.create_atomically`), so a crash never leaves a
half-made store. An existing file is checked read-only before anything writes to it
(:meth:`SqliteBackend.inspect`): an empty, truncated, damaged or foreign file is refused, never modified.

Opened ``read_only`` (``envsched store verify`` and ``info``) it connects through a ``mode=ro`` URI with
``query_only``, and ``immutable`` when no process has the store open, so that no ``-wal``/``-shm`` file
appears beside it. Driver errors become :class:`~envsched.store.StoreError` naming the store and, where it
can tell, why (a read-only folder, a lock held too long, a damaged file).
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from envsched.store.errors import StoreCorruptError, StoreError

__all__ = ["SqliteBackend", "SqliteTransaction", "sqlite_error"]


class SqliteTransaction:
    """A running SQLite transaction: ``execute(sql, params)`` returns all rows (as tuples)."""

    def __init__(self, conn: sqlite3.Connection, where: str) -> None:
        self.conn = conn
        self.where = where

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        try:
            return self.conn.execute(sql, dict(params or {})).fetchall()
        except sqlite3.DatabaseError as exc:
            raise sqlite_error(exc, self.where) from exc


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


def sqlite_error(exc: sqlite3.Error, where: str) -> Exception:
    """The store error to raise for SQLite's ``exc`` on the store at ``where``: damage is
    :class:`StoreCorruptError`, anything else :class:`StoreError`, each saying why where it can."""
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


class SqliteBackend:
    """A store in the SQLite file ``path`` (for writing, or ``read_only``)."""

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
                raise sqlite_error(exc, self.where) from exc
        try:
            rows = ro.execute("PRAGMA quick_check").fetchall()
            problems = [r[0] for r in rows if r[0] != "ok"]
            if problems:
                raise StoreCorruptError(f"store {self.where} is damaged: SQLite integrity check says "
                                        f"{'; '.join(problems[:3])}")
            names = {r[0] for r in ro.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.Error as exc:
            raise sqlite_error(exc, self.where) from exc
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
            raise sqlite_error(exc, self.where) from exc
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
            raise sqlite_error(exc, self.where) from exc
        return conn

    def conn(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            if not self.path.exists():
                raise StoreError(f"store file {self.where} does not exist")
            self._conn = self._connect(self.path)
            self._pid = os.getpid()
        return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SqliteTransaction]:
        conn = self.conn()
        try:
            conn.execute("BEGIN" if self.read_only else "BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise sqlite_error(exc, self.where) from exc
        try:
            yield SqliteTransaction(conn, self.where)
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise sqlite_error(exc, self.where) from exc

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
                init(SqliteTransaction(conn, self.where))
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


