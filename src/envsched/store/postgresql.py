"""The PostgreSQL backend of the history store: SQLAlchemy with psycopg (``pip install 'envsched[postgres]'``).

Every transaction first takes a transaction-scoped advisory lock derived from the table prefix: exclusive
for a writer, shared for a store opened ``read_only`` (which also runs ``SET TRANSACTION READ ONLY``, so
the server refuses any write). Several stores can share one database under different table prefixes.
A process never reuses connections its parent opened before a fork.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from envsched.errors import redact_secrets, redact_url
from envsched.store.errors import StoreCorruptError, StoreError

__all__ = ["PostgresBackend", "PostgresTransaction"]


class PostgresTransaction:
    """A running PostgreSQL transaction: ``execute(sql, params)`` returns all rows (as tuples)."""

    def __init__(self, conn: Any, text: Any, where: str) -> None:
        self.conn = conn
        self.text = text
        self.where = where

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        result = self.conn.execute(self.text(sql), dict(params or {}))
        return [tuple(r) for r in result.fetchall()] if result.returns_rows else []


class PostgresBackend:
    """A store in the PostgreSQL database at ``url``, locked under a key derived from ``prefix``."""

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
        self.where = redact_url(url)  # a password, in the userinfo or a query parameter, shown as ***
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
    def transaction(self) -> Iterator[PostgresTransaction]:
        self._check_pid()
        sa = self._sa
        try:
            with self.engine.begin() as conn:
                if self.read_only:  # the server refuses every write in this transaction
                    conn.execute(sa.text("SET TRANSACTION READ ONLY"))
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": self.lock_key})
                else:
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": self.lock_key})
                yield PostgresTransaction(conn, sa.text, self.where)
        except sa.exc.OperationalError as exc:
            raise StoreError(f"store {self.where}: cannot reach PostgreSQL "
                             f"({redact_secrets(exc.orig, self.url)})") from exc
        except sa.exc.DataError as exc:
            raise StoreCorruptError(f"store {self.where}: damaged data ({exc.orig})") from exc

    def close(self) -> None:
        self.engine.dispose()
