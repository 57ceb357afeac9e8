"""SamplerWrapper: the protocol forwarded, ``.unwrapped`` through any number of wrappers, nothing else
forwarded implicitly; DurableSampler is one. And the package's error base on the store and host errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envsched.errors import EnvSchedError
from envsched.pool import TaskPool
from envsched.samplers import UniformSampler
from envsched.samplers.wrappers import SamplerWrapper, unwrap
from envsched.store import DurableSampler

POOL = TaskPool([{"id": f"t{i}", "env": f"e{i % 2}"} for i in range(8)], reward_range=(0.0, 2.0))


class Counting(SamplerWrapper):
    """Counts the updates it forwards; changes nothing else."""

    def __init__(self, sampler: Any) -> None:
        super().__init__(sampler)
        self.updates = 0

    def update(self, task: Any, rewards: Any, costs: Any = None) -> Any:
        self.updates += 1
        return super().update(task, rewards, costs)


def test_the_protocol_is_forwarded_and_unwrapped_reaches_the_innermost_sampler() -> None:
    inner = UniformSampler(POOL, seed=4)
    twice = Counting(Counting(inner))
    plain = UniformSampler(POOL, seed=4)
    batch = twice.sample(3)
    assert [t["id"] for t in batch] == [t["id"] for t in plain.sample(3)]
    twice.update(batch[0], [2.0, 0.0])
    twice.discard(batch[1])
    assert twice.updates == 1 and twice.sampler.updates == 1
    assert twice.outstanding() == {batch[2]["id"]: 1}
    assert twice.tasks == inner.tasks and twice.reward_range == (0.0, 2.0)
    assert twice.metrics()["groups"] == 1.0 and twice.metrics()["discarded_groups"] == 1.0
    state = twice.state_dict()
    fresh = Counting(UniformSampler(POOL, seed=4))
    fresh.load_state_dict(state)
    assert fresh.unwrapped.state_dict() == inner.state_dict()
    assert twice.unwrapped is inner and unwrap(twice) is inner and unwrap(inner) is inner
    with pytest.raises(AttributeError):
        twice.position_of  # noqa: B018 - a sampler's own method is reached through .unwrapped, not forwarded
    assert twice.unwrapped.position_of(batch[0]) == inner.position_of(batch[0])
    assert repr(twice).startswith("Counting(Counting(UniformSampler(8 tasks")


def test_durable_sampler_is_a_wrapper(tmp_path: Path) -> None:
    inner = UniformSampler(POOL, seed=1)
    d = DurableSampler(inner, tmp_path / "h.sqlite")
    assert isinstance(d, SamplerWrapper) and d.unwrapped is inner and d.sampler is inner
    task = d.sample(1)[0]
    assert d.outstanding() == {task["id"]: 1} and d.tasks == inner.tasks and d.reward_range == (0.0, 2.0)
    d.update(task, [1.0])
    assert d.metrics()["store_events"] == 2.0  # the wrapper's own metrics still override
    d.close()


def test_store_and_host_errors_derive_from_envsched_error_and_keep_their_builtin_base() -> None:
    from envsched.distributed import LeaseUnconfirmedError, UpdateBatchError
    from envsched.store import (
        LeaseConflictError,
        LeaseExpiredError,
        ReplayDivergenceError,
        StoreCorruptError,
        StoreError,
        StoreMismatchError,
        UnknownLeaseError,
    )
    from envsched.testing import SamplerCheckError

    for cls, base in ((StoreError, RuntimeError), (StoreCorruptError, RuntimeError), (StoreMismatchError, ValueError),
                      (ReplayDivergenceError, RuntimeError), (LeaseExpiredError, ValueError),
                      (LeaseConflictError, ValueError), (UnknownLeaseError, ValueError),
                      (LeaseUnconfirmedError, RuntimeError), (UpdateBatchError, ValueError),
                      (SamplerCheckError, AssertionError)):
        assert issubclass(cls, EnvSchedError) and issubclass(cls, base), cls


# ---------------------------------------------------------------- the three shapes of a sampler front
def test_every_sampler_answers_unwrapped_wrapped_or_not() -> None:
    plain = UniformSampler(POOL, seed=0)
    assert plain.unwrapped is plain and Counting(plain).unwrapped is plain


def test_shares_sampler_is_a_composite_that_answers_the_whole_protocol() -> None:
    from envsched.samplers.shares import SharesSampler

    s = SharesSampler.from_pool(POOL, {"e0": 1, "e1": 1}, lambda tasks, src: UniformSampler(tasks, seed=3,
                                                                                          reward_range=(0.0, 2.0)))
    assert s.unwrapped is s and s.reward_range == (0.0, 2.0)
    batch = s.sample(4)
    keys = [t["id"] for t in batch]
    assert s.outstanding() == dict.fromkeys(keys, 1)
    s.update(keys[0], [2.0, 0.0])  # a task named by its key is routed to its source
    assert s.samplers[s.source_of_task(keys[0])].metrics()["groups"] == 1.0
    with pytest.raises(KeyError, match="nope"):
        s.update("nope", [1.0, 0.0])
    s.discard(batch[1])
    m = s.metrics()
    assert (m["dispatched_groups"], m["discarded_groups"], m["outstanding_groups"], m["groups"]) == (4, 1, 2, 1)
    with pytest.raises(ValueError, match="exceeds the batch limit MAX_BATCH"):
        s.sample(10**12)
    with pytest.raises(ValueError, match="exceeds what source 'e0' can draw"):
        s.sample(9)  # e0 owes 5 of 9, its sampler holds 4 distinct tasks


def test_shares_sampler_refuses_a_task_in_two_sources_and_mixed_reward_ranges() -> None:
    from envsched.samplers.shares import SharesSampler

    with pytest.raises(ValueError, match="'t0' is in the samplers of sources 'a' and 'b'"):
        SharesSampler({"a": UniformSampler(POOL, seed=0), "b": UniformSampler(POOL, seed=1)}, {"a": 1, "b": 1})
    mixed = SharesSampler({"e0": UniformSampler(POOL[:4], seed=0, reward_range=(0.0, 2.0)),
                           "e1": UniformSampler(POOL[4:], seed=0, reward_range=(0.0, 1.0))}, {"e0": 1, "e1": 1})
    with pytest.raises(AttributeError, match="2 reward ranges"):
        mixed.reward_range  # noqa: B018


def test_the_remote_client_answers_the_whole_protocol_from_the_host() -> None:
    from envsched.distributed.ray_host import SamplerHost

    inner = UniformSampler(POOL, seed=2)
    client = SamplerHost(inner).client()
    assert client.unwrapped is client
    assert client.tasks == list(inner.tasks) and client.reward_range == (0.0, 2.0)
    batch = client.sample(3)
    other = SamplerHost(inner).client()  # another worker of the same sampler sees every dispatch
    assert other.outstanding() == client.outstanding() == {t["id"]: 1 for t in batch} == inner.outstanding()
    with pytest.raises(ValueError, match="must be a sequence"):
        client.update(batch[0], {"a": 1.0})  # refused by name, not turned into the list of its keys
    assert client.held_leases().keys() == {t["id"] for t in batch}  # the refused update kept its lease
