"""EnvSchedSampler: determinism, state_dict round-trips mid-run, and asynchronous (late, out-of-order,
missing) updates."""

from __future__ import annotations

import json

import numpy as np
import pytest

from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.sampler import EnvSchedSampler

G = synthetic_graph(240, 8, seed=5)
TASKS = synthetic_tasks(G)
P = np.random.default_rng(1).random(240)


def _rewards(task_id: str, step: int) -> list[float | None]:
    rng = np.random.default_rng(hash((task_id, step)) % 2**32)
    r: list[float | None] = (rng.random(8) < P[int(task_id[1:])]).astype(float).tolist()
    if step % 3 == 0:
        r[0] = None
    return r


def _run(s: EnvSchedSampler, steps: int, start: int = 0, n: int = 16) -> list[list[str]]:
    out = []
    for k in range(start, start + steps):
        batch = s.sample(n)
        out.append([t["id"] for t in batch])
        for t in batch:
            s.update(t, _rewards(t["id"], k))
    return out


def test_deterministic_given_seed():
    a = _run(EnvSchedSampler(TASKS, G, seed=7), 6)
    b = _run(EnvSchedSampler(TASKS, G, seed=7), 6)
    c = _run(EnvSchedSampler(TASKS, G, seed=8), 6)
    assert a == b
    assert a != c


def test_state_dict_round_trip_mid_run_with_outstanding_groups():
    s = EnvSchedSampler(TASKS, G, seed=3)
    _run(s, 4)
    pending = s.sample(16)  # dispatched, half reported: the rest are in flight at checkpoint time
    for t in pending[:8]:
        s.update(t, _rewards(t["id"], 4))
    state = json.loads(json.dumps(s.state_dict()))  # JSON-serialisable
    r = EnvSchedSampler(TASKS, G, seed=99)  # the seed is restored from the state
    r.load_state_dict(state)
    assert r.metrics() == pytest.approx(s.metrics(), nan_ok=True)
    assert r.metrics()["outstanding_groups"] == 8
    for x in (s, r):
        for t in pending[8:]:
            x.update(t, _rewards(t["id"], 4))
    assert _run(s, 3, start=5) == _run(r, 3, start=5)
    np.testing.assert_array_equal(s.predict().informativeness, r.predict().informativeness)


def test_load_state_refuses_other_config_and_changes_nothing():
    s = EnvSchedSampler(TASKS, G, seed=3)
    _run(s, 2)
    state = s.state_dict()
    other = EnvSchedSampler(TASKS, G, config=SchedulerConfig(coverage_share=0.25), seed=3)
    _run(other, 1)
    before = json.dumps(other.state_dict())
    with pytest.raises(ValueError, match="coverage_share"):
        other.load_state_dict(state)
    assert json.dumps(other.state_dict()) == before
    broken = json.loads(json.dumps(state))
    broken["extra"]["history"]["obs"]["pos"][0] = 10_000
    with pytest.raises(ValueError, match=r"history\.obs\.pos\[0\] must be a whole number in \[0, 239\]"):
        EnvSchedSampler(TASKS, G, seed=3).load_state_dict(broken)


def test_late_out_of_order_and_missing_updates():
    s = EnvSchedSampler(TASKS, G, seed=0)
    b0 = s.sample(16)
    b1 = s.sample(16)  # the trainer draws again before any reward came back
    assert not {t["id"] for t in b0} & {t["id"] for t in b1}  # in-flight tasks count as observed
    assert s.last_phases() == ["cold_start"] * 16  # still no history
    for t in reversed(b1):  # step 1 reports first ...
        s.update(t, [0.0, 1.0])
    for t in b0[:-2]:  # ... then step 0, except two groups
        s.update(t, [1.0, 1.0])
    s.discard(b0[-1])  # one dropped by the trainer
    m = s.metrics()
    assert m["outstanding_groups"] == 1 and m["discarded_groups"] == 1
    obs = s.history.obs
    steps = {s.keys[p]: st for p, st in zip(obs.col("pos"), obs.col("step"), strict=True)}
    assert all(steps[t["id"]] == 1 for t in b1) and all(steps[t["id"]] == 0 for t in b0[:-2])
    # the reference is the latest step with its own reference: step 1 (mean 0.5), not step 0 (mean 1.0)
    assert s.history.global_reference()[0] == 0.5
    b2 = s.sample(16)
    assert len({t["id"] for t in b2}) == 16
    s.update(b0[-2], [0.0, 0.0])  # a group two batches late is dated by its own draw (step 0)
    assert s.history.obs.col("step")[-1] == 0
    with pytest.raises(ValueError, match="without an outstanding dispatch"):
        s.update(b0[-1], [1.0])  # discarded: its update can no longer come


def test_same_task_in_flight_twice_is_matched_first_in_first_out():
    tasks = TASKS[:3]
    from envsched.method.graph.synthetic import graph_from_arrays

    g = graph_from_arrays([t["id"] for t in tasks], [t["env"] for t in tasks], [[], [], []], [[1], [0], [0]])
    s = EnvSchedSampler(tasks, g, seed=0)
    s.sample(3)
    s.sample(3)
    s.update(tasks[0], [1.0])
    s.update(tasks[0], [0.0])
    steps = s.history.obs.col("step").tolist()
    assert steps == [0, 1]


def test_metrics_report_the_papers_batch_statistics():
    tasks = [dict(t, tools=[{"name": f"tool{int(t['id'][1:]) % 13}"}]) for t in TASKS]
    s = EnvSchedSampler(tasks, G, config=SchedulerConfig.paper(batch_size=16), seed=0)
    _run(s, 3)
    batch = s.sample(16)
    variances = []
    for t in batch:
        r = _rewards(t["id"], 9)
        s.update(t, r)
        variances.append(np.var([x for x in r if x is not None]))
    m = s.metrics()
    assert m["batch_reward_variance"] == pytest.approx(np.mean(variances))
    assert m["last_batch_envs"] == len({t["env"] for t in batch})
    assert m["last_batch_tools"] == len({t["tools"][0]["name"] for t in batch})
    assert (m["last_batch_coverage"], m["last_batch_exploitation"]) == (8.0, 8.0)
    expl = [t for t, ph in zip(batch, s.last_phases(), strict=True) if ph == "exploitation"]
    hits = [np.var([x for x in _rewards(t["id"], 9) if x is not None]) > 0 for t in expl]
    assert m["exploitation_hit_rate"] == pytest.approx(np.mean(hits))
    assert m["outstanding_groups"] == 0 and m["steps"] == 4
