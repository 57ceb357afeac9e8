"""Cost of durability: per-call latency of a DurableSampler, and how long a rebuild takes.

Measures, on a CurriculumSampler over a synthetic pool:
  * the median and p95 latency of ``update`` (one committed transaction each) for SQLite with
    ``synchronous=FULL`` (default) and ``NORMAL``, and for PostgreSQL when ``--postgres URL`` is given;
  * the time to rebuild the sampler from a store of ``--events`` events, from the latest snapshot
    (``snapshot_every`` = 1000) and by a full replay of the log.

    nice .venv/bin/python benchmarks/durable_store.py --tasks 2000 --events 20000 [--postgres URL] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from envsched.pool import TaskPool
from envsched.samplers import CurriculumSampler
from envsched.store import DurableSampler, HistoryStore


def _pool(n: int) -> TaskPool:
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 20}", "difficulty": i % 5} for i in range(n)])


def _fill(durable: DurableSampler, events: int, rng: random.Random) -> list[float]:
    """Drive sample(8) + 8 updates until ``events`` events are logged; returns update latencies (s)."""
    lat = []
    while durable.seq < events:
        for t in durable.sample(8):
            rewards = [rng.choice([0.0, 1.0, None]) for _ in range(8)]
            t0 = time.perf_counter()
            durable.update(t, rewards)
            lat.append(time.perf_counter() - t0)
    return lat


def _summary(lat: list[float]) -> dict[str, float]:
    lat = sorted(lat)
    return {"calls": len(lat), "median_ms": 1e3 * statistics.median(lat), "p95_ms": 1e3 * lat[int(0.95 * len(lat))]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--latency-events", type=int, default=1500)
    ap.add_argument("--postgres", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    pool = _pool(args.tasks)

    def make() -> CurriculumSampler:
        return CurriculumSampler(pool, group_size=8, seed=0)

    out: dict[str, Any] = {"tasks": args.tasks}
    with tempfile.TemporaryDirectory() as tmp:
        for sync in ("FULL", "NORMAL"):
            d = DurableSampler(make(), HistoryStore(Path(tmp) / f"lat-{sync}.sqlite", synchronous=sync))
            out[f"update_latency_sqlite_{sync.lower()}"] = _summary(_fill(d, args.latency_events, random.Random(0)))
            d.close()
        if args.postgres:
            prefix = f"bench_{uuid.uuid4().hex[:8]}"
            store = HistoryStore(args.postgres, table_prefix=prefix)
            try:
                d = DurableSampler(make(), store)
                out["update_latency_postgres"] = _summary(_fill(d, args.latency_events, random.Random(0)))
            finally:
                store.drop()
                store.close()

        path = Path(tmp) / "rebuild.sqlite"
        d = DurableSampler(make(), HistoryStore(path, synchronous="NORMAL"), snapshot_every=1000)
        _fill(d, args.events, random.Random(1))
        events = d.seq
        d.close()
        for label, use in (("rebuild_from_snapshot", True), ("rebuild_full_replay", False)):
            t0 = time.perf_counter()
            r = DurableSampler(make(), HistoryStore(path), snapshot_every=1000, use_snapshots=use)
            out[f"{label}_s"] = time.perf_counter() - t0
            out[f"{label}_replayed_events"] = r.replayed_events
            r.close()
        out["events"] = events
        out["store_bytes"] = sum(p.stat().st_size for p in Path(tmp).glob("rebuild.sqlite*"))
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
