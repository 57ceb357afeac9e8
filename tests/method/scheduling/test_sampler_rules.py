"""EnvSched stage 3: cold start, coverage, exploitation, caps, filters and ablations on hand-made pools."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import graph_from_arrays, synthetic_graph, synthetic_tasks
from envsched.method.sampler import EnvSchedSampler
from envsched.method.scheduling.batch import BatchSimilarity, SimilarityIndex, representative_scores
from envsched.method.scheduling.identifier_filter import IdentifierVerdict, Trajectory


def _pool(n_envs: int, per_env: int):
    tasks = [{"id": f"e{e}t{j}", "env": f"env{e}"} for e in range(n_envs) for j in range(per_env)]
    return tasks, [t["env"] for t in tasks]


def _ring_graph(tasks, envs, features=None):
    """Within: every other task of the environment; cross: the same slot in the next environment."""
    by_env: dict[str, list[int]] = {}
    for i, e in enumerate(envs):
        by_env.setdefault(e, []).append(i)
    names = sorted(by_env)
    within = [[j for j in by_env[e] if j != i] for i, e in enumerate(envs)]
    cross = []
    for i, e in enumerate(envs):
        nxt = by_env[names[(names.index(e) + 1) % len(names)]]
        slot = by_env[e].index(i)
        cross.append([nxt[slot % len(nxt)]] if len(names) > 1 else [])
    return graph_from_arrays([t["id"] for t in tasks], envs, within, cross, full_features=features,
                             abstract_features=features)


def _var_rewards(v: float) -> list[float]:
    x = math.sqrt(v)
    return [0.5 - x, 0.5 + x]


def test_cold_start_one_representative_per_env_then_novelty_at_most_two_per_env():
    tasks, envs = _pool(5, 6)
    a = [0.0, 0.1, 0.2, 0.35, 0.6, 0.9]
    rows = []
    for e in range(5):
        for j in range(6):
            r = np.zeros(10)
            r[2 * e], r[2 * e + 1] = 1.0, a[j]
            rows.append(r)
    g = _ring_graph(tasks, envs, np.array(rows))
    s = EnvSchedSampler(tasks, g, seed=3)
    batch = s.sample(8)
    envs_of = [t["env"] for t in batch]
    assert len(set(envs_of[:5])) == 5  # one representative per environment first
    central = representative_scores(g)
    for t in batch[:5]:
        i = s.position_of(t)
        members = [k for k in range(30) if envs[k] == envs[i]]
        best = max(members, key=lambda k: central[k])
        assert sorted(central[members])[-1] > sorted(central[members])[-2]  # a unique most central task
        assert i == best
    assert max(Counter(envs_of).values()) <= 2
    assert s.last_phases() == ["cold_start"] * 8
    assert s.metrics()["observed_groups"] == 0  # no pilot rollouts: nothing was run to choose them
    # novelty: the second task of an environment is the one least similar to its representative
    for e in set(envs_of[5:]):
        rep = next(s.position_of(t) for t in batch[:5] if t["env"] == e)
        second = next(s.position_of(t) for t in batch[5:] if t["env"] == e)
        members = [k for k in range(30) if envs[k] == e and k != rep]
        sims = g.pair_similarity(rep, np.array(members))
        assert sims[members.index(second)] == sims.min()


def test_cold_start_relaxes_the_per_env_cap_only_when_the_pool_forces_it():
    tasks, envs = _pool(3, 5)
    s = EnvSchedSampler(tasks, _ring_graph(tasks, envs), seed=0)
    batch = s.sample(9)
    counts = Counter(t["env"] for t in batch)
    assert sorted(counts.values()) == [3, 3, 3]
    relaxed = [r["relaxed"] for r in s.explanations()]
    assert relaxed[:6] == [[]] * 6 and all("cold_start_max_per_env->3" in r for r in relaxed[6:])


@pytest.mark.parametrize("dense_abs, blocks, patterns", [(3000, 8_000_000, 200), (0, 0, 200), (0, 0, 5)])
def test_batch_similarity_matches_pair_similarity(monkeypatch, dense_abs, blocks, patterns):
    # every code path: dense S_abs / feature gather / mat-vec, cached S_full blocks / on-the-fly rows
    monkeypatch.setattr(SimilarityIndex, "dense_abstract_max_nodes", dense_abs)
    monkeypatch.setattr(SimilarityIndex, "block_cache_entries", blocks)
    g = synthetic_graph(300, 6, seed=1, patterns=patterns)
    bs = BatchSimilarity(SimilarityIndex(g))
    members = [5, 17, 123]
    for m in members:
        bs.add(m)
    expected = np.max([g.pair_similarity(m, np.arange(300)) for m in members], axis=0)
    got = bs.max_sim(np.arange(300))
    assert np.allclose(got, expected, atol=1e-6)
    same = [g.env_codes == g.env_codes[m] for m in members]
    expected_within = np.max([np.where(sm, g.pair_similarity(m, np.arange(300)), 0) for m, sm in
                              zip(members, same, strict=True)], axis=0)
    assert np.allclose(bs.max_within, expected_within, atol=1e-6)
    assert got.max() > 0


def _loop(s: EnvSchedSampler, n: int, steps: int, reward_of, record=None):
    out = []
    for _ in range(steps):
        batch = s.sample(n)
        out.append([t["id"] for t in batch])
        if record is not None:
            record.append(list(s.last_phases()))
        for t in batch:
            s.update(t, reward_of(t["id"]))
    return out


def test_coverage_prefers_unselected_environments_then_unobserved_tasks():
    tasks, envs = _pool(2, 4)
    s = EnvSchedSampler(tasks, _ring_graph(tasks, envs), config=SchedulerConfig.paper(mode="coverage_only"), seed=0)
    batches = _loop(s, 1, 8, lambda _id: [0.0, 1.0])
    assert batches[0][0][:2] != batches[1][0][:2]  # step 1 goes to the environment step 0 did not cover
    assert sorted(b[0] for b in batches) == sorted(t["id"] for t in tasks)  # each task once before any twice


def test_coverage_and_quota_caps_in_the_full_scheduler():
    tasks, envs = _pool(3, 10)
    cfg = SchedulerConfig.paper(batch_size=12, coverage_share=0.5, max_per_env_coverage=1, env_quota_per_batch=4)
    s = EnvSchedSampler(tasks, _ring_graph(tasks, envs), config=cfg, seed=0)
    phases: list[list[str]] = []
    batches = _loop(s, 12, 4, lambda _id: [0.0, 1.0, 1.0], phases)
    for ids, ph in list(zip(batches, phases, strict=True))[1:]:
        cov = [i for i, p in zip(ids, ph, strict=True) if p == "coverage"]
        assert len(cov) == 3 and len({i.split("t")[0] for i in cov}) == 3  # C1 = 1 per environment
        assert sorted(Counter(i.split("t")[0] for i in ids).values()) == [4, 4, 4]  # C3 = 4 per environment
        assert ph.count("exploitation") == 9
        caps = [r["caps"] for r in s.explanations()] if ids == batches[-1] else []
        for c in caps:
            assert c["env_quota_per_batch"]["count"] <= 4


def test_consecutive_selection_cap():
    tasks, envs = _pool(2, 6)
    star = "e0t0"

    def reward(i):
        return [0.0, 1.0] * 2 if i == star else [1.0, 1.0, 1.0, 1.0]

    def streak(cap):
        s = EnvSchedSampler(tasks, _ring_graph(tasks, envs), seed=0,
                            config=SchedulerConfig.paper(batch_size=3, mode="exploitation_only",
                                                         max_consecutive_selections=cap,
                                                         use_progress_filter=False, exposure_power=0.0))
        batches = _loop(s, 3, 10, reward)
        picked = [star in b for b in batches]
        first = picked.index(True)
        longest = run = 0
        for x in picked[first:]:
            run = run + 1 if x else 0
            longest = max(longest, run)
        return longest, picked[first:]

    longest, picked = streak(2)
    assert longest == 2  # never three batches in a row
    assert picked[:6] == [True, True, False, True, True, False]  # but as often as the cap allows
    assert streak(10)[0] >= 5  # without the cap it would be picked every time


def test_progress_filter_out_of_exploitation_still_in_coverage_and_back():
    tasks, envs = _pool(2, 3)
    g = _ring_graph(tasks, envs)
    cfg = SchedulerConfig.paper(batch_size=6, mode="exploitation_only")
    s = EnvSchedSampler(tasks, g, config=cfg, require_dispatch=False)
    for v in (0.2, 0.1, 0.05, 0.0):
        s.update("e0t0", _var_rewards(v))
    h = s.history
    assert h.transitions[0] == 3 and h.residual[0] == pytest.approx(0.0 + (0.0 - 0.2) / 3)
    assert h.progress_filtered()[0]
    batch = s.sample(5)  # exploitation can fill 5 of 6 without it
    assert "e0t0" not in [t["id"] for t in batch] and set(s.last_phases()) == {"exploitation"}
    rec = s.explanations()
    assert all(not r["filters"]["progress"]["filtered"] for r in rec)
    cov = EnvSchedSampler(tasks, g, config=SchedulerConfig.paper(batch_size=6, mode="coverage_only"),
                          require_dispatch=False)
    for v in (0.2, 0.1, 0.05, 0.0):
        cov.update("e0t0", _var_rewards(v))
    cov.sample(6)
    assert cov.last_phases() == ["coverage"] * 6  # the filtered task is still a coverage candidate
    s.update("e0t0", _var_rewards(0.05))  # new observation: 0.05 + (0.05 - 0.1) / 3 > 0
    assert h.residual[0] == pytest.approx(0.05 + (0.05 - 0.1) / 3) and not h.progress_filtered()[0]
    batch = s.sample(6)
    assert "e0t0" in [t["id"] for t in batch] and set(s.last_phases()) == {"exploitation"}


def test_progress_filter_needs_three_transitions():
    tasks, envs = _pool(1, 3)
    s = EnvSchedSampler(tasks, _ring_graph(tasks, envs), require_dispatch=False)
    for _ in range(3):
        s.update("e0t0", [1.0, 1.0])
    assert s.history.transitions[0] == 2 and not s.history.progress_filtered()[0]
    s.update("e0t0", [1.0, None])  # one scored rollout: not scorable, no transition
    assert s.history.transitions[0] == 2
    s.update("e0t0", [1.0, 1.0])
    assert s.history.transitions[0] == 3 and s.history.progress_filtered()[0]


class _FlagEverything:
    def __init__(self):
        self.seen = []

    def check(self, task, trajectory):
        self.seen.append(task["id"])
        return IdentifierVerdict(True, trajectory.reward, [], f"guessed id in {task['id']}")


def test_identifier_filter_hook_removes_flagged_tasks_from_exploitation():
    tasks, envs = _pool(2, 3)
    hook = _FlagEverything()
    s = EnvSchedSampler(tasks, _ring_graph(tasks, envs),
                        config=SchedulerConfig.paper(batch_size=6, mode="exploitation_only"),
                        identifier_filter=hook, require_dispatch=False)
    s.update("e0t1", [0.0, 1.0])
    assert s.submit_trajectory("e0t1", Trajectory([["f(1)"]], reward=0.5)) is None  # not a high reward
    verdict = s.submit_trajectory("e0t1", Trajectory([["f(1)"]], reward=1.0))
    assert verdict.flagged and hook.seen == ["e0t1"]
    assert s.identifier_flags() == {"e0t1": "guessed id in e0t1"}
    batch = s.sample(5)
    assert "e0t1" not in [t["id"] for t in batch]
    assert s.metrics()["identifier_flagged"] == 1
    s.unflag_task("e0t1")
    assert "e0t1" in [t["id"] for t in s.sample(6)] and s.last_phases() == ["exploitation"] * 6
    with pytest.raises(ValueError, match="finite number"):
        s.submit_trajectory("e0t1", Trajectory([["f(1)"]], reward=float("nan")))
    with pytest.raises(KeyError, match="unknown task"):
        s.submit_trajectory("nope", Trajectory([["f(1)"]], reward=1.0))
    with pytest.raises(ValueError, match="no identifier_filter"):
        EnvSchedSampler(tasks, _ring_graph(tasks, envs)).submit_trajectory("e0t1", Trajectory([], 1.0))


def test_mode_ablations_change_the_split():
    g = synthetic_graph(120, 12, seed=2)  # env10, env11 sort before env2: the sampler renumbers environments
    tasks = synthetic_tasks(g)
    rng = np.random.default_rng(0)
    p = rng.random(120)

    def phases(mode):
        s = EnvSchedSampler(tasks, g, config=SchedulerConfig.paper(batch_size=16, mode=mode), seed=0)
        rec: list[list[str]] = []
        _loop(s, 16, 4, lambda i: (rng.random(8) < p[int(i[1:])]).astype(float).tolist(), rec)
        return rec[1:], s

    full, s_full = phases("full")
    assert all(Counter(r) == {"coverage": 8, "exploitation": 8} for r in full)
    cov_envs = [r["env"] for r in s_full.explanations() if r["phase"] == "coverage"]
    assert len(set(cov_envs)) == 8  # lowest current-step coverage first: 8 different environments
    m = s_full.metrics()
    assert (m["last_batch_coverage"], m["last_batch_exploitation"]) == (8.0, 8.0)
    cov, _ = phases("coverage_only")
    assert all(set(r) == {"coverage"} for r in cov)
    exp, _ = phases("exploitation_only")
    assert all(set(r) == {"exploitation"} for r in exp)


def test_graph_must_match_the_tasks():
    tasks, envs = _pool(2, 2)
    g = _ring_graph(tasks, envs)
    with pytest.raises(ValueError, match="same order"):
        EnvSchedSampler(list(reversed(tasks)), g)
    with pytest.raises(ValueError, match="nodes"):
        EnvSchedSampler(tasks[:3], g)
    moved = [dict(t) for t in tasks]
    moved[0]["env"] = "env1"
    with pytest.raises(ValueError, match="environment"):
        EnvSchedSampler(moved, g)
    bad = graph_from_arrays([t["id"] for t in tasks], envs, [[1], [0], [3], [2]], [[2], [3], [0], [1]],
                            full_features=sp.identity(4), abstract_features=sp.identity(4))
    bad.within_index[3, 0] = 9
    with pytest.raises(ValueError, match="neighbour indices"):
        EnvSchedSampler(tasks, bad)
    with pytest.raises(TypeError, match="SchedulerConfig"):
        EnvSchedSampler(tasks, g, config={"mode": "full"})


@pytest.mark.parametrize("factor, extra", [(0, 3), (8, 256)])
def test_exploitation_shortlist_gives_the_same_batches_as_a_full_scan(monkeypatch, factor, extra):
    import envsched.method.scheduling.batch as scheduling

    g = synthetic_graph(400, 8, seed=4)
    tasks = synthetic_tasks(g)
    p = np.random.default_rng(3).random(400)

    def run():
        s = EnvSchedSampler(tasks, g, seed=2)
        rng = np.random.default_rng(0)
        return _loop(s, 24, 5, lambda i: (rng.random(8) < p[int(i[1:])]).astype(float).tolist())

    monkeypatch.setattr(scheduling, "SHORTLIST_FACTOR", 0)
    monkeypatch.setattr(scheduling, "SHORTLIST_EXTRA", 10**9)
    full = run()
    monkeypatch.setattr(scheduling, "SHORTLIST_FACTOR", factor)
    monkeypatch.setattr(scheduling, "SHORTLIST_EXTRA", extra)
    assert run() == full


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_envs=st.integers(1, 5), per_env=st.integers(1, 6), n=st.integers(1, 12), c1=st.integers(1, 3),
       c3=st.integers(1, 4), ctask=st.integers(1, 2), mode=st.sampled_from(["full", "coverage_only",
                                                                             "exploitation_only"]),
       seed=st.integers(0, 3))
def test_caps_hold_unless_a_fill_pick_says_it_relaxed_them(n_envs, per_env, n, c1, c3, ctask, mode, seed):
    tasks, envs = _pool(n_envs, per_env)
    n = min(n, len(tasks))
    cfg = SchedulerConfig.paper(batch_size=max(n, 2), coverage_share=0.5, max_per_env_coverage=c1,
                          env_quota_per_batch=c3, max_consecutive_selections=ctask, mode=mode)
    s = EnvSchedSampler(tasks, _ring_graph(tasks, envs), config=cfg, seed=seed)
    rng = np.random.default_rng(seed)
    runs: dict[str, int] = {}
    for _ in range(4):
        batch = s.sample(n)
        ids = [t["id"] for t in batch]
        assert len(set(ids)) == n
        recs = s.explanations()
        for r in recs:
            if r["phase"] in ("coverage", "exploitation"):
                assert r["caps"]["env_quota_per_batch"]["count"] <= c3
                assert r["caps"]["max_consecutive_selections"]["count"] <= ctask
            if r["phase"] == "coverage":
                assert r["caps"]["max_per_env_coverage"]["count"] <= c1
            if r["phase"] == "fill":
                over = (r["caps"]["env_quota_per_batch"]["count"] > c3
                        or r["caps"]["max_consecutive_selections"]["count"] > ctask)
                assert not over or r["relaxed"]
        for i in ids:  # consecutive runs, checked independently of the records
            runs[i] = runs.get(i, 0) + 1
        for i in list(runs):
            if i not in ids:
                runs[i] = 0
        over_cap = [i for i in ids if runs[i] > ctask]
        for i in over_cap:
            rec = next(r for r in recs if r["task_id"] == i)
            assert "max_consecutive_selections" in rec["relaxed"]
        for t in batch:
            s.update(t, (rng.random(4) < 0.5).astype(float).tolist())
