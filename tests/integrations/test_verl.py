"""EnvSchedVerlSampler inside torchdata's StatefulDataLoader (the loader verl builds), fed back from batches
shaped like verl's ``DataProto`` after a step.

verl itself is not installed (its ``DataProto`` needs ray and tensordict): the batches here are a stand-in
with DataProto's two attributes, built the way ``RayPPOTrainer.fit`` builds them (one ``uid`` per prompt,
``repeat(n, interleave=True)``, ``token_level_scores`` of shape (rows, response length), ``response_mask``).
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

from envsched.envs.reasoning_gym import build_reasoning_gym_pool  # noqa: E402
from envsched.integrations.verl import EnvSchedVerlSampler, groups_from_batch  # noqa: E402
from envsched.samplers.simple import CurriculumSampler, UniformSampler  # noqa: E402

N = 4  # rollout.n
RESP = 5


class RowDataset(torch.utils.data.Dataset):
    """Rows as verl's RLHFDataset returns them (data_source, prompt, extra_info with the task key)."""

    def __init__(self, pool):
        self.rows = [{"data_source": t["env"], "prompt": t["instruction"],
                      "extra_info": {"task_id": t["id"], "index": i}} for i, t in enumerate(pool)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


@pytest.fixture(scope="module")
def pool():
    return build_reasoning_gym_pool(["chain_sum", "basic_arithmetic", "leg_counting"], tasks_per_dataset=4,
                                    num_tiers=2, seed=0)


def _obj(values):
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values)
    return arr


def _step_batch(rows, rewards_of, nan_rows=()):
    """A finished step's batch: uid per prompt, repeated N times interleaved, scores on the last token."""
    uids = [str(uuid.uuid4()) for _ in rows]
    rep = [r for r in rows for _ in range(N)]
    scores = torch.zeros(len(rep), RESP)
    mask = torch.zeros(len(rep), RESP)
    for i, r in enumerate(rep):
        length = 1 + (i % RESP)
        mask[i, :length] = 1
        scores[i, length - 1] = rewards_of(r["extra_info"]["task_id"], i % N)
        if i in nan_rows:
            scores[i, length - 1] = float("nan")
    return SimpleNamespace(batch={"token_level_scores": scores, "response_mask": mask},
                           non_tensor_batch={"uid": _obj([u for u in uids for _ in range(N)]),
                                             "extra_info": _obj([r["extra_info"] for r in rep]),
                                             "data_source": _obj([r["data_source"] for r in rep])})


def _loader(sampler, ds, batch_size=4):
    return StatefulDataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=0, drop_last=True,
                              collate_fn=lambda rows: rows)


def test_one_epoch_draws_each_task_once_and_feedback_reaches_the_sampler(pool):
    ds = RowDataset(pool)
    inner = UniformSampler(pool, seed=2)
    s = EnvSchedVerlSampler(ds, task_sampler=inner, batch_size=4)
    seen = []
    for rows in _loader(s, ds):
        seen.extend(r["extra_info"]["task_id"] for r in rows)
        s.update(_step_batch(rows, lambda tid, j: float(j % 2), nan_rows={3}))
    assert sorted(seen) == sorted(t["id"] for t in pool)  # uniform, one epoch, no repeats
    assert inner.groups == 12 and inner.episodes == 48 and inner.outstanding_groups == 0
    assert inner.signal_groups == 12 and inner.unscored_episodes == 3  # row 3 of each batch was NaN
    assert inner.cost == sum(1 + (i % RESP) for i in range(16)) * 3


def test_groups_from_batch_reads_uid_groups_rewards_and_costs(pool):
    rows = RowDataset(pool).rows[:2]
    b = _step_batch(rows, lambda tid, j: 0.25 * j, nan_rows={5})
    groups = groups_from_batch(b)
    assert [g[0] for g in groups] == [r["extra_info"]["task_id"] for r in rows]
    assert groups[0][1] == [0.0, 0.25, 0.5, 0.75] and groups[1][1] == [0.0, None, 0.5, 0.75]
    assert groups[0][2] == [1.0, 2.0, 3.0, 4.0]
    b.non_tensor_batch["uid"][1] = b.non_tensor_batch["uid"][N]  # a uid spanning two tasks
    with pytest.raises(ValueError, match="several tasks"):
        groups_from_batch(b)
    del b.non_tensor_batch["extra_info"]
    with pytest.raises(ValueError, match="names no task"):
        groups_from_batch(b)


def test_built_from_verl_data_config(pool):
    ds = RowDataset(pool)
    cfg = {"train_batch_size": 3, "dataloader_num_workers": 0,
           "sampler": {"envsched": {"sampler": "curriculum", "group_size": N, "seed": 1,
                                    "options": {"key": "id"}}}}
    s = EnvSchedVerlSampler(data_source=ds, data_config=cfg)
    assert isinstance(s.task_sampler, CurriculumSampler) and s.batch_size == 3
    rows = next(iter(_loader(s, ds, batch_size=3)))
    assert len(rows) == 3 and s.task_sampler.outstanding_groups == 3
    s.update(_step_batch(rows, lambda tid, j: 1.0))
    assert s.task_sampler.groups == 3 and s.metrics()["envsched/groups"] == 3.0
    with pytest.raises(ValueError, match="no dataset row"):
        EnvSchedVerlSampler(ds, task_sampler=UniformSampler([{"id": "nope", "env": "x"}]))


def test_stateful_dataloader_resume_continues_the_same_draws(pool):
    ds = RowDataset(pool)

    def build():
        inner = CurriculumSampler(pool, group_size=N, key="group", seed=5)
        return EnvSchedVerlSampler(ds, task_sampler=inner, batch_size=4)

    def reward(tid, j):
        return 1.0 if ("chain_sum" in tid and j < 3) else 0.0

    s1 = build()
    loader1 = _loader(s1, ds)
    it = iter(loader1)
    for _ in range(2):
        s1.update(_step_batch(next(it), reward))
    # verl saves the checkpoint after the third batch was generated but before its update(batch)
    third = next(it)
    ckpt = loader1.state_dict()
    s1.update(_step_batch(third, reward))
    after1 = []
    for rows in it:  # rest of epoch 0, then epoch 1
        after1.append([r["extra_info"]["task_id"] for r in rows])
        s1.update(_step_batch(rows, reward))
    for rows in loader1:
        after1.append([r["extra_info"]["task_id"] for r in rows])
        s1.update(_step_batch(rows, reward))

    s2 = build()
    loader2 = _loader(s2, ds)
    loader2.load_state_dict(ckpt)
    it2 = iter(loader2)  # torchdata applies the state when the iterator is made
    assert s2.task_sampler.outstanding_groups == 0  # the unreported third batch was released
    assert s2.task_sampler.groups == 8 and s2.task_sampler.metrics()["discarded_groups"] == 4
    # replay the third batch's feedback the uninterrupted run had, to compare draws exactly
    s2.task_sampler.require_dispatch = False
    s2.update(_step_batch(third, reward))
    s2.task_sampler.require_dispatch = True
    after2 = []
    for rows in it2:
        after2.append([r["extra_info"]["task_id"] for r in rows])
        s2.update(_step_batch(rows, reward))
    for rows in loader2:
        after2.append([r["extra_info"]["task_id"] for r in rows])
        s2.update(_step_batch(rows, reward))
    # no fast-forwarding through (and drawing) old batches: the epoch ends where it ended
    assert len(after2) == len(after1) == 3  # 3 batches per epoch: 0 left in epoch 0, 3 in epoch 1
    assert after2 == after1
    assert s2.task_sampler.state_dict()["rng"] == s1.task_sampler.state_dict()["rng"]


def test_bad_state_is_refused(pool):
    ds = RowDataset(pool)
    s = EnvSchedVerlSampler(ds, task_sampler=UniformSampler(pool, seed=0), batch_size=2)
    with pytest.raises(ValueError, match="not an EnvSchedVerlSampler state"):
        s.load_state_dict({"format": "other"})
    state = s.state_dict()
    state["queue"] = [999]
    with pytest.raises(ValueError, match="outside the dataset"):
        s.load_state_dict(state)
