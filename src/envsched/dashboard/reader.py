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

Bounded work whatever the log holds: a read takes the next ``limit`` events by position (never a range of
sequence numbers), and the events of a store are numbered 1, 2, 3, ... without gaps, so a gap, a number that
is not an integer, an unknown kind or a malformed payload stops the read with a :class:`DashboardError`
naming the event and the field (the fast path checks the types the database reports; when something is off,
the same events are parsed in Python to name the first bad one).

It reads only what the views need, extracted by the database itself (SQLite's JSON1 functions, PostgreSQL's
``jsonb``): per drawn group its task key; per update the number of rollouts and the scored rewards' count,
minimum, maximum, sum and sum of squares (PostgreSQL aggregates them in SQL; from SQLite the reward and cost
arrays come as JSON text that numpy parses and aggregates in one pass); per discard its reason. The hash
chain is not checked here (that is ``envsched store verify``): the dashboard shows what was committed.

Store URLs are shown through :func:`envsched.errors.redact_url` (passwords and credential parameters become
``***``), in every message and in :attr:`StoreReader.where`, which the page title and the summary show.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sqlite3
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envsched.dashboard.checks import EVENT_KINDS, JSON_TYPES, check_event, finite_or_null, quote, type_name
from envsched.errors import EnvSchedError, is_int, is_number, redact_secrets, redact_url

__all__ = ["DashboardError", "EventBatch", "StoreReader", "TaskTable"]

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
_FORMAT = "envsched.store/1"
#: how many characters of an instruction the dashboard keeps (shown as text, never as markup)
INSTRUCTION_CHARS = 600


class DashboardError(EnvSchedError, RuntimeError):
    """The store cannot be read by the dashboard (missing, not an envsched store, damaged, unreachable)."""


class _Malformed(Exception):
    """The fast path found something off in events ``(after, upto]`` (``detail`` says what)."""

    def __init__(self, after: int, upto: int, detail: str) -> None:
        super().__init__(detail)
        self.after, self.upto, self.detail = after, upto, detail


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


def _json_numbers(texts: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Flat values and per-row lengths of compact JSON arrays of numbers and nulls (``None``: no array);
    null becomes NaN. ``ValueError`` when an element is not a number or null (the caller names the event)."""
    lens = np.fromiter((t.count(",") + 1 if isinstance(t, str) and len(t) > 2 else 0 for t in texts),
                       dtype=np.int64, count=len(texts))
    body = ",".join(t[1:-1] for t in texts if isinstance(t, str) and len(t) > 2)
    vals = np.array(body.replace("null", "nan").split(","), dtype=np.float64) if body else np.zeros(0)
    if vals.size != lens.sum():
        raise ValueError("an array holds something other than numbers and nulls")
    return vals, lens


def _per_row(func: Any, values: np.ndarray, lens: np.ndarray, empty: float) -> np.ndarray:
    """``func.reduceat`` over consecutive runs of ``lens`` values (``empty`` for a run of none)."""
    out = np.full(lens.size, empty)
    nonempty = lens > 0
    if nonempty.any():
        out[nonempty] = func.reduceat(values, (np.cumsum(lens) - lens)[nonempty])
    return out


def _aggregate_updates(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``(seq, created, key, lease, rewards JSON, costs JSON, ...)`` rows -> the update columns of
    :class:`EventBatch` (rollouts, scored, min, max, sum, sum of squares of the scored rewards, total cost).
    ``ValueError`` when an array holds anything but finite numbers and nulls."""
    if not rows:
        return []
    seq, created, key, lease, rewards, costs = list(zip(*rows, strict=True))[:6]
    vals, lens = _json_numbers(list(rewards))
    cvals, clens = _json_numbers(list(costs))
    if np.isinf(vals).any() or np.isinf(cvals).any():
        raise ValueError("a reward or cost is not finite")
    ok = ~np.isnan(vals)
    scored = _per_row(np.add, ok.astype(np.float64), lens, 0.0).astype(np.int64)
    total = _per_row(np.add, np.where(ok, vals, 0.0), lens, 0.0)
    squares = _per_row(np.add, np.where(ok, vals * vals, 0.0), lens, 0.0)
    lo = _per_row(np.minimum, np.where(ok, vals, np.inf), lens, np.inf)
    hi = _per_row(np.maximum, np.where(ok, vals, -np.inf), lens, -np.inf)
    cost = _per_row(np.add, np.nan_to_num(cvals), clens, 0.0)
    none = scored == 0
    lo_list = np.where(none, None, lo).tolist()
    hi_list = np.where(none, None, hi).tolist()
    return list(zip(seq, created, key, lease, lens.tolist(), scored.tolist(), lo_list, hi_list, total.tolist(),
                    squares.tolist(), cost.tolist(), strict=True))


def is_url(target: str) -> bool:
    return "://" in target and not target.startswith("sqlite:///")


class StoreReader:
    """A read-only view of the history store at ``target`` (a SQLite path, ``sqlite:///path`` or a
    ``postgresql://`` URL). Raises :class:`DashboardError` when it cannot be read; creates no file."""

    def __init__(self, target: str | os.PathLike[str], *, table_prefix: str = "envsched",
                 use_sql_json: bool = True) -> None:
        if not isinstance(table_prefix, str) or not _PREFIX_RE.match(table_prefix):
            raise ValueError(f"table_prefix must match {_PREFIX_RE.pattern}, got {table_prefix!r}")
        text = os.fspath(target)
        self.t_meta, self.t_events = f"{table_prefix}_meta", f"{table_prefix}_events"
        self.t_leases = f"{table_prefix}_leases"
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
            import sqlalchemy
        except ImportError:  # pragma: no cover - depends on the environment
            raise DashboardError("a PostgreSQL store needs SQLAlchemy and psycopg: "
                                 "pip install 'envsched[postgres]'") from None
        if url.startswith(("postgresql://", "postgres://")):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        self._sa = sqlalchemy
        try:
            self._engine = sqlalchemy.create_engine(url, pool_pre_ping=True, pool_size=1, max_overflow=1,
                                                    connect_args={"connect_timeout": 10})
        except (sqlalchemy.exc.ArgumentError, ValueError, TypeError) as exc:
            raise DashboardError(f"store {self.where}: not a usable PostgreSQL URL "
                                 f"({redact_secrets(exc, self._url)})") from None

    def _db_error(self, exc: BaseException) -> DashboardError:
        text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        first = text[0] if text else type(exc).__name__
        return DashboardError(f"store {self.where}: {redact_secrets(first, self._url)}")

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        """One read-only transaction; yields ``run(sql, params, data=False) -> rows``. A database error is a
        :class:`DashboardError`; with ``data=True`` (a query whose result depends on the events' contents) it
        is :class:`_Malformed`, which the caller turns into a message naming the event."""
        with self._lock:
            if self._path is not None:
                conn = self._sqlite_connect()
                try:
                    try:
                        conn.execute("BEGIN")
                    except sqlite3.Error as exc:
                        raise self._db_error(exc) from None

                    def run(sql: str, params: dict[str, Any] | None = None, *,
                            data: bool = False) -> list[tuple[Any, ...]]:
                        try:
                            return conn.execute(sql, params or {}).fetchall()
                        except sqlite3.Error as exc:
                            if data:
                                raise _Malformed(0, 0, str(exc)) from None
                            raise self._db_error(exc) from None
                        except (OverflowError, RecursionError, MemoryError) as exc:
                            raise _Malformed(0, 0, f"{type(exc).__name__}: {exc}") from None

                    yield run
                finally:
                    conn.close()  # also ends the transaction
                return
            sa = self._sa
            try:
                with self._engine.connect().execution_options(isolation_level="REPEATABLE READ",
                                                              postgresql_readonly=True) as c, c.begin():

                    def run(sql: str, params: dict[str, Any] | None = None, *,
                            data: bool = False) -> list[tuple[Any, ...]]:
                        try:
                            return [tuple(r) for r in c.execute(sa.text(sql), params or {}).fetchall()]
                        except (sa.exc.DataError, sa.exc.ProgrammingError, sa.exc.InternalError) as exc:
                            if data:
                                raise _Malformed(0, 0, str(getattr(exc, "orig", exc))) from None
                            raise

                    yield run
            except sa.exc.SQLAlchemyError as exc:
                raise self._db_error(exc) from None

    def close(self) -> None:
        """Release the database connections (a SQLite store holds none between reads)."""
        if self._engine is not None:
            self._engine.dispose()

    # ------------------------------------------------------------------ metadata
    def _read_header(self) -> dict[str, Any]:
        with self._read() as run:
            if self.kind == "sqlite":
                names = {r[0] for r in run("SELECT name FROM sqlite_master WHERE type='table'")}
                exists = self.t_meta in names
            else:
                exists = bool(run("SELECT to_regclass(:t) IS NOT NULL", {"t": self.t_meta})[0][0])
            if not exists:
                raise DashboardError(f"{self.where} is not an envsched history store (no table {self.t_meta})")
            rows = run(f"SELECT key, value FROM {self.t_meta} WHERE key <> 'tasks'")
        meta: dict[str, Any] = {}
        for key, value in rows:
            try:
                meta[str(key)] = json.loads(value)
            except (TypeError, ValueError, RecursionError):
                raise DashboardError(f"store {self.where}: metadata {quote(key)} is not valid JSON (damaged "
                                     "store)") from None
        if meta.get("format") != _FORMAT:
            raise DashboardError(f"store {self.where} has format {quote(meta.get('format'))}, expected "
                                 f"{_FORMAT!r}")
        rr = meta.get("reward_range")
        numbers = isinstance(rr, list) and len(rr) == 2 and all(x is not None and finite_or_null(x) for x in rr)
        if rr is not None and not (numbers and rr[0] < rr[1]):
            raise DashboardError(f"store {self.where}: metadata 'reward_range' is {type_name(rr)}, expected "
                                 "[low, high] with low < high (damaged store)")
        gs = meta.get("group_size")
        if gs is not None and not (is_int(gs, numpy=False) and gs >= 1):
            raise DashboardError(f"store {self.where}: metadata 'group_size' is {type_name(gs)}, expected a "
                                 "positive integer or null (damaged store)")
        sc = meta.get("sampler_class")
        if sc is not None and not isinstance(sc, str):
            raise DashboardError(f"store {self.where}: metadata 'sampler_class' is {type_name(sc)}, expected a "
                                 "class name (damaged store)")
        return meta

    def tasks(self) -> TaskTable:
        """The task list the store was created with (key, environment, start of the instruction)."""
        n = INSTRUCTION_CHARS
        bad = DashboardError(f"store {self.where}: metadata 'tasks' is not a JSON list of task objects "
                             "(damaged store)")
        with self._read() as run:
            try:
                if self.use_sql_json and self.kind == "sqlite":
                    top = run(f"SELECT json_type(value) FROM {self.t_meta} WHERE key = 'tasks'", data=True)
                    if top and top[0][0] != "array":
                        raise bad
                    rows = run(f"SELECT j.type, json_extract(j.value, '$.id'), json_extract(j.value, '$.split'), "
                               f"json_extract(j.value, '$.index'), json_extract(j.value, '$.env'), "
                               f"substr(json_extract(j.value, '$.instruction'), 1, {n}) FROM {self.t_meta} m, "
                               "json_each(m.value) j WHERE m.key = 'tasks' ORDER BY j.key", data=True)
                    if any(r[0] != "object" for r in rows):
                        raise bad
                    rows = [r[1:] for r in rows]
                elif self.use_sql_json:
                    top = run(f"SELECT jsonb_typeof(value::jsonb) FROM {self.t_meta} WHERE key = 'tasks'", data=True)
                    if top and top[0][0] != "array":
                        raise bad
                    rows = run(f"SELECT jsonb_typeof(t), t->>'id', t->>'split', t->>'index', t->>'env', "
                               f"left(t->>'instruction', {n}) FROM {self.t_meta} m, "
                               "jsonb_array_elements(m.value::jsonb) WITH ORDINALITY AS a(t, i) "
                               "WHERE m.key = 'tasks' ORDER BY i", data=True)
                    if any(r[0] != "object" for r in rows):
                        raise bad
                    rows = [r[1:] for r in rows]
                else:
                    raw = run(f"SELECT value FROM {self.t_meta} WHERE key = 'tasks'")
                    try:
                        data = json.loads(raw[0][0]) if raw else []
                    except (TypeError, ValueError, RecursionError):
                        raise bad from None
                    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
                        raise bad
                    rows = [(t.get("id"), t.get("split"), t.get("index"), t.get("env"),
                             t.get("instruction")[:n] if isinstance(t.get("instruction"), str) else None)
                            for t in data]
            except _Malformed:
                raise bad from None
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
    def _last_seq(self, run: Any) -> int:
        """The largest integer sequence number (a number that is not an integer is named by the read that
        reaches it)."""
        where = " WHERE typeof(seq) = 'integer'" if self.kind == "sqlite" else ""
        top = run(f"SELECT MAX(seq) FROM {self.t_events}{where}")[0][0]
        return int(top) if is_int(top, numpy=False) else 0

    def head(self) -> int:
        """The last committed event's ``seq`` (0 when there is none)."""
        with self._read() as run:
            return self._last_seq(run)

    def events(self, after: int, *, limit: int = 200_000) -> EventBatch:
        """The next events after ``after`` (at most ``limit`` of them), read in one transaction. The events
        before the first missing (a gap in the numbering) or malformed one are returned; when that one is next,
        :class:`DashboardError` names it and what is wrong with it."""
        try:
            return self._events(after, limit)
        except _Malformed as m:
            bad_seq, error = self._diagnose(m.after, m.upto, m.detail)
            if bad_seq is None or bad_seq <= after + 1:
                raise error from None
        return self._events(after, bad_seq - 1 - after)  # the events before the malformed one

    def _events(self, after: int, limit: int) -> EventBatch:
        with self._read() as run:
            top = self._last_seq(run)
            upto, problem = self._check_numbering(run, after, limit)
            if upto <= after:
                if problem is not None:
                    raise DashboardError(problem)
                return EventBatch(after, after, top, [], [], [], {})
            p = {"a": after, "b": upto}
            try:
                if self.use_sql_json:
                    samples, updates, discards = self._events_sql(run, p)
                else:
                    samples, updates, discards = self._events_py(run, p)
            except _Malformed as m:
                raise _Malformed(after, upto, m.detail) from None
            named = sorted({r[3] for r in updates if r[3] is not None} | {r[3] for r in discards if r[3] is not None})
            leases = self._lease_issues(run, named) if named else {}
        return EventBatch(after, upto, top, samples, updates, discards, leases)

    def _check_numbering(self, run: Any, after: int, limit: int) -> tuple[int, str | None]:
        """The last seq of the next ``limit`` events that are numbered ``after + 1``, ... without a gap, each of
        a known kind with a time; and what is wrong with the event after them (``None``: nothing)."""
        window = f"SELECT seq, kind, created FROM {self.t_events} WHERE seq > :a ORDER BY seq LIMIT :n"
        p = {"a": after, "n": int(limit)}
        if self.kind == "sqlite":
            good = ("typeof(seq) = 'integer' AND typeof(created) IN ('integer', 'real') AND abs(created) <= 1e308 "
                    "AND kind IN ('sample', 'update', 'discard')")
        else:  # BIGINT and DOUBLE PRECISION columns: only the value can be off (NaN is above every number)
            good = "created BETWEEN -1e308 AND 1e308 AND kind IN ('sample', 'update', 'discard')"
        count, top, fine = run(f"SELECT COUNT(*), MAX(seq), SUM(CASE WHEN {good} THEN 1 ELSE 0 END) FROM ({window}) w",
                               p)[0]
        if not count:
            return after, None
        if is_int(top, numpy=False) and top == after + count and fine == count:
            return int(top), None  # numbered after + 1, ..., after + count: no gap, every row well-formed
        rows = run(window, p)  # something is off: find the first event that is, and say what
        expected = after + 1
        for seq, kind, created in rows:
            problem = None
            if not is_int(seq, numpy=False):
                problem = (f"store {self.where}: the event after event {expected - 1} has the sequence number "
                           f"{quote(seq)}, which is not an integer (damaged store)")
            elif seq != expected:
                problem = (f"store {self.where}: event {expected} is missing (the next event is {seq}): the log has "
                           "a gap (damaged store; `envsched store verify` checks it)")
            elif kind not in EVENT_KINDS:
                problem = (f"store {self.where}: event {seq} has unknown kind {quote(kind)} (a store logs "
                           f"{', '.join(EVENT_KINDS)})")
            elif not (is_number(created, numpy=False) and math.isfinite(created)):
                problem = (f"store {self.where}: event {seq} ({kind}): its time 'created' is {type_name(created)}, "
                           "expected seconds since the epoch")
            if problem is not None:
                return expected - 1, problem
            expected += 1
        return expected - 1, None

    def _diagnose(self, after: int, upto: int, detail: str) -> tuple[int | None, DashboardError]:
        """Parse events ``(after, upto]`` in Python (the fast path found something off: ``detail``): the first
        malformed one's seq and the error naming it and its field (``None`` and a general error if every event
        parses)."""
        with self._read() as run:
            rows = run(f"SELECT seq, kind, created, payload FROM {self.t_events} WHERE seq > :a AND seq <= :b "
                       "ORDER BY seq", {"a": after, "b": upto})
            for seq, kind, created, payload in rows:
                try:
                    check_event(kind, created, payload)
                except ValueError as exc:
                    return int(seq), DashboardError(f"store {self.where}: event {seq} ({kind}): {exc}")
        return None, DashboardError(f"store {self.where}: events {after + 1} to {upto} cannot be read "
                                    f"({redact_secrets(detail, self._url)})")

    def _has_leases(self, run: Any) -> bool:
        if self.kind == "sqlite":
            return bool(run("SELECT 1 FROM sqlite_master WHERE type='table' AND name = :t", {"t": self.t_leases}))
        return bool(run("SELECT to_regclass(:t) IS NOT NULL", {"t": self.t_leases})[0][0])

    def _lease_issues(self, run: Any, names: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in range(0, len(names), 500):
            chunk = {f"l{j}": v for j, v in enumerate(names[i:i + 500])}
            marks = ", ".join(f":{k}" for k in chunk)
            for lease, issued in run(f"SELECT lease, issued_seq FROM {self.t_leases} WHERE lease IN ({marks})",
                                     chunk):
                if not is_int(issued, numpy=False):
                    raise DashboardError(f"store {self.where}: lease {quote(lease)} has the issuing event "
                                         f"{quote(issued)}, expected an event number (damaged store)")
                out[str(lease)] = int(issued)
        return out

    def _events_sql(self, run: Any, p: dict[str, int]) -> tuple[list[Any], list[Any], list[Any]]:
        e = self.t_events
        types = JSON_TYPES[self.kind]
        if self.kind == "sqlite":
            bad_sample = run(f"SELECT seq FROM {e} WHERE kind = 'sample' AND seq > :a AND seq <= :b AND "
                             "(json_type(payload, '$.keys') IS NOT 'array' OR "
                             "EXISTS (SELECT 1 FROM json_each(payload, '$.keys') WHERE type <> 'text') OR "
                             "(json_type(payload, '$.leases') IS NOT NULL AND "
                             "(json_type(payload, '$.leases') <> 'array' OR "
                             "json_array_length(payload, '$.leases') <> json_array_length(payload, '$.keys') OR "
                             "EXISTS (SELECT 1 FROM json_each(payload, '$.leases') WHERE type <> 'text')))) LIMIT 1",
                             p, data=True)
            rows = run(f"SELECT e.seq, e.created, j.key, j.value, json_type(e.payload, '$.leases') IS NOT NULL "
                       f"FROM {e} e, json_each(e.payload, '$.keys') j WHERE e.kind = 'sample' AND e.seq > :a "
                       "AND e.seq <= :b ORDER BY e.seq, j.key", p, data=True)
            # SQLite hands out the two arrays as compact JSON text; numpy parses and aggregates them at once
            # (faster than SQLite's json_each with GROUP BY); the last column flags a field of the wrong type
            raw = run(f"SELECT seq, created, json_extract(payload, '$.key'), json_extract(payload, '$.lease'), "
                      "json_extract(payload, '$.rewards'), json_extract(payload, '$.costs'), "
                      "json_type(payload, '$.key') IS NOT 'text' OR json_type(payload, '$.lease') NOT IN ('text', "
                      "'null') OR json_type(payload, '$.rewards') IS NOT 'array' OR json_type(payload, '$.costs') "
                      f"NOT IN ('array', 'null') FROM {e} WHERE kind = 'update' AND seq > :a AND seq <= :b "
                      "ORDER BY seq", p, data=True)
            disc = run(f"SELECT seq, created, json_extract(payload, '$.key'), json_extract(payload, '$.lease'), "
                       "json_extract(payload, '$.reason'), COALESCE(json_extract(payload, '$.reclaimed'), 0), "
                       "json_type(payload, '$.key'), json_type(payload, '$.lease'), json_type(payload, '$.reason'), "
                       f"json_type(payload, '$.reclaimed') FROM {e} WHERE kind = 'discard' AND seq > :a "
                       "AND seq <= :b ORDER BY seq", p, data=True)
            if bad_sample or any(r[6] for r in raw):
                raise _Malformed(0, 0, "a field of the wrong type")
            try:
                updates = _aggregate_updates(raw)
            except ValueError as exc:
                raise _Malformed(0, 0, str(exc)) from None
        else:
            bad_sample = run(f"SELECT e.seq FROM {e} e WHERE e.kind = 'sample' AND e.seq > :a AND e.seq <= :b AND "
                             "(jsonb_typeof(e.payload::jsonb -> 'keys') IS DISTINCT FROM 'array' OR "
                             "(e.payload::jsonb ? 'leases' AND (jsonb_typeof(e.payload::jsonb -> 'leases') <> 'array' "
                             "OR jsonb_array_length(e.payload::jsonb -> 'leases') <> "
                             "jsonb_array_length(e.payload::jsonb -> 'keys') OR EXISTS (SELECT 1 FROM "
                             "jsonb_array_elements(e.payload::jsonb -> 'leases') x "
                             "WHERE jsonb_typeof(x) <> 'string')))) LIMIT 1", p, data=True)
            if bad_sample:
                raise _Malformed(0, 0, "a sample event's keys or leases")
            rows = run(f"SELECT e.seq, e.created, k.i - 1, k.v #>> '{{}}', (e.payload::jsonb ? 'leases'), "
                       f"jsonb_typeof(k.v) FROM {e} e, jsonb_array_elements(e.payload::jsonb -> 'keys') "
                       "WITH ORDINALITY AS k(v, i) WHERE e.kind = 'sample' AND e.seq > :a AND e.seq <= :b "
                       "ORDER BY e.seq, k.i", p, data=True)
            if any(r[5] != "string" for r in rows):
                raise _Malformed(0, 0, "a sample event's keys")
            rows = [r[:5] for r in rows]
            j = "e.payload::jsonb"
            raw = run(f"SELECT e.seq, e.created, {j} ->> 'key', {j} ->> 'lease', "
                      f"jsonb_array_length({j} -> 'rewards'), COUNT(r.x), MIN(r.x), MAX(r.x), "
                      "COALESCE(SUM(r.x), 0), COALESCE(SUM(r.x * r.x), 0), "
                      "(SELECT COALESCE(SUM(c::text::float8), 0) FROM jsonb_array_elements(CASE WHEN "
                      f"jsonb_typeof({j} -> 'costs') = 'array' THEN {j} -> 'costs' "
                      "ELSE '[]'::jsonb END) c WHERE jsonb_typeof(c) <> 'null'), "
                      f"jsonb_typeof({j} -> 'key'), jsonb_typeof({j} -> 'lease'), jsonb_typeof({j} -> 'rewards'), "
                      f"jsonb_typeof({j} -> 'costs'), COUNT(*) FILTER (WHERE r.t NOT IN ('number', 'null')), "
                      f"(SELECT COUNT(*) FROM jsonb_array_elements(CASE WHEN jsonb_typeof({j} -> 'costs') = 'array' "
                      f"THEN {j} -> 'costs' ELSE '[]'::jsonb END) c WHERE jsonb_typeof(c) NOT IN ('number', 'null')) "
                      f"FROM {e} e LEFT JOIN LATERAL (SELECT jsonb_typeof(v) AS t, CASE WHEN jsonb_typeof(v) = "
                      "'number' THEN v::text::float8 END AS x FROM jsonb_array_elements(CASE WHEN "
                      f"jsonb_typeof({j} -> 'rewards') = 'array' THEN {j} -> 'rewards' ELSE '[]'::jsonb END) v) r "
                      "ON TRUE WHERE e.kind = 'update' AND e.seq > :a AND e.seq <= :b GROUP BY e.seq "
                      "ORDER BY e.seq", p, data=True)
            if any(r[15] or r[16] for r in raw):
                raise _Malformed(0, 0, "an update's rewards or costs")
            self._check_types([r[:2] + r[2:4] + (None, None) + r[11:15] for r in raw], types, "update")
            updates = [r[:11] for r in raw]
            disc = run(f"SELECT seq, created, payload::jsonb ->> 'key', payload::jsonb ->> 'lease', "
                       "payload::jsonb ->> 'reason', COALESCE((payload::jsonb -> 'reclaimed') = 'true'::jsonb, false), "
                       "jsonb_typeof(payload::jsonb -> 'key'), jsonb_typeof(payload::jsonb -> 'lease'), "
                       "jsonb_typeof(payload::jsonb -> 'reason'), jsonb_typeof(payload::jsonb -> 'reclaimed') "
                       f"FROM {e} WHERE kind = 'discard' AND seq > :a AND seq <= :b ORDER BY seq", p, data=True)
        self._check_types(disc, types, "discard")
        return rows, updates, [r[:6] for r in disc]

    @staticmethod
    def _check_types(rows: list[tuple[Any, ...]], types: dict[str, set[Any]], kind: str) -> None:
        """Columns 6-9 of update / discard rows are the JSON types of (key, lease, rewards or reason, costs or
        reclaimed); :class:`_Malformed` when one is not what the store writes."""
        third, fourth = (("array", "opt_array") if kind == "update" else ("opt_text", "opt_bool"))
        for r in rows:
            if (r[6] not in types["text"] or r[7] not in types["opt_text"] or r[8] not in types[third]
                    or r[9] not in types[fourth]):
                raise _Malformed(0, 0, f"event {r[0]}'s fields")

    def _events_py(self, run: Any, p: dict[str, int]) -> tuple[list[Any], list[Any], list[Any]]:
        """The same columns as :meth:`_events_sql`, parsed in Python (any backend; the reference the tests
        compare the SQL extraction with)."""
        samples, updates, discards = [], [], []
        for seq, kind, created, payload in run(f"SELECT seq, kind, created, payload FROM {self.t_events} "
                                               "WHERE seq > :a AND seq <= :b ORDER BY seq", p):
            try:
                data = check_event(kind, created, payload)
            except ValueError as exc:
                raise DashboardError(f"store {self.where}: event {seq} ({kind}): {exc}") from None
            if kind == "sample":
                leased = "leases" in data
                samples += [(seq, created, i, k, leased) for i, k in enumerate(data["keys"])]
            elif kind == "update":
                rewards = data["rewards"]
                scored = [float(r) for r in rewards if r is not None]
                costs = [c for c in data.get("costs") or [] if c is not None]
                updates.append((seq, created, data["key"], data.get("lease"), len(rewards), len(scored),
                                min(scored) if scored else None, max(scored) if scored else None,
                                float(sum(scored)), float(sum(x * x for x in scored)), float(sum(costs))))
            elif kind == "discard":
                discards.append((seq, created, data["key"], data.get("lease"), data.get("reason"),
                                 bool(data.get("reclaimed") or False)))
        return samples, updates, discards

    def lease_counts(self) -> dict[str, int]:
        """Leases by state (``open``, ``update``, ``discard``, ``reclaim``); zeros for a store without leases."""
        out = {"open": 0, "update": 0, "discard": 0, "reclaim": 0}
        with self._read() as run:
            if self._has_leases(run):
                for outcome, count in run(f"SELECT outcome, COUNT(*) FROM {self.t_leases} GROUP BY outcome"):
                    name = "open" if outcome is None else str(outcome)
                    if name not in out:
                        raise DashboardError(f"store {self.where}: a lease has the outcome {quote(outcome)}, "
                                             "expected update, discard or reclaim (damaged store)")
                    out[name] = int(count)
        return out
