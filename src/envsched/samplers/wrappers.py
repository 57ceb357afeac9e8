"""A base for samplers that wrap another sampler, in the manner of Gymnasium's ``Wrapper``.

A wrapper adds behaviour around one sampler (a history store: :class:`~envsched.store.DurableSampler`) and is
itself a :class:`~envsched.samplers.base.TaskSampler`. :class:`SamplerWrapper` forwards the whole protocol --
``sample``, ``update``, ``discard``, ``metrics``, ``state_dict``, ``load_state_dict``, ``outstanding``,
``tasks`` and ``reward_range`` -- to the wrapped sampler, so a subclass overrides only what it changes.
Anything else belongs to the sampler itself: reach it with :attr:`SamplerWrapper.unwrapped` (the innermost
sampler, through any number of wrappers), e.g. ``durable.unwrapped.explanations()`` for an EnvSched sampler
kept in a store. Attributes are not forwarded implicitly: a wrapper never answers for its sampler by accident.

A wrapper is one of three shapes of object that stand in front of samplers, and all three answer the same
protocol, ``unwrapped`` included (every :class:`~envsched.samplers.base.BaseSampler` answers it with itself,
as Gymnasium's ``Env`` does), and keep the shared semantics of :func:`envsched.testing.check_sampler`:

* a **wrapper** (this class) stands in front of one sampler in this process and forwards to it;
* a **composite**, :class:`~envsched.samplers.shares.SharesSampler`, splits each batch between several
  samplers and routes each update to the one that drew the task; ``unwrapped`` is the composite itself, and
  each source's sampler is ``samplers[source]``;
* a **proxy**, :class:`~envsched.distributed.RemoteSampler`, reaches a sampler in another process (a host
  actor) through calls; ``unwrapped`` is the proxy itself, the innermost object this process can reach.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["SamplerWrapper", "unwrap"]


class SamplerWrapper:
    """Forwards the sampler protocol to :attr:`sampler`; subclasses override what they change.

    Args:
        sampler: the wrapped sampler (any TaskSampler; another wrapper too).
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    @property
    def unwrapped(self) -> Any:
        """The innermost sampler, below every wrapper."""
        return unwrap(self.sampler)

    # ------------------------------------------------------------------ the protocol, forwarded
    def sample(self, n: int) -> list[Any]:
        return self.sampler.sample(n)

    def update(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None) -> Any:
        return self.sampler.update(task, rewards, costs)

    def discard(self, task: Any) -> None:
        self.sampler.discard(task)

    def metrics(self) -> dict[str, float]:
        return self.sampler.metrics()

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)

    def outstanding(self) -> dict[str, int]:
        """Outstanding dispatches per task key (the wrapped sampler's)."""
        return self.sampler.outstanding()

    @property
    def tasks(self) -> list[Any]:
        """The wrapped sampler's task list."""
        return self.sampler.tasks

    @property
    def reward_range(self) -> tuple[float, float]:
        """The wrapped sampler's declared reward range."""
        return self.sampler.reward_range

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sampler!r})"


def unwrap(sampler: Any) -> Any:
    """The innermost sampler of ``sampler`` (``sampler`` itself when it wraps nothing)."""
    while isinstance(sampler, SamplerWrapper):
        sampler = sampler.sampler
    return sampler
