"""Hostile answers against every reasoning-gym dataset whose own scorer evaluates text (issue 23, finding 1),
through ``score_task_answer``, ``ReasoningGymEnvironment.step`` and a real OpenEnv server over its WebSocket;
and BFCL's final check inside the episode deadline (finding 7).

Each crafted answer would create a marker file if anything evaluated it. The checks: the marker is never
created, every answer gets a reward no higher than a malformed answer's within a bounded time, and the
server's memory (with its scorer workers) stays bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from envsched.envs import safe_scoring
from envsched.envs.reasoning_gym import ReasoningGymEnvironment, build_reasoning_gym_pool, score_task_answer
from envsched.envs.safe_scoring import EVALUATING_DATASETS, UnsafeScorerError

HANG_GUARD_S = 60.0  # a generous bound per answer: a hang guard, not a speed target
RSS_BOUND = 2 * 2**30

_RAW_PAYLOADS: dict[str, str] = {
    "the exploit as reported": "__import__('os').system('id > {mark}') or [1]",
    "os.system": "__import__('os').system('touch {mark}')",
    "os.system in a list": "[__import__('os').system('touch {mark}')]",
    "os.system added to a term": "x + __import__('os').system('touch {mark}')",
    "open for writing": "open('{mark}', 'w').write('x') or [1]",
    "exec": "exec(\"open('{mark}', 'w')\") or [1]",
    "nested eval": "eval(\"__import__('os').system('touch {mark}')\")",
    "compile": "compile(\"open('{mark}', 'w')\", 'f', 'exec')",
    "subprocess": "__import__('subprocess').call(['touch', '{mark}'])",
    "builtins through globals": "globals()['__builtins__']['__import__']('os').system('touch {mark}')",
    "getattr": "getattr(__import__('os'), 'system')('touch {mark}')",
    "__class__ walk": "().__class__.__base__.__subclasses__()",
    "__subclasses__ to Popen": "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0]"
                               "(['touch', '{mark}'])",
    "__mro__ walk": "''.__class__.__mro__[1].__subclasses__()",
    "__globals__ chain": "x.__class__.__init__.__globals__['os'].system('touch {mark}')",
    "function __globals__": "sin.__globals__['__builtins__']",
    "lambda call": "(lambda: __import__('os').system('touch {mark}'))()",
    "bare lambda": "lambda x: x",
    "f-string": "f\"{{__import__('os').system('touch {mark}')}}\"",
    "walrus": "(y := __import__('os')).system('touch {mark}')",
    "list comprehension": "[__import__('os').system('touch {mark}') for _ in range(1)]",
    "generator throw": "(_ for _ in ()).throw(SystemExit)",
    "format walk": "'{{0.__class__.__mro__}}'.format(1)",
    "statement after semicolon": "1; __import__('os').system('touch {mark}')",
    "statement after newline": "1\n__import__('os').system('touch {mark}')",
    "line continuation": "__import__\\\n('os').system('touch {mark}')",
    "import statement": "import os",
    "breakpoint": "breakpoint()",
    "exit": "exit()",
    "dict holding a call": "{{'a': __import__('os').system('touch {mark}')}}",
    "set holding a call": "{{__import__('os').system('touch {mark}')}}",
    "tuple holding a call": "(__import__('os').system('touch {mark}'), 1)",
    "fullwidth __import__ (NFKC)": "__\uff49\uff4d\uff50\uff4f\uff52\uff54__('os').system('touch {mark}')",
    "cyrillic look-alike": "__\u0456mport__('os').system('touch {mark}')",
    "fullwidth digits": "\uff11\uff12\uff13",
    "mathematical bold x": "\U0001d431**2/2 + C",
    "sympy Symbol().__class__": "Symbol('x').__class__",
    "sympy S of text": "S(\"__import__('os').system('touch {mark}')\")",
    "sympify of text": "sympify(\"__import__('os').system('touch {mark}')\")",
    "parse_expr of text": "parse_expr(\"__import__('os').system('touch {mark}')\")",
    "lambdify of text": "lambdify(x, \"__import__('os').system('touch {mark}')\")(1)",
    "Function named __import__": "Function('__import__')('os')",
    "N of text": "N(\"__import__('os')\")",
    "var injection": "var('os')",
    "preview to a file": "preview(x, viewer='file', filename='{mark}')",
    "Symbol named __class__": "Symbol('__class__')",
    "sympy attribute": "x._print",
    "keyword argument": "sin(x, evaluate=False)",
    "star arguments": "sin(*[x])",
    "subscript": "x[0]",
    "string literal": "'x**2/2 + C'",
    "bytes literal": "b'\\x00'",
    "NUL byte": "[1]\x00",
    "huge power tower": "9**9**9",
    "huge power in a list": "[9**9**9]",
    "symbol to a huge power": "x**(9**9**9)",
    "huge power of two": "2**10**8",
    "factorial of a billion": "factorial(10**9)",
    "list repetition": "[1]*10**10",
    "string repetition": "'a'*10**10",
    "5,000 nested brackets": "[" * 5_000 + "]" * 5_000,
    "5,000 nested parentheses": "(" * 5_000 + "1" + ")" * 5_000,
    "100 nested parentheses": "(" * 100 + "x" + ")" * 100,
    "deep unary minus": "-" * 50_000 + "1",
    "2 MB string": "'" + "a" * 2_000_000 + "'",
    "100,000-digit number": "1" * 100_000,
    "100,000-term sum": "+".join(["x"] * 100_000),
    "complex power": "1j**1e10",
    "float overflow": "1e308*10",
    "nan": "float('nan')",
    "infinity literal": "1e999",
    "oo to the oo": "oo**oo",
    "division by zero": "1/0",
    "ellipsis": "...",
    "None": "None",
    "True": "True",
    "empty": "",
    "only spaces": "   ",
}


def _payloads(mark: Path) -> dict[str, str]:
    return {name: raw.replace("{mark}", str(mark)).replace("{{", "{").replace("}}", "}")
            for name, raw in _RAW_PAYLOADS.items()}


def test_the_suite_has_at_least_60_distinct_answers(tmp_path: Path) -> None:
    answers = list(_payloads(tmp_path / "m").values())
    assert len(set(answers)) == len(answers) >= 60


@pytest.fixture(scope="module")
def one_task_each() -> dict[str, dict]:
    specs = build_reasoning_gym_pool(sorted(EVALUATING_DATASETS), tasks_per_dataset=1, seed=11)
    return {s["env"]: s for s in specs}


def _check_dataset(spec: dict, mark: Path, score) -> tuple[float, str]:
    """Score every payload with ``score(answer)``; returns the slowest time and its payload."""
    floor = score("zzz not an answer")
    slowest = (0.0, "")
    for name, answer in _payloads(mark).items():
        started = time.monotonic()
        reward = score(answer)
        took = time.monotonic() - started
        slowest = max(slowest, (took, name))
        assert not mark.exists(), f"{spec['env']}: {name!r} created the marker file"
        assert reward is not None and 0.0 <= reward <= max(floor, 0.05), (spec["env"], name, reward, floor)
        assert took < HANG_GUARD_S, (spec["env"], name, took)
    return slowest


@pytest.mark.parametrize("dataset", sorted(EVALUATING_DATASETS))
@pytest.mark.hostile_budget(60)  # many inputs (or a deadline the test waits out) in one call
def test_score_task_answer_never_evaluates_a_hostile_answer(dataset: str, one_task_each: dict, tmp_path: Path
                                                            ) -> None:
    spec = one_task_each[dataset]
    took, name = _check_dataset(spec, tmp_path / "marker", lambda a: score_task_answer(spec, a))
    print(f"{dataset}: slowest answer {name!r} took {took:.2f}s")
    assert score_task_answer(spec, json.loads(json.dumps(_reference(spec)))) == 1.0  # still scores correctly


def _reference(spec: dict) -> str:
    from envsched.envs.reasoning_gym import regenerate_item

    return regenerate_item(spec)["answer"]


@pytest.mark.parametrize("dataset", sorted(EVALUATING_DATASETS))
@pytest.mark.hostile_budget(60)  # many inputs (or a deadline the test waits out) in one call
def test_the_environment_step_never_evaluates_a_hostile_answer(dataset: str, one_task_each: dict,
                                                               tmp_path: Path) -> None:
    spec = one_task_each[dataset]
    env = ReasoningGymEnvironment()

    def score(answer: str) -> float | None:
        env.reset(spec)
        result = env.step(answer)
        assert result.done
        return result.reward

    _check_dataset(spec, tmp_path / "marker", score)


@pytest.mark.slow
def test_the_scorer_worker_is_bounded_in_time(monkeypatch: pytest.MonkeyPatch, one_task_each: dict) -> None:
    """An answer the grammar accepts but SymPy cannot finish soon (reasoning-gym's own scorer would run it for
    more than 20 s) is killed at the budget and scores 0."""
    monkeypatch.setenv(safe_scoring.SCORER_TIMEOUT_ENV, "2")
    spec = one_task_each["simple_integration"]
    env = ReasoningGymEnvironment()
    env.reset(spec)
    started = time.monotonic()
    result = env.step("(x + 1)**100000 + (x + 2)**99999")
    assert time.monotonic() - started < HANG_GUARD_S
    assert result.reward == 0.0
    assert "longer than 2s" in result.info["scoring"]  # killed at the budget (it ran > 20 s when measured)
    assert score_task_answer(spec, _reference(spec)) == 1.0  # a fresh worker serves the next answer


def test_bad_scorer_budgets_are_refused(monkeypatch: pytest.MonkeyPatch, one_task_each: dict) -> None:
    spec = one_task_each["spiral_matrix"]
    for bad in ("0", "-1", "nan", "inf", "ten"):
        monkeypatch.setenv(safe_scoring.SCORER_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=safe_scoring.SCORER_TIMEOUT_ENV):
            score_task_answer(spec, "1 2")


def test_an_answer_over_the_length_cap_scores_zero_unscored(one_task_each: dict) -> None:
    spec = one_task_each["number_sorting"]
    env = ReasoningGymEnvironment()
    env.reset(spec)
    result = env.step(" " * (safe_scoring.MAX_ANSWER_CHARS + 1))
    assert result.reward == 0.0 and "more than" in result.info["scoring"]


def test_this_process_runs_no_scorer_and_arms_no_guard(one_task_each: dict) -> None:
    """Scoring happens in worker processes (the guard is armed there, envs/_guard.py and
    tests/hostile/test_guard_hostile.py): this process keeps evaluating, writing and importing freely."""
    from envsched.envs import _guard

    assert score_task_answer(one_task_each["spiral_matrix"], "[1]*3") == 0.0
    assert not _guard.armed()
    assert eval("1 + 1") == 2


# ---------------------------------------------------------------------------------------- unaudited datasets
@pytest.fixture
def unaudited_dataset():
    """A dataset registered at run time (so not audited), whose scorer evaluates its answer."""
    from dataclasses import dataclass

    from reasoning_gym import factory
    from reasoning_gym.dataset import ProceduralDataset

    @dataclass
    class EvilConfig:
        seed: int | None = None
        size: int = 2

        def validate(self) -> None:
            pass

    class EvilDataset(ProceduralDataset):
        def __init__(self, config: EvilConfig) -> None:
            super().__init__(config=config, seed=config.seed, size=config.size)

        def __getitem__(self, idx: int) -> dict:
            return {"question": "1 + 1?", "answer": "2", "metadata": {}}

        def score_answer(self, answer, entry) -> float:
            return 1.0 if str(eval(answer)) == entry["answer"] else 0.0

    name = "envsched_test_evaluating"
    factory.register_dataset(name, EvilDataset, EvilConfig)
    try:
        yield name
    finally:
        factory.DATASETS.pop(name, None)


def test_an_unaudited_dataset_is_refused_unless_the_operator_accepts_it(unaudited_dataset: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(safe_scoring.ALLOW_EVALUATING_ENV, raising=False)
    assert safe_scoring.scoring_kind(unaudited_dataset) == "unaudited"
    with pytest.raises(UnsafeScorerError, match=safe_scoring.ALLOW_EVALUATING_ENV):
        build_reasoning_gym_pool([unaudited_dataset], tasks_per_dataset=1)
    spec = build_reasoning_gym_pool([unaudited_dataset], tasks_per_dataset=1, allow_evaluating_scorers=True)[0]
    with pytest.raises(UnsafeScorerError, match="no safe scorer"):
        score_task_answer(spec, "2")
    with pytest.raises(UnsafeScorerError):
        ReasoningGymEnvironment().reset(spec)
    from envsched.envs.reasoning_gym import list_datasets, list_scorable_datasets

    assert unaudited_dataset in list_datasets()
    assert unaudited_dataset not in list_scorable_datasets()  # what datasets="all" builds
    assert unaudited_dataset in list_scorable_datasets(allow_evaluating_scorers=True)
    monkeypatch.setenv(safe_scoring.ALLOW_EVALUATING_ENV, "1")
    assert score_task_answer(spec, "1 + 1") == 1.0  # the operator accepted evaluation
    with pytest.raises(UnsafeScorerError):  # an explicit False wins over the environment variable
        score_task_answer(spec, "2", allow_evaluating_scorers=False)


def test_the_openenv_server_refuses_an_unaudited_dataset(unaudited_dataset: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from envsched.envs.openenv_server import AnswerEnvironment

    monkeypatch.delenv(safe_scoring.ALLOW_EVALUATING_ENV, raising=False)
    task = {"id": "u", "env": "qa", "initial_state": {"reasoning_gym": {"dataset": unaudited_dataset, "seed": 0}}}
    with pytest.raises(UnsafeScorerError, match="no safe scorer"):
        AnswerEnvironment().reset(task)


# ---------------------------------------------------------------------------------------- the OpenEnv server
def _rss_tree(pid: int) -> int:
    import psutil

    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total = max(total, child.memory_info().rss)
    return total


@pytest.fixture(scope="module")
def spiral_server(tmp_path_factory, uvicorn_app):
    """The server started as the docs say, on a pool file of spiral_matrix and simple_integration tasks,
    in a working directory where ``id > marker`` would write."""
    root = tmp_path_factory.mktemp("server")
    specs = build_reasoning_gym_pool(["spiral_matrix"], tasks_per_dataset=3, seed=5)
    for k, spec in enumerate(build_reasoning_gym_pool(["simple_integration"], tasks_per_dataset=2, seed=5)):
        specs.append({**spec, "index": 3 + k})  # indexes 3 and 4 of the split
    (root / "spiral.json").write_text(json.dumps(specs))
    env = {**os.environ, "ENVSCHED_OPENENV_POOL": str(root / "spiral.json")}
    env.pop(safe_scoring.ALLOW_EVALUATING_ENV, None)
    with uvicorn_app(env, cwd=root, timeout_s=120) as (proc, port):
        yield proc, port, root, specs


def _ws_episode(port: int, answer: str, index: int = 0) -> dict:
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{port}/ws", open_timeout=30, close_timeout=5, max_size=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"index": index}}))
        reset = json.loads(ws.recv(timeout=HANG_GUARD_S))
        assert reset.get("type") != "error", reset
        ws.send(json.dumps({"type": "step", "data": {"answer": answer}}))
        return json.loads(ws.recv(timeout=HANG_GUARD_S))


@pytest.mark.slow
@pytest.mark.hostile_budget(30)  # many inputs (or a deadline the test waits out) in one call
def test_the_reported_exploit_over_the_websocket_runs_nothing(spiral_server) -> None:
    _proc, port, root, _ = spiral_server
    reply = _ws_episode(port, "__import__('os').system('id > marker') or [1]")
    assert not (root / "marker").exists()
    assert reply["type"] == "observation", reply
    assert reply["data"]["reward"] == 0.0 and reply["data"]["done"] is True


@pytest.mark.parametrize("index", [1, 3], ids=["spiral_matrix", "simple_integration"])
def test_every_hostile_answer_over_the_websocket_scores_zero_and_memory_stays_bounded(spiral_server, index: int
                                                                                       ) -> None:
    proc, port, root, specs = spiral_server
    mark = root / "marker2"
    rss_before = _rss_tree(proc.pid)
    slowest = (0.0, "")
    refused: list[str] = []
    for name, answer in _payloads(mark).items():
        started = time.monotonic()
        reply = _ws_episode(port, answer, index=index)
        took = time.monotonic() - started
        slowest = max(slowest, (took, name))
        assert not mark.exists(), name
        assert took < HANG_GUARD_S, (name, took)
        if reply["type"] == "error":  # a message the server refuses outright (too large): no episode scored
            refused.append(name)
            continue
        assert reply["data"]["reward"] == 0.0, (name, reply)
    print(f"server: refused outright {refused}")
    assert len(refused) <= 3  # the rest were scored
    rss_after = _rss_tree(proc.pid)
    print(f"server: slowest answer {slowest[1]!r} took {slowest[0]:.2f}s; RSS {rss_before >> 20} -> "
          f"{rss_after >> 20} MiB")
    assert rss_after < RSS_BOUND
    assert proc.poll() is None  # still serving
    from envsched.envs.reasoning_gym import regenerate_item

    good = _ws_episode(port, regenerate_item(specs[index])["answer"], index=index)
    assert good["data"]["reward"] == 1.0


# ---------------------------------------------------------------------------------------- BFCL (finding 7)
@pytest.mark.slow
@pytest.mark.hostile_budget(30)  # many inputs (or a deadline the test waits out) in one call
def test_bfcl_final_check_ends_at_the_episode_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's case: an 8 s deadline and six 0.85 s calls; the final check replays them and ran the
    episode to 10.6 s. Now it is cut at the deadline and the episode is an infrastructure timeout."""
    pytest.importorskip("bfcl_eval", reason="needs bfcl-eval")
    from envsched.envs import bfcl
    from envsched.envs.base import InfrastructureError

    math_api = bfcl._bfcl().cls("MathAPI")
    real_add = math_api.add

    def slow_add(self, a, b):  # a slow call: the real one, 0.85 s later
        time.sleep(0.85)
        return real_add(self, a, b)

    monkeypatch.setattr(math_api, "add", slow_add)
    bfcl._CallWorker.clear_idle()  # workers forked before the patch would run the fast call
    env = bfcl.BFCLEnvironment()
    try:
        env.reset("multi_turn_base_15")  # GorillaFileSystem + MathAPI, 5 turns
        started = time.monotonic()
        env.set_deadline(started + 8.0)
        result = env.step([f"add(a={i}, b=1)" for i in range(6)])
        assert not result.done and json.loads(result.observation["results"][5]) == {"result": 6}
        with pytest.raises(bfcl.BFCLDeadlineExceeded, match="deadline passed during BFCL's final check") as info:
            for _ in range(5):
                env.step([])
        took = time.monotonic() - started
        assert isinstance(info.value, InfrastructureError)
        assert env.last_check.get("timeout") is True
        assert took < 9.9, took  # cut at the deadline; replaying the calls would take it past 10.2 s
    finally:
        env.close()
        bfcl._CallWorker.clear_idle()


def test_bfcl_final_check_within_the_deadline_still_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("bfcl_eval", reason="needs bfcl-eval")
    from envsched.envs import bfcl

    env = bfcl.BFCLEnvironment()
    try:
        env.reset("multi_turn_base_15")
        env.set_deadline(time.monotonic() + 120.0)
        result = None
        for _ in range(5):
            result = env.step([])
        assert result is not None and result.done and result.reward == 0.0  # scored, not cut
        assert "timeout" not in env.last_check
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.hostile_budget(30)  # many inputs (or a deadline the test waits out) in one call
def test_bfcl_deadline_in_the_evaluation_harness_is_an_infrastructure_timeout(monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    pytest.importorskip("bfcl_eval", reason="needs bfcl-eval")
    from envsched.envs import bfcl
    from envsched.evaluation.harness import EpisodeSettings, run_episode
    from envsched.evaluation.policy import FunctionCallAdapter, PolicyResponse

    math_api = bfcl._bfcl().cls("MathAPI")
    real_add = math_api.add

    def slow_add(self, a, b):
        time.sleep(0.85)
        return real_add(self, a, b)

    monkeypatch.setattr(math_api, "add", slow_add)
    bfcl._CallWorker.clear_idle()
    spec = next(s for s in bfcl.build_bfcl_pool(["base"]) if s["id"] == "bfcl/multi_turn_base_15")

    class SixSlowCalls:  # six calls in the first step, then a text reply at every turn
        def __init__(self) -> None:
            self.n = 0

        def complete(self, messages: object, *, timeout_s: float | None = None) -> PolicyResponse:
            self.n += 1
            if self.n == 1:
                return PolicyResponse(text="[" + ", ".join(f"add(a={i}, b=1)" for i in range(6)) + "]")
            return PolicyResponse(text="done")

    settings = EpisodeSettings(episode_timeout_s=8.0, max_retries=0, backoff_s=0.0, backoff_max_s=0.0)
    rec = run_episode(bfcl.BFCLEnvironment, SixSlowCalls(), FunctionCallAdapter(), spec, None, 0, settings,
                      sleep=lambda s: None)
    bfcl._CallWorker.clear_idle()
    assert rec.outcome == "infra_error" and rec.reward is None, (rec.outcome, rec.error)
    assert "deadline" in rec.error
    assert rec.duration_s < 9.9, rec.duration_s
