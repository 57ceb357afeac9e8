"""tau2-bench and ACEBench pool builders, reading the shared data folders (and upstream-style layouts)."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from envsched.envs.acebench import build_acebench_pool
from envsched.envs.tau2 import build_tau2_pool, find_tau2_domains
from envsched.pool import TaskPool

DATA = Path("/work/shared/data")
TAU2 = DATA / "tau2-bench"
ACE = DATA / "acebench"

pytestmark = pytest.mark.skipif(not (TAU2.is_dir() and ACE.is_dir()), reason="shared data folder not present")


def test_tau2_counts_and_fields() -> None:
    specs = build_tau2_pool(TAU2)
    pool = TaskPool(specs)
    assert len(pool) == 184
    assert pool.summary()["by_env"] == {"airline": 50, "retail": 114, "telecom": 20}
    missing = pool.missing_fields()
    assert missing["instruction"] == missing["tools"] == missing["verifier.checks"] == 0
    assert missing["verifier.code"] == 184  # the evaluator is tau2's code, not data
    upstream = Counter(s["tau2"]["upstream_split"] for s in specs)
    assert upstream == {"train": 104, "test": 60, "base": 20}  # telecom's small set is in neither split
    assert {s["split"] for s in specs} == {"train"}
    assert {s["split"] for s in build_tau2_pool(TAU2, ["airline"], split=None)} == {"train", "test"}


def test_tau2_checks_and_tools_come_from_the_files() -> None:
    specs = {s["id"]: s for s in build_tau2_pool(TAU2)}
    r0 = specs["tau2/retail/0"]
    assert r0["difficulty"] == 5
    assert any(c.startswith("expected agent action: exchange_delivered_order_items(order_id=\"#W2378156\"")
               for c in r0["verifier"]["checks"])
    assert "reward basis: DB, NL_ASSERTION" in r0["verifier"]["checks"]
    assert "Reason for call: You received your order #W2378156" in r0["instruction"]
    tools = {t["name"]: t for t in r0["tools"]}
    assert "exchange_delivered_order_items" in tools
    assert set(tools["exchange_delivered_order_items"]["parameters"]["properties"]) == {
        "order_id", "item_ids", "new_item_ids", "payment_method_id"}
    a0 = specs["tau2/airline/0"]
    assert "natural-language assertion (LLM judge): Agent should refuse to proceed with the cancellation." \
        in a0["verifier"]["checks"]
    assert a0["tau2"]["policy"].startswith("# Airline Agent Policy")
    tel = next(s for s in specs.values() if s["env"] == "telecom")
    assert any(c.startswith("environment assertion (user): assert_") for c in tel["verifier"]["checks"])
    assert "Ticket:" in tel["instruction"]
    assert "toggle_roaming" in {t["name"] for t in tel["tools"]}
    assert "user" in next(t for t in tel["tools"] if t["name"] == "toggle_roaming")["caller"]


def test_tau2_upstream_layout_and_bad_folders(tmp_path: Path) -> None:
    root = tmp_path / "tau2-bench"
    dom = root / "data" / "tau2" / "domains" / "airline"
    dom.mkdir(parents=True)
    shutil.copy(TAU2 / "airline" / "tasks.json", dom / "tasks.json")
    shutil.copy(TAU2 / "airline" / "policy.md", dom / "policy.md")
    assert list(find_tau2_domains(root)) == ["airline"]
    assert len(build_tau2_pool(root)) == 50
    with pytest.raises(FileNotFoundError, match="tau2 domain 'retail'"):
        build_tau2_pool(root, ["retail"])
    with pytest.raises(ValueError, match="unknown tau2 domain"):
        build_tau2_pool(root, ["banking"])
    with pytest.raises(FileNotFoundError, match="not found"):
        build_tau2_pool(tmp_path / "nope")


def test_tau2_empty_and_malformed(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no tau2-bench domain found"):
        build_tau2_pool(tmp_path / "empty")
    f = tmp_path / "file.json"
    f.write_text("[]")
    with pytest.raises(NotADirectoryError):
        build_tau2_pool(f)
    bad = tmp_path / "bad" / "retail"
    bad.mkdir(parents=True)
    (bad / "tasks.json").write_text("[{\"id\": \"0\",")
    with pytest.raises(ValueError, match=r"tasks\.json: invalid JSON"):
        build_tau2_pool(tmp_path / "bad")
    (bad / "tasks.json").write_text("{\"id\": \"0\"}")
    with pytest.raises(ValueError, match="expected a JSON list of task objects"):
        build_tau2_pool(tmp_path / "bad")


def test_acebench_counts_and_fields() -> None:
    specs = build_acebench_pool(ACE)
    pool = TaskPool(specs)
    assert len(pool) == 50
    assert pool.summary()["by_env"] == {"FoodPlatform": 18, "MessageApi": 8, "ReminderApi": 14, "Travel": 10}
    assert Counter(s["group"] for s in specs) == {"multi_step": 20, "multi_turn": 30}
    s0 = specs[0]
    assert s0["id"] == "acebench/agent_multi_step_0" and s0["env"] == "ReminderApi"
    assert "end state: FoodPlatform.logged_in_users == [\"Eve\"]" in s0["verifier"]["checks"]
    assert any(c.startswith("milestone 1: [login_food_platform(") for c in s0["verifier"]["checks"])
    assert {"send_message", "add_reminder"} <= {t["name"] for t in s0["tools"]}
    assert s0["initial_state"] == {"BaseApi": {"wifi": True, "logged_in": True}}
    assert pool.missing_fields()["tools"] == 0 and pool.missing_fields()["initial_state"] == 10  # travel: {}


def test_acebench_layouts_and_bad_folders(tmp_path: Path) -> None:
    up = tmp_path / "ACEBench" / "data_all" / "data_en"
    (up / "possible_answer").mkdir(parents=True)
    shutil.copy(ACE / "data_agent_multi_turn.json", up / "data_agent_multi_turn.json")
    with pytest.raises(FileNotFoundError, match=r"missing file .*possible_answer"):
        build_acebench_pool(tmp_path / "ACEBench")
    shutil.copy(ACE / "possible_answer" / "data_agent_multi_turn.json", up / "possible_answer")
    assert len(build_acebench_pool(tmp_path / "ACEBench")) == 30  # upstream layout, multi_turn only
    with pytest.raises(FileNotFoundError, match="missing file"):
        build_acebench_pool(tmp_path / "ACEBench", ["multi_step"])
    with pytest.raises(ValueError, match="unknown ACEBench subset"):
        build_acebench_pool(ACE, ["multi_hop"])
    with pytest.raises(FileNotFoundError, match="not found"):
        build_acebench_pool(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no ACEBench agent task file"):
        build_acebench_pool(tmp_path / "empty")
    (up / "data_agent_multi_turn.json").write_text("{\"id\": \"a\"}\nnot json\n")
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        build_acebench_pool(tmp_path / "ACEBench")
