"""examples/prime_rl_orchestrator.py --smoke: the orchestrator entrypoint against the stand-in for prime-rl's
orchestrator module (prime-rl needs Python 3.12, vLLM and GPUs)."""

import pickle

import pytest

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

pytest.importorskip("verifiers.v1")


def test_prime_rl_entrypoint_smoke_run(run_example, tmp_path):
    s = run_example("prime_rl_orchestrator", ["--smoke", "--out", "run"], tmp_path)
    assert s["samplers"] == {env: "PrimeRLTaskSampler" for env in ("arithmetic", "calendar", "files", "shop")}
    assert s["observed_groups"] == {"first": 16, "resumed": 24}  # 4 x 4 groups, then 8 restored + 4 x 4
    assert s["resumed_steps"] == 6
    state = pickle.loads((tmp_path / "run" / "step_6" / "orchestrator.pkl").read_bytes())
    samplers = [env["sampler"] for env in state["train_source"]["envs"].values()]
    assert all(s["format"] == "envsched.prime_rl/1" for s in samplers)  # prime-rl's checkpoint holds envsched's
    assert sum(s["observed"] for s in samplers) == 24
