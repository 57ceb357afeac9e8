"""The history store on a real PostgreSQL server (CI starts one with .ci/postgres.sh and sets the URL)."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from envsched.pool import TaskPool
from envsched.samplers import CurriculumSampler, UniformSampler
from envsched.store import DurableSampler, HistoryStore, StoreCorruptError, StoreError, StoreMismatchError

URL = os.environ.get("ENVSCHED_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not URL, reason="ENVSCHED_TEST_POSTGRES_URL is not set (CI runs .ci/postgres.sh)")


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    store = HistoryStore(URL, table_prefix=name)
    store.drop()
    store.close()


def _pool() -> TaskPool:
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 3}", "difficulty": i % 4} for i in range(14)])


def test_postgres_store_resumes_exactly(prefix: str) -> None:
    pool = _pool()
    durable = DurableSampler(CurriculumSampler(pool, group_size=3, seed=2), HistoryStore(URL, table_prefix=prefix),
                             snapshot_every=6, group_size=3)
    reference = CurriculumSampler(pool, group_size=3, seed=2)
    rng = random.Random(1)
    for _ in range(8):
        batch = durable.sample(3)
        assert batch == reference.sample(3)
        for t in batch:
            rewards = [rng.choice([0.0, 1.0, None]) for _ in range(3)]
            durable.update(t, rewards, [0.5, 0.5, 0.5])
            reference.update(t, rewards, [0.5, 0.5, 0.5])
    held = durable.sample(2)
    assert held == reference.sample(2)
    durable.close()
    store = HistoryStore(URL, table_prefix=prefix)
    assert store.kind == "postgresql" and store.count_events() == 8 * 4 + 1
    assert store.snapshot_seqs()[0] == 0 and store.snapshot_seqs()[-1] == 30
    for use_snapshots in (True, False):
        rebuilt = DurableSampler(CurriculumSampler(pool, group_size=3, seed=2), store, group_size=3,
                                 use_snapshots=use_snapshots)
        assert rebuilt.sampler.state_dict() == reference.state_dict()
    assert rebuilt.outstanding() == reference.outstanding()
    assert rebuilt.sample(5) == reference.sample(5)
    resumed = DurableSampler.resume(HistoryStore(URL, table_prefix=prefix))
    assert resumed.sampler.state_dict() == reference.state_dict()


def test_postgres_store_refuses_another_configuration_and_edited_rows(prefix: str) -> None:
    pool = _pool()
    durable = DurableSampler(UniformSampler(pool, seed=1), HistoryStore(URL, table_prefix=prefix))
    for t in durable.sample(4):
        durable.update(t, [1.0, 0.0])
    durable.close()
    other = UniformSampler(pool, seed=2)
    before = other.state_dict()
    with pytest.raises(StoreMismatchError, match=f"tables {prefix}_.*seed: store has 1, this sampler has 2"):
        DurableSampler(other, HistoryStore(URL, table_prefix=prefix))
    assert other.state_dict() == before
    with pytest.raises(StoreMismatchError, match="written for another pool"):
        DurableSampler(UniformSampler(TaskPool(list(pool)[:5]), seed=1), HistoryStore(URL, table_prefix=prefix))

    store = HistoryStore(URL, table_prefix=prefix)
    with store.transaction() as tx:
        tx.execute(f"UPDATE {prefix}_events SET payload = replace(payload, '1.0', '0.0') WHERE seq = 2")
    fresh = UniformSampler(pool, seed=1)
    before = fresh.state_dict()
    with pytest.raises(StoreCorruptError, match="event 2 fails its integrity check"):
        DurableSampler(fresh, store)
    assert fresh.state_dict() == before


def test_unreachable_postgres_is_a_clear_error() -> None:
    store = HistoryStore("postgresql://nobody@127.0.0.1:9/none", table_prefix="t_x", busy_timeout_s=2)
    with pytest.raises(StoreError, match="cannot connect to PostgreSQL"):
        DurableSampler(UniformSampler(_pool()), store)


def _digest(prefix: str) -> list[Any]:
    """Every row of the store's tables (what a write would change)."""
    store = HistoryStore(URL, table_prefix=prefix, read_only=True)
    with store.transaction() as tx:
        rows = [tx.execute(f"SELECT * FROM {prefix}_{t} ORDER BY 1") for t in ("meta", "events", "snapshots")]
        if store.has_lease_table(tx):
            rows.append(tx.execute(f"SELECT * FROM {prefix}_leases ORDER BY 1"))
    store.close()
    return rows


def test_postgres_verify_is_read_only_and_refuses_edited_schemas(prefix: str) -> None:
    """``envsched store verify`` on PostgreSQL runs in read-only transactions (a write is refused by the
    server), changes no row, and refuses a trigger or rule added to the store's tables and a dropped lease
    table."""
    from click.testing import CliRunner

    from envsched.cli.main import cli

    d = DurableSampler(UniformSampler(_pool(), seed=1), HistoryStore(URL, table_prefix=prefix), snapshot_every=3)
    d.sample(3, leases=["a", "b", "c"])
    for lid, key in d.open_leases():
        assert d.update(key, [1.0], lease=lid) == "applied"
    d.close()
    before = _digest(prefix)
    result = CliRunner().invoke(cli, ["store", "verify", URL, "--prefix", prefix])
    assert result.exit_code == 0, result.output
    assert _digest(prefix) == before

    ro = HistoryStore(URL, table_prefix=prefix, read_only=True)
    with pytest.raises(Exception, match="read-only transaction"), ro.transaction() as tx:
        tx.execute(f"DELETE FROM {prefix}_events")
    assert _digest(prefix) == before

    rw = HistoryStore(URL, table_prefix=prefix)
    with rw.transaction() as tx:
        tx.execute(f"CREATE RULE evil AS ON INSERT TO {prefix}_events DO ALSO DELETE FROM {prefix}_snapshots")
    result = CliRunner().invoke(cli, ["store", "verify", URL, "--prefix", prefix])
    assert result.exit_code == 1 and "rule 'evil'" in result.output and "edited" in result.output, result.output
    with rw.transaction() as tx:
        tx.execute(f"DROP RULE evil ON {prefix}_events")
        tx.execute(f"DROP TABLE {prefix}_leases")
    result = CliRunner().invoke(cli, ["store", "verify", URL, "--prefix", prefix])
    assert result.exit_code == 1 and "lease table" in result.output and "dropped" in result.output, result.output
    with pytest.raises(StoreCorruptError, match="was dropped"):
        DurableSampler(UniformSampler(_pool(), seed=1), rw)
    rw.close()
