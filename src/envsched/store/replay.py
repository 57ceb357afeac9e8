"""Rebuilding a sampler from its store: load a snapshot, replay the events after it, check every replayed draw.

:class:`ReplayMixin` is the replay half of :class:`~envsched.store.DurableSampler`: it reads the attributes
the sampler keeps (``store``, ``sampler``, ``group_size``, ``_store_id``, ``_seq``, ``_digest``, ...) and
changes only the wrapped sampler's state and the replay position. A full replay (from the initial snapshot)
also audits the lease table against the events: each lease issued once and consumed at most once.
"""

from __future__ import annotations

from typing import Any

from envsched.pool.spec import task_key
from envsched.store.errors import StoreCorruptError, StoreError
from envsched.store.schema import Event, Payload, genesis_digest

__all__ = ["ReplayDivergenceError", "ReplayMixin"]

_REPLAY_CHUNK = 5000


class ReplayDivergenceError(StoreError):
    """Replaying the log did not reproduce it: a replayed draw differs from the logged one, or a logged
    update is refused. The sampler is not deterministic given its state, or the code changed."""


class ReplayMixin:
    """Snapshot loading, event replay and the lease audit of a DurableSampler (see the module docstring)."""

    store: Any
    sampler: Any
    group_size: int | None
    _store_id: str
    _seq: int
    _digest: str
    _replayed: int
    _stale: bool
    _broken: str | None
    _audit: dict[str, list[Any]] | None

    def _rebuild(self, tx: Any, *, latest: bool) -> None:
        snap = self.store.read_snapshot(tx, latest=latest)
        genesis = genesis_digest(self._store_id)
        if snap.seq == 0:
            if snap.digest != genesis:
                raise StoreCorruptError(f"store {self.store.where}: the initial snapshot does not belong to "
                                        "this store (damaged or copied from another store)")
        elif self.store.digest_at(tx, snap.seq) is None:
            last = self.store.last_event(tx)[0]
            raise StoreCorruptError(f"store {self.store.where}: the event log ends at event {last}, but a snapshot "
                                    f"refers to event {snap.seq}: events at the end of the log were removed; "
                                    "restore the store from a backup")
        elif self.store.digest_at(tx, snap.seq) != snap.digest:
            raise StoreCorruptError(f"store {self.store.where}: the snapshot after event {snap.seq} does not "
                                    "match the event log (damaged store)")
        try:
            self.sampler.load_state_dict(snap.state)
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreCorruptError(f"store {self.store.where}: the snapshot after event {snap.seq} cannot be "
                                    f"loaded into {type(self.sampler).__name__}: {exc}") from None
        self._seq, self._digest = snap.seq, snap.digest
        self._replayed = 0
        self._audit = {} if snap.seq == 0 else None  # a full replay checks the lease index against the events
        try:
            self._catch_up(tx)
            self.store.check_head(tx, self._seq, self._digest)
            self.store.check_tail(tx, self._seq)
            if self._audit is not None and self.store.has_lease_table(tx):
                self._check_lease_index(tx, self._audit)
        finally:
            self._audit = None
        self._stale = False

    def _audit_event(self, ev: Event) -> None:
        """Follow the leases the events name (full replay): each is issued once and consumed at most once."""
        audit = self._audit
        if audit is None:
            return
        p = Payload(ev.payload)
        if ev.kind == "sample":
            for lid, key in zip(p.leases, p.task_keys, strict=False):
                if lid in audit:
                    raise StoreCorruptError(f"store {self.store.where}: lease {lid} is issued twice (events "
                                            f"{audit[lid][1]} and {ev.seq})")
                audit[lid] = [key, ev.seq, None, None]
            return
        lid = p.lease
        if lid is None:
            return
        row = audit.get(lid)
        if row is None or row[0] != p.key:
            raise StoreCorruptError(f"store {self.store.where}: event {ev.seq} ({ev.kind}) names lease {lid}, "
                                    f"which no earlier draw of task {p.key!r} issued")
        if row[2] is not None:
            raise StoreCorruptError(f"store {self.store.where}: lease {lid} is consumed twice (events {row[2]} "
                                    f"and {ev.seq}): a duplicated {ev.kind}")
        row[2] = ev.seq
        row[3] = "update" if ev.kind == "update" else ("reclaim" if p.reclaimed else "discard")

    def _check_lease_index(self, tx: Any, audit: dict[str, list[Any]]) -> None:
        table = self.store.all_leases(tx)
        if set(table) != set(audit):
            extra = sorted(set(table) - set(audit))[:3]
            missing = sorted(set(audit) - set(table))[:3]
            raise StoreCorruptError(f"store {self.store.where}: the lease table does not match the events "
                                    f"(rows without a draw: {extra}; drawn leases without a row: {missing})")
        for lid, row in audit.items():
            if tuple(row) != table[lid]:
                raise StoreCorruptError(f"store {self.store.where}: lease {lid} is {table[lid]} in the lease "
                                        f"table but {tuple(row)} by the events")

    def _catch_up(self, tx: Any) -> None:
        while True:
            events = self.store.read_events(tx, self._seq, self._digest, limit=_REPLAY_CHUNK)
            for ev in events:
                self._replay(ev)
                self._audit_event(ev)
                self._seq, self._digest = ev.seq, ev.digest
                self._replayed += 1
            if len(events) < _REPLAY_CHUNK:
                return

    def _replay(self, ev: Event) -> None:
        p = Payload(ev.payload)
        try:
            if ev.kind == "sample":
                got = [task_key(t) for t in self.sampler.sample(p.n)]
                if got != p.task_keys:
                    raise ReplayDivergenceError(
                        f"store {self.store.where}: replaying event {ev.seq} (sample n={p.n}) drew "
                        f"{got[:8]} but the log holds {p.task_keys[:8]}: {type(self.sampler).__name__} did not "
                        "reproduce its logged draws (non-deterministic sampler, or its code changed)")
            elif ev.kind == "update":
                if self.group_size is not None and len(p.rewards) != self.group_size:
                    self._broken = "replay failed"
                    raise StoreCorruptError(f"store {self.store.where}: event {ev.seq} (update) has "
                                            f"{len(p.rewards)} rewards, but the store records group_size="
                                            f"{self.group_size}: the metadata or the log was edited")
                self.sampler.update(p.key, p.rewards, p.costs)
            else:
                self.sampler.discard(p.key)
        except ReplayDivergenceError:
            self._broken = "replay diverged"
            raise
        except (KeyError, ValueError, TypeError) as exc:
            self._broken = "replay failed"
            raise ReplayDivergenceError(f"store {self.store.where}: event {ev.seq} ({ev.kind}) cannot be "
                                        f"replayed into {type(self.sampler).__name__}: {exc}") from None
