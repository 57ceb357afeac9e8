"""How fast the dashboard answers on a long run: 10,000 steps of 64 groups over the bundled 2,550-task pool.

Writes (once; cached under /tmp) a SQLite history store with a real sampler, the real reward simulation and a
real :class:`~envsched.store.DurableSampler` (one transaction per step: ``update_many`` of the batch's 64
groups, then the next ``sample``), then starts ``envsched dashboard`` on 127.0.0.1 and times:

* the dashboard's start: opening the store read-only and indexing every event;
* the page (``GET /``) and each JSON endpoint it loads, cold and warm (median of ``--repeat`` requests);
* how long a newly committed step takes to appear in ``/api/state`` (the live path).

    PYTHONPATH=src python benchmarks/dashboard_load.py [--steps 10000] [--sampler mopps] [--json out.json]

Figures from one run are in docs/dashboard.md (taken on a loaded 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any


def build_store(path: Path, *, steps: int, sampler_name: str, batch_size: int = 64, group_size: int = 8,
                seed: int = 0) -> Path:
    """Write a run of ``steps`` batches to ``path`` (skipped when a complete one is already there)."""
    from envsched.envs.default_pool import default_pool
    from envsched.samplers.registry import make_sampler
    from envsched.simulation.rewards import StochasticRewardSource
    from envsched.store import DurableSampler, HistoryStore

    done = path.with_suffix(".done")
    if path.exists() and done.exists() and done.read_text().strip() == f"{steps} {sampler_name}":
        return path
    for extra in ("", "-wal", "-shm"):
        Path(str(path) + extra).unlink(missing_ok=True)
    done.unlink(missing_ok=True)
    pool = default_pool()
    sampler = make_sampler(sampler_name, pool, seed=seed, group_size=group_size)
    durable = DurableSampler(sampler, HistoryStore(path, synchronous="NORMAL"), group_size=group_size,
                             snapshot_every=20_000)
    source = StochasticRewardSource(pool, seed=seed)
    t0 = time.perf_counter()
    tasks = durable.sample(batch_size)
    for step in range(1, steps + 1):
        items = []
        for task in tasks:
            rewards, costs = source.rollout(task, group_size)
            items.append((task, rewards, costs, None))
        results = durable.update_many(items)
        assert all(r == "applied" for r in results), results
        if step < steps:
            tasks = durable.sample(batch_size)
        if step % 1000 == 0:
            print(f"  wrote step {step}/{steps} ({time.perf_counter() - t0:.0f} s)", flush=True)
    durable.close()
    done.write_text(f"{steps} {sampler_name}")
    return path


def _resume(path: Path, sampler_name: str, group_size: int = 8, seed: int = 0) -> tuple[object, object]:
    """The run's sampler, rebuilt from its store (to write more steps), and its reward source."""
    from envsched.envs.default_pool import default_pool
    from envsched.samplers.registry import make_sampler
    from envsched.simulation.rewards import StochasticRewardSource
    from envsched.store import DurableSampler, HistoryStore

    pool = default_pool()
    sampler = make_sampler(sampler_name, pool, seed=seed, group_size=group_size)
    durable = DurableSampler(sampler, HistoryStore(path, synchronous="NORMAL"), group_size=group_size,
                             snapshot_every=20_000)
    return durable, StochasticRewardSource(pool, seed=seed + 1)


def measure_live(path: Path, base: str, sampler_name: str, steps: int) -> list[float]:
    """Seconds from the commit of a new step (a draw and its 64 updates) to the dashboard's views showing it
    (``/api/views`` at the new step count), polled every 20 ms. The page polls ``/api/state`` every 0.5 s,
    so a browser shows the step at most about 0.5 s after that."""
    durable, source = _resume(path, sampler_name)
    out = []
    for _ in range(steps):
        tasks = durable.sample(64)  # type: ignore[attr-defined]
        items = [(t, *source.rollout(t, 8), None) for t in tasks]  # type: ignore[attr-defined]
        durable.update_many(items)  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        want = None
        while True:
            with urllib.request.urlopen(base + "/api/state", timeout=60) as resp:
                st = json.loads(resp.read())
            if want is None:
                want = st["head"]
            if st["caught_up"] and st["seq"] >= durable.seq:  # type: ignore[attr-defined]
                with urllib.request.urlopen(base + "/api/views", timeout=60) as resp:
                    views = json.loads(resp.read())
                if views["seq"] >= durable.seq:  # type: ignore[attr-defined]
                    break
            time.sleep(0.02)
        out.append(time.perf_counter() - t0)
    durable.close()  # type: ignore[attr-defined]
    return out


def measure_live_browser(path: Path, base: str, sampler_name: str, steps: int) -> list[float]:
    """Seconds from the commit of a new step to headless Chromium showing it (the coverage view's step count
    attribute changes after the redraw), with the page open throughout."""
    import tempfile

    from playwright.sync_api import sync_playwright

    durable, source = _resume(path, sampler_name)
    out = []
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                                   headless=True, viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.new_page()
            page.goto(base + "/")
            page.wait_for_selector("body[data-version]", state="attached", timeout=120_000)
            for _ in range(steps):
                shown = int(page.get_attribute("#fig-coverage", "data-steps") or 0)
                tasks = durable.sample(64)  # type: ignore[attr-defined]
                items = [(t, *source.rollout(t, 8), None) for t in tasks]  # type: ignore[attr-defined]
                durable.update_many(items)  # type: ignore[attr-defined]
                t0 = time.perf_counter()
                page.wait_for_selector(f"#fig-coverage[data-steps='{shown + 1}']", state="attached", timeout=60_000)
                out.append(time.perf_counter() - t0)
        finally:
            ctx.close()
    durable.close()  # type: ignore[attr-defined]
    return out


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def browser_page_ready(base: str, repeat: int) -> tuple[list[float], dict[str, float]]:
    """Seconds from navigation to every view drawn, in headless Chromium (Playwright with the system browser):
    the page loaded, plotly.js parsed, the views fetched and drawn (``body[data-version]`` set after the
    last ``Plotly.react``)."""
    import tempfile

    from playwright.sync_api import sync_playwright

    out, stages = [], {}
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                                   headless=True, viewport={"width": 1400, "height": 1000})
        try:
            for _ in range(repeat):
                page = ctx.new_page()
                t0 = time.perf_counter()
                page.goto(base + "/")
                page.wait_for_selector("body[data-version]", state="attached", timeout=120_000)
                out.append(time.perf_counter() - t0)
                stages = page.evaluate("window.envschedTimings")
                page.close()
        finally:
            ctx.close()
    return out, stages


def _get(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as resp:
        body = resp.read()
    return time.perf_counter() - t0, len(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--sampler", default="mopps")
    ap.add_argument("--store", type=Path, default=None, help="default: /tmp/envsched-dashboard-<steps>.sqlite")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--live-steps", type=int, default=5, help="new steps written to a copy to time the live path")
    ap.add_argument("--no-browser", action="store_true", help="skip the timing in headless Chromium")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    store = args.store or Path(f"/tmp/envsched-dashboard-{args.steps}-{args.sampler}.sqlite")
    t0 = time.perf_counter()
    build_store(store, steps=args.steps, sampler_name=args.sampler)
    print(f"store {store} ready ({time.perf_counter() - t0:.1f} s; {store.stat().st_size / 1e6:.0f} MB)")

    import uvicorn

    from envsched.dashboard.app import create_app

    t0 = time.perf_counter()
    app = create_app(str(store), start=False)
    app.state.dashboard.index.refresh()  # index every event before serving, to time the page alone
    app.state.dashboard.views_json()
    start_s = time.perf_counter() - t0
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"store": str(store), "steps": args.steps, "sampler": args.sampler,
                           "start_index_s": round(start_s, 3)}
    print(f"dashboard start (open read-only, index all {args.steps * 65:,} events, compute the views): {start_s:.2f} s")
    # the page: the HTML, then what its script loads at once (plotly.js, the views)
    for name, path in (("page", "/"), ("plotly_js", "/static/plotly.min.js"), ("state", "/api/state"),
                       ("views", "/api/views"), ("picks", "/api/picks?limit=200")):
        cold, size = _get(base + path)
        warm = statistics.median(_get(base + path)[0] for _ in range(args.repeat))
        out[name] = {"cold_s": round(cold, 4), "warm_median_s": round(warm, 4), "bytes": size}
        print(f"  {path:<24} cold {cold * 1e3:7.1f} ms, warm median {warm * 1e3:7.1f} ms, {size:,} bytes")
    ready = sum(out[k]["cold_s"] for k in ("page", "plotly_js", "state", "views", "picks"))
    out["page_ready_s"] = round(ready, 3)
    print(f"page ready (HTML + plotly.js + state + views + picks, sequential, cold): {ready:.3f} s")
    if Path(CHROMIUM).exists() and not args.no_browser:
        times, stages = browser_page_ready(base, args.repeat)
        out["browser_page_ready_s"] = [round(x, 3) for x in times]
        out["browser_last_load_stages_ms"] = {k: round(v) for k, v in stages.items()}
        print(f"page ready in headless Chromium (navigation -> every view drawn): first {times[0]:.2f} s, "
              f"median {statistics.median(times):.2f} s over {len(times)} loads; last load, ms since "
              f"navigation: {out['browser_last_load_stages_ms']}")
    server.should_exit = True
    thread.join(timeout=10)
    if args.live_steps:
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory(dir=store.parent) as tmp:
            copy = Path(tmp) / "live.sqlite"
            shutil.copyfile(store, copy)  # the cached store stays as it is
            app = create_app(str(copy))
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
            thread = threading.Thread(target=server.run, daemon=True)
            thread.start()
            while not server.started:
                time.sleep(0.01)
            base = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
            while not json.loads(urllib.request.urlopen(base + "/api/state", timeout=60).read())["caught_up"]:
                time.sleep(0.2)
            _get(base + "/api/views")
            lat = measure_live(copy, base, args.sampler, args.live_steps)
            out["live_commit_to_views_s"] = [round(x, 3) for x in lat]
            print(f"live: commit of a new step -> views updated: median {statistics.median(lat):.2f} s, max "
                  f"{max(lat):.2f} s over {len(lat)} steps (+ up to 0.5 s until the page's next poll)")
            if Path(CHROMIUM).exists() and not args.no_browser:
                lat = measure_live_browser(copy, base, args.sampler, args.live_steps)
                out["live_commit_to_browser_s"] = [round(x, 3) for x in lat]
                print(f"live: commit of a new step -> shown in headless Chromium: median "
                      f"{statistics.median(lat):.2f} s, max {max(lat):.2f} s over {len(lat)} steps")
            server.should_exit = True
            thread.join(timeout=10)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
