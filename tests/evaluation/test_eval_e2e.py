"""End to end: `envsched eval` against a real OpenEnv server (envsched's own pool environment, `openenv`
package, uvicorn on 127.0.0.1) and a local OpenAI-compatible policy stub whose answers the test controls.

Controlled outcomes (2 samples per task, seed 0), split "test":
  qa-0  answer right twice                         -> pass, 2/2
  qa-1  right, then wrong                          -> pass (1/2), pass@1 0.5, pass@2 1
  qa-2  wrong twice                                -> fail
  cs-3  reasoning-gym chain_sum, right twice       -> pass (scored by reasoning-gym's score_answer)
  qa-4  no reference answer                        -> unscored twice (reward None)
  qa-5  the policy answers with a malformed body   -> policy_error twice (not solved, error_rate)
The first run loses the OpenEnv server mid-run (stopped while qa-2 is being answered and left down):
the rest of the run is infrastructure errors. The server is restarted and the same command resumes;
during the resumed run the server is stopped and restarted again mid-episode, which the retries absorb.
"""

from __future__ import annotations

import json
import math
import threading

import pytest
from click.testing import CliRunner

pytest.importorskip("openenv.core.env_server")

from envsched.cli.main import cli
from envsched.envs.openenv_server import ServerThread, make_app, reasoning_gym_entry
from envsched.pool.pool import TaskPool

CS_TASK = {"id": "cs-3", "env": "reasoning_gym", "split": "test", "group": "chain_sum", "difficulty": 1,
           "initial_state": {"reasoning_gym": {"dataset": "chain_sum", "seed": 42,
                                               "config": {"min_terms": 3, "max_terms": 3}}}}


def _pool() -> TaskPool:
    qa = [("What is the capital of France?", "Paris"), ("What is 2 + 2?", "4"),
          ("What colour is a clear daytime sky?", "blue")]
    tasks = [{"id": f"qa-{i}", "env": "qa", "split": "test", "group": "trivia", "difficulty": 0,
              "initial_state": {"question": q, "answer": a}} for i, (q, a) in enumerate(qa)]
    tasks.append(CS_TASK)
    tasks.append({"id": "qa-4", "env": "qa", "split": "test", "group": "trivia", "difficulty": 0,
                  "initial_state": {"question": "What is your favourite number?"}})
    tasks.append({"id": "qa-5", "env": "qa", "split": "test", "group": "trivia", "difficulty": 0,
                  "initial_state": {"question": "Name a primary colour.", "answer": "red"}})
    tasks.append({"id": "train-0", "env": "qa", "split": "train",
                  "initial_state": {"question": "Train question?", "answer": "x"}})
    return TaskPool(tasks)


def _eval(runner: CliRunner, url: str, llm: str, out, *extra: str):
    args = ["eval", url, "--split", "test", "--llm-endpoint", llm, "--model", "stub-model", "--output-dir",
            str(out), "--samples-per-task", "2", "--seeds", "0", "--temperature", "0.7", "--concurrency", "1",
            "--episode-timeout", "20", *extra]
    res = runner.invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads((out / "result.json").read_text()), res.output


@pytest.mark.slow
def test_eval_end_to_end_with_infra_failure_and_resume(tmp_path, stub_llm):
    pool = _pool()
    server = ServerThread(make_app(pool, max_concurrent_envs=4)).start()
    cs_question = reasoning_gym_entry(CS_TASK, 0)[1]
    url = server.url + "/"  # a base URL as users paste it
    state = {"stop_on": "What colour is a clear daytime sky?", "restart": False}

    def respond(question: str, n: int):
        if question == state["stop_on"] and state["stop_on"] is not None:
            state["stop_on"] = None
            server.stop()  # the environment server goes away while this episode waits for the policy
            if state["restart"]:
                threading.Timer(0.3, server.start).start()
        if question.startswith("What is the capital"):
            return "Reasoning... <answer>Paris</answer>"
        if question.startswith("What is 2 + 2"):
            return "4" if n == 1 else "5"
        if question.startswith("What colour"):
            return "green"
        if question == cs_question["question"]:
            return f"<answer>{cs_question['answer']}</answer>"
        if question.startswith("What is your favourite"):
            return "7"
        if question.startswith("Name a primary"):
            return ("raw", 200, b"this is not JSON")
        raise AssertionError(f"unexpected question {question!r}")

    stub_llm.respond = respond
    runner = CliRunner()
    out = tmp_path / "run"
    try:
        # ---- run 1: the server disappears at qa-2 and stays down
        # (--stop-after 0: the circuit breaker would stop after 5 such episodes; here every one is recorded)
        r1, _ = _eval(runner, url, stub_llm.url, out, "--retries", "1", "--backoff", "0.05", "--stop-after", "0")
        s1 = r1["scores"]
        assert s1["episodes"] == 12 and s1["planned_episodes"] == 12
        assert s1["outcomes"]["infra_error"] == 8  # qa-2 .. qa-5, two samples each
        assert s1["infra_error_rate"] == pytest.approx(8 / 12)
        assert s1["scored"] == 4 and s1["successes"] == 3
        assert s1["success_rate"] == pytest.approx(0.75)  # infra errors are not failures
        assert r1["reproducible"] is True
        assert r1["per_task"]["qa-2"]["outcome"] == "infra_error"
        calls_before = dict(stub_llm.calls)
        lines1 = (out / "episodes.jsonl").read_text().splitlines()
        assert len(lines1) == 12

        # ---- run 2: restart, resume; the server is stopped and restarted again mid-episode (cs-3)
        server.start()
        state.update(stop_on=cs_question["question"], restart=True)
        r2, text = _eval(runner, url, stub_llm.url, out, "--retries", "5", "--backoff", "0.2")
        s2 = r2["scores"]
        # finished episodes were not re-run: qa-0 and qa-1 were asked exactly twice in total
        assert stub_llm.calls["What is the capital of France?"] == calls_before["What is the capital of France?"] == 2
        assert stub_llm.calls["What is 2 + 2?"] == 2
        assert stub_llm.calls[cs_question["question"]] == 3  # two samples + one retry after the restart
        lines2 = (out / "episodes.jsonl").read_text().splitlines()
        assert len(lines2) == 12 + 8  # the 8 infra errors re-ran; the result counts each episode once
        assert s2["episodes"] == 12 and s2["outcomes"]["infra_error"] == 0
        assert s2["outcomes"] == {"success": 5, "failure": 3, "limit": 0, "policy_error": 2, "unscored": 2,
                                  "infra_error": 0, "error": 0}
        assert s2["scored"] == 10 and s2["successes"] == 5
        assert s2["success_rate"] == pytest.approx(0.5)
        assert s2["success_rate_se"] == pytest.approx(math.sqrt(0.5 * 0.5 / 10))
        assert s2["mean_reward"] == pytest.approx(0.5)
        assert s2["unscored_rate"] == pytest.approx(2 / 12)
        assert s2["error_rate"] == pytest.approx(2 / 12)
        assert s2["infra_error_rate"] == 0
        # pass@k over (task, seed) problems with scored samples: qa-0 1, qa-1 .5/1, qa-2 0, cs-3 1, qa-5 0
        assert s2["pass@1"] == pytest.approx((1 + 0.5 + 0 + 1 + 0) / 5)
        assert s2["pass@2"] == pytest.approx((1 + 1 + 0 + 1 + 0) / 5)
        assert s2["pass@1_problems"] == 5
        # tokens from `usage`: every answered request reports 7; the malformed ones report nothing
        assert s2["mean_completion_tokens"] == pytest.approx(7.0)
        assert s2["mean_turns"] == pytest.approx(1.0)
        cs_rec = [json.loads(x) for x in lines2 if json.loads(x)["task_id"] == "cs-3"][-2:]
        attempts = sorted(r["attempts"] for r in cs_rec)
        assert attempts[0] == 1 and attempts[1] >= 2  # the lost session was retried on the restarted server
        per = r2["per_task"]
        assert {t: per[t]["outcome"] for t in per} == {"qa-0": "pass", "qa-1": "pass", "qa-2": "fail",
                                                        "cs-3": "pass", "qa-4": "unscored", "qa-5": "fail"}
        assert "train-0" not in per
        assert r2["by_group"]["chain_sum"]["success_rate"] == 1.0
        assert r2["by_group"]["trivia"]["scored"] == 8
        assert "success_rate" in text and "error_rate" in text

        # ---- a later checkpoint, compared with the first: qa-2 fixed, qa-0 regressed, qa-4 left out
        def respond2(question: str, n: int):
            if question.startswith("What colour"):
                return "Blue"
            if question.startswith("What is the capital"):
                return "Lyon"
            if question.startswith("What is 2 + 2"):
                return "4"
            return respond(question, n)

        stub_llm.respond = respond2
        out2 = tmp_path / "run2"
        r3, text3 = _eval(runner, url, stub_llm.url, out2, "--compare", str(out / "result.json"))
        cmp = json.loads((out2 / "comparison.json").read_text())
        assert cmp["fixed"] == ["qa-2"] and cmp["regressed"] == ["qa-0"]
        assert set(cmp["left_out"]) == {"qa-4"}
        assert r3["scores"]["success_rate"] == pytest.approx(0.6)  # qa-1, qa-2, cs-3 pass twice of 10 scored
        d = cmp["deltas"]["success_rate"]
        assert d["delta"] == pytest.approx(0.1)
        se = math.sqrt(0.25 / 10 + 0.24 / 10)
        assert d["se"] == pytest.approx(se) and d["z"] == pytest.approx(0.1 / se)
        assert d["significant"] is False and d["note"].startswith("within noise")
        assert "fixed (1): qa-2" in text3
    finally:
        server.stop()
