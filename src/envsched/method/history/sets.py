"""Set operations on small integer arrays by sorting, for the per-draw updates of
:mod:`~envsched.method.history.incremental` (which handle a few hundred positions at a time): ``numpy.unique``,
``numpy.union1d`` and ``numpy.isin`` take several times longer at those sizes (hash tables, kind selection)."""

from __future__ import annotations

import numpy as np

__all__ = ["distinct", "member", "union"]


def distinct(a: np.ndarray) -> np.ndarray:
    """The distinct values of ``a``, ascending (``numpy.unique``)."""
    a = np.sort(np.asarray(a).ravel())
    if a.size < 2:
        return a
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def union(*arrays: np.ndarray) -> np.ndarray:
    """The distinct values of all ``arrays``, ascending (``numpy.union1d``)."""
    return distinct(np.concatenate([np.asarray(x).ravel() for x in arrays]))


def member(a: np.ndarray, sorted_values: np.ndarray) -> np.ndarray:
    """Whether each of ``a`` is in ``sorted_values`` (ascending, distinct) (``numpy.isin``), in
    ``O(len(a) log len(sorted_values))``."""
    a = np.asarray(a)
    if not sorted_values.size:
        return np.zeros(a.shape, dtype=bool)
    at = np.searchsorted(sorted_values, a)
    np.minimum(at, sorted_values.size - 1, out=at)
    return sorted_values[at] == a
