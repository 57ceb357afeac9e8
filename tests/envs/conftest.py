"""Shared fixtures for the environment tests: the real bundled pool, built once per session."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def bundled_pool_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("envsched-cache")


@pytest.fixture(scope="session")
def bundled_pool(bundled_pool_cache: Path):
    """``default_pool()`` built from scratch into a temporary cache folder (the real 2,550-task pool)."""
    from envsched.envs.default_pool import default_pool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the no-BFCL fallback warns; tested on its own
        return default_pool(cache=bundled_pool_cache)
