"""Hostile input to the durable and shared wrappers: a clear error, and no state change. (The samplers themselves
get every rule of the shared semantics from ``envsched.testing.check_sampler``: test_check_sampler.py.)"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envsched.distributed import SamplerHost
from envsched.pool import TaskPool, TaskSpecError
from envsched.samplers import CurriculumSampler, SequentialSampler, UniformSampler
from envsched.store import DurableSampler

GROUP = 4


def _pool() -> TaskPool:
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 3}", "difficulty": i % 3, "instruction": f"task {i}",
                      "tools": [{"name": f"tool{i % 4}", "description": "d"}]} for i in range(9)])


FACTORIES = {
    "durable": lambda pool, tmp: DurableSampler(UniformSampler(pool, seed=1), tmp / "h.sqlite", group_size=GROUP),
    "host": lambda pool, tmp: SamplerHost(CurriculumSampler(pool, group_size=GROUP, seed=1), group_size=GROUP).client(),
}


def _snapshot(sampler: Any) -> tuple[Any, Any]:
    state = copy.deepcopy(sampler.state_dict())
    metrics = sampler.metrics()
    return state, {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}


def _draw(sampler: Any, n: int) -> list[Any]:
    out = sampler.sample(n)
    return [t for _, t in out] if isinstance(sampler, SamplerHost) else out


HOSTILE: dict[str, tuple[Any, type[Exception], str]] = {
    "nan reward": (lambda s, t: s.update(t, [0.0, math.nan, 1.0, 1.0]), ValueError, r"rewards\[1\].*must be finite"),
    "inf reward": (lambda s, t: s.update(t, [0.0, 1.0, math.inf, 1.0]), ValueError, r"rewards\[2\].*must be finite"),
    "-inf reward": (lambda s, t: s.update(t, [-math.inf, 1.0, 1.0, 1.0]), ValueError, "must be finite"),
    "reward above range": (lambda s, t: s.update(t, [0.0, 1.0, 1.0, 7.0]), ValueError,
                           "outside the declared reward range"),
    "reward below range": (lambda s, t: s.update(t, [-0.5, 1.0, 1.0, 1.0]), ValueError,
                           "outside the declared reward range"),
    "numpy nan": (lambda s, t: s.update(t, np.array([0.0, np.nan, 1.0, 1.0])), ValueError, "must be finite"),
    "string reward": (lambda s, t: s.update(t, [0.0, "1", 1.0, 1.0]), ValueError, "must be a number or None"),
    "bool reward": (lambda s, t: s.update(t, [True, 1.0, 1.0, 1.0]), ValueError, "must be a number or None"),
    "rewards not a list": (lambda s, t: s.update(t, "0101"), ValueError, "must be a sequence"),
    "no rewards": (lambda s, t: s.update(t, []), ValueError, "empty|expected group_size"),
    "negative cost": (lambda s, t: s.update(t, [0.0, 1.0, 1.0, 1.0], [1.0, -1.0, 1.0, 1.0]), ValueError,
                      "costs must be finite and >= 0"),
    "nan cost": (lambda s, t: s.update(t, [0.0, 1.0, 1.0, 1.0], [1.0, math.nan, 1.0, 1.0]), ValueError,
                 "costs must be finite and >= 0"),
    "missing cost": (lambda s, t: s.update(t, [0.0, 1.0, 1.0, 1.0], [1.0, None, 1.0, 1.0]), ValueError,
                     r"costs\[1\].*must be a number"),
    "too few costs": (lambda s, t: s.update(t, [0.0, 1.0, 1.0, 1.0], [1.0]), ValueError, "one cost per rollout"),
    "unknown task": (lambda s, t: s.update("no-such-task", [0.0, 1.0, 1.0, 1.0]), KeyError, "no-such-task"),
    "task without id": (lambda s, t: s.update({"env": "e0"}, [0.0, 1.0, 1.0, 1.0]), KeyError, "no 'id'"),
    "never dispatched": (lambda s, t: s.update("t8", [0.0, 1.0, 1.0, 1.0]), ValueError,
                         "without an outstanding dispatch"),
    "discard never dispatched": (lambda s, t: s.discard("t8"), ValueError, "no outstanding dispatch"),
    "n = 0": (lambda s, t: _draw(s, 0), ValueError, "n must be a positive integer"),
    "n < 0": (lambda s, t: _draw(s, -3), ValueError, "n must be a positive integer"),
    "n not an int": (lambda s, t: _draw(s, 2.5), ValueError, "n must be a positive integer"),
    "n bool": (lambda s, t: _draw(s, True), ValueError, "n must be a positive integer"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_hostile_update_is_refused_without_state_change(tmp_path: Path, kind: str, name: str) -> None:
    sampler = FACTORIES[kind](_pool(), tmp_path)
    drawn = _draw(sampler, 3)
    keys = [t["id"] for t in drawn]
    if "t8" in keys:  # keep one task never dispatched
        pytest.skip("t8 was drawn")
    sampler.update(drawn[1], [1.0, 0.0, None, 1.0], [1.0, 2.0, 0.5, 1.0])
    call, error, message = HOSTILE[name]
    before = _snapshot(sampler)
    with pytest.raises(error, match=message):
        call(sampler, drawn[0])
    assert _snapshot(sampler) == before
    # a second update for the same dispatch
    with pytest.raises(ValueError, match=r"without an outstanding dispatch|reclaimed"):
        sampler.update(drawn[1], [1.0, 0.0, 1.0, 1.0])
    assert _snapshot(sampler) == before
    # the sampler still works
    sampler.update(drawn[0], [0.0, 1.0, 1.0, 1.0])


@pytest.mark.parametrize("kind", ["durable", "host"])
def test_reward_list_of_the_wrong_length_for_the_declared_group_size(tmp_path: Path, kind: str) -> None:
    sampler = FACTORIES[kind](_pool(), tmp_path)
    t = _draw(sampler, 1)[0]
    before = _snapshot(sampler)
    for rewards in ([1.0, 0.0, 1.0], [1.0] * 5):
        with pytest.raises(ValueError, match=f"have {len(rewards)} entries, expected group_size=4"):
            sampler.update(t, rewards)
    assert _snapshot(sampler) == before


def test_n_larger_than_the_pool_allows(tmp_path: Path) -> None:
    sampler = FACTORIES["durable"](_pool(), tmp_path)
    limit = sampler.sampler.max_sample_size()
    assert limit is not None
    before = _snapshot(sampler)
    with pytest.raises(ValueError, match=f"n={limit + 1} exceeds"):
        sampler.sample(limit + 1)
    assert _snapshot(sampler) == before


def test_empty_environment_and_empty_pool(tmp_path: Path) -> None:
    with pytest.raises(TaskSpecError, match="field 'env': must be a non-empty string"):
        TaskPool([{"id": "a", "env": "   "}])
    pool = _pool()
    with pytest.raises(KeyError, match="unknown environment"):
        pool.filter(envs=["e9"])
    with pytest.raises(KeyError, match="unknown environment 'e9'"):
        pool.by_env("e9")
    empty = pool.filter(split="no-such-split")
    assert len(empty) == 0
    for make in (lambda: UniformSampler(empty), lambda: CurriculumSampler(empty, group_size=2),
                 lambda: SequentialSampler(empty)):
        with pytest.raises(ValueError, match="needs at least one task; the task list is empty"):
            make()
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ValueError, match="the task list is empty"):
        UniformSampler(TaskPool.from_file(path))
    assert not (tmp_path / "h.sqlite").exists()
    with pytest.raises(ValueError, match="the task list is empty"):
        DurableSampler(UniformSampler(empty), tmp_path / "h.sqlite")
    assert not (tmp_path / "h.sqlite").exists()


def test_malformed_state_is_refused_without_change() -> None:
    sampler = CurriculumSampler(_pool(), group_size=GROUP, seed=1)
    for t in sampler.sample(3):
        sampler.update(t, [1.0, 0.0, 1.0, None])
    before = _snapshot(sampler)
    good = sampler.state_dict()
    bad_states = [
        ({**good, "counters": {**good["counters"], "groups": -1}}, "counters.groups must be a whole number in \\[0, "),
        ({**good, "tasks_sha256": "0" * 64}, "another task list"),
        ({**good, "sampler": "UniformSampler"}, "cannot load into CurriculumSampler"),
        ({**good, "extra": {**good["extra"], "successes": [1.0]}}, "successes must have 3 entries"),
        ({**good, "outstanding": {"nope": 1}}, "malformed CurriculumSampler state: outstanding names task 'nope'"),
        ("not a dict", "must be a dict"),
    ]
    for state, message in bad_states:
        with pytest.raises(ValueError, match=message):
            sampler.load_state_dict(state)
        assert _snapshot(sampler) == before
