"""The example tests load their runner by path (the suite runs with --import-mode=importlib)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def run_example():
    spec = importlib.util.spec_from_file_location("envsched_examples_run", Path(__file__).with_name("_run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_example
