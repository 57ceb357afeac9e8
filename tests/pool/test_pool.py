import json

import numpy as np
import pytest

from envsched.pool import TaskPool, TaskSpecError, task_key, validate_task_spec


def spec(i, env="e0", **kw):
    return {"id": f"t{i}", "env": env, **kw}


def test_pool_indexes_by_id_and_env():
    pool = TaskPool([spec(0, "b"), spec(1, "a"), spec(2, "b")])
    assert len(pool) == 3
    assert pool.ids == ["t0", "t1", "t2"]
    assert pool.envs == ["a", "b"]
    assert pool.env_codes.tolist() == [1, 0, 1]
    assert [t["id"] for t in pool.by_env("b")] == ["t0", "t2"]
    assert pool.index_of("t2") == 2
    assert pool.get("t1")["env"] == "a"
    assert "t1" in pool and "t9" not in pool
    with pytest.raises(KeyError, match="unknown task id 't9'"):
        pool.get("t9")
    with pytest.raises(KeyError, match="unknown environment 'zz'"):
        pool.by_env("zz")


def test_missing_fields_are_counted_not_errors():
    pool = TaskPool([
        spec(0, instruction="x", tools=[{"name": "f", "description": "d"}], verifier={"checks": ["c"]}),
        spec(1, instruction="", verifier={"code": "def f(): pass"}),
        spec(2),
    ])
    missing = pool.missing_fields()
    assert missing["instruction"] == 2
    assert missing["tools"] == 2
    assert missing["initial_state"] == 3
    assert missing["verifier"] == 1
    assert missing["verifier.checks"] == 2
    assert missing["verifier.code"] == 2


@pytest.mark.parametrize(("bad", "field", "fragment"), [
    ({"env": "e"}, "id", "missing required field 'id'"),
    ({"id": "x"}, "env", "missing required field 'env'"),
    ({"id": 3, "env": "e"}, "id", "must be a string, got int"),
    ({"id": "x", "env": ""}, "env", "non-empty"),
    ({"id": "x", "env": "e", "index": -1}, "index", "non-negative integer"),
    ({"id": "x", "env": "e", "index": True}, "index", "non-negative integer"),
    ({"id": "x", "env": "e", "difficulty": "hard"}, "difficulty", "finite number"),
    ({"id": "x", "env": "e", "difficulty": float("nan")}, "difficulty", "finite number"),
    ({"id": "x", "env": "e", "tools": "f"}, "tools", "list of objects"),
    ({"id": "x", "env": "e", "tools": [{"description": "no name"}]}, "tools",
     "tools[0] needs a non-empty string 'name'"),
    ({"id": "x", "env": "e", "verifier": ["c"]}, "verifier", "must be an object"),
    ({"id": "x", "env": "e", "verifier": {"checks": [1]}}, "verifier", "list of strings"),
    ({"id": "x", "env": "e", "group": 5}, "group", "must be a string"),
])
def test_validation_names_the_field(bad, field, fragment):
    with pytest.raises(TaskSpecError) as info:
        validate_task_spec(bad, source="f.jsonl", line=7)
    assert info.value.field == field
    assert info.value.line == 7
    assert fragment in str(info.value)
    assert str(info.value).startswith("f.jsonl, line 7")


def test_jsonl_errors_name_file_line_and_field(tmp_path):
    path = tmp_path / "pool.jsonl"
    path.write_text('{"id": "a", "env": "e"}\n\n{"id": "b", "env": "e"}\n{"id": "a", "env": "f"}\n')
    with pytest.raises(TaskSpecError) as info:
        TaskPool.from_file(path)
    assert info.value.line == 4  # blank line 2 still counts as a line
    assert info.value.field == "id"
    assert "duplicate task id 'a' (first at line 1)" in str(info.value)
    assert str(path) in str(info.value)


def test_truncated_jsonl_and_bad_encoding(tmp_path):
    trunc = tmp_path / "t.jsonl"
    trunc.write_text('{"id": "a", "env": "e"}\n{"id": "b", "en')
    with pytest.raises(TaskSpecError, match=r"line 2: invalid JSON"):
        TaskPool.from_file(trunc)
    latin = tmp_path / "l.jsonl"
    latin.write_bytes(b'{"id": "a", "env": "e"}\n{"id": "caf\xe9", "env": "e"}\n')
    with pytest.raises(TaskSpecError, match=r"line 2: not valid UTF-8"):
        TaskPool.from_file(latin)
    huge = tmp_path / "h.jsonl"
    huge.write_text('{"id": "a", "env": "e", "instruction": "' + "x" * 5000 + '"}\n')
    with pytest.raises(TaskSpecError, match="line 1: line longer than 1000 bytes"):
        TaskPool.from_file(huge, max_line_bytes=1000)
    deep = tmp_path / "d.jsonl"
    deep.write_text('{"id": "a", "env": "e", "initial_state": ' + "[" * 100000 + "]" * 100000 + "}\n")
    with pytest.raises(TaskSpecError, match="line 1: JSON nested too deeply"):
        TaskPool.from_file(deep)
    not_obj = tmp_path / "n.jsonl"
    not_obj.write_text('[1, 2]\n')
    with pytest.raises(TaskSpecError, match="line 1: each line must be a JSON object, got list"):
        TaskPool.from_file(not_obj)


def test_json_file_forms_and_reward_range(tmp_path):
    as_list = tmp_path / "a.json"
    as_list.write_text(json.dumps([spec(0), spec(1, "e1")]))
    assert TaskPool.from_file(as_list).envs == ["e0", "e1"]
    as_obj = tmp_path / "b.json"
    as_obj.write_text(json.dumps({"name": "mine", "reward_range": [-1, 1], "tasks": [spec(0)]}))
    pool = TaskPool.from_file(as_obj)
    assert pool.name == "mine" and pool.reward_range == (-1.0, 1.0)
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"items": []}))
    with pytest.raises(TaskSpecError, match="must be a list of task specs or an object with a 'tasks' list"):
        TaskPool.from_file(bad)
    with pytest.raises(FileNotFoundError, match="task pool file not found"):
        TaskPool.from_file(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="low < high"):
        TaskPool([spec(0)], reward_range=(1, 0))


def test_roundtrip_and_fingerprint(tmp_path):
    pool = TaskPool([spec(i, f"e{i % 3}", instruction=f"do {i}", difficulty=i % 2) for i in range(20)])
    out = pool.to_jsonl(tmp_path / "sub" / "p.jsonl")
    again = TaskPool.from_file(out)
    assert again.ids == pool.ids
    assert again.fingerprint() == pool.fingerprint()
    changed = TaskPool([*list(pool)[:-1], spec(19, "e0", instruction="other")])
    assert changed.fingerprint() != pool.fingerprint()
    assert list(tmp_path.joinpath("sub").iterdir()) == [out]  # no temporary left behind


def test_extend_and_filter_return_new_pools():
    pool = TaskPool([spec(0, split="train"), spec(1, "e1", split="test")])
    bigger = pool.extend([spec(2, "e2")])
    assert len(pool) == 2 and len(bigger) == 3
    with pytest.raises(TaskSpecError, match="duplicate task id 't0'"):
        pool.extend([spec(0)])
    assert len(pool) == 2
    assert pool.filter(split="test").ids == ["t1"]
    assert pool.filter(envs=["e0"]).ids == ["t0"]
    with pytest.raises(KeyError, match="unknown environment"):
        pool.filter(envs=["nope"])
    summary = bigger.summary()
    assert summary["by_env"] == {"e0": 1, "e1": 1, "e2": 1}
    assert summary["by_split"] == {"train": 1, "test": 1, "(none)": 1}


def test_nothing_half_loaded_on_error():
    tasks = [spec(0), spec(1), {"id": "t2"}]
    with pytest.raises(TaskSpecError, match="<iterable>, item 3, field 'env'"):
        TaskPool(tasks)


def test_task_key():
    assert task_key({"id": "a"}) == "a"
    assert task_key({"split": "test", "index": 3}) == "test/3"
    with pytest.raises(KeyError, match="no 'id'"):
        task_key({"question": "?"})
    assert np.array_equal(TaskPool([spec(0)]).env_codes, [0])
