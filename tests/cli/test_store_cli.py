"""``envsched store info`` and ``envsched store verify``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.pool import TaskPool
from envsched.samplers import CurriculumSampler
from envsched.store import DurableSampler


def _store(tmp_path: Path) -> Path:
    pool = TaskPool([{"id": f"t{i}", "env": f"e{i % 2}", "difficulty": i % 3} for i in range(10)])
    durable = DurableSampler(CurriculumSampler(pool, group_size=2, seed=0), tmp_path / "h.sqlite", snapshot_every=4)
    for _ in range(3):
        for t in durable.sample(2):
            durable.update(t, [1.0, None])
    durable.close()
    return tmp_path / "h.sqlite"


def test_info_and_verify(tmp_path: Path) -> None:
    path = _store(tmp_path)
    res = CliRunner().invoke(cli, ["store", "info", str(path), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["events"] == 9 and info["by_kind"] == {"sample": 3, "update": 6}
    assert info["snapshots"] == [0, 4, 8] and info["updates_with_unscored_rollouts"] == 6
    assert info["sampler_class"] == "envsched.samplers.simple:CurriculumSampler"
    res = CliRunner().invoke(cli, ["store", "verify", str(path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["ok"] and out["events"] == 9 and out["replayed_from_snapshot"] == 1
    assert out["metrics"]["groups"] == 6 and out["metrics"]["unscored_episodes"] == 6


def test_damaged_store_fails_with_the_reason(tmp_path: Path) -> None:
    path = _store(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE envsched_events SET payload = replace(payload, '1.0', '0.0') WHERE seq = 2")
    conn.commit()
    conn.close()
    for cmd in ("info", "verify"):
        res = CliRunner().invoke(cli, ["store", cmd, str(path)])
        assert res.exit_code == 1
        assert "event 2 fails its integrity check" in " ".join(res.output.split())
    garbage = tmp_path / "notes.txt"
    garbage.write_text("hello" * 50)
    res = CliRunner().invoke(cli, ["store", "info", str(garbage)])
    assert res.exit_code == 1 and "not an SQLite database" in res.output
