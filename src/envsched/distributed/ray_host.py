"""The sampler host on Ray: :func:`launch_sampler` starts a :class:`~envsched.distributed.host.SamplerHost` as
a Ray actor and returns a :class:`~envsched.distributed.client.RemoteSampler` for it.

The host itself (leases, durability, group commit) is described in :mod:`envsched.distributed.host`, the
workers' handles in :mod:`envsched.distributed.client`. This module also gathers the public names of the
shared sampler, which :mod:`envsched.distributed` exports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envsched.distributed.client import LeaseUnconfirmedError, LocalClient, RemoteSampler, UpdateBatchError
from envsched.distributed.host import Lease, SamplerHost
from envsched.distributed.ray_support import ray_module, release_name
from envsched.store.leases import LeaseConflictError, LeaseExpiredError, UnknownLeaseError

__all__ = ["Lease", "LeaseConflictError", "LeaseExpiredError", "LeaseUnconfirmedError", "LocalClient",
           "RemoteSampler", "SamplerHost", "UnknownLeaseError", "UpdateBatchError", "launch_sampler", "release_name"]


def launch_sampler(sampler_factory: Callable[[], Any], *, lease_timeout_s: float = 600.0,
                   group_size: int | None = None, name: str | None = None, namespace: str | None = None,
                   max_restarts: int = 0, detached: bool = False, store_retry_s: float = 600.0,
                   **actor_options: Any) -> RemoteSampler:
    """Start the sampler host as a Ray actor and return a :class:`RemoteSampler` for it.

    ``sampler_factory`` runs inside the actor. Build a :class:`~envsched.store.DurableSampler` there to make
    the shared sampler durable; with ``max_restarts`` != 0 Ray reruns the factory after the actor dies, and
    it rebuilds the sampler (and the open leases) from the store, retrying an unreachable store for
    ``store_retry_s``. ``max_restarts`` != 0 with a sampler that is not durable is refused (``ValueError``;
    the host would restart from zero). ``name`` lets other drivers find it with
    :meth:`RemoteSampler.connect`; a dead host's name is freed with :func:`release_name`. The actor takes no
    CPU (``num_cpus=0``) unless ``actor_options`` say otherwise. Ray must be initialised. Keep the returned
    handle (or pass ``detached=True``): Ray ends a non-detached actor when its creator's handles are gone.
    """
    ray = ray_module()
    # calls run in up to 32 threads; the host serialises them, and a durable sampler commits the calls that
    # queued up meanwhile in one transaction (group commit)
    options: dict[str, Any] = {"num_cpus": 0, "max_restarts": max_restarts, "max_concurrency": 32}
    if name is not None:
        options["name"] = name
    if namespace is not None:
        options["namespace"] = namespace
    if detached:
        options["lifetime"] = "detached"
    options.update(actor_options)
    actor_cls = ray.remote(SamplerHost)
    try:
        handle = actor_cls.options(**options).remote(sampler_factory, lease_timeout_s=lease_timeout_s,
                                                     group_size=group_size, store_retry_s=store_retry_s)
    except Exception as exc:
        if name is not None and ("AlreadyExists" in type(exc).__name__ or "already taken" in str(exc)):
            raise ValueError(f"a Ray actor named {name!r} already exists (a live host: connect with "
                             f"RemoteSampler.connect({name!r}); a dead one keeps its name: free it with "
                             f"envsched.distributed.release_name({name!r}) and launch again)") from exc
        raise
    remote = RemoteSampler(handle)
    try:
        durable = remote._call("is_durable")  # surfaces a failing factory here, not at the first sample
    except BaseException:
        ray.kill(handle, no_restart=True)
        raise
    if max_restarts != 0 and not durable:
        ray.kill(handle, no_restart=True)
        raise ValueError(f"max_restarts={max_restarts} needs a durable sampler: a host restarted without a store "
                         "starts from zero and forgets every update. Build a DurableSampler in the factory, or "
                         "use max_restarts=0")
    return remote
