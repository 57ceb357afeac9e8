"""BFCL's sandboxed call worker (:mod:`envsched.envs.bfcl`): a process that executes one episode's calls, and
then BFCL's final check, holding the BFCL class instances between calls, under an address-space cap; the
environment sends it requests with a time budget and kills it when a budget passes."""

from __future__ import annotations

import contextlib
import decimal
import os
import re
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from envsched.envs._bfcl_package import _bfcl
from envsched.envs._worker_pool import PooledWorker, limit_address_space, wait_for_request

__all__: list[str] = []


def _sanitize(name: str) -> str:
    return re.sub(r"[-./:]", "_", name)


@contextlib.contextmanager
def _memory_errors(executor: Callable[..., Any]) -> Iterator[list[bool]]:
    """Notice a ``MemoryError`` that reaches BFCL's executor: it turns every exception of a call into an
    error string, which would hide that the call ran out of its memory budget."""
    hit: list[bool] = []
    target = getattr(executor, "__code__", None)

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "exception" and issubclass(arg[0], MemoryError):
            hit.append(True)
        return local

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is target else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield hit
    finally:
        sys.settrace(previous)


def _worker_main(conn: Any, memory_bytes: int) -> None:
    """The worker process: executes one episode's calls (and then its check) on request, holding the BFCL
    class instances between calls; its address space is capped ``memory_bytes`` above its start size."""
    parent = os.getppid()
    b = _bfcl()
    limit_address_space(memory_bytes)
    entry: dict[str, Any] = {}
    model_name = ""
    ctx = decimal.Context()
    while True:
        try:
            wait_for_request(conn, parent)
            msg = conn.recv()
        except (EOFError, OSError):
            return
        op = msg[0]
        try:
            if op == "begin":  # a new episode in this (possibly reused) worker
                if model_name:
                    _drop_instances(model_name)
                entry, model_name, ctx = msg[1], msg[2], decimal.Context()
                reply: tuple[str, Any] = ("ok", None)
            elif op == "call":
                with _episode_decimal(ctx), _memory_errors(b.execute) as hit:
                    out, _ = b.execute(func_call_list=[msg[1]], initial_config=entry.get("initial_config", {}),
                                       involved_classes=entry["involved_classes"], model_name=model_name,
                                       test_entry_id=entry["id"], long_context=msg[2], is_evaL_run=False)
                if hit:
                    raise MemoryError
                reply = ("ok", [str(r) if not isinstance(r, str) else r for r in out])
            elif op == "check":
                reply = ("ok", _check(entry, msg[1]))
            else:
                reply = ("error", f"unknown request {op!r}")
        except MemoryError:
            reply = ("budget", "the call exceeded its memory budget")
        except Exception as exc:  # BFCL's own failure: reported, the worker goes on
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except MemoryError:
            conn.send(("budget", "the call's result exceeded the memory budget"))


class _CallWorker(PooledWorker):
    """One worker process and the pipe to it. ``fork`` where the platform has it: the worker starts at once
    with bfcl-eval already imported and runs nothing of the caller's ``__main__`` (``spawn``/``forkserver``
    would re-import an unguarded script); it only runs this module's code and BFCL's, so the parent's other
    threads do not matter to it."""

    target = _worker_main
    process_name = "envsched-bfcl-calls"
    idle: ClassVar[list[_CallWorker]] = []
    idle_lock = threading.Lock()
    max_idle = 8

    def request(self, msg: tuple[Any, ...], timeout_s: float) -> tuple[str, Any]:
        """Send ``msg``; ``("ok", value)``, ``("error", why)`` or ``("budget", why)`` (then the worker is dead)."""
        try:
            self.conn.send(msg)
            ready = self.conn.poll(max(0.0, timeout_s))
            if ready:
                reply = self.conn.recv()
                if reply[0] == "budget":  # out of memory: never reuse a worker in that state
                    self.kill()
                return reply
        except (EOFError, OSError, BrokenPipeError):
            self.kill()
            return "budget", f"the call's worker process died (exit code {self.proc.exitcode})"
        self.kill()
        return "budget", f"the call took longer than its {timeout_s:.3g}s budget"


@contextlib.contextmanager
def _episode_decimal(ctx: decimal.Context) -> Iterator[None]:
    """Make ``ctx`` the thread's decimal context (BFCL code may change it) and restore the caller's after."""
    saved = decimal.getcontext()
    decimal.setcontext(ctx)
    try:
        yield
    finally:
        decimal.setcontext(saved)


def _drop_instances(model_name: str) -> None:
    """Forget the instances BFCL's executor keeps in its module globals under ``model_name``."""
    prefix = _sanitize(model_name)
    store = vars(_bfcl().utils)
    for key in [k for k in store if k.startswith(prefix)]:
        store.pop(key, None)


def _check(entry: Mapping[str, Any], calls: list[list[list[str]]]) -> tuple[float | None, dict[str, Any]]:
    b = _bfcl()
    name = f"envsched_check_{uuid.uuid4().hex}"
    # Steps with no calls are not steps to BFCL's evaluator (it drops empty decoded responses).
    decoded = [[step for step in turn if step] for turn in calls]
    try:
        # BFCL's MathAPI sets the process-wide decimal precision; keep that inside the episode, starting
        # from Python's default context, so that neither BFCL nor other code (reasoning-gym's decimal
        # datasets) sees the other's setting.
        with _episode_decimal(decimal.Context()):
            verdict = b.checker(decoded, entry["ground_truth"], dict(entry), entry["id"].rsplit("_", 1)[0], name)
    except Exception as exc:  # the checker itself failed: not a score
        result: tuple[float | None, dict[str, Any]] = (None, {"error": f"{type(exc).__name__}: {exc}"})
    else:
        result = (1.0 if verdict.get("valid") else 0.0, _summarise(verdict))
    finally:
        _drop_instances(name)
    return result


def _summarise(verdict: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"valid": bool(verdict.get("valid"))}
    for key in ("error_type", "error_message"):
        if key in verdict:
            out[key] = verdict[key]
    return out
