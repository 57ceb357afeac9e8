"""``DurableSampler``: any envsched sampler, with every dispatch and update logged to a :class:`HistoryStore`.

The wrapped sampler's state is a pure function of its initial state and the sequence of ``sample``,
``update`` and ``discard`` calls it received (its random generator is part of the state). The wrapper
appends each call, in the order applied, to the store in the same transaction that acknowledges it; to
rebuild a sampler after a crash it loads the latest snapshot (or the initial state) and replays the events
that follow, checking that every replayed draw equals the logged one. Hence:

* an ``update`` that returned is in the store (one committed transaction per call);
* the rebuilt sampler holds every acknowledged update and makes the same next draws as a sampler that never
  crashed;
* several processes can share one store: each takes the store's lock, replays the events the others
  appended since its last call, then applies and logs its own -- one linearised history, as if a single
  sampler had served every process.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envsched.samplers.base import BaseSampler
from envsched.samplers.wrappers import SamplerWrapper
from envsched.store.errors import StoreCorruptError, StoreError, StoreMismatchError
from envsched.store.history import HistoryStore
from envsched.store.leases import (
    LeaseConflictError,
    LeaseDecision,
    LeaseExpiredError,
    LeaseOutcome,
    LeaseRecord,
    UnknownLeaseError,
    logged_group,
    resolve_lease,
)
from envsched.store.operations import GO, DiscardOp, Operation, RefusedOp, SampleOp, UpdateOp, safe_key
from envsched.store.records import (
    CALLER_PARAMS,
    SAMPLER_CLASSES,
    describe_sampler,
    graph_fingerprint,
    header_differences,
    register_sampler_class,
    sampler_from_record,
    tasks_fingerprint,
)
from envsched.store.replay import ReplayDivergenceError, ReplayMixin
from envsched.store.schema import Payload, canonical_json
from envsched.validation import check_int, is_int

__all__ = ["CALLER_PARAMS", "SAMPLER_CLASSES", "DurableSampler", "LeaseConflictError", "LeaseExpiredError",
           "ReplayDivergenceError", "UnknownLeaseError", "describe_sampler", "graph_fingerprint", "logged_group",
           "register_sampler_class", "tasks_fingerprint"]



class DurableSampler(ReplayMixin, SamplerWrapper):
    """A :class:`~envsched.samplers.base.TaskSampler` that logs every call to a :class:`HistoryStore`
    and rebuilds itself from it: a :class:`~envsched.samplers.wrappers.SamplerWrapper` (the wrapped sampler is
    :attr:`sampler`; ``durable.unwrapped.explanations()`` reaches an ``EnvSchedSampler``'s own methods).

    Wrapping a sampler on an empty store creates the store (configuration, pool fingerprint, task list and
    the sampler's initial state). Wrapping a sampler of the same class, configuration and pool on an
    existing store replaces the wrapped sampler's state with the one rebuilt from the store: the same line
    of code starts a run and resumes it after a crash.

    Args:
        sampler: the sampler to make durable (a :class:`BaseSampler`; any sampler, including
            ``EnvSchedSampler``). Its state is overwritten when the store already holds a history.
        store: a :class:`HistoryStore`, or a path / URL to open one.
        group_size: if given, every ``update`` must carry exactly this many rewards.
        snapshot_every: store a ``state_dict`` snapshot after every ``snapshot_every``-th event, so that a
            rebuild replays at most that many events (``None``: never; rebuilds replay the whole log).
        use_snapshots: rebuild from the latest snapshot (``True``) or replay the whole log from the initial
            state (``False``: slower, checks every logged draw and the lease index).
        graph_path: for an ``EnvSchedSampler``, the graph file its graph was loaded from; recorded (with the
            graph's fingerprint and build configuration) so that :meth:`resume` can reload it.

    Raises:
        StoreMismatchError: the store was written for another pool, sampler class, configuration or group
            size (the message names what differs); nothing is changed.
        StoreCorruptError: the store is damaged or truncated.
        ReplayDivergenceError: a replayed draw differs from the logged one (non-deterministic sampler or
            changed code).
    """

    def __init__(self, sampler: BaseSampler, store: HistoryStore | str | os.PathLike[str], *,
                 group_size: int | None = None, snapshot_every: int | None = 1000,
                 use_snapshots: bool = True, graph_path: str | os.PathLike[str] | None = None) -> None:
        for name in ("sample", "update", "discard", "state_dict", "load_state_dict", "tasks", "reward_range"):
            if not hasattr(sampler, name):
                raise TypeError(f"DurableSampler needs a BaseSampler-like sampler (missing {name!r}), got "
                                f"{type(sampler).__name__}")
        if group_size is not None and not (is_int(group_size) and group_size >= 1):
            raise ValueError(f"group_size must be a positive integer or None, got {group_size!r}")
        if snapshot_every is not None and not (is_int(snapshot_every) and snapshot_every >= 1):
            raise ValueError(f"snapshot_every must be a positive integer or None, got {snapshot_every!r}")
        self.store = store if isinstance(store, HistoryStore) else HistoryStore(store)
        super().__init__(sampler)
        self.group_size = group_size
        self.snapshot_every = snapshot_every
        self._lock = threading.RLock()
        self._stale = False
        self._broken: str | None = None
        self._seq = 0
        self._digest = ""
        self._replayed = 0
        self._lease_cache: dict[str, Any] | None = None
        self._closing: list[tuple[str, int, str]] = []
        self._audit: dict[str, list[Any]] | None = None
        self._groups: dict[str, tuple[Any, Any]] = {}
        #: one line per thing this sampler noticed about its store and did not act on (e.g. a field
        #: :meth:`resume` left unused, a missing lease table of an old store opened read-only)
        self.notes: list[str] = []
        expected = describe_sampler(sampler, group_size, graph_path=graph_path)
        header = self.store.header()
        if header is None and self.store.read_only:
            raise StoreError(f"store {self.store.where} holds no history yet (opened read-only: nothing is created)")
        if header is None:
            try:
                tasks_json: Any = json.loads(canonical_json(list(sampler.tasks)))
            except (TypeError, ValueError):
                tasks_json = None  # not JSON: the store cannot rebuild the sampler without its tasks
            before = sampler.state_dict()
            self.store.initialize({**expected, "tasks": tasks_json}, before)
            header = self.store.header()
            if header is None:  # pragma: no cover - defensive
                raise StoreError(f"store {self.store.where} could not be created")
        self._check_header(header, expected)
        self._store_id: str = header["store_id"]
        state_before = sampler.state_dict()
        try:
            with self._lock, self.store.transaction() as tx:
                if not self.store.has_lease_table(tx):
                    self._missing_lease_table(tx, header)
                self._rebuild(tx, latest=use_snapshots)
        except BaseException:
            with contextlib.suppress(Exception):  # the original error is the one to report
                sampler.load_state_dict(state_before)
            raise

    def _missing_lease_table(self, tx: Any, header: Mapping[str, Any]) -> None:
        """A store without a lease table: refused when it was created with one, or when its events name
        leases (the table was dropped); otherwise a store written before leases existed, which gets the table
        -- or, opened read-only, a note saying it will get one on the first write."""
        where = self.store.where
        if self.store.queries.lease_table_required(tx, header):
            raise StoreCorruptError(f"store {where}: its lease table {self.store.t_leases} is missing, but the "
                                    "store was created with one (or its events name leases): the table was "
                                    "dropped; restore the store from a backup")
        if self.store.read_only:
            self.notes.append(f"store {where} has no lease table (written before leases existed); the first "
                              "write adds it (opened read-only: nothing was written)")
            return
        self.store.ensure_lease_table(tx)

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def resume(cls, store: HistoryStore | str | os.PathLike[str], *, tasks: Sequence[Any] | None = None,
               sampler_classes: Sequence[type] = (), graph: Any = None,
               graph_path: str | os.PathLike[str] | None = None, run_file: str | os.PathLike[str] | None = None,
               workers: int = 1, **kwargs: Any) -> DurableSampler:
        """Rebuild a sampler from the store alone: look up its class, construct it with the recorded task
        list (or ``tasks``) and configuration, then replay.

        **A store is data, never instructions.** The class the store names is only ever one of envsched's
        registered sampler classes (:mod:`envsched.samplers.registry`, :func:`register_sampler_class`) or one of
        ``sampler_classes``; any other name is refused with :class:`StoreError` before anything is imported or
        called. Nothing read from the store chooses a file to read or write, an address to call, or a number
        of processes or threads: those come from the caller --

        * ``graph`` / ``graph_path``: an ``EnvSchedSampler``'s graph (the recorded graph file is never opened;
          without either, the graph is rebuilt from the recorded ``GraphConfig``, which is refused for an LLM
          abstraction -- it would send the pool to the recorded endpoint);
        * ``run_file``: where an ``EnvSchedSampler`` appends explanations (the recorded one is never written);
        * ``workers``: processes and threads of a graph rebuild (default 1; the recorded counts are not used).

        Each recorded field left unused this way is named, with what to pass instead, in :attr:`notes` (one
        line each). The graph must match the recorded fingerprint (``StoreMismatchError`` otherwise).
        Samplers whose configuration holds objects JSON cannot record (a client), or arguments that name a
        file, address or process count, must be constructed by the caller and wrapped instead."""
        check_int(workers, "workers", low=1, high=1024)
        store = store if isinstance(store, HistoryStore) else HistoryStore(store)
        header = store.header()
        if header is None:
            raise StoreError(f"store {store.where} holds no history yet: nothing to resume")
        sampler, notes = sampler_from_record(header, store.tasks if tasks is None else tasks, where=store.where,
                                             sampler_classes=sampler_classes, graph=graph, graph_path=graph_path,
                                             run_file=run_file, workers=workers)
        kwargs.setdefault("group_size", header.get("group_size"))
        out = cls(sampler, store, **kwargs)
        out.notes = notes + out.notes
        return out

    def _check_header(self, header: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
        where = self.store.where
        if header["sampler_class"] != expected["sampler_class"]:
            raise StoreMismatchError(f"store {where} was written by {header['sampler_class']}, not by "
                                     f"{expected['sampler_class']}: open the store the run wrote with that "
                                     "sampler, or use a new store")
        if header["pool_fingerprint"] != expected["pool_fingerprint"]:
            raise StoreMismatchError(
                f"store {where} was written for another pool: fingerprint {header['pool_fingerprint'][:12]}... "
                f"({header['num_tasks']} tasks, reward range {header.get('reward_range')}), this sampler's "
                f"pool is {expected['pool_fingerprint'][:12]}... ({expected['num_tasks']} tasks, reward range "
                f"{expected['reward_range']})")
        if header["num_tasks"] != expected["num_tasks"]:
            raise StoreCorruptError(f"store {where}: its metadata says num_tasks={header['num_tasks']}, but its pool "
                                    f"fingerprint is that of this sampler's {expected['num_tasks']} tasks: the "
                                    "metadata was edited")
        diffs = header_differences(header["sampler_params"], expected["sampler_params"])
        if diffs:
            raise StoreMismatchError(f"store {where} was written with another {expected['sampler_class']} "
                                     f"configuration: {'; '.join(diffs)}")
        mine, theirs = expected.get("graph"), header.get("graph")
        if (isinstance(mine, Mapping) and isinstance(theirs, Mapping)
                and mine["fingerprint"] != theirs.get("fingerprint")):
            raise StoreMismatchError(f"store {where} was written with another graph: fingerprint "
                                     f"{str(theirs.get('fingerprint'))[:12]}... ({theirs.get('num_nodes')} nodes), "
                                     f"this sampler's graph has {mine['fingerprint'][:12]}... "
                                     f"({mine['num_nodes']} nodes)")
        if header.get("group_size") != expected["group_size"]:
            raise StoreMismatchError(f"store {where} was written with group_size={header.get('group_size')}, "
                                     f"this DurableSampler has group_size={expected['group_size']}")

    # ------------------------------------------------------------------ logged calls
    def _run_many(self, ops: Sequence[Operation], *, batch: bool, prefetch: list[str] | None = None) -> list[Any]:
        """Apply and log ``ops`` (:mod:`envsched.store.operations`) in one transaction.

        Each op's ``check(self, tx)`` runs first and may answer it without applying it (e.g. an update whose
        lease the store shows as already applied); ``after(self, tx, seq)`` runs once its event is appended.
        Bad input (``ValueError``/``KeyError``/``TypeError`` from ``check`` or ``apply``, which change nothing)
        raises at once when ``batch`` is false; in a batch it becomes that op's result and the others go on.
        """
        if self._broken is not None:
            raise StoreError(f"this DurableSampler is unusable ({self._broken}); fix the cause and resume it "
                             "from the store")
        if self.store.read_only:
            raise StoreError(f"store {self.store.where} is opened read-only: this DurableSampler can be read "
                             "(metrics, state_dict), not sample, update or discard")
        results: list[Any] = []
        with self._lock:
            applied = committed = False
            try:
                with self.store.transaction() as tx:
                    if self._stale:
                        self._rebuild(tx, latest=True)
                    else:
                        self._catch_up(tx)
                    seq, digest = self._seq, self._digest
                    rows: list[tuple[int, str, str, str]] = []
                    self._closing = []
                    self._lease_cache = self.store.leases_bulk(tx, prefetch) if prefetch else None
                    for op in ops:
                        try:
                            early = op.check(self, tx)
                            if early is not GO:
                                results.append(early)
                                continue
                            result = op.apply(self)  # bad input raises ValueError/KeyError/TypeError, no change
                        except (ValueError, KeyError, TypeError) as exc:
                            if not batch:
                                raise
                            results.append(exc)
                            continue
                        except BaseException:
                            applied = True  # interrupted mid-call (e.g. KeyboardInterrupt): state may be partial
                            raise
                        applied = True
                        seq += 1
                        text, digest = self.store.chain_event(digest, op.kind, op.payload(result))
                        rows.append((seq, op.kind, text, digest))
                        op.after(self, tx, seq)
                        if self.snapshot_every is not None and seq % self.snapshot_every == 0:
                            self.store.write_snapshot(tx, seq, digest, self.sampler.state_dict())
                        results.append(result)
                    if rows:  # the events and the leases they consume, in a few statements
                        self.store.append_many(tx, rows)
                    if self._closing:
                        self.store.close_leases(tx, self._closing)
                committed = True
            finally:
                self._lease_cache = None
                self._closing = []
                self._groups = {}
                if applied and not committed:
                    self._stale = True  # the local state is ahead of the store: rebuild before the next call
            self._seq, self._digest = seq, digest
            return results

    def _close(self, lease: str, seq: int, outcome: LeaseOutcome) -> None:
        """Consume ``lease`` with event ``seq`` (written with the events at the end of the transaction)."""
        outcome = LeaseOutcome(outcome).value  # type: ignore[assignment] - the store records the plain string
        self._closing.append((lease, seq, outcome))
        if self._lease_cache is not None and lease in self._lease_cache:
            key, issued, _, _ = self._lease_cache[lease]
            self._lease_cache[lease] = (key, issued, seq, outcome)  # a second use in this batch sees it consumed

    def _lease_check(self, tx: Any, lease: str, key: str, action: str, group: tuple[Any, Any] | None = None) -> Any:
        """Pre-check of an update/discard naming ``lease`` by the lease rules (:func:`resolve_lease`):
        ``GO`` while the lease is open; the answer ``"already_applied"`` for an update whose lease an update
        with the same rewards and costs (``group``) already consumed (a retry after a lost reply); otherwise
        the error naming what is wrong."""
        if not isinstance(lease, str) or not lease:
            raise UnknownLeaseError(f"lease must be a non-empty string, got {lease!r}")
        row = self._lease_cache.get(lease) if self._lease_cache is not None else self.store.lease(tx, lease)
        record = None
        if row is not None:
            lkey, _, closed, outcome = row

            def logged() -> Any:
                if lease in self._groups:
                    return self._groups[lease]
                payload = self.store.event_payload(tx, int(closed)) if closed is not None else None
                return None if payload is None else Payload(payload).logged_group()

            record = LeaseRecord(lkey, None if outcome is None else LeaseOutcome(outcome),
                                 "" if closed is None else f" (event {closed})", logged)
        decision = resolve_lease(lease, key, action, record, group=group,
                                 never_issued=f"store {self.store.where} never issued it")
        return GO if decision is LeaseDecision.APPLY else decision.value

    # ------------------------------------------------------------------ the protocol
    def sample(self, n: int, *, leases: Sequence[str] | None = None) -> list[Any]:
        """Draw ``n`` tasks (see the wrapped sampler) and log the draw before returning it.

        ``leases``: one new lease id per drawn group (a sampler host passes them); they are recorded with the
        draw, so that an update naming one can be matched exactly, and recognised as already applied when it
        is retried, even by a host restarted on this store.
        """
        return self._run_many([SampleOp(n, None if leases is None else list(leases))], batch=False)[0]

    def _update_op(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None,
                   lease: str | None) -> UpdateOp:
        if (self.group_size is not None and hasattr(rewards, "__len__") and not isinstance(rewards, str | bytes)
                and len(rewards) != self.group_size):
            key = task if isinstance(task, str) else safe_key(task)
            raise ValueError(f"rewards for task {key!r} have {len(rewards)} entries, expected group_size="
                             f"{self.group_size} (one reward per rollout, None for an unscored one)")
        return UpdateOp(task, rewards, costs, lease)

    def update(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None, *,
               lease: str | None = None) -> str:
        """Report one group; returns once the update is committed to the store (acknowledged).

        ``lease``: the lease id the group was drawn under (see :meth:`sample`). With it the update is
        idempotent: a retry of an update that committed (e.g. its reply was lost) returns
        ``"already_applied"`` and changes nothing; an update for a reclaimed or discarded group raises
        :class:`LeaseExpiredError`; a lease the store never issued, or one of another task, raises
        :class:`UnknownLeaseError`. Returns ``"applied"`` otherwise.

        Raises what the wrapped sampler raises for bad input, and ``ValueError`` when ``group_size`` is set
        and ``rewards`` has another length; on error nothing is logged and no state changes.
        """
        return self._run_many([self._update_op(task, rewards, costs, lease)], batch=False)[0]

    def update_many(self, items: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Report several groups in one transaction: ``items`` are ``(task, rewards, costs, lease)`` tuples
        (``costs`` and ``lease`` may be ``None``).

        Returns one result per item, in order: ``"applied"``, ``"already_applied"``, or the exception that
        refused that item (bad input, :class:`LeaseExpiredError`, :class:`UnknownLeaseError`), which changed
        nothing; the other items are applied and committed together.
        """
        leases = [x[3] for x in items if isinstance(x, tuple | list) and len(x) == 4 and isinstance(x[3], str)]
        return self._run_many(self._update_ops(items), batch=True, prefetch=leases)

    def _update_ops(self, items: Sequence[tuple[Any, ...]]) -> list[Operation]:
        ops: list[Operation] = []
        for item in items:
            try:
                task, rewards, costs, lease = item
                ops.append(self._update_op(task, rewards, costs, lease))
            except (ValueError, TypeError) as exc:
                ops.append(RefusedOp(exc))
        return ops

    def update_many_and_sample(self, items: Sequence[tuple[Any, ...]], n: int,
                               leases: Sequence[str]) -> tuple[list[Any], Any]:
        """:meth:`update_many` then :meth:`sample` (``n`` groups under ``leases``) in one transaction.
        Returns the update results and the drawn tasks -- or, for a refused draw, the exception (the updates
        are committed all the same)."""
        ops = self._update_ops(items)
        ops.append(SampleOp(n, list(leases)))
        results = self._run_many(ops, batch=True,
                                 prefetch=[x[3] for x in items if isinstance(x, tuple | list) and len(x) == 4
                                           and isinstance(x[3], str)])
        return results[:-1], results[-1]

    def run_batch(self, requests: Sequence[tuple[Sequence[tuple[Any, ...]], int | None, list[str] | None]]
                  ) -> list[tuple[list[Any], Any]]:
        """Several callers' work in one transaction (a sampler host's group commit): each request is
        ``(update items, n, leases)`` -- updates as :meth:`update_many`, then, when ``n`` is not ``None``, a
        draw of ``n`` groups under ``leases``. Returns ``(update results, drawn tasks or the exception that
        refused the draw, or None)`` per request, in order."""
        ops: list[Operation] = []
        spans: list[tuple[int, int, bool]] = []
        prefetch: list[str] = []
        for items, n, leases in requests:
            start = len(ops)
            ops += self._update_ops(items)
            prefetch += [x[3] for x in items if isinstance(x, tuple | list) and len(x) == 4 and isinstance(x[3], str)]
            if n is not None:
                ops.append(SampleOp(n, leases))
            spans.append((start, len(ops), n is not None))
        results = self._run_many(ops, batch=True, prefetch=prefetch)
        out: list[tuple[list[Any], Any]] = []
        for start, end, drew in spans:
            part = results[start:end]
            out.append((part[:-1], part[-1]) if drew else (part, None))
        return out

    def discard(self, task: Any, *, reason: str | None = None, lease: str | None = None,
                reclaimed: bool = False) -> None:
        """Release one outstanding dispatch of ``task`` without rewards (logged with ``reason``).

        ``lease``: the lease the group was drawn under (consumed; see :meth:`update`). ``reclaimed``: the
        host gives the group back because its lease expired (counted in ``metrics()["reclaimed_groups"]``).
        """
        self._run_many([DiscardOp(task, reason, lease, reclaimed)], batch=False)

    def lease_status(self, lease: str) -> str:
        """Where a lease stands in the store: ``"open"``, ``"applied"`` (an update consumed it),
        ``"discarded"``, ``"reclaimed"``, or ``"unknown"`` (never issued here). Answers, for one update,
        whether it committed."""
        with self.store.transaction() as tx:
            row = self.store.lease(tx, lease) if self.store.has_lease_table(tx) else None
        if row is None:
            return "unknown"
        return "open" if row[3] is None else LeaseOutcome(row[3]).status

    def open_leases(self) -> list[tuple[str, str]]:
        """``(lease, task key)`` of every lease the store shows as issued and not consumed, oldest first."""
        return self._run_read(self.store.open_leases)

    def refresh(self) -> int:
        """Catch up with events other processes appended; returns the number of logged events."""
        self._run_read()
        return self._seq

    def _run_read(self, read: Callable[[Any], Any] | None = None) -> Any:
        """Catch up with the store (rebuild if stale), then ``read(tx)`` in the same transaction."""
        if self._broken is not None:
            raise StoreError(f"this DurableSampler is unusable ({self._broken})")
        with self._lock, self.store.transaction() as tx:
            if self._stale:
                self._rebuild(tx, latest=True)
            else:
                self._catch_up(tx)
            return read(tx) if read is not None else None

    def metrics(self) -> dict[str, float]:
        """The wrapped sampler's metrics after catching up with the store, plus ``store_events`` and, from
        the store's lease table (so they survive restarts), ``reclaimed_groups`` and ``open_leases``."""
        counts = self._run_read(self.store.lease_counts)
        m = dict(self.sampler.metrics())
        m["store_events"] = float(self._seq)
        m["reclaimed_groups"] = float(counts["reclaim"])
        m["open_leases"] = float(counts["open"])
        return m

    def state_dict(self) -> dict[str, Any]:
        """The wrapped sampler's state after catching up, plus ``durable`` = where it stands in the store.
        It loads into a plain sampler of the same configuration as well."""
        self._run_read()
        state = dict(self.sampler.state_dict())
        state["durable"] = {"store_id": self._store_id, "seq": self._seq, "digest": self._digest}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Accept a state this store produced (a no-op: the store holds that history and what followed).

        A DurableSampler's state comes from its store; loading a foreign state would put the sampler out of
        step with its log, so it raises ``ValueError`` (state unchanged). To restart from an older
        checkpoint, start a new store.
        """
        mark = state.get("durable") if isinstance(state, Mapping) else None
        if not isinstance(mark, Mapping) or mark.get("store_id") != self._store_id:
            raise ValueError("cannot load this state into a DurableSampler: it was not produced by this store "
                             f"({self.store.where}); the sampler's state is rebuilt from its store. To restart "
                             "from another state, load it into a fresh sampler and wrap it on a new store")
        seq = mark.get("seq")
        if not isinstance(seq, int) or seq < 0:
            raise ValueError(f"malformed DurableSampler state: seq {seq!r}")
        self._run_read()
        if seq > self._seq:
            raise ValueError(f"state is at event {seq} but store {self.store.where} holds only {self._seq} "
                             "events: the store lost events (restored from an older copy?)")
        digest = mark.get("digest")
        if seq > 0 and isinstance(digest, str):
            with self._lock, self.store.transaction() as tx:
                logged = self.store.digest_at(tx, seq)
            if logged != digest:
                raise StoreCorruptError(f"store {self.store.where}: event {seq} differs from the one this state "
                                        "was taken after (its digest changed): the log was rewritten since "
                                        "the checkpoint; restore the store from a backup")

    # ------------------------------------------------------------------ introspection
    @property
    def seq(self) -> int:
        """Number of logged events this sampler has applied."""
        return self._seq

    @property
    def replayed_events(self) -> int:
        """Events replayed by the last rebuild and the catch-ups since (0 for a fresh store)."""
        return self._replayed

    def outstanding(self) -> dict[str, int]:
        """Outstanding dispatches per task key (local view; call :meth:`refresh` first to include others')."""
        return self.sampler.outstanding()

    def get_params(self) -> dict[str, Any]:
        return {"group_size": self.group_size, "snapshot_every": self.snapshot_every}

    def close(self) -> None:
        """Close the store's connection."""
        self.store.close()

    def __repr__(self) -> str:
        return f"DurableSampler({self.sampler!r}, {self.store!r}, events={self._seq})"
