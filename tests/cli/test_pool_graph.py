"""`envsched pool graph FILE`: builds, saves, summarises, explains one task's neighbours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.method.graph.io import load_graph
from envsched.pool import TaskPool


def _write_pool(path: Path) -> TaskPool:
    tools_a = [{"name": "get_booking", "description": "Get a booking by id."},
               {"name": "cancel_booking", "description": "Cancel a booking. Cannot be undone."}]
    tools_b = [{"name": "find_patient", "description": "Find a patient by id."},
               {"name": "remove_visit", "description": "Delete a visit. Cannot be undone."}]
    specs = []
    for i in range(4):
        specs.append({"id": f"a{i}", "env": "hotel", "tools": tools_a,
                      "instruction": f"Get booking B{i}00{i} and cancel booking B{i}00{i}.",
                      "verifier": {"checks": [f"booking B{i}00{i} is cancelled"]}})
        specs.append({"id": f"[visit]b{i}", "env": "clinic", "tools": tools_b,
                      "instruction": f"Find patient P{i}1{i} and remove visit V{i}2.",
                      "verifier": {"checks": [f"visit V{i}2 is deleted"]}})
    path.write_text("\n".join(json.dumps(s) for s in specs))
    return TaskPool(specs)


def test_graph_command_builds_saves_and_explains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))
    pool = _write_pool(tmp_path / "p.jsonl")
    runner = CliRunner()
    res = runner.invoke(cli, ["pool", "graph", str(tmp_path / "p.jsonl"), "--json", "--task", "a0",
                              "--k-within", "2", "--k-cross", "3"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["nodes"] == 8 and out["environments"] == 2
    assert out["relations"]["within"]["k"] == 2 and out["relations"]["cross"]["degree"]["mean"] == 3
    assert {e["env"]: e["tasks"] for e in out["per_environment"]} == {"clinic": 4, "hotel": 4}
    tn = out["task_neighbours"]
    assert {n["env"] for n in tn["within"]} == {"hotel"} and {n["env"] for n in tn["cross"]} == {"clinic"}
    assert abs(sum(n["weight"] for n in tn["cross"]) - 1) < 1e-3
    shared = [f["feature"] for f in tn["cross"][0]["shared_features"]]
    assert any(f.startswith("operations:op:delete") for f in shared)
    saved = Path(out["saved_to"])  # in the cache by default, never next to the pool file
    assert saved.parent == tmp_path / "cache" / "graphs" and saved.name.startswith("p-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "p.jsonl"]
    assert load_graph(saved, pool).num_nodes == 8
    # human output and --reuse
    res = runner.invoke(cli, ["pool", "graph", str(tmp_path / "p.jsonl"), "--reuse", "--k-within", "2",
                              "--k-cross", "3", "--task", "[visit]b1"])
    assert res.exit_code == 0, res.output
    assert "reusing" in res.output and "cross neighbours of [visit]b1" in res.output
    assert "[visit]b0" in res.output  # task ids with brackets are printed verbatim, not read as markup
    # errors are clean
    res = runner.invoke(cli, ["pool", "graph", str(tmp_path / "p.jsonl"), "--no-save", "--task", "zzz"])
    assert res.exit_code == 1 and "unknown task id 'zzz'" in res.output
    res = runner.invoke(cli, ["pool", "graph", str(tmp_path / "p.jsonl"), "--llm-endpoint", "http://127.0.0.1:1"])
    assert res.exit_code == 2 and "--model" in res.output
    res = runner.invoke(cli, ["pool", "graph", str(tmp_path / "p.jsonl"), "--k-cross", "0"])
    assert res.exit_code == 2 and "--k-cross" in res.output and "1<=x<=1024" in res.output
