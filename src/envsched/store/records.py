"""What a history store records about its sampler, and how a sampler is built back from that record.

A store's header is the sampler's construction record (:meth:`BaseSampler.to_record
<envsched.samplers.base.BaseSampler.to_record>`) plus the group size and, for a sampler with a dual-relation
graph, the graph's fingerprint. :func:`sampler_from_record` constructs the sampler a header names -- only a
class of envsched's sampler registry (:mod:`envsched.samplers.registry`), :func:`register_sampler_class` or
the caller's list -- with the class's ``from_record`` (or its record's ``restore`` hook). **A store is data,
never instructions**: nothing read from it chooses code, a file, an address or a process count.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envsched.samplers import registry
from envsched.samplers.base import BaseSampler, canonical_param, rebuildable, tasks_fingerprint
from envsched.store.errors import StoreError

__all__ = ["CALLER_PARAMS", "SAMPLER_CLASSES", "describe_sampler", "graph_fingerprint", "header_differences",
           "register_sampler_class", "sampler_from_record", "tasks_fingerprint"]

#: Sampler classes registered with :func:`register_sampler_class` (by class object), as ``"module:qualname"``;
#: with the registry's classes (:func:`envsched.samplers.registry.sampler_classes`) they are every class a
#: store may name. A store naming any other class is refused before anything is imported.
SAMPLER_CLASSES: set[str] = set()

#: ``sampler_params`` a store records for information only: they name where a sampler writes, which a store
#: never chooses (resume takes them from its caller), and they do not change the sampler's draws, so they are
#: not compared when a sampler is wrapped on an existing store.
CALLER_PARAMS: frozenset[str] = frozenset({"run_file"})

#: Words that mark a constructor argument of a sampler class outside envsched as something a store must not
#: choose (a file, folder, address, process or thread count); resume refuses such a recorded argument.
_CALLER_WORDS = ("file", "path", "dir", "url", "endpoint", "host", "port", "worker", "process", "thread",
                 "command", "module", "class", "callback")

#: Words that mark a constructor argument of a sampler class outside envsched as something a store must not
#: choose (a file, folder, address, process or thread count); resume refuses such a recorded argument.
_CALLER_WORDS = ("file", "path", "dir", "url", "endpoint", "host", "port", "worker", "process", "thread",
                 "command", "module", "class", "callback")


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register_sampler_class(cls: type) -> None:
    """Allow :meth:`DurableSampler.resume` to construct ``cls`` (a :class:`BaseSampler` subclass) from a
    store. Registration is by the class object, so a store can only name code the program imported. (A
    sampler registered with :func:`envsched.samplers.registry.register_sampler` and its ``sampler_class``
    needs no such call.)"""
    if not (isinstance(cls, type) and issubclass(cls, BaseSampler)):
        raise TypeError(f"register_sampler_class needs a BaseSampler subclass, got {cls!r}")
    SAMPLER_CLASSES.add(_class_name(cls))


def _resolve_sampler_class(name: Any, where: str, extra: Sequence[type]) -> tuple[type, str]:
    """The class a store's ``sampler_class`` names, if it is allowed, and its restore hook (``""``: the
    class's ``from_record``); checked before any import."""
    for cls in extra:
        if isinstance(cls, type) and _class_name(cls) == name:
            return cls, ""
    allowed = registry.sampler_classes()
    if not isinstance(name, str) or (name not in allowed and name not in SAMPLER_CLASSES):
        raise StoreError(f"store {where} names sampler class {str(name)[:120]!r}, which is not a registered "
                         "envsched sampler class: refusing to import or call it (a store is data, never code). "
                         "If it is your own sampler, pass DurableSampler.resume(..., sampler_classes=[YourClass]) "
                         "or call envsched.store.durable.register_sampler_class(YourClass) first")
    try:
        obj = registry.lookup(name)
    except (ImportError, AttributeError) as exc:
        raise StoreError(f"store {where}: cannot import sampler class {name} ({exc})") from None
    if not (isinstance(obj, type) and issubclass(obj, BaseSampler)):  # pragma: no cover - registry is checked
        raise StoreError(f"store {where}: {name} is not a sampler class")
    return obj, allowed.get(name, "")


def graph_fingerprint(graph: Any) -> str:
    """SHA-256 of what a scheduler reads from a dual-relation graph: task ids, environments, both neighbour
    relations (indices, and weights and similarities rounded to 6 decimals, so a rebuild on another machine
    whose floating point differs in the last bits still matches)."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    h.update(json.dumps([list(map(str, graph.task_ids)), list(map(str, graph.envs))]).encode())
    for name in ("env_codes", "within_index", "cross_index"):
        a = np.ascontiguousarray(np.asarray(getattr(graph, name), dtype=np.int64))
        h.update(name.encode() + repr(a.shape).encode() + a.tobytes())
    for name in ("within_weight", "within_similarity", "cross_weight", "cross_similarity"):
        a = np.asarray(getattr(graph, name), dtype=np.float64)
        r = np.ascontiguousarray(np.round(a, 6) + 0.0)  # + 0.0 folds -0.0 into 0.0
        h.update(name.encode() + repr(r.shape).encode() + r.tobytes())
    return h.hexdigest()


def _describe_graph(sampler: Any, graph_path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    graph = getattr(sampler, "graph", None)
    if graph is None or not hasattr(graph, "within_index"):
        return None
    return {"fingerprint": graph_fingerprint(graph), "num_nodes": int(graph.num_nodes),
            "config": canonical_param(dict(getattr(graph, "config", {}) or {})),
            "path": None if graph_path is None else os.fspath(graph_path)}


def describe_sampler(sampler: Any, group_size: int | None = None, *,
                     graph_path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The configuration a store records and checks: the sampler's construction record (``to_record()``:
    class, ``get_params()`` as plain JSON, pool fingerprint), the group size and -- for a sampler with a
    dual-relation graph (``EnvSchedSampler``) -- the graph's fingerprint, build configuration and, when given,
    the file it was loaded from (``graph_path``)."""
    if hasattr(sampler, "to_record"):
        out = dict(sampler.to_record())
    else:  # a sampler that is not a BaseSampler: the same fields, read the same way
        cls = type(sampler)
        params = sampler.get_params() if hasattr(sampler, "get_params") else {}
        canon = {k: canonical_param(v) for k, v in sorted(params.items())}
        out = {"sampler_class": _class_name(cls), "sampler_params": canon, "params_rebuildable": rebuildable(canon),
               "pool_fingerprint": tasks_fingerprint(sampler.tasks, tuple(sampler.reward_range)),
               "num_tasks": len(sampler.tasks), "reward_range": [float(x) for x in sampler.reward_range]}
    out["group_size"] = group_size
    graph = _describe_graph(sampler, graph_path)
    if graph is not None:
        out["graph"] = graph
    return out


def sampler_from_record(header: Mapping[str, Any], tasks: Sequence[Any] | Callable[[], Sequence[Any] | None], *,
                        where: str, sampler_classes: Sequence[type] = (), **resources: Any) -> tuple[Any, list[str]]:
    """The sampler a store's ``header`` describes, in its initial state, and one note per recorded field left
    unused. The class must be allowed (see the module docstring); a class outside envsched whose recorded
    arguments may name a file, address or process count is refused; ``resources`` (graph, graph_path,
    run_file, workers) come from the caller. ``tasks``: the task list, or a function reading the store's
    (called once the class is known to be allowed). Raises :class:`StoreError` naming what is wrong."""
    if not header.get("params_rebuildable", False):
        objs = [k for k, v in header["sampler_params"].items() if not rebuildable(v)]
        raise StoreError(f"store {where}: the {str(header['sampler_class'])[:120]} configuration holds "
                         f"objects the store cannot record ({', '.join(objs)[:200]}); construct the sampler "
                         "yourself and wrap it: DurableSampler(sampler, store)")
    cls, restore = _resolve_sampler_class(header["sampler_class"], where, sampler_classes)
    if callable(tasks):
        tasks = tasks()
    if tasks is None:
        raise StoreError(f"store {where} does not hold its task list (the tasks were not JSON); pass tasks=...")
    if not restore and header["sampler_class"] not in registry.builtin_classes():
        for name in header["sampler_params"]:
            if any(w in name.lower() for w in _CALLER_WORDS):
                raise StoreError(f"store {where}: sampler_params.{name[:60]} of {header['sampler_class']} may "
                                 "name a file, address or process count, which a store never chooses: construct "
                                 "the sampler yourself and wrap it: DurableSampler(sampler, store)")
    notes: list[str] = []
    build = registry.lookup(restore) if restore else cls.from_record
    try:
        if restore:
            sampler = build(cls, tasks, header, notes=notes, where=where, **resources)
        else:
            sampler = build(tasks, header, notes=notes, where=where, **resources)
    except StoreError:
        raise
    except (MemoryError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # whatever the recorded values make the constructor raise: a clear refusal
        raise StoreError(f"store {where}: cannot construct {header['sampler_class']} from the recorded "
                         f"configuration ({type(exc).__name__}: {str(exc)[:300]}); construct the sampler "
                         "yourself and wrap it: DurableSampler(sampler, store)") from None
    return sampler, notes


def header_differences(stored: Any, mine: Any) -> list[str]:
    """One line per recorded parameter that differs between ``stored`` and ``mine`` (caller parameters aside)."""
    keys = sorted((set(stored) | set(mine)) - CALLER_PARAMS)
    missing = object()
    out = []
    for k in keys:
        a, b = stored.get(k, missing), mine.get(k, missing)
        if a != b:
            fa = "(absent)" if a is missing else json.dumps(a)[:80]
            fb = "(absent)" if b is missing else json.dumps(b)[:80]
            out.append(f"{k}: store has {fa}, this sampler has {fb}")
    return out
