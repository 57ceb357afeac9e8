"""The identifier filter's interface: the scheduler takes any filter with ``check(task, trajectory)``, names no
environment's filter, and shares the trajectory and verdict types with the environments that produce them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import envsched.method
from envsched.envs import base
from envsched.envs.bfcl_identifier_filter import BfclIdentifierFilter
from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import graph_from_arrays
from envsched.method.sampler import EnvSchedSampler
from envsched.method.scheduling import identifier_filter as interface


class _SecondLetter:
    """A filter of a made-up environment: flags a trajectory whose first action's second letter is 'x'."""

    def check(self, task, trajectory):
        first = trajectory.calls_per_turn[0][0]
        return interface.IdentifierVerdict(first[1:2] == "x", trajectory.reward, [], f"{task['id']}: {first}")


def test_the_shared_types_are_the_environments_own():
    assert interface.Trajectory is base.Trajectory
    assert interface.IdentifierVerdict is base.IdentifierVerdict
    assert interface.SuspiciousAction is base.SuspiciousAction


def test_bfcl_and_any_other_filter_implement_the_interface():
    assert isinstance(BfclIdentifierFilter(), interface.IdentifierFilter)
    assert isinstance(_SecondLetter(), interface.IdentifierFilter)
    assert not isinstance(object(), interface.IdentifierFilter)


def test_the_scheduler_takes_a_filter_of_another_environment_through_the_interface():
    tasks = [{"id": f"t{i}", "env": "e0" if i < 2 else "e1"} for i in range(4)]
    g = graph_from_arrays([t["id"] for t in tasks], [t["env"] for t in tasks], [[1], [0], [3], [2]],
                          [[2], [3], [0], [1]])
    s = EnvSchedSampler(tasks, g, SchedulerConfig.paper(mode="exploitation_only", batch_size=2),
                        identifier_filter=_SecondLetter(), require_dispatch=False)
    for t in tasks:
        s.update(t["id"], [0.0, 1.0])
    assert not s.submit_trajectory("t0", base.Trajectory([["ab()"]], 1.0)).flagged
    verdict = s.submit_trajectory("t1", base.Trajectory([["ax()"]], 1.0))
    assert verdict.flagged and s.identifier_flags() == {"t1": "t1: ax()"}
    assert all("t1" not in [t["id"] for t in s.sample(2)] for _ in range(4))  # out of exploitation


def test_an_object_without_check_is_refused_naming_the_interface():
    tasks = [{"id": "t0", "env": "e"}, {"id": "t1", "env": "e"}]
    g = graph_from_arrays(["t0", "t1"], ["e", "e"], [[1], [0]], [[], []])
    with pytest.raises(TypeError, match=r"implement IdentifierFilter .* got object"):
        EnvSchedSampler(tasks, g, identifier_filter=object())
    with pytest.raises(TypeError, match="implement IdentifierFilter"):
        EnvSchedSampler(tasks, g, identifier_filter=type("F", (), {"check": 3})())


def test_the_scheduler_names_no_environment_filter():
    """method/ reaches an environment's filter only through the interface: no module of it imports BFCL."""
    root = Path(envsched.method.__file__).parent
    named = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            named += [f"{path.relative_to(root)}:{node.lineno} {m}" for m in modules
                      if m.startswith("envsched.envs.bfcl")]
    assert named == []
