"""One sampler shared by many rollout workers: :class:`SamplerHost`, which serialises the calls to it and keeps
an exact lease per dispatched group.

Distributed trainers run rollouts on many workers (and machines) but need *one* scheduler: its statistics
must see every group. :func:`~envsched.distributed.launch_sampler` (:mod:`envsched.distributed.ray_host`)
starts a Ray actor whose body is a :class:`SamplerHost` owning the sampler; every worker holds a
:class:`RemoteSampler` (a :class:`~envsched.samplers.base.TaskSampler`) that forwards ``sample`` and
``update`` to it. The actor takes calls in up to 32 threads and the host serialises them; a durable host
commits the calls that queued up while it was busy in one store transaction (group commit).

**Leases.** Each dispatched group gets a lease: a random 128-bit id (unguessable, so it cannot be made up)
issued by the host. Every ``update`` and ``discard`` must name one, and a lease is consumed exactly once:

* an update naming a live lease of that task is applied and consumes it;
* a retry of an update that was applied (its reply was lost) is answered ``"already_applied"`` and changes
  nothing -- with a :class:`~envsched.store.DurableSampler` this is read from the store, so it holds across
  host restarts; a second update under that lease with *other* rewards or costs is not a retry: it raises
  :class:`LeaseConflictError` (rewards refused);
* an update for a group that was reclaimed (its lease expired) or discarded raises
  :class:`LeaseExpiredError`; a lease the host never issued (nor its store), or a lease of another task,
  raises :class:`UnknownLeaseError`. Neither changes anything, and no update is ever matched to another
  worker's dispatch.

A worker that dies leaves its groups outstanding; once a lease is older than ``lease_timeout_s`` (and not
renewed) the host reclaims the group -- ``discard`` on the sampler, so the task can be drawn again.

:meth:`SamplerHost.leases` lists only the leases of the worker that asks, so a worker never learns (and so
cannot report) another worker's lease ids; :meth:`SamplerHost.lease_summary` gives operators counts only.

**Durability.** Host a :class:`~envsched.store.DurableSampler` (build it in the factory) to survive the
actor's death: with ``max_restarts`` Ray reruns the factory, which rebuilds the sampler from its store, and
the host re-adopts every lease the store shows open, so workers' updates for them are still matched
exactly. While the store is unreachable the factory is retried with backoff (``store_retry_s``) instead of
the actor dying for good. A host without a store cannot come back: :func:`launch_sampler` refuses
``max_restarts`` for it, and a restarted non-durable host refuses to start rather than silently begin from
zero. See ``docs/durability.md`` for the recovery path of each failure.

**Batches.** ``sample(n)`` draws ``n`` groups and :meth:`RemoteSampler.update_many` reports several groups
in one round trip (and, for a durable sampler, one store transaction).

:class:`SamplerHost` is the actor's plain-Python body and works without Ray (e.g. in threads, through
:meth:`SamplerHost.client`).
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envsched.distributed.client import LocalClient
from envsched.distributed.ray_support import in_restarted_actor, transient
from envsched.pool.spec import task_key
from envsched.samplers.base import MAX_BATCH
from envsched.samplers.wrappers import unwrap
from envsched.store.durable import DurableSampler
from envsched.store.errors import StoreError
from envsched.store.leases import (
    LeaseDecision,
    LeaseExpiredError,
    LeaseOutcome,
    LeaseRecord,
    UnknownLeaseError,
    logged_group,
    resolve_lease,
)
from envsched.validation import is_int

__all__ = ["Lease", "SamplerHost"]

_CLOSED_MEMORY = 200_000


class _Request:
    """One queued call of the group commit: its updates, its draw, and (when done) its answer."""

    __slots__ = ("done", "error", "items", "n", "result", "worker")

    def __init__(self, items: list[Any], n: int | None, worker: str | None) -> None:
        self.items, self.n, self.worker = items, n, worker
        self.done = False
        self.error: BaseException | None = None
        self.result: Any = None


@dataclass
class Lease:
    """One dispatched group: its id, task key, the worker it went to, and when it expires (host clock).
    ``anonymous`` leases stand for dispatches whose lease is not known (an older store, or a plain sampler
    that had groups outstanding): nobody can name them; they are only reclaimed."""

    lease_id: str
    key: str
    worker: str | None
    issued: float
    deadline: float
    anonymous: bool = False


def _drawable(n: Any) -> bool:
    """Whether ``n`` is a batch size worth issuing lease ids for (the sampler still checks it: a refused ``n``
    gets no ids)."""
    return is_int(n) and 0 < n <= MAX_BATCH


def _is_sampler(obj: Any) -> bool:
    return all(hasattr(obj, m) for m in ("sample", "update", "discard", "metrics", "state_dict"))


class SamplerHost:
    """Serialises calls to one sampler and keeps an exact lease per dispatched group.

    Args:
        sampler: the sampler, or a zero-argument factory that builds it (the way to host it in a Ray actor:
            the factory runs inside the actor process). It needs ``discard`` and ``outstanding``
            (every :class:`BaseSampler` and :class:`DurableSampler` has them). A
            :class:`~envsched.store.DurableSampler` records the leases in its store.
        lease_timeout_s: a dispatched group not reported (nor renewed) within this many seconds is
            reclaimed.
        group_size: if given, every update must carry exactly this many rewards.
        store_retry_s: how long the factory is retried (with exponential backoff, 0.5 s up to 10 s) while it
            raises :class:`~envsched.store.StoreError` -- the store is unreachable -- before giving up.
        clock: time source (seconds); injectable for tests.
    """

    def __init__(self, sampler: Any, *, lease_timeout_s: float = 600.0, group_size: int | None = None,
                 store_retry_s: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not (isinstance(lease_timeout_s, int | float) and lease_timeout_s > 0):
            raise ValueError(f"lease_timeout_s must be a positive number, got {lease_timeout_s!r}")
        if group_size is not None and not (is_int(group_size) and group_size >= 1):
            raise ValueError(f"group_size must be a positive integer or None, got {group_size!r}")
        if not (isinstance(store_retry_s, int | float) and store_retry_s >= 0):
            raise ValueError(f"store_retry_s must be a number >= 0, got {store_retry_s!r}")
        self.store_retry_s = float(store_retry_s)
        self.store_retries = 0
        if not _is_sampler(sampler):
            if not callable(sampler):
                raise TypeError(f"sampler must be a sampler or a factory returning one, got {type(sampler).__name__}")
            sampler = self._build(sampler)
            if not _is_sampler(sampler):
                raise TypeError(f"the factory returned {type(sampler).__name__}, not a sampler")
        self.sampler = sampler
        #: the hosted sampler keeps its history and the leases in a store (a DurableSampler)
        self.durable = isinstance(sampler, DurableSampler)
        if not self.durable and in_restarted_actor():
            raise RuntimeError("the sampler host was restarted by Ray but its sampler is not durable: it would "
                               "start from zero and forget every update. Build a DurableSampler in the factory, "
                               "or launch with max_restarts=0 and relaunch after release_name(name)")
        self.lease_timeout_s = float(lease_timeout_s)
        self.group_size = group_size
        self._clock = clock
        self._lock = threading.RLock()
        self._epoch = uuid.uuid4().hex[:8]
        self._leases: dict[str, Lease] = {}  # in deadline order (new and renewed leases go to the end)
        # non-durable: lease -> (key, outcome, logged (rewards, costs) of the consuming update or None)
        self._closed: OrderedDict[str, tuple[str, LeaseOutcome, Any]] = OrderedDict()
        self._reclaimed_groups = 0
        self._needs_sync = False
        self._queue: list[_Request] = []
        self._qlock = threading.Lock()
        self._adopt_outstanding()

    def _build(self, factory: Callable[[], Any]) -> Any:
        """Run the factory; while it fails with StoreError (store unreachable), retry with backoff."""
        deadline = time.monotonic() + self.store_retry_s
        delay = 0.5
        while True:
            try:
                return factory()
            except StoreError as exc:
                left = deadline - time.monotonic()
                if left <= 0 or not transient(exc):
                    raise
                self.store_retries += 1
                warnings.warn(f"sampler host: the store is unreachable ({exc}); retrying in {min(delay, left):.1f} s",
                              RuntimeWarning, stacklevel=2)
                time.sleep(min(delay, left))
                delay = min(delay * 2, 10.0)

    # ------------------------------------------------------------------ leases
    def _adopt_outstanding(self) -> None:
        """Lease every dispatch the sampler has outstanding, e.g. after the host was restarted on a store.

        A durable sampler's store names the open leases: they are adopted with their ids (owner unknown),
        so the workers holding them are still matched exactly. Dispatches without a known lease get
        anonymous leases, which are only reclaimed. Both expire ``lease_timeout_s`` from now."""
        old = self._leases
        self._leases = {}
        now = self._clock()
        known: dict[str, int] = {}
        if self.durable:
            for lid, key in self.sampler.open_leases():
                prev = old.get(lid)
                self._leases[lid] = prev if prev is not None else Lease(lid, key, None, now,
                                                                        now + self.lease_timeout_s)
                known[key] = known.get(key, 0) + 1
        outstanding = self.sampler.outstanding() if hasattr(self.sampler, "outstanding") else {}
        for key, count in outstanding.items():
            prev_anon = [x for x in old.values() if x.anonymous and x.key == key]
            for i in range(int(count) - known.get(key, 0)):
                lease = prev_anon[i] if i < len(prev_anon) else Lease(f"anon-{secrets.token_hex(8)}", key, None,
                                                                      now, now + self.lease_timeout_s, True)
                self._leases[lease.lease_id] = lease
        self._leases = dict(sorted(self._leases.items(), key=lambda kv: kv[1].deadline))  # deadline order
        self._needs_sync = False

    def _sync(self) -> None:
        """After a store error the host's view may differ from the store's (a call may have committed
        although its reply was lost): re-read the open leases from the store."""
        if self._needs_sync:
            self._adopt_outstanding()

    def _new_ids(self, n: int) -> list[str]:
        return [secrets.token_hex(16) for _ in range(n)]

    def _remember_closed(self, lease: Lease, outcome: LeaseOutcome, group: tuple[Any, Any] | None = None) -> None:
        """Keep what consumed a lease (non-durable host; a durable one reads it from the store): the outcome
        and, for an update, its logged rewards and costs, so that a retry is told from a conflicting update."""
        if not self.durable:
            self._closed[lease.lease_id] = (lease.key, outcome, group)
            while len(self._closed) > _CLOSED_MEMORY:
                self._closed.popitem(last=False)

    def _discard_in_sampler(self, lease: Lease, reason: str, reclaimed: bool) -> None:
        if self.durable:
            self.sampler.discard(lease.key, reason=reason, lease=None if lease.anonymous else lease.lease_id,
                                 reclaimed=reclaimed)
            return
        try:
            self.sampler.discard(lease.key, reason=reason)
        except TypeError:
            self.sampler.discard(lease.key)

    def _reclaim(self, leases: list[Lease], reason: str) -> list[str]:
        done = []
        for lease in leases:
            try:
                self._discard_in_sampler(lease, reason, reclaimed=True)
            except StoreError:
                self._needs_sync = True
                raise
            except LeaseExpiredError:
                pass  # the store shows the lease consumed already (a call whose reply was lost): just forget it
            del self._leases[lease.lease_id]
            self._remember_closed(lease, LeaseOutcome.RECLAIM)
            self._reclaimed_groups += 1
            done.append(lease.lease_id)
        return done

    def reclaim_expired(self) -> list[str]:
        """Discard every group whose lease expired; returns their lease ids. Runs before every call too."""
        with self._lock:
            self._sync()
            now = self._clock()
            expired = []
            for lease in self._leases.values():  # kept in deadline order: stop at the first live one
                if lease.deadline > now:
                    break
                expired.append(lease)
            if not expired:
                return []
            return self._reclaim(expired, f"lease expired after {self.lease_timeout_s:g} s")

    def release_worker(self, worker: str) -> list[str]:
        """Reclaim at once every group leased to ``worker`` (e.g. the trainer saw it die)."""
        with self._lock:
            self._sync()
            return self._reclaim([lease for lease in self._leases.values() if lease.worker == worker],
                                 f"worker {worker} released")

    def renew(self, lease_ids: Sequence[str]) -> int:
        """Extend these leases by ``lease_timeout_s`` from now (a heartbeat for long rollouts); returns how
        many were still live."""
        with self._lock:
            self.reclaim_expired()
            now = self._clock()
            live = 0
            for lid in lease_ids:
                lease = self._leases.pop(lid, None)
                if lease is not None:
                    if not lease.anonymous:
                        lease.deadline = now + self.lease_timeout_s
                        live += 1
                    self._leases[lid] = lease  # to the end: the leases stay in deadline order
            return live

    def leases(self, worker: str) -> list[dict[str, Any]]:
        """The live leases of ``worker`` (id, task key, worker, seconds left): only the caller's own, so that
        no worker learns another's lease ids (and so cannot report another worker's group)."""
        if not isinstance(worker, str) or not worker:
            raise ValueError(f"leases(worker) lists one worker's leases: give its non-empty id, got {worker!r} "
                             "(lease_summary() counts every worker's leases without their ids)")
        with self._lock:
            now = self._clock()
            return [{"lease": x.lease_id, "key": x.key, "worker": x.worker, "expires_in_s": x.deadline - now,
                     "anonymous": x.anonymous} for x in self._leases.values() if x.worker == worker]

    def lease_summary(self) -> dict[str, int]:
        """Live leases counted by worker (``"(adopted)"``: leases of a previous incarnation whose worker is
        not known; ``"(anonymous)"``: dispatches without a known lease). No lease ids."""
        with self._lock:
            out: dict[str, int] = {}
            for x in self._leases.values():
                who = "(anonymous)" if x.anonymous else (x.worker if x.worker is not None else "(adopted)")
                out[who] = out.get(who, 0) + 1
            return out

    def lease_status(self, lease_id: str) -> str:
        """``"live"`` (held, not yet reported), ``"applied"``, ``"discarded"``, ``"reclaimed"`` or
        ``"unknown"``: whether an update naming this lease committed (read from the store when durable)."""
        with self._lock:
            if lease_id in self._leases and not self._leases[lease_id].anonymous:
                return "live"
            if self.durable:
                status = self.sampler.lease_status(lease_id)
                return "live" if status == "open" else status
            closed = self._closed.get(lease_id)
            if closed is None:
                return "unknown"
            return LeaseOutcome(closed[1]).status

    def _position_of(self, key: str) -> None:
        inner = unwrap(self.sampler)
        if hasattr(inner, "position_of"):
            inner.position_of(key)  # KeyError naming an unknown task

    def _check_lease(self, key: str, lease_id: Any, action: str, group: tuple[Any, Any] | None = None) -> Lease | str:
        """The live lease ``lease_id`` of task ``key``, or ``"already_applied"`` (an update whose rewards and
        costs, ``group``, equal those of the update that consumed the lease); else an error. For a durable
        sampler a consumed lease is passed on as a :class:`Lease` (the store compares the rewards)."""
        if lease_id is None:
            self._position_of(key)
            raise UnknownLeaseError(f"{action} of task {key!r} names no lease: refused as an {action} without an "
                                    "outstanding dispatch of the caller (no outstanding dispatch of it is leased "
                                    f"to the caller; every {action} must name the lease sample() returned)")
        if not isinstance(lease_id, str) or not lease_id or lease_id.startswith("anon-"):
            raise UnknownLeaseError(f"{action} of task {key!r} names no valid lease ({lease_id!r}): every "
                                    f"{action} must name the lease sample() returned for the group")
        lease = self._leases.get(lease_id)
        if lease is not None:
            if lease.key != key:
                raise UnknownLeaseError(f"lease {lease_id} belongs to task {lease.key!r}, not {key!r}")
            return lease
        record: LeaseRecord | None
        if self.durable:
            status = self.sampler.lease_status(lease_id)
            if status == "open":  # issued by this store but not adopted yet (another process's draw): resync
                self._needs_sync = True
                self._sync()
                lease = self._leases.get(lease_id)
                if lease is not None and lease.key == key:
                    return lease
            if status == "applied" and action == "update":
                # the store holds the consuming update: let the DurableSampler tell a retry from a conflict
                return Lease(lease_id, key, None, self._clock(), self._clock())
            outcome = LeaseOutcome.from_status(status)
            record = None if outcome is None else LeaseRecord(None, outcome)
        else:
            closed = self._closed.get(lease_id)
            record = None
            if closed is not None:  # (key, outcome, logged rewards and costs of the consuming update or None)
                key_, outcome_, group_ = closed
                record = LeaseRecord(key_, LeaseOutcome(outcome_), "",
                                     None if group_ is None else (lambda: group_))
        decision = resolve_lease(lease_id, key, action, record, group=group,
                                 never_issued="not issued by this sampler host"
                                 + (" nor found in its store" if self.durable else ""),
                                 expired=f"after {self.lease_timeout_s:g} s")
        assert decision is not LeaseDecision.APPLY  # an open lease is in self._leases (or adopted above)
        return decision.value

    # ------------------------------------------------------------------ the protocol, serialised
    # ------------------------------------------------------------------ group commit (durable samplers)
    def _combined(self, items: list[Any], n: int | None, worker: str | None) -> tuple[list[Any], Any]:
        """Queue this call and let whoever holds the lock run every queued call in one store transaction:
        with many workers calling at once (a threaded actor), one commit serves them all."""
        req = _Request(items, n, worker)
        with self._qlock:
            self._queue.append(req)
        with self._lock:
            if not req.done:
                self._drain()
        if req.error is not None:
            raise req.error
        return req.result

    def _drain(self) -> None:
        with self._qlock:
            reqs, self._queue = self._queue, []
        try:
            self.reclaim_expired()
            prepared = []
            for req in reqs:
                results, todo = self._prepare_updates(req.items, True)
                valid_n = _drawable(req.n)
                ids = self._new_ids(req.n) if valid_n else []  # type: ignore[arg-type]
                prepared.append((req, results, todo, ids))
            try:
                out = self.sampler.run_batch([([x[2] for x in todo], req.n, ids or None)
                                              for req, _, todo, ids in prepared])
            except StoreError:
                self._needs_sync = True  # some of it may have committed: the store, read next, will say
                raise
            now = self._clock()
            for (req, results, todo, ids), (done, drawn) in zip(prepared, out, strict=True):
                req.result = (self._finish_updates(results, todo, done, True), None)
                if isinstance(drawn, BaseException):
                    req.error = drawn
                elif drawn is not None:
                    pairs = []
                    for lid, t in zip(ids, drawn, strict=True):
                        self._leases[lid] = Lease(lid, task_key(t), req.worker, now, now + self.lease_timeout_s)
                        pairs.append((lid, t))
                    req.result = (req.result[0], pairs)
        except BaseException as exc:
            for req in reqs:
                if not req.done and req.error is None:
                    req.error = exc
            raise
        finally:
            for req in reqs:
                req.done = True

    def sample(self, n: int, worker: str | None = None) -> list[tuple[str, Any]]:
        """Draw ``n`` tasks; returns ``(lease_id, task)`` pairs."""
        if self.durable:
            return self._combined([], n, worker)[1]
        with self._lock:
            self.reclaim_expired()
            ids = self._new_ids(n) if _drawable(n) else []
            try:
                tasks = self.sampler.sample(n, leases=ids) if self.durable and ids else self.sampler.sample(n)
            except StoreError:
                self._needs_sync = True
                raise
            now = self._clock()
            out = []
            for lid, t in zip(ids, tasks, strict=True):
                self._leases[lid] = Lease(lid, task_key(t), worker, now, now + self.lease_timeout_s)
                out.append((lid, t))
            return out

    def _check_size(self, key: str, rewards: Any) -> None:
        if (self.group_size is not None and hasattr(rewards, "__len__") and not isinstance(rewards, str | bytes)
                and len(rewards) != self.group_size):
            raise ValueError(f"rewards for task {key!r} have {len(rewards)} entries, expected group_size="
                             f"{self.group_size} (one reward per rollout, None for an unscored one)")

    def update(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None,
               lease: str | None = None) -> str:
        """Report one group under ``lease`` (the id :meth:`sample` returned for it). Returns ``"applied"``, or
        ``"already_applied"`` for a retry of an update that was applied."""
        return self._update_items([(task, rewards, costs, lease)], batch=False)[0]

    def update_many(self, items: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Report several groups in one call: ``(task, rewards, costs, lease)`` tuples. Returns one result per
        item: ``"applied"``, ``"already_applied"``, or the exception that refused it (nothing changed for it)."""
        if not isinstance(items, list | tuple):
            raise TypeError(f"items must be a list of (task, rewards, costs, lease) tuples, got {type(items).__name__}")
        if self.durable:
            return self._combined(list(items), None, None)[0]
        return self._update_items(list(items), batch=True)

    def _update_items(self, items: list[Any], *, batch: bool) -> list[Any]:
        with self._lock:
            self.reclaim_expired()
            results, todo = self._prepare_updates(items, batch)
            if not todo:
                return results
            try:
                done = self.sampler.update_many([x[2] for x in todo]) if self.durable else self._apply_plain(todo)
            except StoreError:
                self._needs_sync = True  # it may have committed: the store, read on the next call, will say
                raise
            return self._finish_updates(results, todo, done, batch)

    def update_and_sample(self, items: Sequence[tuple[Any, ...]], n: int,
                          worker: str | None = None) -> tuple[list[Any], list[tuple[str, Any]]]:
        """:meth:`update_many` then :meth:`sample` in one call -- and, for a durable sampler, one store
        transaction: a worker reports its last groups and draws the next ones in one round trip. Returns the
        update results and the ``(lease_id, task)`` pairs drawn. A refused draw (bad ``n``) raises after the
        updates were applied."""
        if not isinstance(items, list | tuple):
            raise TypeError(f"items must be a list of (task, rewards, costs, lease) tuples, got {type(items).__name__}")
        if self.durable:
            return self._combined(list(items), n, worker)
        with self._lock:
            self.reclaim_expired()
            results, todo = self._prepare_updates(list(items), True)
            ids = self._new_ids(n) if _drawable(n) else []
            try:
                if self.durable and ids:
                    done, tasks = self.sampler.update_many_and_sample([x[2] for x in todo], n, ids)
                else:
                    done = (self.sampler.update_many([x[2] for x in todo]) if self.durable
                            else self._apply_plain(todo))
                    try:
                        tasks = self.sampler.sample(n)
                    except (ValueError, KeyError, TypeError) as exc:
                        tasks = exc
            except StoreError:
                self._needs_sync = True
                raise
            results = self._finish_updates(results, todo, done, True)
            if isinstance(tasks, BaseException):
                raise tasks
            now = self._clock()
            pairs = []
            for lid, t in zip(ids, tasks, strict=True):
                self._leases[lid] = Lease(lid, task_key(t), worker, now, now + self.lease_timeout_s)
                pairs.append((lid, t))
            return results, pairs

    def _prepare_updates(self, items: list[Any], batch: bool) -> tuple[list[Any], list[tuple[int, Lease, tuple]]]:
        """Check each item against the leases: returns the results known already (a retry's answer, or the
        error that refuses an item) and the items to apply."""
        results: list[Any] = [None] * len(items)
        todo: list[tuple[int, Lease, tuple[Any, ...]]] = []
        seen: set[str] = set()
        for i, item in enumerate(items):
            try:
                if not isinstance(item, list | tuple) or len(item) != 4:
                    raise TypeError(f"item {i} must be a (task, rewards, costs, lease) tuple")
                task, rewards, costs, lease_id = item
                key = task if isinstance(task, str) else task_key(task)
                self._check_size(key, rewards)
                found = self._check_lease(key, lease_id, "update", (rewards, costs))
                if isinstance(found, str):
                    results[i] = found
                    continue
                if found.lease_id in seen:
                    raise UnknownLeaseError(f"lease {found.lease_id} is named twice in one batch")
                seen.add(found.lease_id)
                todo.append((i, found, (task, rewards, costs, found.lease_id)))
            except (ValueError, KeyError, TypeError) as exc:
                if not batch:
                    raise
                results[i] = exc
        return results, todo

    def _apply_plain(self, todo: list[tuple[int, Lease, tuple[Any, ...]]]) -> list[Any]:
        done: list[Any] = []
        for _, _, (task, rewards, costs, _) in todo:
            try:
                self.sampler.update(task, rewards, costs)
                done.append("applied")
            except (ValueError, KeyError, TypeError) as exc:
                done.append(exc)
        return done

    def _finish_updates(self, results: list[Any], todo: list[tuple[int, Lease, tuple[Any, ...]]], done: list[Any],
                        batch: bool) -> list[Any]:
        for (i, lease, item), res in zip(todo, done, strict=True):
            results[i] = res
            if isinstance(res, LeaseExpiredError):  # the store knew better (a lost reply): forget it
                self._leases.pop(lease.lease_id, None)
            elif not isinstance(res, BaseException):
                self._leases.pop(lease.lease_id, None)
                self._remember_closed(lease, LeaseOutcome.UPDATE, logged_group(item[1], item[2]))
        if not batch and isinstance(results[0], BaseException):
            raise results[0]
        return results

    def discard(self, task: Any, lease: str | None = None) -> None:
        """Give a dispatched group back without rewards (``lease``: the id :meth:`sample` returned)."""
        with self._lock:
            self.reclaim_expired()
            key = task if isinstance(task, str) else task_key(task)
            found = self._check_lease(key, lease, "discard")
            assert isinstance(found, Lease)  # "already_applied" is only an update's answer
            try:
                self._discard_in_sampler(found, "discarded by worker", reclaimed=False)
            except StoreError:
                self._needs_sync = True
                raise
            del self._leases[found.lease_id]
            self._remember_closed(found, LeaseOutcome.DISCARD)

    def metrics(self) -> dict[str, float]:
        """The sampler's metrics plus ``leases`` (live), ``reclaimed_groups`` (read from the store when the
        sampler is durable, so it survives restarts) and ``store_retries`` (factory retries at start)."""
        with self._lock:
            self.reclaim_expired()
            m = dict(self.sampler.metrics())
            m["leases"] = float(len(self._leases))
            if "reclaimed_groups" not in m:
                m["reclaimed_groups"] = float(self._reclaimed_groups)
            m["store_retries"] = float(self.store_retries)
            return m

    def outstanding(self) -> dict[str, int]:
        """The hosted sampler's outstanding dispatches per task key, after reclaiming expired leases."""
        with self._lock:
            self.reclaim_expired()
            return dict(self.sampler.outstanding())

    def tasks(self) -> list[Any]:
        """The hosted sampler's task list."""
        return list(self.sampler.tasks)

    def reward_range(self) -> tuple[float, float]:
        """The hosted sampler's declared reward range."""
        low, high = self.sampler.reward_range
        return float(low), float(high)

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a sampler state; outstanding dispatches in it get fresh (anonymous) leases."""
        with self._lock:
            self.sampler.load_state_dict(state)
            self._leases = {}
            self._adopt_outstanding()

    def client(self, worker: str | None = None) -> LocalClient:
        """A worker's handle on this host in the same process (threads, tests): like :class:`RemoteSampler`,
        it remembers the lease of every group it drew and sends it with the update."""
        return LocalClient(self, worker=worker)

    def is_durable(self) -> bool:
        """Whether the hosted sampler keeps its history (and the leases) in a store."""
        return self.durable

    def ping(self) -> str:
        """The host's incarnation id (changes when the actor is restarted)."""
        return self._epoch
