"""envsched inside the real verl 0.9.1: v0 ``RayPPOTrainer`` subclass, its own ``StatefulDataLoader``, real
``RLHFDataset`` rows from a parquet file and real ``DataProto`` batches built the way ``RayPPOTrainer.fit``
builds them (``from_single_dict``, one ``uid`` per prompt, ``repeat(n, interleave=True)``, ``union`` with the
generated responses, ``token_level_scores`` set after the rewards).

verl's GPU worker groups (actor/rollout) cannot run here: the trainer's ``actor_rollout_wg`` is a small local
object with the three methods the tested code paths call (``update_actor``, ``save_checkpoint``,
``load_checkpoint``); everything else is verl's code.
"""

from __future__ import annotations

import json
import os
import uuid

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
pd = pytest.importorskip("pandas")

# verl imports Ray's deprecated state API, whose first import records a usage tag in the key-value store of the
# Ray cluster this process is connected to. Imported here, at collection, when no cluster is connected, it records
# it locally: on a pytest-xdist worker that had started and stopped Ray clusters for other modules' tests, that
# remote write during a test's first import of verl's trainer hung the run.
import ray.experimental.state.api  # noqa: E402,F401
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402

from envsched.integrations.verl import (  # noqa: E402
    SAMPLER_STATE_FILE,
    EnvSchedVerlSampler,
    check_verl_config,
    groups_from_batch,
)
from envsched.samplers.simple import CurriculumSampler, UniformSampler  # noqa: E402

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

N = 2  # actor_rollout_ref.rollout.n
BATCH = 4  # data.train_batch_size
P, R = 3, 4  # prompt and response lengths of the fake generations
NUM_TASKS = 10  # 2 full batches per epoch; the 2 leftover rows are never drawn


class WorkerGroup:
    """Local replacement for verl's GPU actor/rollout worker group (records calls)."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.calls = []

    def update_actor(self, batch_td):
        from tensordict import NonTensorData, TensorDict

        self.calls.append(("update_actor", self.sampler.task_sampler.groups))
        assert {"input_ids", "response_mask"} <= set(batch_td.keys())  # verl's no-padding layout
        return TensorDict({"metrics": NonTensorData({"mfu": 0.0})}, batch_size=[])

    def save_checkpoint(self, local_path, remote_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        self.calls.append(("save", local_path))

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.calls.append(("load", local_path))


def _pool():
    return [{"id": f"arith/{i}", "env": "arith" if i % 2 else "logic", "instruction": f"What is {i} + {i}?"}
            for i in range(NUM_TASKS)]


@pytest.fixture(scope="module")
def verl_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl")
    rows = [{"data_source": t["env"], "prompt": [{"role": "user", "content": t["instruction"]}],
             "reward_model": {"ground_truth": str(2 * i)}, "extra_info": {"task_id": t["id"], "index": i}}
            for i, t in enumerate(_pool())]
    pd.DataFrame(rows).to_parquet(root / "train.parquet")
    dataset = RLHFDataset(data_files=str(root / "train.parquet"), tokenizer=None,
                          config=OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(root / "c")}))
    import verl.trainer.config as verl_config

    with initialize_config_dir(config_dir=os.path.dirname(verl_config.__file__), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[
            "trainer.use_v1=false", f"data.train_batch_size={BATCH}", f"actor_rollout_ref.rollout.n={N}",
            f"trainer.default_local_dir={root / 'ckpt'}", "trainer.device=cpu", "data.dataloader_num_workers=0",
            "trainer.logger=[console]", "trainer.resume_mode=auto", "algorithm.adv_estimator=grpo"])
    return root, dataset, config


def _trainer(verl_env, task_sampler, reward_range=None, config=None):
    from verl.single_controller.ray.base import RayWorkerGroup
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager
    from verl.trainer.ppo.utils import Role

    from envsched.integrations.verl import EnvSchedRayPPOTrainer

    _root, dataset, base = verl_env
    config = config if config is not None else base.copy()
    tokenizer, role_worker_mapping = None, {Role.ActorRollout: WorkerGroup}
    resource_pool_manager = ResourcePoolManager({}, {})
    # the lines of a user's v0 entrypoint (docs/trainers.md)
    sampler = EnvSchedVerlSampler(dataset, task_sampler=task_sampler, batch_size=BATCH, reward_range=reward_range)
    trainer = EnvSchedRayPPOTrainer(
        config=config, tokenizer=tokenizer, role_worker_mapping=role_worker_mapping,
        resource_pool_manager=resource_pool_manager, ray_worker_group_cls=RayWorkerGroup,
        train_dataset=dataset, val_dataset=dataset, collate_fn=collate_fn, train_sampler=sampler)
    trainer.actor_rollout_wg = WorkerGroup(sampler)
    return trainer, sampler


def _step_batch(batch_dict, reward_of):
    """A finished step's DataProto, as RayPPOTrainer.fit builds it (rewards of the j-th rollout per prompt)."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    batch = batch.repeat(repeat_times=N, interleave=True)
    rows = len(batch)
    resp_len = torch.tensor([1 + (i % R) for i in range(rows)])
    response_mask = (torch.arange(R)[None, :] < resp_len[:, None]).long()
    attention_mask = torch.cat([torch.ones(rows, P, dtype=torch.long), response_mask], dim=1)
    scores = torch.zeros(rows, R)
    for i in range(rows):
        scores[i, resp_len[i] - 1] = reward_of(batch.non_tensor_batch["extra_info"][i]["task_id"], i % N)
    gen = DataProto.from_dict(tensors={
        "input_ids": torch.randint(0, 50, (rows, P + R)), "attention_mask": attention_mask,
        "position_ids": torch.clamp(torch.cumsum(attention_mask, dim=1) - 1, min=0),
        "responses": torch.randint(0, 50, (rows, R)), "response_mask": response_mask})
    batch = batch.union(gen)
    batch.batch["token_level_scores"] = scores
    return batch


def _run_steps(trainer, steps, reward_of, save_freq=0):
    """The part of RayPPOTrainer.fit around the envsched hooks: draw from verl's loader, feed via _update_actor
    (the real override), checkpoint via the real _save_checkpoint. Returns the task ids drawn per step."""
    drawn = []
    it = iter(trainer.train_dataloader)
    for _ in range(steps):
        try:
            batch_dict = next(it)
        except StopIteration:
            it = iter(trainer.train_dataloader)
            batch_dict = next(it)
        trainer.global_steps += 1
        drawn.append([e["task_id"] for e in batch_dict["extra_info"]])
        trainer._update_actor(_step_batch(batch_dict, reward_of))
        if save_freq and trainer.global_steps % save_freq == 0:
            trainer._save_checkpoint()
    return drawn


def _reward(tid, j):
    return 1.0 if (tid.endswith(("1", "3")) and j == 0) else 0.0


def test_v0_trainer_draws_from_envsched_and_feeds_every_group_before_the_actor_update(verl_env):
    inner = CurriculumSampler(_pool(), group_size=N, key="id", seed=5)
    trainer, sampler = _trainer(verl_env, inner)
    assert trainer.train_dataloader.sampler is sampler and len(trainer.train_dataloader) == NUM_TASKS // BATCH
    trainer.global_steps = 0
    drawn = _run_steps(trainer, 4, _reward)
    # every update_actor call saw the step's groups already reported
    assert [c for c in trainer.actor_rollout_wg.calls if c[0] == "update_actor"] == [
        ("update_actor", BATCH * (k + 1)) for k in range(4)]
    assert inner.groups == 16 and inner.episodes == 16 * N and inner.outstanding_groups == 0
    assert all(len(d) == BATCH for d in drawn)
    assert inner.signal_groups == sum(t.endswith(("1", "3")) for d in drawn for t in d)
    assert inner.cost == 4 * sum(1 + (i % R) for i in range(BATCH * N))
    # a second call in the same step (e.g. _update_actor after _update_critic) does not report twice
    trainer.envsched_feed(_step_batch(next(iter(trainer.train_dataloader)), _reward))
    assert inner.groups == 16


def _resume_run(verl_env, tmp_path, total, save_at):
    """Run A: `total` steps, checkpoint every `save_at`. Run B: resume from the last checkpoint <= save_at, go to
    `total`. Returns both runs' draws and samplers."""
    def build(cfg):
        return _trainer(verl_env, CurriculumSampler(_pool(), group_size=N, key="id", seed=7), config=cfg)

    cfg = verl_env[2].copy()
    cfg.trainer.default_local_dir = str(tmp_path / "ckpt")
    ta, sa = build(cfg.copy())
    ta.global_steps = 0
    drawn_a = _run_steps(ta, total, _reward, save_freq=save_at)
    cfg_b = cfg.copy()
    cfg_b.trainer.resume_mode = "resume_path"
    cfg_b.trainer.resume_from_path = str(tmp_path / "ckpt" / f"global_step_{save_at}")
    tb, sb = build(cfg_b)
    tb._load_checkpoint()
    assert tb.global_steps == save_at
    drawn_b = _run_steps(tb, total - save_at, _reward)
    return drawn_a, drawn_b, sa, sb, tb


@pytest.mark.parametrize("save_at", [1, 2], ids=["mid_epoch", "epoch_boundary"])
def test_resume_restores_the_sampler_on_every_path(verl_env, tmp_path, save_at):
    """Mid-epoch, verl restores data.pt and envsched_sampler.json; at an epoch boundary (2 steps per epoch)
    verl 0.9.1 skips data.pt, and the sampler still resumes from envsched_sampler.json."""
    drawn_a, drawn_b, sa, sb, tb = _resume_run(verl_env, tmp_path, 4, save_at)
    state = json.loads((tmp_path / "ckpt" / f"global_step_{save_at}" / SAMPLER_STATE_FILE).read_text())
    assert state["global_step"] == save_at
    assert state["state"]["sampler"]["counters"]["groups"] == BATCH * save_at
    assert ("load", str(tmp_path / "ckpt" / f"global_step_{save_at}" / "actor")) in tb.actor_rollout_wg.calls
    assert drawn_b == drawn_a[save_at:]  # the same draws as the uninterrupted run
    assert sb.task_sampler.state_dict()["counters"] == sa.task_sampler.state_dict()["counters"]
    assert sb.task_sampler.state_dict()["rng"] == sa.task_sampler.state_dict()["rng"]


def test_resume_from_a_checkpoint_without_sampler_state_is_refused(verl_env, tmp_path):
    cfg = verl_env[2].copy()
    folder = tmp_path / "ckpt" / "global_step_3"
    folder.mkdir(parents=True)
    cfg.trainer.resume_mode = "resume_path"
    cfg.trainer.resume_from_path = str(folder)
    trainer, _ = _trainer(verl_env, UniformSampler(_pool(), seed=0), config=cfg)
    with pytest.raises(FileNotFoundError, match=SAMPLER_STATE_FILE):
        trainer._load_checkpoint()


def test_data_sampler_class_path_naming_envsched_is_refused_on_verl_0_9(verl_env):
    cfg = verl_env[2].copy()
    OmegaConf.set_struct(cfg, False)
    cfg.data.sampler = {"class_path": "pkg://envsched.integrations.verl", "class_name": "EnvSchedVerlSampler"}
    with pytest.raises(ValueError, match=r"ignored by verl 0\.9\.1.*EnvSchedPPOTrainer.*EnvSchedReplayBuffer"):
        _trainer(verl_env, UniformSampler(_pool()), config=cfg)
    with pytest.raises(ValueError, match="ignored by verl"):
        EnvSchedVerlSampler(verl_env[1], data_config=cfg.data)
    check_verl_config(cfg, version=(0, 7, 1))  # the legacy release reads it: accepted there
    with pytest.raises(TypeError, match="EnvSchedVerlSampler"):
        _trainer_plain_sampler(verl_env)


def _trainer_plain_sampler(verl_env):
    from torch.utils.data import SequentialSampler
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager
    from verl.trainer.ppo.utils import Role

    from envsched.integrations.verl import EnvSchedRayPPOTrainer

    _root, dataset, base = verl_env
    return EnvSchedRayPPOTrainer(config=base.copy(), tokenizer=None, role_worker_mapping={Role.ActorRollout: 0},
                                    resource_pool_manager=ResourcePoolManager({}, {}), train_dataset=dataset,
                                    val_dataset=dataset, collate_fn=collate_fn,
                                    train_sampler=SequentialSampler(dataset))


@pytest.mark.parametrize(("value", "mapped", "nonfinite"), [
    (1.5, 1.0, 0), (-1.0, 0.0, 0), (100.0, 1.0, 0), (float("nan"), None, 1)])
def test_rewards_of_any_scale_never_raise(verl_env, value, mapped, nonfinite):
    """verl's scores are whatever the reward function returns: learned range by default."""
    inner = UniformSampler(_pool(), seed=1)
    trainer, sampler = _trainer(verl_env, inner)
    trainer.global_steps = 1
    batch_dict = next(iter(trainer.train_dataloader))
    first = batch_dict["extra_info"][0]["task_id"]
    seen = []
    orig = inner.update

    def spy(task, rewards, costs=None):
        seen.append((task["id"], list(rewards)))
        orig(task, rewards, costs)

    inner.update = spy
    trainer._update_actor(_step_batch(batch_dict, lambda tid, j: value if (tid == first and j == 0) else 0.5))
    assert inner.groups == BATCH and inner.episodes == BATCH * N  # the group still counts
    rewards = dict(seen)[first]
    assert rewards[0] == mapped
    m = sampler.metrics()
    assert m["envsched/rewards_nonfinite"] == nonfinite and m["envsched/unscored_episodes"] == nonfinite
    if value == 1.5:  # learned range [0, 1.5]: 0.5 -> 1/3
        assert rewards[1] == pytest.approx(0.5 / 1.5) and m["envsched/reward_range_high"] == 1.5
    # the sampler's own update still refuses the raw value
    inner.update = orig
    with pytest.raises(ValueError, match=r"must be finite|outside the declared reward range"):
        inner.update(inner.tasks[0], [value], None)


def test_given_reward_range_maps_and_clips(verl_env):
    inner = UniformSampler(_pool(), seed=1)
    trainer, sampler = _trainer(verl_env, inner, reward_range=(-1.0, 3.0))
    trainer.global_steps = 1
    batch = _step_batch(next(iter(trainer.train_dataloader)), lambda tid, j: [5.0, 1.0][j])
    groups = groups_from_batch(batch)
    assert [g[1] for g in groups] == [[5.0, 1.0]] * BATCH
    trainer._update_actor(batch)
    assert sampler.reward_scale.map([1.0, -1.0, 7.0]) == [0.5, 0.0, 1.0]
    assert sampler.metrics()["envsched/rewards_clipped"] == BATCH + 1


def test_bad_state_is_refused_and_state_round_trips(verl_env):
    ds = verl_env[1]
    s = EnvSchedVerlSampler(ds, task_sampler=UniformSampler(_pool(), seed=0), batch_size=2)
    with pytest.raises(ValueError, match="not an EnvSchedVerlSampler state"):
        s.load_state_dict({"format": "other"})
    state = s.state_dict()
    bad = dict(state, queue=[999])
    with pytest.raises(ValueError, match="outside the dataset"):
        s.load_state_dict(bad)
    with pytest.raises(ValueError, match="no dataset row"):
        EnvSchedVerlSampler(ds, task_sampler=UniformSampler([{"id": "nope", "env": "x"}]))


def test_unreported_groups_stay_bounded_when_batches_come_back_partly_and_out_of_order(verl_env):
    """Each batch's last group is reported with the next batch, groups in reverse order: after 40 batches the
    sampler still holds only the one group in flight, and its checkpoint discards exactly that dispatch."""
    ds = verl_env[1]
    inner = UniformSampler(_pool(), seed=0)
    s = EnvSchedVerlSampler(ds, task_sampler=inner, batch_size=BATCH)
    ids = [t["id"] for t in _pool()]
    held = None
    for _ in range(40):
        it = iter(s)
        keys = [ids[next(it)] for _ in range(BATCH)]
        now = [(k, [1.0, 0.0], None) for k in keys[:-1]] + ([held] if held else [])
        s.report_groups(now[::-1])
        held = (keys[-1], [0.0, 1.0], None)
        assert s.unreported == {keys[-1]: 1} and inner.outstanding() == {keys[-1]: 1}
    state = json.loads(json.dumps(s.state_dict()))
    assert state["unreported"] == [[held[0]]]
    fresh = EnvSchedVerlSampler(ds, task_sampler=UniformSampler(_pool(), seed=0), batch_size=BATCH)
    fresh.load_state_dict(state)
    assert fresh.task_sampler.groups == inner.groups == 40 * BATCH - 1
    assert fresh.task_sampler.outstanding_groups == 0 and fresh.unreported == {}
    assert fresh.task_sampler.state_dict()["rng"] == inner.state_dict()["rng"]


def _v1_config(root, *, command_line=True, **overrides):
    """verl's composed ppo_trainer config; ``command_line``: with the overrides of verl's command line that name
    envsched's replay buffer (else for EnvSchedPPOTrainer, which needs none)."""
    import verl.trainer.config as verl_config

    envsched = ["trainer.v1.sampler.custom_sampler.path=pkg://envsched.integrations.verl",
                "trainer.v1.sampler.custom_sampler.name=EnvSchedReplayBuffer",
                "+trainer.v1.sampler.sampler_kwargs.sampler=uniform"] if command_line else []
    with initialize_config_dir(config_dir=os.path.dirname(verl_config.__file__), version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"data.train_batch_size={BATCH}", f"actor_rollout_ref.rollout.n={N}", "trainer.device=cpu",
            f"data.train_files={root / 'train.parquet'}", f"data.val_files={root / 'train.parquet'}",
            "data.filter_overlong_prompts=false", "data.dataloader_num_workers=0", "algorithm.adv_estimator=grpo",
            f"trainer.default_local_dir={root / 'v1ckpt'}", *envsched, "+trainer.v1.sampler.sampler_kwargs.seed=0",
            *[f"{k}={v}" for k, v in overrides.items()]])


def _v1_trainer(root, route="command_line", **overrides):
    """The v1 trainer as verl's command line builds it (route ``command_line``: verl's get_trainer_cls, the
    replay buffer from custom_sampler) or as a Python entrypoint does (``python``: EnvSchedPPOTrainer with a
    ready task sampler)."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    if route == "python":
        from envsched.integrations.verl import EnvSchedPPOTrainer

        config = _v1_config(root, command_line=False, **overrides)
        trainer = EnvSchedPPOTrainer(config, task_sampler=CurriculumSampler(_pool(), group_size=N, key="id", seed=3))
    else:
        config = _v1_config(root, **overrides)
        trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    trainer.tokenizer, trainer.processor = None, None  # set by _init_tokenizer from a model path in verl
    return trainer


@pytest.mark.parametrize("route", ["command_line", "python"])
def test_v1_replay_buffer_draws_from_envsched_and_reports_every_finished_group(verl_env, route):
    """verl's v1 trainer builds EnvSchedReplayBuffer (from trainer.v1.sampler.custom_sampler on the command line;
    EnvSchedPPOTrainer builds it itself, around the task sampler it was given); the trainer's loader draws from
    envsched; a real TransferQueue (local Ray) holds the finished groups, and the buffer's poll reports each
    once -- failed sessions as None, rewards of any scale mapped -- and checkpoints carry it."""
    ray = pytest.importorskip("ray")
    tq = pytest.importorskip("transfer_queue")
    from tensordict import TensorDict

    root = verl_env[0]
    trainer = _v1_trainer(root, route)
    buffer = trainer.replay_buffer
    assert type(buffer).__name__ == "EnvSchedReplayBuffer"
    trainer._init_dataloader()
    sampler = trainer.train_dataloader.sampler
    assert isinstance(sampler, EnvSchedVerlSampler) and buffer.envsched_sampler is sampler
    assert type(sampler.task_sampler) is {"python": CurriculumSampler, "command_line": UniformSampler}[route]
    batch = trainer._fetch_one_gen_batch()
    uids = [str(u) for u in batch["uid"]]
    assert len(uids) == BATCH and set(buffer._uid_key) == set(uids)
    assert sampler.task_sampler.outstanding_groups == BATCH
    drawn = sorted(k for k, c in sampler.unreported.items() for _ in range(c))
    assert sorted(buffer._uid_key.values()) == drawn  # the keys envsched drew

    owner = not ray.is_initialized()  # share a cluster another test module left running
    if owner:  # TransferQueue's controller and storage actors each hold a CPU slot
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        # uid 0 finished with rewards 100.0 and NaN; uid 1 failed with one session lost; uids 2, 3 finished
        statuses = ["finished", "failure", "finished", "finished"]
        tq.kv_batch_put(keys=uids, partition_id="train", tags=[{"is_prompt": True, "status": st, "global_steps": 1}
                                                                for st in statuses])
        keys = [f"{u}_{sess}_0" for i, u in enumerate(uids) for sess in range(N) if not (i == 1 and sess == 1)]
        values = {keys[0]: 100.0, keys[1]: float("nan")}
        scores = torch.zeros(len(keys), 3)
        for i, k in enumerate(keys):
            scores[i, 2] = values.get(k, 0.5 * (i % 2))
        fields = TensorDict({"rm_scores": scores}, batch_size=[len(keys)])
        tq.kv_batch_put(keys=keys, partition_id="train", fields=fields,
                        tags=[{"status": "success", "response_len": 2 + i % 2, "global_steps": 1}
                              for i in range(len(keys))])
        meta, _ = buffer.sample(1, "train", BATCH)
        assert len(meta.keys) == len(keys)
        inner = sampler.task_sampler
        assert inner.groups == BATCH and inner.episodes == BATCH * N and inner.outstanding_groups == 0
        assert inner.unscored_episodes == 2  # the NaN and the lost session
        assert inner.cost == sum(2 + i % 2 for i in range(len(keys)))
        m = buffer.metrics()
        assert m["envsched/rewards_nonfinite"] == 1 and m["envsched/reward_range_high"] == 100.0
        buffer.envsched_report("train")  # a later poll does not report them again
        assert inner.groups == BATCH
        assert buffer._uid_key == {} and sampler.unreported == {}  # reported prompts are forgotten
        trainer.actor_rollout_wg = WorkerGroup(sampler)
        trainer.global_steps = 1
        trainer._save_checkpoint()
    finally:
        tq.close()
        if owner:
            ray.shutdown()
    resumed = _v1_trainer(root, route, **{"trainer.resume_mode": "resume_path",
                                          "trainer.resume_from_path": str(root / "v1ckpt" / "global_step_1")})
    resumed._init_dataloader()
    resumed.actor_rollout_wg = WorkerGroup(resumed.replay_buffer.envsched_sampler)
    resumed._load_checkpoint()
    restored = resumed.replay_buffer.envsched_sampler
    assert restored.task_sampler.state_dict()["counters"] == sampler.task_sampler.state_dict()["counters"]
    assert restored.reward_scale.source == (0.0, 100.0)


def test_v1_refuses_async_trainer_modes(verl_env):
    from verl.trainer.ppo.v1 import get_trainer_cls

    cfg = _v1_trainer(verl_env[0]).config.copy()
    cfg.trainer.v1.trainer_mode = "separate_async"
    with pytest.raises(ValueError, match="trainer_mode=sync"):
        get_trainer_cls("sync")(config=cfg)


def _deprecations(caught):
    """Deprecation warnings from verl (raised in verl's code, or in envsched's code by verl, as the @deprecated
    class RayPPOTrainer does, or naming verl), as ``file:line: category: message``; other libraries' left out."""
    def from_verl(w):
        where = w.filename.replace(os.sep, "/")
        return "/verl/" in where or "/envsched/" in where or "verl" in str(w.message)

    return [f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}" for w in caught
            if issubclass(w.category, (DeprecationWarning, FutureWarning, PendingDeprecationWarning))
            and from_verl(w)]


def test_the_v1_python_entrypoint_emits_no_deprecation_warning(verl_env, monkeypatch):
    """verl 0.9.1 deprecates its v0 RayPPOTrainer (a FutureWarning on construction) and its load_extern_type
    (which reads trainer.v1.sampler.custom_sampler): the Python entrypoint -- importing the integration, building
    EnvSchedPPOTrainer, its dataloader, a draw, envsched_task_runner -- goes through neither, and nothing else
    it calls warns of a deprecation. The legacy v0 class still lets verl's own warning through."""
    import warnings

    import envsched.integrations.verl as integration

    monkeypatch.setattr(integration, "_LAZY", {})  # verl's classes are subclassed again, inside the block
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _v1_trainer(verl_env[0], "python")
        trainer._init_dataloader()
        assert len(trainer._fetch_one_gen_batch()["uid"]) == BATCH
        integration.envsched_task_runner()
    assert _deprecations(caught) == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(verl_env, UniformSampler(_pool(), seed=0))
    assert any("RayPPOTrainer" in d and "deprecated" in d for d in _deprecations(caught))


def test_python_entrypoint_refuses_another_custom_sampler_and_a_non_sampler(verl_env):
    from envsched.integrations.verl import EnvSchedPPOTrainer

    config = _v1_config(verl_env[0], command_line=False, **{
        "trainer.v1.sampler.custom_sampler.path": "pkg://somewhere.else", "trainer.v1.sampler.custom_sampler.name":
        "OtherBuffer"})
    with pytest.raises(ValueError, match=r"names pkg://somewhere\.else:OtherBuffer.*remove custom_sampler"):
        EnvSchedPPOTrainer(config)
    with pytest.raises(TypeError, match="task_sampler must be an envsched TaskSampler; list has no sample"):
        EnvSchedPPOTrainer(_v1_config(verl_env[0], command_line=False), task_sampler=[])


class _Stop(Exception):
    pass


def _make_task_sampler(config):
    return CurriculumSampler(_pool(), group_size=int(config.actor_rollout_ref.rollout.n), key="id", seed=11)


def test_task_runner_runs_verls_v1_runner_with_the_envsched_trainer(verl_env, monkeypatch):
    """envsched_task_runner's run is verl's TaskRunnerV1.run (TransferQueue up, trainer built, init, agent loop,
    fit, TransferQueue closed) with EnvSchedPPOTrainer built around make_task_sampler(config). Run in this
    process (the Ray actor's class itself) up to trainer.init(), which needs the GPU worker groups."""
    ray = pytest.importorskip("ray")
    from envsched.integrations.verl import EnvSchedPPOTrainer, envsched_task_runner

    built = []

    def init(self):
        built.append(self)
        raise _Stop

    monkeypatch.setattr(EnvSchedPPOTrainer, "init", init)
    runner_cls = envsched_task_runner(_make_task_sampler)
    runner = runner_cls.__ray_actor_class__()
    config = _v1_config(verl_env[0], command_line=False)
    OmegaConf.set_struct(config, False)
    config.transfer_queue.backend = {"SimpleStorage": {"num_data_storage_units": 1}}
    owner = not ray.is_initialized()
    if owner:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with pytest.raises(_Stop):
            runner.run(config)
    finally:
        if owner:
            ray.shutdown()
    (trainer,) = built
    assert type(trainer) is EnvSchedPPOTrainer and type(trainer.replay_buffer).__name__ == "EnvSchedReplayBuffer"
    assert trainer.replay_buffer.envsched_task_sampler.seed == 11
    import verl.trainer.ppo.v1 as v1

    assert v1.get_trainer_cls("sync").__name__ == "PPOTrainerSync"  # verl's lookup is back after the run
