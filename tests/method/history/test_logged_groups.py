"""History's narrow query API: the signal rates and the one-task draws read ``History.logged_groups()`` (and the
decayed sums), never the observation log's columns; its rows say what each logged group was, by the one
signal-group rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import envsched
from envsched.method.config import SchedulerConfig
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.history.statistics import PHASES
from envsched.method.sampler import EnvSchedSampler
from envsched.samplers.base import GroupResult


def test_logged_groups_describe_each_group_by_the_one_signal_rule():
    g = synthetic_graph(12, 3, seed=0)
    tasks = synthetic_tasks(g)
    s = EnvSchedSampler(tasks, g, SchedulerConfig(), seed=0, reward_range=(0.0, 2.0))
    drawn = s.sample(4)
    groups = [[0.0, 2e-7, 0.0, 0.0], [2.0, 2.0, None, 0.0], [None, 2.0, None, None], [1.0, 1.0, 1.0, 1.0]]
    for task, rewards in zip(drawn, groups, strict=True):
        s.update(task, rewards)
    lg = s._history.logged_groups()
    assert lg.task.tolist() == [s.position_of(t) for t in drawn]
    assert lg.scored.tolist() == [4, 3, 1, 4]
    assert lg.scorable.tolist() == [True, True, False, True]
    # the same verdicts as every sampler's metrics(): on the [0, 1] scale 1e-7 apart is no signal
    want = [GroupResult(0, r, None, (0.0, 2.0)).has_signal for r in groups]
    assert lg.signal.tolist() == want == [False, True, False, False]
    # reward sums of the scored rollouts on [0, 1]: 1e-7, 1 + 1 + 0, 1, 4 x 0.5
    assert lg.successes == pytest.approx([1e-7, 2.0, 1.0, 2.0])
    assert set(lg.phase.tolist()) <= set(range(len(PHASES))) and lg.step.tolist() == [0, 0, 0, 0]
    for name in ("task", "phase", "step", "scored", "successes", "scorable", "signal"):
        with pytest.raises(ValueError):  # read-only: a reader cannot change the log or what the next reader sees
            getattr(lg, name)[0] = 1
    assert s._history.logged_groups() is lg  # cached until the history changes
    s.update(s.sample(1)[0], [0.0, 2.0])
    assert s._history.logged_groups().task.size == 5


def test_no_module_outside_the_history_reads_the_observation_log():
    """Only statistics.py touches ``History.obs`` / ``History.dispatch`` (the logs and their columns)."""
    src = Path(envsched.__file__).parent
    readers = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "statistics.py" and path.parent.name == "history":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("obs", "dispatch") and not (
                    isinstance(node.value, ast.Name) and node.value.id == "self"):
                readers.append(f"{path.relative_to(src)}:{node.lineno}")
    assert readers == [], readers
