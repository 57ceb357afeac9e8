"""A store is data, never instructions: crafted history stores and lease calls (issue 23, findings 2, 3, 8, 9).

Every crafted store is a real SQLite file built by a real ``DurableSampler`` and then edited with ``sqlite3``
the way an attacker with the file (or an unlucky operator) would. Each case is run through
``envsched store verify`` (and, where the library path differs, ``DurableSampler.resume``) while watching:

* **outbound connections**: a listener on 127.0.0.1 that every crafted address points at must accept
  nothing, and no socket may connect anywhere (``socket.connect`` is observed, then called);
* **processes**: ``os.fork``, ``subprocess.Popen`` and ``multiprocessing`` starts are observed (none allowed);
* **writes**: every file under the case's folder (store included, for verify) keeps its size, mtime and
  SHA-256; files a store names (run files, caches, pipes) are not created or touched;
* **hangs**: each case runs under a generous 60 s alarm (a named pipe opened for reading would block forever);
* **clear errors**: a refused store exits with status 1 and a one-line reason, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing.process
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.distributed import SamplerHost
from envsched.pool import TaskPool
from envsched.samplers import UniformSampler
from envsched.store import (
    DurableSampler,
    HistoryStore,
    LeaseConflictError,
    StoreCorruptError,
    StoreError,
)
from envsched.store.history import _chain, canonical_json, genesis_digest

HANG_BOUND_S = 60


def _pool() -> TaskPool:
    return TaskPool([{"id": f"t{i:02d}", "env": f"env{i % 3}", "difficulty": i % 4} for i in range(12)])


# ---------------------------------------------------------------------------------------------- watchers
class _Listener:
    """A TCP listener on 127.0.0.1 that counts the connections it accepts (every crafted address points here)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@dataclass
class Watch:
    """What a case did: connections attempted, processes started."""

    connects: list[Any] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def listener() -> Iterator[_Listener]:
    srv = _Listener()
    yield srv
    srv.close()


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Watch:
    """Observe (then perform) every socket connect and process start of the case."""
    w = Watch()
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_fork, real_popen = os.fork, subprocess.Popen.__init__
    real_start = multiprocessing.process.BaseProcess.start

    def connect(self: socket.socket, address: Any) -> Any:
        w.connects.append(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        w.connects.append(address)
        return real_connect_ex(self, address)

    def fork() -> int:
        w.processes.append("os.fork")
        return real_fork()

    def popen(self: Any, *args: Any, **kwargs: Any) -> None:
        w.processes.append(f"Popen {args[:1]!r}")
        real_popen(self, *args, **kwargs)

    def start(self: Any) -> None:
        w.processes.append("multiprocessing start")
        real_start(self)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(os, "fork", fork)
    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    return w


def _tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``root``: size, mtime (ns) and SHA-256 (named pipes and devices by their mode only)."""
    out: dict[str, tuple[int, int, str]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        if p.is_symlink() or not p.is_file():
            out[str(p)] = (st.st_mode, 0, "special")
            continue
        out[str(p)] = (st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


class _Hang(Exception):
    pass


def _bounded(call: Callable[[], Any]) -> Any:
    """Run ``call`` under a generous alarm: a hang (e.g. a named pipe opened for reading) fails the case."""

    def fire(*_: Any) -> None:
        raise _Hang(f"the case ran for more than {HANG_BOUND_S} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(HANG_BOUND_S)
    try:
        return call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------------------------------- base stores
def _uniform_store(path: Path) -> None:
    """A UniformSampler store with leases, updates, a discard and snapshots (every 4 events)."""
    d = DurableSampler(UniformSampler(_pool(), seed=3), path, snapshot_every=4, group_size=2)
    for n in range(4):
        leases = [f"lease-{n}-{j}" for j in range(2)]
        tasks = d.sample(2, leases=leases)
        d.update(tasks[0], [1.0, 0.0], lease=leases[0])
        d.discard(tasks[1], lease=leases[1], reason="test")
    d.close()


def _envsched_store(path: Path) -> None:
    from envsched.method.sampler import EnvSchedSampler

    d = DurableSampler(EnvSchedSampler(_pool(), seed=0), path, snapshot_every=4)
    for _ in range(2):
        for t in d.sample(4):
            d.update(t, [1.0, 0.0])
    d.close()


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    out = {"uniform": root / "uniform.sqlite", "envsched": root / "envsched.sqlite"}
    _uniform_store(out["uniform"])
    _envsched_store(out["envsched"])
    return out


# ---------------------------------------------------------------------------------------------- editing
@dataclass
class Ctx:
    """One case: its folder, the store in it, the listener's address, and files a store may name."""

    root: Path
    store: Path
    url: str
    outside: Path  # a folder next to the case's: nothing may appear in or change under it

    def sql(self, *statements: str, params: tuple[Any, ...] = ()) -> None:
        conn = sqlite3.connect(self.store)
        with conn:
            for s in statements:
                conn.execute(s, params) if params else conn.execute(s)
        conn.close()

    def meta(self, key: str) -> Any:
        conn = sqlite3.connect(self.store)
        (value,) = conn.execute("SELECT value FROM envsched_meta WHERE key = ?", (key,)).fetchone()
        conn.close()
        return json.loads(value)

    def set_raw(self, key: str, text: str) -> None:
        self.sql("INSERT INTO envsched_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
                 "value = excluded.value", params=(key, text))

    def set(self, key: str, value: Any) -> None:
        self.set_raw(key, json.dumps(value))

    def graph_config(self, **changes: Any) -> None:
        graph = self.meta("graph")
        graph["config"].update(changes)
        self.set("graph", graph)

    def params(self, **changes: Any) -> None:
        params = self.meta("sampler_params")
        params.update(changes)
        self.set("sampler_params", params)

    def fifo(self, name: str = "pipe") -> Path:
        p = self.outside / name
        os.mkfifo(p)
        return p

    def rechain(self, keep: int) -> None:
        """Cut the log after event ``keep`` and rewrite the head to match, as someone with write access
        who knows the (public) chain rule would."""
        conn = sqlite3.connect(self.store)
        with conn:
            conn.execute("DELETE FROM envsched_events WHERE seq > ?", (keep,))
            (digest,) = conn.execute("SELECT digest FROM envsched_events WHERE seq = ?", (keep,)).fetchone()
            conn.execute("UPDATE envsched_meta SET value = ? WHERE key = 'head'",
                         (canonical_json({"seq": keep, "digest": digest}),))
        conn.close()


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# Each case: (id, base store, edit, expectation). Expectation: ("refused", regex of the one-line reason) or
# ("ok", regex every note line must include, or None).
Edit = Callable[[Ctx], None]
CASES: list[tuple[str, str, Edit, tuple[str, str | None]]] = [
    # --- finding 2: the graph recipe must not call out, fork, or read a path the store names
    ("llm-endpoint-listener", "envsched",
     lambda c: c.graph_config(abstraction="llm", llm_endpoint=c.url, llm_model="m"),
     ("refused", r"graph\.config\.abstraction.*never chooses an address.*--graph")),
    ("llm-endpoint-https", "envsched",
     lambda c: c.graph_config(abstraction="llm", llm_endpoint=c.url.replace("http", "https"), llm_model="m"),
     ("refused", r"never chooses an address")),
    ("llm-endpoint-no-path", "envsched",
     lambda c: c.graph_config(abstraction="llm", llm_endpoint=c.url.rsplit("/", 1)[0], llm_model="m"),
     ("refused", r"never chooses an address")),
    ("llm-abstraction-odd-name", "envsched",
     lambda c: c.graph_config(abstraction="LLM ", llm_endpoint=c.url, llm_model="m"),
     ("refused", r"never chooses an address")),
    ("llm-endpoint-with-static", "envsched",
     lambda c: c.graph_config(llm_endpoint=c.url, llm_model="m"),
     ("ok", r"llm_(endpoint|model) is not used")),
    ("llm-cache-dir", "envsched",
     lambda c: c.graph_config(llm_cache_dir=str(c.outside / "cache")),
     ("ok", r"llm_cache_dir is not used")),
    ("workers-24", "envsched", lambda c: c.graph_config(workers=24),
     ("ok", r"graph\.config\.workers \(24\) is not used")),
    ("workers-24-parallel-from-0", "envsched", lambda c: c.graph_config(workers=24, parallel_min_tasks=0),
     ("ok", r"workers \(24\) is not used")),
    ("ann-threads-64", "envsched", lambda c: c.graph_config(ann_threads=64),
     ("ok", r"ann_threads \(64\) is not used")),
    ("graph-path-named-pipe", "envsched", lambda c: c.set("graph", {**c.meta("graph"), "path": str(c.fifo())}),
     ("ok", r"graph\.path .* is not opened.*--graph PATH")),
    ("graph-path-dev-zero", "envsched", lambda c: c.set("graph", {**c.meta("graph"), "path": "/dev/zero"}),
     ("ok", r"graph\.path \(/dev/zero\) is not opened")),
    ("graph-path-missing", "envsched",
     lambda c: c.set("graph", {**c.meta("graph"), "path": str(c.outside / "nope.npz")}),
     ("ok", r"is not opened")),
    ("graph-path-directory", "envsched", lambda c: c.set("graph", {**c.meta("graph"), "path": str(c.outside)}),
     ("ok", r"is not opened")),
    ("graph-path-url", "envsched", lambda c: c.set("graph", {**c.meta("graph"), "path": c.url + "/g.npz"}),
     ("ok", r"is not opened")),
    ("graph-path-proc", "envsched",
     lambda c: c.set("graph", {**c.meta("graph"), "path": "/proc/self/mem"}), ("ok", r"is not opened")),
    ("k-within-huge", "envsched", lambda c: c.graph_config(k_within=100_000_000),
     ("refused", r"graph\.config\.k_within is 100000000")),
    ("k-cross-string", "envsched", lambda c: c.graph_config(k_cross="12"), ("refused", r"k_cross")),
    ("exact-block-rows-huge", "envsched", lambda c: c.graph_config(exact_block_rows=10**12),
     ("refused", r"exact_block_rows")),
    ("context-chars-huge", "envsched", lambda c: c.graph_config(initial_context_max_chars=10**12),
     ("refused", r"initial_context_max_chars")),
    ("graph-config-unknown-field", "envsched", lambda c: c.graph_config(module="os"),
     ("refused", r"unknown GraphConfig field")),
    ("graph-not-object", "envsched", lambda c: c.set("graph", "pool.graph.npz"),
     ("refused", r"'graph' is a str")),
    ("graph-list", "envsched", lambda c: c.set("graph", []), ("refused", r"'graph' is a list")),
    ("graph-no-fingerprint", "envsched",
     lambda c: c.set("graph", {k: v for k, v in c.meta("graph").items() if k != "fingerprint"}),
     ("refused", r"'graph' lacks a fingerprint")),
    ("graph-path-number", "envsched", lambda c: c.set("graph", {**c.meta("graph"), "path": 7}),
     ("refused", r"'graph' lacks a fingerprint, or its config, path")),
    ("graph-fingerprint-other", "envsched", lambda c: c.set("graph", {**c.meta("graph"), "fingerprint": "0" * 64}),
     ("refused", r"graph of fingerprint 000000000000")),
    ("scheduler-config-unknown-field", "envsched",
     lambda c: c.params(config={**c.meta("sampler_params")["config"], "hook": "os:system"}),
     ("refused", r"unknown SchedulerConfig field")),
    # --- finding 3: a path to write
    ("run-file-outside", "envsched", lambda c: c.params(run_file=str(c.outside / "explain.jsonl")),
     ("ok", r"sampler_params\.run_file .* is not written.*run_file=PATH")),
    ("run-file-named-pipe", "envsched", lambda c: c.params(run_file=str(c.fifo("run"))), ("ok", r"not written")),
    ("run-file-dev-full", "envsched", lambda c: c.params(run_file="/dev/full"), ("ok", r"not written")),
    ("run-file-symlink", "envsched", lambda c: (
        (c.outside / "target.txt").write_text("keep"),
        os.symlink(c.outside / "target.txt", c.outside / "link.jsonl"),
        c.params(run_file=str(c.outside / "link.jsonl"))), ("ok", r"not written")),
    ("run-file-in-etc", "envsched", lambda c: c.params(run_file="/etc/envsched-should-not-exist.jsonl"),
     ("ok", r"not written")),
    ("extra-param-callback", "envsched", lambda c: c.params(callback="os:system"),
     ("refused", r"cannot construct .*callback")),
    # --- a class or module to import
    ("class-os-system", "uniform", lambda c: c.set("sampler_class", "os:system"),
     ("refused", r"not a registered envsched sampler class")),
    ("class-subprocess-popen", "uniform", lambda c: c.set("sampler_class", "subprocess:Popen"),
     ("refused", r"not a registered")),
    ("class-builtins-eval", "uniform", lambda c: c.set("sampler_class", "builtins:eval"),
     ("refused", r"not a registered")),
    ("class-dunder-walk", "uniform",
     lambda c: c.set("sampler_class", "envsched.samplers.simple:UniformSampler.__init__.__globals__"),
     ("refused", r"not a registered")),
    ("class-trailing-space", "uniform",
     lambda c: c.set("sampler_class", "envsched.samplers.simple:UniformSampler "), ("refused", r"not a registered")),
    ("class-list", "uniform", lambda c: c.set("sampler_class", ["os", "system"]),
     ("refused", r"'sampler_class' is a list")),
    ("params-extra-kwarg", "uniform", lambda c: c.params(command="id"), ("refused", r"cannot construct")),
    ("params-not-object", "uniform", lambda c: c.set("sampler_params", ["seed", 3]),
     ("refused", r"'sampler_params' is a list")),
    # --- finding 9: edited metadata values end in a clear error
    ("group-size-string", "uniform", lambda c: c.set("group_size", "2"),
     ("refused", r"'group_size' is a string \('2'\)")),
    ("group-size-negative", "uniform", lambda c: c.set("group_size", -1),
     ("refused", r"'group_size' is the number -1")),
    ("group-size-bool", "uniform", lambda c: c.set("group_size", True), ("refused", r"'group_size'")),
    ("group-size-huge", "uniform", lambda c: c.set("group_size", 10**12), ("refused", r"'group_size'")),
    ("group-size-other", "uniform", lambda c: c.set("group_size", 3),
     ("refused", r"event \d+ \(update\) has 2 rewards, but the store records group_size=3")),
    ("num-tasks-wrong", "uniform", lambda c: c.set("num_tasks", 13), ("refused", r"'num_tasks' says 13")),
    ("num-tasks-string", "uniform", lambda c: c.set("num_tasks", "12"), ("refused", r"'num_tasks' is a str")),
    ("num-tasks-negative", "uniform", lambda c: c.set("num_tasks", -1), ("refused", r"'num_tasks' is -1")),
    ("tasks-object", "uniform", lambda c: c.set("tasks", {"t00": {}}),
     ("refused", r"'tasks' is an object, expected a list")),
    ("tasks-edited", "uniform", lambda c: c.set("tasks", [{**t, "env": "evil"} for t in c.meta("tasks")]),
     ("refused", r"another pool|fingerprint")),
    ("nested-params", "uniform", lambda c: c.set_raw("sampler_params", _nested(100_000)),
     ("refused", r"'sampler_params' is JSON nested too deeply")),
    ("nested-tasks", "uniform", lambda c: c.set_raw("tasks", _nested(50_000)), ("refused", r"nested too deeply")),
    ("nested-head", "uniform", lambda c: c.set_raw("head", _nested(50_000)), ("refused", r"nested too deeply")),
    ("nested-extra-key", "uniform", lambda c: c.set_raw("note", _nested(50_000)), ("refused", r"nested too deeply")),
    ("nested-snapshot", "uniform",
     lambda c: c.sql(f"UPDATE envsched_snapshots SET state = '{_nested(50_000)}' WHERE seq > 0"),
     ("refused", r"snapshot after event \d+ is JSON nested too deeply")),
    ("snapshot-not-json", "uniform", lambda c: c.sql("UPDATE envsched_snapshots SET state = '{' WHERE seq > 0"),
     ("refused", r"snapshot after event \d+ is not valid JSON")),
    ("meta-not-json", "uniform", lambda c: c.set_raw("group_size", "{{"), ("refused", r"'group_size' is not valid")),
    ("reward-range-reversed", "uniform", lambda c: c.set("reward_range", [1.0, 0.0]), ("refused", r"reward_range")),
    ("reward-range-strings", "uniform", lambda c: c.set("reward_range", ["a", 1]), ("refused", r"reward_range")),
    ("reward-range-nan", "uniform", lambda c: c.set_raw("reward_range", "[NaN, 1.0]"), ("refused", r"reward_range")),
    ("params-rebuildable-string", "uniform", lambda c: c.set("params_rebuildable", "yes"),
     ("refused", r"params_rebuildable")),
    ("format-other", "uniform", lambda c: c.set("format", "envsched.store/99"), ("refused", r"format")),
    ("store-id-number", "uniform", lambda c: c.set("store_id", 7),
     ("refused", r"'store_id' is the number 7, expected a string")),
    ("head-malformed", "uniform", lambda c: c.set("head", {"seq": "x"}), ("refused", r"'head' is malformed")),
    ("head-ahead", "uniform", lambda c: c.set("head", {**c.meta("head"), "seq": 99}),
     ("refused", r"event\(s\) at the end of the log were lost")),
    ("pool-fingerprint-edited", "uniform", lambda c: c.set("pool_fingerprint", "0" * 64),
     ("refused", r"another pool")),
    # --- finding 9: edited stores accepted before
    ("trigger-on-events", "uniform", lambda c: c.sql(
        "CREATE TRIGGER evil AFTER INSERT ON envsched_events BEGIN DELETE FROM envsched_events; END"),
     ("refused", r"trigger 'evil'.*edited")),
    ("trigger-on-meta", "uniform", lambda c: c.sql(
        "CREATE TRIGGER evil2 BEFORE UPDATE ON envsched_meta BEGIN SELECT 1; END"), ("refused", r"trigger 'evil2'")),
    ("trigger-on-leases", "uniform", lambda c: c.sql(
        "CREATE TRIGGER evil3 AFTER UPDATE ON envsched_leases BEGIN SELECT 1; END"), ("refused", r"trigger")),
    ("lease-table-dropped", "uniform", lambda c: c.sql("DROP TABLE envsched_leases"),
     ("refused", r"lease table envsched_leases is missing.*dropped")),
    ("lease-table-dropped-flag-removed", "uniform",
     lambda c: c.sql("DROP TABLE envsched_leases", "DELETE FROM envsched_meta WHERE key = 'lease_table'"),
     ("refused", r"lease table envsched_leases is missing")),
    ("lease-row-removed", "uniform", lambda c: c.sql("DELETE FROM envsched_leases WHERE lease = 'lease-0-0'"),
     ("refused", r"lease table does not match the events")),
    ("lease-row-reopened", "uniform",
     lambda c: c.sql("UPDATE envsched_leases SET closed_seq = NULL, outcome = NULL WHERE lease = 'lease-1-0'"),
     ("refused", r"lease lease-1-0 is")),
    ("tail-cut-head-rewritten", "uniform", lambda c: c.rechain(9), ("refused", r"ends at event 9, but a snapshot")),
    ("tail-cut-snapshots-removed", "uniform",
     lambda c: (c.rechain(9), c.sql("DELETE FROM envsched_snapshots WHERE seq > 9")),
     ("refused", r"ends at event 9, but a (consumed )?lease refers to event")),
    ("event-edited", "uniform",
     lambda c: c.sql("UPDATE envsched_events SET payload = replace(payload, '1.0', '0.0') WHERE kind = 'update'"),
     ("refused", r"fails its integrity check")),
    ("event-kind-edited", "uniform", lambda c: c.sql("UPDATE envsched_events SET kind = 'exec' WHERE seq = 2"),
     ("refused", r"integrity check|unknown kind")),
]

# stores that verify accepts, with the lease table of an old store (no flag, no lease events): reported, not made
OLD_STORE_NOTE = r"has no lease table .*opened read-only: nothing was written"


def _ids() -> list[str]:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))
    return ids


def _prepare(tmp_path: Path, bases: dict[str, Path], base: str, edit: Edit, url: str) -> Ctx:
    root, outside = tmp_path / "case", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    store = root / "history.sqlite"
    shutil.copy(bases[base], store)
    ctx = Ctx(root, store, url, outside)
    edit(ctx)
    return ctx


@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_store_verify_on_a_crafted_store_is_data_only(case: tuple[str, str, Edit, tuple[str, str | None]],
                                                       tmp_path: Path, bases: dict[str, Path],
                                                       listener: _Listener, watch: Watch) -> None:
    name, base, edit, (outcome, pattern) = case
    ctx = _prepare(tmp_path, bases, base, edit, listener.url)
    before = _tree(tmp_path)
    accepted_before = listener.accepted
    result = _bounded(lambda: CliRunner().invoke(cli, ["store", "verify", str(ctx.store)]))
    out = result.output
    assert "Traceback" not in out, f"{name}: {out}"
    assert result.exception is None or isinstance(result.exception, SystemExit), f"{name}: {result.exception!r}"
    if outcome == "refused":
        assert result.exit_code == 1, f"{name}: accepted\n{out}"
        lines = [line for line in out.splitlines() if line.strip()]
        assert len(lines) == 1, f"{name}: the reason is not one line:\n{out}"
        assert pattern is not None and re.search(pattern, out), f"{name}: {out}"
    else:
        assert result.exit_code == 0, f"{name}: refused\n{out}"
        notes = [line for line in out.splitlines() if line.startswith("note: ")]
        assert pattern is None or any(re.search(pattern, n) for n in notes), f"{name}: {out}"
    assert watch.connects == [], f"{name}: connected to {watch.connects}"
    assert listener.accepted == accepted_before, f"{name}: the listener was called"
    assert watch.processes == [], f"{name}: started {watch.processes}"
    assert _tree(tmp_path) == before, f"{name}: verify wrote a file"


# ---------------------------------------------------------------------------------------------- the library
LIBRARY_CASES: list[tuple[str, Edit, dict[str, Any], str]] = [
    ("run-file", lambda c: c.params(run_file=str(c.outside / "explain.jsonl")), {}, r"run_file .* is not written"),
    ("run-file-pipe", lambda c: c.params(run_file=str(c.fifo("run"))), {}, r"run_file .* is not written"),
    ("graph-path-pipe", lambda c: c.set("graph", {**c.meta("graph"), "path": str(c.fifo())}), {},
     r"graph\.path .* is not opened"),
    ("workers", lambda c: c.graph_config(workers=24, parallel_min_tasks=0), {}, r"workers \(24\) is not used"),
    ("llm-with-caller-graph", lambda c: c.graph_config(abstraction="llm", llm_endpoint=c.url, llm_model="m"),
     {"graph": "base"}, ""),
]


@pytest.mark.parametrize("case", LIBRARY_CASES, ids=[c[0] for c in LIBRARY_CASES])
def test_resume_in_the_library_writes_only_the_store(case: tuple[str, Edit, dict[str, Any], str], tmp_path: Path,
                                                     bases: dict[str, Path], listener: _Listener,
                                                     watch: Watch) -> None:
    """``DurableSampler.resume`` (not only the CLI) never writes, reads, calls or forks what a store names; it
    samples and logs into the store, and nothing else changes."""
    name, edit, kwargs, note = case
    ctx = _prepare(tmp_path, bases, "envsched", edit, listener.url)
    if kwargs.get("graph") == "base":
        kwargs = {"graph": DurableSampler.resume(HistoryStore(bases["envsched"], read_only=True)).sampler.graph}
    outside_before = _tree(ctx.outside)
    resumed = _bounded(lambda: DurableSampler.resume(ctx.store, **kwargs))
    resumed.update(resumed.sample(1)[0], [1.0, 0.0])  # writes: the store only
    resumed.close()
    assert not note or any(re.search(note, n) for n in resumed.notes), (name, resumed.notes)
    assert _tree(ctx.outside) == outside_before, f"{name}: a file outside the store changed"
    assert sorted(p.name for p in ctx.root.iterdir()) == ["history.sqlite"]
    assert watch.connects == [] and watch.processes == [] and listener.accepted == 0


def test_resume_with_a_caller_run_file_writes_there(tmp_path: Path, bases: dict[str, Path]) -> None:
    """What the store cannot choose, the caller can: resume(run_file=...) appends explanations to that file."""
    store = tmp_path / "h.sqlite"
    shutil.copy(bases["envsched"], store)
    mine = tmp_path / "mine.jsonl"
    resumed = DurableSampler.resume(store, run_file=mine)
    resumed.sample(2)
    assert mine.exists() and len(mine.read_text().splitlines()) >= 2
    resumed.close()


def test_resume_refuses_a_bad_workers_argument(tmp_path: Path, bases: dict[str, Path]) -> None:
    for bad in (0, -1, True, "4", 10**6):
        with pytest.raises(ValueError, match="workers must be"):
            DurableSampler.resume(bases["uniform"], workers=bad)


# ---------------------------------------------------------------------------------------------- target paths
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "symlink-to-fifo"])
def test_a_store_path_that_is_not_a_regular_file_is_refused_without_hanging(kind: str, tmp_path: Path) -> None:
    target = tmp_path / "store.sqlite"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero":
        target = Path("/dev/zero")
    elif kind == "directory":
        target.mkdir()
    else:
        os.mkfifo(tmp_path / "pipe")
        os.symlink(tmp_path / "pipe", target)
    with pytest.raises((ValueError, StoreError), match=r"not a regular file|is a directory"):
        _bounded(lambda: HistoryStore(target))
    result = _bounded(lambda: CliRunner().invoke(cli, ["store", "verify", str(target)]))
    assert result.exit_code == 1 and "Traceback" not in result.output


def test_verify_reports_a_missing_lease_table_of_an_old_store_and_writes_nothing(tmp_path: Path) -> None:
    """A store written before leases existed (no table, no lease in its events, no flag): verify says so in
    one line and does not add the table (it used to)."""
    store = tmp_path / "old.sqlite"
    d = DurableSampler(UniformSampler(_pool(), seed=1), store)
    for t in d.sample(3):
        d.update(t, [1.0])
    d.close()
    conn = sqlite3.connect(store)
    with conn:
        conn.execute("DROP TABLE envsched_leases")
        conn.execute("DELETE FROM envsched_meta WHERE key = 'lease_table'")
    conn.close()
    before = _tree(tmp_path)
    result = CliRunner().invoke(cli, ["store", "verify", str(store)])
    assert result.exit_code == 0, result.output
    assert re.search(OLD_STORE_NOTE, result.output), result.output
    assert _tree(tmp_path) == before
    # a writer adds it
    DurableSampler(UniformSampler(_pool(), seed=1), store).close()
    with HistoryStore(store, read_only=True) as st, st.transaction() as tx:
        assert st.has_lease_table(tx)


# ---------------------------------------------------------------------------------------------- kills in creation
@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
def test_temporary_files_of_a_killed_creation_are_cleaned_on_the_next_open(suffix: str, tmp_path: Path) -> None:
    store = tmp_path / "h.sqlite"
    # a pid that is certainly not alive: beyond the kernel's pid range (4194304)
    stale = tmp_path / f".h.sqlite.init-4194399-0123abcd{suffix}"
    stale.write_bytes(b"partial")
    alive = tmp_path / f".h.sqlite.init-{os.getpid()}-0123abcd{suffix}"  # a live process's: kept
    alive.write_bytes(b"partial")
    unrelated = tmp_path / ".other.sqlite.init-4194399-0123abcd"
    unrelated.write_bytes(b"x")
    DurableSampler(UniformSampler(_pool(), seed=0), store).close()
    assert not stale.exists() and alive.exists() and unrelated.exists()


@pytest.mark.slow
@pytest.mark.hostile_budget(60)  # many inputs (or a deadline the test waits out) in one call
def test_kills_during_store_creation_leave_no_init_files(tmp_path: Path) -> None:
    """Ten creations SIGKILLed inside the atomic creation: five wait, once the temporary database is open, to be
    killed there (so they land inside however loaded the machine is), five are killed at a random instant within
    the next 30 ms. Whatever they leave is gone after the next open."""
    import random
    import sys
    import time

    rng = random.Random(23)
    store = tmp_path / "h.sqlite"
    code = (f"import sys; sys.path[:0] = {sys.path!r}\n"
            "from envsched.pool import TaskPool\nfrom envsched.samplers import UniformSampler\n"
            "from envsched.store import DurableSampler, history\n"
            "real = history._SqliteBackend._connect\n"
            "def spy(self, path):\n"
            "    conn = real(self, path)\n"
            "    if '.init-' in path.name:\n"
            "        print('in', flush=True)\n"
            "        if sys.argv[1] == 'wait':\n"
            "            import time; time.sleep(30)\n"
            "    return conn\n"
            "history._SqliteBackend._connect = spy\n"
            "p = TaskPool([{'id': f't{i}', 'env': 'e'} for i in range(3000)])\n"
            f"DurableSampler(UniformSampler(p, seed=0), {str(store)!r})\n"
            "print('done', flush=True)\n")
    left = 0
    for k in range(10):
        proc = subprocess.Popen([sys.executable, "-c", code, "wait" if k % 2 == 0 else "go"], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"in"
        time.sleep(rng.uniform(0.0, 0.03))
        proc.kill()
        proc.wait(timeout=30)
        left += len(list(tmp_path.glob(".h.sqlite.init-*"))) > 0
        if store.exists():
            HistoryStore(store).close()
        else:
            DurableSampler(UniformSampler(_pool(), seed=0), store).close()
        assert list(tmp_path.glob(".h.sqlite.init-*")) == []
        for extra in ("", "-wal", "-shm"):
            Path(str(store) + extra).unlink(missing_ok=True)
    assert left >= 5, f"only {left} of 10 kills landed inside the creation"


# ---------------------------------------------------------------------------------------------- leases (finding 8)
def _durable(tmp_path: Path) -> tuple[DurableSampler, Any, str]:
    d = DurableSampler(UniformSampler(_pool(), seed=4), tmp_path / "h.sqlite", group_size=2)
    (task,) = d.sample(1, leases=["L1"])
    assert d.update(task, [1.0, 0.0], lease="L1") == "applied"
    return d, task, "L1"


@pytest.mark.parametrize("rewards,costs", [([0.0, 1.0], None), ([1.0, None], None), ([1.0, 1.0], None),
                                           ([1.0, 0.0], [2.0, 2.0])])
def test_a_used_lease_with_other_rewards_or_costs_is_refused(rewards: list[Any], costs: Any, tmp_path: Path) -> None:
    d, task, lease = _durable(tmp_path)
    before, events = json.dumps(d.state_dict(), sort_keys=True), d.store.count_events()
    with pytest.raises(LeaseConflictError, match=r"lease L1 .* already used by an update \(event 2\) with rewards "
                                                  r"\[1\.0, 0\.0\].*not a retry"):
        d.update(task, rewards, costs, lease=lease)
    assert json.dumps(d.state_dict(), sort_keys=True) == before and d.store.count_events() == events
    assert d.update(task, [1, 0], lease=lease) == "already_applied"  # the same group (ints) is a retry
    # the same rules after a restart (read from the store) and inside one batch
    d.close()
    again = DurableSampler(UniformSampler(_pool(), seed=4), tmp_path / "h.sqlite", group_size=2)
    results = again.update_many([(task, rewards, costs, lease), (task, [1.0, 0.0], None, lease)])
    assert isinstance(results[0], LeaseConflictError) and results[1] == "already_applied"


def test_two_updates_under_one_new_lease_in_one_batch(tmp_path: Path) -> None:
    d = DurableSampler(UniformSampler(_pool(), seed=4), tmp_path / "h.sqlite", group_size=2)
    (task,) = d.sample(1, leases=["L9"])
    results = d.update_many([(task, [1.0, 0.0], None, "L9"), (task, [0.0, 0.0], None, "L9"),
                             (task, [1.0, 0.0], None, "L9")])
    assert results[0] == "applied" and isinstance(results[1], LeaseConflictError) and results[2] == "already_applied"
    assert [e.kind for e in d.store.events()] == ["sample", "update"]


@pytest.mark.parametrize("durable", [False, True])
def test_the_ray_host_applies_the_same_lease_rules(durable: bool, tmp_path: Path) -> None:
    sampler: Any = UniformSampler(_pool(), seed=5)
    if durable:
        sampler = DurableSampler(sampler, tmp_path / "h.sqlite", group_size=2)
    host = SamplerHost(sampler, lease_timeout_s=60, group_size=2)
    ((lease, task),) = host.sample(1, worker="w1")
    ((other_lease, _),) = host.sample(1, worker="w2")
    assert [x["lease"] for x in host.leases("w1")] == [lease]  # w1 sees its own lease only
    assert all(x["lease"] != other_lease for x in host.leases("w1"))
    assert host.leases("nobody") == [] and sorted(host.lease_summary().items()) == [("w1", 1), ("w2", 1)]
    with pytest.raises(ValueError, match="one worker's leases"):
        host.leases(None)  # type: ignore[arg-type]
    assert host.update(task, [1.0, 0.0], lease=lease) == "applied"
    state = json.dumps(host.state_dict(), sort_keys=True)
    with pytest.raises(LeaseConflictError, match="not a retry"):
        host.update(task, [0.0, 0.0], lease=lease)
    assert host.update(task, [1.0, 0.0], lease=lease) == "already_applied"
    results = host.update_many([(task, [0.0, 1.0], None, lease)])
    assert isinstance(results[0], LeaseConflictError)
    assert json.dumps(host.state_dict(), sort_keys=True) == state


def test_a_worker_client_lists_only_its_own_leases(tmp_path: Path) -> None:
    host = SamplerHost(UniformSampler(_pool(), seed=6), lease_timeout_s=60)
    a, b = host.client(), host.client()
    a.sample(2)
    b.sample(3)
    assert len(a.leases()) == 2 and len(b.leases()) == 3
    assert {x["lease"] for x in a.leases()}.isdisjoint({x["lease"] for x in b.leases()})
    assert len(a.worker.rsplit(":", 1)[-1]) == 32  # not guessable


# ---------------------------------------------------------------------------------------------- rewritten logs
def test_a_rewritten_log_is_caught_by_the_checkpoints_mark(tmp_path: Path, bases: dict[str, Path]) -> None:
    """Someone with write access who recomputes the whole chain (and cleans snapshots and leases) leaves a
    store that checks out on its own; the (seq, digest) mark in the trainer's checkpoint still catches it."""
    store = tmp_path / "h.sqlite"
    d = DurableSampler(UniformSampler(_pool(), seed=8), store, snapshot_every=None)
    for t in d.sample(3):
        d.update(t, [1.0])
    mark = d.state_dict()
    d.close()
    conn = sqlite3.connect(store)
    with conn:
        store_id = json.loads(conn.execute("SELECT value FROM envsched_meta WHERE key='store_id'").fetchone()[0])
        prev = genesis_digest(store_id)
        rows = conn.execute("SELECT seq, kind, payload FROM envsched_events ORDER BY seq").fetchall()
        for seq, kind, payload in rows:
            if kind == "update":
                payload = payload.replace("[1.0]", "[0.0]")
            prev = _chain(prev, kind, payload)
            conn.execute("UPDATE envsched_events SET payload = ?, digest = ? WHERE seq = ?", (payload, prev, seq))
        conn.execute("UPDATE envsched_meta SET value = ? WHERE key = 'head'",
                     (canonical_json({"seq": rows[-1][0], "digest": prev}),))
    conn.close()
    again = DurableSampler(UniformSampler(_pool(), seed=8), store, snapshot_every=None)  # checks out alone
    with pytest.raises(StoreCorruptError, match="the log was rewritten since the checkpoint"):
        again.load_state_dict(mark)
    # a cut tail is caught by the mark too
    again.close()
    conn = sqlite3.connect(store)
    with conn:
        conn.execute("DELETE FROM envsched_events WHERE seq > 2")
        digest = conn.execute("SELECT digest FROM envsched_events WHERE seq = 2").fetchone()[0]
        conn.execute("UPDATE envsched_meta SET value = ? WHERE key = 'head'",
                     (canonical_json({"seq": 2, "digest": digest}),))
    conn.close()
    cut = DurableSampler(UniformSampler(_pool(), seed=8), store, snapshot_every=None)
    with pytest.raises(ValueError, match="the store lost events"):
        cut.load_state_dict(mark)


def test_a_read_only_store_cannot_be_written_through_a_durable_sampler(tmp_path: Path,
                                                                       bases: dict[str, Path]) -> None:
    store = tmp_path / "h.sqlite"
    shutil.copy(bases["uniform"], store)
    before = _tree(tmp_path)
    d = DurableSampler.resume(HistoryStore(store, read_only=True))
    for call in (lambda: d.sample(1), lambda: d.update("t00", [1.0, 0.0]), lambda: d.discard("t00")):
        with pytest.raises(StoreError, match="opened read-only"):
            call()
    with pytest.raises(StoreError, match="read-only"):
        d.store.drop()
    with pytest.raises(StoreError, match="does not exist"):
        HistoryStore(tmp_path / "absent.sqlite", read_only=True)
    assert _tree(tmp_path) == before


def test_resume_refuses_an_llm_graph_recipe_without_calling_it(tmp_path: Path, bases: dict[str, Path],
                                                               listener: _Listener, watch: Watch,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _prepare(tmp_path, bases, "envsched",
                   lambda c: c.graph_config(abstraction="llm", llm_endpoint=c.url, llm_model="m"), listener.url)
    monkeypatch.setenv("ENVSCHED_LLM_API_KEY", "secret-that-must-not-leave")
    with pytest.raises(StoreError, match=r"graph\.config\.abstraction is 'llm'.*never chooses an address.*"
                                         r"graph_path=PATH"):
        _bounded(lambda: DurableSampler.resume(ctx.store))
    assert watch.connects == [] and listener.accepted == 0 and watch.processes == []


@pytest.mark.parametrize("command", [["store", "info"], ["store", "info", "--json"], ["store", "verify", "--json"]])
def test_store_info_and_verify_write_nothing_beside_a_closed_store(command: list[str], tmp_path: Path,
                                                                   bases: dict[str, Path]) -> None:
    store = tmp_path / "h.sqlite"
    shutil.copy(bases["uniform"], store)
    before = _tree(tmp_path)
    result = CliRunner().invoke(cli, [*command, str(store)])
    assert result.exit_code == 0, result.output
    assert _tree(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["h.sqlite"]


class _LoggingSampler(UniformSampler):
    """A user's sampler class whose constructor takes a file to write (a store must not choose it)."""

    def __init__(self, tasks: Any, seed: int = 0, log_path: str = "") -> None:
        super().__init__(tasks, seed=seed)
        self.log_path = log_path


@pytest.mark.parametrize("name", ["log_path", "endpoint_url", "num_workers"])
def test_resume_refuses_a_user_class_argument_naming_a_file_address_or_process_count(name: str,
                                                                                     tmp_path: Path) -> None:
    store = tmp_path / "h.sqlite"
    DurableSampler(_LoggingSampler(_pool(), seed=1, log_path=str(tmp_path / "log.txt")), store).close()
    if name != "log_path":
        conn = sqlite3.connect(store)
        with conn:
            params = json.loads(conn.execute("SELECT value FROM envsched_meta WHERE key='sampler_params'")
                                .fetchone()[0])
            params[name] = params.pop("log_path")
            conn.execute("UPDATE envsched_meta SET value = ? WHERE key = 'sampler_params'", (json.dumps(params),))
        conn.close()
    with pytest.raises(StoreError, match=rf"sampler_params\.{name} of .*_LoggingSampler may name a file, address "
                                         r"or process count.*DurableSampler\(sampler, store\)"):
        DurableSampler.resume(store, sampler_classes=[_LoggingSampler])
    assert not (tmp_path / "log.txt").exists()
