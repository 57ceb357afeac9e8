"""Saving and loading the graph: round trip, versioning, wrong pool."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from envsched.method.graph.build import build_graph, extend_graph
from envsched.method.graph.io import FORMAT_VERSION, GraphFileError, load_graph, read_graph_header, save_graph
from envsched.pool import TaskPool


def _specs(n_envs: int = 4, per_env: int = 6) -> list[dict]:
    verbs = ["get", "cancel", "update", "send", "calculate"]
    specs = []
    for e in range(n_envs):
        tools = [{"name": f"{v}_thing_{e}", "description": f"{v} a thing",
                  "parameters": {"type": "object", "properties": {"thing_id": {"type": "string"}}}}
                 for v in verbs[e % 3: e % 3 + 3]]
        for t in range(per_env):
            specs.append({"id": f"e{e}/t{t}", "env": f"env{e}", "tools": tools,
                          "instruction": f"{verbs[(e + t) % 5]} thing {t} then {verbs[t % 5]} it",
                          "initial_state": {"logged_in": bool(t % 2)},
                          "verifier": {"checks": [f"thing {t} is {verbs[t % 5]}d"], "code": f"assert x == {t}"}})
    return specs


def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    pool = TaskPool(_specs())
    g = build_graph(pool)
    path = save_graph(g, tmp_path / "pool.graph.npz")
    back = load_graph(path, pool)
    for name in ("env_codes", "within_index", "within_weight", "within_similarity", "cross_index", "cross_weight",
                 "cross_similarity", "within_bandwidth", "cross_bandwidth"):
        assert np.array_equal(getattr(back, name), getattr(g, name)), name
    assert (back.full_features != g.full_features).nnz == 0
    assert (back.abstract_features != g.abstract_features).nnz == 0
    assert back.task_ids == g.task_ids and back.envs == g.envs
    assert back.config == g.config and back.pool_fingerprint == pool.fingerprint()
    assert back.report["features"]["missing"] == g.report["features"]["missing"]
    assert back.feature_space.column_names("full") == g.feature_space.column_names("full")
    assert back.shared_features(0, int(back.within_index[0][0]), "within") == \
        g.shared_features(0, int(g.within_index[0][0]), "within")
    # a loaded graph can still grow
    bigger = TaskPool(_specs(n_envs=5))
    assert extend_graph(back, bigger).num_nodes == len(bigger)
    assert read_graph_header(path)["version"] == FORMAT_VERSION


def test_loading_for_another_pool_or_version_fails_clearly(tmp_path: Path) -> None:
    pool = TaskPool(_specs())
    path = save_graph(build_graph(pool), tmp_path / "g.npz")
    other = TaskPool(_specs(n_envs=3))
    with pytest.raises(GraphFileError, match=r"built from another pool .*24 tasks.*18 tasks.*envsched pool graph"):
        load_graph(path, other)
    with pytest.raises(GraphFileError, match="another pool"):
        load_graph(path, expected_fingerprint="0" * 64)
    # another format version
    data = dict(np.load(path, allow_pickle=False))
    header = json.loads(bytes(data["__header__"]).decode())
    header["version"] = FORMAT_VERSION + 1
    data["__header__"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    newer = tmp_path / "newer.npz"
    np.savez(newer, **data)
    with pytest.raises(GraphFileError, match=rf"version {FORMAT_VERSION + 1}.*reads version {FORMAT_VERSION}"):
        load_graph(newer, pool)
    # not a graph file at all
    junk = tmp_path / "junk.npz"
    junk.write_text("hello")
    with pytest.raises(GraphFileError, match="not an envsched graph file"):
        load_graph(junk)
    plain = tmp_path / "plain.npz"
    np.savez(plain, a=np.zeros(3))
    with pytest.raises(GraphFileError, match="no header"):
        load_graph(plain)
    with pytest.raises(FileNotFoundError):
        load_graph(tmp_path / "missing.npz")
