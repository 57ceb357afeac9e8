"""The dashboard's read-only store reader and run index, on real stores written by DurableSampler."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time

import numpy as np
import pytest

from envsched.dashboard.model import RunIndex
from envsched.dashboard.reader import DashboardError, StoreReader
from envsched.dashboard.views import build_views, metrics, pick_rows, uniform_envs_expected
from envsched.samplers.simple import UniformSampler
from envsched.store import DurableSampler, HistoryStore

from .conftest import make_pool


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mixed_store(path):
    """A store with every kind of event: draws with and without leases, updates with unscored rollouts and
    costs, a discard with a reason, a reclaimed lease."""
    pool = make_pool(4, 5)
    d = DurableSampler(UniformSampler(pool, seed=3), HistoryStore(path), group_size=3)
    a = d.sample(4)
    d.update(a[0], [1.0, 0.0, None], [2.0, 3.0, 4.0])
    d.update(a[1], [1.0, 1.0, 1.0])
    d.discard(a[2], reason="env crashed")
    b = d.sample(3, leases=["L1", "L2", "L3"])
    d.update(a[3], [0.0, 0.5, 1.0])  # late: a later batch was drawn before it arrived
    d.update(b[0], [None, None, None], lease="L1")
    d.discard(b[1], lease="L2", reclaimed=True)
    return d, pool, a, b


def test_sql_extraction_equals_python_parsing(tmp_path):
    d, *_ = _mixed_store(tmp_path / "s.sqlite")
    d.close()
    sql = StoreReader(tmp_path / "s.sqlite").events(0)
    py = StoreReader(tmp_path / "s.sqlite", use_sql_json=False).events(0)
    assert sql.upto == py.upto == 8
    assert [tuple(r) for r in sql.samples] == [tuple(r) for r in py.samples]
    assert [tuple(r) for r in sql.discards] == [(a, b, c, d_, e, bool(f)) for a, b, c, d_, e, f in py.discards]
    assert len(sql.updates) == len(py.updates) == 4
    for s, p in zip(sql.updates, py.updates, strict=True):
        assert s[:6] == p[:6]
        assert s[6:] == pytest.approx(p[6:])
    assert sql.leases == py.leases == {"L1": 5, "L2": 5}
    assert StoreReader(tmp_path / "s.sqlite").tasks() == StoreReader(tmp_path / "s.sqlite", use_sql_json=False).tasks()


def test_index_attributes_updates_to_their_draw_and_matches_the_samplers_metrics(tmp_path):
    d, *_ = _mixed_store(tmp_path / "s.sqlite")
    ix = RunIndex(StoreReader(tmp_path / "s.sqlite"))
    ix.refresh()
    snap = ix.snapshot()
    assert ix.num_steps == 2 and list(snap["steps"]["n"]) == [4, 3]
    # closes in log order: update a0, update a1, discard a2, update a3 (late), update b0 (lease), reclaim b1
    assert list(snap["c_step"]) == [1, 1, 1, 1, 2, 2]
    assert list(snap["c_lag"]) == [0, 0, 0, 1, 0, 0]
    assert list(snap["closes"]["kind"]) == [0, 0, 1, 0, 0, 2]
    assert list(snap["closes"]["signal"]) == [True, False, False, True, False, False]
    assert snap["closes"]["var"][0] == pytest.approx(0.25) and snap["closes"]["var"][3] == pytest.approx(1 / 6)
    m = metrics(ix, snap)
    want = d.metrics()
    for key in ("groups", "signal_groups", "episodes", "unscored_episodes", "cost", "signal_groups_per_episode",
                "zero_signal_fraction", "dispatched_groups", "discarded_groups", "outstanding_groups",
                "last_batch_size", "last_batch_envs", "store_events", "reclaimed_groups", "open_leases"):
        assert m[key] == pytest.approx(want[key]), key
    assert m["late_updates"] == 1 and m["outstanding_groups"] == 1 and m["open_leases"] == 1
    assert ix.discard_reasons == {"env crashed": 1, "reclaimed (lease expired)": 1}
    d.close()


def test_reader_is_read_only_and_never_blocks_the_writer(tmp_path, run_writer):
    path = tmp_path / "run.sqlite"
    w = run_writer(path, None, sampler="uniform", batch_size=6).run(3)
    before = _digest(path)
    reader = StoreReader(path)
    ix = RunIndex(reader)
    ix.refresh()
    assert ix.num_steps == 3
    conn = reader._sqlite_connect()  # the connection each read opens
    with pytest.raises(sqlite3.OperationalError, match=r"readonly|read-only|query_only|attempt to write"):
        conn.execute(f"DELETE FROM {reader.tables.events}")
    conn.close()
    # the writer commits while the reader's connection is open and reading in another thread
    stop = threading.Event()

    def keep_reading() -> None:
        while not stop.is_set():
            reader.head()

    t = threading.Thread(target=keep_reading)
    t.start()
    try:
        t0 = time.monotonic()
        w.run(2)
        assert time.monotonic() - t0 < 60  # a guard against a hang, not a speed test
    finally:
        stop.set()
        t.join()
    assert ix.refresh() and ix.num_steps == 5
    assert ix.refresh() is False  # nothing new
    w.close()
    reader.close()
    # a reader alone changes nothing in the file
    before = _digest(path)
    r2 = StoreReader(path)
    RunIndex(r2).refresh()
    r2.close()
    assert _digest(path) == before


def test_missing_or_foreign_store_is_a_clear_error_and_creates_nothing(tmp_path):
    missing = tmp_path / "nope.sqlite"
    with pytest.raises(DashboardError, match="store not found"):
        StoreReader(missing)
    assert not missing.exists()
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(DashboardError, match="not an envsched history store"):
        StoreReader(other)
    with pytest.raises(DashboardError, match="directory"):
        StoreReader(tmp_path)
    with pytest.raises(DashboardError, match="unsupported store URL"):
        StoreReader("mysql://x/y")


def test_uniform_expectation_is_the_hypergeometric_one():
    sizes = np.array([5, 5])
    # a batch of 1 covers exactly one environment; a batch of 6 from 2 x 5 always covers both
    assert uniform_envs_expected(sizes, 1) == pytest.approx(1.0)
    assert uniform_envs_expected(sizes, 6) == pytest.approx(2.0)
    # batch of 2: P(both from the same env) = 2 * C(5,2) / C(10,2) = 20/45
    assert uniform_envs_expected(sizes, 2) == pytest.approx(2 - 20 / 45)


def test_coverage_counts_each_environment_per_step(tmp_path, run_writer):
    path = tmp_path / "run.sqlite"
    w = run_writer(path, None, sampler="uniform", batch_size=6).run(4)
    ix = RunIndex(StoreReader(path))
    ix.refresh()
    views = build_views(ix)
    heat = views["figures"]["coverage"]["data"][0]
    assert heat["x"] == [1, 2, 3, 4]
    events = HistoryStore(path).events()
    draws = [e.payload["keys"] for e in events if e.kind == "sample"]
    env_of = {t["id"]: t["env"] for t in w.pool}
    for step, keys in enumerate(draws):
        for row, env in enumerate(ix.envs):
            share = sum(env_of[k] == env for k in keys) / len(keys)
            assert heat["z"][row][step] == pytest.approx(share, abs=1e-6)
    per_batch = views["figures"]["envs_per_batch"]["data"][0]["y"]
    assert per_batch == [float(len({env_of[k] for k in keys})) for keys in draws]


def test_repeated_draws_of_a_task_are_answered_first_in_first_out(tmp_path):
    from envsched.samplers.simple import SequentialSampler

    pool = make_pool(4, 5)  # 21 tasks
    d = DurableSampler(SequentialSampler(pool, wrap=True), HistoryStore(tmp_path / "s.sqlite"), group_size=2)
    first = d.sample(15)
    second = d.sample(15)  # tasks 15..20, then 0..8 again
    again = [t["id"] for t in second if t["id"] in {x["id"] for x in first}]
    assert len(again) == 9
    t0 = first[0]
    d.update(t0, [1.0, 0.0])  # answers the draw of step 1 (it arrived after step 2 was drawn: late)
    d.update(t0, [1.0, 1.0])  # answers the draw of step 2
    ix = RunIndex(StoreReader(tmp_path / "s.sqlite"))
    ix.refresh()
    snap = ix.snapshot()
    assert list(snap["c_step"]) == [1, 2] and list(snap["c_lag"]) == [1, 0]
    rows = {(r["step"], r["task_id"]): r for r in pick_rows(ix, snap, task=t0["id"])}
    assert rows[(1, t0["id"])]["status"] == "late update" and rows[(1, t0["id"])]["signal"] is True
    assert rows[(2, t0["id"])]["status"] == "updated" and rows[(2, t0["id"])]["signal"] is False
    assert metrics(ix, snap)["outstanding_groups"] == d.metrics()["outstanding_groups"] == 28
    d.close()


def _listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_reading_a_wal_store_leaves_no_file_beside_it(tmp_path, run_writer):
    """A read-only SQLite connection to a WAL store creates STORE-wal and STORE-shm when they are absent and
    cannot delete them: the reader opens such a store ``immutable`` (no writer has it open), and uses the
    writer's files, one short connection per read, while one does."""
    from click.testing import CliRunner

    from envsched.cli.main import cli

    folder = tmp_path / "runs"
    folder.mkdir()
    store = folder / "run.sqlite"
    w = run_writer(store, None, sampler="uniform", batch_size=4).run(3)
    w.close()
    assert _listing(folder) == ["run.sqlite"]
    before = _digest(store)
    res = CliRunner().invoke(cli, ["report", str(store), "--html", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    reader = StoreReader(store)
    index = RunIndex(reader)
    index.refresh()
    assert index.num_steps == 3 and index.seq == 3 * (1 + 4)
    reader.close()
    assert _listing(folder) == ["run.sqlite"] and _digest(store) == before
    # a writer at work: its own files are there; the reader adds none and keeps none alive after it
    w2 = DurableSampler.resume(HistoryStore(store))
    w2.sample(4)
    live = _listing(folder)
    assert live == ["run.sqlite", "run.sqlite-shm", "run.sqlite-wal"]
    reader = StoreReader(store)
    index = RunIndex(reader)
    index.refresh()
    assert index.num_steps == 4  # the draw still in the writer's WAL is read
    assert _listing(folder) == live
    w2.close()  # the writer closes while the reader is idle: it deletes its files as usual
    assert _listing(folder) == ["run.sqlite"]
    index.refresh()
    reader.close()
    assert _listing(folder) == ["run.sqlite"]


@pytest.mark.parametrize("url", [
    "postgresql://envsched:S3cretPw@127.0.0.1:{port}/db",
    "postgresql://envsched@127.0.0.1:{port}/db?password=S3cretPw",
    "postgresql://127.0.0.1:{port}/db?user=u&sslpassword=S3cretPw&sslmode=disable",
    "postgres://u@127.0.0.1:{port}/db?PASSWORD=S3cretPw",
    "postgresql+psycopg://u@127.0.0.1:{port}/db?pass%77ord=S3cretPw",
    "postgresql://u:S3cretPw@127.0.0.1:{port}/db?application_name=a@b",
    "postgresql://u@127.0.0.1:{port}/db?dbname=host%3Dx%20password%3DS3cretPw",
    "postgresql://u:S3cret%2FPw@127.0.0.1:{port}/db",
    "mysql://u:S3cretPw@127.0.0.1:{port}/db",
])
def test_a_store_urls_secrets_never_reach_a_message(url):
    pytest.importorskip("psycopg")
    import socket

    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there
    with pytest.raises(DashboardError) as info:
        StoreReader(url.format(port=port))
    message = str(info.value)
    assert "S3cret" not in message and "***" in message and f"127.0.0.1:{port}" in message, message
    assert len(message.splitlines()) == 1
