"""The base of every exception envsched raises, the exceptions of refused values, and secrets kept out of messages.

Every exception class the package defines derives from :class:`EnvSchedError`, so a caller can catch
anything envsched raised on purpose with one ``except EnvSchedError``; each class also keeps the built-in
base it had before (``ValueError``, ``RuntimeError``, ...), so existing ``except ValueError`` code is
unaffected.

:class:`InvalidValueError` (a refused option or argument) and :class:`StateError` (a refused field of a saved
state) are what the checks of :mod:`envsched.validation` raise; :class:`UnreadKnobError`, an
``InvalidValueError``, is a scheduler knob set where nothing reads it.

:func:`redact_url` is the one place where a URL is made fit for a message: every message, page title or
summary that shows a store URL shows it through this function (the password and credential-bearing query
parameters become ``***``); :func:`redact_secrets` takes the same secrets out of any other text, such as a
database driver's error message.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_plus

__all__ = [
    "EnvSchedError",
    "InvalidValueError",
    "StateError",
    "UnreadKnobError",
    "redact_secrets",
    "redact_url",
]


class EnvSchedError(Exception):
    """Base of every exception raised by envsched on purpose."""


class InvalidValueError(EnvSchedError, ValueError, TypeError):
    """A user-supplied value of the wrong type or outside its admissible range.

    Attributes:
        name: what the value is (a parameter, a field, an option).
        value: the value that was refused.
    """

    def __init__(self, message: str, *, name: str = "", value: Any = None) -> None:
        super().__init__(message)
        self.name = name
        self.value = value


class UnreadKnobError(InvalidValueError):
    """A scheduler knob set to a value other than its default where the configuration's switches leave it unread:
    it would change no batch (:class:`envsched.method.config.SchedulerConfig`).

    Attributes:
        name, value: the first such knob and its value.
        unread: every such knob, with the mechanism that reads it and the switch that turns it on.
    """

    def __init__(self, message: str, *, name: str = "", value: Any = None,
                 unread: dict[str, str] | None = None) -> None:
        super().__init__(message, name=name, value=value)
        self.unread = dict(unread or {})


class StateError(EnvSchedError, ValueError):
    """A saved state refused by a loader (the readers of :mod:`envsched.validation`).

    Attributes:
        field: dotted name of the offending field (``extra.history.obs.v[0]``).
        problem: what is wrong with it.
        owner: the class whose state it is, once known (it starts the message: ``malformed X state: ...``).
    """

    def __init__(self, field: str, problem: str, owner: str | None = None) -> None:
        self.field, self.problem, self.owner = field, problem, owner
        head = f"malformed {owner} state: " if owner else ""
        super().__init__(f"{head}{field} {problem}")

    def within(self, prefix: str = "", owner: str | None = None) -> StateError:
        """The same refusal seen from an enclosing state: ``prefix`` goes before the field name."""
        return StateError(prefix + self.field, self.problem, owner or self.owner)


# ---------------------------------------------------------------------------------------------- secrets in URLs
#: query parameter names that carry a credential (matched anywhere in the decoded, case-folded name):
#: ``password``, ``sslpassword``, ``passwd``, ``pwd``, ``secret``, ``token``, ``api_key``, ``auth``, ...
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|key|auth|cred|sig", re.IGNORECASE)
#: a ``name=value`` pair with a secret name inside a parameter's value (libpq's ``dbname`` may hold a whole
#: connection string)
_SECRET_PAIR = re.compile(r"(?:pass|pwd|secret|token|key|auth|cred|sig)\w*\s*=", re.IGNORECASE)
REDACTED = "***"


def _secret_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every secret in the URL ``text``: the password of the userinfo (as SQLAlchemy reads it,
    up to the first ``@``, and as RFC 3986 reads it, up to the last ``@`` of the authority: both are hidden)
    and the value of each query parameter whose name, or whose value's own ``name=value`` pairs, name a
    credential."""
    start = text.find("://")
    if start < 0:
        return []
    start += 3
    spans: list[tuple[int, int]] = []
    colon = start
    while colon < len(text) and text[colon] not in ":/@?#":
        colon += 1
    if colon < len(text) and text[colon] == ":":
        first_at = text.find("@", colon)
        end = min([i for i in (text.find(c, colon) for c in "/?#") if i >= 0], default=len(text))
        last_at = text.rfind("@", colon, end)
        for at in (first_at, last_at):
            if at > colon:
                spans.append((colon + 1, at))
    # the query: after the authority (and after any password span, which may itself hold '?')
    after = max([start] + [e for _, e in spans])
    q = text.find("?", after)
    if q >= 0:
        end_q = text.find("#", q)
        end_q = len(text) if end_q < 0 else end_q
        pos = q + 1
        for part in re.split(r"[&;]", text[q + 1:end_q]):
            name, eq, value = part.partition("=")
            if eq and value:
                try:
                    decoded_name, decoded_value = unquote_plus(name), unquote_plus(value)
                except (UnicodeError, ValueError):  # pragma: no cover - unquote_plus replaces bad bytes
                    decoded_name, decoded_value = name, value
                if _SECRET_NAME.search(decoded_name) or _SECRET_PAIR.search(decoded_value):
                    vstart = pos + len(name) + 1
                    spans.append((vstart, vstart + len(value)))
            pos += len(part) + 1
    return spans


def redact_url(target: object) -> str:
    """``target`` as text fit for a message: in a URL (``scheme://...``), the userinfo's password and the values
    of query parameters that carry a credential (``password``, ``sslpassword``, ``passwd``, ``token``,
    ``api_key``, ...; or a parameter whose value holds such a ``name=value`` pair) become ``***``. Anything else
    (a file path) is returned as it is."""
    text = str(target)
    spans = sorted(_secret_spans(text))
    if not spans:
        return text
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    out, pos = [], 0
    for s, e in merged:
        out += [text[pos:s], REDACTED]
        pos = e
    out.append(text[pos:])
    return "".join(out)


def redact_secrets(message: object, url: object) -> str:
    """``message`` with every secret of ``url`` (see :func:`redact_url`) replaced by ``***``, as written in the
    URL and percent-decoded: for text that may repeat them, such as a database driver's error message."""
    text, source = str(message), str(url)
    secrets: set[str] = set()
    for s, e in _secret_spans(source):
        raw = source[s:e]
        secrets.update(x for x in (raw, unquote_plus(raw)) if x)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return redact_url(text)
