"""Stage 4 of EnvSched: why each task was selected (the paper's case studies F.1-F.3, as data).

For every selected task the sampler builds one explanation record: the phase and batch rank, the
percentile ``q`` and informativeness, the predicted mean / dispersion / variance, the estimate of each
relation and the neighbours behind it (with their own histories), the global reference, the task's own
history, the similarity penalty, exposure, the caps that bind it and the filters. Records are JSON objects;
with a run file they are appended to it, one per line, after every ``sample()`` -- ``envsched explain``
prints them.

Record schema (``"format": "envsched.explain/1"``, ``"kind": "pick"``)::

    step, rank, task_id, env, phase ("cold_start" | "coverage" | "exploitation" | "fill"),
    score (the penalised score the pick maximised), base_score, q, informativeness,
    predicted {mean, dispersion, variance, variance_reconstructed} | null,
    half_lives {long|short: {half_life, score, q, variance, variance_reconstructed}} | null,
    decline, global_reference {mean, variance, dispersion} | null,
    own_history {groups, weight, mean, variance, dispersion} | null,
    relations {within|cross: {used, has_observed_neighbors, estimate {mean, variance, dispersion},
               neighbors [{id, env, weight, similarity, observed, groups, mean, variance}]}} | null,
    fusion {within_weight, prior {mean, variance, dispersion}, prior_strength} | null,
    similarity {max_similarity, penalty}, exposure {exposure, discount}, novelty,
    coverage {env_batch_count, env_coverage_count, env_selections_before, task_observations_before,
              tied_envs},
    caps {max_per_env_coverage | env_quota_per_batch | max_consecutive_selections:
          {paper, limit, count, reached}},
    filters {progress {transitions, residual, filtered}, identifier {flagged, reason}},
    relaxed [names of caps or filters a fill pick ignored]

Values from the prediction are on the pool's reward scale mapped to [0, 1]; relation and history values
use the long half-life (the short one is in ``half_lives``). The first line of a run file is a header
(``"kind": "header"``) with the sampler configuration.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from envsched.method.config import SchedulerConfig
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.history.prediction import Prediction
from envsched.method.history.statistics import History
from envsched.method.scheduling.batch import Pick

__all__ = ["EXPLAIN_FORMAT", "build_records", "filter_snapshot", "iter_run_file", "read_run_file", "write_records"]

EXPLAIN_FORMAT = "envsched.explain/1"
_STATS = ("mean", "variance", "dispersion")


def _f(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else round(x, 6)


def _stats(row: np.ndarray) -> dict[str, float | None]:
    return {k: _f(row[j]) for j, k in enumerate(_STATS)}


def _relation(pos: int, relation: str, graph: DualRelationGraph, pred: Prediction, used: bool,
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


def filter_snapshot(history: History, positions: list[int]) -> dict[int, tuple[int, float, bool, int]]:
    """What the explanation needs from the history, per selected task, taken right after the batch was
    recorded: ``(scorable transitions, residual, progress-filtered, consecutive selections)``."""
    filtered = history.progress_filtered()
    return {p: (int(history.transitions[p]), float(history.residual[p]), bool(filtered[p]),
                int(history.run_length[p])) for p in positions}


def build_records(step: int, picks: list[Pick], *, graph: DualRelationGraph,
                  snapshot: dict[int, tuple[int, float, bool, int]], prediction: Prediction | None,
                  config: SchedulerConfig, task_ids: list[str], envs: list[str], env_codes: np.ndarray,
                  identifier_flags: dict[int, str]) -> list[dict[str, Any]]:
    """One record per pick (see the module docstring); ``snapshot`` from :func:`filter_snapshot`."""
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
                rel: _relation(i, rel, graph, pr, used, task_ids, envs, env_codes, config.explain_max_neighbors)
                for rel, used in (("within", config.use_within_edges), ("cross", config.use_cross_edges))}
            rec["fusion"] = {"within_weight": config.within_fusion_weight if config.use_cross_edges
                             else (1.0 if config.use_within_edges else 0.0),
                             "prior": _stats(pr.long.prior[i]), "prior_strength": config.prior_strength}
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
        out.append(rec)
    return out


def write_records(path: str | os.PathLike[str], records: list[dict[str, Any]], header: dict[str, Any]) -> None:
    """Append ``records`` to the JSONL run file ``path`` (the header first when the file is new or empty)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", encoding="utf-8") as fh:
        if new:
            fh.write(json.dumps({"format": EXPLAIN_FORMAT, "kind": "header", **header}) + "\n")
        for r in records:
            fh.write(json.dumps(r) + "\n")
        fh.flush()


def iter_run_file(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the records of a run file (header included). Raises ``ValueError`` naming the bad line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run file not found: {path}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, expected an explanation run file (JSONL)")
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}, line {lineno}: invalid JSON ({exc.msg})") from None
            if not isinstance(rec, dict) or rec.get("format") != EXPLAIN_FORMAT:
                raise ValueError(f"{path}, line {lineno}: not an explanation record (format "
                                 f"{rec.get('format') if isinstance(rec, dict) else None!r}, "
                                 f"expected {EXPLAIN_FORMAT!r})")
            yield rec


def read_run_file(path: str | os.PathLike[str], *, step: int | None = None,
                  task: str | None = None) -> list[dict[str, Any]]:
    """The pick records of a run file, optionally of one step and/or one task id."""
    return [r for r in iter_run_file(path) if r.get("kind") == "pick"
            and (step is None or r.get("step") == step) and (task is None or r.get("task_id") == task)]
