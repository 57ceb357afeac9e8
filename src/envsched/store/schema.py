"""The history store's stored format, in one place: table names and layout, metadata, event payloads and
what each field may hold, the hash chain, the format's version and its in-place upgrades.

This module and :mod:`envsched.store.queries` (every read of the format, in SQL for both dialects) are the
only ones that spell a table name or a path into an event payload (``tests/store/test_schema.py`` checks it).
The backends (:mod:`envsched.store.sqlite`, :mod:`envsched.store.postgresql`) connect, lock and translate
driver errors; the durable store (:mod:`envsched.store.history`) writes and verifies; readers -- the store
itself, ``envsched store info`` and ``verify``, the dashboard -- read through
:class:`~envsched.store.queries.StoreQueries`.

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
writer, and a store still without one is read as it is (``StoreQueries.pending_upgrades`` names them).

**Checks.** A store is data anyone may hand over: :func:`validate_meta` refuses metadata of the wrong shape,
:func:`check_event` an event whose fields are not of the types above (one line naming the field), and
:func:`event_head_problem` an event numbered out of order, of an unknown kind or without a finite time;
a read that finds such a value raises :class:`MalformedStoreData`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from envsched.store.errors import StoreCorruptError
from envsched.validation import is_int, is_number

__all__ = ["DIALECTS", "EVENT_KINDS", "FORMAT_VERSION", "HEAD_KEY", "PREFIX_PATTERN", "STORE_FORMAT",
           "UPGRADES", "Event", "MalformedStoreData", "Payload", "Snapshot", "Tables", "Upgrade", "canonical_json",
           "chain_digest", "check_event", "check_prefix", "discard_payload", "event_head_problem",
           "finite_or_null", "genesis_digest", "loads_stored", "meta_problems", "parse_head", "quote",
           "sample_payload", "type_name", "update_payload", "validate_meta"]

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
_TYPE_WORDS = {str: "a string", dict: "an object", int: "an integer"}


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


# ---------------------------------------------------------------------------------------------- messages
#: How many characters of a refused value a message quotes.
QUOTE_CHARS = 60


class MalformedStoreData(StoreCorruptError):
    """A value read from a store is not what the format allows (a damaged or crafted store). The message is a
    phrase without the store's name (the reader, which knows it, adds it); ``seq`` is the event it concerns
    when known (``None``: the read found something off without naming the event)."""

    def __init__(self, detail: str, *, seq: int | None = None) -> None:
        super().__init__(detail)
        self.detail, self.seq = detail, seq


def quote(value: Any) -> str:
    """``repr(value)``, cut to :data:`QUOTE_CHARS` characters (a message quotes a refused value, never all of it)."""
    text = repr(value)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "..."


def type_name(value: Any) -> str:
    """What a JSON ``value`` is, for a message: ``null``, ``a boolean``, ``the number 5``, ``a string ('abc')``,
    ``a list of 2 ([1, 2])``, ``an object``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if is_number(value, numpy=False):
        return f"the number {quote(value)}"
    if isinstance(value, str):
        return f"a string ({quote(value)})"
    if isinstance(value, list):
        return f"a list of {len(value)} ({quote(value)})"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def finite_or_null(value: Any) -> bool:
    """Whether ``value`` is a finite JSON number or null (what a reward or a cost may be)."""
    return value is None or (is_number(value, numpy=False) and math.isfinite(value))


# ---------------------------------------------------------------------------------------------- metadata
def meta_problems(meta: Mapping[str, Any]) -> list[str]:
    """What is wrong with the optional metadata values (each a short phrase); empty when all is well."""
    out: list[str] = []
    gs = meta.get("group_size")
    if gs is not None and not (is_int(gs) and 1 <= gs <= 1_000_000):
        out.append(f"'group_size' is {type_name(gs)}, expected a positive integer or null")
    if meta["num_tasks"] < 0:
        out.append(f"'num_tasks' is {meta['num_tasks']}, expected a count >= 0")
    rr = meta.get("reward_range")
    if rr is not None and not (isinstance(rr, list) and len(rr) == 2
                               and all(is_number(x) and math.isfinite(x) for x in rr) and rr[0] < rr[1]):
        out.append(f"'reward_range' is {type_name(rr)}, expected [low, high] with finite low < high")
    if "params_rebuildable" in meta and not isinstance(meta["params_rebuildable"], bool):
        out.append(f"'params_rebuildable' is {type_name(meta['params_rebuildable'])}, expected true or false")
    tasks = meta.get("tasks")
    if tasks is not None:
        if not isinstance(tasks, list):
            out.append(f"'tasks' is {type_name(tasks)}, expected a list")
        elif len(tasks) != meta["num_tasks"]:
            out.append(f"'num_tasks' says {meta['num_tasks']} but the recorded task list has {len(tasks)} tasks")
    graph = meta.get("graph")
    if graph is not None:
        if not isinstance(graph, dict):
            out.append(f"'graph' is {type_name(graph)}, expected an object")
        elif not (isinstance(graph.get("fingerprint"), str) and isinstance(graph.get("config", {}), dict)
                  and isinstance(graph.get("path"), str | type(None))
                  and is_int(graph.get("num_nodes"))):
            out.append("'graph' lacks a fingerprint, or its config, path or num_nodes has the wrong type")
    if "lease_table" in meta and not isinstance(meta["lease_table"], bool):
        out.append(f"'lease_table' is {type_name(meta['lease_table'])}, expected true or false")
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
            raise StoreCorruptError(f"store {where}: metadata {key!r} is {type_name(value)}, "
                                    f"expected {_TYPE_WORDS[kinds]} (damaged or crafted store)")
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


def _time_problem(created: Any) -> str | None:
    if is_number(created, numpy=False) and math.isfinite(created):
        return None
    return f"its time 'created' is {type_name(created)}, expected seconds since the epoch"


def event_head_problem(seq: Any, expected: int, kind: Any, created: Any) -> str | None:
    """What is wrong with the stored event found where event ``expected`` should be -- its number, kind or time
    (a phrase for a message that names the event) -- or ``None`` when nothing is."""
    if not is_int(seq, numpy=False):
        return (f"the event after event {expected - 1} has the sequence number {quote(seq)}, which is not an "
                "integer (damaged store)")
    if seq != expected:
        return (f"event {expected} is missing (the next event is {seq}): the log has a gap (damaged store; "
                "`envsched store verify` checks it)")
    if kind not in EVENT_KINDS:
        return f"event {seq} has unknown kind {quote(kind)} (a store logs {', '.join(EVENT_KINDS)})"
    problem = _time_problem(created)
    return None if problem is None else f"event {seq} ({kind}): {problem}"


def check_event(kind: Any, created: Any, payload: Any) -> dict[str, Any]:
    """The decoded payload of one stored event, after checking every field of its kind against the layout
    above; otherwise ``ValueError`` with a one-line reason that names the field (the caller adds the store and
    the event)."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown kind {quote(kind)} (a store logs {', '.join(EVENT_KINDS)})")
    problem = _time_problem(created)
    if problem is not None:
        raise ValueError(problem)
    if isinstance(payload, bytes):
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("its payload is not UTF-8 text") from None
    if not isinstance(payload, str):
        raise ValueError(f"its payload is {type_name(payload)}, expected JSON text")
    try:
        data = json.loads(payload)
    except RecursionError:
        raise ValueError("its payload is nested too deeply to be an event") from None
    except ValueError as exc:
        raise ValueError(f"its payload is not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(data, dict):
        raise ValueError(f"its payload is {type_name(data)}, expected a JSON object")

    def field(name: str, ok: Any, expected: str, *, required: bool = True) -> Any:
        if name not in data:
            if required:
                raise ValueError(f"field {name!r} is missing, expected {expected}")
            return None
        value = data[name]
        if not ok(value):
            raise ValueError(f"field {name!r} is {type_name(value)}, expected {expected}")
        return value

    def items(name: str, values: list[Any], ok: Any, expected: str) -> None:
        for i, v in enumerate(values):
            if not ok(v):
                raise ValueError(f"field {name!r}[{i}] is {type_name(v)}, expected {expected}")

    def is_list(v: Any) -> bool:
        return isinstance(v, list)

    def is_str(v: Any) -> bool:
        return isinstance(v, str)

    if kind == "sample":
        keys = field("keys", is_list, "a list of task ids")
        items("keys", keys, is_str, "a task id (a string)")
        leases = field("leases", is_list, "a list of lease ids, one per drawn task", required=False)
        if leases is not None:
            items("leases", leases, is_str, "a lease id (a string)")
            if len(leases) != len(keys):
                raise ValueError(f"field 'leases' holds {len(leases)} lease ids for {len(keys)} drawn tasks")
    else:
        field("key", is_str, "a task id (a string)")
        field("lease", lambda v: v is None or isinstance(v, str), "a lease id (a string)", required=False)
    if kind == "update":
        rewards = field("rewards", is_list, "a list of rewards (numbers or null)")
        items("rewards", rewards, finite_or_null, "a finite number or null")
        costs = field("costs", lambda v: v is None or isinstance(v, list), "a list of costs or null",
                      required=False)
        if costs is not None:
            items("costs", costs, finite_or_null, "a finite number or null")
    elif kind == "discard":
        field("reason", lambda v: v is None or isinstance(v, str), "a reason (a string) or null", required=False)
        field("reclaimed", lambda v: v is None or isinstance(v, bool), "true or false", required=False)
    return data
