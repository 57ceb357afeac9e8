"""What the workers' handles (:mod:`envsched.distributed.client`) and the sampler host
(:mod:`envsched.distributed.host`, :mod:`envsched.distributed.ray_host`) both need to know about Ray and the
store: importing Ray on demand, which failures are worth retrying, whether an actor is gone for good or being
re-created, and freeing a dead host's actor name.

Ray is imported only inside these functions, so importing :mod:`envsched.distributed` works without it.
"""

from __future__ import annotations

import time
from typing import Any

from envsched.store.errors import StoreCorruptError, StoreError, StoreMismatchError

__all__ = ["dead_for_good", "in_restarted_actor", "ray_module", "release_name", "retryable_errors", "transient"]


def ray_module() -> Any:
    """The ``ray`` module; ``ImportError`` saying how to install it when it is missing."""
    try:
        import ray
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("envsched.distributed needs Ray: pip install 'envsched[ray]'") from None
    return ray


def transient(exc: StoreError) -> bool:
    """A store error worth retrying: unreachable or locked, not a damaged or mismatched store."""
    return not isinstance(exc, StoreCorruptError | StoreMismatchError)


def retryable_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """The Ray errors of a call to an actor that may be restarting (this Ray version's classes)."""
    ex = ray.exceptions
    kinds: list[type[BaseException]] = [ex.RayActorError]
    for name in ("ActorUnavailableError", "GetTimeoutError"):
        if hasattr(ex, name):
            kinds.append(getattr(ex, name))
    return tuple(kinds)


def dead_for_good(exc: BaseException) -> bool:
    """An ActorDiedError of an actor Ray will not restart (killed with no_restart, out of restarts)."""
    ray = ray_module()
    unavailable = getattr(ray.exceptions, "ActorUnavailableError", None)
    if unavailable is not None and isinstance(exc, unavailable):
        return False
    text = str(exc).lower()
    return any(x in text for x in ("no_restart", "max_restarts", "restarted too many times", "ray.kill",
                                   "creation task", "__init__"))


def in_restarted_actor() -> bool:
    """True inside a Ray actor that Ray is re-creating after it died (False without Ray)."""
    try:
        import ray
    except ImportError:  # pragma: no cover - depends on the environment
        return False
    try:
        if not ray.is_initialized():
            return False
        ctx = ray.get_runtime_context()
        return bool(ctx.get_actor_id()) and bool(ctx.was_current_actor_reconstructed)
    except Exception:
        return False


def release_name(name: str, *, namespace: str | None = None) -> bool:
    """Free the Ray actor name of a sampler host so that :func:`~envsched.distributed.launch_sampler` can use
    it again.

    Kills the actor registered under ``name`` (dead or alive, without restart) and waits until Ray has
    released the name. Returns ``False`` when no actor had that name. Call it after a host died for good
    (``ActorDiedError``; with ``max_restarts=0`` Ray keeps the dead actor's name), or to replace a host.
    """
    ray = ray_module()
    try:
        handle = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            return True
        time.sleep(0.1)
    raise RuntimeError(f"Ray did not release the actor name {name!r} within 30 s")
