"""A worker's handle on the shared sampler: :class:`RemoteSampler` (through Ray) and :class:`LocalClient` (in
the host's process), and the errors only a worker sees. See :mod:`envsched.distributed.host` for the host, its
leases and its durability, and :mod:`envsched.distributed.ray_host` for launching it on Ray. This module
imports neither: a handle only calls the host's methods by name."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envsched.distributed.ray_support import dead_for_good, ray_module, release_name, retryable_errors, transient
from envsched.errors import EnvSchedError
from envsched.pool.spec import task_key
from envsched.store.errors import StoreError
from envsched.store.leases import LeaseExpiredError, UnknownLeaseError

__all__ = ["LeaseUnconfirmedError", "LocalClient", "RemoteSampler", "UpdateBatchError", "release_name"]


class LeaseUnconfirmedError(EnvSchedError, RuntimeError):
    """A call naming a lease failed in a way that does not say whether it took effect (the host stayed
    unreachable for the whole retry window). The worker has dropped the lease; ask
    :meth:`RemoteSampler.lease_status` later for the answer."""

    def __init__(self, message: str, lease: str | None) -> None:
        super().__init__(message)
        self.lease = lease


class UpdateBatchError(EnvSchedError, ValueError):
    """Some items of an :meth:`RemoteSampler.update_many` call were refused (the others were applied).

    ``results`` holds one entry per item: ``"applied"``, ``"already_applied"`` or the refusing exception."""

    def __init__(self, message: str, results: list[Any]) -> None:
        super().__init__(message)
        self.results = results


def _plain(values: Any) -> Any:
    """Rewards or costs as a list for the trip to the host (a tuple, an array); anything that is not a plain
    sequence (``None``, a string, a mapping, a number) goes as it is, for the host to refuse by name."""
    if values is None or isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        return values
    return list(values)


class RemoteSampler:
    """A worker's handle on the shared sampler: a TaskSampler whose calls run in the host actor.

    It remembers the lease of every group it drew and sends it with the update. A call that fails because
    the host is restarting (or the store is briefly unreachable) is retried for up to ``retry_s`` seconds
    with backoff; updates are idempotent by lease, so a retry never counts a group twice. A lease whose
    update or discard cannot be confirmed is dropped (never sent again): see :class:`LeaseUnconfirmedError`.
    Pickle it into Ray tasks freely: each unpickled copy is a new worker (own id, no leases).
    """

    def __init__(self, actor: Any, *, worker: str | None = None, retry_s: float = 120.0) -> None:
        self.actor = actor
        self._explicit_worker = worker
        # a random part no other worker can guess: the host lists a worker's leases to whoever names it
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        self.retry_s = float(retry_s)
        self._leases: dict[str, deque[str]] = {}
        self.last_lease: str | None = None
        self._tasks: list[Any] | None = None
        self._reward_range: tuple[float, float] | None = None

    @classmethod
    def connect(cls, name: str, *, namespace: str | None = None, worker: str | None = None,
                retry_s: float = 120.0) -> RemoteSampler:
        """Attach to a host launched with ``name``."""
        return cls(ray_module().get_actor(name, namespace=namespace), worker=worker, retry_s=retry_s)

    def __getstate__(self) -> dict[str, Any]:
        return {"actor": self.actor, "worker": self._explicit_worker, "retry_s": self.retry_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["actor"], worker=state["worker"], retry_s=state.get("retry_s", 120.0))  # type: ignore[misc]

    def _call_once(self, method: str, *args: Any) -> Any:
        ray = ray_module()
        try:
            return ray.get(getattr(self.actor, method).remote(*args))
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise

    def _transient_errors(self) -> tuple[type[BaseException], ...]:
        return (*retryable_errors(ray_module()), StoreError)

    def _call(self, method: str, *args: Any, retry: bool = False) -> Any:
        """Call the host; with ``retry``, retry while it is restarting or its store is unreachable."""
        if not retry:
            return self._call_once(method, *args)
        ray = ray_module()
        kinds = self._transient_errors()
        deadline = time.monotonic() + self.retry_s
        delay = 0.2
        while True:
            try:
                return self._call_once(method, *args)
            except kinds as exc:
                if isinstance(exc, StoreError) and not transient(exc):
                    raise
                if isinstance(exc, ray.exceptions.RayActorError) and dead_for_good(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def sample(self, n: int) -> list[Any]:
        """Draw ``n`` groups (one round trip); their leases are remembered for :meth:`update`."""
        pairs = self._call("sample", n, self.worker, retry=True)
        out = []
        for lease_id, task in pairs:
            self._leases.setdefault(task_key(task), deque()).append(lease_id)
            out.append(task)
        return out

    def sample_leased(self, n: int) -> list[tuple[str, Any]]:
        """Draw ``n`` groups and return ``(lease_id, task)`` pairs without remembering them: the caller
        passes each lease to :meth:`update` itself (e.g. when another process reports the group)."""
        return self._call("sample", n, self.worker, retry=True)

    def _take_lease(self, task: Any, lease: str | None) -> tuple[str, str | None]:
        """Take the lease for ``task`` out of this worker's book (the given one, else the oldest held).
        ``None`` when the worker holds none: the host then refuses the call, naming why."""
        key = task if isinstance(task, str) else task_key(task)
        q = self._leases.get(key)
        if lease is None:
            lease = q[0] if q else None
        if q is not None and lease in q:
            q.remove(lease)
            if not q:
                del self._leases[key]
        return key, lease

    def _put_back(self, key: str, lease: str | None) -> None:
        if lease is not None:
            self._leases.setdefault(key, deque()).appendleft(lease)

    def update(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None, *,
               lease: str | None = None) -> str:
        """Report one group under its lease. Returns ``"applied"``, or ``"already_applied"`` when a retry
        found the update committed. Bad input raises (the lease is kept, so a corrected update can follow);
        :class:`LeaseExpiredError` and :class:`UnknownLeaseError` drop the lease; a host that stays
        unreachable raises :class:`LeaseUnconfirmedError` (lease dropped)."""
        key, lid = self._take_lease(task, lease)
        self.last_lease = lid
        args = (task, _plain(rewards), _plain(costs), lid)
        return self._leased_call("update", key, lid, args)

    def _leased_call(self, method: str, key: str, lid: str | None, args: tuple[Any, ...]) -> Any:
        try:
            return self._call(method, *args, retry=True)
        except (LeaseExpiredError, UnknownLeaseError):
            raise
        except (ValueError, KeyError, TypeError):
            self._put_back(key, lid)  # bad input changed nothing: the group is still this worker's
            raise
        except self._transient_errors() as exc:
            raise LeaseUnconfirmedError(f"{method} of task {key!r} (lease {lid}) could not be confirmed ({exc}); "
                                        "the lease is dropped. Ask lease_status(lease) later: 'applied' means it "
                                        "was counted", lid) from exc

    def update_and_sample(self, items: Sequence[tuple[Any, ...]], n: int) -> list[Any]:
        """Report groups (as :meth:`update_many`) and draw the next ``n`` in one round trip (and, with a
        durable sampler, one store transaction). Returns the ``n`` tasks drawn."""
        return self._update_many(items, then_sample=n)[1]

    def update_many(self, items: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Report several groups in one round trip: ``(task, rewards)`` or ``(task, rewards, costs)`` tuples.

        Returns one result per item (``"applied"`` / ``"already_applied"``). If some were refused, raises
        :class:`UpdateBatchError` after the others were applied; its ``results`` say which (a refused item
        for bad input keeps its lease, so a corrected update can follow)."""
        return self._update_many(items)[0]

    def _update_many(self, items: Sequence[tuple[Any, ...]], then_sample: int | None = None) -> tuple[list[Any], Any]:
        taken: list[tuple[str, str | None]] = []
        payload = []
        try:
            for item in items:
                task, rewards, costs = (*item, None)[:3] if len(item) == 2 else item
                key, lid = self._take_lease(task, None)
                taken.append((key, lid))
                payload.append((task, _plain(rewards), _plain(costs), lid))
        except BaseException:
            for key, lid in reversed(taken):
                self._put_back(key, lid)
            raise
        drawn: list[Any] = []
        try:
            if then_sample is None:
                results = self._call("update_many", payload, retry=True)
            else:
                results, pairs = self._call("update_and_sample", payload, then_sample, self.worker, retry=True)
                for lease_id, task in pairs:
                    self._leases.setdefault(task_key(task), deque()).append(lease_id)
                    drawn.append(task)
        except self._transient_errors() as exc:
            raise LeaseUnconfirmedError(f"update_many of {len(payload)} groups could not be confirmed ({exc}); "
                                        "their leases are dropped; ask lease_status(lease) for each",
                                        ",".join(str(lid) for _, lid in taken)) from exc
        bad = []
        for (key, lid), res in zip(taken, results, strict=True):
            if isinstance(res, BaseException):
                bad.append(res)
                if not isinstance(res, LeaseExpiredError | UnknownLeaseError):
                    self._put_back(key, lid)
        if bad:
            raise UpdateBatchError(f"{len(bad)} of {len(results)} updates refused; first: {bad[0]}", results)
        return results, drawn

    def discard(self, task: Any, *, lease: str | None = None) -> None:
        """Give a group drawn by this worker back without rewards."""
        key, lid = self._take_lease(task, lease)
        self._leased_call("discard", key, lid, (task, lid))

    def held_leases(self) -> dict[str, list[str]]:
        """The leases this worker holds, by task key."""
        return {k: list(q) for k, q in self._leases.items()}

    def lease_status(self, lease: str) -> str:
        """Whether the update naming ``lease`` committed: ``"applied"``, ``"live"``, ``"discarded"``,
        ``"reclaimed"`` or ``"unknown"`` (from the store when the host is durable)."""
        return self._call("lease_status", lease, retry=True)

    def renew(self) -> int:
        """Extend all of this worker's leases (call it during long rollouts)."""
        return self._call("renew", [lid for q in self._leases.values() for lid in q], retry=True)

    def metrics(self) -> dict[str, float]:
        return self._call("metrics", retry=True)

    def outstanding(self) -> dict[str, int]:
        """The shared sampler's outstanding dispatches per task key, every worker's (this worker's own are
        :meth:`held_leases`)."""
        return self._call("outstanding", retry=True)

    @property
    def tasks(self) -> list[Any]:
        """The shared sampler's task list (fetched from the host once)."""
        if self._tasks is None:
            self._tasks = self._call("tasks", retry=True)
        return self._tasks

    @property
    def reward_range(self) -> tuple[float, float]:
        """The shared sampler's declared reward range (fetched from the host once)."""
        if self._reward_range is None:
            low, high = self._call("reward_range", retry=True)
            self._reward_range = (float(low), float(high))
        return self._reward_range

    @property
    def unwrapped(self) -> RemoteSampler:
        """This handle: the sampler itself lives in the host's process, reachable only through the calls
        above (as for every sampler, ``unwrapped`` is the innermost object this process can reach)."""
        return self

    def state_dict(self) -> dict[str, Any]:
        return self._call("state_dict", retry=True)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._call("load_state_dict", state)

    def reclaim_expired(self) -> list[str]:
        return self._call("reclaim_expired", retry=True)

    def release_worker(self, worker: str) -> list[str]:
        return self._call("release_worker", worker, retry=True)

    def leases(self) -> list[dict[str, Any]]:
        """The live leases of this worker (the host shows no worker another's)."""
        return self._call("leases", self.worker, retry=True)

    def ping(self) -> str:
        """The host's incarnation id; it changes when Ray restarts the actor."""
        return self._call("ping")


class LocalClient(RemoteSampler):
    """A :class:`RemoteSampler` for a :class:`~envsched.distributed.SamplerHost` in the same process (no Ray;
    ``host``'s methods are called directly): see :meth:`~envsched.distributed.SamplerHost.client`. A store
    error is not retried here; it propagates (the lease is dropped as unconfirmed)."""

    def __init__(self, host: Any, *, worker: str | None = None) -> None:
        super().__init__(host, worker=worker or f"local:{uuid.uuid4().hex}", retry_s=0.0)

    def _transient_errors(self) -> tuple[type[BaseException], ...]:
        return (StoreError,)

    def _call_once(self, method: str, *args: Any) -> Any:
        return getattr(self.actor, method)(*args)

    def _call(self, method: str, *args: Any, retry: bool = False) -> Any:
        return self._call_once(method, *args)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a LocalClient works only in the process of its host; use launch_sampler for Ray")
