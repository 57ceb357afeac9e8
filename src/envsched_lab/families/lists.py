"""Corpus ``lists``: questions about a list of digits. Shared primitives: maximum (``max``, ``argmax``; also
``text/max``, ``arith/bigger``), counting (``count``; also ``text/count``) and indexing (``at``, ``argmax``;
also ``text/at``). Tier t: lists of 3 + 2t digits."""

from __future__ import annotations

import numpy as np

from envsched_lab.families.base import TemplateFamily, digits

__all__ = ["LIST_FAMILIES"]

_READ = {"name": "read_list", "description": "Return the list of digits attached to the record."}
_SUBMIT = {"name": "submit", "description": "Submit the final reply as a short string."}


def _n(tier: int) -> int:
    return 3 + 2 * tier


def _max(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    xs = digits(rng, _n(tier))
    return "max:" + "".join(map(str, xs)), str(max(xs))


def _min(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    xs = digits(rng, _n(tier))
    return "min:" + "".join(map(str, xs)), str(min(xs))


def _count(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    xs = digits(rng, _n(tier))
    d = int(xs[int(rng.integers(len(xs)))]) if rng.random() < 0.8 else int(rng.integers(10))
    return f"cnt{d}:" + "".join(map(str, xs)), str(xs.count(d))


def _at(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    xs = digits(rng, _n(tier))
    k = int(rng.integers(len(xs)))
    return f"at{k}:" + "".join(map(str, xs)), str(xs[k])


def _argmax(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    xs = digits(rng, _n(tier), unique=True)
    return "argmax:" + "".join(map(str, xs)), str(int(np.argmax(xs)))


LIST_FAMILIES = [
    TemplateFamily("lists/max", "lists", [_READ, _SUBMIT],
                   ("Read the record's list and submit its largest value.",
                    "Submit the maximum of the digits returned by read_list.",
                    "Find the highest digit in the attached list and submit it."),
                   ("reply equals the maximum element of the list", "reply is a single digit"), _max,
                   pattern="maximum"),
    TemplateFamily("lists/min", "lists", [_READ, _SUBMIT],
                   ("Read the record's list and submit its smallest value.",
                    "Submit the minimum of the digits returned by read_list.",
                    "Find the lowest digit in the attached list and submit it."),
                   ("reply equals the minimum element of the list", "reply is a single digit"), _min),
    TemplateFamily("lists/count", "lists", [_READ, _SUBMIT],
                   ("Count how many times the queried digit occurs in the list and submit the count.",
                    "Submit the number of occurrences of the query digit in read_list's output.",
                    "How often does the given digit appear in the attached list? Submit the count."),
                   ("reply equals the number of occurrences of the query digit", "reply is a non-negative integer"),
                   _count, pattern="counting"),
    TemplateFamily("lists/at", "lists", [_READ, _SUBMIT],
                   ("Submit the element of the list at the queried zero-based position.",
                    "Read the list and submit the digit stored at the given index (counting from 0).",
                    "Look up the queried index in the attached list and submit the value there."),
                   ("reply equals the list element at the query index", "reply is a single digit"), _at,
                   pattern="indexing"),
    TemplateFamily("lists/argmax", "lists", [_READ, _SUBMIT],
                   ("Submit the zero-based position of the largest value in the list.",
                    "Read the list and submit the index (counting from 0) of its maximum.",
                    "Where is the highest digit of the attached list? Submit its index."),
                   ("reply equals the index of the maximum element", "reply is a single digit"), _argmax,
                   pattern="maximum"),
]
