"""Bounded load test of envsched's OpenEnv Task API server on 127.0.0.1 (stops by itself).

Starts the server the documented way (``python -m uvicorn envsched.envs.openenv_server:app``) in a
subprocess over a pool of ``--tasks`` question/answer tasks in one split, then for ``--duration`` seconds
runs at the same time:

* ``--readers`` threads of Task API reads (a random ``/task``, a ``/task_range`` page of ``--page`` tasks,
  ``/num_tasks``), each over its own HTTP connection;
* ``--episodes`` threads of WebSocket episodes (OpenEnv's ``GenericEnvClient``: ``reset(split, index,
  seed)`` then one ``step``), more threads than the server's ``--max-sessions``, so the session limit is
  reached and some resets are refused with ``CAPACITY_REACHED``;
* a few hostile requests: an unbounded ``/task_range``, a 2 MiB body, a negative range.

It prints per-route throughput and latency (p50/p95/max), status counts, episodes per second,
capacity refusals and the server's resident memory before and after, then stops the server.

    python benchmarks/task_api_load.py --duration 10 --readers 4 --episodes 10 --max-sessions 8
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_server(n_tasks: int, max_sessions: int, workdir: Path) -> tuple[subprocess.Popen, int]:
    from envsched.envs.openenv_server import _free_port

    pool = workdir / "pool.jsonl"
    with pool.open("w") as fh:
        for i in range(n_tasks):
            fh.write(json.dumps({"id": f"q{i}", "env": "qa", "split": "test", "group": f"g{i % 5}",
                                 "difficulty": i % 5,
                                 "initial_state": {"question": f"What is {i} + 1?", "answer": str(i + 1)}}) + "\n")
    port = _free_port("127.0.0.1")
    env = {**os.environ, "ENVSCHED_OPENENV_POOL": str(pool), "ENVSCHED_OPENENV_NAME": "load",
           "ENVSCHED_OPENENV_MAX_SESSIONS": str(max_sessions)}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "envsched.envs.openenv_server:app", "--host",
                             "127.0.0.1", "--port", str(port), "--log-level", "error"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                c.close()
                # the app (and the pool) is built on the first request: warm it up
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                c.request("POST", "/load/num_tasks", json.dumps({"split": "test"}),
                          {"Content-Type": "application/json"})
                c.getresponse().read()
                c.close()
                return proc, port
        except OSError:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError("the server exited during startup")
    proc.kill()
    raise RuntimeError("the server did not start within 120 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of load (the run stops by itself)")
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=10, help="episode threads (above --max-sessions)")
    ap.add_argument("--max-sessions", type=int, default=8)
    ap.add_argument("--page", type=int, default=256)
    args = ap.parse_args()
    if not 0 < args.duration <= 300:
        ap.error("--duration must be in (0, 300]")

    from openenv.core.generic_client import GenericEnvClient

    from envsched.envs.openenv_server import MAX_PAGE_SIZE

    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(args.tasks, args.max_sessions, Path(tmp))
        base = f"http://127.0.0.1:{port}"
        rss_before = rss_mib(proc.pid)
        lat: dict[str, list[float]] = defaultdict(list)
        status: Counter[str] = Counter()
        ep = Counter()
        lock = threading.Lock()
        stop_at = time.monotonic() + args.duration

        def post(conn: http.client.HTTPConnection, route: str, body: bytes) -> int:
            t = time.perf_counter()
            conn.request("POST", route, body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            with lock:
                lat[route.rsplit("/", 1)[1]].append(time.perf_counter() - t)
                status[f"{route.rsplit('/', 1)[1]} {r.status}"] += 1
            return r.status

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            while time.monotonic() < stop_at:
                k = rng.random()
                if k < 0.6:
                    body = {"split": "test", "index": rng.randrange(args.tasks)}
                    post(conn, "/load/task", json.dumps(body).encode())
                elif k < 0.9:
                    start = rng.randrange(max(1, args.tasks - args.page))
                    body = {"split": "test", "start": start, "stop": min(args.tasks, start + args.page)}
                    post(conn, "/load/task_range", json.dumps(body).encode())
                else:
                    post(conn, "/load/num_tasks", b'{"split": "test"}')
            conn.close()

        def episodes(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < stop_at:
                i = rng.randrange(args.tasks)
                client = GenericEnvClient(base_url=base, message_timeout_s=30).sync()
                t = time.perf_counter()
                try:
                    client.reset(split="test", index=i, seed=rng.randrange(100))
                    r = client.step({"answer": str(i + 1)})
                    with lock:
                        ep["ok" if r.reward == 1.0 else "wrong"] += 1
                        lat["episode"].append(time.perf_counter() - t)
                except Exception as exc:  # counted by kind
                    kind = "CAPACITY_REACHED" if "CAPACITY_REACHED" in str(exc) else type(exc).__name__
                    with lock:
                        ep[kind] += 1
                    time.sleep(0.01)
                finally:
                    with contextlib.suppress(Exception):
                        client.close()

        def hostile() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            while time.monotonic() < stop_at:
                post(conn, "/load/task_range", b'{"split": "test"}')                       # whole split: 400
                post(conn, "/load/task_range", b'{"split": "test", "start": -5}')          # negative: 400
                try:
                    post(conn, "/load/num_tasks", b'{"split": "' + b"x" * (2 << 20) + b'"}')  # 2 MiB: 413
                except OSError:
                    with lock:
                        status["num_tasks 413 (connection closed)"] += 1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                time.sleep(0.2)
            conn.close()

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(args.readers)]
        threads += [threading.Thread(target=episodes, args=(100 + i,)) for i in range(args.episodes)]
        threads.append(threading.Thread(target=hostile))
        t0 = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join(args.duration + 60)
        wall = time.monotonic() - t0
        rss_after = rss_mib(proc.pid)
        alive = proc.poll() is None
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()

    print(f"server: {args.tasks} tasks, max_sessions={args.max_sessions}, page limit {MAX_PAGE_SIZE}; "
          f"load: {args.readers} readers + {args.episodes} episode threads + 1 hostile, {wall:.1f} s")
    for route, xs in sorted(lat.items()):
        xs = sorted(xs)
        p95 = xs[min(len(xs) - 1, int(0.95 * len(xs)))]
        print(f"  {route:12s} {len(xs):6d} done  {len(xs) / wall:8.1f}/s  p50 {1e3 * statistics.median(xs):7.1f} ms"
              f"  p95 {1e3 * p95:7.1f} ms  max {1e3 * xs[-1]:7.1f} ms")
    print("  statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(status.items())))
    print("  episodes: " + ", ".join(f"{k}: {v}" for k, v in sorted(ep.items())))
    print(f"  server RSS {rss_before:.0f} MiB -> {rss_after:.0f} MiB; still serving at the end: {alive}")


if __name__ == "__main__":
    main()
