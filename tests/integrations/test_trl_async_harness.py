"""TRL's OpenEnv harness driven by an envsched sampler, for real on CPU.

The real ``AsyncGRPOTrainer`` with TRL's harness worker (``HarnessRolloutWorker``'s loop, ``MCPHarnessAdapter``:
TRL samples each turn from the stand-in vLLM server and the adapter calls the session's ``answer`` tool) runs
episodes against envsched's OpenEnv server (``envsched.envs.openenv_server``, served by uvicorn in a subprocess on
127.0.0.1) through :class:`~envsched.integrations.openenv_harness.OpenEnvTaskSessionFactory`. The stand-in server
holds some requests back, so groups finish late and out of order and some go stale. Run A trains 6 steps; run B
resumes A's ``checkpoint-2`` with a fresh trainer and sampler and must draw what A drew after it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("aiohttp")
pytest.importorskip("openenv.core.harness")

from openenv.core.harness import MCPHarnessAdapter  # noqa: E402
from trl.chat_template_utils import qwen3_chat_template  # noqa: E402
from trl.experimental.async_grpo import AsyncGRPOConfig  # noqa: E402
from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker  # noqa: E402

from envsched.envs.reasoning_gym import build_reasoning_gym_pool  # noqa: E402
from envsched.integrations.openenv_harness import (  # noqa: E402
    EnvSchedHarnessRolloutLoop,
    EnvSchedHarnessRolloutWorker,
    OpenEnvTaskSessionFactory,
    check_harness_hooks,
)
from envsched.integrations.standin import StandInVLLMServer, StandInWeightTransfer, digit_share  # noqa: E402
from envsched.integrations.trl_async import (  # noqa: E402
    SAMPLER_STATE_FILE,
    EnvSchedAsyncGRPOTrainer,
    EnvSchedRolloutWorker,
)
from envsched.samplers.simple import UniformSampler  # noqa: E402

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

pytest.importorskip("reasoning_gym")

G = 4
MAX_STEPS = 6  # A draws for 4 steps past checkpoint-2 (16 groups B drew too, in one run; 4 are required)
ENVS = ["chain_sum", "basic_arithmetic", "leg_counting"]


def delay(n: int) -> float:
    """Every 7th request waits 2 s: its group finishes after groups drawn later."""
    return 2.0 if n % 7 == 3 else 0.0


class Recording(UniformSampler):
    """A UniformSampler logging every call the trainer makes (its draws depend on its RNG only)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls: list[tuple[str, str]] = []

    def sample(self, n):
        out = super().sample(n)
        self.calls += [("sample", t["id"]) for t in out]
        return out

    def update(self, task, rewards, costs=None):
        super().update(task, rewards, costs)
        self.calls.append(("update", task["id"]))

    def discard(self, task):
        super().discard(task)
        self.calls.append(("discard", task["id"]))


def row(task):
    return {"prompt": [{"role": "user", "content": task["instruction"][:80]}]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_llm, uvicorn_app):
    root = tmp_path_factory.mktemp("async_harness")
    pool = list(build_reasoning_gym_pool(ENVS, tasks_per_dataset=4, num_tiers=2, seed=0))
    pool_file = root / "pool.jsonl"
    pool_file.write_text("".join(json.dumps(t) + "\n" for t in pool))
    model_dir = root / "model"
    tok = tiny_llm(pool, model_dir)
    tok.chat_template = qwen3_chat_template  # TRL's harness renders the session's messages and tools with it
    tok.save_pretrained(model_dir)
    # the tool preamble of the chat template alone exceeds the tiny model's 256 positions (an empty completion would
    # make TRL's harness fail the rollout): serve 1024 (RoPE runs past max_position_embeddings)
    env = {**os.environ, "ENVSCHED_OPENENV_POOL": str(pool_file), "ENVSCHED_OPENENV_MAX_SESSIONS": "32",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    with uvicorn_app(env) as (_proc, port), \
            StandInVLLMServer(str(model_dir), delay=delay, max_model_len=1024) as server:
        yield root, pool, str(model_dir), tok, server, f"http://127.0.0.1:{port}"


def make_trainer(setup, out: Path):
    _root, pool, model_dir, tok, server, env_url = setup
    sampler = Recording(pool, seed=5)
    args = AsyncGRPOConfig(output_dir=str(out), report_to="none", use_cpu=True, bf16=False, disable_tqdm=True,
                           max_steps=MAX_STEPS, save_strategy="steps", save_steps=2, logging_steps=1, seed=0,
                           num_generations=G, per_device_train_batch_size=2 * G, max_completion_length=6,
                           max_staleness=1, token_budget=0, vllm_server_base_url=server.url, learning_rate=1e-3,
                           max_inflight_tasks=8, max_tool_calling_iterations=2)
    factory = functools.partial(OpenEnvTaskSessionFactory, env_url, log_path=str(out / "episodes.jsonl"))
    trainer = EnvSchedAsyncGRPOTrainer(
        model_dir, reward_funcs=[digit_share], args=args, processing_class=tok, task_sampler=sampler,
        task_to_row=row, weight_transfer=StandInWeightTransfer(server),
        harness_session_factory=factory, harness_adapter=MCPHarnessAdapter())
    return trainer, sampler


@pytest.fixture(scope="module")
def runs(setup):
    root = setup[0]
    (root / "a").mkdir()
    ta, sa = make_trainer(setup, root / "a")
    assert isinstance(ta.rollout_worker, EnvSchedHarnessRolloutWorker)
    assert isinstance(ta.rollout_worker, HarnessRolloutWorker)
    ta.train()
    (root / "b").mkdir()
    tb, sb = make_trainer(setup, root / "b")
    tb.train(resume_from_checkpoint=str(root / "a" / "checkpoint-2"))
    return (ta, sa), (tb, sb)


def _episodes(path: Path, event: str = "reset") -> list[dict]:
    return [e for line in path.read_text().splitlines() if (e := json.loads(line))["event"] == event]


def _accounting(trainer, sampler):
    """Every draw (replays included) is updated, discarded or still unresolved, none twice; the sampler's
    outstanding dispatches are exactly the unresolved draws."""
    draws = trainer.envsched_draw_log
    drawn_ids = {g for g, _ in draws}
    assert len(drawn_ids) == len(draws), "a group id was issued twice"
    log = trainer.envsched_feedback_log
    ids = [e["group_id"] for e in log]
    assert len(ids) == len(set(ids)), "a group was resolved twice"
    assert set(ids) <= drawn_ids
    unresolved = trainer.unresolved_draws
    assert not set(ids) & set(unresolved)
    assert Counter(k for _, k in draws) == Counter(e["task_id"] for e in log) + \
        Counter(k for g, k in unresolved.items() if g in drawn_ids)
    assert sampler.outstanding() == dict(Counter(unresolved.values()))
    assert [(e["outcome"], e["task_id"]) for e in log] == \
        [(op, k) for op, k in sampler.calls if op in ("update", "discard")]
    return ids


def test_episodes_run_exactly_the_drawn_tasks(runs, setup):
    """The OpenEnv server started every episode on the task the sampler drew for its group (its own report of
    the task id), with the group id as seed; every resolved group ran its G episodes."""
    (ta, _sa), _ = runs
    episodes = _episodes(setup[0] / "a" / "episodes.jsonl")
    assert episodes and all(e["task_id"] == e["requested"] for e in episodes)
    drawn = dict(ta.envsched_draw_log)
    by_group = Counter(e["seed"] for e in episodes)
    assert set(by_group) <= set(drawn)
    assert all(drawn[e["seed"]] == e["task_id"] for e in episodes), "an episode ran another task than its draw"
    for e in ta.envsched_feedback_log:
        assert by_group[e["group_id"]] == G
    assert len({e["episode_id"] for e in episodes}) == len(episodes)


def test_every_group_is_accounted_for_with_delays(runs):
    (ta, sa), _ = runs
    ids = _accounting(ta, sa)
    m = ta.envsched_metrics()
    assert m["groups_drawn"] == len([c for c in sa.calls if c[0] == "sample"]) == ta._es_feed.next_id
    assert set(ids) | set(ta.unresolved_draws) == set(range(ta._es_feed.next_id))
    assert ids != sorted(ids), "the delayed groups should have finished after later draws"
    assert m["groups_updated"] >= 8
    assert sa.groups == m["groups_updated"]
    assert sa.state_dict()["counters"]["discarded_groups"] == m["groups_discarded_stale"]
    for e in ta.envsched_feedback_log:
        if e["outcome"] == "update":
            assert len(e["rewards"]) == G


def test_rewards_are_the_environment_reward_plus_the_reward_functions(runs, setup):
    """Each rollout's reward is the OpenEnv environment's score of its episode (``verify``, in [0, 1]) plus
    ``digit_share`` (in [0, 1]), summed by TRL; per updated group, the sampler's raw rewards minus the episodes'
    environment rewards stay within the shaping term's range."""
    (ta, _sa), _ = runs
    verified: dict[int, list[float]] = {}
    for e in _episodes(setup[0] / "a" / "episodes.jsonl", "verify"):
        assert e["answered_by"] in ("tool", "final_message")
        assert e["env_reward"] is not None and 0.0 <= e["env_reward"] <= 1.0
        verified.setdefault(e["seed"], []).append(e["env_reward"])
    updates = [e for e in ta.envsched_feedback_log if e["outcome"] == "update"]
    assert updates
    for e in updates:
        env = verified[e["group_id"]]
        assert len(env) == G and None not in e["raw_rewards"]
        extra = sum(e["raw_rewards"]) - sum(env)
        assert -1e-6 <= extra <= G + 1e-6
    assert any(r > 0 for rs in verified.values() for r in rs), "the environment never scored above 0"
    logged = [h for h in ta.state.log_history if "rewards/harness_reward" in h]
    assert logged and all(0.0 <= h["rewards/harness_reward"] <= 1.0 for h in logged)


def test_resume_continues_the_same_draws(runs, setup):
    (ta, _sa), (tb, sb) = runs
    state = json.loads((setup[0] / "a" / "checkpoint-2" / SAMPLER_STATE_FILE).read_text())
    log_b = tb.envsched_draw_log
    replayed = [(g, k) for g, k in log_b if g < state["next_id"]]
    assert replayed == [tuple(p) for p in state["unresolved"]][:len(replayed)]
    assert log_b[:len(replayed)] == replayed
    fresh = log_b[len(replayed):]
    assert fresh and all(g >= state["next_id"] for g, _ in fresh)
    a_by_id = dict(ta.envsched_draw_log)
    common = [(g, k) for g, k in fresh if g in a_by_id]
    assert len(common) >= 4
    assert all(a_by_id[g] == k for g, k in common), "the resumed run drew other tasks than the uninterrupted one"
    _accounting(tb, sb)
    episodes = _episodes(setup[0] / "b" / "episodes.jsonl")
    drawn_b = dict(log_b)
    assert episodes and all(drawn_b[e["seed"]] == e["task_id"] == e["requested"] for e in episodes)


def test_harness_arguments_are_checked(setup, tmp_path):
    _root, pool, model_dir, tok, server, env_url = setup
    args = AsyncGRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, max_steps=1,
                           vllm_server_base_url=server.url)
    with pytest.raises(ValueError, match="harness_session_factory"):
        EnvSchedAsyncGRPOTrainer(model_dir, args=args, processing_class=tok, task_sampler=UniformSampler(pool),
                                 task_to_row=row, harness_adapter=MCPHarnessAdapter())
    with pytest.raises(ValueError, match="environment_factory"):
        EnvSchedAsyncGRPOTrainer(model_dir, args=args, processing_class=tok, task_sampler=UniformSampler(pool),
                                 task_to_row=row, environment_factory=dict,
                                 harness_session_factory=functools.partial(OpenEnvTaskSessionFactory, env_url))


def test_session_factory_selects_by_id_and_checks_the_started_task(setup):
    """A task without split/index is found by id in the Task API; the session reports the server's task id and
    the environment's reward of the submitted answer."""
    _root, pool, _model_dir, _tok, _server, env_url = setup
    factory = OpenEnvTaskSessionFactory(env_url)
    task = {k: v for k, v in pool[5].items() if k not in ("split", "index")}
    s = factory.create(task, seed=3, episode_id="e1")
    try:
        assert s.task_id == pool[5]["id"]
        msgs = s.initial_messages()
        assert msgs[-1]["role"] == "user" and msgs[-1]["content"]
        assert [t.name for t in s.list_tools()] == ["answer"]
        assert s.call_tool("nope", {}).error == "unknown tool"
        res = s.call_tool("answer", {"answer": "definitely not it"})
        assert res.done and res.metadata["reward"] is not None and 0.0 <= res.metadata["reward"] < 1.0
        v = s.verify([])
        assert v.env_reward == res.metadata["reward"] and v.metrics["answered_by"] == "tool"
    finally:
        s.close()
    with pytest.raises(LookupError, match="not served"):
        factory.create({"id": "no-such-task"}, seed=0)
    wrong = {**pool[2], "index": pool[3]["index"]}
    with pytest.raises(RuntimeError, match="not the drawn task"):
        factory.create(wrong, seed=0)


class _OwnHarnessWorker(EnvSchedHarnessRolloutWorker):
    """A harness worker of a trainer subclass's own (``harness_rollout_worker_class``)."""


def test_the_harness_worker_is_built_from_the_class_the_trainer_names(setup, tmp_path):
    """With ``harness_session_factory=``, the trainer builds ``harness_rollout_worker_class`` (default
    ``EnvSchedHarnessRolloutWorker``) from TRL's worker arguments, the harness's and the draw channel; a class
    without the harness loop is refused before anything is built."""
    _root, pool, model_dir, tok, server, env_url = setup
    args = AsyncGRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, max_steps=1, num_generations=G,
                           per_device_train_batch_size=G, vllm_server_base_url=server.url)
    factory = functools.partial(OpenEnvTaskSessionFactory, env_url)
    adapter = MCPHarnessAdapter()

    def build(trainer_class):
        return trainer_class(model_dir, reward_funcs=[digit_share], args=args, processing_class=tok,
                             task_sampler=UniformSampler(pool), task_to_row=row,
                             weight_transfer=StandInWeightTransfer(server), harness_session_factory=factory,
                             harness_adapter=adapter, lossless_capture=False)

    class Own(EnvSchedAsyncGRPOTrainer):
        harness_rollout_worker_class = _OwnHarnessWorker

    trainer = build(Own)
    try:
        worker = trainer.rollout_worker
        assert type(worker) is _OwnHarnessWorker and worker._loop_cls is EnvSchedHarnessRolloutLoop
        kwargs = worker._loop_kwargs
        assert kwargs["harness_session_factory"] is factory and kwargs["harness_adapter"] is adapter
        assert kwargs["lossless_capture"] is False and kwargs["rollout_reward_fn"] is None
        assert kwargs["envsched_channel"] == (trainer._es_channel.address, trainer._es_channel.authkey)
        assert kwargs["num_generations"] == G and kwargs["vllm_server_url"] == server.url
        assert trainer.rollout_queue.inner is worker.rollout_buffer
    finally:
        trainer._es_channel.close()

    class Plain(EnvSchedAsyncGRPOTrainer):
        harness_rollout_worker_class = EnvSchedRolloutWorker  # draws, but runs TRL's own turn loop

    with pytest.raises(TypeError, match=r"Plain\.harness_rollout_worker_class must be EnvSchedHarnessRolloutWorker "
                                        r"or a subclass of it, got <class '.*EnvSchedRolloutWorker'>"):
        build(Plain)


def test_changed_harness_hooks_are_refused_naming_the_version(monkeypatch):
    from trl.experimental.async_grpo.openenv_harness import _HarnessRolloutLoop

    check_harness_hooks()

    def run_session(self, prompt, group_id=0):
        return self._factory.create(None, seed=0)

    monkeypatch.setattr(_HarnessRolloutLoop, "_run_session", run_session)
    with pytest.raises(RuntimeError, match=r"supports TRL 1\.16\.0.*factory's task"):
        check_harness_hooks()
