"""Every read of a history store, in SQL for both dialects: :class:`StoreQueries`.

The stored format -- table names, payload layout, metadata, versions and the checks of each field -- is
:mod:`envsched.store.schema`; this module holds the statements that read it, with the JSON paths of the payload
fields, so that the two are the only modules that spell a table name or a payload path
(``tests/store/test_schema.py`` checks it). The durable store (:mod:`envsched.store.history`),
``envsched store info`` and ``verify``, and the dashboard's reader run them on connections of their own: each
method takes a :class:`Transaction`.

A watcher reads a log it does not trust: :meth:`StoreQueries.numbered_events`,
:meth:`~StoreQueries.event_rows_by_kind`, :meth:`~StoreQueries.task_rows` and the lease reads check what they
return (the JSON types the database reports on the fast path; :func:`~envsched.store.schema.check_event` on each
payload in Python) and raise :class:`~envsched.store.schema.MalformedStoreData` when a value is not what the
format allows. The rows stay bounded whatever the log holds: a read takes the next events by position, never a
range of sequence numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from envsched.store.errors import StoreCorruptError
from envsched.store.leases import OUTCOMES
from envsched.store.schema import (
    DIALECTS,
    EVENT_KINDS,
    HEAD_KEY,
    UPGRADES,
    MalformedStoreData,
    Tables,
    Upgrade,
    check_event,
    event_head_problem,
    loads_stored,
    quote,
)
from envsched.validation import is_int

__all__ = ["JSON_TYPES", "StoreQueries", "Transaction"]

#: The JSON type names each dialect reports (SQLite's ``json_type``, PostgreSQL's ``jsonb_typeof``) that a
#: payload field of each sort may have; SQL ``NULL`` (``None``): the field is absent.
JSON_TYPES: dict[str, dict[str, set[Any]]] = {
    "sqlite": {"text": {"text"}, "opt_text": {None, "null", "text"}, "array": {"array"},
               "opt_array": {None, "null", "array"}, "opt_bool": {None, "null", "true", "false"}},
    "postgresql": {"text": {"string"}, "opt_text": {None, "null", "string"}, "array": {"array"},
                   "opt_array": {None, "null", "array"}, "opt_bool": {None, "null", "boolean"}},
}
#: What the tasks metadata must be, for a message.
_BAD_TASKS = "metadata 'tasks' is not a JSON list of task objects (damaged store)"


class Transaction(Protocol):
    """What the queries run on: ``execute(sql, params)`` returns all rows as tuples."""

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]: ...


def _chunks(values: Sequence[Any], size: int, letter: str) -> list[tuple[dict[str, Any], str]]:
    """``values`` in chunks of ``size``, each as named parameters and the ``:l0, :l1, ...`` placeholders."""
    out = []
    for i in range(0, len(values), size):
        names = {f"{letter}{j}": v for j, v in enumerate(values[i:i + size])}
        if names:
            out.append((names, ", ".join(f":{k}" for k in names)))
    return out


class StoreQueries:
    """Every read of a store, for one store's :class:`~envsched.store.schema.Tables` in one SQL ``dialect``
    (``"sqlite"`` or ``"postgresql"``). Each method takes a :class:`Transaction` and only reads. The raw reads
    (metadata text, events as stored, snapshots) leave decoding to the caller (the durable store verifies the
    chain); the reads a watcher shows check types and raise
    :class:`~envsched.store.schema.MalformedStoreData` (see the module's docstring).

    The rows of :meth:`sample_rows`, :meth:`update_rows` and :meth:`discard_rows` (and of :meth:`task_rows`)
    are extracted by the database itself (SQLite's JSON1 functions, PostgreSQL's ``jsonb``) unless
    ``sql_json=False`` is given, which parses the payloads in Python (any backend; the reference the two are
    compared with, and the parse that names the field when the fast path found something off).
    """

    def __init__(self, tables: Tables | str, dialect: str) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}, got {dialect!r}")
        self.tables = tables if isinstance(tables, Tables) else Tables(tables)
        self.dialect = dialect

    # ------------------------------------------------------------------ tables
    def table_names(self, tx: Transaction) -> set[str]:
        """The names of every table in an SQLite database (this store's and any other)."""
        if self.dialect != "sqlite":
            raise ValueError("table_names lists an SQLite database's tables; use table_exists on PostgreSQL")
        return {r[0] for r in tx.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def table_exists(self, tx: Transaction, table: str) -> bool:
        """Whether ``table`` exists (PostgreSQL: in the current schema, read from ``pg_class`` through the
        statement's snapshot -- ``to_regclass()`` would consult the catalog snapshot, which can predate another
        writer's committed ``CREATE TABLE`` while this transaction waited for the lock)."""
        if self.dialect == "sqlite":
            return bool(tx.execute("SELECT name FROM sqlite_master WHERE type='table' AND name = :t", {"t": table}))
        rows = tx.execute("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                          "ON n.oid = c.relnamespace WHERE c.relname = :t AND n.nspname = current_schema())",
                          {"t": table})
        return bool(rows[0][0])

    def foreign_objects(self, tx: Transaction) -> list[tuple[str, str]]:
        """``(kind, name)`` of every trigger, view (SQLite) or rule (PostgreSQL) on or named like the store's
        tables: envsched creates none, so any is an edit of the store."""
        tables = self.tables.names()
        if self.dialect == "sqlite":
            rows = tx.execute("SELECT type, name, tbl_name FROM sqlite_master WHERE type IN ('trigger', 'view')")
            return [(t, n) for t, n, tbl in rows if tbl in tables or n in tables]
        rows = tx.execute(
            "SELECT 'trigger', t.tgname FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = "
            "t.tgrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE NOT t.tgisinternal AND "
            "n.nspname = current_schema() AND c.relname IN (:a, :b, :c, :d) UNION ALL "
            "SELECT 'rule', r.rulename FROM pg_catalog.pg_rules r WHERE r.schemaname = current_schema() "
            "AND r.tablename IN (:a, :b, :c, :d)", dict(zip("abcd", tables, strict=True)))
        return [(t, n) for t, n in rows]

    # ------------------------------------------------------------------ metadata
    def meta_rows(self, tx: Transaction, *, tasks: bool = True) -> list[tuple[Any, Any]]:
        """``(key, JSON text)`` of every metadata entry (without the task list unless ``tasks``)."""
        sql = f"SELECT key, value FROM {self.tables.meta}"
        return [(k, v) for k, v in tx.execute(sql if tasks else sql + " WHERE key <> 'tasks'")]

    def meta_text(self, tx: Transaction, key: str) -> tuple[Any] | None:
        """The row ``(JSON text,)`` of one metadata entry, or ``None`` when there is none."""
        rows = tx.execute(f"SELECT value FROM {self.tables.meta} WHERE key = :k", {"k": key})
        return (rows[0][0],) if rows else None

    def task_rows(self, tx: Transaction, instruction_chars: int, *, sql_json: bool = True) -> list[tuple[Any, ...]]:
        """``(id, split, index, env, first instruction_chars characters of the instruction)`` of every recorded
        task, in order (values the task does not have are ``None``; no rows when the store records no task
        list). :class:`~envsched.store.schema.MalformedStoreData` when the task list is not a JSON list of
        objects (a database error on text that is not JSON is the caller's to report the same way)."""
        n, meta = int(instruction_chars), self.tables.meta
        if sql_json:
            if self.dialect == "sqlite":
                top = tx.execute(f"SELECT json_type(value) FROM {meta} WHERE key = 'tasks'")
                sql = (f"SELECT j.type, json_extract(j.value, '$.id'), json_extract(j.value, '$.split'), "
                       f"json_extract(j.value, '$.index'), json_extract(j.value, '$.env'), "
                       f"substr(json_extract(j.value, '$.instruction'), 1, {n}) FROM {meta} m, "
                       "json_each(m.value) j WHERE m.key = 'tasks' ORDER BY j.key")
            else:
                top = tx.execute(f"SELECT jsonb_typeof(value::jsonb) FROM {meta} WHERE key = 'tasks'")
                sql = (f"SELECT jsonb_typeof(t), t->>'id', t->>'split', t->>'index', t->>'env', "
                       f"left(t->>'instruction', {n}) FROM {meta} m, jsonb_array_elements(m.value::jsonb) "
                       "WITH ORDINALITY AS a(t, i) WHERE m.key = 'tasks' ORDER BY i")
            if top and top[0][0] != "array":  # both dialects name a JSON array and object alike
                raise MalformedStoreData(_BAD_TASKS)
            rows = tx.execute(sql) if top else []
            if any(r[0] != "object" for r in rows):
                raise MalformedStoreData(_BAD_TASKS)
            return [tuple(r[1:]) for r in rows]
        raw = tx.execute(f"SELECT value FROM {meta} WHERE key = 'tasks'")
        try:
            data = loads_stored(raw[0][0], "metadata 'tasks'") if raw else []
        except StoreCorruptError:
            raise MalformedStoreData(_BAD_TASKS) from None
        if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
            raise MalformedStoreData(_BAD_TASKS)
        return [(t.get("id"), t.get("split"), t.get("index"), t.get("env"),
                 t.get("instruction")[:n] if isinstance(t.get("instruction"), str) else None) for t in data]

    # ------------------------------------------------------------------ events and snapshots
    def last_event(self, tx: Transaction) -> tuple[int, str | None]:
        """``(seq, digest)`` of the last event (``(0, None)`` when there is none)."""
        rows = tx.execute(f"SELECT seq, digest FROM {self.tables.events} ORDER BY seq DESC LIMIT 1")
        return (int(rows[0][0]), str(rows[0][1])) if rows else (0, None)

    def event_rows(self, tx: Transaction, after: int, limit: int | None = None) -> list[tuple[Any, ...]]:
        """``(seq, kind, payload text, digest)`` of the events after ``after``, in order."""
        sql = f"SELECT seq, kind, payload, digest FROM {self.tables.events} WHERE seq > :a ORDER BY seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return tx.execute(sql, {"a": after})

    def event_heads(self, tx: Transaction, after: int, limit: int) -> list[tuple[Any, ...]]:
        """``(seq, kind, created)`` of the next ``limit`` events after ``after``, by position (as stored)."""
        return tx.execute(f"SELECT seq, kind, created FROM {self.tables.events} WHERE seq > :a ORDER BY seq "
                          "LIMIT :n", {"a": after, "n": int(limit)})

    def max_seq(self, tx: Transaction) -> int:
        """The largest sequence number that is an integer (0 when there is none): the head of the log as a
        watcher sees it (a number that is not an integer is named by :meth:`numbered_events` when it is
        reached)."""
        where = " WHERE typeof(seq) = 'integer'" if self.dialect == "sqlite" else ""
        top = tx.execute(f"SELECT MAX(seq) FROM {self.tables.events}{where}")[0][0]
        return int(top) if is_int(top, numpy=False) else 0

    def numbered_events(self, tx: Transaction, after: int, limit: int) -> tuple[int, str | None]:
        """The last seq of the next ``limit`` events (by position) that are numbered ``after + 1``,
        ``after + 2``, ... without a gap, each with a known kind and a finite time; and what is wrong with the
        event after them (:func:`~envsched.store.schema.event_head_problem`; ``None``: nothing). One aggregate
        over the window when all is well, the window's rows to name the first bad event when not."""
        window = f"SELECT seq, kind, created FROM {self.tables.events} WHERE seq > :a ORDER BY seq LIMIT :n"
        p = {"a": after, "n": int(limit)}
        kinds = ", ".join(f"'{k}'" for k in EVENT_KINDS)
        if self.dialect == "sqlite":
            good = ("typeof(seq) = 'integer' AND typeof(created) IN ('integer', 'real') AND abs(created) <= 1e308 "
                    f"AND kind IN ({kinds})")
        else:  # BIGINT and DOUBLE PRECISION columns: only the value can be off (NaN is above every number)
            good = f"created BETWEEN -1e308 AND 1e308 AND kind IN ({kinds})"
        count, top, fine = tx.execute(f"SELECT COUNT(*), MAX(seq), SUM(CASE WHEN {good} THEN 1 ELSE 0 END) "
                                      f"FROM ({window}) w", p)[0]
        if not count:
            return after, None
        if is_int(top, numpy=False) and top == after + count and fine == count:
            return int(top), None  # numbered after + 1, ..., after + count: no gap, every row well-formed
        expected = after + 1
        for seq, kind, created in self.event_heads(tx, after, limit):
            problem = event_head_problem(seq, expected, kind, created)
            if problem is not None:
                return expected - 1, problem
            expected += 1
        return expected - 1, None

    def event_payload_rows(self, tx: Transaction, after: int, upto: int) -> list[tuple[Any, ...]]:
        """``(seq, kind, created, payload text)`` of the events in ``(after, upto]`` (as stored)."""
        return tx.execute(f"SELECT seq, kind, created, payload FROM {self.tables.events} WHERE seq > :a AND "
                          "seq <= :b ORDER BY seq", {"a": after, "b": upto})

    def payload_text(self, tx: Transaction, seq: int) -> tuple[Any] | None:
        """The row ``(payload text,)`` of event ``seq``, or ``None`` when there is none."""
        rows = tx.execute(f"SELECT payload FROM {self.tables.events} WHERE seq = :s", {"s": seq})
        return (rows[0][0],) if rows else None

    def digest_at(self, tx: Transaction, seq: int) -> str | None:
        """The digest of event ``seq`` (``None`` when there is none)."""
        rows = tx.execute(f"SELECT digest FROM {self.tables.events} WHERE seq = :s", {"s": seq})
        return str(rows[0][0]) if rows else None

    def events_name_leases(self, tx: Transaction) -> bool:
        """Whether any event's payload carries a lease id (``"lease":`` or ``"leases":`` as a key of the
        canonical JSON: inside a string value the quote would be escaped)."""
        rows = tx.execute(f"SELECT 1 FROM {self.tables.events} WHERE payload LIKE :a OR payload LIKE :b LIMIT 1",
                          {"a": '%"lease":%', "b": '%"leases":%'})
        return bool(rows)

    def tail_references(self, tx: Transaction, *, leases: bool) -> tuple[Any, Any, Any]:
        """The last event a snapshot, an issued lease and a consumed lease refer to (``None`` for none; the
        lease table is read only when ``leases``)."""
        snap = tx.execute(f"SELECT MAX(seq) FROM {self.tables.snapshots}")
        lease = (tx.execute(f"SELECT MAX(issued_seq), MAX(closed_seq) FROM {self.tables.leases}")
                 if leases else [(None, None)])
        return (snap[0][0] if snap else None), lease[0][0], lease[0][1]

    def snapshot_seqs(self, tx: Transaction) -> list[int]:
        """Event numbers after which a snapshot is stored, in order."""
        return [int(r[0]) for r in tx.execute(f"SELECT seq FROM {self.tables.snapshots} ORDER BY seq")]

    def snapshot_row(self, tx: Transaction, *, latest: bool, at_most: int | None = None) -> tuple[Any, ...] | None:
        """``(seq, state text, digest)`` of snapshot 0 (``latest=False``) or of the latest one with
        ``seq <= at_most``; ``None`` when there is none."""
        if latest:
            sql = f"SELECT seq, state, digest FROM {self.tables.snapshots}"
            params: dict[str, Any] = {}
            if at_most is not None:
                sql += " WHERE seq <= :m"
                params["m"] = at_most
            rows = tx.execute(sql + " ORDER BY seq DESC LIMIT 1", params)
        else:
            rows = tx.execute(f"SELECT seq, state, digest FROM {self.tables.snapshots} WHERE seq = 0")
        return tuple(rows[0]) if rows else None

    def event_rows_by_kind(self, tx: Transaction, after: int, upto: int, *,
                           sql_json: bool = True) -> tuple[list[Any], list[Any], list[Any]]:
        """The rows of :meth:`sample_rows`, :meth:`update_rows` and :meth:`discard_rows` of events
        ``(after, upto]`` at once (in Python each payload is parsed once). Check the numbering first
        (:meth:`numbered_events`): these rows are per kind, so a gap would go unseen."""
        if not sql_json:
            return self._python_rows(tx, after, upto)
        return self.sample_rows(tx, after, upto), self.update_rows(tx, after, upto), self.discard_rows(tx, after, upto)

    def sample_rows(self, tx: Transaction, after: int, upto: int, *, sql_json: bool = True) -> list[tuple[Any, ...]]:
        """``(seq, created, position in the draw, task key, drawn under a lease)`` per drawn group of the
        ``sample`` events in ``(after, upto]``."""
        if not sql_json:
            return self._python_rows(tx, after, upto)[0]
        p, e = {"a": after, "b": upto}, self.tables.events
        if self.dialect == "sqlite":
            bad = tx.execute(f"SELECT seq FROM {e} WHERE kind = 'sample' AND seq > :a AND seq <= :b AND "
                             "(json_type(payload, '$.keys') IS NOT 'array' OR "
                             "EXISTS (SELECT 1 FROM json_each(payload, '$.keys') WHERE type <> 'text') OR "
                             "(json_type(payload, '$.leases') IS NOT NULL AND "
                             "(json_type(payload, '$.leases') <> 'array' OR "
                             "json_array_length(payload, '$.leases') <> json_array_length(payload, '$.keys') OR "
                             "EXISTS (SELECT 1 FROM json_each(payload, '$.leases') WHERE type <> 'text')))) LIMIT 1",
                             p)
            if bad:
                raise MalformedStoreData("a sample event's keys or leases")
            return tx.execute(f"SELECT e.seq, e.created, j.key, j.value, json_type(e.payload, '$.leases') IS NOT "
                              f"NULL FROM {e} e, json_each(e.payload, '$.keys') j WHERE e.kind = 'sample' AND "
                              "e.seq > :a AND e.seq <= :b ORDER BY e.seq, j.key", p)
        j = "e.payload::jsonb"
        bad = tx.execute(f"SELECT e.seq FROM {e} e WHERE e.kind = 'sample' AND e.seq > :a AND e.seq <= :b AND "
                         f"(jsonb_typeof({j} -> 'keys') IS DISTINCT FROM 'array' OR ({j} ? 'leases' AND "
                         f"(jsonb_typeof({j} -> 'leases') <> 'array' OR jsonb_array_length({j} -> 'leases') <> "
                         f"jsonb_array_length({j} -> 'keys') OR EXISTS (SELECT 1 FROM "
                         f"jsonb_array_elements({j} -> 'leases') x WHERE jsonb_typeof(x) <> 'string')))) LIMIT 1", p)
        if bad:
            raise MalformedStoreData("a sample event's keys or leases")
        rows = tx.execute(f"SELECT e.seq, e.created, k.i - 1, k.v #>> '{{}}', ({j} ? 'leases'), jsonb_typeof(k.v) "
                          f"FROM {e} e, jsonb_array_elements({j} -> 'keys') WITH ORDINALITY AS k(v, i) "
                          "WHERE e.kind = 'sample' AND e.seq > :a AND e.seq <= :b ORDER BY e.seq, k.i", p)
        if any(r[5] != "string" for r in rows):
            raise MalformedStoreData("a sample event's keys")
        return [tuple(r[:5]) for r in rows]

    def update_rows(self, tx: Transaction, after: int, upto: int, *, sql_json: bool = True) -> list[tuple[Any, ...]]:
        """``(seq, created, key, lease, rollouts, scored, min, max, sum, sum of squares, total cost)`` per
        ``update`` event in ``(after, upto]`` (min and max of the scored rewards, ``None`` when none is scored;
        an unscored cost counts 0).

        PostgreSQL aggregates in SQL; from SQLite the reward and cost arrays come as compact JSON text that
        numpy parses and aggregates in one pass (faster than SQLite's ``json_each`` with ``GROUP BY``)."""
        if not sql_json:
            return self._python_rows(tx, after, upto)[1]
        p, e = {"a": after, "b": upto}, self.tables.events
        if self.dialect == "sqlite":
            # the last column flags a field of the wrong type (the arrays' items are checked as numpy parses them)
            raw = tx.execute("SELECT seq, created, json_extract(payload, '$.key'), json_extract(payload, '$.lease'), "
                             "json_extract(payload, '$.rewards'), json_extract(payload, '$.costs'), "
                             "json_type(payload, '$.key') IS NOT 'text' OR json_type(payload, '$.lease') NOT IN "
                             "('text', 'null') OR json_type(payload, '$.rewards') IS NOT 'array' OR "
                             "json_type(payload, '$.costs') NOT IN ('array', 'null') "
                             f"FROM {e} WHERE kind = 'update' AND seq > :a AND seq <= :b ORDER BY seq", p)
            if any(r[6] for r in raw):
                raise MalformedStoreData("an update event's field of the wrong type")
            return _aggregate_updates([r[:6] for r in raw])
        j = "e.payload::jsonb"
        costs = f"CASE WHEN jsonb_typeof({j} -> 'costs') = 'array' THEN {j} -> 'costs' ELSE '[]'::jsonb END"
        raw = tx.execute(f"SELECT e.seq, e.created, {j} ->> 'key', {j} ->> 'lease', "
                         f"jsonb_array_length({j} -> 'rewards'), COUNT(r.x), MIN(r.x), MAX(r.x), "
                         "COALESCE(SUM(r.x), 0), COALESCE(SUM(r.x * r.x), 0), "
                         f"(SELECT COALESCE(SUM(c::text::float8), 0) FROM jsonb_array_elements({costs}) c "
                         "WHERE jsonb_typeof(c) <> 'null'), "
                         f"jsonb_typeof({j} -> 'key'), jsonb_typeof({j} -> 'lease'), jsonb_typeof({j} -> 'rewards'), "
                         f"jsonb_typeof({j} -> 'costs'), COUNT(*) FILTER (WHERE r.t NOT IN ('number', 'null')), "
                         f"(SELECT COUNT(*) FROM jsonb_array_elements({costs}) c "
                         "WHERE jsonb_typeof(c) NOT IN ('number', 'null')) "
                         f"FROM {e} e LEFT JOIN LATERAL (SELECT jsonb_typeof(v) AS t, CASE WHEN jsonb_typeof(v) = "
                         "'number' THEN v::text::float8 END AS x FROM jsonb_array_elements(CASE WHEN "
                         f"jsonb_typeof({j} -> 'rewards') = 'array' THEN {j} -> 'rewards' ELSE '[]'::jsonb END) v) r "
                         "ON TRUE WHERE e.kind = 'update' AND e.seq > :a AND e.seq <= :b GROUP BY e.seq "
                         "ORDER BY e.seq", p)
        if any(r[15] or r[16] for r in raw) or not self._types_ok(
                [r[11:15] for r in raw], ("text", "opt_text", "array", "opt_array")):
            raise MalformedStoreData("an update event's field of the wrong type")
        return [tuple(r[:11]) for r in raw]

    def discard_rows(self, tx: Transaction, after: int, upto: int, *, sql_json: bool = True) -> list[tuple[Any, ...]]:
        """``(seq, created, key, lease, reason, reclaimed)`` per ``discard`` event in ``(after, upto]``."""
        if not sql_json:
            return self._python_rows(tx, after, upto)[2]
        p, e = {"a": after, "b": upto}, self.tables.events
        if self.dialect == "sqlite":
            raw = tx.execute("SELECT seq, created, json_extract(payload, '$.key'), json_extract(payload, '$.lease'), "
                             "json_extract(payload, '$.reason'), COALESCE(json_extract(payload, '$.reclaimed'), 0), "
                             "json_type(payload, '$.key'), json_type(payload, '$.lease'), "
                             "json_type(payload, '$.reason'), json_type(payload, '$.reclaimed') "
                             f"FROM {e} WHERE kind = 'discard' AND seq > :a AND seq <= :b ORDER BY seq", p)
        else:
            j = "payload::jsonb"
            raw = tx.execute(f"SELECT seq, created, {j} ->> 'key', {j} ->> 'lease', {j} ->> 'reason', "
                             f"COALESCE(({j} -> 'reclaimed') = 'true'::jsonb, false), jsonb_typeof({j} -> 'key'), "
                             f"jsonb_typeof({j} -> 'lease'), jsonb_typeof({j} -> 'reason'), "
                             f"jsonb_typeof({j} -> 'reclaimed') "
                             f"FROM {e} WHERE kind = 'discard' AND seq > :a AND seq <= :b ORDER BY seq", p)
        if not self._types_ok([r[6:10] for r in raw], ("text", "opt_text", "opt_text", "opt_bool")):
            raise MalformedStoreData("a discard event's field of the wrong type")
        return [tuple(r[:6]) for r in raw]

    def _types_ok(self, types: list[tuple[Any, ...]], sorts: tuple[str, ...]) -> bool:
        """Whether every row of JSON type names has, column by column, a type the field's sort allows."""
        allowed = [JSON_TYPES[self.dialect][s] for s in sorts]
        return all(t in a for row in types for t, a in zip(row, allowed, strict=True))

    def _python_rows(self, tx: Transaction, after: int, upto: int) -> tuple[list[Any], list[Any], list[Any]]:
        """The rows of :meth:`sample_rows`, :meth:`update_rows` and :meth:`discard_rows`, parsed and checked in
        Python (:func:`~envsched.store.schema.check_event`); the first malformed event is named."""
        samples, updates, discards = [], [], []
        for seq, kind, created, payload in self.event_payload_rows(tx, after, upto):
            try:
                data = check_event(kind, created, payload)
            except ValueError as exc:
                raise MalformedStoreData(f"event {seq} ({kind}): {exc}",
                                         seq=int(seq) if is_int(seq, numpy=False) else None) from None
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
            else:
                discards.append((seq, created, data["key"], data.get("lease"), data.get("reason"),
                                 bool(data.get("reclaimed") or False)))
        return samples, updates, discards

    # ------------------------------------------------------------------ leases
    def lease_row(self, tx: Transaction, lease: str) -> tuple[Any, ...] | None:
        """``(key, issued_seq, closed_seq, outcome)`` of a lease as stored, or ``None``."""
        rows = tx.execute(f"SELECT key, issued_seq, closed_seq, outcome FROM {self.tables.leases} WHERE lease = :l",
                          {"l": lease})
        return tuple(rows[0]) if rows else None

    def lease_rows(self, tx: Transaction, ids: Sequence[str]) -> list[tuple[Any, ...]]:
        """``(lease, key, issued_seq, closed_seq, outcome)`` of the leases among ``ids`` the store issued."""
        out: list[tuple[Any, ...]] = []
        for names, marks in _chunks(ids, 500, "l"):
            out += tx.execute(f"SELECT lease, key, issued_seq, closed_seq, outcome FROM {self.tables.leases} "
                              f"WHERE lease IN ({marks})", names)
        return out

    def issued(self, tx: Transaction, ids: Sequence[str]) -> set[str]:
        """The ids among ``ids`` that the store issued."""
        out: set[str] = set()
        for names, marks in _chunks(ids, 500, "l"):
            out.update(str(r[0]) for r in tx.execute(f"SELECT lease FROM {self.tables.leases} WHERE lease IN "
                                                     f"({marks})", names))
        return out

    def issued_seqs(self, tx: Transaction, ids: Sequence[str]) -> dict[str, int]:
        """``lease -> issued_seq`` of the leases among ``ids`` the store issued."""
        out: dict[str, int] = {}
        for names, marks in _chunks(ids, 500, "l"):
            for lease, issued in tx.execute(f"SELECT lease, issued_seq FROM {self.tables.leases} WHERE lease IN "
                                            f"({marks})", names):
                if not is_int(issued, numpy=False):
                    raise MalformedStoreData(f"lease {quote(lease)} has the issuing event {quote(issued)}, expected "
                                             "an event number (damaged store)")
                out[str(lease)] = int(issued)
        return out

    def open_leases(self, tx: Transaction) -> list[tuple[str, str]]:
        """``(lease, key)`` of every lease not yet consumed, oldest first."""
        return [(str(a), str(b)) for a, b in tx.execute(
            f"SELECT lease, key FROM {self.tables.leases} WHERE closed_seq IS NULL ORDER BY issued_seq, lease")]

    def all_lease_rows(self, tx: Transaction) -> list[tuple[Any, ...]]:
        """``(lease, key, issued_seq, closed_seq, outcome)`` of every lease."""
        return tx.execute(f"SELECT lease, key, issued_seq, closed_seq, outcome FROM {self.tables.leases}")

    def lease_counts(self, tx: Transaction, *, missing_table_ok: bool = False) -> dict[str, int]:
        """Leases by state: ``open`` and each outcome (with ``missing_table_ok``, zeros for a store without a
        lease table; otherwise the missing table is the driver's error).
        :class:`~envsched.store.schema.MalformedStoreData` for an outcome the format does not have."""
        out = {"open": 0, **{o: 0 for o in OUTCOMES}}
        if missing_table_ok and not self.table_exists(tx, self.tables.leases):
            return out
        for outcome, count in tx.execute(f"SELECT outcome, COUNT(*) FROM {self.tables.leases} GROUP BY outcome"):
            name = "open" if outcome is None else outcome
            if name not in out:
                raise MalformedStoreData(f"a lease has the outcome {quote(outcome)}, expected "
                                         f"{', '.join(OUTCOMES[:-1])} or {OUTCOMES[-1]} (damaged store)")
            out[name] = int(count)
        return out

    # ------------------------------------------------------------------ versions
    def lease_table_required(self, tx: Transaction, meta: Mapping[str, Any]) -> bool:
        """Whether the lease table must be there: the store was created with one, or its events name leases.
        A store without the table for which this is false was written before leases existed."""
        return bool(meta.get("lease_table")) or self.events_name_leases(tx)

    def pending_upgrades(self, tx: Transaction, meta: Mapping[str, Any]) -> list[Upgrade]:
        """The :data:`UPGRADES` a store with metadata ``meta`` still lacks (the next writer makes them)."""
        out = []
        if HEAD_KEY not in meta and self.last_event(tx)[0] > 0:
            out.append(UPGRADES[0])
        if not self.table_exists(tx, self.tables.leases) and not self.lease_table_required(tx, meta):
            out.append(UPGRADES[1])
        return out


# ---------------------------------------------------------------------------------------------- aggregation
def _json_numbers(texts: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Flat values and per-row lengths of compact JSON arrays of numbers and nulls (``None``: no array);
    null becomes NaN. ``ValueError`` when an item is anything else (numpy cannot parse it as a number)."""
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
    """``(seq, created, key, lease, rewards JSON, costs JSON)`` rows -> the rows of
    :meth:`StoreQueries.update_rows`. :class:`~envsched.store.schema.MalformedStoreData` when an array holds
    anything but finite numbers and nulls (``NaN`` is how null is parsed, so a number must also be finite)."""
    if not rows:
        return []
    seq, created, key, lease, rewards, costs = zip(*rows, strict=True)
    try:
        vals, lens = _json_numbers(list(rewards))
        cvals, clens = _json_numbers(list(costs))
    except ValueError:
        raise MalformedStoreData("an update's rewards or costs hold something other than numbers and null") from None
    if np.isinf(vals).any() or np.isinf(cvals).any():
        raise MalformedStoreData("an update's reward or cost is not finite")
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
