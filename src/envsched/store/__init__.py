"""Durable scheduler state: an append-only history of dispatches and updates, and samplers rebuilt from it.

See ``docs/durability.md``. ``HistoryStore`` keeps the log (SQLite file, or PostgreSQL via the
``postgres`` extra), whose format -- tables, payloads, version, upgrades -- and every read are in
:mod:`envsched.store.schema`; ``DurableSampler`` wraps any sampler so that every call is logged before it is
acknowledged and the sampler can be rebuilt exactly after a crash.
"""

from envsched.store.durable import (
    DurableSampler,
    LeaseConflictError,
    LeaseExpiredError,
    ReplayDivergenceError,
    UnknownLeaseError,
    describe_sampler,
    tasks_fingerprint,
)
from envsched.store.history import (
    STORE_FORMAT,
    Event,
    HistoryStore,
    Snapshot,
    StoreCorruptError,
    StoreError,
    StoreMismatchError,
    canonical_json,
)

__all__ = [
    "STORE_FORMAT",
    "DurableSampler",
    "Event",
    "HistoryStore",
    "LeaseConflictError",
    "LeaseExpiredError",
    "ReplayDivergenceError",
    "Snapshot",
    "StoreCorruptError",
    "StoreError",
    "StoreMismatchError",
    "UnknownLeaseError",
    "canonical_json",
    "describe_sampler",
    "tasks_fingerprint",
]
