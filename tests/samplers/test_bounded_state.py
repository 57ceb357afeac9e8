"""Nothing a baseline sampler keeps grows with training length: after 10x more steps its state has the same
number of entries, the pickled sampler (everything it holds in memory) the same size, and the state still
round-trips (a restored sampler continues with the same draws)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from envsched.samplers.baselines import DynamicSamplingSampler
from envsched.samplers.registry import make_sampler

N_TASKS, BATCH, G = 40, 8, 4
POOL = [{"id": f"t{i}", "env": f"e{i % 3}", "difficulty": str(i % 4)} for i in range(N_TASKS)]
P_SUCCESS = np.linspace(0.05, 0.95, N_TASKS)


def _build(name):
    if name == "dynamic-sampling":
        return DynamicSamplingSampler(POOL, seed=1)
    return make_sampler(name, POOL, seed=1, group_size=G)


def _train(sampler, steps, rng):
    for _ in range(steps):
        for task in sampler.sample(BATCH):
            i = sampler.position_of(task)
            rewards = (rng.random(G) < P_SUCCESS[i]).astype(float).tolist()
            if rng.random() < 0.1:
                rewards[0] = None  # unscored rollouts too
            sampler.update(task, rewards, [10.0] * G)


def _leaves(x):
    if isinstance(x, dict):
        return sum(_leaves(v) for v in x.values()) + len(x)
    if isinstance(x, list | tuple):
        return sum(_leaves(v) for v in x) + 1
    return 1


@pytest.mark.parametrize("name", ["uniform", "curriculum", "mopps", "greso", "plr", "dps", "sec", "dynamic-sampling"])
def test_state_and_memory_are_flat_in_training_length(name):
    rng = np.random.default_rng(0)
    sampler = _build(name)
    _train(sampler, 30, rng)
    short_leaves = _leaves(json.loads(json.dumps(sampler.state_dict())))
    short_bytes = len(pickle.dumps(sampler))
    _train(sampler, 300, rng)
    state = json.loads(json.dumps(sampler.state_dict()))
    assert sampler.groups == 330 * BATCH
    assert _leaves(state) == short_leaves
    assert len(pickle.dumps(sampler)) <= short_bytes * 1.01 + 64
    fresh = _build(name)
    fresh.load_state_dict(state)
    assert fresh.sample(BATCH) == sampler.sample(BATCH)
