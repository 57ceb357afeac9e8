"""Crafted sampler states (issue 23, finding 5): every loader refuses what its sampler could not have written.

For every registered sampler (``envsched.samplers.registry``) plus the sequential, dynamic-sampling and
shares samplers, after a few real ``sample``/``update``/``discard`` steps:

* a **generated sweep**: every numeric, bool and string leaf of the saved state set to NaN, inf, -inf,
  ``None``, a huge value, a negative value, a value of the wrong type; every list truncated and extended
  (long lists at their first, second, middle and last entries). Each crafted state must be refused with a
  ``ValueError`` naming the field, the state (random generator included) unchanged -- except a few listed
  mutations that a sampler can legitimately reach (a shorter ``last_batch``, a queue after a pop, ...),
  which may also load and must then leave a sampler that keeps working;
* **named cases**, each a crafted state with the error it must raise, and the three reported ones verbatim;
* ``sample()`` **atomicity**: the random generator failing at each of its calls in turn (and, for EnvSched,
  the batch builder failing) leaves the sampler exactly as before.

After each refusal the next ``sample()`` gives exactly what an untouched twin gives.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from envsched.pool import TaskPool
from envsched.samplers import CurriculumSampler, SequentialSampler, UniformSampler
from envsched.samplers.baselines import DynamicSamplingSampler, PLRSampler
from envsched.samplers.registry import SAMPLERS, make_sampler
from envsched.samplers.shares import SharesSampler, allocate_quotas

NAN, INF = math.nan, math.inf
HANG_BOUND_S = 10  # a generous bound against a hang, not a speed target


def _pool() -> TaskPool:
    return TaskPool([{"id": f"t{i:02d}", "env": f"env{i % 3}", "difficulty": i % 4,
                      "instruction": f"task {i}", "tools": [{"name": f"tool{i % 4}", "description": "d"}]}
                     for i in range(12)])


def _shares(pool: TaskPool, seed: int) -> SharesSampler:
    kinds = {"env0": UniformSampler, "env1": CurriculumSampler, "env2": PLRSampler}

    def make(tasks: list[Any], source: str) -> Any:
        if kinds[source] is CurriculumSampler:
            return CurriculumSampler(tasks, group_size=4, seed=seed)
        return kinds[source](tasks, seed=seed)

    return SharesSampler.from_pool(pool, {"env0": 1.0, "env1": 2.0, "env2": 1.0}, make)


BUILDERS: dict[str, Callable[[TaskPool, int], Any]] = {
    **{name: (lambda pool, seed, name=name: make_sampler(name, pool, seed=seed, group_size=4)) for name in SAMPLERS},
    "envsched-folded": lambda pool, seed: make_sampler("envsched", pool, seed=seed, group_size=4,
                                                       history_tolerance=0.5),
    "sequential": lambda pool, seed: SequentialSampler(pool, seeds=[0, 1], wrap=True),
    "dynamic-sampling": lambda pool, seed: DynamicSamplingSampler(pool, seed=seed),
    "shares": _shares,
}
REWARDS = ([1.0, 0.0, None, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, None, 0.0], [0.5, 0.25, 1.0, 0.0],
           [None, None, None, None])


def _build(name: str, seed: int = 3) -> Any:
    """The sampler after a few real steps: updates of every kind, a discard, and a batch still outstanding."""
    s = BUILDERS[name](_pool(), seed)
    rounds = 50 if name == "envsched-folded" else 3  # enough batches to fold the history
    for r in range(rounds):
        for i, task in enumerate(s.sample(4)):
            if i == 3 and r == 1:
                s.discard(task)
            else:
                s.update(task, REWARDS[(i + r) % len(REWARDS)])
    s.sample(3)
    if name == "envsched-folded":
        assert s.history.live_start > 0, "the history was not folded"
    return s


def frozen(state: Any) -> str:
    """A comparable form of a state (NaN-safe; a state's keys come in a fixed order)."""
    return json.dumps(state, default=str)


def _draws(sampler: Any, n: int = 3, rounds: int = 2) -> list[list[str]]:
    out = []
    for _ in range(rounds):
        out.append([t["id"] for t in sampler.sample(n)])
    return out


@contextlib.contextmanager
def hang_guard(seconds: int = HANG_BOUND_S) -> Iterator[None]:
    """Fail (instead of hanging) if the body runs longer than ``seconds``."""

    def _alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"ran for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------- the generated sweep
Path = tuple[Any, ...]


def _walk(node: Any, path: Path = ()) -> Iterator[tuple[str, Path, Any]]:
    """``("leaf" | "list", path, value)`` for every leaf and list (long lists: four entries)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, (*path, k))
    elif isinstance(node, list):
        yield "list", path, node
        n = len(node)
        for i in (range(n) if n <= 6 else sorted({0, 1, n // 2, n - 1})):
            yield from _walk(node[i], (*path, i))
    else:
        yield "leaf", path, node


def _mutations(kind: str, value: Any) -> dict[str, Any]:
    if kind == "list":
        return {"truncated": value[:-1], "extended": [*value, value[-1] if value else 0], "an object": {"0": 1},
                "None": None}
    if isinstance(value, bool):
        return {"None": None, "int": int(value), "string": "true", "NaN": NAN}
    if isinstance(value, int):
        return {"NaN": NAN, "inf": INF, "-inf": -INF, "None": None, "huge": 2**200, "negative": -abs(value) - 1,
                "string": str(value), "bool": True, "fraction": value + 0.5, "list": [value]}
    if isinstance(value, float):
        return {"NaN": NAN, "inf": INF, "-inf": -INF, "None": None, "huge": 1e300, "negative": -abs(value) - 1.5,
                "string": "0.5", "bool": True, "list": [value]}
    if isinstance(value, str):
        return {"None": None, "int": 7, "list": [value]}
    if value is None:
        return {"NaN": NAN, "string": "x", "int": 1}
    raise AssertionError(f"unexpected leaf {value!r}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and json.dumps(a) == json.dumps(b)


def _may_be_valid(path: Path, kind: str, mutation: str) -> bool:
    """Mutations a sampler can reach: a shorter or longer ``last_batch``, a curriculum queue after a pop, the
    phases of a last batch, a progress filter's points, a cost counter of 1e300 (costs are any finite
    number), a state without a pool fingerprint (older states), a folded history without a frozen reference
    (a fold of steps none of which had a step-level reference)."""
    keys = [p for p in path if isinstance(p, str)]
    if kind == "list" and mutation in ("truncated", "extended"):
        last = path[-1] if path else None
        if last in ("last_batch", "last_phases") or (keys and keys[-1] in ("queues", "points") and
                                                   isinstance(last, int)):
            return True
    if keys[-2:] == ["counters", "cost"] and mutation == "huge":
        return True
    return keys[-1:] in (["pool_fingerprint"], ["reference"], ["first_reference"]) and mutation == "None"


def _set(state: Any, path: Path, value: Any) -> Any:
    node = state
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return state


def crafted_states(state: dict[str, Any]) -> Iterator[tuple[str, Path, bool, dict[str, Any]]]:
    """``(mutation, path, may_be_valid, crafted state)`` for every mutation of every leaf and list."""
    text_ = json.dumps(state)
    for kind, path, value in list(_walk(state)):
        if not path:
            continue
        for mutation, new in _mutations(kind, value).items():
            if _same(new, value):
                continue
            yield mutation, path, _may_be_valid(path, kind, mutation), _set(json.loads(text_), path, new)


def _names_the_field(message: str, path: Path) -> bool:
    """The error names a key on the mutated path (or, for the identity fields, what they identify)."""
    alias = {"tasks_sha256": "task list", "format": "format", "sampler": "sampler", "sources": "sources",
             "shares": "shares"}
    words = [alias.get(p, p) for p in path if isinstance(p, str) and p not in ("extra", "samplers")]
    return any(re.search(re.escape(w), message, re.IGNORECASE) for w in words)


def sweep(name: str) -> dict[str, Any]:
    """Load every crafted state of sampler ``name`` into one sampler; returns the counts and the failures
    (accepted invalid states, refusals that changed the state or did not name the field)."""
    s = _build(name)
    good = json.loads(json.dumps(s.state_dict()))
    out: dict[str, Any] = {"crafted": 0, "invalid": 0, "maybe_valid": 0, "accepted_invalid": [],
                           "changed": [], "unnamed": [], "other_error": [], "accepted_maybe_valid": 0}
    before = frozen(s.state_dict())
    for mutation, path, maybe, bad in crafted_states(good):
        out["crafted"] += 1
        out["maybe_valid" if maybe else "invalid"] += 1
        case = f"{'.'.join(map(str, path))} {mutation}"
        try:
            s.load_state_dict(bad)
        except ValueError as exc:
            if not _names_the_field(str(exc), path):
                out["unnamed"].append(f"{case}: {exc}")
        except Exception as exc:
            out["other_error"].append(f"{case}: {type(exc).__name__}: {exc}")
        else:
            if not maybe:
                out["accepted_invalid"].append(case)
            else:
                out["accepted_maybe_valid"] += 1
                with hang_guard():
                    s.sample(2)  # a reachable state keeps working
            s.load_state_dict(good)
        if frozen(s.state_dict()) != before:
            out["changed"].append(case)
            s.load_state_dict(good)
    out["sampler"] = s
    return out


SWEEP_NAMES = sorted(BUILDERS)


@pytest.mark.slow
@pytest.mark.parametrize("name", SWEEP_NAMES)
@pytest.mark.hostile_budget(120)  # many inputs (or a deadline the test waits out) in one call
def test_generated_sweep_refuses_every_invalid_state(name: str) -> None:
    r = sweep(name)
    assert r["accepted_invalid"] == [], f"{len(r['accepted_invalid'])} invalid states accepted"
    assert r["other_error"] == [], "a loader answered with something else than a ValueError"
    assert r["changed"] == [], "a refused state changed the sampler's state"
    assert r["unnamed"] == [], "a refusal did not name the field"
    assert r["invalid"] >= 60
    # the sampler that refused every state draws exactly as an untouched twin
    twin = _build(name)
    with hang_guard():
        assert _draws(r["sampler"]) == _draws(twin)


@pytest.mark.slow
@pytest.mark.hostile_budget(120)  # many inputs (or a deadline the test waits out) in one call
def test_the_sweep_crafts_at_least_3000_states() -> None:
    counts = {name: sum(1 for _ in crafted_states(json.loads(json.dumps(_build(name).state_dict()))))
              for name in SWEEP_NAMES}
    assert sum(counts.values()) >= 3000, counts
    assert all(c >= 60 for c in counts.values()), counts


# ---------------------------------------------------------------------- named cases
def _at(*path: Any) -> Callable[[dict[str, Any], Any], None]:
    def set_(state: dict[str, Any], value: Any) -> None:
        _set(state, path, value)
    return set_


def _edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any], Any], None]:
    return lambda state, _value: fn(state)


def _first_scored(state: dict[str, Any]) -> int:
    obs = state["extra"]["history"]["obs"]
    return next(i for i, k in enumerate(obs["n_scored"]) if k > 0)


def _obs_set(col: str, value: Any, scored: bool = True) -> Callable[[dict[str, Any], Any], None]:
    def fn(state: dict[str, Any], _value: Any) -> None:
        obs = state["extra"]["history"]["obs"]
        i = _first_scored(state) if scored else next(i for i, k in enumerate(obs["n_scored"]) if k == 0)
        obs[col][i] = value
    return fn


def _unscored_with_stats(state: dict[str, Any]) -> None:
    obs = state["extra"]["history"]["obs"]
    obs["n_scored"][_first_scored(state)] = 0


def _v_above_bound(state: dict[str, Any]) -> None:
    obs = state["extra"]["history"]["obs"]
    i = _first_scored(state)
    obs["m"][i], obs["v"][i] = 0.9, 0.2  # 0.2 > 0.9 * 0.1


def _dispatch_repeat(state: dict[str, Any]) -> None:
    d = state["extra"]["history"]["dispatch"]
    d["pos"][1] = d["pos"][0]


H = ("extra", "history")
X = ("extra",)
# name -> (sampler, how to craft, value, regex the error must match)
NAMED: dict[str, tuple[str, Callable[[dict[str, Any], Any], None], Any, str]] = {
    # base fields (every BaseSampler)
    "uniform groups NaN": ("uniform", _at("counters", "groups"), NAN, r"counters\.groups must be a whole"),
    "uniform episodes inf": ("uniform", _at("counters", "episodes"), INF, r"counters\.episodes must be a whole"),
    "uniform cost -inf": ("uniform", _at("counters", "cost"), -INF, r"counters\.cost must be a finite"),
    "uniform dispatched None": ("uniform", _at("counters", "dispatched_groups"), None,
                                r"counters\.dispatched_groups must be a whole"),
    "uniform signal groups above groups": ("uniform", _at("counters", "signal_groups"), 10**6,
                                           r"counters\.signal_groups .* cannot exceed counters\.groups"),
    "uniform unscored above episodes": ("uniform", _at("counters", "unscored_episodes"), 10**6,
                                        r"counters\.unscored_episodes .* cannot exceed counters\.episodes"),
    "uniform outstanding above dispatched": ("uniform", _at("outstanding"), {"t00": 10**6},
                                             r"outstanding .*exceed counters\.dispatched_groups"),
    "uniform num_tasks NaN": ("uniform", _at("num_tasks"), NAN, r"num_tasks must be a whole number in \[12, 12\]"),
    "uniform last batch repeats": ("uniform", _at("last_batch"), ["t00", "t00"], r"last_batch repeats a task"),
    "uniform rng inc even": ("uniform", _at("rng", "state", "inc"), 2, r"rng\.state\.inc must be odd"),
    "uniform rng has_uint32 2": ("uniform", _at("rng", "has_uint32"), 2, r"rng\.has_uint32 must be one of"),
    "uniform rng uinteger 2**32": ("uniform", _at("rng", "uinteger"), 2**32, r"rng\.uinteger must be a whole"),
    "uniform rng state True": ("uniform", _at("rng", "state", "state"), True, r"rng\.state\.state must be a whole"),
    "uniform rng state NaN": ("uniform", _at("rng", "state", "state"), NAN, r"rng\.state\.state must be a whole"),
    "uniform rng unknown key": ("uniform", _at("rng", "seed"), 1, r"rng has unknown keys \['seed'\]"),
    "uniform order fraction": ("uniform", _at(*X, "order", 0), 1.5, r"order\[0\] must be a whole"),
    "uniform order True": ("uniform", _at(*X, "order", 0), True, r"order\[0\] must be a whole"),
    "uniform order short": ("uniform", _edit(lambda s: s["extra"]["order"].pop()), None,
                            r"order must be empty before the first epoch and a permutation"),
    "uniform cursor beyond order": ("uniform", _at(*X, "cursor"), 13,
                                    r"extra\.cursor must be a whole number in \[0, 12\]"),
    "uniform epoch 0 with an order": ("uniform", _at(*X, "epoch"), 0, r"extra\.order must be empty before"),
    "uniform epoch NaN": ("uniform", _at(*X, "epoch"), NAN, r"extra\.epoch must be a whole"),
    "dynamic sampling order repeats": ("dynamic-sampling", _at(*X, "order", 1), 0, r"order is not a permutation"),
    # sequential
    "sequential cursor NaN": ("sequential", _at(*X, "cursor"), NAN, r"extra\.cursor must be a whole"),
    "sequential cursor True": ("sequential", _at(*X, "cursor"), True, r"extra\.cursor must be a whole"),
    "sequential cursor past the end": ("sequential", _at(*X, "cursor"), 24,
                                       r"extra\.cursor must be a whole number in \[0, 23\]"),
    "sequential cursor negative": ("sequential", _at(*X, "cursor"), -1, r"extra\.cursor must be a whole"),
    # curriculum (reported: successes accepted NaN/inf/None)
    "curriculum successes NaN": ("curriculum", _at(*X, "successes", 0), NAN, r"extra\.successes\[0\] must be a finite"),
    "curriculum failures inf": ("curriculum", _at(*X, "failures", 1), INF, r"extra\.failures\[1\] must be a finite"),
    "curriculum successes None": ("curriculum", _at(*X, "successes", 2), None,
                                  r"extra\.successes\[2\] must be a finite"),
    "curriculum successes 1e300": ("curriculum", _at(*X, "successes", 0), 1e300,
                                   r"extra\.successes\[0\] must be a finite"),
    "curriculum successes negative": ("curriculum", _at(*X, "successes", 0), -0.5, r"extra\.successes\[0\]"),
    "curriculum successes a string": ("curriculum", _at(*X, "successes", 0), "1", r"extra\.successes\[0\]"),
    "curriculum successes short": ("curriculum", _at(*X, "successes"), [0.0], r"extra\.successes must have 4 entries"),
    "curriculum queue of another key": ("curriculum", _at(*X, "queues", 0), [1],
                                        r"extra\.queues\[0\] must hold distinct tasks of key"),
    "curriculum queue repeats": ("curriculum", _at(*X, "queues", 0), [0, 0], r"extra\.queues\[0\] must hold distinct"),
    "curriculum queue a string": ("curriculum", _at(*X, "queues", 0), ["0"],
                                  r"extra\.queues\[0\]\[0\] must be a whole"),
    "curriculum keys renamed": ("curriculum", _at(*X, "keys", 0), "x", r"extra\.keys differ"),
    # MoPPS (reported: alpha/beta accepted NaN/inf/None)
    "mopps alpha NaN": ("mopps", _at(*X, "alpha", 0), NAN, r"extra\.alpha\[0\] must be a finite"),
    "mopps beta inf": ("mopps", _at(*X, "beta", 0), INF, r"extra\.beta\[0\] must be a finite"),
    "mopps alpha None": ("mopps", _at(*X, "alpha", 3), None, r"extra\.alpha\[3\] must be a finite"),
    "mopps alpha below the prior": ("mopps", _at(*X, "alpha", 0), 0.5,
                                    r"extra\.alpha\[0\] must be a finite number in \[0\.99"),
    "mopps beta zero": ("mopps", _at(*X, "beta", 1), 0.0, r"extra\.beta\[1\]"),
    "mopps alpha 1e300": ("mopps", _at(*X, "alpha", 0), 1e300, r"extra\.alpha\[0\]"),
    "mopps alpha True": ("mopps", _at(*X, "alpha", 0), True, r"extra\.alpha\[0\]"),
    "mopps beta long": ("mopps", _edit(lambda s: s["extra"]["beta"].append(1.0)), None,
                        r"extra\.beta must have 12 entries"),
    # GRESO (reported: p_easy accepted NaN/inf/None)
    "greso p_easy NaN": ("greso", _at(*X, "p_easy"), NAN, r"extra\.p_easy must be a finite number in \[0\.05, 0\.95\]"),
    "greso p_hard inf": ("greso", _at(*X, "p_hard"), INF, r"extra\.p_hard must be a finite"),
    "greso p_easy None": ("greso", _at(*X, "p_easy"), None, r"extra\.p_easy must be a finite"),
    "greso p_easy above its bound": ("greso", _at(*X, "p_easy"), 0.99,
                                     r"extra\.p_easy must be a finite number in \[0\.05, 0\.95\]"),
    "greso run length negative": ("greso", _at(*X, "run_length", 0), -1, r"extra\.run_length\[0\] must be a whole"),
    "greso run length fraction": ("greso", _at(*X, "run_length", 0), 1.5, r"extra\.run_length\[0\] must be a whole"),
    "greso run_easy 1": ("greso", _at(*X, "run_easy", 0), 1, r"extra\.run_easy\[0\] must be true or false"),
    "greso window more hits than groups": ("greso", _at(*X, "window"), [1, 2, 3],
                                           r"extra\.window counts more zero-variance"),
    "greso window short": ("greso", _at(*X, "window"), [0, 0], r"extra\.window must have 3 entries"),
    # PLR (reported: scores accepted NaN/inf/None)
    "plr score NaN": ("plr", _at(*X, "scores", 0), NAN, r"extra\.scores\[0\] must be a finite"),
    "plr score inf": ("plr", _at(*X, "scores", 0), INF, r"extra\.scores\[0\] must be a finite"),
    "plr score None": ("plr", _at(*X, "scores", 0), None, r"extra\.scores\[0\] must be a finite"),
    "plr score above 0.5": ("plr", _at(*X, "scores", 0), 0.9,
                            r"extra\.scores\[0\] must be a finite number in \[0\.0, 0\.5"),
    "plr seen 1": ("plr", _at(*X, "seen", 0), 1, r"extra\.seen\[0\] must be true or false"),
    "plr last draw after draws": ("plr", _at(*X, "last_draw", 0), 10**6, r"extra\.last_draw\[0\] must be a whole"),
    "plr draws negative": ("plr", _at(*X, "draws"), -1, r"extra\.draws must be a whole"),
    "plr draws NaN": ("plr", _at(*X, "draws"), NAN, r"extra\.draws must be a whole"),
    # EnvSched history (reported: v[0] = NaN accepted, then sample() raised IndexError)
    "envsched obs v NaN": ("envsched", _obs_set("v", NAN), None, r"extra\.history\.obs\.v\[\d+\] must be a finite"),
    "envsched obs m inf": ("envsched", _obs_set("m", INF), None, r"extra\.history\.obs\.m\[\d+\] must be a finite"),
    "envsched obs m None": ("envsched", _obs_set("m", None), None, r"extra\.history\.obs\.m\[\d+\] must be a finite"),
    "envsched obs d 2": ("envsched", _obs_set("d", 2.0), None,
                         r"extra\.history\.obs\.d\[\d+\] must be a finite number in \[0\.0, 1\.0\]"),
    "envsched obs v above m(1-m)": ("envsched", _edit(_v_above_bound), None,
                                    r"extra\.history\.obs\.v\[\d+\] is more than m \(1 - m\)"),
    "envsched obs raw_var negative": ("envsched", _obs_set("raw_var", -0.1), None,
                                      r"extra\.history\.obs\.raw_var\[\d+\]"),
    "envsched obs raw_var beyond the range": ("envsched", _obs_set("raw_var", 0.3), None,
                                              r"extra\.history\.obs\.raw_var\[\d+\]"),
    "envsched unscored group with statistics": ("envsched", _edit(_unscored_with_stats), None,
                                                r"extra\.history\.obs\.m\[\d+\] must be NaN"),
    "envsched unscored group m finite": ("envsched", _obs_set("m", 0.5, scored=False), None,
                                         r"extra\.history\.obs\.m\[\d+\] must be NaN"),
    "envsched obs n_scored above n_rollouts": ("envsched", _obs_set("n_scored", 9), None,
                                               r"extra\.history\.obs\.n_scored\[\d+\] exceeds"),
    "envsched obs n_rollouts 0": ("envsched", _obs_set("n_rollouts", 0), None,
                                  r"extra\.history\.obs\.n_rollouts\[\d+\]"),
    "envsched obs n_rollouts 2**40": ("envsched", _obs_set("n_rollouts", 2**40), None,
                                      r"extra\.history\.obs\.n_rollouts\[\d+\]"),
    "envsched obs pos negative": ("envsched", _at(*H, "obs", "pos", 0), -1,
                                  r"extra\.history\.obs\.pos\[0\] must be a whole number in \[0, 11\]"),
    "envsched obs step in the future": ("envsched", _at(*H, "obs", "step", 0), 99, r"extra\.history\.obs\.step\[0\]"),
    "envsched obs phase 9": ("envsched", _at(*H, "obs", "phase", 0), 9, r"extra\.history\.obs\.phase\[0\]"),
    "envsched dispatch status 3": ("envsched", _at(*H, "dispatch", "status", 0), 3,
                                   r"extra\.history\.dispatch\.status\[0\]"),
    "envsched dispatch phase external": ("envsched", _at(*H, "dispatch", "phase", 0), 4,
                                         r"extra\.history\.dispatch\.phase\[0\] must be a whole number in \[0, 3\]"),
    "envsched dispatch repeats a task": ("envsched", _edit(_dispatch_repeat), None,
                                         r"extra\.history\.dispatch\.pos repeats"),
    "envsched batch sizes disagree": ("envsched", _at(*H, "batch_sizes", 0), 5,
                                      r"extra\.history\.dispatch\.step rows .* batch_sizes"),
    "envsched step NaN": ("envsched", _at(*H, "step"), NAN, r"extra\.history\.step must be a whole"),
    "envsched step 2**60": ("envsched", _at(*H, "step"), 2**60, r"extra\.history\.step must be a whole"),
    "envsched live_start after step": ("envsched", _at(*H, "live_start"), 99,
                                       r"extra\.history\.live_start must be a whole"),
    "envsched last_selected run 0": ("envsched", _at(*H, "last_selected", "run", 0), 0,
                                     r"extra\.history\.last_selected\.run\[0\]"),
    "envsched last_selected step NaN": ("envsched", _at(*H, "last_selected", "step", 0), NAN,
                                        r"extra\.history\.last_selected\.step\[0\]"),
    "envsched observations fewer than logged": ("envsched", _at(*H, "observations"), 1,
                                                r"extra\.history\.observations must be a whole"),
    "envsched latest observed step -5": ("envsched", _at(*H, "latest_observed_step"), -5,
                                         r"extra\.history\.latest_observed_step must be a whole"),
    "envsched progress count 0": ("envsched", _at(*H, "progress", "count", 0), 0,
                                  r"extra\.history\.progress\.count\[0\]"),
    "envsched progress point v NaN": ("envsched", _at(*H, "progress", "v", 0), NAN,
                                      r"extra\.history\.progress\.v\[0\] must be a finite"),
    "envsched folded reference NaN": ("envsched", _at(*H, "folded", "reference"), [NAN, 0.0, 0.0],
                                      r"extra\.history\.folded\.reference\[0\] must be a finite"),
    "envsched batch totals beyond the steps": ("envsched", _at(*X, "batch_totals", "batches"), 10**6,
                                               r"extra\.batch_totals\.batches must be a whole"),
    "envsched last tools huge": ("envsched", _at(*X, "last_tools"), 10**9, r"extra\.last_tools must be a whole"),
    "envsched last phase unknown": ("envsched", _at(*X, "last_phases"), ["warp"],
                                    r"extra\.last_phases\[0\] must be one of"),
    "envsched last adaptive share NaN": ("envsched", _at(*X, "last_adaptive", "share"), NAN,
                                         r"extra\.last_adaptive\.share must be a finite"),
    "envsched last adaptive unknown key": ("envsched", _at(*X, "last_adaptive", "boost"), 1.0,
                                           r"extra\.last_adaptive has unknown keys \['boost'\]"),
    "envsched flag reason None": ("envsched", _at(*X, "flags"), {"t00": None},
                                  r"extra\.flags\['t00'\] must be a non-empty string"),
    "envsched flag unknown task": ("envsched", _at(*X, "flags"), {"zz": "why"}, r"extra\.flags names task 'zz'"),
    "envsched config clip NaN": ("envsched", _at(*X, "config", "variance_clip"), [NAN, 0.25], r"variance_clip"),
    "envsched graph nodes": ("envsched", _at(*X, "graph", "nodes"), 13,
                             r"extra\.graph\.nodes must be a whole number in \[12, 12\]"),
    "envsched-paper obs v NaN": ("envsched-paper", _obs_set("v", NAN), None,
                                 r"extra\.history\.obs\.v\[\d+\] must be a finite"),
    "envsched folded counts": ("envsched-folded", _edit(lambda s: s["extra"]["history"]["folded"]["scored"].__setitem__(
        0, 10**6)), None, r"extra\.history\.folded\.scored counts must satisfy"),
    "envsched folded env selections short": ("envsched-folded", _at(*H, "folded", "env_selections"), [0],
                                             r"extra\.history\.folded\.env_selections must have 3 entries"),
    "envsched frozen row in a live step": ("envsched-folded", _edit(
        lambda s: s["extra"]["history"]["obs"]["frozen"].__setitem__(-1, 1)), None,
        r"extra\.history\.obs\.frozen\[\d+\] disagrees"),
    # shares (reported: carry["b"] = 1e30 accepted, then sample(4) ran a rounding loop of ~1e30 steps)
    "shares carry 1e30": ("shares", _at("carry", "env1"), 1e30,
                          r"malformed SharesSampler state: carry\['env1'\] must be a finite number in \[-1"),
    "shares carry NaN": ("shares", _at("carry", "env0"), NAN, r"carry\['env0'\] must be a finite"),
    "shares carry None": ("shares", _at("carry", "env0"), None, r"carry\['env0'\] must be a finite"),
    "shares carries that do not sum to 0": ("shares", _at("carry"), {"env0": 0.5, "env1": 0.5, "env2": 0.5},
                                            r"carry remainders must sum to 0"),
    "shares drawn negative": ("shares", _at("drawn", "env0"), -1, r"drawn\['env0'\] must be a whole"),
    "shares last quota above drawn": ("shares", _at("last_quotas", "env0"), 10**6,
                                      r"last_quotas\['env0'\] must be a whole"),
    "shares inner state NaN": ("shares", _at("samplers", "env1", "extra", "successes", 0), NAN,
                               r"samplers\['env1'\]\.extra\.successes\[0\] must be a finite"),
    "shares inner rng": ("shares", _at("samplers", "env2", "rng", "state", "inc"), 4,
                         r"samplers\['env2'\]\.rng\.state\.inc must be odd"),
    "shares share changed": ("shares", _at("shares", "env0"), 0.5, r"saved with shares"),
    "shares share NaN": ("shares", _at("shares", "env0"), NAN, r"shares\['env0'\] must be a finite"),
    "shares sources reordered": ("shares", _at("sources"), ["env1", "env0", "env2"], r"state is for sources"),
}


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[Any, dict[str, Any], list[list[str]]]]:
    """Per sampler: a built sampler's good state and the draws that follow it (from a twin)."""
    out = {}
    for name in {case[0] for case in NAMED.values()}:
        s = _build(name)
        state = json.loads(json.dumps(s.state_dict()))
        out[name] = (state, _draws(s))
    return out


def _refused_cleanly(name: str, bad: dict[str, Any], match: str, expected_draws: list[list[str]]) -> ValueError:
    s = _build(name)
    before = frozen(s.state_dict())
    rng_before = copy.deepcopy(getattr(s, "_rng", None) and s._rng.bit_generator.state)
    with pytest.raises(ValueError, match=match) as info:
        s.load_state_dict(bad)
    assert frozen(s.state_dict()) == before, "a refused state changed the sampler"
    if rng_before:
        assert s._rng.bit_generator.state == rng_before, "a refused state moved the random generator"
    with hang_guard():
        assert _draws(s) == expected_draws, "the sampler no longer draws what it would have"
    return info.value


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(NAMED))
def test_named_crafted_state_is_refused(built: dict[str, Any], case: str) -> None:
    name, craft, value, match = NAMED[case]
    state, draws = built[name]
    bad = json.loads(json.dumps(state))
    craft(bad, value)
    assert frozen(bad) != frozen(state), "the case crafted nothing"
    _refused_cleanly(name, bad, match, draws)


def test_at_least_80_named_cases() -> None:
    assert len(NAMED) >= 80


# ---------------------------------------------------------------------- the three reported cases, verbatim
def test_reported_envsched_history_v_nan_is_refused_and_sample_keeps_its_draws(built: dict[str, Any]) -> None:
    """Before: the state loaded, then ``sample()`` raised IndexError and advanced the random generator."""
    state, draws = built["envsched"]
    bad = json.loads(json.dumps(state))
    bad["extra"]["history"]["obs"]["v"][0] = NAN
    assert bad["extra"]["history"]["obs"]["n_scored"][0] > 0  # a scored group: NaN is not its value
    _refused_cleanly("envsched", bad, r"extra\.history\.obs\.v\[0\] must be a finite number", draws)


def test_reported_shares_huge_carry_is_refused_and_sampling_cannot_hang(built: dict[str, Any]) -> None:
    """Before: ``carry["b"] = 1e30`` loaded and the next ``sample(4)`` ran for more than 20 s."""
    state, draws = built["shares"]
    bad = json.loads(json.dumps(state))
    bad["carry"]["env1"] = 1e30
    _refused_cleanly("shares", bad, r"carry\['env1'\] must be a finite number in \[-1", draws)
    # the rounding itself refuses such a carry at once instead of looping
    with hang_guard(), pytest.raises(ValueError, match="carry of source 'b' must be a number in \\[-1, 1\\]"):
        allocate_quotas(4, {"a": 1.0, "b": 1.0}, {"a": 0.0, "b": 1e30})


FAMILIES = {  # the reported accepted fields, each with NaN, inf and None
    "curriculum": ("extra", "successes", 0), "mopps-alpha": ("extra", "alpha", 0), "mopps-beta": ("extra", "beta", 0),
    "greso": ("extra", "p_easy"), "plr": ("extra", "scores", 0),
}


@pytest.mark.parametrize("value", [NAN, INF, None], ids=["nan", "inf", "None"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_reported_non_finite_fields_are_refused(built: dict[str, Any], family: str, value: Any) -> None:
    """Before: 71 of 3,226 such states were accepted (curriculum successes, MoPPS alpha/beta, GRESO p_easy,
    PLR scores, EnvSched history)."""
    name = family.split("-")[0]
    state, draws = built[name]
    path = FAMILIES[family]
    bad = _set(json.loads(json.dumps(state)), path, value)
    field = re.escape(".".join(str(p) for p in path if isinstance(p, str)))
    _refused_cleanly(name, bad, field + r"(\[0\])? must be a finite number", draws)


# ---------------------------------------------------------------------- sample() is atomic
class _Boom(RuntimeError):
    pass


class _FailingRng:
    """Forwards to a real generator and raises on its ``fail_at``-th method call."""

    def __init__(self, rng: Any, fail_at: int) -> None:
        self.rng, self.fail_at, self.calls = rng, fail_at, 0

    @property
    def bit_generator(self) -> Any:
        return self.rng.bit_generator

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.rng, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.fail_at:
                raise _Boom(f"random generator call {self.calls} ({name}) failed")
            return attr(*args, **kwargs)
        return call


def _rng_holders(s: Any) -> list[Any]:
    """The samplers whose generator is made to fail: for shares, its first source (a later envsched source
    failing on an internal error leaves the sources before it drawn; see SharesSampler.sample)."""
    return [s.samplers["env0"]] if isinstance(s, SharesSampler) else [s]


@pytest.mark.parametrize("name", sorted(set(SWEEP_NAMES) - {"sequential"}))  # sequential draws nothing at random
def test_sample_is_atomic_when_the_generator_fails_at_any_call(name: str) -> None:
    n = 10  # crosses the uniform sampler's epoch, so that it draws a permutation
    twin = _build(name)
    expected = _draws(twin, n=n, rounds=1)
    for holder_index in range(len(_rng_holders(twin))):
        failures = 0
        for fail_at in range(1, 200):
            s = _build(name)
            holder = _rng_holders(s)[holder_index]
            before = frozen(s.state_dict())
            real = holder._rng
            holder._rng = _FailingRng(real, fail_at)
            try:
                got = [t["id"] for t in s.sample(n)]
            except _Boom:
                failures += 1
                holder._rng = real
                assert frozen(s.state_dict()) == before, f"sample() failing at rng call {fail_at} changed the state"
                assert _draws(s, n=n, rounds=1) == expected
                continue
            holder._rng = real
            assert [got] == expected
            break
        assert failures >= 1, "the generator was never called: nothing was tested"


@pytest.mark.parametrize("name", ["envsched", "envsched-paper"])
def test_envsched_sample_is_atomic_when_the_batch_builder_fails(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import envsched.method.sampler as envsched_sampler

    twin = _build(name)
    expected = _draws(twin, n=4, rounds=1)
    s = _build(name)
    before = frozen(s.state_dict())
    real = envsched_sampler.build_batch

    def failing(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise _Boom("the batch builder failed after building")

    monkeypatch.setattr(envsched_sampler, "build_batch", failing)
    with pytest.raises(_Boom):
        s.sample(4)
    monkeypatch.setattr(envsched_sampler, "build_batch", real)
    assert frozen(s.state_dict()) == before
    assert _draws(s, n=4, rounds=1) == expected


class _Plain:
    """A TaskSampler that is not an envsched sampler (the wrapper cannot rely on its sample being atomic)."""

    def __init__(self, tasks: list[Any], seed: int) -> None:
        self.inner = UniformSampler(tasks, seed=seed)
        self.tasks = self.inner.tasks

    def sample(self, n: int) -> list[Any]:
        return self.inner.sample(n)

    def update(self, task: Any, rewards: Any, costs: Any = None) -> None:
        self.inner.update(task, rewards, costs)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def test_shares_sample_is_atomic_when_a_later_plain_source_fails() -> None:
    def build() -> SharesSampler:
        s = SharesSampler.from_pool(_pool(), {"env0": 1.0, "env1": 1.0, "env2": 1.0},
                                    lambda tasks, src: _Plain(tasks, seed=int(src[-1])))
        for _ in range(4):  # each source's epoch of 4 tasks ends: its next draw shuffles a new one
            for t in s.sample(3):
                s.update(t, [1.0, 0.0])
        return s

    expected = _draws(build(), n=3, rounds=1)
    s = build()
    before = frozen(s.state_dict())
    last = s.samplers["env2"].inner
    real = last._rng
    last._rng = _FailingRng(real, 1)  # the first two sources have drawn when the third fails
    with pytest.raises(_Boom):
        s.sample(3)
    last._rng = real
    assert frozen(s.state_dict()) == before
    assert _draws(s, n=3, rounds=1) == expected


def test_shares_checks_every_quota_before_any_source_draws() -> None:
    """An EnvSched source whose coverage share leaves a quota of 1 no exploitation slot refuses it; the
    uniform source before it has not drawn."""
    pool = _pool()
    by_env = {e: [t for t in pool if t["env"] == e] for e in ("env0", "env1")}
    samplers = {"env0": UniformSampler(by_env["env0"], seed=1),
                "env1": make_sampler("envsched", TaskPool(by_env["env1"]), seed=1, coverage_share=0.9)}
    s = SharesSampler(samplers, {"env0": 3.0, "env1": 1.0})
    before = frozen(s.state_dict())
    with pytest.raises(ValueError, match=r"source 'env1' cannot draw its quota of 1 tasks .* no exploitation slot"):
        s.sample(4)
    assert frozen(s.state_dict()) == before


# ---------------------------------------------------------------------- the trainer integrations' reward scale
REWARD_SCALE_CASES = {
    "nonfinite NaN": ("nonfinite", NAN, r"nonfinite must be a whole number"),
    "clipped 1e300": ("clipped", 1e300, r"clipped must be a whole number"),
    "rescaled negative": ("rescaled", -1, r"rescaled must be a whole number"),
    "rescaled None": ("rescaled", None, r"rescaled must be a whole number"),
    "fixed 1": ("fixed", 1, r"fixed must be one of \[True, False\]"),
    "source NaN": ("source", [NAN, 1.0], r"saved reward range must be two finite numbers"),
}


@pytest.mark.parametrize("case", sorted(REWARD_SCALE_CASES))
def test_reward_scale_state_is_refused(case: str) -> None:
    from envsched.integrations._rewards import RewardScale

    key, value, match = REWARD_SCALE_CASES[case]
    scale = RewardScale((0.0, 1.0))
    scale.map([0.5, 2.0, NAN])  # counts something
    before = frozen(scale.state_dict())
    bad = {**json.loads(json.dumps(scale.state_dict())), key: value}
    with pytest.raises(ValueError, match=match):
        scale.load_state_dict(bad)
    assert frozen(scale.state_dict()) == before
