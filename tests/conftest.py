"""Suite-wide setup: a throw-away PostgreSQL server for the store tests when one can be started here.

``tests/store/`` and ``tests/distributed/`` read ``ENVSCHED_TEST_POSTGRES_URL`` when their modules are imported.
When that variable is not set, the first such test module to be collected (in either folder, whatever the
order) starts a server (see ``tests/_postgres.py``: the
steps of ``.ci/postgres.sh``, with no package installation) and sets the variable, so that a plain
``python -m pytest`` runs the PostgreSQL tests; the server and its files are removed when the session
ends. ``ENVSCHED_TEST_POSTGRES=0`` turns this off. When no server can be started the PostgreSQL tests
skip, and the reason is in pytest's summary of skips (``-ra``) and its last lines. Under pytest-xdist (``-n``,
with ``--dist loadgroup``) each worker that collects those folders starts its own server, and the test modules that use
PostgreSQL or Ray run on a single worker (``SHARED_SERVICE_MODULES``), one test at a time.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).resolve().parent
_state: dict[str, Any] = {"tried": False, "server": None, "reason": ""}

# Ray starts one idle worker process per CPU slot when a driver connects (4 for the verl tests' ray.init(num_cpus=4));
# on a 2-core machine their start-up (each imports Ray) competes with the actors a test starts (TransferQueue's
# controller and storage import torch) and made each local cluster seconds slower to serve. Workers then start
# when a task or an actor needs one, as they would anyway. Set here, before any cluster starts, so the raylets of
# this process and of the subprocesses the tests start (the examples) inherit it.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")

# One OpenMP thread per process (torch's intra-op pool, OpenBLAS): the tests' tensors are tiny (the 32-wide test
# Llama) and their processes run side by side (a trainer, its rollout child, the stand-in vLLM server's thread, a
# second rank, Ray's actors). With two threads each, every small op waited for a pool thread another process held:
# on a busy 2-core machine a 32 x 300 linear layer took 11 ms instead of 1.8 ms, and a 5-step TRL run 11 s instead
# of 0.4 s. Set before torch or numpy is imported; subprocesses inherit it (a run that sets its own thread count,
# as examples/grpo_smollm2.py does, keeps it).
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported by a plugin before this file: set its pool directly
    sys.modules["torch"].set_num_threads(1)


def _load_helper() -> Any:
    spec = importlib.util.spec_from_file_location("envsched_tests_postgres", _HERE / "_postgres.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _ensure_postgres() -> None:
    if _state["tried"]:
        return
    _state["tried"] = True
    if os.environ.get("ENVSCHED_TEST_POSTGRES_URL"):
        _state["reason"] = "given by ENVSCHED_TEST_POSTGRES_URL"
        return
    if os.environ.get("ENVSCHED_TEST_POSTGRES", "1") == "0":
        _state["reason"] = "ENVSCHED_TEST_POSTGRES=0: not started"
        return
    server, reason = _load_helper().start()
    if server is None:
        _state["reason"] = reason
        return
    _state["server"] = server
    _state["reason"] = f"throw-away server {server.url}"
    os.environ["ENVSCHED_TEST_POSTGRES_URL"] = server.url


#: the test folders whose modules read ENVSCHED_TEST_POSTGRES_URL when they are imported
POSTGRES_DIRS = (_HERE / "store", _HERE / "distributed")


def pytest_collect_file(file_path: Path, parent: Any) -> None:
    # before any module that reads the variable at import time is imported, whichever folder is collected first
    if file_path.suffix == ".py" and file_path.parent in POSTGRES_DIRS and file_path.name.startswith("test_"):
        _ensure_postgres()


#: test modules that use a machine-wide service: a PostgreSQL server (with ENVSCHED_TEST_POSTGRES_URL given, one
#: database for all of them) or a local Ray cluster (two Ray clusters started side by side by two processes of one
#: machine have hung a test in Ray's own import)
SHARED_SERVICE_MODULES = frozenset(_HERE / rel for rel in (
    "store/test_postgres.py", "store/test_crash.py", "store/test_concurrency.py", "store/test_schema.py",
    "distributed/test_faults.py", "distributed/test_ray_host.py", "dashboard/test_postgres.py",
    "evaluation/test_harness.py", "integrations/test_verl.py", "examples/test_verl_grpo.py"))


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    # under pytest-xdist (--dist loadgroup) one worker runs every test that uses those services, one at a time
    group = pytest.mark.xdist_group("shared-services")
    for item in items:
        if Path(str(item.path)).resolve() in SHARED_SERVICE_MODULES:
            item.add_marker(group)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: Any) -> Any:
    # collection imports torch, transformers, TRL, verl and the rest (about a million objects): the cyclic
    # collector's full passes over that growing heap cost 7 s of a 25 s collection and free almost nothing.
    # What collection leaves alive (modules, classes, test items) lives until the session ends: after one pass
    # that frees import-time cycles it is frozen, so that the full collections during the tests (automatic
    # ones, and the gc.collect() that HF's Trainer runs on every train()) scan only what the tests create.
    # A wrapper, so that gc is enabled again however collection ends (an error, or pytest-xdist's controller,
    # which collects nothing)
    gc.disable()
    try:
        return (yield)
    finally:
        gc.enable()
        gc.collect()
        gc.freeze()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _state["tried"]:
        # pytest-xdist's controller collects nothing: its workers start their own servers when none is given
        if os.environ.get("ENVSCHED_TEST_POSTGRES_URL"):
            terminalreporter.write_line("PostgreSQL store tests ran against: given by ENVSCHED_TEST_POSTGRES_URL")
        return
    if os.environ.get("ENVSCHED_TEST_POSTGRES_URL"):
        terminalreporter.write_line(f"PostgreSQL store tests ran against: {_state['reason']}")
    else:
        terminalreporter.write_line(f"PostgreSQL store tests skipped: {_state['reason']} (set "
                                    "ENVSCHED_TEST_POSTGRES_URL, or run `bash .ci/postgres.sh` as root)")


def pytest_unconfigure(config: Any) -> None:
    server = _state.get("server")
    if server is not None:
        server.stop()
        _state["server"] = None


@pytest.fixture(scope="session")
def tiny_llm() -> Any:
    """``build_tiny_llm(pool, out, **sizes)`` from ``tests/_tiny_llm.py`` (imports torch and transformers only
    when a test asks for it)."""
    spec = importlib.util.spec_from_file_location("envsched_tests_tiny_llm", _HERE / "_tiny_llm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_tiny_llm


@pytest.fixture(scope="session")
def uvicorn_app() -> Any:
    """``uvicorn_app(env, cwd=None, timeout_s=60)``: a context manager that serves
    ``envsched.envs.openenv_server:app`` with uvicorn in a subprocess on 127.0.0.1 (a free port), as the docs
    start it, waits for ``/health``, yields ``(process, port)`` and stops the server afterwards."""
    import contextlib
    import subprocess
    import time
    import urllib.request

    from envsched.envs.openenv_server import _free_port

    @contextlib.contextmanager
    def serve(env: dict[str, str], cwd: Path | None = None, timeout_s: float = 60.0) -> Any:
        port = _free_port("127.0.0.1")
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "envsched.envs.openenv_server:app", "--host",
                                 "127.0.0.1", "--port", str(port), "--log-level", "warning"], env=env, cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("server did not start")
            time.sleep(0.1)
        try:
            yield proc, port
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()

    return serve
