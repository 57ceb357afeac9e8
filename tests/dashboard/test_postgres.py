"""The dashboard's reader on a real PostgreSQL store: the database's own JSON extraction gives what Python's
parsing gives, and the recomputed metrics are the sampler's; a server that refuses the session is one line in
every command that opens a store."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.dashboard.model import RunIndex
from envsched.dashboard.reader import DashboardError, StoreReader
from envsched.dashboard.views import build_views, metrics
from envsched.samplers.simple import UniformSampler
from envsched.store import DurableSampler, HistoryStore

from .conftest import make_pool


@pytest.fixture(scope="module")
def pg_url():
    url = os.environ.get("ENVSCHED_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    if os.environ.get("ENVSCHED_TEST_POSTGRES", "1") == "0":
        pytest.skip("ENVSCHED_TEST_POSTGRES=0")
    path = Path(__file__).resolve().parents[1] / "_postgres.py"  # the suite's throw-away server (tests/_postgres.py)
    spec = importlib.util.spec_from_file_location("envsched_tests_postgres", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    server, reason = module.start()
    if server is None:
        pytest.skip(f"no PostgreSQL server: {reason} (set ENVSCHED_TEST_POSTGRES_URL)")
    try:
        yield server.url
    finally:
        server.stop()


def test_postgres_reader_matches_python_parsing_and_the_samplers_metrics(pg_url):
    prefix = f"d_{uuid.uuid4().hex[:10]}"
    d = DurableSampler(UniformSampler(make_pool(4, 5), seed=3), HistoryStore(pg_url, table_prefix=prefix),
                       group_size=3)
    try:
        a = d.sample(4)
        d.update(a[0], [1.0, 0.0, None], [2.0, 3.0, 4.0])
        d.update(a[1], [1.0, 1.0, 1.0])
        d.discard(a[2], reason="env crashed")
        b = d.sample(3, leases=["L1", "L2", "L3"])
        d.update(a[3], [0.0, 0.5, 1.0])
        d.update(b[0], [None, None, None], lease="L1")
        d.discard(b[1], lease="L2", reclaimed=True)
        sql = StoreReader(pg_url, table_prefix=prefix)
        py = StoreReader(pg_url, table_prefix=prefix, use_sql_json=False)
        es, ep = sql.events(0), py.events(0)
        assert es.upto == ep.upto == 8
        assert [tuple(r) for r in es.samples] == [tuple(r) for r in ep.samples]
        assert [tuple(r) for r in es.discards] == [tuple(r) for r in ep.discards]
        for s, p in zip(es.updates, ep.updates, strict=True):
            assert s[:6] == p[:6] and s[6:] == pytest.approx(p[6:])
        assert es.leases == ep.leases == {"L1": 5, "L2": 5}
        assert sql.tasks() == py.tasks()
        ix = RunIndex(sql)
        ix.refresh()
        snap = ix.snapshot()
        m, want = metrics(ix, snap), d.metrics()
        for key in ("groups", "signal_groups", "episodes", "unscored_episodes", "cost", "outstanding_groups",
                    "discarded_groups", "reclaimed_groups", "open_leases", "store_events"):
            assert m[key] == pytest.approx(want[key]), key
        assert build_views(ix, snap)["steps"] == 2
        sql.close()
        py.close()
    finally:
        d.close()
        HistoryStore(pg_url, table_prefix=prefix).drop()


SECRETS = ("S3cretUserinfo", "S3cretQueryPw", "S3cretSslPw")


def _with_secrets(url: str) -> str:
    """``url`` with a password in the userinfo and two more as query parameters (the server trusts every local
    connection, so they are not checked, but a message, title or summary must never show one)."""
    scheme, rest = url.split("://", 1)
    userinfo, _, host = rest.rpartition("@")
    user = userinfo.split(":", 1)[0] or "postgres"
    sep = "&" if "?" in host else "?"
    return f"{scheme}://{user}:{SECRETS[0]}@{host}{sep}password={SECRETS[1]}&sslpassword={SECRETS[2]}"


def test_postgres_passwords_never_reach_titles_summaries_or_messages(pg_url, tmp_path):
    from envsched.dashboard.app import create_app
    from envsched.dashboard.report import write_report

    prefix = f"d_{uuid.uuid4().hex[:10]}"
    url = _with_secrets(pg_url)
    d = DurableSampler(UniformSampler(make_pool(3, 3), seed=1), HistoryStore(url, table_prefix=prefix), group_size=2)
    try:
        for t in d.sample(3):
            d.update(t, [1.0, 0.0])
        reader = StoreReader(url, table_prefix=prefix)
        assert "password=***" in reader.where and "sslpassword=***" in reader.where and ":***@" in reader.where
        reader.close()
        out = write_report(url, tmp_path / "r.html", table_prefix=prefix)
        text = out.read_text(encoding="utf-8")
        assert "<title>envsched report: postgresql" in text and '"store":"postgresql' in text
        assert not any(s in text for s in SECRETS)
        from starlette.testclient import TestClient

        with TestClient(create_app(url, table_prefix=prefix, start=False), base_url="http://127.0.0.1") as client:
            page = client.get("/").text
            views = client.get("/api/views").text
        assert "<title>envsched dashboard: postgresql" in page and "password=***" in page
        assert not any(s in page + views for s in SECRETS)
        # an event that cannot be read: the message names the store without its secrets
        with d.store._backend.engine.begin() as c:
            import sqlalchemy

            c.execute(sqlalchemy.text(f"UPDATE {prefix}_events SET payload = :p WHERE seq = 2"),
                      {"p": '{"key": 5, "rewards": [1]}'})
        with pytest.raises(DashboardError, match=r"event 2 \(update\): field 'key' is the number 5") as info:
            RunIndex(StoreReader(url, table_prefix=prefix)).refresh()
        assert not any(s in str(info.value) for s in SECRETS) and "password=***" in str(info.value)
        assert not any(s in d.store.where for s in SECRETS), d.store.where  # the store's own messages
    finally:
        d.close()
        HistoryStore(pg_url, table_prefix=prefix).drop()


# crafted events through PostgreSQL's own JSON extraction (jsonb) and through Python's parsing alike
PG_CASES = [
    ("keys_string", 1, '{"keys": "abc", "n": 2}', r"event 1 \(sample\): field 'keys' is a string \('abc'\)"),
    ("keys_item_number", 1, '{"keys": ["a", 7], "n": 2}', r"event 1 \(sample\): field 'keys'\[1\] is the number 7"),
    ("payload_not_json", 2, "not json", r"event 2 \(update\): its payload is not valid JSON"),
    ("payload_list", 2, "[1, 2]", r"event 2 \(update\): its payload is a list of 2"),
    ("rewards_item_text", 2, '{"key": "k", "rewards": [1, "x"]}', r"event 2 \(update\): field 'rewards'\[1\] is a"),
    ("rewards_huge", 2, '{"key": "k", "rewards": [1e999]}', r"event 2 \(update\): field 'rewards'\[0\] is the number"),
    ("costs_item_text", 2, '{"key": "k", "rewards": [1], "costs": ["x"]}', r"field 'costs'\[0\] is a string"),
    ("reclaimed_text", 3, '{"key": "k", "reason": null, "reclaimed": "yes"}', r"event 3 \(discard\): field 'reclaim"),
    ("leases_short", 1, '{"keys": ["a", "b"], "leases": ["L"], "n": 2}', r"field 'leases' holds 1 lease ids for 2"),
]


@pytest.mark.parametrize(("name", "seq", "payload", "match"), PG_CASES, ids=[c[0] for c in PG_CASES])
def test_postgres_crafted_events_are_named_like_sqlites(pg_url, name, seq, payload, match):
    prefix = f"d_{uuid.uuid4().hex[:10]}"
    d = DurableSampler(UniformSampler(make_pool(3, 3), seed=1), HistoryStore(pg_url, table_prefix=prefix),
                       group_size=1)
    try:
        t = d.sample(2)
        d.update(t[0], [1.0])
        d.discard(t[1], reason="gone")
        import sqlalchemy

        with d.store._backend.engine.begin() as c:
            c.execute(sqlalchemy.text(f"UPDATE {prefix}_events SET payload = :p WHERE seq = :s"),
                      {"p": payload, "s": seq})
        for use_sql_json in (True, False):
            reader = StoreReader(pg_url, table_prefix=prefix, use_sql_json=use_sql_json)
            with pytest.raises(DashboardError, match=match) as info:
                RunIndex(reader).refresh()
            assert len(str(info.value).splitlines()) == 1
            reader.close()
    finally:
        d.close()
        HistoryStore(pg_url, table_prefix=prefix).drop()


def test_postgres_task_list_and_lease_outcomes_are_checked(pg_url):
    prefix = f"d_{uuid.uuid4().hex[:10]}"
    d = DurableSampler(UniformSampler(make_pool(3, 3), seed=1), HistoryStore(pg_url, table_prefix=prefix),
                       group_size=1)
    try:
        t = d.sample(2, leases=["L1", "L2"])
        d.update(t[0], [1.0], lease="L1")
        import sqlalchemy

        with d.store._backend.engine.begin() as c:
            c.execute(sqlalchemy.text(f"UPDATE {prefix}_leases SET outcome = 'boom' WHERE lease = 'L1'"))
        reader = StoreReader(pg_url, table_prefix=prefix)
        with pytest.raises(DashboardError, match=r"a lease has the outcome 'boom', expected update, discard or "
                                                 r"reclaim \(damaged store\)"):
            reader.lease_counts()
        reader.close()
        with d.store._backend.engine.begin() as c:
            c.execute(sqlalchemy.text(f"UPDATE {prefix}_meta SET value = :v WHERE key = 'tasks'"),
                      {"v": '[{"id": "a"}, "b"]'})
        for use_sql_json in (True, False):
            reader = StoreReader(pg_url, table_prefix=prefix, use_sql_json=use_sql_json)
            with pytest.raises(DashboardError, match=r"metadata 'tasks' is not a JSON list of task objects"):
                reader.tasks()
            reader.close()
    finally:
        d.close()
        HistoryStore(pg_url, table_prefix=prefix).drop()


def _other_user(url: str) -> str:
    """``url`` with the role ``nosuchrole`` (and a password) instead of its own."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://nosuchrole:S3cretPw@{rest.split('@', 1)[-1]}"


def _with_option(url: str) -> str:
    return url + ("&" if "?" in url else "?") + "options=-c%20nosuch_setting%3D1"


# a server that refuses the session (what libpq reports on several lines, with FATAL and two spaces)
REFUSED_SESSIONS = {
    "no_database": (lambda u: u.rsplit("/", 1)[0] + "/nosuchdb_x", r'FATAL: database "nosuchdb_x" does not exist'),
    "no_role": (_other_user, r'FATAL: role "nosuchrole" does not exist'),
    "unknown_setting": (_with_option, r'FATAL: unrecognized configuration parameter "nosuch_setting"'),
}


@pytest.mark.parametrize("name", sorted(REFUSED_SESSIONS))
def test_a_server_that_refuses_the_session_is_one_line_everywhere(pg_url, tmp_path, name):
    change, match = REFUSED_SESSIONS[name]
    url = change(pg_url)
    for argv in (["store", "info", url], ["store", "verify", url], ["report", url, "--html", str(tmp_path / "r.html")]):
        res = CliRunner().invoke(cli, argv)
        lines = res.output.strip().splitlines()
        assert res.exit_code == 1 and len(lines) == 1, (argv[:2], res.output)
        assert re.search(r"cannot connect to PostgreSQL \(connection failed: .*" + match + r"\)$", lines[0]), res.output
        assert "S3cret" not in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r.html").exists()
