"""Hostile LLM replies and cache files: parsing is linear and bounded; a bad cache file is a miss; a hostile
endpoint (slow drip, 800 MB body, gzip bomb, deep nesting, odd shapes) ends in a clear error within the deadline
and the size cap."""

from __future__ import annotations

import asyncio
import gzip
import http.server
import json
import select
import socketserver
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from envsched.evaluation.policy import ChatCompletionsPolicy, PolicyError, PolicyUnavailable
from envsched.llm_http import (
    MAX_JSON_DEPTH,
    MAX_RESPONSE_BYTES,
    ResponseDeadline,
    ResponseTooDeep,
    ResponseTooLarge,
    loads_bounded,
    post_bounded,
)
from envsched.method.graph.llm_abstraction import MAX_REPLY_CHARS, LLMAbstractionError, LLMAbstractor, _content_key

SPEC = {"id": "airline-7", "env": "airline", "instruction": "Cancel reservation ABC123."}
VALID = {
    "operations": [{"family": "lookup", "effect": "read", "inputs": ["identifier"], "required": True}],
    "gates": [], "dependencies": [], "check_groups": [], "conflicts": [], "literals": {"identifier": 1},
}


def _llm(tmp_path: Path) -> LLMAbstractor:
    return LLMAbstractor("http://127.0.0.1:9/v1", "m", cache_dir=tmp_path / "cache", max_retries=0)


@pytest.mark.slow
def test_open_fence_with_thousands_of_newlines_parses_in_linear_time(tmp_path: Path) -> None:
    """The audit's reply took 122 s through the old fence regex; parsed in a child so a hang cannot stall CI."""
    code = textwrap.dedent("""
        from envsched.method.graph.llm_abstraction import LLMAbstractor
        llm = LLMAbstractor("http://127.0.0.1:9/v1", "m", cache_dir=%r, max_retries=0)
        for reply in ["```json\\n" + "\\n" * 5000 + "x", "```" + " " * 20000 + "x```y", "```json" + "\\n" * 40000]:
            answer, errors = llm._parse(reply)
            assert answer is None and errors, errors
        print("parsed")
    """) % str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "parsed" in proc.stdout, proc.stderr[-2000:]


HOSTILE_REPLIES = {
    "longer than the limit": ("x" * (MAX_REPLY_CHARS + 1), "more than the limit"),
    "valid JSON padded past the limit": (json.dumps(VALID) + " " * MAX_REPLY_CHARS, "more than the limit"),
    "integer past the digit limit": ('{"literals": {"identifier": ' + "9" * 5000 + "}}", "not valid JSON"),
    "fence without JSON": ("```json\n```", "not valid JSON"),
    "nested object inside the schema": (json.dumps({**VALID, "literals": {"a": {"b": {"c": 1}}}}), "literals"),
    "deeply nested arrays in a value": (json.dumps({**VALID, "gates": [[[[[[[[[[]]]]]]]]]]}), "gates"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_REPLIES))
def test_hostile_reply_is_a_malformed_answer(tmp_path: Path, case: str) -> None:
    reply, problem = HOSTILE_REPLIES[case]
    _, errors = _llm(tmp_path)._parse(reply)
    assert errors and any(problem in e for e in errors), errors


def test_fenced_valid_answer_still_parses(tmp_path: Path) -> None:
    llm = _llm(tmp_path)
    for reply in ("```json\n" + json.dumps(VALID) + "\n```", "  ```" + json.dumps(VALID) + "```  ", json.dumps(VALID)):
        assert llm._parse(reply) == (VALID, [])


BAD_CACHE_FILES = {
    "bad UTF-8": b"\xff\xfe\x00{",
    "deep nesting": b"[" * 100000 + b"]" * 100000,
    "not JSON": b"{operations: 1",
    "a JSON array": b"[]",
    "schema-invalid object": json.dumps({"operations": "x"}).encode(),
    "too large": b" " * (MAX_REPLY_CHARS + 1) + json.dumps(VALID).encode(),
    "NaN literal": json.dumps({**VALID, "literals": {"identifier": float("nan")}}).encode(),
}


@pytest.mark.parametrize("case", sorted(BAD_CACHE_FILES))
def test_bad_cache_file_is_a_miss(tmp_path: Path, case: str) -> None:
    llm = _llm(tmp_path)
    key = _content_key(SPEC, "m")
    path = llm._cache_path(key)
    path.parent.mkdir(parents=True)
    path.write_bytes(BAD_CACHE_FILES[case])
    assert llm.cached(SPEC) is None
    path.write_text(json.dumps(VALID))
    assert llm.cached(SPEC) == VALID


def test_a_directory_in_place_of_a_cache_file_is_a_miss(tmp_path: Path) -> None:
    llm = _llm(tmp_path)
    llm._cache_path(_content_key(SPEC, "m")).mkdir(parents=True)
    assert llm.cached(SPEC) is None


# ---------------------------------------------------------------------------- a misbehaving endpoint
# A real HTTP server on 127.0.0.1 plays each hostile endpoint; the two LLM clients (the evaluation policy and the
# graph's LLM abstraction) post to it through envsched.llm_http: size cap, whole-request deadline, depth cap.

HUGE = 800 * 1024 * 1024  # the audit's body: generated lazily, the server stops when the client hangs up


class _EndpointClock:
    """The clock a client's deadline is measured on, moved by the endpoint instead of the endpoint sleeping: the
    slow paths advance it by their pause (1.5 s a byte, or the silence) and wait until the client's event loop
    has seen the new time, so a 3 s deadline passes in milliseconds, at the same point of the exchange as on the
    real clock. It stops moving once every loop that read it has closed (the client gave up).

    The endpoint moves it in steps of :attr:`STEP` and stops when the client hangs up, so after the client's
    deadline fires the clock moves on only for the few loop turns the client takes to close the connection:
    a reading of the clock just after the call is the deadline to within a fraction of a second."""

    STEP = 0.125  # a binary fraction: 1.5 s and 0.5 s pauses add up exactly

    def __init__(self) -> None:
        self.now = 0.0
        self._loops: set[asyncio.AbstractEventLoop] = set()
        self._lock = threading.Lock()

    def __call__(self) -> float:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            with self._lock:
                self._loops.add(loop)
        return self.now

    def advance(self, seconds: float) -> bool:
        """Move on by ``seconds`` and let each reading loop see it; ``False`` (not moved) once none is open."""
        with self._lock:
            loops = [loop for loop in self._loops if not loop.is_closed()]
            if not loops:
                return False
            self.now += seconds
        for loop in loops:
            seen = threading.Event()
            try:
                loop.call_soon_threadsafe(seen.set)
            except RuntimeError:  # closed meanwhile
                continue
            seen.wait(5.0)
        return True


def _completion(content: object, **extra: object) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}], **extra}).encode()


def _nested(depth: int) -> bytes:
    return _completion("x", deep=json.loads("[" * depth + "]" * depth)) if depth < 500 else (
        b'{"choices": [{"message": {"content": "x"}}], "deep": ' + b"[" * depth + b"]" * depth + b"}")


class _Hostile(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sent: ClassVar[dict[str, int]] = {}
    #: the clock of the test's next client, which the slow paths advance (the real clock when none is set)
    clock: ClassVar[_EndpointClock | None] = None

    def _pause(self, clock: _EndpointClock | None, seconds: float) -> bool:
        """Let ``seconds`` pass on the requesting client's clock; ``False`` once that client is gone (it hung up,
        or its event loop closed)."""
        if clock is None:
            time.sleep(seconds)
            return True
        for _ in range(round(seconds / _EndpointClock.STEP)):  # in small steps, checking for a hang-up each
            if select.select([self.connection], [], [], 0)[0]:  # readable after a whole request: hung up
                return False
            if not clock.advance(_EndpointClock.STEP):
                return False
        return True

    def log_message(self, *args: object) -> None:
        pass

    def _head(self, status: int = 200, length: int | None = None, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if length is not None:
            self.send_header("Content-Length", str(length))
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()

    def _body(self, status: int, body: bytes, **headers: str) -> None:
        self._head(status, len(body), **headers)
        self.wfile.write(body)

    def _stream(self, status: int, total: int, chunk: bytes, chunked: bool) -> None:
        """Write ``total`` bytes lazily; stop when the client hangs up (count what was written)."""
        written = 0
        try:
            if chunked:
                self._head(status, None, Transfer_Encoding="chunked")
            else:
                self._head(status, total)
            while written < total:
                piece = chunk[: total - written]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                written += len(piece)
        except OSError:
            pass
        finally:
            _Hostile.sent[self.path] = written

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        path = self.path.split("/")[1]
        clock = _Hostile.clock  # this request's client's
        try:
            if path == "drip-body":  # headers at once, then one byte every 1.5 s
                body = _completion("slow")
                self._head(200, len(body))
                for b in body:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    if not self._pause(clock, 1.5):
                        break
            elif path == "drip-head":  # the status line, then one header byte every 1.5 s
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                for b in b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}":
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    if not self._pause(clock, 1.5):
                        break
            elif path == "silent":  # nothing for 30 s
                for _ in range(60):
                    if not self._pause(clock, 0.5):
                        break
            elif path == "huge-declared":
                self._stream(200, HUGE, b" " * 65536, chunked=False)
            elif path == "huge-chunked":
                self._stream(200, HUGE, b" " * 65536, chunked=True)
            elif path == "huge-error":
                self._stream(500, HUGE, b"e" * 65536, chunked=True)
            elif path == "huge-404":
                self._stream(404, HUGE, b"n" * 65536, chunked=True)
            elif path == "gzip-bomb":  # 64 MiB of zeros in about 64 KiB
                self._body(200, gzip.compress(b"\0" * (64 << 20), compresslevel=9), Content_Encoding="gzip")
            elif path == "deep-content":  # the model's answer is deeply nested JSON (a string: depth 4)
                self._body(200, _completion("[" * 100000 + "]" * 100000))
            elif path.startswith("deep-"):
                self._body(200, _nested(int(path[5:])))
            elif path == "redirect-loop":
                self._body(307, b"", Location=self.path)
            elif path == "redirect-drip":
                self._body(307, b"", Location="/drip-body/v1/chat/completions")
            elif path == "short-body":  # declares 1000 bytes, sends 10, hangs up
                self._head(200, 1000)
                self.wfile.write(b'{"choices"')
                self.close_connection = True
            elif path == "bad-length":
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: lots\r\n\r\n{}")
                self.close_connection = True
            else:
                self._body(200, _SHAPES[path])
        except OSError:
            pass


_SHAPES = {
    "not-json": b"<html>MARK</html>",
    "json-array": b"[1, 2]",
    "json-string": b'"hello"',
    "no-choices": b'{"id": "x"}',
    "empty-choices": b'{"choices": []}',
    "choice-a-string": b'{"choices": ["x"]}',
    "message-a-list": b'{"choices": [{"message": [1]}]}',
    "content-null": _completion(None),
    "content-a-number": _completion(5),
    "content-a-list": _completion([{"type": "text", "text": "x"}]),
    "bad-utf8": b'{"choices": [{"message": {"content": "\xff\xfe"}}]}',
    "5000-digit-usage": b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": '
                        + b"9" * 5000 + b"}}",
    "nan-usage": _completion("x", usage={"prompt_tokens": float("nan"), "completion_tokens": -3}),
    "depth-at-cap": _completion("x", deep=json.loads("[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1))),
    "brackets-in-strings": _completion("[" * 5000 + "{" * 5000),
}


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    srv = _Server(("127.0.0.1", 0), _Hostile)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _policy(endpoint: str, path: str, timeout_s: float = 10.0, clock: _EndpointClock | None = None,
            ) -> ChatCompletionsPolicy:
    return ChatCompletionsPolicy(f"{endpoint}/{path}/v1", "m", timeout_s=timeout_s, clock=clock)


@pytest.fixture
def new_clock() -> Iterator[Callable[[], _EndpointClock]]:
    """Makes the clock of the test's next client, which the endpoint's slow paths advance instead of sleeping."""

    def make() -> _EndpointClock:
        _Hostile.clock = _EndpointClock()
        return _Hostile.clock

    yield make
    _Hostile.clock = None


@pytest.mark.parametrize("path", ["drip-body", "drip-head", "silent", "redirect-drip"])
def test_the_deadline_covers_the_whole_request(endpoint: str, path: str,
                                               new_clock: Callable[[], _EndpointClock]) -> None:
    """1 byte every 1.5 s with timeout 3 s: a per-read timeout never fires (the whole drip would take 75 s); the
    deadline does, at 3 s. Measured on the endpoint's clock, so the test takes milliseconds."""
    t0 = time.monotonic()
    clock = new_clock()
    with pytest.raises(PolicyUnavailable, match=r"timed out.*3 s deadline") as info:
        _policy(endpoint, path, timeout_s=3, clock=clock).complete([{"role": "user", "content": "q"}])
    assert 3.0 <= clock.now < 4.0, clock.now  # at the deadline: not before it, not a read later
    assert f"{endpoint}/{path}/v1/chat/completions" in str(info.value)
    clock = new_clock()
    with pytest.raises(ResponseDeadline, match=r"2 s deadline"):
        post_bounded(f"{endpoint}/{path}/v1", b"{}", {}, timeout_s=2, clock=clock)
    assert 2.0 <= clock.now < 3.0, clock.now
    assert time.monotonic() - t0 < 5  # no real wait (a generous guard against a hang)


@pytest.mark.parametrize("path, words", [
    ("huge-declared", "declares 838860800 bytes, more than the cap of 4194304"),
    ("huge-chunked", "passed the cap of 4194304 bytes"),
    ("gzip-bomb", "passed the cap of 4194304 bytes"),
])
def test_a_huge_response_stops_at_the_cap(endpoint: str, path: str, words: str) -> None:
    with pytest.raises(PolicyError, match=words) as info:
        _policy(endpoint, path).complete([{"role": "user", "content": "q"}])
    assert endpoint in str(info.value) and "max_response_bytes" in str(info.value)
    assert _Hostile.sent.get(f"/{path}/v1/chat/completions", 0) < 64 * MAX_RESPONSE_BYTES  # stopped early
    with pytest.raises(ResponseTooLarge):
        post_bounded(f"{endpoint}/{path}/v1", b"{}", {}, timeout_s=10, max_bytes=1000)


def test_an_800_mb_body_keeps_the_client_small(endpoint: str) -> None:
    """The audit's 800 MB body reached 2.2 GB RSS; read in a child process whose peak RSS is measured."""
    code = textwrap.dedent("""
        import time
        from envsched.evaluation.policy import ChatCompletionsPolicy, PolicyError
        t0 = time.monotonic()
        for path in ("huge-chunked", "huge-declared", "huge-error"):
            try:
                ChatCompletionsPolicy(%r + "/" + path + "/v1", "m", timeout_s=20).complete([{"role": "user",
                                                                                            "content": "q"}])
            except Exception as exc:
                print(path, type(exc).__name__)
        # VmHWM: this process's own peak (ru_maxrss would carry the forking parent's RSS over exec)
        hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        print("peak_mb", int(hwm.split()[1]) / 1024, "s", time.monotonic() - t0)
    """) % endpoint
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["huge-chunked"] == "PolicyError" and lines["huge-declared"] == "PolicyError"
    assert lines["huge-error"] == "PolicyUnavailable"  # a 5xx: its first 64 KiB are read for the message
    print(proc.stdout)  # the peak RSS and the time, for the docs (pytest -s)
    peak_mb = float(lines["peak_mb"].split()[0])
    assert peak_mb < 200, proc.stdout  # the interpreter with httpx is about 55 MB; 800 MB read whole is > 1 GB


@pytest.mark.parametrize("path, error, words", [
    ("huge-error", PolicyUnavailable, "HTTP 500: eeee"),
    ("huge-404", PolicyError, r"refused the request \(HTTP 404\): nnnn"),
    ("redirect-loop", PolicyUnavailable, "unreachable"),
    ("short-body", PolicyUnavailable, "unreachable"),
    ("bad-length", PolicyUnavailable, "unreachable"),
    ("deep-100000", PolicyError, "nested deeper than the cap of 64 levels"),
    ("deep-65", PolicyError, "nested deeper than the cap of 64 levels"),
    ("not-json", PolicyError, "not JSON"),
    ("bad-utf8", PolicyError, "not JSON"),
    ("5000-digit-usage", PolicyError, "not JSON"),
    ("json-array", PolicyError, "list instead of an object"),
    ("json-string", PolicyError, "str instead of an object"),
    ("no-choices", PolicyError, "no choices"),
    ("empty-choices", PolicyError, "no choices"),
    ("choice-a-string", PolicyError, "no choices"),
    ("message-a-list", PolicyError, "has no message"),
    ("content-null", PolicyError, "content is NoneType"),
    ("content-a-number", PolicyError, "content is int"),
    ("content-a-list", PolicyError, "content is list"),
])
def test_a_hostile_response_is_a_clear_error(endpoint: str, path: str, error: type, words: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(error, match=words) as info:
        _policy(endpoint, path).complete([{"role": "user", "content": "q"}])
    assert time.monotonic() - t0 < 10 and len(str(info.value)) < 1000
    assert not isinstance(info.value.__context__, RecursionError)


@pytest.mark.parametrize("path, expected", [
    ("nan-usage", ("x", None, None)),
    ("depth-at-cap", ("x", None, None)),
    ("brackets-in-strings", ("[" * 5000 + "{" * 5000, None, None)),
])
def test_odd_but_valid_responses_are_read(endpoint: str, path: str, expected: tuple) -> None:
    r = _policy(endpoint, path).complete([{"role": "user", "content": "q"}])
    assert (r.text, r.prompt_tokens, r.completion_tokens) == expected


@pytest.mark.parametrize("path, words", [
    ("deep-100000", "nested deeper than the cap of 64 levels"),
    ("huge-chunked", "passed the cap of 4194304 bytes"),
    ("deep-content", "nested too deeply"),
    ("content-a-number", "5 is not of type 'object'"),
])
def test_the_llm_abstraction_refuses_hostile_responses(endpoint: str, tmp_path: Path, path: str, words: str) -> None:
    llm = LLMAbstractor(f"{endpoint}/{path}/v1", "m", cache_dir=tmp_path, max_retries=1, timeout=10)
    with pytest.raises(LLMAbstractionError, match=words) as info:
        llm.extract(SPEC)
    assert f"{endpoint}/{path}/v1/chat/completions" in str(info.value) and llm.stats["requests"] == 2
    assert not list(tmp_path.rglob("*.json"))  # nothing cached


def test_the_llm_abstraction_deadline_is_per_request_not_per_read(
        endpoint: str, tmp_path: Path, new_clock: Callable[[], _EndpointClock]) -> None:
    clock = new_clock()
    llm = LLMAbstractor(f"{endpoint}/drip-body/v1", "m", cache_dir=tmp_path, max_retries=0, timeout=3, clock=clock)
    t0 = time.monotonic()
    with pytest.raises(LLMAbstractionError, match="3 s deadline"):
        llm.extract(SPEC)
    assert 3.0 <= clock.now < 4.0, clock.now
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("raw", [b"[" * 100000 + b"]" * 100000, b'{"a":' * 65 + b"1" + b"}" * 65,
                                 ("[" * 70 + "]" * 70).encode("utf-16")[2:].decode("utf-16").encode()])
def test_loads_bounded_refuses_deep_json_by_name(raw: bytes) -> None:
    with pytest.raises(ResponseTooDeep, match=r"LLM endpoint http://e: .*cap of 64 levels"):
        loads_bounded(raw, url="http://e")
    assert loads_bounded(b'{"a":' * 64 + b"1" + b"}" * 64, url="http://e", max_depth=64)["a"]["a"]


@pytest.mark.parametrize("kwargs", [{"max_response_bytes": 0}, {"max_response_bytes": True},
                                    {"max_json_depth": 0}, {"max_json_depth": 2.5}, {"timeout_s": 0}])
def test_the_caps_themselves_are_checked(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        ChatCompletionsPolicy("http://127.0.0.1:9/v1", "m", **kwargs)
