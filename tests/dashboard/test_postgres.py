"""The dashboard's reader on a real PostgreSQL store: the database's own JSON extraction gives what Python's
parsing gives, and the recomputed metrics are the sampler's."""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from pathlib import Path

import pytest

from envsched.dashboard.model import RunIndex
from envsched.dashboard.reader import StoreReader
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
