"""The shared semantics, checked by ``envsched.testing.check_sampler`` on every registered sampler; a sampler
registered later is checked with no test edit; and each rule can fail (a sampler broken for it is caught)."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from envsched.samplers import SequentialSampler, UniformSampler
from envsched.samplers.base import BaseSampler
from envsched.samplers.registry import SAMPLERS, make_sampler
from envsched.testing import RULES, SamplerCheckError, check_sampler

ROOT = Path(__file__).resolve().parents[2]


def registered(name: str) -> Any:
    """The factory check_sampler needs, for the sampler registered as ``name``."""
    return lambda pool, seed: make_sampler(name, pool, seed=seed, group_size=4)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_registered_sampler_keeps_the_shared_semantics(name: str) -> None:
    check_sampler(registered(name))


def test_sequential_sampler_keeps_the_shared_semantics() -> None:
    check_sampler(lambda pool, seed: SequentialSampler(pool, seeds=[0, 1], require_dispatch=True), seeded=False)


def test_a_shares_sampler_keeps_the_shared_semantics() -> None:
    """A composite over one learning sampler per source (PLR, MoPPS, uniform) answers like one sampler."""
    from envsched.samplers.shares import SharesSampler

    kinds = {"env0": "plr", "env1": "mopps", "env2": "uniform"}
    check_sampler(lambda pool, seed: SharesSampler.from_pool(
        pool, {"env0": 1, "env1": 2, "env2": 1},
        lambda tasks, src: make_sampler(kinds[src], tasks, seed=seed, group_size=4)))


def test_the_remote_client_keeps_the_shared_semantics() -> None:
    """A worker's handle on a sampler host (in-process, no Ray) answers like the sampler it reaches.
    ``state-round-trip`` is the documented exception: a host that loads a state gives the dispatches
    outstanding in it anonymous leases, which no worker can report (they are reclaimed when they expire)."""
    from envsched.distributed.ray_host import SamplerHost

    check_sampler(lambda pool, seed: SamplerHost(make_sampler("envsched", pool, seed=seed, group_size=4)).client(),
                  skip=("state-round-trip",))


@pytest.mark.slow
def test_a_newly_registered_sampler_is_checked_with_no_test_edit(tmp_path: Path) -> None:
    """A throw-away sampler registered with ``register_sampler`` (before the suite is collected) gets the
    parametrized conformance test above, and passes it."""
    script = tmp_path / "register_and_test.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import pytest
        from envsched.samplers.base import BaseSampler
        from envsched.samplers.registry import register_sampler

        class ThrowAwaySampler(BaseSampler):
            '''Draws tasks uniformly at random, distinct within a batch; learns nothing.'''

            def _select(self, n):
                return self._rng.choice(len(self.tasks), size=n, replace=False).tolist()

        def make_throwaway(pool, *, seed, group_size, **options):
            return ThrowAwaySampler(pool, seed=seed, **options)

        register_sampler("throwaway", "a sampler only this test knows", "__main__:make_throwaway")
        sys.exit(pytest.main([{str(Path(__file__))!r}, "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                              "-n", "0",  # one process: the sampler is registered in this one
                              "-k", "registered_sampler_keeps and throwaway", "--rootdir", {str(ROOT)!r}]))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 passed" in out.stdout and "throwaway" not in SAMPLERS


# ---------------------------------------------------------------- each rule can fail
class _NoDiscard:
    """Has the five protocol methods but no discard()."""

    def __init__(self, pool: Any, seed: int) -> None:
        self.inner = UniformSampler(pool, seed=seed)

    def sample(self, n: int) -> list[Any]:
        return self.inner.sample(n)

    def update(self, task: Any, rewards: Any, costs: Any = None) -> None:
        self.inner.update(task, rewards, costs)

    def metrics(self) -> dict[str, float]:
        return self.inner.metrics()

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def outstanding(self) -> dict[str, int]:
        return self.inner.outstanding()


class _NoCostMetric(UniformSampler):
    def metrics(self) -> dict[str, float]:
        return {k: v for k, v in super().metrics().items() if k != "signal_groups_per_cost"}


class _NoneAsZero(UniformSampler):
    def update(self, task: Any, rewards: Any, costs: Any = None) -> None:
        if isinstance(rewards, list):
            rewards = [0.0 if r is None else r for r in rewards]
        super().update(task, rewards, costs)


class _DrawsWhenRefusing(UniformSampler):
    """Advances its random generator when it refuses an update: a refused input changes the state."""

    def update(self, task: Any, rewards: Any, costs: Any = None) -> None:
        try:
            super().update(task, rewards, costs)
        except ValueError:
            self._rng.random()
            raise


class _LaxUnknownTask(UniformSampler):
    def update(self, task: Any, rewards: Any, costs: Any = None) -> None:
        if task == "no-such-task":
            return
        super().update(task, rewards, costs)


class _AcceptsBoolN(UniformSampler):
    def check_sample_size(self, n: Any) -> int:
        return super().check_sample_size(int(n) if isinstance(n, bool) and n else n)


class _UnseededDraws(UniformSampler):
    def _select(self, n: int) -> list[int]:
        return random.Random().sample(range(len(self.tasks)), n)


class _HiddenCursor(BaseSampler):
    """Round-robin from a cursor it does not save in state_dict()."""

    def __init__(self, tasks: Any, *, seed: int = 0) -> None:
        super().__init__(tasks, seed=seed)
        self.cursor = int(self._rng.integers(len(self.tasks)))

    def _select(self, n: int) -> list[int]:
        out = [(self.cursor + i) % len(self.tasks) for i in range(n)]
        self.cursor = (self.cursor + n) % len(self.tasks)
        self._rng.random()
        return out


class _DiscardKeepsDispatch(UniformSampler):
    def discard(self, task: Any) -> None:
        self.position_of(task)
        self._counters["discarded_groups"] += 1


class _InOrderOnly(UniformSampler):
    """Refuses an update for a batch while an earlier batch is still outstanding (no asynchronous trainers)."""

    def __init__(self, tasks: Any, *, seed: int = 0) -> None:
        super().__init__(tasks, seed=seed)
        self.batches: list[list[str]] = []

    def sample(self, n: int) -> list[Any]:
        out = super().sample(n)
        self.batches.append([t["id"] for t in out])
        return out

    def update(self, task: Any, rewards: Any, costs: Any = None) -> None:
        key = task if isinstance(task, str) else task.get("id")
        self.batches = [b for b in self.batches if b]
        if self.batches and key not in self.batches[0] and any(key in b for b in self.batches):
            raise ValueError(f"update for {key!r} arrived before the earlier batch {self.batches[0]} was reported")
        super().update(task, rewards, costs)
        for b in self.batches:
            if key in b:
                b.remove(key)
                break


class _MovesBeforeItDraws(_HiddenCursor):
    """Advances its cursor, then draws: a failing draw leaves the cursor moved (no checkpoint)."""

    def _select(self, n: int) -> list[int]:
        self.cursor = (self.cursor + n) % len(self.tasks)
        self._rng.random()
        return [(self.cursor + i) % len(self.tasks) for i in range(n)]

    def _extra_state(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        self.cursor = int(extra["cursor"])


BROKEN: dict[str, Any] = {
    "protocol": lambda pool, seed: _NoDiscard(pool, seed),
    "metrics-keys": lambda pool, seed: _NoCostMetric(pool, seed=seed),
    "none-rewards": lambda pool, seed: _NoneAsZero(pool, seed=seed),
    "bad-updates": lambda pool, seed: _DrawsWhenRefusing(pool, seed=seed),
    "bad-tasks": lambda pool, seed: _LaxUnknownTask(pool, seed=seed),
    "bad-sample-sizes": lambda pool, seed: _AcceptsBoolN(pool, seed=seed),
    "determinism": lambda pool, seed: _UnseededDraws(pool, seed=seed),
    "state-round-trip": lambda pool, seed: _HiddenCursor(pool, seed=seed),
    "discard": lambda pool, seed: _DiscardKeepsDispatch(pool, seed=seed),
    "async-order": lambda pool, seed: _InOrderOnly(pool, seed=seed),
    "sample-atomic": lambda pool, seed: _MovesBeforeItDraws(pool, seed=seed),
}


def test_every_rule_has_a_broken_sampler() -> None:
    assert sorted(BROKEN) == sorted(RULES)


@pytest.mark.parametrize("rule", RULES)
def test_check_sampler_catches_a_sampler_broken_for_each_rule(rule: str) -> None:
    with pytest.raises(SamplerCheckError) as info:
        check_sampler(BROKEN[rule])
    assert info.value.rule == rule, str(info.value)
    assert isinstance(info.value, AssertionError) and str(info.value).startswith(f"[{rule}] ")


def test_a_skipped_rule_is_not_run_and_unknown_rules_are_refused() -> None:
    check_sampler(BROKEN["discard"], skip=("discard",))
    with pytest.raises(ValueError, match="skip names unknown rules"):
        check_sampler(registered("uniform"), skip=("no-such-rule",))
