"""Explanation records (built for all picks at once): the same records, byte for byte, as the
plain one-value-at-a-time code, and the vectorised rounding is exactly Python's ``round(x, 6)``."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest

from envsched.method.config import SchedulerConfig
from envsched.method.explain import _STATS, EXPLAIN_FORMAT, _f, _round6, _stats, build_records, read_run_file
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.history.prediction import Prediction
from envsched.method.sampler import EnvSchedSampler
from envsched.method.scheduling.batch import Pick


def test_round6_is_python_round_exactly():
    rng = np.random.default_rng(0)
    k = rng.integers(-10**9, 10**9, 2_000).astype(float)
    halves = (k + 0.5) / 1e6  # the nearest doubles to exact ties, on either side of them
    values = np.concatenate([
        rng.random(5_000), rng.normal(0, 1e3, 2_000), rng.random(500) * 1e-7, -rng.random(500),
        halves, np.nextafter(halves, np.inf), np.nextafter(halves, -np.inf), np.nextafter(halves, 0),
        [0.0, -0.0, 0.5, 1.0, 2.5e-7, -2.5e-7, 0.0000005, 1e300, -1e300, 2.0**51 / 1e6, 1e-320,
         math.inf, -math.inf, math.nan, 0.1234565, 1234.5678905, 4503599.6274945]])
    expected = [_f(x) for x in values]
    got = _round6(values)
    assert len(got) == len(expected)
    for x, a, b in zip(values.tolist(), got, expected, strict=True):
        assert (a is None and b is None) or (json.dumps(a) == json.dumps(b) and type(a) is float), x
    assert _round6(np.empty(0)) == []


# ---- the records built one value at a time (the reference)

def _plain_relation(pos: int, relation: str, graph: DualRelationGraph, pred: Prediction, used: bool,
              task_ids: list[str], envs: list[str], env_codes: np.ndarray, max_neighbors: int | None) -> dict:
    hl = pred.long
    if relation == "within":
        idx, w, s = graph.within_index[pos], graph.within_weight[pos], graph.within_similarity[pos]
        est, has = hl.within[pos], hl.within_has[pos]
    else:
        idx, w, s = graph.cross_index[pos], graph.cross_weight[pos], graph.cross_similarity[pos]
        est, has = hl.cross[pos], hl.cross_has[pos]
    neighbors = []
    for j in range(idx.size):
        k = int(idx[j])
        if k < 0:
            continue
        obs = bool(hl.history.observed[k])
        neighbors.append({
            "id": task_ids[k], "env": envs[int(env_codes[k])], "weight": _f(w[j]), "similarity": _f(s[j]),
            "observed": obs, "groups": int(hl.history.groups[k]),
            "mean": _f(hl.history.values[k, 0]) if obs else None,
            "variance": _f(hl.history.values[k, 1]) if obs else None,
        })
    if max_neighbors is not None:
        neighbors = neighbors[:max_neighbors]
    return {"used": used, "has_observed_neighbors": bool(has), "estimate": _stats(est), "neighbors": neighbors}


def plain_build_records(step: int, picks: list[Pick], *, graph: DualRelationGraph,
                  snapshot: dict[int, tuple[int, float, bool, int]], prediction: Prediction | None,
                  config: SchedulerConfig, task_ids: list[str], envs: list[str], env_codes: np.ndarray,
                  identifier_flags: dict[int, str],
                  adaptive: tuple[dict[str, float], dict[int, dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """The records built one value at a time."""
    out = []
    c1, c3 = config.caps_for(len(picks)) if picks else (config.max_per_env_coverage, config.env_quota_per_batch)
    for p in picks:
        i = p.pos
        rec: dict[str, Any] = {
            "format": EXPLAIN_FORMAT, "kind": "pick", "step": step, "rank": p.rank, "task_id": task_ids[i],
            "env": envs[int(env_codes[i])], "phase": p.phase, "score": _f(p.score), "base_score": _f(p.base_score),
        }
        if prediction is not None:
            pr = prediction
            rec["q"] = _f(pr.q[i])
            rec["informativeness"] = _f(pr.informativeness[i])
            rec["predicted"] = {"mean": _f(pr.mean[i]), "dispersion": _f(pr.dispersion[i]),
                                "variance": _f(pr.variance[i]),
                                "variance_reconstructed": _f(pr.long.v_reconstructed[i])}
            rec["half_lives"] = {
                name: {"half_life": hl.history.half_life, "score": _f(hl.score[i]), "q": _f(hl.q[i]),
                       "variance": _f(hl.v_direct[i]), "variance_reconstructed": _f(hl.v_reconstructed[i])}
                for name, hl in (("long", pr.long), ("short", pr.short))}
            rec["decline"] = _f(pr.decline[i])
            rec["global_reference"] = _stats(pr.reference)
            h = pr.long.history
            rec["own_history"] = {"groups": int(h.groups[i]), "weight": _f(h.weight[i]),
                                  **(_stats(h.values[i]) if h.weight[i] > 0 else dict.fromkeys(_STATS))}
            rec["relations"] = {
                rel: _plain_relation(i, rel, graph, pr, used, task_ids, envs, env_codes, config.explain_max_neighbors)
                for rel, used in (("within", config.use_within_edges), ("cross", config.use_cross_edges))}
            rec["fusion"] = {"within_weight": config.within_fusion_weight if config.use_cross_edges
                             else (1.0 if config.use_within_edges else 0.0),
                             "prior": _stats(pr.long.prior[i]), "prior_strength": config.prior_strength,
                             "unobserved_neighbours": config.unobserved_neighbours,
                             "environment": (None if pr.long.relations.environment is None
                                             else _stats(pr.long.relations.environment[i]))}
        else:
            rec.update(q=None, informativeness=None, predicted=None, half_lives=None, decline=None,
                       global_reference=None, own_history=None, relations=None, fusion=None)
        rec["similarity"] = {"max_similarity": _f(p.max_similarity), "penalty": config.similarity_penalty}
        rec["exposure"] = {"exposure": _f(p.exposure), "discount": _f(p.exposure_discount)}
        rec["novelty"] = _f(p.novelty) if p.novelty is not None else None
        rec["coverage"] = {"env_batch_count": p.env_batch_count, "env_coverage_count": p.env_coverage_count,
                           "env_selections_before": p.env_selections_before,
                           "task_observations_before": p.task_observations_before, "tied_envs": p.tied_envs}
        transitions, res, filtered, run = snapshot[i]
        rec["caps"] = {
            "max_per_env_coverage": {"paper": "C1", "limit": c1, "count": p.env_coverage_count,
                                     "reached": p.env_coverage_count >= c1},
            "env_quota_per_batch": {"paper": "C3", "limit": c3, "count": p.env_batch_count,
                                    "reached": p.env_batch_count >= c3},
            "max_consecutive_selections": {"paper": "C_task", "limit": config.max_consecutive_selections,
                                           "count": run, "reached": run >= config.max_consecutive_selections},
        }
        if p.phase == "cold_start":
            rec["caps"]["cold_start_max_per_env"] = {"paper": "C (cold start)", "limit": config.cold_start_max_per_env,
                                                     "count": p.env_batch_count,
                                                     "reached": p.env_batch_count >= config.cold_start_max_per_env}
        rec["filters"] = {
            "progress": {"transitions": transitions, "residual": None if math.isinf(res) else _f(res),
                         "filtered": filtered},
            "identifier": {"flagged": i in identifier_flags, "reason": identifier_flags.get(i)},
        }
        rec["relaxed"] = list(p.relaxed)
        if adaptive is not None:
            batch_info, per_pos = adaptive
            rec["adaptive"] = {**{k: _f(v) for k, v in batch_info.items()}, **per_pos.get(i, {})}
        else:
            rec["adaptive"] = None
        out.append(rec)
    return out


CONFIGS = {"default": SchedulerConfig(), "paper": SchedulerConfig.paper(),
           "three neighbours": dataclasses.replace(SchedulerConfig(), explain_max_neighbors=3),
           "no within edges": dataclasses.replace(SchedulerConfig.paper(), use_within_edges=False)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_records_equal_the_plain_records_byte_for_byte(name, tmp_path):
    config = CONFIGS[name]
    g = synthetic_graph(1_200, 24, seed=1)
    tasks = synthetic_tasks(g)
    run_file = tmp_path / "run.jsonl"
    s = EnvSchedSampler(tasks, g, config, seed=5, run_file=run_file)
    rng = np.random.default_rng(2)
    p = rng.beta(0.6, 0.6, size=len(tasks))
    pending = s.sample(48)
    checked = 0
    for step in range(8):
        for t in pending:  # some unscored rollouts, so residuals and histories vary
            s.update(t, [None if rng.random() < 0.1 else float(rng.random() < p[s.position_of(t)])
                         for _ in range(6)])
        if step == 2:
            s.flag_task(pending[0], "looks solved")
        pending = s.sample(48)
        pe = s._pending_explain
        st, picks = pe.step, pe.picks
        kw = dict(graph=g, snapshot=pe.snapshot, prediction=pe.prediction, config=config, task_ids=s._keys,
                  envs=s.envs, env_codes=s.env_codes, identifier_flags=pe.flags)
        plain = plain_build_records(st, picks, **kw, adaptive=pe.trace.explain([q.pos for q in picks]))
        new = build_records(st, picks, **kw, trace=pe.trace)
        assert [json.dumps(r) for r in new] == [json.dumps(r) for r in plain]
        assert s.explanations() == plain
        # the run file holds the same text json.dumps writes
        lines = run_file.read_text().splitlines()[-len(plain):]
        assert lines == [json.dumps(r) for r in plain]
        checked += sum(r["relations"] is not None for r in plain)
    assert checked > 0 and len(read_run_file(run_file, step=st)) == 48
