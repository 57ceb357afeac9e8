"""PrimeRLTaskSampler against the real verifiers 0.4.0 types (Task, TaskData, Episode, Trace, Reward)."""

from __future__ import annotations

import importlib.util
import json
import pickle
import sys
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1")

from verifiers.v1.configs.agent import AgentConfig  # noqa: E402

from envsched.integrations.prime_rl import PrimeRLTaskSampler, episode_reward, task_spec_from_vf  # noqa: E402
from envsched.samplers.simple import CurriculumSampler, UniformSampler  # noqa: E402


class KeyedTask(vf.Task):
    """A task whose durable id is its key (verifiers' documented override)."""

    @property
    def key(self) -> str:
        return f"arith/{self.data.id}"


def _tasks(n=6, cls=vf.Task):
    return [cls(vf.TaskData(idx=i, id=f"q{i}", prompt=f"What is {i} + {i}?")) for i in range(n)]


def _episode(task, *, score=None, errors=False, none_reward=False, out_tokens=5, trainable=True):
    tt = vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash)
    rewards = {"correct": None if none_reward else vf.Reward(score=score, weight=1.0)}
    if score is not None and not none_reward:
        rewards["format"] = vf.Reward(score=1.0, weight=0.0)  # weighted out: trace.reward == score
    trace = vf.Trace(task=tt, agent=vf.AgentInfo(config=AgentConfig(), trainable=trainable), rewards=rewards,
                     ok=not errors, is_completed=True,
                     errors=[vf.trace.Error(type="SandboxError", message="boom")] if errors else [],
                     calls=[vf.ModelCall(usage=vf.Usage(prompt_tokens=3, completion_tokens=out_tokens))])
    return vf.Episode(task=tt, traces=[trace], ok=not errors, group=vf.GroupInfo(id="g"),
                      env=vf.EnvInfo(id="arith", name="arith"))


def test_draws_are_vf_tasks_keyed_by_task_key():
    tasks = _tasks(cls=KeyedTask)
    s = PrimeRLTaskSampler.from_tasks(tasks, lambda specs: UniformSampler(specs, seed=2), env="arith", draw_batch=2)
    drawn = [next(s) for _ in range(6)]
    assert all(isinstance(t, KeyedTask) for t in drawn)
    assert sorted(t.key for t in drawn) == sorted(t.key for t in tasks)  # one epoch without replacement
    spec = task_spec_from_vf(tasks[3], "arith")
    assert spec == {"id": "arith/q3", "env": "arith", "instruction": "What is 3 + 3?", "index": 3}


def test_observe_reports_rewards_none_and_costs():
    tasks = _tasks()
    inner = UniformSampler([task_spec_from_vf(t, "arith") for t in tasks], seed=0)
    s = PrimeRLTaskSampler(inner, tasks)
    t = next(s)
    group = [_episode(t, score=1.0, out_tokens=4), _episode(t, score=0.0, out_tokens=6),
             _episode(t, score=0.0, errors=True, out_tokens=2), _episode(t, none_reward=True, out_tokens=1)]
    assert [episode_reward(e) for e in group] == [1.0, 0.0, None, None]
    s.observe(group)
    assert inner.groups == 1 and inner.signal_groups == 1 and inner.episodes == 4
    assert inner.unscored_episodes == 2 and inner.cost == 13.0
    m = s.metrics()
    assert m["observed_groups"] == 1 and m["signal_groups_per_episode"] == 0.25


def test_feedback_may_lag_and_arrive_out_of_order():
    tasks = _tasks(8)
    inner = CurriculumSampler([task_spec_from_vf(t, "arith") for t in tasks], group_size=2, key="id", seed=1)
    s = PrimeRLTaskSampler(inner, tasks)
    ahead = [next(s) for _ in range(5)]  # prime-rl draws far ahead of feedback
    assert inner.outstanding_groups == 5
    for t in reversed(ahead):
        s.observe([_episode(t, score=1.0), _episode(t, score=0.0)])
    assert inner.groups == 5 and inner.outstanding_groups == 0 and inner.signal_groups == 5


def test_bad_groups_are_refused_without_state_change():
    tasks = _tasks()
    inner = UniformSampler([task_spec_from_vf(t, "arith") for t in tasks], seed=0)
    s = PrimeRLTaskSampler(inner, tasks)
    a, b = next(s), next(s)
    before = s.state_dict()
    with pytest.raises(ValueError, match="non-empty"):
        s.observe([])
    with pytest.raises(ValueError, match=r"exactly one task\.key"):
        s.observe([_episode(a, score=1.0), _episode(b, score=1.0)])
    stranger = vf.Task(vf.TaskData(idx=99, id="zz", prompt="not in the taskset"))
    with pytest.raises(KeyError, match="not a task"):
        s.observe([_episode(stranger, score=1.0)])
    assert s.state_dict() == before
    with pytest.raises(ValueError, match="task ids must be the tasks' keys"):
        PrimeRLTaskSampler(UniformSampler([{"id": "x", "env": "e"}]), tasks)
    with pytest.raises(ValueError, match="duplicate"):
        PrimeRLTaskSampler(inner, tasks + tasks[:1])


def test_state_round_trip_continues_the_same_draws():
    tasks = _tasks(9)

    def make(specs):
        return CurriculumSampler(specs, group_size=2, key="id", seed=4)

    s1 = PrimeRLTaskSampler.from_tasks(tasks, make, env="arith", draw_batch=3)
    for i in range(4):
        t = next(s1)
        s1.observe([_episode(t, score=float(i % 2)), _episode(t, score=1.0)])
    next(s1)  # 5 handed out of 2 draws of 3: one task left in the draw buffer
    state = json.loads(json.dumps(s1.state_dict()))
    s2 = PrimeRLTaskSampler.from_tasks(tasks, make, env="arith", draw_batch=3)
    s2.load_state_dict(state)
    assert s2.metrics()["buffered"] == 1
    seq1 = [next(s1).key for _ in range(7)]
    seq2 = [next(s2).key for _ in range(7)]
    assert seq1 == seq2


@pytest.mark.parametrize(("value", "mapped", "nonfinite"), [
    (1.5, 1.0, 0), (-1.0, 0.0, 0), (100.0, 1.0, 0), (float("nan"), None, 1)])
def test_rewards_of_any_scale_never_raise_in_observe(value, mapped, nonfinite):
    """prime-rl's trace.reward is an unbounded weighted sum: observe() maps it (learned range by default),
    a NaN reaches the sampler as None, and the group still counts in episodes and cost."""
    tasks = _tasks()
    inner = UniformSampler([task_spec_from_vf(t, "arith") for t in tasks], seed=0)
    s = PrimeRLTaskSampler(inner, tasks)
    t = next(s)
    seen = []
    orig = inner.update
    inner.update = lambda task, rewards, costs=None: (seen.append(list(rewards)), orig(task, rewards, costs))
    s.observe([_episode(t, score=value, out_tokens=3), _episode(t, score=0.5, out_tokens=4)])
    assert seen[0][0] == mapped
    assert inner.groups == 1 and inner.episodes == 2 and inner.cost == 7.0
    m = s.metrics()
    assert m["rewards_nonfinite"] == nonfinite and m["unscored_episodes"] == nonfinite
    if value == 100.0:
        assert seen[0][1] == pytest.approx(0.005) and m["reward_range_high"] == 100.0
    # the learned range is part of the state: a restored adapter maps the next group the same way
    state = json.loads(json.dumps(s.state_dict()))
    s2 = PrimeRLTaskSampler(UniformSampler([task_spec_from_vf(t, "arith") for t in tasks], seed=0), tasks)
    s2.load_state_dict(state)
    assert s2.reward_scale.map([0.5]) == s.reward_scale.map([0.5])
    inner.update = orig
    with pytest.raises(ValueError, match=r"must be finite|outside the declared reward range"):
        inner.update(inner.tasks[0], [value])  # the sampler's own update still refuses the raw value


def test_given_reward_range_for_prime_rl():
    tasks = _tasks()
    inner = UniformSampler([task_spec_from_vf(t, "arith") for t in tasks], seed=0)
    s = PrimeRLTaskSampler(inner, tasks, reward_range=(0.0, 10.0))
    t = next(s)
    s.observe([_episode(t, score=5.0), _episode(t, score=20.0)])
    assert s.metrics()["rewards_clipped"] == 1 and inner.signal_groups == 1
    with pytest.raises(ValueError, match="low < high"):
        PrimeRLTaskSampler(inner, tasks, reward_range=(1.0, 1.0))


# ---------------------------------------------------------------------------------------------- the entrypoint
TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny_pool.jsonl"


@pytest.fixture
def standin(monkeypatch):
    """prime-rl's orchestrator module, as tests/integrations/prime_rl_standin.py stands in for it (prime-rl
    itself needs Python 3.12, vLLM and GPUs); sys.modules and sys.argv are restored afterwards."""
    spec = importlib.util.spec_from_file_location("prime_rl_standin", Path(__file__).with_name("prime_rl_standin.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("prime_rl", "prime_rl.orchestrator", "prime_rl.orchestrator.orchestrator"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "argv", ["orchestrator"])
    module.install()
    return module


def test_orchestrator_entrypoint_puts_envsched_in_every_train_env_and_resumes(standin, tmp_path):
    """orchestrator_main runs the orchestrator's own main with envsched's TrainSource subclass: every env's
    curriculum samples through PrimeRLTaskSampler, every finished group (out of draw order, draws ahead) is
    observed, the checkpoint holds the adapters' states and a resume from it continues their counts."""
    from envsched.integrations.prime_rl import orchestrator_main

    common = ["--pool", str(TINY), "--groups", "4", "--rollouts", "4", "--in-flight", "6", "--out", str(tmp_path)]
    a = orchestrator_main(["--envsched-sampler", "curriculum", "--envsched-draw-batch", "2", *common,
                           "--steps", "4"])
    envs = {json.loads(line)["env"] for line in TINY.read_text().splitlines() if line.strip()}
    assert a["samplers"] == {env: "PrimeRLTaskSampler" for env in envs}
    m = a["metrics"]
    observed = sum(m[f"curriculum/{e}/sampler/observed_groups"] for e in envs)
    assert observed == 16 and sum(m[f"curriculum/{e}/sampler/groups"] for e in envs) == 16
    assert sum(m[f"curriculum/{e}/sampler/episodes"] for e in envs) == 64
    # drawn, never observed: the 5 groups in flight after the last one finished, and the tasks the adapters
    # drew in pairs (draw_batch 2) and have not handed out yet
    buffered = sum(m[f"curriculum/{e}/sampler/buffered"] for e in envs)
    assert sum(m[f"curriculum/{e}/sampler/outstanding_groups"] for e in envs) == 5 + buffered
    ckpt = pickle.loads((tmp_path / "step_2" / "orchestrator.pkl").read_bytes())
    states = {e: ckpt["train_source"]["envs"][e]["sampler"] for e in envs}
    assert all(s["format"] == "envsched.prime_rl/1" for s in states.values())
    assert sum(s["observed"] for s in states.values()) == 8
    b = orchestrator_main(["--envsched-sampler", "curriculum", "--envsched-draw-batch", "2", *common,
                           "--steps", "4", "--resume-step", "2"])
    assert b["steps"] == 4 and len(b["trained"]) == 2
    assert sum(b["metrics"][f"curriculum/{e}/sampler/observed_groups"] for e in envs) == 16  # 8 restored + 8


def test_orchestrator_entrypoint_refuses_bad_choices_in_one_line(standin, tmp_path, capsys):
    from envsched.integrations.prime_rl import install_task_samplers, orchestrator_main

    args = ["--pool", str(TINY), "--out", str(tmp_path), "--steps", "1"]
    with pytest.raises(KeyError, match=r"no train env 'nope'.*its envs: \['arithmetic', 'calendar'"):
        orchestrator_main(["--envsched-envs", "nope", *args])
    with pytest.raises(SystemExit):
        orchestrator_main(["--envsched-sampler", "nope", *args])
    assert "unknown --envsched-sampler 'nope'; choose one of:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        orchestrator_main(["--envsched-reward-range", "0", *args])
    assert "--envsched-reward-range takes LOW,HIGH" in capsys.readouterr().err
    source = standin.TrainSource([("a", _tasks(3), 1.0), ("b", _tasks(2), 1.0)])
    source.curricula["b"].sampler.tasks = None  # an infinite taskset
    before = source.curricula["a"].sampler
    with pytest.raises(ValueError, match="train env 'b' has an infinite taskset"):
        install_task_samplers(source, lambda specs, env: UniformSampler(specs))
    assert source.curricula["a"].sampler is before  # nothing replaced


def test_orchestrator_entrypoint_without_prime_rl_says_what_it_needs(monkeypatch):
    from envsched.integrations.prime_rl import orchestrator_main

    monkeypatch.setitem(sys.modules, "prime_rl", None)  # not importable, as here
    with pytest.raises(SystemExit, match=r"needs prime-rl \(main >= v0\.8\.1\.dev40, Python 3\.12"):
        orchestrator_main(["--envsched-sampler", "uniform"])
