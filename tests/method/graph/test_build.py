"""The dual-relation graph on hand-made pools: neighbours are what S_full / S_abs imply."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from envsched.method.config import DEFAULT_VIEW_WEIGHTS, GraphConfig
from envsched.method.graph.abstraction import abstract_tokens, extract_abstraction
from envsched.method.graph.build import build_graph, extend_graph
from envsched.method.graph.features import build_features
from envsched.method.graph.neighbors import adaptive_weights, merge_topk
from envsched.pool import TaskPool

DATA = Path("/work/shared/data")


def _tool(name: str, desc: str, **params: str) -> dict:
    return {"name": name, "description": desc,
            "parameters": {"type": "object", "properties": {p: {"type": t} for p, t in params.items()}}}


LOGIN_A = _tool("agent_login", "Log in with the agent password.", password="string")
GET_RES = _tool("get_reservation_details", "Get a reservation by id.", reservation_id="string")
CANCEL_RES = _tool("cancel_reservation", "Cancel a reservation. This cannot be undone.", reservation_id="string")
GET_BAG = _tool("get_baggage_allowance", "Get the baggage allowance of a cabin class.", cabin="string")
LOGIN_B = _tool("clinic_sign_in", "Log in to the clinic system with a password.", password="string")
GET_APPT = _tool("lookup_appointment", "Look up an appointment by id.", appointment_id="string")
DEL_APPT = _tool("delete_appointment", "Delete an appointment. This cannot be undone.", appointment_id="string")
CALC = _tool("calculate_invoice_total", "Calculate the total of an invoice.", amount="number")
MAIL = _tool("send_email", "Send an email to a patient.", message="string")


def cancel_task(tid: str, env: str, ident: str, who: str = "Ann") -> dict:
    return {"id": tid, "env": env,
            "instruction": f"I am {who}. Log in, look up reservation {ident} and cancel it.",
            "tools": [LOGIN_A, GET_RES, CANCEL_RES],
            "verifier": {"checks": [f"reservation {ident} status is cancelled"],
                         "code": f"assert db['reservations']['{ident}']['status'] == 'cancelled'"}}


def hand_pool() -> list[dict]:
    return [
        cancel_task("A/cancel1", "airline", "ZX9QK1"),
        cancel_task("A/cancel2", "airline", "PL4MM2", who="Bo"),
        {"id": "A/bags", "env": "airline", "instruction": "What is the baggage allowance in business class?",
         "tools": [GET_BAG], "verifier": {"checks": ["agent says two bags"]}},
        # same execution structure as the airline cancellations, different domain words and ids
        {"id": "B/delete", "env": "clinic",
         "instruction": "I am Cy. Sign in, find appointment 77AB12 and delete it.",
         "tools": [LOGIN_B, GET_APPT, DEL_APPT],
         "verifier": {"checks": ["appointment 77AB12 status is deleted"],
                      "code": "assert db['appointments']['77AB12']['status'] == 'deleted'"}},
        # shares the airline task's identifier and words, but not its structure
        {"id": "B/invoice", "env": "clinic",
         "instruction": "Reservation ZX9QK1: calculate the invoice total for reservation ZX9QK1 and email it.",
         "tools": [CALC, MAIL], "verifier": {"checks": ["email mentions ZX9QK1 reservation total"]}},
    ]


def test_identifiers_do_not_make_cross_neighbours_shared_structure_does() -> None:
    pool = TaskPool(hand_pool())
    g = build_graph(pool, GraphConfig(k_within=1, k_cross=1))
    a = pool.index_of("A/cancel1")
    cross, _ = g.neighbors(a, "cross")
    assert [g.task_ids[j] for j in cross] == ["B/delete"]
    s = g.pair_similarity(a, np.array([pool.index_of("B/delete"), pool.index_of("B/invoice")]))
    assert s[0] > s[1] + 0.2
    # the concrete features do see the shared identifier; the abstract ones do not
    shared = [f for f, _ in g.shared_features(a, pool.index_of("B/invoice"), "within", top=50)]
    assert "task_text:zx9qk1" in shared and "verifier_checks:zx9qk1" in shared
    assert not any("zx9qk1" in f for f, _ in g.shared_features(a, pool.index_of("B/invoice"), "cross", top=50))
    # within the airline environment, the other cancellation is the neighbour, not the baggage question
    within, w = g.neighbors(a, "within")
    assert [g.task_ids[j] for j in within] == ["A/cancel2"] and w[0] == pytest.approx(1.0)


def test_abstract_representation_replaces_identifiers_by_categories() -> None:
    one = extract_abstraction(cancel_task("x", "airline", "ZX9QK1"))
    other = extract_abstraction(cancel_task("y", "airline", "QQ1234", who="Zed"))
    assert one == other  # a different id and person: the same abstract task
    text = json.dumps(one)
    for forbidden in ("ZX9QK1", "reservation", "cancel_reservation", "agent_login", "Ann"):
        assert forbidden not in text
    assert {"type": "destructive", "families": ["delete"]} in one["conflicts"]
    assert one["literals"] == {"identifier": 2}  # once in the instruction, once in the check
    fams = {(o["family"], o["required"]) for o in one["operations"]}
    assert ("delete", True) in fams and ("authenticate", True) in fams
    assert any(g["type"] == "authentication" and g["provenance"] == "tool_description" for g in one["gates"])
    assert {"from": "lookup", "to": "delete", "kind": "data"} in one["dependencies"]


def test_features_weights_and_missing_fields_reported() -> None:
    specs = [*hand_pool(), {"id": "C/bare", "env": "clinic"}, {"id": "C/text", "env": "clinic",
                                                             "instruction": "Delete the appointment."}]
    pool = TaskPool(specs)
    g = build_graph(pool, GraphConfig(k_within=2, k_cross=2))
    feats = g.report["features"]
    assert feats["missing"]["task_text"] == 1
    assert feats["missing"]["verifier_code"] == 4
    assert feats["missing"]["initial_context"] == 7
    assert feats["missing"]["operation_names"] == 2
    assert "C/bare" in feats["missing_examples"]["verifier_checks"]
    assert feats["tasks_without_concrete_features"] == 1
    assert "initial_context" in feats["views_unused"]
    bare = pool.index_of("C/bare")
    assert (g.within_index[bare] == -1).all() and (g.cross_index[bare] == -1).all()
    assert g.within_weight[bare].sum() == 0
    # nobody has the bare task as a neighbour either (similarity 0 is no edge)
    assert bare not in g.within_index and bare not in g.cross_index
    # S_full is the weighted sum of per-view cosines when every view is present
    c1, c2 = pool.index_of("A/cancel1"), pool.index_of("A/cancel2")
    cols = feats["full_view_columns"]
    total = 0.0
    for view, (lo, hi) in cols.items():
        x, y = g.full_features[c1, lo:hi].toarray().ravel(), g.full_features[c2, lo:hi].toarray().ravel()
        if np.linalg.norm(x) and np.linalg.norm(y):
            total += DEFAULT_VIEW_WEIGHTS[view] * float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))
    present = sum(DEFAULT_VIEW_WEIGHTS[v] for v in cols)
    assert g.pair_similarity(c1, np.array([c2]))[0] == pytest.approx(total / present, rel=1e-4)


def test_adaptive_weights_follow_local_bandwidths() -> None:
    idx = np.array([[1, 2, 3], [0, 2, -1], [0, -1, -1], [-1, -1, -1]])
    sim = np.array([[0.9, 0.5, 0.1], [0.9, 0.4, 0], [0.5, 0, 0], [0, 0, 0]], dtype=np.float32)
    w, sigma = adaptive_weights(idx, sim, rank=2, min_bandwidth=1e-3)
    assert sigma[0] == pytest.approx(0.5) and sigma[1] == pytest.approx(0.6) and sigma[2] == pytest.approx(0.5)
    assert sigma[3] == pytest.approx(1.0)  # no neighbours
    raw = np.exp(-np.array([0.1, 0.6]) ** 2 / (2 * 0.6**2))
    assert w[1, :2] == pytest.approx(raw / raw.sum(), rel=1e-5) and w[1, 2] == 0
    assert w[0].sum() == pytest.approx(1.0) and w[3].sum() == 0
    assert w[0, 0] > w[0, 1] > w[0, 2]
    # a node whose neighbours are all far spreads its weight; one with close neighbours is sharp
    far = adaptive_weights(np.array([[1, 2]]), np.array([[0.11, 0.10]], dtype=np.float32), 1, 1e-3)[0]
    near = adaptive_weights(np.array([[1, 2]]), np.array([[0.99, 0.90]], dtype=np.float32), 1, 1e-3)[0]
    assert far[0, 0] == pytest.approx(0.5, abs=0.02) and near[0, 0] > 0.99


def test_merge_topk_deduplicates_and_keeps_best() -> None:
    a_i, a_s = np.array([[5, 3, -1]]), np.array([[0.9, 0.2, 0]], dtype=np.float32)
    b_i, b_s = np.array([[3, 7, 5]]), np.array([[0.2, 0.5, 0.9]], dtype=np.float32)
    i, s = merge_topk(a_i, a_s, b_i, b_s, 3)
    assert i.tolist() == [[5, 7, 3]] and s[0].tolist() == pytest.approx([0.9, 0.5, 0.2])


def _random_pool(n_envs: int, per_env: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    verbs = ["get", "cancel", "update", "create", "send", "calculate", "login", "list", "transfer", "book"]
    nouns = ["order", "flight", "patient", "claim", "card", "room", "book", "device", "loan", "ticket", "pet"]
    specs = []
    for e in range(n_envs):
        tools = [_tool(f"{rng.choice(verbs)}_{rng.choice(nouns)}_{e}", f"{rng.choice(verbs)} a {rng.choice(nouns)}",
                       **{f"{rng.choice(nouns)}_id": "string"}) for _ in range(rng.randint(2, 5))]
        for t in range(per_env):
            used = rng.sample(tools, rng.randint(1, len(tools)))
            words = " then ".join(u["name"].replace("_", " ") for u in used)
            specs.append({"id": f"e{e}/t{t}", "env": f"env{e}", "tools": tools,
                          "instruction": f"Please {words} for {rng.randint(100, 999)} before {rng.randint(1, 28)}",
                          "verifier": {"checks": [f"{u['name'].split('_')[1]} is {rng.choice(['done', 'open'])}"
                                                  for u in used]}})
    return specs


def test_approximate_search_matches_exact_search() -> None:
    pool = TaskPool(_random_pool(n_envs=60, per_env=25, seed=1))
    exact = build_graph(pool, GraphConfig())
    approx = build_graph(pool, GraphConfig(exact_max_nodes=300, recall_sample=200))
    assert exact.report["cross"]["method"] == "exact"
    assert approx.report["cross"]["method"] == "approximate"
    recall = approx.report["cross"]["recall_at_k"]
    assert recall["sampled"] > 100 and recall["tie_aware"] >= 0.9
    # never a same-environment cross neighbour, and similarities are the exact ones
    for g in (exact, approx):
        ci = g.cross_index
        valid = ci >= 0
        assert not (g.env_codes[np.maximum(ci, 0)] == g.env_codes[:, None])[valid].any()
        rows = np.nonzero(valid)[0][:200]
        cols = ci[valid][:200]
        direct = np.asarray(g.abstract_features[rows].multiply(g.abstract_features[cols]).sum(axis=1)).ravel()
        assert g.cross_similarity[valid][:200] == pytest.approx(direct, abs=1e-5)
    # the within relation is exact per environment in both
    assert (exact.within_index == approx.within_index).all()


@pytest.mark.slow
def test_large_environment_uses_approximate_within_search() -> None:
    pool = TaskPool(_random_pool(n_envs=2, per_env=150, seed=2))
    exact = build_graph(pool, GraphConfig())
    approx = build_graph(pool, GraphConfig(exact_max_nodes=100))
    assert approx.report["within"]["approximate_envs"] == 2
    found = [len(np.intersect1d(a[a >= 0], b[b >= 0])) / max(1, (b >= 0).sum())
             for a, b in zip(approx.within_index, exact.within_index, strict=True)]
    assert np.mean(found) >= 0.8
    same_env = approx.env_codes[np.maximum(approx.within_index, 0)] == approx.env_codes[:, None]
    assert same_env[approx.within_index >= 0].all()


def test_incremental_growth_equals_rebuild_in_the_same_feature_space() -> None:
    specs = _random_pool(n_envs=8, per_env=10, seed=3)
    old = TaskPool(specs[:50])
    grown = TaskPool(specs)  # adds tasks to existing environments and three new environments
    g_old = build_graph(old)
    g_ext = extend_graph(g_old, grown)
    same_space = build_graph(grown, feature_space=g_old.feature_space)
    # equal up to the order of exactly tied neighbours (float32 sums in another order can swap them)
    for rel in ("within", "cross"):
        a_i, b_i = getattr(g_ext, f"{rel}_index"), getattr(same_space, f"{rel}_index")
        a_s, b_s = getattr(g_ext, f"{rel}_similarity"), getattr(same_space, f"{rel}_similarity")
        assert np.allclose(a_s, b_s, atol=1e-5), rel
        untied = np.ones_like(a_s, dtype=bool)
        untied[:, 1:] &= ~np.isclose(a_s[:, 1:], a_s[:, :-1], atol=1e-5)
        untied[:, :-1] &= ~np.isclose(a_s[:, :-1], a_s[:, 1:], atol=1e-5)
        assert (a_i[untied] == b_i[untied]).all(), rel
        assert np.allclose(getattr(g_ext, f"{rel}_weight"), getattr(same_space, f"{rel}_weight"), atol=1e-4)
    assert g_ext.report["extended"][0]["added_tasks"] == 30
    # a fresh rebuild refits IDF on the grown pool: close, not identical
    fresh = build_graph(grown)
    overlap = np.mean([len(np.intersect1d(a[a >= 0], b[b >= 0])) / max(1, (b >= 0).sum())
                       for a, b in zip(g_ext.cross_index, fresh.cross_index, strict=True)])
    assert overlap >= 0.7
    # the pool must start with the graph's tasks
    with pytest.raises(ValueError, match="starts with the graph's tasks"):
        extend_graph(g_old, TaskPool(specs[1:]))
    changed = [dict(s) for s in specs]
    changed[0]["instruction"] = "something else"
    with pytest.raises(ValueError, match="fingerprint"):
        extend_graph(g_old, TaskPool(changed))


def test_extend_with_approximate_search() -> None:
    specs = _random_pool(n_envs=40, per_env=20, seed=4)
    cfg = GraphConfig(exact_max_nodes=150, recall_sample=0)
    g_old = build_graph(TaskPool(specs[:600]), cfg)
    g_ext = extend_graph(g_old, TaskPool(specs))
    exact = build_graph(TaskPool(specs), feature_space=g_old.feature_space)
    found = np.mean([len(np.intersect1d(a[a >= 0], b[b >= 0])) / max(1, (b >= 0).sum())
                     for a, b in zip(g_ext.cross_index, exact.cross_index, strict=True)])
    assert found >= 0.85


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="k_cross"):
        GraphConfig(k_cross=0)
    with pytest.raises(ValueError, match="unknown view"):
        GraphConfig(view_weights={"task_text": 1.0, "nonsense": 1.0})
    with pytest.raises(ValueError, match="llm_endpoint"):
        GraphConfig(abstraction="llm")
    cfg = GraphConfig(k_within=3)
    assert GraphConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.bandwidth_rank_for(12) == 6 and cfg.bandwidth_rank_for(3) == 2


def test_view_weights_are_configuration() -> None:
    specs = hand_pool()
    toks = [abstract_tokens(extract_abstraction(s)) for s in specs]
    only_text = build_features(specs, toks, GraphConfig(view_weights={"task_text": 1.0}))
    assert set(only_text.report["full_view_columns"]) == {"task_text"}
    default = build_features(specs, toks, GraphConfig())
    assert default.full.shape[1] > only_text.full.shape[1]


def _tau2_specs() -> list[dict]:
    specs = []
    for domain in ("airline", "retail"):
        for t in json.loads((DATA / "tau2-bench" / domain / "tasks.json").read_text())[:40]:
            ins = t["user_scenario"]["instructions"]
            crit = t.get("evaluation_criteria") or {}
            names = sorted({a["name"] for a in crit.get("actions") or []})
            specs.append({"id": f"tau2-{domain}/{t['id']}", "env": f"tau2-{domain}",
                          "instruction": " ".join(str(ins.get(k) or "") for k in
                                                  ("reason_for_call", "known_info", "task_instructions")),
                          "tools": [{"name": n} for n in names],
                          "verifier": {"checks": [*(crit.get("nl_assertions") or []),
                                                  *(f"action {a['name']} {json.dumps(a['arguments'])}"
                                                    for a in crit.get("actions") or [])]}})
    for line in (DATA / "acebench" / "data_agent_multi_turn.json").read_text().splitlines()[:20]:
        t = json.loads(line)
        specs.append({"id": t["id"], "env": "acebench-" + "+".join(sorted(t.get("involved_classes") or [])),
                      "instruction": t["question"], "tools": t["function"], "initial_state": t["initial_config"]})
    return specs


@pytest.mark.skipif(not DATA.exists(), reason="shared task data not available")
def test_real_tasks_abstract_features_hold_no_identifiers() -> None:
    specs = _tau2_specs()
    pool = TaskPool(specs)
    g = build_graph(pool)
    assert g.report["features"]["missing"]["verifier_code"] == len(specs)
    tool_names = {t["name"].lower() for s in specs for t in s.get("tools") or []}
    abstract_names = g.feature_space.column_names("abstract")
    assert abstract_names
    for name in abstract_names:
        term = name.split(":", 1)[1]
        assert not re.search(r"\d{3,}", term), name
        assert not any(tn in term for tn in tool_names if len(tn) > 4), name
    # tasks with operations find cross neighbours, and none in their own environment
    has_ops = np.array([bool(s.get("tools")) for s in pool])
    assert ((g.cross_index >= 0).sum(axis=1)[has_ops] > 0).all()
    assert g.report["isolated"]["within"] == 0
