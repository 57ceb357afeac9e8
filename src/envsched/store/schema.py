"""The history store's stored format, in one place: table names and layout, metadata, event payloads, the
hash chain, the format's version and its in-place upgrades, and the read-only queries every reader runs.

This module is the only one that spells a table name or a path into an event payload. The backends
(:mod:`envsched.store.sqlite`, :mod:`envsched.store.postgresql`) connect, lock and translate driver errors;
the durable store (:mod:`envsched.store.history`) writes and verifies; readers -- the store itself,
``envsched store info`` and ``verify``, the dashboard -- read through :class:`StoreQueries` here.

**Tables** (``p`` is the table prefix, default ``envsched``; :class:`Tables`):

``p_meta``       ``(key, value)``, the value JSON: ``format`` (:data:`STORE_FORMAT`), ``store_id`` (random; the
                 start of the hash chain), ``sampler_class``, ``sampler_params``, ``pool_fingerprint``,
                 ``num_tasks``, ``tasks`` (the task list, so that a sampler can be rebuilt from the store
                 alone), ``created_at``, ``lease_table`` (``true``: created with the lease table), optional
                 ``group_size``, ``reward_range``, ``graph``, ``params_rebuildable``, and ``head``
                 (``{"seq", "digest"}`` of the last event, rewritten with every event, so a lost tail is seen).
``p_events``     ``seq`` (1, 2, 3, ... without gaps), ``kind`` (:data:`EVENT_KINDS`), ``payload`` (canonical
                 JSON, below), ``digest`` (SHA-256 of the previous digest, the kind and the payload text:
                 :func:`chain_digest`; before event 1 stands :func:`genesis_digest`) and ``created`` (Unix time).
``p_snapshots``  ``state_dict()`` of the sampler after event ``seq`` (``seq = 0``: its initial state), bound to
                 the event chain by that event's digest.
``p_leases``     one row per lease a sampler host issued: ``lease``, its task ``key``, ``issued_seq`` (the
                 ``sample`` event that issued it), ``closed_seq`` and ``outcome`` (``update``, ``discard`` or
                 ``reclaim``) once consumed. It indexes what the events record (their payloads carry the lease
                 ids, under the hash chain); a full replay checks that the two agree.

**Event payloads** (:func:`sample_payload`, :func:`update_payload`, :func:`discard_payload` write them;
:class:`Payload` reads them):

* ``sample``: ``{"n": int, "keys": [task key, ...], "leases": [lease id, ...]}`` (``leases`` only for a
  leased draw, one id per drawn group);
* ``update``: ``{"key": str, "rewards": [number or null, ...], "costs": [number, ...] or null, "lease": str}``
  (``lease`` only under a lease);
* ``discard``: ``{"key": str, "reason": str or null, "lease": str, "reclaimed": true}`` (``lease`` only
  under a lease, ``reclaimed`` only for a group whose lease expired).

**Versions.** A store records its format under ``format``; a store of any other format is refused. Format 1
received additions after its first stores were written (:data:`UPGRADES`); each is made in place by the next
writer, and a store still without one is read as it is (:meth:`StoreQueries.pending_upgrades` names them).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from envsched.errors import is_int, is_number
from envsched.store.errors import StoreCorruptError
from envsched.store.leases import OUTCOMES

__all__ = ["DIALECTS", "EVENT_KINDS", "FORMAT_VERSION", "HEAD_KEY", "PREFIX_PATTERN", "STORE_FORMAT",
           "UPGRADES", "Event", "Payload", "Snapshot", "StoreQueries", "Tables", "Transaction", "Upgrade",
           "canonical_json", "chain_digest", "check_prefix", "discard_payload", "genesis_digest",
           "loads_stored", "meta_problems", "parse_head", "sample_payload", "update_payload", "validate_meta"]

#: Version of the stored format; :data:`STORE_FORMAT` is what a store records under ``format``.
FORMAT_VERSION = 1
STORE_FORMAT = f"envsched.store/{FORMAT_VERSION}"
#: What a table prefix may be: lower-case letters, digits and ``_``, a letter first, at most 40 characters.
PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
EVENT_KINDS: tuple[str, ...] = ("sample", "update", "discard")
#: The SQL dialects the queries are written for (a backend's ``kind``).
DIALECTS: tuple[str, ...] = ("sqlite", "postgresql")
#: The metadata key of the chain's head.
HEAD_KEY = "head"
#: Metadata every store holds, with the type each must have.
REQUIRED_META: tuple[tuple[str, type], ...] = (("store_id", str), ("sampler_class", str), ("sampler_params", dict),
                                               ("pool_fingerprint", str), ("num_tasks", int))


@dataclass(frozen=True)
class Upgrade:
    """An addition to the stored format made in place: its ``name`` and what it adds."""

    name: str
    description: str


#: The additions format 1 received after its first stores were written, oldest first.
UPGRADES: tuple[Upgrade, ...] = (
    Upgrade("head", "metadata 'head', the last event's seq and digest: written with the next event; until then "
                    "a lost tail of the log cannot be detected"),
    Upgrade("lease_table", "the lease table: created by the next writer (opened read-only, it is only "
                           "reported); a store whose metadata says lease_table: true, or whose events name "
                           "leases, and that lacks the table is damaged, not old"),
)


# ---------------------------------------------------------------------------------------------- tables
def check_prefix(prefix: Any) -> str:
    """``prefix`` when it is a valid table prefix (:data:`PREFIX_PATTERN`), else ``ValueError``."""
    if not isinstance(prefix, str) or not PREFIX_PATTERN.match(prefix):
        raise ValueError(f"table_prefix must match {PREFIX_PATTERN.pattern}, got {prefix!r}")
    return prefix


@dataclass(frozen=True)
class Tables:
    """The table names of the store with table prefix ``prefix`` (checked), and their definitions."""

    prefix: str = "envsched"

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    @property
    def meta(self) -> str:
        return f"{self.prefix}_meta"

    @property
    def events(self) -> str:
        return f"{self.prefix}_events"

    @property
    def snapshots(self) -> str:
        return f"{self.prefix}_snapshots"

    @property
    def leases(self) -> str:
        return f"{self.prefix}_leases"

    def names(self) -> tuple[str, str, str, str]:
        """The four names: meta, events, snapshots, leases."""
        return self.meta, self.events, self.snapshots, self.leases

    def create_statements(self) -> list[str]:
        """``CREATE TABLE IF NOT EXISTS`` of every table (the same text for both dialects)."""
        return [
            f"CREATE TABLE IF NOT EXISTS {self.meta} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.events} (seq BIGINT PRIMARY KEY, kind TEXT NOT NULL, "
            "payload TEXT NOT NULL, digest TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.snapshots} (seq BIGINT PRIMARY KEY, state TEXT NOT NULL, "
            "digest TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)",
            self.lease_table_statement(),
        ]

    def lease_table_statement(self) -> str:
        """The lease table's definition (also the ``lease_table`` upgrade of an older store)."""
        return (f"CREATE TABLE IF NOT EXISTS {self.leases} (lease TEXT PRIMARY KEY, key TEXT NOT NULL, "
                "issued_seq BIGINT NOT NULL, closed_seq BIGINT, outcome TEXT)")


# ---------------------------------------------------------------------------------------------- values
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


def chain_digest(prev: str, kind: str, payload: str) -> str:
    """The digest of an event: SHA-256 over the previous digest, the kind and the payload text."""
    h = hashlib.sha256()
    for part in (prev, kind, payload):
        h.update(part.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def genesis_digest(store_id: str) -> str:
    """Digest that precedes event 1 (derived from the store's random id)."""
    return hashlib.sha256(f"envsched-store:{store_id}".encode()).hexdigest()


def loads_stored(text: Any, what: str) -> Any:
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


# ---------------------------------------------------------------------------------------------- metadata
def meta_problems(meta: Mapping[str, Any]) -> list[str]:
    """What is wrong with the optional metadata values (each a short phrase); empty when all is well."""
    out: list[str] = []
    gs = meta.get("group_size")
    if gs is not None and not (is_int(gs) and 1 <= gs <= 1_000_000):
        out.append(f"'group_size' is {str(gs)[:40]!r} ({type(gs).__name__}), expected a positive integer or null")
    if meta["num_tasks"] < 0:
        out.append(f"'num_tasks' is {meta['num_tasks']}, expected a count >= 0")
    rr = meta.get("reward_range")
    if rr is not None and not (isinstance(rr, list) and len(rr) == 2
                               and all(is_number(x) and math.isfinite(x) for x in rr) and rr[0] < rr[1]):
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


def validate_meta(meta: Mapping[str, Any], where: str) -> None:
    """Refuse metadata of another format, without a required key, or of the wrong shape, before anything
    reads it (a crafted store is data only): :class:`StoreCorruptError` naming the key."""
    if meta.get("format") != STORE_FORMAT:
        raise StoreCorruptError(f"store {where} has format {meta.get('format')!r}, expected {STORE_FORMAT!r}")
    for key, _ in REQUIRED_META:
        if key not in meta:
            raise StoreCorruptError(f"store {where}: metadata lacks {key!r} (damaged store)")
    for key, kinds in REQUIRED_META:
        value = meta[key]
        if not (is_int(value) if kinds is int else isinstance(value, kinds)):
            raise StoreCorruptError(f"store {where}: metadata {key!r} is a {type(value).__name__}, "
                                    f"expected {kinds.__name__} (damaged or crafted store)")
    problems = meta_problems(meta)
    if problems:
        raise StoreCorruptError(f"store {where}: metadata {problems[0]} (damaged or crafted store)")
    head = meta.get(HEAD_KEY)
    if head is not None and not (isinstance(head, dict) and is_int(head.get("seq")) and head["seq"] >= 0
                                 and isinstance(head.get("digest"), str)):
        raise StoreCorruptError(f"store {where}: metadata 'head' is malformed (damaged store)")


def head_value(seq: int, digest: str) -> dict[str, Any]:
    """The ``head`` metadata value for the chain ending at event ``seq`` with ``digest``."""
    return {"seq": int(seq), "digest": digest}


def parse_head(text: Any, where: str) -> tuple[int, str]:
    """``(seq, digest)`` of a stored ``head`` value; :class:`StoreCorruptError` when it is malformed."""
    try:
        head = loads_stored(text, f"store {where}: metadata 'head'")
        return int(head["seq"]), str(head["digest"])
    except (TypeError, ValueError, KeyError, StoreCorruptError):
        raise StoreCorruptError(f"store {where}: metadata 'head' is malformed (damaged store)") from None


# ---------------------------------------------------------------------------------------------- payloads
def sample_payload(n: int, keys: Sequence[str], leases: Sequence[str] | None = None) -> dict[str, Any]:
    """The payload of a ``sample`` event: ``n`` groups drawn, their task keys, and their leases if any."""
    out: dict[str, Any] = {"n": int(n), "keys": list(keys)}
    if leases is not None:
        out["leases"] = leases
    return out


def update_payload(key: str, rewards: Sequence[float | None], costs: Sequence[float] | None,
                   lease: str | None = None) -> dict[str, Any]:
    """The payload of an ``update`` event (rewards as floats or null, costs as floats or null)."""
    out: dict[str, Any] = {"key": key, "rewards": [None if r is None else float(r) for r in rewards],
                           "costs": None if costs is None else [float(c) for c in costs]}
    if lease is not None:
        out["lease"] = lease
    return out


def discard_payload(key: str, reason: str | None, lease: str | None = None,
                    reclaimed: bool = False) -> dict[str, Any]:
    """The payload of a ``discard`` event."""
    out: dict[str, Any] = {"key": key, "reason": reason}
    if lease is not None:
        out["lease"] = lease
    if reclaimed:
        out["reclaimed"] = True
    return out


def _field(name: str, doc: str, *, required: bool = True) -> property:
    """A :class:`Payload` property reading field ``name`` when asked (a missing optional field is ``None``)."""
    if required:
        return property(lambda self: self.data[name], doc=doc)
    return property(lambda self: self.data.get(name), doc=doc)


class Payload:
    """An event payload's fields by name. A required field is read when asked, so a payload missing it raises
    ``KeyError`` then (as a lookup in the dict would); optional fields have their default."""

    __slots__ = ("data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data

    n = _field("n", "``sample``: the number of groups drawn.")
    task_keys = _field("keys", "``sample``: the drawn groups' task keys.")
    key = _field("key", "``update``/``discard``: the task's key.")
    lease = _field("lease", "``update``/``discard``: the lease consumed (``None`` without one).", required=False)
    rewards = _field("rewards", "``update``: one reward per rollout (``None`` for an unscored one).")
    costs = _field("costs", "``update``: one cost per rollout, or ``None``.")
    reason = _field("reason", "``discard``: why the group was given back (``None`` when not said).",
                    required=False)

    @property
    def leases(self) -> Any:
        """``sample``: the drawn groups' lease ids (empty for a draw without leases)."""
        return self.data.get("leases") or []

    @property
    def reclaimed(self) -> bool:
        """``discard``: whether the group was reclaimed because its lease expired."""
        return bool(self.data.get("reclaimed", False))

    def logged_group(self) -> tuple[Any, Any]:
        """``update``: ``(rewards, costs)`` as logged (``None`` for a field that is missing)."""
        return self.data.get("rewards"), self.data.get("costs")


# ---------------------------------------------------------------------------------------------- reading
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
    """Every read of a store, for one store's :class:`Tables` in one SQL ``dialect`` (``"sqlite"`` or
    ``"postgresql"``). Each method takes a :class:`Transaction` and only reads; decoding and checking what
    was read is the caller's (the durable store verifies the chain, a watcher shows what was committed).

    The rows of :meth:`sample_rows`, :meth:`update_rows` and :meth:`discard_rows` are extracted by the
    database itself (SQLite's JSON1 functions, PostgreSQL's ``jsonb``) unless ``sql_json=False`` is given,
    which parses the payloads in Python (any backend; the reference the two are compared with).
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
        task, in order (values the task does not have are ``None``)."""
        n, meta = int(instruction_chars), self.tables.meta
        if sql_json and self.dialect == "sqlite":
            return tx.execute(f"SELECT json_extract(j.value, '$.id'), json_extract(j.value, '$.split'), "
                              f"json_extract(j.value, '$.index'), json_extract(j.value, '$.env'), "
                              f"substr(json_extract(j.value, '$.instruction'), 1, {n}) FROM {meta} m, "
                              "json_each(m.value) j WHERE m.key = 'tasks' ORDER BY j.key")
        if sql_json:
            return tx.execute(f"SELECT t->>'id', t->>'split', t->>'index', t->>'env', left(t->>'instruction', {n}) "
                              f"FROM {meta} m, jsonb_array_elements(m.value::jsonb) WITH ORDINALITY AS a(t, i) "
                              "WHERE m.key = 'tasks' ORDER BY i")
        raw = tx.execute(f"SELECT value FROM {meta} WHERE key = 'tasks'")
        data = json.loads(raw[0][0]) if raw else []
        return [(t.get("id"), t.get("split"), t.get("index"), t.get("env"),
                 t.get("instruction")[:n] if isinstance(t.get("instruction"), str) else None)
                for t in data if isinstance(t, dict)]

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

    def sample_rows(self, tx: Transaction, after: int, upto: int, *, sql_json: bool = True) -> list[tuple[Any, ...]]:
        """``(seq, created, position in the draw, task key, drawn under a lease)`` per drawn group of the
        ``sample`` events in ``(after, upto]``."""
        if not sql_json:
            return self._python_rows(tx, after, upto)[0]
        p, e = {"a": after, "b": upto}, self.tables.events
        if self.dialect == "sqlite":
            return tx.execute(f"SELECT e.seq, e.created, j.key, j.value, json_type(e.payload, '$.leases') IS NOT "
                              f"NULL FROM {e} e, json_each(e.payload, '$.keys') j WHERE e.kind = 'sample' AND "
                              "e.seq > :a AND e.seq <= :b ORDER BY e.seq, j.key", p)
        return tx.execute(f"SELECT e.seq, e.created, k.i - 1, k.v, (e.payload::jsonb ? 'leases') FROM {e} e, "
                          "jsonb_array_elements_text(e.payload::jsonb -> 'keys') WITH ORDINALITY AS k(v, i) "
                          "WHERE e.kind = 'sample' AND e.seq > :a AND e.seq <= :b ORDER BY e.seq, k.i", p)

    def update_rows(self, tx: Transaction, after: int, upto: int, *, sql_json: bool = True) -> list[tuple[Any, ...]]:
        """``(seq, created, key, lease, rollouts, scored, min, max, sum, sum of squares, total cost)`` per
        ``update`` event in ``(after, upto]`` (min and max of the scored rewards, ``None`` when none is scored).

        PostgreSQL aggregates in SQL; from SQLite the reward and cost arrays come as compact JSON text that
        numpy parses and aggregates in one pass (faster than SQLite's ``json_each`` with ``GROUP BY``)."""
        if not sql_json:
            return self._python_rows(tx, after, upto)[1]
        p, e = {"a": after, "b": upto}, self.tables.events
        if self.dialect == "sqlite":
            return _aggregate_updates(tx.execute(
                "SELECT seq, created, json_extract(payload, '$.key'), json_extract(payload, '$.lease'), "
                "json_extract(payload, '$.rewards'), json_extract(payload, '$.costs') "
                f"FROM {e} WHERE kind = 'update' AND seq > :a AND seq <= :b ORDER BY seq", p))
        return tx.execute(f"SELECT e.seq, e.created, e.payload::jsonb ->> 'key', e.payload::jsonb ->> 'lease', "
                          "jsonb_array_length(e.payload::jsonb -> 'rewards'), COUNT(r.x), MIN(r.x), MAX(r.x), "
                          "COALESCE(SUM(r.x), 0), COALESCE(SUM(r.x * r.x), 0), "
                          "(SELECT COALESCE(SUM(c::text::float8), 0) FROM jsonb_array_elements(CASE WHEN "
                          "jsonb_typeof(e.payload::jsonb -> 'costs') = 'array' THEN e.payload::jsonb -> 'costs' "
                          "ELSE '[]'::jsonb END) c) "
                          f"FROM {e} e LEFT JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(v) = 'number' THEN "
                          "v::text::float8 END AS x FROM jsonb_array_elements(e.payload::jsonb -> 'rewards') v) r "
                          "ON TRUE WHERE e.kind = 'update' AND e.seq > :a AND e.seq <= :b GROUP BY e.seq "
                          "ORDER BY e.seq", p)

    def discard_rows(self, tx: Transaction, after: int, upto: int, *, sql_json: bool = True) -> list[tuple[Any, ...]]:
        """``(seq, created, key, lease, reason, reclaimed)`` per ``discard`` event in ``(after, upto]``."""
        if not sql_json:
            return self._python_rows(tx, after, upto)[2]
        p, e = {"a": after, "b": upto}, self.tables.events
        if self.dialect == "sqlite":
            return tx.execute(f"SELECT seq, created, json_extract(payload, '$.key'), json_extract(payload, '$.lease'), "
                              "json_extract(payload, '$.reason'), COALESCE(json_extract(payload, '$.reclaimed'), 0) "
                              f"FROM {e} WHERE kind = 'discard' AND seq > :a AND seq <= :b ORDER BY seq", p)
        return tx.execute(f"SELECT seq, created, payload::jsonb ->> 'key', payload::jsonb ->> 'lease', "
                          "payload::jsonb ->> 'reason', COALESCE((payload::jsonb ->> 'reclaimed')::boolean, false) "
                          f"FROM {e} WHERE kind = 'discard' AND seq > :a AND seq <= :b ORDER BY seq", p)

    def _python_rows(self, tx: Transaction, after: int, upto: int) -> tuple[list[Any], list[Any], list[Any]]:
        """The rows of :meth:`sample_rows`, :meth:`update_rows` and :meth:`discard_rows`, parsed in Python."""
        samples, updates, discards = [], [], []
        for seq, kind, created, payload in self.event_payload_rows(tx, after, upto):
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
            out.update({str(a): int(b) for a, b in tx.execute(
                f"SELECT lease, issued_seq FROM {self.tables.leases} WHERE lease IN ({marks})", names)})
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
        lease table; otherwise the missing table is the driver's error)."""
        out = {"open": 0, **{o: 0 for o in OUTCOMES}}
        if missing_table_ok and not self.table_exists(tx, self.tables.leases):
            return out
        for outcome, count in tx.execute(f"SELECT outcome, COUNT(*) FROM {self.tables.leases} GROUP BY outcome"):
            out["open" if outcome is None else str(outcome)] = int(count)
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
    null becomes NaN."""
    lens = np.fromiter((t.count(",") + 1 if isinstance(t, str) and len(t) > 2 else 0 for t in texts),
                       dtype=np.int64, count=len(texts))
    body = ",".join(t[1:-1] for t in texts if isinstance(t, str) and len(t) > 2)
    vals = np.array(body.replace("null", "nan").split(","), dtype=np.float64) if body else np.zeros(0)
    if vals.size != lens.sum():  # pragma: no cover - only for arrays SQLite did not write compactly
        raise StoreCorruptError("an update's rewards are not a flat JSON array of numbers")
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
    :meth:`StoreQueries.update_rows`."""
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
