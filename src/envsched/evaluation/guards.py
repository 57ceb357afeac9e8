"""Fail fast when an evaluation cannot reach what it needs.

* :func:`check_endpoint` opens one TCP connection to an endpoint before the first episode, so that a model
  server or environment server nobody listens on stops the evaluation at once with the connection error,
  instead of after every episode has been retried with backoff;
* :class:`CircuitBreaker` counts consecutive episodes that ended in an infrastructure failure and trips after
  a set number of them, so that an endpoint that goes away during a run stops it early
  (:class:`EvaluationStopped` carries the last failure).
"""

from __future__ import annotations

import socket
import urllib.parse

from envsched.envs.base import InfrastructureError
from envsched.validation import check_int

__all__ = ["CircuitBreaker", "EndpointUnreachable", "EvaluationStopped", "check_endpoint"]

_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


class EndpointUnreachable(InfrastructureError):
    """No TCP connection could be opened to an endpoint (refused, no route, unknown host, timeout)."""


class EvaluationStopped(InfrastructureError):
    """The circuit breaker stopped an evaluation after consecutive infrastructure failures.

    The episodes finished before the stop are kept in the run's ``episodes.jsonl``; running the same
    evaluation again resumes it.
    """

    def __init__(self, failures: int, last_error: str, done: int, planned: int) -> None:
        self.failures, self.last_error, self.done, self.planned = failures, last_error, done, planned
        super().__init__(f"stopped after {failures} consecutive episodes failed on infrastructure "
                         f"({done} of {planned} episodes recorded); last failure: {last_error}")


def check_endpoint(url: str, *, what: str = "endpoint", timeout_s: float = 5.0) -> None:
    """Open (and close) one TCP connection to ``url``'s host and port; raise :class:`EndpointUnreachable`
    naming ``what``, the URL and the operating system's reason when it fails.

    Only reachability is checked (a listening socket), not that the server speaks the expected protocol:
    a wrong server still fails on its first episode, with its own error. ``url`` is an ``http(s)://`` or
    ``ws(s)://`` URL, or ``host:port``.
    """
    raw = url.strip() if isinstance(url, str) else ""
    if not raw:
        raise ValueError(f"{what}: the URL must be a non-empty string, got {url!r}")
    parts = urllib.parse.urlsplit(raw if "://" in raw else "http://" + raw)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError as exc:
        raise ValueError(f"{what} {url!r} has an invalid port: {exc}") from None
    if not parts.hostname or port is None:
        raise ValueError(f"{what} {url!r} names no host and port")
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise EndpointUnreachable(f"cannot reach {what} at {url} ({parts.hostname}:{port}): {reason}") from exc


class CircuitBreaker:
    """Trips after ``threshold`` consecutive infrastructure failures (a success or a scored failure resets
    the count). ``threshold=None`` never trips."""

    def __init__(self, threshold: int | None = 5) -> None:
        if threshold is not None:
            threshold = check_int(threshold, "the circuit breaker's threshold (or None)", low=1)
        self.threshold = threshold
        self.consecutive = 0
        self.last_error = ""

    def record(self, outcome: str, error: str | None = None) -> bool:
        """Count one finished episode; return whether the breaker is now open (the run should stop)."""
        if outcome == "infra_error":
            self.consecutive += 1
            self.last_error = (error or "infrastructure failure").strip().splitlines()[0]
        else:
            self.consecutive = 0
        return self.tripped

    @property
    def tripped(self) -> bool:
        return self.threshold is not None and self.consecutive >= self.threshold
