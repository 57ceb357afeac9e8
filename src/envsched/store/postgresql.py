"""The PostgreSQL backend of the history store: SQLAlchemy with psycopg (``pip install 'envsched[postgres]'``).

Every transaction first takes a transaction-scoped advisory lock derived from the table prefix: exclusive
for a writer, shared for a store opened ``read_only`` (which also runs ``SET TRANSACTION READ ONLY``, so
the server refuses any write). Several stores can share one database under different table prefixes.
A process never reuses connections its parent opened before a fork.

Every way of failing to connect -- a URL SQLAlchemy cannot parse, an option libpq does not know (``?PassWord=x``),
a refused connection, an unknown host, database or role, a server that refuses the session -- is one line that
names the store with its secrets redacted (:func:`envsched.errors.redact_url`): the driver's message, its lines
joined (:func:`driver_message`). The dashboard's reader builds its engine and messages with the same functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from envsched.errors import InvalidValueError, redact_secrets, redact_url
from envsched.store.errors import StoreCorruptError, StoreError

__all__ = ["PostgresBackend", "PostgresTransaction", "create_engine", "driver_message"]

#: The most characters of a driver's message a message quotes.
MESSAGE_CHARS = 300


def driver_message(exc: BaseException, url: str) -> str:
    """A database driver's error as one line for a message: the driver's own text (not SQLAlchemy's wrapper and
    its link), its lines joined into sentences, cut to :data:`MESSAGE_CHARS`, every secret of ``url``
    redacted (libpq repeats a connection's parameters in some messages)."""
    orig = getattr(exc, "orig", None) or exc
    parts = [line.strip() for line in str(orig).splitlines() if line.strip()]
    text = ""
    for part in parts:
        if text:
            text += " " if text[-1] in ".:;?!" else ". "
        text += part
    text = " ".join(text.split()) or type(orig).__name__
    if len(text) > MESSAGE_CHARS:
        text = text[:MESSAGE_CHARS].rstrip() + "..."
    return redact_secrets(text, url)


def create_engine(url: str, *, connect_timeout_s: float, pool_size: int = 1, max_overflow: int = 2) -> tuple[Any, str]:
    """A SQLAlchemy engine for the PostgreSQL database at ``url`` (``postgresql://`` and ``postgres://`` mean
    psycopg 3) and the URL it was built from; nothing connects yet. ``ImportError`` without the ``postgres``
    extra; :class:`~envsched.errors.InvalidValueError` naming the URL (redacted) when it cannot be parsed."""
    try:
        import sqlalchemy
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("a PostgreSQL store needs SQLAlchemy and psycopg: pip install 'envsched[postgres]'") from None
    if url.startswith(("postgresql://", "postgres://")):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    try:
        engine = sqlalchemy.create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=max_overflow,
                                          connect_args={"connect_timeout": int(max(1, connect_timeout_s))})
    except (sqlalchemy.exc.ArgumentError, ValueError, TypeError) as exc:
        raise InvalidValueError(f"store {redact_url(url)}: not a usable PostgreSQL URL ({driver_message(exc, url)})",
                                name="store URL", value=redact_url(url)) from None
    return engine, url


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
        self.engine, self.url = create_engine(url, connect_timeout_s=connect_timeout_s)
        import sqlalchemy

        self._sa = sqlalchemy
        self.where = redact_url(self.url)  # a password, in the userinfo or a query parameter, shown as ***
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
            connection = self.engine.connect()
        except sa.exc.SQLAlchemyError as exc:  # any failure to connect, whatever the driver calls it
            raise StoreError(f"store {self.where}: cannot connect to PostgreSQL "
                             f"({driver_message(exc, self.url)})") from None
        try:
            with connection as conn, conn.begin():
                if self.read_only:  # the server refuses every write in this transaction
                    conn.execute(sa.text("SET TRANSACTION READ ONLY"))
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": self.lock_key})
                else:
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": self.lock_key})
                yield PostgresTransaction(conn, sa.text, self.where)
        except sa.exc.OperationalError as exc:
            raise StoreError(f"store {self.where}: cannot reach PostgreSQL "
                             f"({driver_message(exc, self.url)})") from exc
        except sa.exc.DataError as exc:
            raise StoreCorruptError(f"store {self.where}: damaged data ({driver_message(exc, self.url)})") from exc

    def close(self) -> None:
        self.engine.dispose()
