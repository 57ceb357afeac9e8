"""Generating reasoning-gym items in a worker process, so that no generator runs in the caller's process.

Some reasoning-gym generators keep memory they never free (``sokoban`` keeps about 127 MB per item generated
in reasoning-gym 0.1.25: six items took a process from 353 MB to 1,555 MB) or take seconds per item. Every
item envsched generates (building a pool, regenerating a task's item for an episode or a score, the OpenEnv
server's generated tasks) is made by :func:`generate_item` in a worker forked from the caller
(:class:`~envsched.envs._worker_pool.PooledWorker`):

- its address space is capped :data:`GENERATION_MEMORY_MB` MiB above its start size; a generator over it is
  an error (``RuntimeError``), not a crash of the caller;
- after each item it reports how far its address space has grown; past :data:`RETIRE_GROWTH_MB` MiB it is
  retired (stopped, and the next item goes to a fresh worker), so a leaking generator costs a fork every few
  items instead of the caller's memory;
- an item not generated within :data:`GENERATION_TIMEOUT_S` seconds is an error and the worker is killed.

The worker never sees a model's answer, only the (name, configuration, seed, size, index) of an item. Its
replies are pickled (items hold tuples and numpy scalars that JSON would change); the caller reads them with
an unpickler that accepts builtin values and a short list of value classes only (numpy scalars, arrays and
dtypes, ``Fraction``, ``Decimal``, ``OrderedDict``), anything else is an error.
"""

from __future__ import annotations

import contextlib
import decimal
import functools
import io
import json
import os
import pickle
import resource
import threading
from typing import Any, ClassVar

from envsched.envs._worker_pool import PooledWorker, address_space, limit_address_space, wait_for_request

__all__ = ["GENERATION_MEMORY_MB", "GENERATION_TIMEOUT_S", "RETIRE_GROWTH_MB", "generate_item"]

#: Seconds one item may take to generate (a hang guard: the slowest generator measured took 5 s per item).
GENERATION_TIMEOUT_S = 600.0
#: MiB of address space the generation worker may add to its start size.
GENERATION_MEMORY_MB = 4096
#: MiB of address-space growth after which the generation worker is replaced by a fresh one.
RETIRE_GROWTH_MB = 768

_VALUE_CLASSES = frozenset({
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "slice"),
    ("builtins", "range"), ("fractions", "Fraction"), ("decimal", "Decimal"), ("collections", "OrderedDict"),
    ("numpy", "dtype"), ("numpy", "ndarray"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"),
})


class _ValueUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _VALUE_CLASSES:
            raise pickle.UnpicklingError(f"a generated item holds a {module}.{name}, not a plain value")
        return super().find_class(module, name)


@functools.lru_cache(maxsize=512)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    from reasoning_gym import factory

    with decimal.localcontext(decimal.Context()):
        return factory.create_dataset(name, size=size, seed=seed, **json.loads(config_json))


def _item_main(conn: Any, memory_bytes: int) -> None:
    """The generation worker: answers ``(name, config_json, seed, size, index)`` with ``(("ok", item) |
    ("error", why) | ("budget", why) | ("unregistered", name), address-space growth in bytes)``."""
    parent = os.getppid()
    limit_address_space(memory_bytes)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    start = address_space()
    while True:
        try:
            wait_for_request(conn, parent)
            name, config_json, seed, size, index = conn.recv()  # from the trusted caller only
        except (EOFError, OSError):
            return
        try:
            from reasoning_gym import factory

            if name not in factory.DATASETS:  # registered in the caller after this worker was forked
                reply: tuple[str, Any] = ("unregistered", name)
            else:
                ds = _dataset(name, config_json, seed, size)
                with decimal.localcontext(decimal.Context()):
                    reply = ("ok", ds[index])
        except MemoryError:
            reply = ("budget", f"generating the item needed more than {memory_bytes >> 20} MiB")
        except Exception as exc:  # the generator's own failure (a configuration it refuses): reported
            reply = ("error", f"{type(exc).__name__}: {str(exc)[:500]}")
        try:
            conn.send_bytes(pickle.dumps((reply, address_space() - start)))
        except (TypeError, AttributeError, pickle.PicklingError) as exc:
            conn.send_bytes(pickle.dumps((("error", f"the item cannot be sent ({type(exc).__name__})"), 0)))


class _ItemWorker(PooledWorker):
    """One generation worker process and the pipe to it."""

    target = _item_main
    process_name = "envsched-rg-items"
    idle: ClassVar[list[_ItemWorker]] = []
    idle_lock = threading.Lock()
    max_idle = 2

    def __init__(self, memory_bytes: int) -> None:
        import reasoning_gym.factory  # noqa: F401  # imported here, so the forked child imports nothing (another
        super().__init__(memory_bytes)  # thread may hold an import lock at the fork)

    def request(self, msg: tuple[Any, ...], timeout_s: float) -> tuple[tuple[str, Any], int]:
        try:
            self.conn.send(msg)
            if self.conn.poll(timeout_s):
                return _ValueUnpickler(io.BytesIO(self.conn.recv_bytes())).load()
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            self.kill()
            return ("budget", f"the generation worker failed ({type(exc).__name__}: {exc}, exit code "
                              f"{self.proc.exitcode})"), 0
        self.kill()
        return ("budget", f"the item took longer than {timeout_s:g} s to generate"), 0


def generate_item(name: str, config: dict[str, Any], seed: int, size: int, index: int) -> dict[str, Any]:
    """Item ``index`` of ``create_dataset(name, size=size, seed=seed, **config)``, generated in the worker.

    ``ValueError`` (naming the dataset and what its generator raised) when reasoning-gym refuses the
    configuration or fails; ``RuntimeError`` when the generator ran out of time or memory."""
    msg = (name, json.dumps(config, sort_keys=True), int(seed), int(size), int(index))
    for attempt in range(2):
        worker = _ItemWorker.get(GENERATION_MEMORY_MB << 20)
        (status, value), growth = ("budget", "the request failed"), None
        try:
            (status, value), growth = worker.request(msg, GENERATION_TIMEOUT_S)
        finally:
            if isinstance(growth, int) and growth <= RETIRE_GROWTH_MB << 20:
                worker.release()
            else:  # a generator that keeps memory: the next item goes to a fresh worker
                worker.kill()
        if status != "unregistered" or attempt:
            break
        _ItemWorker.clear_idle()  # workers forked before the dataset was registered: fork fresh ones
    if status == "ok" and isinstance(value, dict):
        return value
    if status == "error":
        raise ValueError(f"reasoning-gym could not generate item {index} of {name!r}: {value}")
    raise RuntimeError(f"reasoning-gym item {index} of {name!r} was not generated: {value}")
