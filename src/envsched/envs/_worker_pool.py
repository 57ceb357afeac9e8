"""Bounded worker processes, reused through an idle list: what BFCL's call worker (:mod:`envsched.envs.bfcl`),
the reasoning-gym scorer worker (:mod:`envsched.envs.safe_scoring`) and the reasoning-gym generation worker
(:mod:`envsched.envs._rg_items`) share.

A worker is forked where the platform can (it starts at once, with what the parent imported, and runs none of
the caller's ``__main__``), caps its own address space a budget above its start size, and talks to the parent
over a pipe. Each kind of worker keeps its own idle list (a class attribute of its subclass), so an episode or a
score reuses a live process instead of forking one; a worker that ran out of time or memory is killed, never
reused.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeVar

__all__ = ["PooledWorker", "address_space", "close_inherited_sockets", "limit_address_space", "process_context",
           "wait_for_request"]

W = TypeVar("W", bound="PooledWorker")


def process_context() -> Any:
    """``fork`` where the platform has it, else ``spawn``."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


@contextlib.contextmanager
def _children_allowed() -> Iterator[None]:
    """Let this process start a worker even when it is daemonic.

    multiprocessing refuses to start a process from a daemonic one, because a daemonic process is terminated
    when its parent exits and would leave its children behind. TRL's asynchronous rollout worker is such a
    process, and it scores answers. A worker of this module cannot be left behind: it stops when its pipe
    closes and when it finds that the process that started it is gone (:func:`wait_for_request`), so the
    refusal is lifted for the start and put back after it."""
    me = multiprocessing.current_process()
    if not me.daemon:
        yield
        return
    me.daemon = False
    try:
        yield
    finally:
        me.daemon = True


def wait_for_request(conn: Any, parent: int, poll_s: float = 1.0) -> None:
    """Called in a worker: return once ``conn`` has a request; ``EOFError`` once the process that started the
    worker (pid ``parent``) is gone, so a worker never outlives its parent even when the parent was killed
    before it could close the pipe."""
    while not conn.poll(poll_s):
        if os.getppid() != parent:
            raise EOFError("the process that started this worker is gone")


def close_inherited_sockets(keep: int) -> None:
    """Called first in a forked worker: release every socket it inherited from its parent but ``keep`` (its pipe).
    A forked child holds a copy of each of the parent's descriptors; a server's listening socket among them
    would stay bound for as long as the idle worker lives, so that server could not be started again on its
    port after a stop, and a client connecting while it is down would be queued instead of refused. A worker
    needs no socket but its pipe. Each such descriptor is pointed at ``/dev/null`` rather than closed: a Python
    socket object inherited with it may still close it when collected, and must not close a descriptor the
    worker opened later under the same number. (Where ``/proc/self/fd`` does not exist nothing is done; ``spawn``
    passes no descriptors anyway.)"""
    import stat

    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    null = -1
    try:
        for fd in fds:
            if fd == keep or fd <= 2:
                continue
            try:
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    if null < 0:
                        null = os.open(os.devnull, os.O_RDWR)
                    os.dup2(null, fd)
            except OSError:  # (the listing's own descriptor, already closed)
                continue
    finally:
        if null >= 0:
            os.close(null)


def _worker_main(target: Callable[[Any, int], None], conn: Any, memory_bytes: int) -> None:
    close_inherited_sockets(conn.fileno())
    target(conn, memory_bytes)


def address_space() -> int:
    """This process's virtual memory size in bytes (0 when /proc is unavailable)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def limit_address_space(memory_bytes: int) -> None:
    """Called in a worker: cap its address space ``memory_bytes`` above its present size (where it can)."""
    import resource

    with contextlib.suppress(ValueError, OSError):
        base = address_space()
        if base:
            resource.setrlimit(resource.RLIMIT_AS, (base + memory_bytes, base + memory_bytes))


class PooledWorker:
    """One worker process and the pipe to it. A subclass sets :attr:`target` (the worker's main function,
    called as ``target(conn, memory_bytes)``), :attr:`process_name`, its own :attr:`idle`/:attr:`idle_lock`
    and :attr:`max_idle`, and adds its request method."""

    target: ClassVar[Callable[[Any, int], None]]
    process_name: ClassVar[str]
    idle: ClassVar[list[Any]]
    idle_lock: ClassVar[threading.Lock]
    max_idle: ClassVar[int]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        os.register_at_fork(after_in_child=cls._forget_inherited)

    @classmethod
    def _forget_inherited(cls) -> None:
        """In a process forked from the owner of the idle workers (a process pool of the benchmark, say): those
        workers are the parent's, which this process can neither use nor stop, and the lock may have been held
        by another thread at the fork. This process starts with none and a fresh lock."""
        cls.idle = []
        cls.idle_lock = threading.Lock()

    def __init__(self, memory_bytes: int) -> None:
        ctx = process_context()
        self.conn, child = ctx.Pipe()
        self.memory_bytes = memory_bytes
        self.proc = ctx.Process(target=_worker_main, args=(type(self).target, child, memory_bytes), daemon=True,
                                name=self.process_name)
        with _children_allowed():
            self.proc.start()
        child.close()

    @classmethod
    def get(cls: type[W], memory_bytes: int) -> W:
        """An idle live worker with this budget, or a new one (idle workers of another budget are stopped)."""
        with cls.idle_lock:
            while cls.idle:
                w = cls.idle.pop()
                if w.proc.is_alive() and w.memory_bytes == memory_bytes:
                    return w
                w.kill()
        return cls(memory_bytes)

    @classmethod
    def clear_idle(cls) -> None:
        """Stop every idle worker of this kind (the next :meth:`get` forks a fresh one)."""
        with cls.idle_lock:
            while cls.idle:
                cls.idle.pop().kill()

    def release(self) -> None:
        """Back to the idle list for the next use (or stopped if the list is full or it was killed)."""
        cls = type(self)
        with cls.idle_lock:
            if not self.conn.closed and self.proc.is_alive() and len(cls.idle) < cls.max_idle:
                cls.idle.append(self)
                return
        self.kill(wait=False)

    def kill(self, wait: bool = True) -> None:
        """Stop the worker (SIGKILL). Without ``wait`` the caller goes on at once: a large process takes tens of
        milliseconds to exit, and multiprocessing reaps it when it next starts a process."""
        with contextlib.suppress(Exception):
            self.proc.kill()
            if wait:
                self.proc.join(5)
        with contextlib.suppress(Exception):
            self.conn.close()
