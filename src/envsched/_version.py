"""The package's version, in a module of its own: code below the top level (graph files, pool caches) records
it without importing the package root (``envsched/__init__.py``). pyproject.toml holds the same string; a test
checks that the two agree."""

__version__ = "0.1.0"
