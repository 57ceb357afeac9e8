"""One local Ray cluster (127.0.0.1, 2 CPUs) shared by every test of this directory that needs it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    owner = not ray.is_initialized()  # another test module may have started Ray already: share it
    if owner:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if owner:
        ray.shutdown()
