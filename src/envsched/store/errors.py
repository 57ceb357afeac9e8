"""The history store's errors: one base, :class:`StoreError`, and the two ways a store can be wrong.

They sit apart from the modules that raise them (the schema, both backends and the durable store) so that
each of those can raise them without importing another.
"""

from __future__ import annotations

from envsched.errors import EnvSchedError

__all__ = ["StoreCorruptError", "StoreError", "StoreMismatchError"]


class StoreError(EnvSchedError, RuntimeError):
    """Base class of the store's errors."""


class StoreCorruptError(StoreError):
    """The store's file or tables are damaged, truncated, or not an envsched store."""


class StoreMismatchError(StoreError, ValueError):
    """The store was written for another pool, sampler class or configuration."""
