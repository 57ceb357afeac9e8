"""The chat-completions client (against the local stub), response parsing and the action adapters,
including BFCL multi-turn through the harness with the package's own checker."""

from __future__ import annotations

import pytest

from envsched.envs.base import InfrastructureError, StepResult
from envsched.evaluation import ChatCompletionsPolicy, EvalHarness, FunctionCallAdapter
from envsched.evaluation.policy import (
    AnswerAdapter,
    PolicyError,
    PolicyUnavailable,
    chat_completions_url,
    observation_text,
    parse_chat_response,
    parse_function_calls,
)


def test_endpoint_forms():
    assert chat_completions_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("https://h/x/v1/chat/completions") == "https://h/x/v1/chat/completions"
    for bad in ("127.0.0.1:8000", "ftp://h/", "http://h:notaport"):
        with pytest.raises(ValueError):
            chat_completions_url(bad)
    with pytest.raises(ValueError):
        ChatCompletionsPolicy("http://h:1", "")


def test_client_tokens_and_failure_classes(stub_llm):
    policy = ChatCompletionsPolicy(stub_llm.url, "m", temperature=0.3, max_tokens=9)
    stub_llm.respond = lambda q, n: f"echo {q}"
    r = policy.complete([{"role": "user", "content": "hi"}])
    assert (r.text, r.prompt_tokens, r.completion_tokens) == ("echo hi", 11, 7)
    sent = stub_llm.requests[-1]
    assert sent["model"] == "m" and sent["temperature"] == 0.3 and sent["max_tokens"] == 9
    for raw, kind in ((("raw", 200, b"<html>"), PolicyError), (("raw", 200, b'{"choices": []}'), PolicyError),
                      (("raw", 400, b"context too long"), PolicyError), (("raw", 503, b"busy"), PolicyUnavailable),
                      (("raw", 429, b"slow down"), PolicyUnavailable)):
        stub_llm.respond = lambda q, n, raw=raw: raw
        with pytest.raises(kind):
            policy.complete([{"role": "user", "content": "x"}])
    assert issubclass(PolicyUnavailable, InfrastructureError)
    stub_llm.close()
    with pytest.raises(PolicyUnavailable):
        policy.complete([{"role": "user", "content": "x"}], timeout_s=2)


def test_parse_response_and_tool_calls():
    r = parse_chat_response(b'{"choices": [{"message": {"content": null, "tool_calls": [{"function": '
                            b'{"name": "ls", "arguments": "{\\"a\\": 1}"}}]}}]}')
    assert parse_function_calls(r.text) == ["ls(a=1)"] and r.completion_tokens is None
    with pytest.raises(PolicyError):
        parse_chat_response(b'{"choices": [{"message": {"content": 3}}]}')


def test_answer_adapter():
    a = AnswerAdapter()
    assert a.to_action("thinking <answer>1</answer> more <answer> 42 </answer>", {}) == "42"
    assert a.to_action("  17 ", {}) == "17"
    with pytest.raises(PolicyError):
        a.to_action("   ", {})
    msgs = a.initial_messages({}, {"prompt": "What?", "metadata": {}})
    assert msgs[-1] == {"role": "user", "content": "What?"}
    assert observation_text({"x": 1}) == '{"x": 1}'
    assert a.feedback_message(StepResult("try again")) == {"role": "user", "content": "try again"}


def test_function_call_parsing():
    assert parse_function_calls("[cd(folder='a'), ls(a=True)]") == ["cd(folder='a')", "ls(a=True)"]
    assert parse_function_calls("```python\ncd(folder='a')\nls()\n```") == ["cd(folder='a')", "ls()"]
    assert parse_function_calls('[{"name": "mv", "arguments": {"source": "x", "destination": "y"}}]') == [
        "mv(source='x', destination='y')"]
    assert parse_function_calls("[]") == []
    for bad in ("[cd(folder=", "[1, 2]", "[f(x=open('a'))]"):
        with pytest.raises(PolicyError):
            parse_function_calls(bad)
    ad = FunctionCallAdapter()
    assert ad.to_action("All done, the file is moved.", {}) == []  # prose ends the turn
    with pytest.raises(PolicyError):
        ad.to_action("[mv(source='x'", {})


def test_bfcl_multi_turn_through_the_harness(stub_llm):
    bfcl = pytest.importorskip("envsched.envs.bfcl")
    if not bfcl.bfcl_available():
        pytest.skip("bfcl-eval is not installed")
    tasks = bfcl.build_bfcl_pool(["base"], split="test", limit=2)
    truth = {t["id"]: bfcl.ground_truth_calls(t) for t in tasks}

    def respond_for(task_id, corrupt):
        def respond(messages):
            users = [m["content"] for m in messages if m["role"] == "user"]
            if users[-1].startswith("Function results"):
                return "[]"
            turn = sum(not u.startswith("Function results") for u in users) - 1
            calls = list(truth[task_id][turn])
            if corrupt and calls:
                calls = calls[:-1]
            return "[" + ", ".join(calls) + "]"
        return respond

    current = {}
    stub_llm.respond = lambda q, n: current["fn"](stub_llm.requests[-1]["messages"])
    results = {}
    for corrupt in (False, True):
        for t in tasks:
            current["fn"] = respond_for(t["id"], corrupt)
            h = EvalHarness(bfcl.BFCLEnvironment, ChatCompletionsPolicy(stub_llm.url, "m"), [t],
                            adapter=FunctionCallAdapter(), max_turns=40, check_reproducibility=False)
            results[(t["id"], corrupt)] = h.run().scores
    for t in tasks:
        assert results[(t["id"], False)]["success_rate"] == 1.0  # ground truth scores full marks
        assert results[(t["id"], False)]["mean_turns"] > 2
        assert results[(t["id"], True)]["success_rate"] == 0.0  # a missing call fails the checker
