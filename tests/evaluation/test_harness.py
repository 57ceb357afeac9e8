"""EvalHarness over real runners: reasoning-gym in process and OpenEnv over WebSocket (capacity-limited),
with retries, concurrency, timeouts, resumption, the reproducibility check, EvalSchedule and Ray."""

from __future__ import annotations

import json
import time

import pytest

from envsched.envs.base import Environment, StepResult
from envsched.envs.reasoning_gym import ReasoningGymEnvironment, build_reasoning_gym_pool, regenerate_item
from envsched.evaluation import ChatCompletionsPolicy, EvalHarness, EvalSchedule
from envsched.evaluation.records import EpisodeLog
from envsched.samplers.simple import UniformSampler


@pytest.fixture(scope="module")
def rg_tasks():
    return build_reasoning_gym_pool(["chain_sum", "gcd"], tasks_per_dataset=3, split="test", num_tiers=3)


def _answers(tasks):
    return {str(regenerate_item(t)["question"]): str(regenerate_item(t)["answer"]) for t in tasks}


def test_reasoning_gym_in_process_with_resume(tmp_path, stub_llm, rg_tasks):
    answers = _answers(rg_tasks)
    wrong = {rg_tasks[0]["instruction"], rg_tasks[4]["instruction"]}
    stub_llm.respond = lambda q, n: "nope" if q in wrong else f"<answer>{answers[q]}</answer>"
    policy = ChatCompletionsPolicy(stub_llm.url + "/v1", "m")
    harness = EvalHarness(ReasoningGymEnvironment, policy, rg_tasks, seeds=[0], concurrency=3)
    out = tmp_path / "ev"
    result = harness.run(out)
    s = result.scores
    assert s["episodes"] == 6 and s["successes"] == 4 and s["success_rate"] == pytest.approx(4 / 6)
    assert result.reproducible is True and result.complete
    assert set(result.by_group) == {"chain_sum", "gcd"}
    assert result.by_group["chain_sum"]["successes"] == 2 and result.by_group["gcd"]["successes"] == 2
    assert set(result.by_difficulty) == {"0", "1", "2"}
    assert sum(stub_llm.calls.values()) == 6
    # simulate an interruption: drop the last two records and leave a half-written line
    lines = (out / "episodes.jsonl").read_text().splitlines()
    (out / "episodes.jsonl").write_text("\n".join(lines[:4]) + "\n" + lines[4][:30])
    again = harness.run(out)
    assert sum(stub_llm.calls.values()) == 8  # only the two lost episodes ran again
    assert again.scores["episodes"] == 6 and again.scores["successes"] == 4
    assert len(EpisodeLog(out / "episodes.jsonl").load()) == 6
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 6
    # a different evaluation in the same folder is refused, and nothing is written
    other = EvalHarness(ReasoningGymEnvironment, policy, rg_tasks, seeds=[0, 1])
    with pytest.raises(ValueError, match="different evaluation"):
        other.run(out)
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 6


@pytest.mark.slow
def test_capacity_retries_concurrency_and_timeout(tmp_path, stub_llm):
    pytest.importorskip("openenv.core.env_server")
    from envsched.envs.openenv import OpenEnvEnvironment, TaskAPIClient
    from envsched.envs.openenv_server import ServerThread, make_app
    from envsched.pool.pool import TaskPool

    pool = TaskPool([{"id": f"q{i}", "env": "qa", "split": "test",
                      "initial_state": {"question": f"Repeat {i}", "answer": str(i)}} for i in range(5)])

    def respond(q, n):
        time.sleep(1.5 if q == "Repeat 4" else 0.15)  # each episode holds its session a while
        return q.split()[-1]

    stub_llm.respond = respond
    with ServerThread(make_app(pool, max_concurrent_envs=1)) as srv:
        policy = ChatCompletionsPolicy(stub_llm.url, "m")
        # three workers, one session slot: CAPACITY_REACHED is an infrastructure failure, retried
        harness = EvalHarness(lambda: OpenEnvEnvironment(srv.url), policy, TaskAPIClient(srv.url, "envsched_pool"),
                              concurrency=3, max_retries=30, backoff_s=0.05, backoff_max_s=0.1, limit=4,
                              check_reproducibility=False)
        result = harness.run(tmp_path / "cap")
        records = [json.loads(x) for x in (tmp_path / "cap" / "episodes.jsonl").read_text().splitlines()]
        assert result.scores["outcomes"]["success"] == 4 and result.scores["success_rate"] == 1.0
        assert max(r["attempts"] for r in records) > 1
        assert sum(stub_llm.calls.values()) == 4  # a refused session never reached the policy
        # a policy slower than the episode deadline: a timeout, retried, then reported as infra_error
        slow = EvalHarness(lambda: OpenEnvEnvironment(srv.url), policy, TaskAPIClient(srv.url, "envsched_pool"),
                           max_retries=1, backoff_s=0.01, episode_timeout_s=0.5, check_reproducibility=False)
        slow._tasks = [t for t in slow.tasks if t["id"] == "q4"]
        r = slow.run(tmp_path / "slow")
    rec = json.loads((tmp_path / "slow" / "episodes.jsonl").read_text())
    assert rec["outcome"] == "infra_error" and rec["attempts"] == 2 and "timed out" in rec["error"]
    assert r.scores["infra_error_rate"] == 1.0 and r.scores["scored"] == 0
    assert stub_llm.calls["Repeat 4"] == 2


class _Drifting(Environment):
    """Not reproducible: the first observation changes between resets."""

    name = "drift"
    counter = 0

    def reset(self, task, seed=None):
        type(self).counter += 1
        return f"question {type(self).counter}"

    def step(self, action):
        return StepResult(None, 1.0, True)

    def final_reward(self):
        return 1.0


def test_reproducibility_mismatch_is_recorded(stub_llm):
    stub_llm.respond = lambda q, n: "x"
    harness = EvalHarness(_Drifting, ChatCompletionsPolicy(stub_llm.url, "m"),
                          [{"id": "t", "env": "drift", "split": "test"}])
    with pytest.warns(RuntimeWarning, match="not reproducible"):
        result = harness.run()
    assert result.reproducible is False
    h = result.reproducibility["hashes"]
    assert len(h) == 2 and h[0] != h[1]


def test_eval_schedule_logs_sampler_counters(tmp_path, stub_llm, rg_tasks):
    answers = _answers(rg_tasks)
    stub_llm.respond = lambda q, n: answers[q]
    harness = EvalHarness(ReasoningGymEnvironment, ChatCompletionsPolicy(stub_llm.url, "m"), rg_tasks, limit=2,
                          check_reproducibility=False)
    sampler = UniformSampler(rg_tasks, seed=0)
    seen = []
    sched = EvalSchedule(harness, None, 2, lambda step, r: seen.append((step, r.training)), sampler=sampler,
                         output_dir=tmp_path)
    assert sched.maybe_run(0) is not None  # the baseline
    for step in (1, 2, 2, 3):
        for task in sampler.sample(2):
            sampler.update(task, [1.0, 0.0], costs=[10, 20])
        sched.maybe_run(step)
    assert [s for s, _ in seen] == [0, 2]
    assert seen[0][1]["sampler_episodes"] == 0 and seen[0][1]["sampler_cost"] == 0
    assert seen[1][1]["sampler_episodes"] == 8 and seen[1][1]["sampler_cost"] == 120  # after steps 1 and 2 (x2)
    stored = json.loads((tmp_path / "step-00000002" / "result.json").read_text())
    assert stored["training"]["step"] == 2 and stored["scores"]["success_rate"] == 1.0
    with pytest.raises(ValueError):
        EvalSchedule(harness, None, 0)
    with pytest.raises(ValueError, match="history_size"):
        EvalSchedule(harness, None, 2, history_size=-1)
    with pytest.raises(TypeError, match="config is None"):
        EvalSchedule(harness, 2, 3)  # a pre-RFC call: the config slot got a number
    with pytest.raises(ValueError):
        sched.due(-1)


def test_eval_schedule_history_keeps_the_newest_history_size_results(stub_llm, rg_tasks):
    answers = _answers(rg_tasks)
    stub_llm.respond = lambda q, n: answers[q]
    harness = EvalHarness(ReasoningGymEnvironment, ChatCompletionsPolicy(stub_llm.url, "m"), rg_tasks, limit=1,
                          check_reproducibility=False)
    seen = []
    sched = EvalSchedule(harness, None, 1, lambda step, r: seen.append((step, r)), history_size=2)
    for step in range(5):
        sched.maybe_run(step)
    assert sched.evaluations == 5 and len(seen) == 5
    assert sched.history == seen[-2:]  # the two newest, oldest first; on_result got every one
    assert EvalSchedule(harness, None, 1, history_size=0).maybe_run(0) is not None


def test_bad_configuration_is_refused(stub_llm, rg_tasks):
    policy = ChatCompletionsPolicy(stub_llm.url, "m")
    for kwargs in ({"samples_per_task": 0}, {"concurrency": 0}, {"limit": 0}, {"seeds": []}, {"seeds": [1, 1]},
                   {"episode_timeout_s": 0}, {"samples_per_task": 2}):  # several samples at temperature 0
        with pytest.raises(ValueError):
            EvalHarness(ReasoningGymEnvironment, policy, rg_tasks, **kwargs)
    with pytest.raises(ValueError, match="no task in split 'dev'"):
        EvalHarness(ReasoningGymEnvironment, policy, rg_tasks, split="dev").plan()


@pytest.mark.slow
def test_ray_workers(tmp_path, stub_llm, rg_tasks):
    ray = pytest.importorskip("ray")
    answers = _answers(rg_tasks)
    stub_llm.respond = lambda q, n: answers[q]
    harness = EvalHarness(ReasoningGymEnvironment, ChatCompletionsPolicy(stub_llm.url, "m"), rg_tasks,
                          concurrency=2, ray_address="local", check_reproducibility=False)
    started_here = not ray.is_initialized()
    try:
        result = harness.run(tmp_path / "ray")
    finally:
        if started_here:
            ray.shutdown()
    assert result.scores["episodes"] == 6 and result.scores["success_rate"] == 1.0
    assert sum(stub_llm.calls.values()) == 6
    assert len((tmp_path / "ray" / "episodes.jsonl").read_text().splitlines()) == 6
