"""The dashboard's HTTP app (Starlette's test client over the real app, store and run file)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import plotly.graph_objects as go
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from envsched.cli.main import cli
from envsched.dashboard.app import CSP, create_app, is_loopback

from .conftest import HOSTILE_ID, HOSTILE_INSTRUCTION


@pytest.fixture
def app_and_run(tmp_path, run_writer):
    store, run_file = tmp_path / "run.sqlite", tmp_path / "run.jsonl"
    w = run_writer(store, run_file).run(4)
    app = create_app(str(store), run_file=str(run_file), start=False)
    app.state.dashboard.tick()
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield app, client, w
    app.state.dashboard.stop()


def test_page_and_static_files_are_served_with_a_strict_policy(app_and_run):
    _, client, _ = app_and_run
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe-eval" not in CSP
    assert '<script src="/static/plotly.min.js">' in page.text and "http" not in page.text.replace("http-equiv", "")
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and "plotly" in js.text[:2000].lower() and len(js.content) > 1_000_000
    assert client.get("/static/dashboard.js").status_code == 200
    for bad in ("/static/..%2Fapp.py", "/static/../../etc/passwd", "/static/reader.py", "/etc/passwd",
                "/static/%2e%2e/%2e%2e/pyproject.toml"):
        r = client.get(bad)
        assert r.status_code == 404, bad


def test_views_are_valid_plotly_figures_and_follow_the_run(app_and_run):
    app, client, w = app_and_run
    views = client.get("/api/views").json()
    assert views["steps"] == 4 and views["summary"]["explained_picks"] == 4 * 12
    for name, fig in views["figures"].items():
        go.Figure(fig)  # plotly's own validation: raises on any property plotly.js does not know
        assert fig["layout"]["title"]["text"], name
    assert views["figures"]["coverage"]["data"][0]["x"] == [1, 2, 3, 4]
    phases = {tr["name"].split(" ")[0] for tr in views["figures"]["reliability"]["data"][1:]}
    assert phases and phases <= {"cold_start", "coverage", "exploitation", "fill"}
    # a draw and 12 updates per step
    assert views["metrics"]["groups"] == 4 * 12 and views["metrics"]["store_events"] == 4 * 13
    state = client.get("/api/state").json()
    assert state["steps"] == 4 and state["caught_up"] and state["error"] is None
    w.step()
    app.state.dashboard.tick()
    assert client.get("/api/state").json()["steps"] == 5
    assert client.get("/api/views").json()["figures"]["coverage"]["data"][0]["x"] == [1, 2, 3, 4, 5]


def test_picks_are_searchable_and_carry_the_explanations(app_and_run):
    _, client, _ = app_and_run
    latest = client.get("/api/picks").json()["rows"]
    assert latest and {r["step"] for r in latest} <= {2, 3, 4} and latest[0]["step"] == 4
    assert all(r["phase"] in ("cold_start", "coverage", "exploitation", "fill") for r in latest)
    assert all(r["reasons"] and r["status"] == "updated" for r in latest)
    one = client.get("/api/picks", params={"step": 2}).json()["rows"]
    assert len(one) == 12 and {r["step"] for r in one} == {2}
    env1 = client.get("/api/picks", params={"task": "ENV1/"}).json()["rows"]
    assert env1 and all(r["task_id"].startswith("env1/") for r in env1)
    assert client.get("/api/picks", params={"step": "x"}).status_code == 400


def test_hostile_instruction_travels_as_data_never_as_markup(tmp_path, run_writer):
    store = tmp_path / "run.sqlite"
    w = run_writer(store, None, sampler="uniform", batch_size=49).run(1)  # the whole pool: the hostile task too
    app = create_app(str(store), start=False)
    app.state.dashboard.tick()
    with TestClient(app, base_url="http://127.0.0.1") as client:
        rows = client.get("/api/picks", params={"task": HOSTILE_ID}).json()["rows"]
        assert [r["instruction"] for r in rows] == [HOSTILE_INSTRUCTION]
        assert HOSTILE_INSTRUCTION not in client.get("/").text
    app.state.dashboard.stop()
    w.close()


def test_host_header_must_name_this_machine(app_and_run):
    app, _, _ = app_and_run
    with TestClient(app, base_url="http://evil.example") as client:
        assert client.get("/api/state").status_code == 400
    with TestClient(app, base_url="http://localhost:8080") as client:
        assert client.get("/api/state").status_code == 200
    app.state.dashboard.stop()
    store = app.state.dashboard.reader.where
    named = create_app(store, host="10.1.2.3", start=False)
    with TestClient(named, base_url="http://10.1.2.3:8080") as client:
        assert client.get("/api/state").status_code == 200
    with TestClient(named, base_url="http://evil.example") as client:
        assert client.get("/api/state").status_code == 400
    named.state.dashboard.stop()


def test_loopback_only_unless_asked(tmp_path, run_writer):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.com")
    store = tmp_path / "run.sqlite"
    run_writer(store, None, sampler="uniform", batch_size=4).run(1)
    res = CliRunner().invoke(cli, ["dashboard", str(store), "--host", "0.0.0.0"])
    assert res.exit_code == 2 and "not a loopback address" in res.output and "--allow-remote" in res.output
    res = CliRunner().invoke(cli, ["dashboard", str(tmp_path / "missing.sqlite")])
    assert res.exit_code == 1 and "store not found" in res.output
    assert not (tmp_path / "missing.sqlite").exists()


def test_state_reports_a_store_that_became_unreadable(tmp_path, run_writer):
    store = tmp_path / "run.sqlite"
    run_writer(store, None, sampler="uniform", batch_size=4).run(1)
    app = create_app(str(store), start=False)
    dash = app.state.dashboard
    dash.tick()
    store.rename(tmp_path / "moved.sqlite")  # each read opens the store anew: now it is gone
    dash.tick()
    assert "run.sqlite" in dash.state()["error"] and json.dumps(dash.state())
    dash.stop()


def _dashboard(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "envsched.cli.main", "dashboard", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, text=True)


@pytest.mark.slow
def test_cli_serves_the_dashboard_on_loopback_and_prints_the_url_it_serves(tmp_path, run_writer):
    """With --port 0 the system picks the port: the line printed names that port (it said :0), once bound."""
    store = tmp_path / "run.sqlite"
    run_writer(store, None, sampler="uniform", batch_size=4).run(2)
    proc = _dashboard(str(store), "--port", "0")
    try:
        line = proc.stdout.readline()  # printed after the port is bound: it can be fetched at once
        m = re.fullmatch(r"envsched dashboard: (http://127\.0\.0\.1:(\d+)/) \(read-only; Ctrl-C to stop\)\n", line)
        assert m and int(m.group(2)) > 0, line
        deadline = time.monotonic() + 120  # a guard against a hang
        while True:
            with urllib.request.urlopen(m.group(1) + "api/state", timeout=5) as resp:
                state = json.loads(resp.read())
            if state["caught_up"]:
                break
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        assert state["steps"] == 2 and state["error"] is None
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: a quiet stop
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in out and "Aborted" not in out, out


@pytest.mark.slow
def test_cli_says_in_one_line_why_it_cannot_serve_before_any_url(tmp_path, run_writer):
    """A port in use printed the 'serving at' line, then uvicorn's 'ERROR: [Errno 98]', and exited 3; a file
    that is not a store printed the URL before the error. Now: one line, status 1, no URL."""
    store = tmp_path / "run.sqlite"
    run_writer(store, None, sampler="uniform", batch_size=4).run(1)
    not_a_store = tmp_path / "notes.sqlite"
    not_a_store.write_text("these are notes, not a store\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = {
            "port in use": ([str(store), "--port", str(port)],
                            rf"cannot serve on 127\.0\.0\.1:{port}: address already in use \(another program listens "
                            r"there; choose another --port, or --port 0 for any free one\)"),
            "not a store": ([str(not_a_store), "--port", "0"], r"store .*notes\.sqlite: file is not a database"),
            "not a store, port in use": ([str(not_a_store), "--port", str(port)],
                                         r"store .*notes\.sqlite: file is not a"),
            "address not this machine's": ([str(store), "--host", "::2", "--allow-remote", "--port", "0"],
                                           r"cannot serve on \[::2\]:0: .*not one of this machine"),
        }
        for name, (args, match) in cases.items():
            proc = _dashboard(*args)
            out, _ = proc.communicate(timeout=120)
            lines = out.strip().splitlines()
            assert proc.returncode == 1 and len(lines) == 1 and re.search("^Error: " + match, lines[0]), (name, out)
            assert "http://" not in out, (name, out)


def test_a_run_file_of_another_run_is_flagged(tmp_path, run_writer):
    store, other = tmp_path / "run.sqlite", tmp_path / "other.jsonl"
    run_writer(store, None, sampler="uniform", batch_size=4).run(2)
    from .conftest import make_pool

    run_writer(tmp_path / "other.sqlite", other, pool=make_pool(3, 4)).run(1)
    app = create_app(str(store), run_file=str(other), start=False)
    app.state.dashboard.tick()
    warnings = json.loads(app.state.dashboard.views_json())["summary"]["warnings"]
    assert any("pool of 13 tasks, the store has 49" in w for w in warnings), warnings
    app.state.dashboard.stop()
