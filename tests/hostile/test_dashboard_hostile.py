"""A history store and a run file are data: crafted ones through `envsched report`, the live dashboard and the
store reader (issue 38, findings 4 and 5).

Every crafted store is a copy of a real SQLite store written by a real ``DurableSampler`` (draws with and
without leases, updates with unscored rollouts and costs, a discard with a reason, a reclaimed lease), edited
with ``sqlite3`` the way an attacker with the file would. Each case must be refused

* by the reader and the run index, through the database's JSON extraction and through Python's parsing alike,
  with one line that names the event (or the metadata, or the lease) and the field;
* by ``envsched report`` with exit status 1, that line and no report file;
* by the live dashboard's polling (the error shown on the page, one line);

and nothing beside the store may change: every file in the store's folder keeps its name, size and SHA-256 (a
read-only SQLite connection to a WAL store would otherwise leave ``STORE-wal`` and ``STORE-shm``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("starlette")
pytest.importorskip("plotly")

from envsched.cli.main import cli
from envsched.dashboard.app import Dashboard
from envsched.dashboard.model import RunIndex
from envsched.dashboard.reader import DashboardError, StoreReader
from envsched.dashboard.views import build_views
from envsched.method.run_file import MAX_RUN_JSON_DEPTH, MAX_RUN_LINE_BYTES
from envsched.pool import TaskPool
from envsched.samplers.simple import UniformSampler
from envsched.store import DurableSampler, HistoryStore

# the events of the base store (see _base_store)
BASE_PAYLOADS = {
    1: {"keys": ["e1/t0", "e0/t1", "e1/t2", "e0/t3"], "n": 4},
    2: {"costs": [2.0, 3.0, 4.0], "key": "e1/t0", "rewards": [1.0, 0.0, None]},
    3: {"costs": None, "key": "e0/t1", "rewards": [1.0, 1.0, 1.0]},
    4: {"key": "e1/t2", "reason": "env crashed"},
    5: {"keys": ["e0/t0", "e1/t1", "e0/t2"], "leases": ["L1", "L2", "L3"], "n": 3},
    6: {"costs": None, "key": "e0/t3", "rewards": [0.0, 0.5, 1.0]},
    7: {"costs": None, "key": "e0/t0", "lease": "L1", "rewards": [None, None, None]},
    8: {"key": "e1/t1", "lease": "L2", "reason": None, "reclaimed": True},
}


def _pool() -> TaskPool:
    return TaskPool([{"id": f"e{i % 2}/t{i // 2}", "env": f"e{i % 2}", "difficulty": i % 4,
                      "instruction": f"task {i}"} for i in range(8)])


@pytest.fixture(scope="module")
def base_store(tmp_path_factory) -> Path:
    """The store every case copies; its events are exactly :data:`BASE_PAYLOADS` (their keys, rewired)."""
    path = tmp_path_factory.mktemp("base") / "run.sqlite"
    pool = _pool()
    d = DurableSampler(UniformSampler(pool, seed=3), HistoryStore(path), group_size=3)
    a = d.sample(4)
    d.update(a[0], [1.0, 0.0, None], [2.0, 3.0, 4.0])
    d.update(a[1], [1.0, 1.0, 1.0])
    d.discard(a[2], reason="env crashed")
    b = d.sample(3, leases=["L1", "L2", "L3"])
    d.update(a[3], [0.0, 0.5, 1.0])
    d.update(b[0], [None, None, None], lease="L1")
    d.discard(b[1], lease="L2", reclaimed=True)
    d.close()
    conn = sqlite3.connect(path)
    keys = {1: [t["id"] for t in a], 5: [t["id"] for t in b]}
    BASE_PAYLOADS[1]["keys"], BASE_PAYLOADS[5]["keys"] = keys[1], keys[5]
    for seq, key in ((2, a[0]), (3, a[1]), (4, a[2]), (6, a[3]), (7, b[0]), (8, b[1])):
        BASE_PAYLOADS[seq]["key"] = key["id"]
    rows = dict(conn.execute("SELECT seq, payload FROM envsched_events").fetchall())
    conn.close()
    assert {s: json.loads(p) for s, p in rows.items()} == BASE_PAYLOADS
    assert sorted(os.listdir(path.parent)) == ["run.sqlite"]
    return path


def _listing(folder: Path) -> dict[str, tuple[int, str]]:
    return {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.iterdir())}


@dataclass
class Case:
    id: str
    sql: list[tuple[str, tuple[Any, ...]]]
    match: str


def _payload(seq: int, text: str) -> tuple[str, tuple[Any, ...]]:
    return ("UPDATE envsched_events SET payload = ? WHERE seq = ?", (text, seq))


def _field(seq: int, name: str, value: Any = ..., raw: str | None = None) -> tuple[str, tuple[Any, ...]]:
    """Event ``seq`` with field ``name`` set to ``value`` (``...``: removed; ``raw``: JSON text spliced in)."""
    data = dict(BASE_PAYLOADS[seq])
    data.pop(name, None)
    if raw is not None:
        data[name] = "@@RAW@@"
        return _payload(seq, json.dumps(data).replace('"@@RAW@@"', raw))
    if value is not ...:
        data[name] = value
    return _payload(seq, json.dumps(data))


def _meta(key: str, text: str) -> tuple[str, tuple[Any, ...]]:
    return ("UPDATE envsched_meta SET value = ? WHERE key = ?", (text, key))


def _seq(old: int, new: Any) -> tuple[str, tuple[Any, ...]]:
    return ("UPDATE envsched_events SET seq = ? WHERE seq = ?", (new, old))


DEEP = "[" * 5000 + "]" * 5000
DEEP_OBJECT = '{"a":' * 3000 + "1" + "}" * 3000

CASES = [
    # numbering: bounded work whatever the sequence numbers; a gap names the missing event
    Case("seq_far_ahead", [_seq(8, 2**62)], r"event 8 is missing \(the next event is 4611686018427387904\)"),
    Case("seq_gap", [_seq(3, 300)], r"event 3 is missing \(the next event is 4\)"),
    Case("first_event_deleted", [("DELETE FROM envsched_events WHERE seq = 1", ())], r"event 1 is missing"),
    Case("seq_negative", [_seq(1, -1)], r"event 1 is missing"),
    Case("seq_zero", [_seq(1, 0)], r"event 1 is missing"),
    Case("seq_text", [_seq(8, "eight")], r"after event 7 has the sequence number 'eight', which is not an integer"),
    Case("seq_real", [_seq(8, 7.5)], r"after event 7 has the sequence number 7\.5, which is not an integer"),
    Case("seq_blob", [_seq(8, b"\x08")], r"after event 7 has the sequence number b'\\x08'"),
    Case("kind_unknown", [("UPDATE envsched_events SET kind = 'evil' WHERE seq = 2", ())],
         r"event 2 has unknown kind 'evil'"),
    Case("kind_upper_case", [("UPDATE envsched_events SET kind = 'SAMPLE' WHERE seq = 1", ())],
         r"event 1 has unknown kind 'SAMPLE'"),
    Case("kind_empty", [("UPDATE envsched_events SET kind = '' WHERE seq = 3", ())], r"event 3 has unknown kind ''"),
    Case("created_text", [("UPDATE envsched_events SET created = 'yesterday' WHERE seq = 3", ())],
         r"event 3 \(update\): its time 'created' is a string \('yesterday'\)"),
    Case("created_infinite", [("UPDATE envsched_events SET created = 9e999 WHERE seq = 3", ())],
         r"event 3 \(update\): its time 'created' is the number inf"),
    # payloads that are not an event object
    Case("payload_not_json", [_payload(2, "not json")], r"event 2 \(update\): its payload is not valid JSON"),
    Case("payload_empty", [_payload(2, "")], r"event 2 \(update\): its payload is not valid JSON"),
    Case("payload_list", [_payload(2, "[1, 2]")],
         r"event 2 \(update\): its payload is a list of 2 \(\[1, 2\]\), expected a JSON object"),
    Case("payload_string", [_payload(1, '"keys"')], r"event 1 \(sample\): its payload is a string \('keys'\)"),
    Case("payload_number", [_payload(4, "5")], r"event 4 \(discard\): its payload is the number 5"),
    Case("payload_null", [_payload(2, "null")], r"event 2 \(update\): its payload is null"),
    Case("payload_deep_array", [_payload(2, DEEP)], r"event 2 \(update\): its payload is nested too deeply"),
    Case("payload_deep_object", [_payload(1, DEEP_OBJECT)], r"event 1 \(sample\): its payload is nested too deeply"),
    Case("payload_blob", [("UPDATE envsched_events SET payload = X'7B7D' WHERE seq = 2", ())],
         r"event 2 \(update\): field 'key' is missing"),
    Case("payload_binary", [("UPDATE envsched_events SET payload = X'FF00FE' WHERE seq = 2", ())],
         r"event 2 \(update\): its payload is not UTF-8 text"),
    Case("payload_nan_literal", [_field(6, "rewards", raw="[0.0, NaN]")],
         r"event 6 \(update\): field 'rewards'\[1\] is the number nan"),
    # a draw's fields
    Case("keys_string", [_field(1, "keys", "abc")], r"event 1 \(sample\): field 'keys' is a string \('abc'\)"),
    Case("keys_missing", [_field(1, "keys")], r"event 1 \(sample\): field 'keys' is missing"),
    Case("keys_number", [_field(1, "keys", 5)], r"event 1 \(sample\): field 'keys' is the number 5"),
    Case("keys_object", [_field(1, "keys", {"a": "b"})], r"event 1 \(sample\): field 'keys' is an object"),
    Case("keys_null", [_field(1, "keys", None)], r"event 1 \(sample\): field 'keys' is null"),
    Case("keys_item_number", [_field(5, "keys", ["a", 1, "b"])],
         r"event 5 \(sample\): field 'keys'\[1\] is the number 1"),
    Case("keys_item_null", [_field(1, "keys", [None])], r"event 1 \(sample\): field 'keys'\[0\] is null"),
    Case("keys_item_list", [_field(1, "keys", [["nested"]])], r"event 1 \(sample\): field 'keys'\[0\] is a list of 1"),
    Case("keys_item_object", [_field(1, "keys", [{"id": "x"}])], r"field 'keys'\[0\] is an object"),
    Case("keys_item_bool", [_field(1, "keys", [True])], r"event 1 \(sample\): field 'keys'\[0\] is a boolean"),
    Case("leases_string", [_field(5, "leases", "L1")], r"event 5 \(sample\): field 'leases' is a string \('L1'\)"),
    Case("leases_item_number", [_field(5, "leases", [1, "L2", "L3"])], r"field 'leases'\[0\] is the number 1"),
    Case("leases_too_few", [_field(5, "leases", ["L1"])],
         r"event 5 \(sample\): field 'leases' holds 1 lease ids for 3"),
    Case("leases_null", [_field(5, "leases", None)], r"event 5 \(sample\): field 'leases' is null"),
    # an update's fields
    Case("key_number", [_field(2, "key", 5)], r"event 2 \(update\): field 'key' is the number 5"),
    Case("key_missing", [_field(2, "key")], r"event 2 \(update\): field 'key' is missing"),
    Case("key_list", [_field(3, "key", ["e0/t1"])], r"event 3 \(update\): field 'key' is a list of 1"),
    Case("key_null", [_field(6, "key", None)], r"event 6 \(update\): field 'key' is null"),
    Case("lease_number", [_field(7, "lease", 7)], r"event 7 \(update\): field 'lease' is the number 7"),
    Case("lease_object", [_field(7, "lease", {"id": "L1"})], r"event 7 \(update\): field 'lease' is an object"),
    Case("rewards_string", [_field(2, "rewards", "1,0")], r"event 2 \(update\): field 'rewards' is a string \('1,0'\)"),
    Case("rewards_missing", [_field(2, "rewards")], r"event 2 \(update\): field 'rewards' is missing"),
    Case("rewards_number", [_field(3, "rewards", 1.0)], r"event 3 \(update\): field 'rewards' is the number 1\.0"),
    Case("rewards_null", [_field(3, "rewards", None)], r"event 3 \(update\): field 'rewards' is null"),
    Case("rewards_object", [_field(3, "rewards", {"0": 1})], r"event 3 \(update\): field 'rewards' is an object"),
    Case("rewards_item_string", [_field(2, "rewards", [1, "x", 0])], r"field 'rewards'\[1\] is a string \('x'\)"),
    Case("rewards_item_comma", [_field(2, "rewards", ["1,2"])], r"field 'rewards'\[0\] is a string \('1,2'\)"),
    Case("rewards_item_null_text", [_field(2, "rewards", ["null"])], r"field 'rewards'\[0\] is a string \('null'\)"),
    Case("rewards_item_inf", [_field(6, "rewards", raw="[1e999]")],
         r"event 6 \(update\): field 'rewards'\[0\] is the number inf"),
    Case("rewards_item_minus_inf", [_field(6, "rewards", raw="[0, -1e999]")],
         r"field 'rewards'\[1\] is the number -inf"),
    Case("rewards_item_bool", [_field(2, "rewards", [True])], r"event 2 \(update\): field 'rewards'\[0\] is a boolean"),
    Case("rewards_item_list", [_field(2, "rewards", [[1.0]])], r"field 'rewards'\[0\] is a list of 1"),
    Case("rewards_item_object", [_field(2, "rewards", [{"r": 1}])], r"field 'rewards'\[0\] is an object"),
    Case("costs_string", [_field(2, "costs", "2,3")], r"event 2 \(update\): field 'costs' is a string"),
    Case("costs_number", [_field(2, "costs", 9)], r"event 2 \(update\): field 'costs' is the number 9"),
    Case("costs_item_string", [_field(2, "costs", [2, "three"])],
         r"event 2 \(update\): field 'costs'\[1\] is a string"),
    Case("costs_item_inf", [_field(2, "costs", raw="[1e999]")],
         r"event 2 \(update\): field 'costs'\[0\] is the number inf"),
    # a discard's fields
    Case("reason_number", [_field(4, "reason", 5)], r"event 4 \(discard\): field 'reason' is the number 5"),
    Case("reason_list", [_field(4, "reason", ["crash"])], r"event 4 \(discard\): field 'reason' is a list of 1"),
    Case("reclaimed_string", [_field(8, "reclaimed", "yes")], r"event 8 \(discard\): field 'reclaimed' is a string"),
    Case("reclaimed_number", [_field(8, "reclaimed", 1)], r"event 8 \(discard\): field 'reclaimed' is the number 1"),
    Case("discard_key_null", [_field(4, "key", None)], r"event 4 \(discard\): field 'key' is null"),
    # the lease table
    Case("lease_issued_text", [("UPDATE envsched_leases SET issued_seq = 'x' WHERE lease = 'L1'", ())],
         r"lease 'L1' has the issuing event 'x', expected an event number"),
    Case("lease_outcome_unknown", [("UPDATE envsched_leases SET outcome = 'boom' WHERE lease = 'L3'", ())],
         r"a lease has the outcome 'boom', expected update, discard or reclaim"),
    # the metadata
    Case("tasks_not_json", [_meta("tasks", "not json")], r"metadata 'tasks' is not a JSON list of task objects"),
    Case("tasks_object", [_meta("tasks", '{"a": {"id": "x"}}')], r"metadata 'tasks' is not a JSON list"),
    Case("tasks_numbers", [_meta("tasks", "[1, 2, 3]")], r"metadata 'tasks' is not a JSON list of task objects"),
    Case("tasks_string", [_meta("tasks", '"tasks"')], r"metadata 'tasks' is not a JSON list"),
    Case("tasks_deep", [_meta("tasks", DEEP)], r"metadata 'tasks' is not a JSON list"),
    Case("reward_range_string", [_meta("reward_range", '"0 to 1"')], r"metadata 'reward_range' is a string"),
    Case("reward_range_reversed", [_meta("reward_range", "[1.0, 0.0]")], r"metadata 'reward_range' is a list of 2"),
    Case("reward_range_infinite", [_meta("reward_range", "[0.0, 1e999]")], r"metadata 'reward_range' is a list of 2"),
    Case("reward_range_three", [_meta("reward_range", "[0, 1, 2]")], r"metadata 'reward_range' is a list of 3"),
    Case("reward_range_text_items", [_meta("reward_range", '["0", "1"]')], r"metadata 'reward_range' is a list of 2"),
    Case("group_size_string", [_meta("group_size", '"3"')], r"metadata 'group_size' is a string \('3'\)"),
    Case("group_size_zero", [_meta("group_size", "0")], r"metadata 'group_size' is the number 0"),
    Case("group_size_fraction", [_meta("group_size", "2.5")], r"metadata 'group_size' is the number 2\.5"),
    Case("sampler_class_list", [_meta("sampler_class", "[1]")], r"metadata 'sampler_class' is a list of 1"),
    Case("format_other", [_meta("format", '"other/1"')], r"has format 'other/1', expected 'envsched.store/1'"),
    Case("format_missing", [("DELETE FROM envsched_meta WHERE key = 'format'", ())], r"has format None"),
    # the metadata is checked as the store itself checks it (envsched.store.schema.validate_meta)
    Case("store_id_missing", [("DELETE FROM envsched_meta WHERE key = 'store_id'", ())], r"metadata lacks 'store_id'"),
    Case("num_tasks_text", [_meta("num_tasks", '"8"')],
         r"metadata 'num_tasks' is a string \('8'\), expected an integer"),
    Case("meta_value_deep", [_meta("sampler_params", DEEP)], r"metadata 'sampler_params' is JSON nested too deeply"),
    Case("meta_value_not_json", [_meta("pool_fingerprint", "abc")], r"metadata 'pool_fingerprint' is not valid JSON"),
    # the tables themselves
    Case("events_table_dropped", [("DROP TABLE envsched_events", ())], r"no such table: envsched_events"),
    Case("meta_table_dropped", [("DROP TABLE envsched_meta", ())],
         r"is not an envsched history store \(no table envsched_meta\)"),
    Case("created_column_dropped", [("ALTER TABLE envsched_events DROP COLUMN created", ())],
         r"no such column: created"),
]


def _craft(folder: Path, base: Path, case: Case) -> Path:
    folder.mkdir()
    store = folder / "run.sqlite"
    shutil.copy(base, store)
    conn = sqlite3.connect(store)
    for sql, params in case.sql:
        conn.execute(sql, params)
    conn.commit()
    conn.close()
    assert sorted(os.listdir(folder)) == ["run.sqlite"]  # the edit left no WAL behind
    return store


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_crafted_store_is_refused_naming_the_event_and_nothing_changes(tmp_path, base_store, case):
    store = _craft(tmp_path / "store", base_store, case)
    before = _listing(store.parent)
    # the library: the database's extraction and Python's parsing name the same event and field
    for use_sql_json in (True, False):
        with pytest.raises(DashboardError, match=case.match) as info:
            reader = StoreReader(store, use_sql_json=use_sql_json)
            try:
                index = RunIndex(reader)
                index.refresh()
                build_views(index)
            finally:
                reader.close()
        assert re.search(r"^store .*run\.sqlite|run\.sqlite (is|has)", _one_line(str(info.value))), info.value
    # the CLI: exit status 1, one line, no report
    out = tmp_path / "report.html"
    res = CliRunner().invoke(cli, ["report", str(store), "--html", str(out)])
    assert res.exit_code == 1 and re.search(case.match, _one_line(res.output)), res.output
    assert not out.exists()
    # the live dashboard: the error is on the page, one line
    try:
        dash = Dashboard(str(store))
    except DashboardError as exc:
        assert re.search(case.match, _one_line(str(exc)))
    else:
        dash.tick()
        assert dash.error is not None and re.search(case.match, _one_line(dash.error)), dash.error
        assert dash.state()["error"] == dash.error and json.dumps(dash.state())
        dash.stop()
    assert _listing(store.parent) == before, "reading a crafted store changed or created a file beside it"


def test_the_untouched_store_is_read_and_leaves_nothing_beside_it(tmp_path, base_store):
    store = _craft(tmp_path / "store", base_store, Case("none", [], ""))
    before = _listing(store.parent)
    out = tmp_path / "report.html"
    res = CliRunner().invoke(cli, ["report", str(store), "--html", str(out)])
    assert res.exit_code == 0, res.output
    dash = Dashboard(str(store))
    dash.tick()
    assert dash.error is None and dash.index.seq == 8 and dash.index.num_steps == 2
    dash.stop()
    assert _listing(store.parent) == before


def test_events_before_a_damaged_one_stay_indexed(tmp_path, base_store):
    store = _craft(tmp_path / "store", base_store, Case("late", [_field(6, "rewards", "broken")], ""))
    reader = StoreReader(store)
    index = RunIndex(reader)
    with pytest.raises(DashboardError, match=r"event 6 \(update\): field 'rewards' is a string"):
        index.refresh()
    assert index.seq == 5 and index.num_steps == 2  # events 1-5 read, the damaged sixth named
    with pytest.raises(DashboardError, match=r"event 6 \(update\)"):  # and again, without reading 1-5 twice
        index.refresh()
    assert index.seq == 5 and build_views(index)["steps"] == 2
    reader.close()


def test_a_far_ahead_sequence_number_costs_one_bounded_read(tmp_path, base_store):
    """One event at seq 2**62 made the index walk the empty range 50,000 numbers at a time (the report was
    still running at 40 s; the live page stayed at 100 % of a core): now one read names the gap."""
    store = _craft(tmp_path / "store", base_store, Case("far", [_seq(8, 2**62)], ""))
    t0 = time.monotonic()
    dash = Dashboard(str(store), chunk=50_000)
    dash.tick()
    assert time.monotonic() - t0 < 10  # a guard against the unbounded walk, not a speed target
    assert "event 8 is missing" in (dash.error or "") and dash.index.seq == 7
    dash.stop()


# ---------------------------------------------------------------------------------------------- run files
class _Data(HTMLParser):
    """The report's embedded JSON."""

    def __init__(self) -> None:
        super().__init__()
        self.text, self._on = "", False

    def handle_starttag(self, tag, attrs):
        self._on = tag == "script" and dict(attrs).get("id") == "envsched-data"

    def handle_data(self, data):
        if self._on:
            self.text += data

    def handle_endtag(self, tag):
        self._on = False


def _pick(**changes: Any) -> dict[str, Any]:
    rec = {"format": "envsched.explain/1", "kind": "pick", "step": 0, "rank": 1, "task_id": "e0/t0", "env": "e0",
           "phase": "cold_start", "score": 0.5, "q": None, "novelty": 0.25, "predicted": {"variance": 0.1, "mean": 0.4}}
    rec.update(changes)
    return rec


def _jsonl(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


HEADER = json.dumps({"format": "envsched.explain/1", "kind": "header", "num_tasks": 8})

# run files with a line that no reader may take in: the report stops with the file and the line named
RUN_FILE_REFUSED = {
    "nested_100000": (_jsonl(HEADER, "[" * 100_000 + "]" * 100_000), r"line 2: the JSON is nested deeper than 64"),
    "nested_just_over": (_jsonl(HEADER, "[" * (MAX_RUN_JSON_DEPTH + 1) + "]" * (MAX_RUN_JSON_DEPTH + 1)),
                         r"line 2: the JSON is nested deeper than 64"),
    "nested_object_in_record": (_jsonl(json.dumps(_pick(coverage=None)).replace(
        '"coverage": null', '"coverage": ' + '{"a":' * 70 + "1" + "}" * 70)), r"line 1: the JSON is nested deeper"),
    "line_too_long": (_jsonl(HEADER, json.dumps("x" * MAX_RUN_LINE_BYTES)), r"line 2: the line is longer than 4194304"),
    "line_too_long_unfinished": (HEADER + "\n" + "y" * (MAX_RUN_LINE_BYTES + 5), r"line 2: the line is longer than"),
}


@pytest.mark.parametrize("name", sorted(RUN_FILE_REFUSED))
def test_report_refuses_a_run_file_line_over_the_caps(tmp_path, base_store, name):
    text, match = RUN_FILE_REFUSED[name]
    store = _craft(tmp_path / "store", base_store, Case("none", [], ""))
    run_file = store.parent / "run.jsonl"
    run_file.write_text(text)
    before = _listing(store.parent)
    out = tmp_path / "report.html"
    res = CliRunner().invoke(cli, ["report", str(store), "--run-file", str(run_file), "--html", str(out)])
    assert res.exit_code == 1 and re.search(match, _one_line(res.output)) and "run.jsonl" in res.output, res.output
    assert not out.exists()
    dash = Dashboard(str(store), run_file=str(run_file))
    dash.tick()
    assert dash.error is not None and re.search(match, dash.error)
    assert dash.index.seq == 8  # the store was read; only the run file stopped
    dash.stop()
    assert _listing(store.parent) == before


def _special(kind: str, folder: Path) -> tuple[Path, Any]:
    """A path that is not a regular file, and what to close afterwards."""
    path = folder / f"{kind}.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
        return path, None
    if kind == "socket":
        short = Path(tempfile.mkdtemp(dir="/tmp"))  # a socket's path must be short (108 bytes)
        path = short / "s.jsonl"
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        return path, s
    if kind == "dev_zero_link":
        path.symlink_to("/dev/zero")
        return path, None
    if kind == "dev_zero":
        return Path("/dev/zero"), None
    raise AssertionError(kind)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX special files")
@pytest.mark.parametrize("kind", ["fifo", "socket", "dev_zero", "dev_zero_link"])
def test_report_and_dashboard_refuse_a_run_file_that_is_not_a_regular_file(tmp_path, base_store, kind):
    store = _craft(tmp_path / "store", base_store, Case("none", [], ""))
    path, handle = _special(kind, tmp_path)
    try:
        out = tmp_path / "report.html"
        res = CliRunner().invoke(cli, ["report", str(store), "--run-file", str(path), "--html", str(out)])
        assert res.exit_code == 2 and "is not a regular file" in res.output and not out.exists(), res.output
        with pytest.raises(ValueError, match="is not a regular file"):
            Dashboard(str(store), run_file=str(path))
    finally:
        if handle is not None:
            handle.close()


# run-file lines a reader skips or reads around: each field of the wrong type reads as absent; the report is
# written, valid JSON, and counts the lines that are not records
def _report_data(tmp_path: Path, base_store: Path, lines: list[str]) -> dict[str, Any]:
    store = _craft(tmp_path / "store", base_store, Case("none", [], ""))
    run_file = store.parent / "run.jsonl"
    run_file.write_bytes("".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape"))
    before = _listing(store.parent)
    out = tmp_path / "report.html"
    res = CliRunner().invoke(cli, ["report", str(store), "--run-file", str(run_file), "--html", str(out)])
    assert res.exit_code == 0, res.output
    assert _listing(store.parent) == before
    scan = _Data()
    scan.feed(out.read_text(encoding="utf-8"))
    return json.loads(scan.text)


SKIPPED_LINES = {
    "invalid_utf8": "\udcff\udcfe{}",
    "invalid_json": "{not json",
    "step_huge": json.dumps(_pick(step=10**30)),
    "step_negative": json.dumps(_pick(step=-1)),
    "step_bool": json.dumps(_pick(step=True)),
    "step_text": json.dumps(_pick(step="0")),
    "task_id_number": json.dumps(_pick(task_id=5)),
    "wrong_format": json.dumps({**_pick(), "format": "envsched.explain/9"}),
    "not_an_object": json.dumps([_pick()]),
    "kind_unknown": json.dumps(_pick(kind="pock")),
}


@pytest.mark.parametrize("name", sorted(SKIPPED_LINES))
def test_report_skips_a_run_file_line_that_is_not_a_record(tmp_path, base_store, name):
    data = _report_data(tmp_path, base_store, [HEADER, SKIPPED_LINES[name], json.dumps(_pick(step=1))])
    summary = data["views"]["summary"]
    assert summary["explained_picks"] == 1
    assert "1 lines of the run file are not explanation records (skipped)" in summary["warnings"]


CLEANED_FIELDS: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], bool]]] = {
    "q_nan": ({"q": float("nan")}, lambda row: row["q"] is None),
    "score_infinite": ({"score": float("inf"), "q": float("-inf")}, lambda row: row["q"] is None),
    "q_text": ({"q": "high"}, lambda row: row["q"] is None),
    "predicted_text": ({"predicted": "soon"}, lambda row: row["predicted_variance"] is None),
    "predicted_variance_text": ({"predicted": {"variance": "high"}}, lambda row: row["predicted_variance"] is None),
    "predicted_variance_bool": ({"predicted": {"variance": True}}, lambda row: row["predicted_variance"] is None),
    "rank_text": ({"rank": "first"}, lambda row: isinstance(row["rank"], int)),
    "rank_huge": ({"rank": 10**40}, lambda row: row["rank"] < 2**31),
    "phase_object": ({"phase": {"x": "y" * 10_000}}, lambda row: len(row["phase"]) <= 40),
    "novelty_text": ({"novelty": "very"}, lambda row: not any("novelty" in r for r in row["reasons"])),
    "relations_number": ({"relations": 5}, lambda row: not any("estimate" in r for r in row["reasons"])),
    "relation_estimate_text": ({"relations": {"within": {"used": True, "estimate": "x"}}},
                               lambda row: not any("within" in r for r in row["reasons"])),
    "coverage_list": ({"coverage": [1, 2]}, lambda row: not any("env picked" in r for r in row["reasons"])),
    "caps_text": ({"caps": "all"}, lambda row: not any("cap " in r for r in row["reasons"])),
    "cap_counts_objects": ({"caps": {"c": {"reached": True, "count": {"a": 1}, "limit": [2]}}},
                           lambda row: "cap c reached ({'a': 1}/[2])" in row["reasons"]),
    "relaxed_number": ({"relaxed": 7}, lambda row: "relaxed to fill the batch: 7" in row["reasons"]),
    "filters_list": ({"filters": ["progress"]}, lambda row: not any("filter" in r for r in row["reasons"])),
    "identifier_reason_long": ({"filters": {"identifier": {"flagged": True, "reason": "r" * 5000}}},
                               lambda row: max(len(r) for r in row["reasons"]) < 260),
    "similarity_text": ({"similarity": {"max_similarity": "high"}},
                        lambda row: not any("similarity" in r for r in row["reasons"])),
    "markup_in_reason": ({"filters": {"identifier": {"flagged": True, "reason": "<script>alert(1)</script>"}}},
                         lambda row: "identifier filter: <script>alert(1)</script>" in row["reasons"]),
}


@pytest.mark.parametrize("name", sorted(CLEANED_FIELDS))
def test_report_reads_a_field_of_the_wrong_type_as_absent(tmp_path, base_store, name):
    changes, check = CLEANED_FIELDS[name]
    task = BASE_PAYLOADS[1]["keys"][0]  # drawn at step 1 (the run file's step 0)
    line = json.dumps(_pick(task_id=task, **changes))  # NaN and Infinity as Python writes them (Python reads them)
    data = _report_data(tmp_path, base_store, [HEADER, line])
    assert data["views"]["summary"]["explained_picks"] == 1 and data["views"]["summary"]["warnings"] == []
    rows = [r for r in data["picks"] if r["step"] == 1 and r["task_id"] == task]
    assert len(rows) == 1 and rows[0]["phase"] is not None and check(rows[0]), rows


# ---------------------------------------------------------------------------------------------- secrets in store URLs
SECRET_URLS = [
    "postgresql://u:S3cretPw@127.0.0.1:{port}/db",
    "postgresql://u@127.0.0.1:{port}/db?password=S3cretPw",
    "postgresql://u@127.0.0.1:{port}/db?sslmode=disable&sslpassword=S3cretPw",
    "postgres://u:S3cret%2FPw@127.0.0.1:{port}/db?password=S3cretPw",
]
COMMANDS = {
    "report": lambda url, tmp: ["report", url, "--html", str(tmp / "r.html")],
    "dashboard": lambda url, tmp: ["dashboard", url, "--port", "0"],
    "store_info": lambda url, tmp: ["store", "info", url],
    "store_verify": lambda url, tmp: ["store", "verify", url],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("url", SECRET_URLS)
def test_a_store_urls_password_never_reaches_the_cli_output(tmp_path, command, url):
    pytest.importorskip("psycopg")
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there: every command fails to connect and says so
    res = CliRunner().invoke(cli, COMMANDS[command](url.format(port=port), tmp_path))
    assert res.exit_code == 1, res.output
    assert "S3cret" not in res.output and "***" in res.output and f"127.0.0.1:{port}" in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "r.html").exists()
