"""Corpus ``text``: questions about a short lowercase word. Shared primitives with ``lists``: maximum
(``max``: the alphabetically last letter), counting (``count``) and indexing (``at``). Not shared:
``reverse`` and ``upper`` (string transformations). Tier t: words of 3 + 2t letters (2 + t for the
transformations, whose answer is the whole word)."""

from __future__ import annotations

import numpy as np

from envsched_lab.families.base import TemplateFamily, letters

__all__ = ["TEXT_FAMILIES"]

_GET = {"name": "get_text", "description": "Return the word stored in the document field."}
_REPLY = {"name": "reply", "description": "Send the reply text to the user."}


def _n(tier: int) -> int:
    return 3 + 2 * tier


def _max(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    w = letters(rng, _n(tier))
    return "max:" + w, max(w)


def _count(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    w = letters(rng, _n(tier))
    c = w[int(rng.integers(len(w)))] if rng.random() < 0.8 else letters(rng, 1)
    return f"cnt{c}:" + w, str(w.count(c))


def _at(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    w = letters(rng, _n(tier))
    k = int(rng.integers(len(w)))
    return f"at{k}:" + w, w[k]


def _reverse(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    w = letters(rng, 2 + tier)
    return "rev:" + w, w[::-1]


def _upper(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    w = letters(rng, 2 + tier)
    return "up:" + w, w.upper()


TEXT_FAMILIES = [
    TemplateFamily("text/max", "text", [_GET, _REPLY],
                   ("Reply with the letter of the document that comes last in the alphabet.",
                    "Fetch the word and answer with its alphabetically greatest letter.",
                    "Which letter of the stored word sorts last? Reply with it."),
                   ("reply equals the alphabetically last letter", "reply is one lowercase letter"), _max,
                   pattern="maximum"),
    TemplateFamily("text/count", "text", [_GET, _REPLY],
                   ("Count the occurrences of the queried letter in the document's word and reply with the number.",
                    "Fetch the word and reply with how many times the given letter appears in it.",
                    "Reply with the count of the query letter in the stored word."),
                   ("reply equals the number of occurrences of the query letter", "reply is a non-negative integer"),
                   _count, pattern="counting"),
    TemplateFamily("text/at", "text", [_GET, _REPLY],
                   ("Reply with the letter of the word at the queried zero-based position.",
                    "Fetch the word and answer with the character at the given index (counting from 0).",
                    "Look up the queried index in the stored word and reply with that letter."),
                   ("reply equals the letter at the query index", "reply is one lowercase letter"), _at,
                   pattern="indexing"),
    TemplateFamily("text/reverse", "text", [_GET, _REPLY],
                   ("Reply with the document's word spelled backwards.",
                    "Fetch the word and answer with its letters in reverse order.",
                    "Reverse the stored word and reply with the result."),
                   ("reply equals the word reversed", "reply has the word's length"), _reverse),
    TemplateFamily("text/upper", "text", [_GET, _REPLY],
                   ("Reply with the document's word in capital letters.",
                    "Fetch the word and answer with it upper-cased.",
                    "Convert the stored word to uppercase and reply with it."),
                   ("reply equals the word in uppercase", "reply has the word's length"), _upper),
]
