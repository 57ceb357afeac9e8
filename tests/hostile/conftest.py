"""Shared pieces of the hostile-input suite: a small pool, samplers and a helper that asserts an input is
refused with a clear error and leaves the sampler's state exactly as it was."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from envsched.pool import TaskPool


def _small_pool(n: int = 12) -> TaskPool:
    return TaskPool([{"id": f"t{i:02d}", "env": f"env{i % 3}", "difficulty": i % 4} for i in range(n)])


def frozen(state: Any) -> str:
    """A comparable form of ``state_dict()`` (NaN-safe)."""
    return json.dumps(state, sort_keys=True, default=str)


def refuses(obj: Any, call: Callable[[], Any], error: type[BaseException] | tuple[type[BaseException], ...],
            match: str) -> BaseException:
    """``call()`` raises ``error`` whose message matches ``match``, and ``obj.state_dict()`` is unchanged."""
    before = frozen(obj.state_dict())
    with pytest.raises(error, match=match) as info:
        call()
    assert frozen(obj.state_dict()) == before, "a refused input changed the state"
    return info.value


def assert_names(exc: BaseException, *words: str) -> None:
    msg = str(exc)
    for w in words:
        assert re.search(w, msg, re.IGNORECASE), f"{w!r} not named in: {msg}"


@pytest.fixture
def pool() -> TaskPool:
    return _small_pool()


@pytest.fixture(name="refuses")
def _refuses_fixture() -> Callable[..., BaseException]:
    return refuses


@pytest.fixture(name="assert_names")
def _assert_names_fixture() -> Callable[..., None]:
    return assert_names


# ---------------------------------------------------------------------------------------------------------------
# Suite-wide guards: every hostile test runs under them, so the suite's goals are checked on every input.
#   * no outbound connection: a socket may connect to loopback or a UNIX socket only; anything else is refused
#     before a packet leaves and fails the test;
#   * no hang: a test's call phase must finish within HOSTILE_BUDGET_S (10 s), or within the budget its
#     ``hostile_budget(seconds)`` marker states (tests that walk thousands of inputs in one call);
#   * no process over 2 GiB: the peak resident size of this process and of any waited-for child, when the test
#     raised it, must stay under MAX_RSS_BYTES.

import ipaddress  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import sys as _sys  # noqa: E402
import time  # noqa: E402

HOSTILE_BUDGET_S = 10.0
MAX_RSS_BYTES = 2 * 1024**3
_outbound: list[str] = []


def _is_local(address: Any, family: int) -> bool:
    if family == getattr(socket, "AF_UNIX", object()):
        return True
    host = address[0] if isinstance(address, tuple) and address else address
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _guarded_connect(self: socket.socket, address: Any) -> Any:
    if not _is_local(address, self.family):
        _outbound.append(repr(address))
        raise ConnectionRefusedError(f"hostile suite: outbound connection to {address!r} refused")
    return _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> Any:
    if not _is_local(address, self.family):
        _outbound.append(repr(address))
        raise ConnectionRefusedError(f"hostile suite: outbound connection to {address!r} refused")
    return _real_connect_ex(self, address)


def _peak_rss_bytes(who: int) -> int:
    scale = 1 if _sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(who).ru_maxrss * scale


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "hostile_budget(seconds): a hostile test's own time budget (default 10 s)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    marker = item.get_closest_marker("hostile_budget")
    budget = float(marker.args[0]) if marker else HOSTILE_BUDGET_S
    rss_before = {who: _peak_rss_bytes(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)}
    _outbound.clear()
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    start = time.monotonic()
    try:
        outcome = yield
    finally:
        socket.socket.connect = _real_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = _real_connect_ex  # type: ignore[method-assign]
    elapsed = time.monotonic() - start
    problems = []
    if _outbound:
        problems.append(f"outbound connection attempted: {', '.join(_outbound[:5])}")
    if elapsed > budget:
        problems.append(f"took {elapsed:.1f} s, over its {budget:g} s budget (a hang)")
    for who, name in ((resource.RUSAGE_SELF, "the test process"), (resource.RUSAGE_CHILDREN, "a child process")):
        peak = _peak_rss_bytes(who)
        if peak > rss_before[who] and peak > MAX_RSS_BYTES:
            problems.append(f"{name} reached {peak / 1024**3:.2f} GiB resident, over 2 GiB")
    if problems and outcome.excinfo is None:
        pytest.fail("hostile-suite guard: " + "; ".join(problems), pytrace=False)
