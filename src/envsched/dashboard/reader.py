"""Read-only access to a history store, for the dashboard.

The dashboard must never write to a store a trainer is writing, nor slow it down. This reader therefore opens
SQLite through a ``mode=ro`` URI with ``PRAGMA query_only`` (in WAL mode a reader never blocks the writer and
takes no lock the writer waits on) and PostgreSQL in ``READ ONLY`` transactions without the store's advisory
lock. Each read is one short transaction, so it sees one consistent, committed state of the log.

It reads only what the views need, extracted by the database itself (SQLite's JSON1 functions, PostgreSQL's
``jsonb``): per drawn group its task key; per update the number of rollouts and the scored rewards' count,
minimum, maximum, sum and sum of squares (PostgreSQL aggregates them in SQL; from SQLite the reward and cost
arrays come as JSON text that numpy parses and aggregates in one pass); per discard its reason. The hash
chain is not checked here (that is ``envsched store verify``): the dashboard shows what was committed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envsched.errors import EnvSchedError

__all__ = ["DashboardError", "EventBatch", "StoreReader", "TaskTable"]

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
_FORMAT = "envsched.store/1"
#: how many characters of an instruction the dashboard keeps (shown as text, never as markup)
INSTRUCTION_CHARS = 600


class DashboardError(EnvSchedError, RuntimeError):
    """The store cannot be read by the dashboard (missing, not an envsched store, damaged, unreachable)."""


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
    null becomes NaN."""
    lens = np.fromiter((t.count(",") + 1 if isinstance(t, str) and len(t) > 2 else 0 for t in texts),
                       dtype=np.int64, count=len(texts))
    body = ",".join(t[1:-1] for t in texts if isinstance(t, str) and len(t) > 2)
    vals = np.array(body.replace("null", "nan").split(","), dtype=np.float64) if body else np.zeros(0)
    if vals.size != lens.sum():  # pragma: no cover - only for arrays SQLite did not write compactly
        raise DashboardError("an update's rewards are not a flat JSON array of numbers")
    return vals, lens


def _per_row(func: Any, values: np.ndarray, lens: np.ndarray, empty: float) -> np.ndarray:
    """``func.reduceat`` over consecutive runs of ``lens`` values (``empty`` for a run of none)."""
    out = np.full(lens.size, empty)
    nonempty = lens > 0
    if nonempty.any():
        out[nonempty] = func.reduceat(values, (np.cumsum(lens) - lens)[nonempty])
    return out


def _aggregate_updates(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``(seq, created, key, lease, rewards JSON, costs JSON)`` rows -> the update columns of
    :class:`EventBatch` (rollouts, scored, min, max, sum, sum of squares of the scored rewards, total cost)."""
    if not rows:
        return []
    seq, created, key, lease, rewards, costs = zip(*rows, strict=True)
    vals, lens = _json_numbers(list(rewards))
    ok = ~np.isnan(vals)
    scored = _per_row(np.add, ok.astype(np.float64), lens, 0.0).astype(np.int64)
    total = _per_row(np.add, np.where(ok, vals, 0.0), lens, 0.0)
    squares = _per_row(np.add, np.where(ok, vals * vals, 0.0), lens, 0.0)
    lo = _per_row(np.minimum, np.where(ok, vals, np.inf), lens, np.inf)
    hi = _per_row(np.maximum, np.where(ok, vals, -np.inf), lens, -np.inf)
    cvals, clens = _json_numbers(list(costs))
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
    ``postgresql://`` URL). Raises :class:`DashboardError` when it cannot be read; never creates a file."""

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
        self._conn: sqlite3.Connection | None = None
        if text.startswith(("postgresql://", "postgresql+", "postgres://")):
            self.kind = "postgresql"
            self._open_postgres(text)
        elif is_url(text):
            raise DashboardError(f"unsupported store URL {text!r}: give a SQLite file path, sqlite:///path or a "
                                 "postgresql:// URL")
        else:
            self.kind = "sqlite"
            self._open_sqlite(Path(text[len("sqlite:///"):] if text.startswith("sqlite:///") else text))
        self.header = self._read_header()

    # ------------------------------------------------------------------ connections
    def _open_sqlite(self, path: Path) -> None:
        self.where = str(path)
        if not path.exists():
            raise DashboardError(f"store not found: {path} (no such file; a SQLite store is the file given to "
                                 "`envsched run --store PATH` or DurableSampler(sampler, PATH))")
        if path.is_dir():
            raise DashboardError(f"{path} is a directory; a SQLite store is a file")
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0,
                                   isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            raise DashboardError(f"store {path}: cannot open it read-only ({exc})") from None
        self._conn = conn

    def _open_postgres(self, url: str) -> None:
        try:
            import sqlalchemy
        except ImportError:  # pragma: no cover - depends on the environment
            raise DashboardError("a PostgreSQL store needs SQLAlchemy and psycopg: "
                                 "pip install 'envsched[postgres]'") from None
        if url.startswith(("postgresql://", "postgres://")):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        self._sa = sqlalchemy
        self.where = sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
        self._engine = sqlalchemy.create_engine(url, pool_pre_ping=True, pool_size=1, max_overflow=1,
                                                connect_args={"connect_timeout": 10})

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        """One read-only transaction; yields ``run(sql, params) -> rows``."""
        with self._lock:
            if self._conn is not None:
                conn = self._conn
                try:
                    conn.execute("BEGIN")
                except sqlite3.Error as exc:
                    raise DashboardError(f"store {self.where}: {exc}") from None

                def run(sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
                    try:
                        return conn.execute(sql, params or {}).fetchall()
                    except sqlite3.Error as exc:
                        raise DashboardError(f"store {self.where}: {exc}") from None

                try:
                    yield run
                finally:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("COMMIT")
                return
            sa = self._sa
            try:
                with self._engine.connect().execution_options(isolation_level="REPEATABLE READ",
                                                              postgresql_readonly=True) as c, c.begin():

                    def run(sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
                        return [tuple(r) for r in c.execute(sa.text(sql), params or {}).fetchall()]

                    yield run
            except sa.exc.SQLAlchemyError as exc:
                raise DashboardError(f"store {self.where}: {getattr(exc, 'orig', exc)}") from None

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
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
            except (TypeError, ValueError):
                raise DashboardError(f"store {self.where}: metadata {key!r} is not valid JSON (damaged store)") \
                    from None
        if meta.get("format") != _FORMAT:
            raise DashboardError(f"store {self.where} has format {meta.get('format')!r}, expected {_FORMAT!r}")
        return meta

    def tasks(self) -> TaskTable:
        """The task list the store was created with (key, environment, start of the instruction)."""
        n = INSTRUCTION_CHARS
        with self._read() as run:
            if self.use_sql_json and self.kind == "sqlite":
                rows = run(f"SELECT json_extract(j.value, '$.id'), json_extract(j.value, '$.split'), "
                           f"json_extract(j.value, '$.index'), json_extract(j.value, '$.env'), "
                           f"substr(json_extract(j.value, '$.instruction'), 1, {n}) FROM {self.t_meta} m, "
                           "json_each(m.value) j WHERE m.key = 'tasks' ORDER BY j.key")
            elif self.use_sql_json:
                rows = run(f"SELECT t->>'id', t->>'split', t->>'index', t->>'env', left(t->>'instruction', {n}) "
                           f"FROM {self.t_meta} m, jsonb_array_elements(m.value::jsonb) WITH ORDINALITY AS a(t, i) "
                           "WHERE m.key = 'tasks' ORDER BY i")
            else:
                raw = run(f"SELECT value FROM {self.t_meta} WHERE key = 'tasks'")
                data = json.loads(raw[0][0]) if raw else []
                rows = [(t.get("id"), t.get("split"), t.get("index"), t.get("env"),
                         t.get("instruction")[:n] if isinstance(t.get("instruction"), str) else None)
                        for t in data if isinstance(t, dict)]
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
        with self._read() as run:
            rows = run(f"SELECT MAX(seq) FROM {self.t_events}")
        return int(rows[0][0] or 0)

    def events(self, after: int, *, limit: int = 200_000) -> EventBatch:
        """The events after ``after`` (at most ``limit`` of them), read in one transaction."""
        with self._read() as run:
            top = run(f"SELECT MAX(seq) FROM {self.t_events}")[0][0] or 0
            upto = min(int(top), after + limit)
            p = {"a": after, "b": upto}
            if upto <= after:
                return EventBatch(after, after, int(top), [], [], [], {})
            if self.use_sql_json:
                samples, updates, discards = self._events_sql(run, p)
            else:
                samples, updates, discards = self._events_py(run, p)
            named = sorted({r[3] for r in updates if r[3] is not None} | {r[3] for r in discards if r[3] is not None})
            leases = self._lease_issues(run, named) if named else {}
        return EventBatch(after, upto, int(top), samples, updates, discards, leases)

    def _lease_issues(self, run: Any, names: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in range(0, len(names), 500):
            chunk = {f"l{j}": v for j, v in enumerate(names[i:i + 500])}
            marks = ", ".join(f":{k}" for k in chunk)
            out.update({str(a): int(b) for a, b in run(
                f"SELECT lease, issued_seq FROM {self.t_leases} WHERE lease IN ({marks})", chunk)})
        return out

    def _events_sql(self, run: Any, p: dict[str, int]) -> tuple[list[Any], list[Any], list[Any]]:
        e = self.t_events
        if self.kind == "sqlite":
            samples = run(f"SELECT e.seq, e.created, j.key, j.value, json_type(e.payload, '$.leases') IS NOT NULL "
                          f"FROM {e} e, json_each(e.payload, '$.keys') j WHERE e.kind = 'sample' AND e.seq > :a "
                          "AND e.seq <= :b ORDER BY e.seq, j.key", p)
            # SQLite hands out the two arrays as compact JSON text; numpy parses and aggregates them at once
            # (faster than SQLite's json_each with GROUP BY)
            rows = run(f"SELECT seq, created, json_extract(payload, '$.key'), json_extract(payload, '$.lease'), "
                       "json_extract(payload, '$.rewards'), json_extract(payload, '$.costs') "
                       f"FROM {e} WHERE kind = 'update' AND seq > :a AND seq <= :b ORDER BY seq", p)
            updates = _aggregate_updates(rows)
            discards = run(f"SELECT seq, created, json_extract(payload, '$.key'), json_extract(payload, '$.lease'), "
                           "json_extract(payload, '$.reason'), COALESCE(json_extract(payload, '$.reclaimed'), 0) "
                           f"FROM {e} WHERE kind = 'discard' AND seq > :a AND seq <= :b ORDER BY seq", p)
        else:
            samples = run(f"SELECT e.seq, e.created, k.i - 1, k.v, (e.payload::jsonb ? 'leases') FROM {e} e, "
                          "jsonb_array_elements_text(e.payload::jsonb -> 'keys') WITH ORDINALITY AS k(v, i) "
                          "WHERE e.kind = 'sample' AND e.seq > :a AND e.seq <= :b ORDER BY e.seq, k.i", p)
            updates = run(f"SELECT e.seq, e.created, e.payload::jsonb ->> 'key', e.payload::jsonb ->> 'lease', "
                          "jsonb_array_length(e.payload::jsonb -> 'rewards'), COUNT(r.x), MIN(r.x), MAX(r.x), "
                          "COALESCE(SUM(r.x), 0), COALESCE(SUM(r.x * r.x), 0), "
                          "(SELECT COALESCE(SUM(c::text::float8), 0) FROM jsonb_array_elements(CASE WHEN "
                          "jsonb_typeof(e.payload::jsonb -> 'costs') = 'array' THEN e.payload::jsonb -> 'costs' "
                          "ELSE '[]'::jsonb END) c) "
                          f"FROM {e} e LEFT JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(v) = 'number' THEN "
                          "v::text::float8 END AS x FROM jsonb_array_elements(e.payload::jsonb -> 'rewards') v) r "
                          "ON TRUE WHERE e.kind = 'update' AND e.seq > :a AND e.seq <= :b GROUP BY e.seq "
                          "ORDER BY e.seq", p)
            discards = run(f"SELECT seq, created, payload::jsonb ->> 'key', payload::jsonb ->> 'lease', "
                           "payload::jsonb ->> 'reason', COALESCE((payload::jsonb ->> 'reclaimed')::boolean, false) "
                           f"FROM {e} WHERE kind = 'discard' AND seq > :a AND seq <= :b ORDER BY seq", p)
        return samples, updates, discards

    def _events_py(self, run: Any, p: dict[str, int]) -> tuple[list[Any], list[Any], list[Any]]:
        """The same columns as :meth:`_events_sql`, parsed in Python (any backend; the reference the tests
        compare the SQL extraction with)."""
        samples, updates, discards = [], [], []
        for seq, kind, created, payload in run(f"SELECT seq, kind, created, payload FROM {self.t_events} "
                                               "WHERE seq > :a AND seq <= :b ORDER BY seq", p):
            data = json.loads(payload)
            if kind == "sample":
                leased = "leases" in data
                samples += [(seq, created, i, k, leased) for i, k in enumerate(data.get("keys") or [])]
            elif kind == "update":
                rewards = data.get("rewards") or []
                scored = [float(r) for r in rewards if r is not None]
                costs = data.get("costs") or []
                updates.append((seq, created, data.get("key"), data.get("lease"), len(rewards), len(scored),
                                min(scored) if scored else None, max(scored) if scored else None,
                                float(sum(scored)), float(sum(x * x for x in scored)), float(sum(costs))))
            elif kind == "discard":
                discards.append((seq, created, data.get("key"), data.get("lease"), data.get("reason"),
                                 bool(data.get("reclaimed", False))))
        return samples, updates, discards

    def lease_counts(self) -> dict[str, int]:
        """Leases by state (``open``, ``update``, ``discard``, ``reclaim``); zeros for a store without leases."""
        out = {"open": 0, "update": 0, "discard": 0, "reclaim": 0}
        with self._read() as run:
            if self.kind == "sqlite":
                has = bool(run("SELECT 1 FROM sqlite_master WHERE type='table' AND name = :t", {"t": self.t_leases}))
            else:
                has = bool(run("SELECT to_regclass(:t) IS NOT NULL", {"t": self.t_leases})[0][0])
            if has:
                for outcome, count in run(f"SELECT outcome, COUNT(*) FROM {self.t_leases} GROUP BY outcome"):
                    out["open" if outcome is None else str(outcome)] = int(count)
        return out
