"""The graph package: its names load on first use, so that reading a graph does not import scikit-learn."""

from __future__ import annotations

import subprocess
import sys

import pytest

import envsched.method.graph as graph_package


def test_every_name_is_the_object_of_its_module():
    from envsched.method.graph import build, dual_graph, io

    homes = {"build_graph": build, "extend_graph": build, "DualRelationGraph": dual_graph,
             "GraphFileError": io, "load_graph": io, "save_graph": io}
    assert sorted(homes) == sorted(graph_package.__all__)
    for name, module in homes.items():
        assert getattr(graph_package, name) is getattr(module, name)
        assert name in dir(graph_package)
    with pytest.raises(AttributeError, match="has no attribute 'build_grahp'"):
        graph_package.build_grahp  # noqa: B018


def test_reading_and_sampling_over_a_saved_graph_import_no_scikit_learn(tmp_path):
    from envsched.method.graph import build_graph, save_graph
    from envsched.pool import TaskPool

    tasks = [{"id": f"{e}-{i}", "env": e, "instruction": f"{verb} the {obj} record {i}",
              "tools": [{"name": f"{verb}_{obj}", "description": f"{verb} a {obj}"}]}
             for e, verb, obj in (("shop", "refund", "order"), ("clinic", "book", "slot")) for i in range(4)]
    path = tmp_path / "graph.npz"
    save_graph(build_graph(TaskPool(tasks)), path)
    code = (
        "import sys\n"
        "from envsched.method.graph import load_graph\n"
        "from envsched.method.sampler import EnvSchedSampler\n"
        "import envsched.cli.explain\n"
        f"g = load_graph({str(path)!r})\n"
        "tasks = [{'id': t, 'env': g.envs[c]} for t, c in zip(g.task_ids, g.env_codes)]\n"
        "s = EnvSchedSampler(tasks, g, seed=0)\n"
        "print(len(s.sample(4)), [m for m in ('sklearn', 'pandas') if m in sys.modules])\n"
        "from envsched.method.graph import build_graph\n"
        "from envsched.pool import TaskPool\n"
        "build_graph(TaskPool([{'id': 'a', 'env': 'x', 'instruction': 'refund the order'},\n"
        "                      {'id': 'b', 'env': 'y', 'instruction': 'book the slot'}]))\n"
        "print('sklearn' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["4 []", "True"]
