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
