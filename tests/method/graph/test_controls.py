"""Negative-control graphs: the shape of the real graph, none of its information."""

from __future__ import annotations

import numpy as np
import pytest

from envsched.method.graph.build import build_graph
from envsched.method.graph.controls import noise_feature_graph, shuffled_graph
from envsched.method.sampler import EnvSchedSampler
from envsched_lab.pools import reasoning_gym_pool


@pytest.fixture(scope="module")
def pool_and_graph():
    pool = reasoning_gym_pool(num_envs=6, per_env=20, seed=0)
    return pool, build_graph(pool)


def _degrees(index: np.ndarray) -> np.ndarray:
    return (index >= 0).sum(axis=1)


def test_shuffled_graph_keeps_degrees_and_relations_and_changes_neighbours(pool_and_graph) -> None:
    _, graph = pool_and_graph
    sh = shuffled_graph(graph, seed=1)
    codes = graph.env_codes
    sizes = np.bincount(codes)
    # degrees kept (bounded by what the environment can offer)
    assert np.array_equal(_degrees(sh.within_index), np.minimum(_degrees(graph.within_index), sizes[codes] - 1))
    assert np.array_equal(_degrees(sh.cross_index), _degrees(graph.cross_index))
    for i in range(graph.num_nodes):
        w = sh.within_index[i][sh.within_index[i] >= 0]
        c = sh.cross_index[i][sh.cross_index[i] >= 0]
        assert (codes[w] == codes[i]).all() and i not in w and len(set(w)) == len(w)
        assert (codes[c] != codes[i]).all() and len(set(c)) == len(c)
    # the neighbour sets are mostly new
    same = np.mean([set(sh.cross_index[i]) == set(graph.cross_index[i]) for i in range(graph.num_nodes)])
    assert same < 0.1
    # weights of a row with neighbours sum to 1; seeded
    rows = _degrees(sh.cross_index) > 0
    assert np.allclose(sh.cross_weight[rows].sum(axis=1), 1.0)
    assert np.array_equal(shuffled_graph(graph, seed=1).cross_index, sh.cross_index)
    assert not np.array_equal(shuffled_graph(graph, seed=2).cross_index, sh.cross_index)


def test_noise_feature_graph_has_the_feature_shape_and_other_neighbours(pool_and_graph) -> None:
    pool, graph = pool_and_graph
    noise = noise_feature_graph(graph, pool, seed=3)
    for real, fake in ((graph.full_features, noise.full_features), (graph.abstract_features, noise.abstract_features)):
        assert fake.shape == real.shape
        assert np.array_equal(np.diff(fake.indptr), np.diff(real.tocsr().indptr))
        assert np.allclose(np.sqrt(fake.multiply(fake).sum(axis=1)).A1[np.diff(fake.indptr) > 0], 1.0)
    same = np.mean([set(noise.within_index[i]) == set(graph.within_index[i]) for i in range(graph.num_nodes)])
    assert same < 0.5
    codes = graph.env_codes
    for i in range(graph.num_nodes):
        w = noise.within_index[i][noise.within_index[i] >= 0]
        assert (codes[w] == codes[i]).all()


def test_noise_feature_graph_refuses_another_pool(pool_and_graph) -> None:
    _, graph = pool_and_graph
    other = reasoning_gym_pool(num_envs=6, per_env=20, seed=1)
    with pytest.raises(ValueError, match="not the one the graph was built from"):
        noise_feature_graph(graph, other, seed=0)


@pytest.mark.parametrize("control", ["shuffled", "noise"])
def test_envsched_runs_on_a_control_graph(pool_and_graph, control: str) -> None:
    pool, graph = pool_and_graph
    g = shuffled_graph(graph, 0) if control == "shuffled" else noise_feature_graph(graph, pool, 0)
    sampler = EnvSchedSampler(pool, graph=g, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(4):
        batch = sampler.sample(16)
        for task in batch:
            sampler.update(task, [float(x) for x in rng.integers(0, 2, size=8)])
    assert sampler.metrics()
