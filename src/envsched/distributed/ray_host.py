"""One sampler shared by many rollout workers: the sampler hosted as a Ray actor.

Distributed trainers run rollouts on many workers (and machines) but need *one* scheduler: its statistics
must see every group. ``launch_sampler`` starts a Ray actor that owns the sampler; every worker holds a
:class:`RemoteSampler` (a :class:`~envsched.samplers.base.TaskSampler`) that forwards ``sample`` and
``update`` to it. The actor runs one call at a time, so concurrent calls are serialised.

Each dispatched group gets a *lease*. The worker's update releases it. A worker that dies leaves its groups
outstanding; once a lease is older than ``lease_timeout_s`` (and not renewed) the host reclaims the group --
``discard`` on the sampler, so the task can be drawn again -- and refuses a late update for it with
:class:`LeaseExpiredError` instead of counting it twice or corrupting the statistics.

Host a :class:`~envsched.store.DurableSampler` (build it in the factory) to also survive the actor's own
death: with ``max_restarts`` Ray reruns the factory, which rebuilds the sampler from its store; the
dispatches that were outstanding get fresh leases.

:class:`SamplerHost` is the actor's plain-Python body and works without Ray (e.g. in threads).
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envsched.pool.spec import task_key

__all__ = ["Lease", "LeaseExpiredError", "RemoteSampler", "SamplerHost", "launch_sampler"]

_RECLAIMED_MEMORY = 100_000
_LEASE_RE = re.compile(r"^[0-9a-f]{8}-[0-9]+$")


class LeaseExpiredError(ValueError):
    """An update (or discard) arrived for a group whose lease expired: the group was reclaimed (discarded)
    and its rewards are not counted."""


@dataclass
class Lease:
    """One dispatched group: its id, task key, the worker it went to, and when it expires (host clock)."""

    lease_id: str
    key: str
    worker: str | None
    issued: float
    deadline: float


def _is_sampler(obj: Any) -> bool:
    return all(hasattr(obj, m) for m in ("sample", "update", "discard", "metrics", "state_dict"))


class SamplerHost:
    """Serialises calls to one sampler and keeps a lease per dispatched group.

    Args:
        sampler: the sampler, or a zero-argument factory that builds it (the way to host it in a Ray actor:
            the factory runs inside the actor process). It needs ``discard`` and ``outstanding``
            (every :class:`BaseSampler` and :class:`DurableSampler` has them).
        lease_timeout_s: a dispatched group not reported (nor renewed) within this many seconds is
            reclaimed.
        group_size: if given, every update must carry exactly this many rewards.
        clock: time source (seconds); injectable for tests.
    """

    def __init__(self, sampler: Any, *, lease_timeout_s: float = 600.0, group_size: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not _is_sampler(sampler):
            if not callable(sampler):
                raise TypeError(f"sampler must be a sampler or a factory returning one, got {type(sampler).__name__}")
            sampler = sampler()
            if not _is_sampler(sampler):
                raise TypeError(f"the factory returned {type(sampler).__name__}, not a sampler")
        if not (isinstance(lease_timeout_s, int | float) and lease_timeout_s > 0):
            raise ValueError(f"lease_timeout_s must be a positive number, got {lease_timeout_s!r}")
        if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                       or group_size < 1):
            raise ValueError(f"group_size must be a positive integer or None, got {group_size!r}")
        self.sampler = sampler
        self.lease_timeout_s = float(lease_timeout_s)
        self.group_size = group_size
        self._clock = clock
        self._lock = threading.RLock()
        self._epoch = uuid.uuid4().hex[:8]
        self._counter = 0
        self._leases: dict[str, Lease] = {}
        self._by_key: dict[str, deque[str]] = {}
        self._reclaimed: OrderedDict[str, Lease] = OrderedDict()
        self._reclaimed_groups = 0
        self._adopt_outstanding()

    # ------------------------------------------------------------------ leases
    def _adopt_outstanding(self) -> None:
        """Give a lease (owner unknown) to every dispatch the sampler already has outstanding, e.g. after the
        host was restarted on a store: those groups are reclaimed if nobody reports them in time."""
        self._leases.clear()
        self._by_key.clear()
        outstanding = self.sampler.outstanding() if hasattr(self.sampler, "outstanding") else {}
        for key, count in outstanding.items():
            for _ in range(int(count)):
                self._new_lease(key, None)

    def _new_lease(self, key: str, worker: str | None) -> Lease:
        self._counter += 1
        now = self._clock()
        lease = Lease(f"{self._epoch}-{self._counter}", key, worker, now, now + self.lease_timeout_s)
        self._leases[lease.lease_id] = lease
        self._by_key.setdefault(key, deque()).append(lease.lease_id)
        return lease

    def _drop_lease(self, lease: Lease) -> None:
        del self._leases[lease.lease_id]
        q = self._by_key.get(lease.key)
        if q is not None:
            q.remove(lease.lease_id)
            if not q:
                del self._by_key[lease.key]

    def _discard_in_sampler(self, key: str, reason: str) -> None:
        try:
            self.sampler.discard(key, reason=reason)
        except TypeError:
            self.sampler.discard(key)

    def _reclaim(self, leases: list[Lease], reason: str) -> list[str]:
        done = []
        for lease in leases:
            self._discard_in_sampler(lease.key, reason)
            self._drop_lease(lease)
            self._reclaimed[lease.lease_id] = lease
            while len(self._reclaimed) > _RECLAIMED_MEMORY:
                self._reclaimed.popitem(last=False)
            self._reclaimed_groups += 1
            done.append(lease.lease_id)
        return done

    def reclaim_expired(self) -> list[str]:
        """Discard every group whose lease expired; returns their lease ids. Runs before every call too."""
        with self._lock:
            now = self._clock()
            expired = [lease for lease in self._leases.values() if lease.deadline <= now]
            return self._reclaim(expired, f"lease expired after {self.lease_timeout_s:g} s")

    def release_worker(self, worker: str) -> list[str]:
        """Reclaim at once every group leased to ``worker`` (e.g. the trainer saw it die)."""
        with self._lock:
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
                lease = self._leases.get(lid)
                if lease is not None:
                    lease.deadline = now + self.lease_timeout_s
                    live += 1
            return live

    def leases(self) -> list[dict[str, Any]]:
        """The live leases (id, task key, worker, seconds left)."""
        with self._lock:
            now = self._clock()
            return [{"lease": x.lease_id, "key": x.key, "worker": x.worker, "expires_in_s": x.deadline - now}
                    for x in self._leases.values()]

    def _find_lease(self, key: str, lease_id: str | None) -> Lease | None:
        if lease_id is not None:
            lease = self._leases.get(lease_id)
            if lease is None:
                old = self._reclaimed.get(lease_id)
                if old is not None:
                    raise LeaseExpiredError(f"the group of task {old.key!r} (lease {lease_id}) was reclaimed "
                                            f"after {self.lease_timeout_s:g} s without an update; its rewards "
                                            "are refused (the task can be drawn again)")
                if (isinstance(lease_id, str) and _LEASE_RE.match(lease_id)
                        and not lease_id.startswith(f"{self._epoch}-")):
                    # issued by an earlier incarnation of the host (restarted on its store): its groups were
                    # adopted with owner-less leases
                    return self._find_lease(key, None)
                raise ValueError(f"unknown lease {lease_id!r} for task {key!r}: not issued by this sampler host")
            if lease.key != key:
                raise ValueError(f"lease {lease_id} belongs to task {lease.key!r}, not {key!r}")
            return lease
        q = self._by_key.get(key)
        if q:
            return self._leases[q[0]]
        if any(old.key == key for old in reversed(self._reclaimed.values())):
            raise LeaseExpiredError(f"task {key!r} has no live dispatch: its group was reclaimed after "
                                    f"{self.lease_timeout_s:g} s without an update; its rewards are refused")
        return None

    # ------------------------------------------------------------------ the protocol, serialised
    def sample(self, n: int, worker: str | None = None) -> list[tuple[str, Any]]:
        """Draw ``n`` tasks; returns ``(lease_id, task)`` pairs."""
        with self._lock:
            self.reclaim_expired()
            tasks = self.sampler.sample(n)
            return [(self._new_lease(task_key(t), worker).lease_id, t) for t in tasks]

    def update(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None,
               lease: str | None = None) -> None:
        """Report one group (``lease``: the id :meth:`sample` returned; else the task's oldest live lease)."""
        with self._lock:
            self.reclaim_expired()
            key = task if isinstance(task, str) else task_key(task)
            if self.group_size is not None and hasattr(rewards, "__len__") and len(rewards) != self.group_size:
                raise ValueError(f"rewards for task {key!r} have {len(rewards)} entries, expected group_size="
                                 f"{self.group_size} (one reward per rollout, None for an unscored one)")
            found = self._find_lease(key, lease)
            self.sampler.update(task, rewards, costs)  # raises on bad input; the lease stays
            if found is not None:
                self._drop_lease(found)

    def discard(self, task: Any, lease: str | None = None) -> None:
        """Give a dispatched group back without rewards."""
        with self._lock:
            self.reclaim_expired()
            key = task if isinstance(task, str) else task_key(task)
            found = self._find_lease(key, lease)
            self._discard_in_sampler(key, "discarded by worker")
            if found is not None:
                self._drop_lease(found)

    def metrics(self) -> dict[str, float]:
        """The sampler's metrics plus ``leases`` (live) and ``reclaimed_groups``."""
        with self._lock:
            self.reclaim_expired()
            m = dict(self.sampler.metrics())
            m["leases"] = float(len(self._leases))
            m["reclaimed_groups"] = float(self._reclaimed_groups)
            return m

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a sampler state; outstanding dispatches in it get fresh leases."""
        with self._lock:
            self.sampler.load_state_dict(state)
            self._adopt_outstanding()

    def ping(self) -> str:
        """The host's incarnation id (changes when the actor is restarted)."""
        return self._epoch


# ---------------------------------------------------------------------------------------------- Ray
def _ray() -> Any:
    try:
        import ray
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("envsched.distributed needs Ray: pip install 'envsched[ray]'") from None
    return ray


def launch_sampler(sampler_factory: Callable[[], Any], *, lease_timeout_s: float = 600.0,
                   group_size: int | None = None, name: str | None = None, namespace: str | None = None,
                   max_restarts: int = 0, detached: bool = False, **actor_options: Any) -> RemoteSampler:
    """Start the sampler host as a Ray actor and return a :class:`RemoteSampler` for it.

    ``sampler_factory`` runs inside the actor (build a :class:`~envsched.store.DurableSampler` there to make
    the shared sampler durable; with ``max_restarts`` > 0 Ray reruns it after the actor dies, and it rebuilds
    the sampler from the store). ``name`` lets other drivers find it with :meth:`RemoteSampler.connect`.
    The actor takes no CPU (``num_cpus=0``) unless ``actor_options`` say otherwise. Ray must be initialised.
    Keep the returned handle (or pass ``detached=True``): Ray ends a non-detached actor when its creator's
    handles are gone.
    """
    ray = _ray()
    options: dict[str, Any] = {"num_cpus": 0, "max_restarts": max_restarts, "max_concurrency": 1}
    if name is not None:
        options["name"] = name
    if namespace is not None:
        options["namespace"] = namespace
    if detached:
        options["lifetime"] = "detached"
    options.update(actor_options)
    actor_cls = ray.remote(SamplerHost)
    handle = actor_cls.options(**options).remote(sampler_factory, lease_timeout_s=lease_timeout_s,
                                                 group_size=group_size)
    remote = RemoteSampler(handle)
    remote._call("ping")  # surfaces a failing factory here, not at the first sample
    return remote


class RemoteSampler:
    """A worker's handle on the shared sampler: a TaskSampler whose calls run in the host actor.

    It remembers the lease of every group it drew and sends it with the update. Pickle it into Ray tasks
    freely: each unpickled copy is a new worker (own id, no leases).
    """

    def __init__(self, actor: Any, *, worker: str | None = None) -> None:
        self.actor = actor
        self._explicit_worker = worker
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._leases: dict[str, deque[str]] = {}

    @classmethod
    def connect(cls, name: str, *, namespace: str | None = None, worker: str | None = None) -> RemoteSampler:
        """Attach to a host launched with ``name``."""
        return cls(_ray().get_actor(name, namespace=namespace), worker=worker)

    def __getstate__(self) -> dict[str, Any]:
        return {"actor": self.actor, "worker": self._explicit_worker}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["actor"], worker=state["worker"])  # type: ignore[misc]

    def _call(self, method: str, *args: Any) -> Any:
        ray = _ray()
        try:
            return ray.get(getattr(self.actor, method).remote(*args))
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise

    def sample(self, n: int) -> list[Any]:
        pairs = self._call("sample", n, self.worker)
        out = []
        for lease_id, task in pairs:
            self._leases.setdefault(task_key(task), deque()).append(lease_id)
            out.append(task)
        return out

    def _pop_lease(self, task: Any) -> tuple[str, str | None]:
        key = task if isinstance(task, str) else task_key(task)
        q = self._leases.get(key)
        return key, (q[0] if q else None)

    def _forget(self, key: str, lease: str | None) -> None:
        if lease is not None:
            q = self._leases[key]
            q.popleft()
            if not q:
                del self._leases[key]

    def update(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None) -> None:
        key, lease = self._pop_lease(task)
        try:
            self._call("update", task, list(rewards) if not isinstance(rewards, str | bytes) else rewards,
                       None if costs is None else list(costs), lease)
        except LeaseExpiredError:
            self._forget(key, lease)
            raise
        self._forget(key, lease)

    def discard(self, task: Any) -> None:
        key, lease = self._pop_lease(task)
        try:
            self._call("discard", task, lease)
        except LeaseExpiredError:
            self._forget(key, lease)
            raise
        self._forget(key, lease)

    def renew(self) -> int:
        """Extend all of this worker's leases (call it during long rollouts)."""
        return self._call("renew", [lid for q in self._leases.values() for lid in q])

    def metrics(self) -> dict[str, float]:
        return self._call("metrics")

    def state_dict(self) -> dict[str, Any]:
        return self._call("state_dict")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._call("load_state_dict", state)

    def reclaim_expired(self) -> list[str]:
        return self._call("reclaim_expired")

    def release_worker(self, worker: str) -> list[str]:
        return self._call("release_worker", worker)

    def leases(self) -> list[dict[str, Any]]:
        return self._call("leases")

    def ping(self) -> str:
        """The host's incarnation id; it changes when Ray restarts the actor."""
        return self._call("ping")
