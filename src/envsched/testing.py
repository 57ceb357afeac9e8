"""Conformance checks for samplers, in the manner of Gymnasium's ``check_env``.

:func:`check_sampler` runs every rule of the semantics envsched's samplers share (OpenEnv RFC 013's
``TaskSampler`` protocol plus envsched's guarantees) on samplers built by a factory, and raises
:class:`SamplerCheckError` naming the first rule that fails. The test suite runs it over every registered
sampler; run it on your own sampler before registering it with
:func:`envsched.samplers.registry.register_sampler`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from envsched.errors import EnvSchedError
from envsched.pool.pool import TaskPool
from envsched.pool.spec import task_key
from envsched.samplers.base import MAX_BATCH, BaseSampler, TaskSampler
from envsched.validation import is_number

__all__ = ["BAD_SAMPLE_SIZES", "BAD_UPDATES", "METRIC_KEYS", "RULES", "SamplerCheckError", "bad_updates",
           "check_sampler"]

#: The rules :func:`check_sampler` runs, in order; :attr:`SamplerCheckError.rule` is one of them.
RULES: tuple[str, ...] = (
    "protocol", "metrics-keys", "determinism", "none-rewards", "bad-updates", "bad-tasks", "bad-sample-sizes",
    "state-round-trip", "discard", "async-order", "sample-atomic",
)

#: Keys every sampler's ``metrics()`` holds (RFC 013's counters and rates, and dispatch bookkeeping).
METRIC_KEYS: tuple[str, ...] = (
    "groups", "signal_groups", "episodes", "unscored_episodes", "cost", "signal_groups_per_episode",
    "signal_groups_per_cost", "zero_signal_fraction", "dispatched_groups", "discarded_groups", "outstanding_groups",
)

_LOW, _HIGH = object(), object()  # stand for the sampler's declared reward bounds in the table below

#: name -> (rewards, costs, regular expression the ``ValueError`` message must match). ``_LOW``/``_HIGH``
#: stand for the sampler's declared reward range; every row is refused with the state unchanged.
BAD_UPDATES: dict[str, tuple[Any, Any, str]] = {
    "nan reward": ([_LOW, math.nan, _HIGH, _HIGH], None, r"rewards\[1\].*must be finite"),
    "inf reward": ([_LOW, _HIGH, math.inf, _HIGH], None, r"rewards\[2\].*must be finite"),
    "-inf reward": ([-math.inf, _HIGH, _HIGH, _HIGH], None, r"rewards\[0\].*must be finite"),
    "numpy nan reward": (np.array([0.0, np.nan, 1.0, 1.0]), None, r"rewards\[1\].*must be finite"),
    "reward above range": ([_LOW, _HIGH, _HIGH, 7.0], None, "outside the declared reward range"),
    "reward below range": ([-0.5, _HIGH, _HIGH, _HIGH], None, "outside the declared reward range"),
    "bool reward": ([True, _LOW], None, r"rewards\[0\].*must be a number or None"),
    "string reward": ([_LOW, "1"], None, r"rewards\[1\].*must be a number or None"),
    "list reward": ([[1.0], _LOW], None, r"rewards\[0\].*must be a number or None"),
    "empty rewards": ([], None, "are empty"),
    "rewards as a string": ("11", None, "must be a sequence"),
    "rewards as bytes": (b"\x00\x01", None, "must be a sequence"),
    "rewards as a dict": ({"a": 1.0}, None, "must be a sequence"),
    "rewards as a number": (1.0, None, "must be a sequence"),
    "rewards as None": (None, None, "must be a sequence"),
    "too few costs": ([_LOW, _HIGH], [1.0], "have 1 entries for 2 rewards"),
    "too many costs": ([_LOW, _HIGH], [1.0, 1.0, 1.0], "have 3 entries for 2 rewards"),
    "negative cost": ([_LOW, _HIGH], [1.0, -2.0], r"costs\[1\].*finite and >= 0"),
    "nan cost": ([_LOW, _HIGH], [math.nan, 1.0], r"costs\[0\].*finite and >= 0"),
    "inf cost": ([_LOW, _HIGH], [1.0, math.inf], r"costs\[1\].*finite and >= 0"),
    "None cost": ([_LOW, _HIGH], [None, 1.0], r"costs\[0\].*must be a number"),
    "bool cost": ([_LOW, _HIGH], [True, 1.0], r"costs\[0\].*must be a number"),
    "string cost": ([_LOW, _HIGH], [1.0, "2"], r"costs\[1\].*must be a number"),
    "costs as a string": ([_LOW, _HIGH], "12", "costs .*must be a sequence"),
    "costs that overflow the counter": ([_LOW, _HIGH], [1e308, 1e308], "cost counter would become infinite"),
}

#: Values of ``n`` that ``sample(n)`` refuses with ``ValueError`` (plus ``max_sample_size() + 1``).
BAD_SAMPLE_SIZES: tuple[Any, ...] = (0, -1, 1.5, True, False, "3", None, np.float64(2.0), [2], 10**12, 2**63)

_GROUP = 4


def bad_updates(reward_range: tuple[float, float] = (0.0, 1.0)) -> dict[str, tuple[Any, Any, str]]:
    """:data:`BAD_UPDATES` with the reward bounds filled in: name -> (rewards, costs, message pattern)."""
    low, high = float(reward_range[0]), float(reward_range[1])
    fill = {id(_LOW): low, id(_HIGH): high}
    return {name: ([fill.get(id(r), r) for r in rewards] if isinstance(rewards, list) else rewards, costs, match)
            for name, (rewards, costs, match) in BAD_UPDATES.items()}


class SamplerCheckError(EnvSchedError, AssertionError):
    """A sampler broke a rule of the shared semantics. ``rule`` is the rule's name (one of :data:`RULES`);
    the message says what was expected and what happened."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


SamplerFactory = Callable[[TaskPool, int], Any]


def default_check_pool() -> TaskPool:
    """The pool :func:`check_sampler` uses unless given one: 12 tasks over 3 environments, with difficulties,
    instructions and tools (so samplers that build features from them have something to read)."""
    return TaskPool([{"id": f"t{i:02d}", "env": f"env{i % 3}", "difficulty": i % 3,
                      "instruction": f"{['book', 'cancel', 'list', 'sum'][i % 4]} item {i}",
                      "tools": [{"name": f"tool{i % 4}", "description": "a tool"}]} for i in range(12)])


def check_sampler(sampler_factory: SamplerFactory, *, pool: TaskPool | None = None, seeded: bool = True,
                  skip: tuple[str, ...] = ()) -> None:
    """Check that samplers built by ``sampler_factory`` keep every rule of the shared semantics.

    ``sampler_factory(pool, seed)`` must return a new sampler over ``pool`` seeded with ``seed``; it is
    called several times. The rules (:data:`RULES`), each on fresh samplers:

    * ``protocol``: the object is a ``TaskSampler`` with ``discard`` and ``outstanding``; ``sample(n)``
      returns ``n`` tasks of the pool (distinct when the sampler says ``distinct_per_batch``).
    * ``metrics-keys``: ``metrics()`` holds every key of :data:`METRIC_KEYS`, as finite numbers, and is JSON.
    * ``determinism``: two samplers with one seed draw the same tasks given the same rewards (and, when
      ``seeded``, two seeds draw differently).
    * ``none-rewards``: a ``None`` reward counts in ``groups``, ``episodes`` and ``cost`` and never as a
      score (signal needs two scored rewards that differ); a twin fed the same groups with the ``None``\\s
      removed draws the same next tasks.
    * ``bad-updates``: every row of :data:`BAD_UPDATES` raises ``ValueError`` naming the problem, with
      ``state_dict()`` and ``metrics()`` unchanged, and the sampler still accepts a good update after.
    * ``bad-tasks``: an unknown task or one without an ``id`` raises ``KeyError``; an update without an
      outstanding dispatch, or a second update for one dispatch, raises ``ValueError``; state unchanged.
    * ``bad-sample-sizes``: every ``n`` of :data:`BAD_SAMPLE_SIZES` and ``max_sample_size() + 1`` raise
      ``ValueError`` with the state unchanged.
    * ``state-round-trip``: ``state_dict()`` survives JSON, loads into a sampler built with another seed
      (outstanding dispatches included), and the restored sampler makes the same next draws.
    * ``discard``: ``discard(task)`` releases one dispatch and counts it; discarding a task with no
      outstanding dispatch raises ``ValueError`` with the state unchanged.
    * ``async-order``: updates may arrive late and out of order (a later batch reported before an earlier
      one); ``outstanding()`` always holds exactly the unreported dispatches.
    * ``sample-atomic``: for a :class:`~envsched.samplers.base.BaseSampler`, a ``sample`` that fails inside
      its selection (the k-th call to its random generator raises, for every k it makes, at three points of a
      stream) leaves the state, the metrics and the next draws as they were.

    Args:
        sampler_factory: ``(pool, seed) -> sampler``.
        pool: the task pool to check on; default :func:`default_check_pool` (12 tasks, 3 environments).
        seeded: whether the sampler draws at random (``False`` for a fixed order such as
            ``SequentialSampler``: the check that two seeds draw differently is then skipped).
        skip: names of rules not to run (documented exceptions of your sampler).

    Raises:
        SamplerCheckError: the first rule broken, by name (``err.rule``).

    Example:
        ```python
        from envsched.samplers import UniformSampler
        from envsched.testing import check_sampler

        check_sampler(lambda pool, seed: UniformSampler(pool, seed=seed))
        ```
    """
    unknown = sorted(set(skip) - set(RULES))
    if unknown:
        raise ValueError(f"skip names unknown rules {unknown}; the rules are {list(RULES)}")
    pool = default_check_pool() if pool is None else pool
    if len(pool) < 4:
        raise ValueError(f"check_sampler needs a pool of at least 4 tasks, got {len(pool)}")
    checker = _Checker(sampler_factory, pool, seeded)
    for rule in RULES:
        if rule in skip:
            continue
        with _rule(rule):
            getattr(checker, "check_" + rule.replace("-", "_"))()


@contextmanager
def _rule(rule: str) -> Iterator[None]:
    """Turn any failure inside one rule into a :class:`SamplerCheckError` naming it."""
    try:
        yield
    except SamplerCheckError:
        raise
    except AssertionError as exc:
        raise SamplerCheckError(rule, str(exc)) from exc
    except Exception as exc:
        raise SamplerCheckError(rule, f"unexpected {type(exc).__name__}: {exc}") from exc


def _frozen(sampler: Any) -> tuple[str, str]:
    """A comparable form of the sampler's state and metrics (NaN-safe)."""
    return (json.dumps(sampler.state_dict(), sort_keys=True, default=str),
            json.dumps(sampler.metrics(), sort_keys=True, default=str))


def _keys(batch: list[Any]) -> list[str]:
    return [task_key(t) for t in batch]


class _Checker:
    def __init__(self, factory: SamplerFactory, pool: TaskPool, seeded: bool) -> None:
        self.factory = factory
        self.pool = pool
        self.seeded = seeded

    # ------------------------------------------------------------------ helpers
    def make(self, seed: int = 7) -> Any:
        return self.factory(self.pool, seed)

    def bounds(self, sampler: Any) -> tuple[float, float]:
        low, high = getattr(sampler, "reward_range", self.pool.reward_range)
        return float(low), float(high)

    def rewards(self, sampler: Any, pattern: list[Any]) -> list[Any]:
        """``pattern`` with 0/1/``_LOW``/``_HIGH`` mapped onto the sampler's reward range (``None`` kept)."""
        low, high = self.bounds(sampler)
        out = []
        for r in pattern:
            if r is _LOW or (type(r) is int and r == 0):
                out.append(low)
            elif r is _HIGH or (type(r) is int and r == 1):
                out.append(high)
            else:
                out.append(r)
        return out

    def limit(self, sampler: Any, n: int) -> int:
        top = sampler.max_sample_size() if hasattr(sampler, "max_sample_size") else None
        return n if top is None else min(n, top)

    def draws(self, sampler: Any, steps: int, n: int, rng_seed: int = 0) -> list[list[str]]:
        """Draw ``steps`` batches of ``n``, reporting seeded random 0/1 rewards for each task."""
        rng = np.random.default_rng(rng_seed)
        low, high = self.bounds(sampler)
        out = []
        for _ in range(steps):
            batch = sampler.sample(self.limit(sampler, n))
            out.append(_keys(batch))
            for t in batch:
                sampler.update(t, [high if x else low for x in rng.integers(0, 2, size=_GROUP)])
        return out

    def refused(self, sampler: Any, call: Callable[[], Any], error: type[BaseException], match: str,
                what: str) -> None:
        """``call()`` raises ``error`` matching ``match`` and changes neither state nor metrics."""
        import re

        before = _frozen(sampler)
        try:
            call()
        except error as exc:
            if not re.search(match, str(exc)):
                raise AssertionError(f"{what}: {type(exc).__name__} message {str(exc)[:200]!r} does not match "
                                     f"{match!r}") from None
        except Exception as exc:
            raise AssertionError(f"{what}: raised {type(exc).__name__} ({str(exc)[:200]}), expected "
                                 f"{error.__name__}") from None
        else:
            raise AssertionError(f"{what}: accepted, expected {error.__name__} matching {match!r}")
        if _frozen(sampler) != before:
            raise AssertionError(f"{what}: refused, but the state or metrics changed")

    # ------------------------------------------------------------------ rules
    def check_protocol(self) -> None:
        s = self.make()
        assert isinstance(s, TaskSampler), (f"{type(s).__name__} lacks a method of the TaskSampler protocol "
                                            "(sample, update, metrics, state_dict, load_state_dict)")
        for name in ("discard", "outstanding"):
            assert callable(getattr(s, name, None)), f"{type(s).__name__} has no {name}() method"
        n = self.limit(s, 5)
        batch = s.sample(n)
        assert isinstance(batch, list), f"sample({n}) returned {type(batch).__name__}, expected a list"
        assert len(batch) == n, f"sample({n}) returned {len(batch)} tasks"
        keys = _keys(batch)
        assert all(k in self.pool for k in keys), f"sample({n}) returned tasks not in the pool: {keys}"
        if getattr(s, "distinct_per_batch", False):
            assert len(set(keys)) == n, f"sample({n}) repeated a task although distinct_per_batch: {keys}"
        assert s.outstanding() == dict(Counter(keys)), (f"outstanding() is {s.outstanding()} after drawing "
                                                        f"{keys}")

    def check_metrics_keys(self) -> None:
        s = self.make()
        for stage in ("fresh", "after a group"):
            m = s.metrics()
            assert isinstance(m, dict), f"metrics() returned {type(m).__name__}, expected a dict"
            missing = [k for k in METRIC_KEYS if k not in m]
            assert not missing, f"metrics() ({stage}) lacks {missing}"
            bad = {k: v for k, v in m.items() if not (is_number(v) and isinstance(v, int | float))
                   or (k in METRIC_KEYS and not math.isfinite(v))}
            assert not bad, f"metrics() ({stage}) has values that are not finite numbers: {bad}"
            json.dumps(m)
            (t,) = s.sample(1)
            s.update(t, self.rewards(s, [0, 1, 1, 0]))

    def check_none_rewards(self) -> None:
        s = self.make()
        a, b, c = s.sample(self.limit(s, 3))
        s.update(a, self.rewards(s, [0, 1, None, 1]), [10, 20, 30, 40])  # signal, one unscored
        s.update(b, self.rewards(s, [1, None, None, 1]), [1, 1, 1, 1])  # no signal: one scored value
        s.update(c, self.rewards(s, [None, 0.5, None, None]))  # one scored rollout cannot be a signal group
        m = s.metrics()
        got = {k: m[k] for k in ("groups", "signal_groups", "episodes", "unscored_episodes", "cost")}
        want = {"groups": 3, "signal_groups": 1, "episodes": 12, "unscored_episodes": 6, "cost": 104}
        assert got == want, f"after three groups with None rewards the counters are {got}, expected {want}"
        rates = (m["signal_groups_per_episode"], m["signal_groups_per_cost"], m["zero_signal_fraction"])
        assert np.allclose(rates, (1 / 12, 1 / 104, 2 / 3)), (
            f"signal_groups_per_episode, signal_groups_per_cost, zero_signal_fraction are {rates}, "
            f"expected {(1 / 12, 1 / 104, 2 / 3)}")
        # a twin fed the same groups without the Nones makes the same decisions
        full, twin = self.make(), self.make()
        rng = np.random.default_rng(3)
        for step in range(4):
            batch = full.sample(self.limit(full, 3))
            twin_batch = twin.sample(self.limit(twin, 3))
            assert _keys(batch) == _keys(twin_batch), (
                f"batch {step}: a twin given the same groups with the None rewards removed drew "
                f"{_keys(twin_batch)} instead of {_keys(batch)}: a None entered an estimate")
            for t in batch:
                scored = self.rewards(full, [int(x) for x in rng.integers(0, 2, size=2)])
                with_none = [scored[0], None, scored[1], None] if rng.random() < 0.7 else [*scored, None]
                full.update(t, with_none)
                twin.update(t, scored)

    def check_bad_updates(self) -> None:
        for name, (rewards, costs, match) in bad_updates(self.bounds(self.make())).items():
            s = self.make()
            first, second = s.sample(self.limit(s, 2))[:2]
            s.update(second, self.rewards(s, [0, 1, None, 1]), [1.0, 2.0, 0.5, 1.0])
            self.refused(s, lambda s=s, t=first, r=rewards, c=costs: s.update(t, r, c), ValueError, match,
                         f"update with {name} ({str(rewards)[:60]}, costs {str(costs)[:40]})")
            s.update(first, self.rewards(s, [0, 1, 1, 1]))  # it still works
            assert s.metrics()["groups"] == 2, f"after {name}: a good update was not counted"

    def check_bad_tasks(self) -> None:
        s = self.make()
        (t,) = s.sample(1)
        other = next(k for k in self.pool.ids if k != task_key(t))
        good = self.rewards(s, [0, 1, 1, 0])
        self.refused(s, lambda: s.update("no-such-task", good), KeyError, "no-such-task", "update for an unknown task")
        self.refused(s, lambda: s.update({"id": "nope", "env": "env0"}, good), KeyError, "nope",
                     "update for an unknown task spec")
        self.refused(s, lambda: s.update({"env": "env0"}, good), KeyError, "no 'id'", "update for a task without id")
        self.refused(s, lambda: s.update(other, good), ValueError, "without an outstanding dispatch",
                     "update for a task never drawn")
        self.refused(s, lambda: s.discard("no-such-task"), KeyError, "no-such-task", "discard of an unknown task")
        s.update(t, good)
        self.refused(s, lambda: s.update(t, good), ValueError, "without an outstanding dispatch|already reported",
                     "a second update for one dispatch")

    def check_bad_sample_sizes(self) -> None:
        s = self.make()
        (t,) = s.sample(1)
        s.update(t, self.rewards(s, [0, 1, 1, 0]))
        top = s.max_sample_size() if hasattr(s, "max_sample_size") else None
        sizes = [*BAD_SAMPLE_SIZES, (top if top is not None else MAX_BATCH) + 1]
        for n in sizes:
            self.refused(s, lambda n=n: s.sample(n), ValueError, "n must be a positive integer|exceeds",
                         f"sample({n!r})")

    def check_determinism(self) -> None:
        one, two = self.draws(self.make(7), 6, 5), self.draws(self.make(7), 6, 5)
        assert one == two, f"two samplers with seed 7 drew differently: {one} vs {two}"
        if self.seeded:
            other = self.draws(self.make(8), 6, 5)
            assert other != one, "samplers with seeds 7 and 8 drew the same 6 batches: the seed is ignored"

    def check_state_round_trip(self) -> None:
        a = self.make(11)
        self.draws(a, 3, 5)
        pending = a.sample(self.limit(a, 2))  # outstanding across the checkpoint
        state = a.state_dict()
        try:
            state = json.loads(json.dumps(state))
        except (TypeError, ValueError) as exc:
            raise AssertionError(f"state_dict() is not JSON-serialisable: {exc}") from None
        b = self.make(99)
        b.load_state_dict(state)
        assert _frozen(b) == _frozen(a), "the restored sampler's state_dict() or metrics() differ from the saved one"
        assert b.outstanding() == a.outstanding(), "outstanding dispatches were not restored"
        for t in pending:
            a.update(t, self.rewards(a, [0, 1, 1, 0]))
            b.update(t, self.rewards(b, [0, 1, 1, 0]))
        after_a, after_b = self.draws(a, 4, 5, rng_seed=1), self.draws(b, 4, 5, rng_seed=1)
        assert after_a == after_b, f"after a state round trip the draws differ: {after_a} vs {after_b}"

    def check_discard(self) -> None:
        s = self.make()
        batch = s.sample(self.limit(s, 3))
        first = batch[0]
        expected = Counter(_keys(batch))
        s.discard(first)
        expected[task_key(first)] -= 1
        expected += Counter()
        assert s.outstanding() == dict(expected), f"after discard outstanding() is {s.outstanding()}"
        m = s.metrics()
        assert (m["discarded_groups"], m["outstanding_groups"], m["groups"]) == (1, len(batch) - 1, 0), (
            f"after one discard: discarded_groups={m['discarded_groups']}, outstanding_groups="
            f"{m['outstanding_groups']}, groups={m['groups']}")
        if expected[task_key(first)] == 0:
            self.refused(s, lambda: s.discard(first), ValueError, "no outstanding dispatch",
                         "a second discard of one dispatch")
            self.refused(s, lambda: s.update(first, self.rewards(s, [0, 1])), ValueError,
                         "without an outstanding dispatch", "an update after the dispatch was discarded")
        for t in batch[1:]:
            s.update(t, self.rewards(s, [0, 1, 1, 0]))
        assert s.metrics()["outstanding_groups"] == 0 and s.outstanding() == {}, "dispatches left after all reports"

    def check_async_order(self) -> None:
        s = self.make()
        n = self.limit(s, 3)
        first, second = s.sample(n), s.sample(n)
        expected = Counter(_keys(first)) + Counter(_keys(second))
        assert s.outstanding() == dict(expected), f"outstanding() is {s.outstanding()} after two batches"
        for t in reversed(second):  # late and out of order
            s.update(t, self.rewards(s, [0, 1, 0, 1]))
            expected[task_key(t)] -= 1
            expected += Counter()
            assert s.outstanding() == dict(expected), f"outstanding() is {s.outstanding()}, expected {expected}"
        for t in reversed(first):
            s.update(t, self.rewards(s, [1, 1, 0, None]))
        m = s.metrics()
        assert (m["groups"], m["dispatched_groups"], m["outstanding_groups"]) == (2 * n, 2 * n, 0), (
            f"after reporting two batches out of order: groups={m['groups']}, dispatched_groups="
            f"{m['dispatched_groups']}, outstanding_groups={m['outstanding_groups']}")
        s.sample(self.limit(s, 2))  # and it keeps drawing

    def check_sample_atomic(self) -> None:
        if not isinstance(self.make(), BaseSampler):
            return  # the failure is injected through BaseSampler's random generator
        # fail the k-th call to the random generator inside sample(), for k = 1, 2, ... until a sample() makes
        # fewer calls, at three points of a stream (an epoch boundary falls in one of them for a 12-task pool):
        # every failure must leave the state and the next draws as they were
        for prefix in (1, 2, 3):
            s = self.make()
            self.draws(s, prefix, 5)
            state = json.loads(json.dumps(s.state_dict()))
            reference = self.make()
            reference.load_state_dict(state)
            want = self.draws(reference, 3, 3, rng_seed=2)
            for k in range(1, 25):
                s.load_state_dict(state)
                before = _frozen(s)
                real = s._rng
                s._rng = _FailingGenerator(real, k)
                try:
                    s.sample(self.limit(s, 3))
                except _InjectedFailure:
                    pass
                else:
                    break  # this sample() made fewer than k calls: every failure point was tried
                finally:
                    s._rng = real
                where = f"after {prefix} batch(es), a sample() that failed at random-generator call {k}"
                assert _frozen(s) == before, f"{where} changed the state or metrics"
                after = self.draws(s, 3, 3, rng_seed=2)
                assert after == want, f"{where} changed the next draws: {after} vs {want}"


class _InjectedFailure(EnvSchedError, RuntimeError):
    """The failure :func:`check_sampler` injects inside ``sample()``."""


class _FailingGenerator:
    """A ``numpy.random.Generator`` stand-in whose ``fail_at``-th method call raises."""

    def __init__(self, real: np.random.Generator, fail_at: int) -> None:
        self._real = real
        self._left = fail_at

    @property
    def bit_generator(self) -> Any:
        return self._real.bit_generator

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._left -= 1
            if self._left == 0:
                raise _InjectedFailure(f"injected failure in Generator.{name}")
            return attr(*args, **kwargs)

        return call
