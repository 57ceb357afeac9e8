"""Hostile history stores: crafted metadata never makes envsched import or call code; a kill during a
checkpoint leaves a store that still opens; a lost tail of the event log is detected; a PostgreSQL store that
cannot be connected to is one line naming it, its password redacted."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.pool import TaskPool
from envsched.samplers import UniformSampler
from envsched.store import DurableSampler, HistoryStore, StoreCorruptError, StoreError


def _pool() -> TaskPool:
    return TaskPool([{"id": f"t{i:02d}", "env": f"env{i % 3}"} for i in range(12)])


def _make_store(path: Path, *, steps: int = 6, snapshot_every: int | None = 4) -> DurableSampler:
    d = DurableSampler(UniformSampler(_pool(), seed=3), path, snapshot_every=snapshot_every)
    for _ in range(steps):
        (task,) = d.sample(1)
        d.update(task, [1.0, 0.0])
    return d


def _set_meta(path: Path, **values: object) -> None:
    conn = sqlite3.connect(path)
    with conn:
        for key, value in values.items():
            conn.execute("UPDATE envsched_meta SET value = ? WHERE key = ?", (json.dumps(value), key))
    conn.close()


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _crafted(tmp_path: Path, sampler_class: str, tasks: object, params: object = None) -> Path:
    path = tmp_path / "evil.sqlite"
    _make_store(path, steps=1).close()
    extra = {"num_tasks": len(tasks)} if isinstance(tasks, list) else {}  # consistent, so the class is what fails
    _set_meta(path, sampler_class=sampler_class, tasks=tasks, sampler_params=params or {}, **extra)
    return path


def test_store_verify_refuses_a_store_naming_subprocess_run_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = _crafted(tmp_path, "subprocess:run", ["touch", str(marker)])
    before = _digest(path)
    result = CliRunner().invoke(cli, ["store", "verify", str(path)])
    assert not marker.exists(), "the crafted store ran a command"
    assert _digest(path) == before
    assert result.exit_code == 1
    assert "not a registered envsched sampler class" in result.output
    assert "subprocess:run" in result.output


@pytest.mark.parametrize("name", ["os:system", "builtins:eval", "subprocess:Popen", "shutil:rmtree",
                                  "envsched.store.history:HistoryStore", "importlib:import_module",
                                  "pathlib:Path.touch", "envsched.samplers.simple:UniformSampler.__init__"])
def test_resume_refuses_any_unregistered_class_before_importing_it(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "pwned"
    path = _crafted(tmp_path, name, [f"touch {marker}"], {"x": str(marker)})
    before = _digest(path)
    with pytest.raises(StoreError, match="not a registered envsched sampler class"):
        DurableSampler.resume(path)
    assert not marker.exists()
    assert _digest(path) == before


@pytest.mark.parametrize("key,value,word", [
    ("sampler_class", 42, "sampler_class"),
    ("sampler_params", ["a"], "sampler_params"),
    ("num_tasks", "12", "num_tasks"),
    ("store_id", None, "store_id"),
    ("pool_fingerprint", {"a": 1}, "pool_fingerprint"),
])
def test_metadata_of_the_wrong_type_is_refused_naming_the_key(tmp_path: Path, key: str, value: object,
                                                               word: str) -> None:
    path = tmp_path / "s.sqlite"
    _make_store(path, steps=1).close()
    _set_meta(path, **{key: value})
    before = _digest(path)
    with pytest.raises(StoreCorruptError, match=word):
        HistoryStore(path)
    assert _digest(path) == before


def test_a_class_the_caller_passes_is_allowed(tmp_path: Path) -> None:
    class MySampler(UniformSampler):
        pass

    path = tmp_path / "mine.sqlite"
    d = DurableSampler(MySampler(_pool(), seed=1), path)
    d.sample(2)
    d.close()
    with pytest.raises(StoreError, match="not a registered"):
        DurableSampler.resume(path)
    again = DurableSampler.resume(path, sampler_classes=[MySampler])
    assert again.seq == 1 and type(again.sampler) is MySampler


def test_registered_classes_still_resume(tmp_path: Path) -> None:
    path = tmp_path / "ok.sqlite"
    d = _make_store(path)
    want = d.sampler.state_dict()
    d.close()
    again = DurableSampler.resume(path)
    assert again.sampler.state_dict() == want


# ------------------------------------------------------------------ a kill during a checkpoint (item 2)
def _mid_checkpoint_copy(src: Path, dst: Path) -> int:
    """Reproduce what a SIGKILL during a checkpoint leaves: every page in the WAL, the main file cut short
    while its header already promises all the pages. Returns the number of pages."""
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("VACUUM")  # rewrites every page: all of them are now frames in the WAL
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    shutil.copyfile(str(src) + "-wal", str(dst) + "-wal")
    data = src.read_bytes()
    conn.close()
    assert int.from_bytes(data[28:32], "big") == pages
    dst.write_bytes(data[: page_size * 2])  # the header says `pages` pages, the file holds 2
    return pages


def test_a_store_killed_during_a_checkpoint_opens_and_resumes(tmp_path: Path) -> None:
    src, dst = tmp_path / "live.sqlite", tmp_path / "killed.sqlite"
    d = _make_store(src, steps=40)
    want = d.sampler.state_dict()
    d.close()
    pages = _mid_checkpoint_copy(src, dst)
    assert pages > 2
    # SQLite itself recovers it from the WAL
    ro = sqlite3.connect(f"{dst.resolve().as_uri()}?mode=ro", uri=True)
    assert ro.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    ro.close()
    again = DurableSampler.resume(dst)
    assert again.seq == 80
    assert again.sampler.state_dict() == want


def test_a_truncated_store_without_a_wal_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    _make_store(path, steps=40).close()
    data = path.read_bytes()
    page_size = int.from_bytes(data[16:18], "big")
    path.write_bytes(data[: page_size * 2])
    with pytest.raises(StoreCorruptError, match="truncated"):
        HistoryStore(path)


# ------------------------------------------------------------------ the tail of the log (item 7)
def _delete_last_events(path: Path, n: int) -> None:
    conn = sqlite3.connect(path)
    with conn:
        last = conn.execute("SELECT max(seq) FROM envsched_events").fetchone()[0]
        conn.execute("DELETE FROM envsched_events WHERE seq > ?", (last - n,))
    conn.close()


@pytest.mark.parametrize("n", [1, 3])
def test_deleting_the_last_events_is_detected(tmp_path: Path, n: int) -> None:
    path = tmp_path / "s.sqlite"
    _make_store(path, steps=5, snapshot_every=None).close()
    _delete_last_events(path, n)
    before = _digest(path)
    with pytest.raises(StoreCorruptError, match=rf"ends at event {10 - n}.*recorded event 10"):
        DurableSampler.resume(path)
    with pytest.raises(StoreCorruptError, match="lost"):
        HistoryStore(path).events()
    result = CliRunner().invoke(cli, ["store", "verify", str(path)])
    assert result.exit_code == 1 and "lost" in result.output
    assert _digest(path) == before


def test_an_intact_store_passes_the_head_check(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    _make_store(path, steps=5).close()
    assert len(HistoryStore(path).events()) == 10
    result = CliRunner().invoke(cli, ["store", "verify", str(path)])
    assert result.exit_code == 0, result.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders: nothing to refuse")
def test_a_store_in_a_read_only_folder_says_read_only(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    _make_store(folder / "s.sqlite").close()
    folder.chmod(0o555)
    try:
        with pytest.raises(StoreError, match="read-only"):
            DurableSampler.resume(folder / "s.sqlite")
    finally:
        folder.chmod(0o755)


# ---------------------------------------------------------------------------------------------- PostgreSQL URLs
def _closed_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    return int(port)


# every way a PostgreSQL URL can fail to connect, without a server: (URL, what the one line says)
CONNECT_FAILURES = {
    "unknown_option": ("postgresql://u@127.0.0.1:{port}/db?PassWord=S3cretPw",
                       r"cannot connect to PostgreSQL \(invalid connection option \"PassWord\"\)$"),
    "refused": ("postgresql://u:S3cretPw@127.0.0.1:{port}/db",
                r"cannot connect to PostgreSQL \(connection failed: .*Connection refused\. Is the server running on "
                r"that host and accepting TCP/IP connections\?\)$"),
    "refused_localhost": ("postgres://u@localhost:{port}/db?password=S3cretPw", r"cannot connect to PostgreSQL"),
    "bad_sslmode": ("postgresql://u@127.0.0.1:{port}/db?sslmode=bogus&sslpassword=S3cretPw",
                    r"cannot connect to PostgreSQL \(.*invalid sslmode value: \"bogus\"\)$"),
    "port_out_of_range": ("postgresql://u:S3cretPw@127.0.0.1:99999/db", r"invalid port number"),
    "no_socket": ("postgresql://u:S3cretPw@/db?host=/nonexistent/sock",
                  r"cannot connect to PostgreSQL \(.*/nonexistent/sock/\.s\.PGSQL\.5432\" failed: No such file"),
    "port_not_a_number": ("postgresql://u:S3cretPw@127.0.0.1:abc/db", r"not a usable PostgreSQL URL \(.*'abc'\)$"),
}


@pytest.mark.parametrize("name", sorted(CONNECT_FAILURES))
def test_a_postgres_store_that_cannot_connect_is_one_clear_line(name: str) -> None:
    pytest.importorskip("psycopg")
    url, match = CONNECT_FAILURES[name]
    url = url.format(port=_closed_port())
    # the library: a StoreError (a URL it cannot parse: a ValueError), one line, the password redacted
    with pytest.raises((StoreError, ValueError)) as info:
        store = HistoryStore(url, table_prefix="t_x", busy_timeout_s=2)
        try:
            store.header()
        finally:
            store.close()
    text = str(info.value)
    assert len(text.splitlines()) == 1 and re.search(match, text), text
    assert "S3cret" not in text and text.startswith("store postgres")
    # the CLI: exit status 1, that line, no traceback
    res = CliRunner().invoke(cli, ["store", "info", url])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and re.search(match, lines[0]), res.output
    assert "S3cret" not in res.output and "Traceback" not in res.output
