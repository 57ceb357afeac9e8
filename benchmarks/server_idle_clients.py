"""Bounded benchmark of envsched's OpenEnv server under slow and idle clients, on 127.0.0.1 (stops by itself).

Issue 23's goals: the server keeps answering ``/health`` within 50 ms while 1,000 slow or idle clients are
connected, and a new WebSocket client is served after idle ones time out.

Phase 1 (load). The server is started the documented way (``python -m envsched.envs.openenv_server``) with
``--ws`` sessions allowed, the default limits (60 s idle, 10 s request head). A load process (asyncio) opens

* ``--slow`` slow-header connections, each sending one byte of a request head every second (slowloris); when
  the server cuts one off (408 at the head deadline) it reconnects, so ``--slow`` stay connected;
* ``--ws`` WebSocket clients, each runs one ``reset`` and then stays idle, holding its session.

Once all are connected, ``/health`` is requested ``--probes`` times, one fresh connection each (p50/p99/max).

Phase 2 (recovery). A server with 8 sessions and an idle limit of ``--idle`` seconds: 8 clients reset and go
idle, a ninth is refused (``CAPACITY_REACHED``), then a new client retries every 0.2 s; the time from the
idle clients' last message until the new client's ``reset`` is served is printed.

    python benchmarks/server_idle_clients.py --slow 1000 --ws 1000 --probes 300 --idle 5

Measurements on a shared, loaded machine are noisy; the figures are what this run saw.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def raise_open_files(needed: int) -> int:
    """Raise this process's soft limit on open files (children inherit it); the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < needed:
        sys.exit(f"needs {needed} open files, the limit is {soft} (ulimit -n)")
    return soft


def write_pool(workdir: Path) -> Path:
    pool = workdir / "pool.jsonl"
    pool.write_text("".join(json.dumps({"id": f"q{i}", "env": "qa", "split": "train",
                                        "initial_state": {"question": f"{i} + 1?", "answer": str(i + 1)}}) + "\n"
                            for i in range(50)))
    return pool


def start_server(pool: Path, sessions: int, idle_s: float | None) -> tuple[subprocess.Popen, int]:
    from envsched.envs.openenv_server import _free_port

    port = _free_port("127.0.0.1")
    env = {**os.environ, "ENVSCHED_OPENENV_POOL": str(pool), "ENVSCHED_OPENENV_MAX_SESSIONS": str(sessions)}
    if idle_s is not None:
        env["ENVSCHED_OPENENV_IDLE_TIMEOUT_S"] = str(idle_s)
    proc = subprocess.Popen([sys.executable, "-m", "envsched.envs.openenv_server", "--port", str(port),
                             "--log-level", "error"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("the server exited at start")
        try:
            health(port)
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    sys.exit("the server did not start within 120 s")


def health(port: int) -> float:
    """Seconds for one ``GET /health`` on a fresh connection."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200 or b"healthy" not in body:
            raise RuntimeError(f"/health answered {resp.status}: {body[:100]!r}")
    finally:
        conn.close()
    return time.perf_counter() - t0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------------------- the load process
async def _slow_client(port: int, stop: asyncio.Event, stats: dict[str, int]) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"s" * 1000
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            stats["connect_errors"] += 1
            await asyncio.sleep(0.5)
            continue
        stats["slow_connected"] += 1
        try:
            for b in head:
                if stop.is_set():
                    break
                writer.write(bytes([b]))
                await writer.drain()
                try:
                    data = await asyncio.wait_for(reader.read(100), timeout=1.0)
                except TimeoutError:
                    continue
                if data.startswith(b"HTTP/1.1 408"):
                    stats["cut_off_408"] += 1
                break  # answered or closed by the server
        except OSError:
            stats["cut_off_reset"] += 1
        finally:
            stats["slow_connected"] -= 1
            writer.close()


async def _idle_ws(port: int, stop: asyncio.Event, stats: dict[str, int]) -> None:
    from websockets.asyncio.client import connect

    try:
        async with connect(f"ws://127.0.0.1:{port}/ws", open_timeout=120) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 120))
            stats["ws_reset" if reply.get("type") == "observation" else "ws_refused"] += 1
            stats["ws_connected"] += 1
            await stop.wait()
            stats["ws_connected"] -= 1
    except Exception:  # counted; the benchmark goes on with the others
        stats["ws_errors"] += 1


async def _load(port: int, n_slow: int, n_ws: int) -> None:
    stats = dict.fromkeys(("slow_connected", "cut_off_408", "cut_off_reset", "connect_errors", "ws_connected",
                           "ws_reset", "ws_refused", "ws_errors"), 0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), stop.set)  # the parent writes a line (or closes stdin) to stop us
    tasks = [asyncio.create_task(_slow_client(port, stop, stats)) for _ in range(n_slow)]
    for i in range(n_ws):
        tasks.append(asyncio.create_task(_idle_ws(port, stop, stats)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)
    while not stop.is_set():
        print(json.dumps(stats), flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(stats), flush=True)


# ---------------------------------------------------------------------------- phases
def phase_load(pool: Path, n_slow: int, n_ws: int, probes: int, probe_s: float) -> dict[str, object]:
    proc, port = start_server(pool, sessions=max(8, n_ws), idle_s=None)
    rss0 = rss_mib(proc.pid)
    load = subprocess.Popen([sys.executable, __file__, "--load-port", str(port), "--slow", str(n_slow),
                             "--ws", str(n_ws)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        stats: dict[str, int] = {}
        assert load.stdout is not None and load.stdin is not None
        while time.monotonic() - t0 < 300:
            stats = json.loads(load.stdout.readline())
            if stats["ws_connected"] + stats["ws_errors"] + stats["ws_refused"] >= n_ws \
                    and stats["slow_connected"] >= n_slow:
                break
        ready_s = time.monotonic() - t0
        held = dict(stats)
        latencies = []
        t_probe = time.monotonic()
        while len(latencies) < probes or time.monotonic() - t_probe < probe_s:
            latencies.append(health(port) * 1000)
            time.sleep(0.02)
        rss1 = rss_mib(proc.pid)
        load.stdin.write("stop\n")
        load.stdin.flush()
        for line in load.stdout:
            stats = json.loads(line)
        load.wait(timeout=60)
    finally:
        if load.poll() is None:
            load.kill()
        proc.terminate()
        proc.wait(timeout=30)
    latencies.sort()
    return {"connected_when_probed": held, "seconds_to_connect_all": round(ready_s, 1),
            "health_ms_p50": round(statistics.median(latencies), 2),
            "health_ms_p99": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
            "health_ms_max": round(latencies[-1], 2), "probes": len(latencies),
            "probe_window_s": probe_s, "slow_clients_cut_off_at_head_deadline": stats["cut_off_408"],
            "server_rss_mib": [round(rss0), round(rss1)]}


def phase_recovery(pool: Path, idle_s: float) -> dict[str, object]:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    proc, port = start_server(pool, sessions=8, idle_s=idle_s)
    url = f"ws://127.0.0.1:{port}/ws"
    stack = contextlib.ExitStack()
    idle = []
    try:
        for _ in range(8):
            ws = stack.enter_context(connect(url))
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
            idle.append(ws)
        last_message = time.monotonic()
        with connect(url) as ninth:
            refused = json.loads(ninth.recv(timeout=30))["data"]["code"]
        attempts = 0
        while time.monotonic() - last_message < idle_s + 60:
            attempts += 1
            try:
                with connect(url) as ws:  # at capacity the server answers CAPACITY_REACHED and closes
                    ws.send(json.dumps({"type": "reset", "data": {"index": 3}}))
                    reply = json.loads(ws.recv(timeout=30))
            except ConnectionClosed:
                reply = {"type": "closed"}
            if reply["type"] == "observation":
                served_s = time.monotonic() - last_message
                break
            time.sleep(0.2)
        else:
            served_s = float("nan")
        codes = []
        for ws in idle:
            try:
                ws.recv(timeout=5)
                ws.recv(timeout=5)
            except Exception as exc:  # the close is what we look at
                codes.append(getattr(getattr(exc, "rcvd", None), "code", type(exc).__name__))
    finally:
        stack.close()
        proc.terminate()
        proc.wait(timeout=30)
    return {"idle_timeout_s": idle_s, "ninth_client": refused, "new_client_served_after_s": round(served_s, 2),
            "attempts": attempts, "idle_clients_closed_with": sorted(set(codes))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=1000, help="slow-header connections (phase 1)")
    parser.add_argument("--ws", type=int, default=1000, help="idle WebSocket sessions (phase 1)")
    parser.add_argument("--probes", type=int, default=300, help="/health requests measured (at least)")
    parser.add_argument("--probe-seconds", type=float, default=25.0,
                        help="probe for at least this long (past the 10 s head deadline, so slow clients are cut "
                             "off and reconnect meanwhile)")
    parser.add_argument("--idle", type=float, default=5.0, help="idle limit of the phase 2 server (seconds)")
    parser.add_argument("--load-port", type=int, help=argparse.SUPPRESS)  # internal: run as the load process
    args = parser.parse_args()
    for name in ("slow", "ws", "probes"):
        if not 0 <= getattr(args, name) <= 5000:
            parser.error(f"--{name} must be in 0..5000")
    if not 0 <= args.probe_seconds <= 600:
        parser.error("--probe-seconds must be in 0..600")
    if not 0.5 <= args.idle <= 120:
        parser.error("--idle must be in 0.5..120 seconds")
    limit = raise_open_files(3 * (args.slow + args.ws) + 256)
    if args.load_port:
        asyncio.run(_load(args.load_port, args.slow, args.ws))
        return
    with tempfile.TemporaryDirectory() as tmp:
        pool = write_pool(Path(tmp))
        print(f"open-file limit {limit}; machine: {os.cpu_count()} cores, shared and loaded", flush=True)
        print("phase 1 (load):", json.dumps(phase_load(pool, args.slow, args.ws, args.probes,
                                                                  args.probe_seconds)), flush=True)
        print("phase 2 (recovery):", json.dumps(phase_recovery(pool, args.idle)), flush=True)


if __name__ == "__main__":
    main()
