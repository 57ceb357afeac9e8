"""Every exception class envsched defines derives from ``EnvSchedError`` (docs/development.md, layer 0), so one
``except EnvSchedError`` catches anything the package raised on purpose."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import envsched
from envsched.errors import EnvSchedError


def _optional_dependency_missing(exc: ImportError) -> bool:
    """An import failed because a third-party package is absent (an optional extra), not because of envsched."""
    name = getattr(exc, "name", None) or ""
    return bool(name) and not name.startswith("envsched")


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(envsched.__path__, prefix="envsched."):
        try:
            importlib.import_module(info.name)
        except ImportError as exc:  # e.g. ray, fastapi, bfcl_eval not installed
            if _optional_dependency_missing(exc):
                continue
            raise
        names.append(info.name)
    return names


def _defined_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not (inspect.isclass(cls) and issubclass(cls, BaseException)):
                continue
            if cls.__module__ != name:
                continue  # imported from elsewhere; judged in the module that defines it
            # classes nested in other classes are reached through their owner
            found[f"{cls.__module__}:{cls.__qualname__}"] = cls
            for inner in vars(cls).values():
                if inspect.isclass(inner) and issubclass(inner, BaseException) and inner.__module__ == name:
                    found[f"{inner.__module__}:{inner.__qualname__}"] = inner
    return found


@pytest.fixture(scope="module")
def defined() -> dict[str, type[BaseException]]:
    return _defined_exceptions()


def test_the_walk_finds_the_package_exceptions(defined: dict[str, type[BaseException]]) -> None:
    # a walk that found nothing would pass the test below vacuously
    for key in ("envsched.errors:InvalidValueError", "envsched.pool.spec:TaskSpecError",
                "envsched.errors:StateError", "envsched.envs.base:InfrastructureError"):
        assert key in defined, key


def test_every_exception_class_derives_from_envsched_error(defined: dict[str, type[BaseException]]) -> None:
    outside = sorted(k for k, cls in defined.items() if not issubclass(cls, EnvSchedError))
    assert not outside, f"exception classes not derived from EnvSchedError: {outside}"


def test_converted_classes_keep_their_builtin_base() -> None:
    from envsched.envs.base import EnvironmentUnavailable, InfrastructureError
    from envsched.errors import StateError
    from envsched.llm_http import ResponseDeadline, ResponseTooLarge
    from envsched.pool.spec import TaskSpecError

    assert issubclass(TaskSpecError, ValueError) and issubclass(StateError, ValueError)
    assert issubclass(InfrastructureError, RuntimeError) and issubclass(EnvironmentUnavailable, ImportError)
    assert issubclass(ResponseDeadline, TimeoutError) and issubclass(ResponseTooLarge, ValueError)
    from envsched.method.graph.io import GraphFileError
    from envsched.store.history import StoreError
    from envsched.store.leases import LeaseExpiredError
    from envsched.testing import SamplerCheckError, _InjectedFailure

    assert issubclass(GraphFileError, ValueError) and issubclass(LeaseExpiredError, ValueError)
    assert issubclass(StoreError, RuntimeError) and issubclass(_InjectedFailure, RuntimeError)
    assert issubclass(SamplerCheckError, AssertionError)
    with pytest.raises(ValueError):
        raise TaskSpecError("bad spec")
