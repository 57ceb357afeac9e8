"""``DurableSampler``: any envsched sampler, with every dispatch and update logged to a :class:`HistoryStore`.

The wrapped sampler's state is a pure function of its initial state and the sequence of ``sample``,
``update`` and ``discard`` calls it received (its random generator is part of the state). The wrapper
appends each call, in the order applied, to the store in the same transaction that acknowledges it; to
rebuild a sampler after a crash it loads the latest snapshot (or the initial state) and replays the events
that follow, checking that every replayed draw equals the logged one. Hence:

* an ``update`` that returned is in the store (one committed transaction per call);
* the rebuilt sampler holds every acknowledged update and makes the same next draws as a sampler that never
  crashed;
* several processes can share one store: each takes the store's lock, replays the events the others
  appended since its last call, then applies and logs its own -- one linearised history, as if a single
  sampler had served every process.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envsched.pool.pool import TaskPool
from envsched.pool.spec import task_key
from envsched.samplers.base import BaseSampler
from envsched.store.history import (
    Event,
    HistoryStore,
    StoreCorruptError,
    StoreError,
    StoreMismatchError,
    canonical_json,
    genesis_digest,
)

__all__ = ["SAMPLER_CLASSES", "DurableSampler", "LeaseConflictError", "LeaseExpiredError", "ReplayDivergenceError",
           "UnknownLeaseError", "describe_sampler", "graph_fingerprint", "register_sampler_class",
           "tasks_fingerprint"]

_REPLAY_CHUNK = 5000
_GO = object()  # a pre-check's answer: go on and apply the call


class LeaseExpiredError(ValueError):
    """An update (or discard) named a lease whose group was already given back: reclaimed after its lease
    expired, or discarded. Its rewards are not counted (the task can be drawn again)."""


class LeaseConflictError(LeaseExpiredError):
    """An update named a lease that an update with *other* rewards (or costs) already consumed: it is not a
    retry of that update, and its rewards are refused (a retry with the same rewards is answered
    ``"already_applied"``). Nothing is changed."""


class UnknownLeaseError(ValueError):
    """An update (or discard) named a lease that was never issued (by this host or, for a durable sampler,
    in this store), or a lease of another task. Nothing is changed."""


class ReplayDivergenceError(StoreError):
    """Replaying the log did not reproduce it: a replayed draw differs from the logged one, or a logged
    update is refused. The sampler is not deterministic given its state, or the code changed."""


#: The sampler classes :meth:`DurableSampler.resume` may construct from a store's metadata, as
#: ``"module:qualname"``. A store naming any other class is refused before anything is imported.
SAMPLER_CLASSES: set[str] = {
    "envsched.samplers.simple:SequentialSampler",
    "envsched.samplers.simple:UniformSampler",
    "envsched.samplers.simple:CurriculumSampler",
    "envsched.samplers.baselines:DynamicSamplingSampler",
    "envsched.samplers.baselines:MoPPSSampler",
    "envsched.samplers.baselines:GRESOSampler",
    "envsched.samplers.baselines:PLRSampler",
    "envsched.samplers.dps:DPSSampler",
    "envsched.samplers.sec:SECSampler",
    "envsched.method.sampler:EnvSchedSampler",
}


#: ``sampler_params`` a store records for information only: they name where a sampler writes, which a store
#: never chooses (resume takes them from its caller), and they do not change the sampler's draws, so they are
#: not compared when a sampler is wrapped on an existing store.
CALLER_PARAMS: frozenset[str] = frozenset({"run_file"})

#: Words that mark a constructor argument of a sampler class outside envsched as something a store must not
#: choose (a file, folder, address, process or thread count); resume refuses such a recorded argument.
_CALLER_WORDS = ("file", "path", "dir", "url", "endpoint", "host", "port", "worker", "process", "thread",
                 "command", "module", "class", "callback")

#: Upper bounds on the recorded GraphConfig numbers a rebuild accepts (a crafted store could otherwise ask for
#: a graph that exhausts memory before its fingerprint is checked).
_GRAPH_REBUILD_CAPS = {"k_within": 10_000, "k_cross": 10_000, "ann_m": 1_000, "ann_ef_construction": 100_000,
                       "ann_ef_search": 100_000, "ann_oversample": 1_000, "ann_dense_dim": 100_000,
                       "exact_block_rows": 1_000_000, "exact_max_nodes": 10_000_000,
                       "initial_context_max_chars": 10_000_000, "recall_sample": 1_000_000,
                       "max_features_per_view": 10_000_000, "min_df": 1_000_000, "bandwidth_rank": 10_000}


#: envsched's own sampler classes (their arguments name no file, address or process count).
_BUILTIN_CLASSES: frozenset[str] = frozenset(SAMPLER_CLASSES)


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register_sampler_class(cls: type) -> None:
    """Allow :meth:`DurableSampler.resume` to construct ``cls`` (a :class:`BaseSampler` subclass) from a
    store. Registration is by the class object, so a store can only name code the program imported."""
    if not (isinstance(cls, type) and issubclass(cls, BaseSampler)):
        raise TypeError(f"register_sampler_class needs a BaseSampler subclass, got {cls!r}")
    SAMPLER_CLASSES.add(_class_name(cls))


def _resolve_sampler_class(name: Any, where: str, extra: Sequence[type]) -> type:
    """The class a store's ``sampler_class`` names, if it is allowed; checked before any import."""
    for cls in extra:
        if isinstance(cls, type) and _class_name(cls) == name:
            return cls
    if not isinstance(name, str) or name not in SAMPLER_CLASSES:
        raise StoreError(f"store {where} names sampler class {str(name)[:120]!r}, which is not a registered "
                         "envsched sampler class: refusing to import or call it (a store is data, never code). "
                         "If it is your own sampler, pass DurableSampler.resume(..., sampler_classes=[YourClass]) "
                         "or call envsched.store.durable.register_sampler_class(YourClass) first")
    module, _, qualname = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise StoreError(f"store {where}: cannot import sampler class {name} ({exc})") from None
    if not (isinstance(obj, type) and issubclass(obj, BaseSampler)):  # pragma: no cover - registry is checked
        raise StoreError(f"store {where}: {name} is not a sampler class")
    return obj


def tasks_fingerprint(tasks: Sequence[Any], reward_range: tuple[float, float]) -> str:
    """SHA-256 of the task specs and the reward range; equals :meth:`TaskPool.fingerprint` for the same pool."""
    if isinstance(tasks, TaskPool) and tuple(tasks.reward_range) == tuple(reward_range):
        return tasks.fingerprint()
    import hashlib

    h = hashlib.sha256()
    h.update(json.dumps([float(reward_range[0]), float(reward_range[1])]).encode())
    for s in tasks:
        h.update(json.dumps(s, sort_keys=True, separators=(",", ":"), default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def _canonical_param(value: Any) -> Any:
    """A JSON form of a constructor argument; objects that JSON cannot hold become ``{"__object__": type}``."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int) or (hasattr(value, "dtype") and getattr(value, "ndim", None) == 0
                                  and str(value.dtype).startswith(("int", "uint"))):
        return int(value)
    if isinstance(value, float) or (hasattr(value, "dtype") and getattr(value, "ndim", None) == 0):
        f = float(value)
        return f if math.isfinite(f) else {"__float__": repr(f)}
    if isinstance(value, list | tuple):
        return [_canonical_param(v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _canonical_param(v) for k, v in sorted(value.items())}
    if hasattr(value, "tolist") and hasattr(value, "shape"):
        return _canonical_param(value.tolist())
    t = type(value)
    return {"__object__": f"{t.__module__}.{t.__qualname__}"}


def _rebuildable(value: Any) -> bool:
    if isinstance(value, dict):
        return "__object__" not in value and "__float__" not in value and all(_rebuildable(v) for v in value.values())
    if isinstance(value, list):
        return all(_rebuildable(v) for v in value)
    return True


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
            "config": _canonical_param(dict(getattr(graph, "config", {}) or {})),
            "path": None if graph_path is None else os.fspath(graph_path)}


def describe_sampler(sampler: Any, group_size: int | None = None, *,
                     graph_path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The configuration a store records and checks: class, ``get_params()`` (as plain JSON), pool
    fingerprint, group size and -- for a sampler with a dual-relation graph (``EnvSchedSampler``) -- the
    graph's fingerprint, build configuration and, when given, the file it was loaded from (``graph_path``)."""
    cls = type(sampler)
    params = sampler.get_params() if hasattr(sampler, "get_params") else {}
    canon = {k: _canonical_param(v) for k, v in sorted(params.items())}
    out = {
        "sampler_class": f"{cls.__module__}:{cls.__qualname__}",
        "sampler_params": canon,
        "params_rebuildable": _rebuildable(canon),
        "pool_fingerprint": tasks_fingerprint(sampler.tasks, tuple(sampler.reward_range)),
        "num_tasks": len(sampler.tasks),
        "reward_range": [float(x) for x in sampler.reward_range],
        "group_size": group_size,
    }
    graph = _describe_graph(sampler, graph_path)
    if graph is not None:
        out["graph"] = graph
    return out


def _resume_envsched(cls: Any, tasks: Any, params: dict[str, Any], header: Mapping[str, Any], where: str,
                     caller: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """Construct an ``EnvSchedSampler`` from a store: its ``SchedulerConfig`` from the recorded plain data,
    its graph from the caller (``graph`` or ``graph_path``) or a rebuild with the recorded ``GraphConfig`` --
    refused unless the graph's fingerprint equals the recorded one. The recorded graph file, run file, worker
    and thread counts, LLM endpoint and cache folder are never used (a store is data: it chooses no path,
    address or process count); returns the sampler and one note per recorded field left unused."""
    from envsched.method.config import GraphConfig, SchedulerConfig
    from envsched.pool import TaskPool

    notes: list[str] = []
    recorded = header.get("graph")
    if not isinstance(recorded, Mapping) or "fingerprint" not in recorded:
        raise StoreError(f"store {where} does not record the EnvSchedSampler's graph (written by an older "
                         "envsched): construct the sampler with its graph and wrap it: DurableSampler(sampler, "
                         "store)")
    params = dict(params)
    config = SchedulerConfig.from_dict(params.pop("config"))
    stored_run_file = params.pop("run_file", "") or None
    run_file = caller.get("run_file")
    if stored_run_file and run_file is None:
        notes.append(f"sampler_params.run_file ({str(stored_run_file)[:120]}) is not written: a store never "
                     "chooses a file to write; pass resume(..., run_file=PATH) to append explanations")
    reward_range = tuple(params.pop("reward_range", header.get("reward_range") or (0.0, 1.0)))
    pool = TaskPool(list(tasks), reward_range=reward_range)
    graph, graph_path = caller.get("graph"), caller.get("graph_path")
    source = "the graph passed in"
    if graph is None and graph_path is not None:
        from envsched.method.graph.io import load_graph

        graph = load_graph(graph_path, expected_fingerprint=header["pool_fingerprint"])
        source = f"graph file {os.fspath(graph_path)}"
    if graph is None:
        if recorded.get("path"):
            notes.append(f"graph.path ({str(recorded['path'])[:120]}) is not opened: a store never chooses a file "
                         "to read; the graph is rebuilt from the recorded GraphConfig (pass resume(..., "
                         "graph_path=PATH) or `envsched store verify --graph PATH` to load it)")
        graph_config = _safe_graph_config(dict(recorded.get("config") or {}), where, caller, notes)
        from envsched.method.graph.build import build_graph

        graph = build_graph(pool, GraphConfig.from_dict(graph_config))
        source = "the graph rebuilt from the recorded GraphConfig"
    got = graph_fingerprint(graph)
    if got != recorded["fingerprint"]:
        raise StoreMismatchError(f"store {where} was written with a graph of fingerprint "
                                 f"{str(recorded['fingerprint'])[:12]}..., but {source} has {got[:12]}...: pass "
                                 "the run's graph (resume(store, graph_path=PATH)) or use a new store")
    return cls(pool, graph, config, run_file=run_file, reward_range=reward_range, **params), notes


def _safe_graph_config(config: dict[str, Any], where: str, caller: Mapping[str, Any], notes: list[str]
                       ) -> dict[str, Any]:
    """The recorded ``GraphConfig`` with what a store must not choose taken from the caller: an LLM
    abstraction (it would send the pool to the recorded endpoint) is refused; the worker and thread counts
    are the caller's ``workers``; the LLM endpoint, model and cache folder are dropped. Numbers beyond
    :data:`_GRAPH_REBUILD_CAPS` are refused."""
    if config.get("abstraction", "static") != "static":
        raise StoreError(f"store {where}: graph.config.abstraction is {str(config.get('abstraction'))[:40]!r} "
                         f"(endpoint {str(config.get('llm_endpoint'))[:80]!r}): a store never chooses an address "
                         "to call, so its graph is not rebuilt; pass the run's graph: resume(store, "
                         "graph_path=PATH) (`envsched store verify --graph PATH`)")
    for name, cap in _GRAPH_REBUILD_CAPS.items():
        value = config.get(name)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value <= cap):
            raise StoreError(f"store {where}: graph.config.{name} is {str(value)[:40]} (at most {cap} for a "
                             "rebuild from the store): pass the run's graph: resume(store, graph_path=PATH)")
    workers = int(caller.get("workers", 1))
    for name in ("workers", "ann_threads"):
        if name in config and config[name] not in (0, 1, workers):
            notes.append(f"graph.config.{name} ({str(config[name])[:20]}) is not used: a store never chooses a "
                         f"process or thread count; the rebuild uses {workers} (pass resume(..., workers=N))")
        config[name] = workers
    for name in ("llm_endpoint", "llm_model", "llm_cache_dir"):
        if config.get(name) is not None:
            notes.append(f"graph.config.{name} is not used: a store never chooses an address or folder")
        config[name] = None
    return config


_RESUME_ADAPTERS: dict[str, Callable[..., Any]] = {"envsched.method.sampler:EnvSchedSampler": _resume_envsched}


def _differences(stored: Any, mine: Any) -> list[str]:
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


class DurableSampler:
    """A :class:`~envsched.samplers.base.TaskSampler` that logs every call to a :class:`HistoryStore`
    and rebuilds itself from it.

    Wrapping a sampler on an empty store creates the store (configuration, pool fingerprint, task list and
    the sampler's initial state). Wrapping a sampler of the same class, configuration and pool on an
    existing store replaces the wrapped sampler's state with the one rebuilt from the store: the same line
    of code starts a run and resumes it after a crash.

    Args:
        sampler: the sampler to make durable (a :class:`BaseSampler`; any sampler, including
            ``EnvSchedSampler``). Its state is overwritten when the store already holds a history.
        store: a :class:`HistoryStore`, or a path / URL to open one.
        group_size: if given, every ``update`` must carry exactly this many rewards.
        snapshot_every: store a ``state_dict`` snapshot after every ``snapshot_every``-th event, so that a
            rebuild replays at most that many events (``None``: never; rebuilds replay the whole log).
        use_snapshots: rebuild from the latest snapshot (``True``) or replay the whole log from the initial
            state (``False``: slower, checks every logged draw and the lease index).
        graph_path: for an ``EnvSchedSampler``, the graph file its graph was loaded from; recorded (with the
            graph's fingerprint and build configuration) so that :meth:`resume` can reload it.

    Raises:
        StoreMismatchError: the store was written for another pool, sampler class, configuration or group
            size (the message names what differs); nothing is changed.
        StoreCorruptError: the store is damaged or truncated.
        ReplayDivergenceError: a replayed draw differs from the logged one (non-deterministic sampler or
            changed code).
    """

    def __init__(self, sampler: BaseSampler, store: HistoryStore | str | os.PathLike[str], *,
                 group_size: int | None = None, snapshot_every: int | None = 1000,
                 use_snapshots: bool = True, graph_path: str | os.PathLike[str] | None = None) -> None:
        for name in ("sample", "update", "discard", "state_dict", "load_state_dict", "tasks", "reward_range"):
            if not hasattr(sampler, name):
                raise TypeError(f"DurableSampler needs a BaseSampler-like sampler (missing {name!r}), got "
                                f"{type(sampler).__name__}")
        if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                       or group_size < 1):
            raise ValueError(f"group_size must be a positive integer or None, got {group_size!r}")
        if snapshot_every is not None and (isinstance(snapshot_every, bool) or not isinstance(snapshot_every, int)
                                           or snapshot_every < 1):
            raise ValueError(f"snapshot_every must be a positive integer or None, got {snapshot_every!r}")
        self.store = store if isinstance(store, HistoryStore) else HistoryStore(store)
        self.sampler = sampler
        self.group_size = group_size
        self.snapshot_every = snapshot_every
        self._lock = threading.RLock()
        self._stale = False
        self._broken: str | None = None
        self._seq = 0
        self._digest = ""
        self._replayed = 0
        self._last_keys: list[str] = []
        self._lease_cache: dict[str, Any] | None = None
        self._closing: list[tuple[str, int, str]] = []
        self._audit: dict[str, list[Any]] | None = None
        self._groups: dict[str, tuple[Any, Any]] = {}
        #: one line per thing this sampler noticed about its store and did not act on (e.g. a field
        #: :meth:`resume` left unused, a missing lease table of an old store opened read-only)
        self.notes: list[str] = []
        expected = describe_sampler(sampler, group_size, graph_path=graph_path)
        header = self.store.header()
        if header is None and self.store.read_only:
            raise StoreError(f"store {self.store.where} holds no history yet (opened read-only: nothing is created)")
        if header is None:
            try:
                tasks_json: Any = json.loads(canonical_json(list(sampler.tasks)))
            except (TypeError, ValueError):
                tasks_json = None  # not JSON: the store cannot rebuild the sampler without its tasks
            before = sampler.state_dict()
            self.store.initialize({**expected, "tasks": tasks_json}, before)
            header = self.store.header()
            if header is None:  # pragma: no cover - defensive
                raise StoreError(f"store {self.store.where} could not be created")
        self._check_header(header, expected)
        self._store_id: str = header["store_id"]
        state_before = sampler.state_dict()
        try:
            with self._lock, self.store.transaction() as tx:
                if not self.store.has_lease_table(tx):
                    self._missing_lease_table(tx, header)
                self._rebuild(tx, latest=use_snapshots)
        except BaseException:
            with contextlib.suppress(Exception):  # the original error is the one to report
                sampler.load_state_dict(state_before)
            raise

    def _missing_lease_table(self, tx: Any, header: Mapping[str, Any]) -> None:
        """A store without a lease table: refused when it was created with one, or when its events name
        leases (the table was dropped); otherwise a store written before leases existed, which gets the table
        -- or, opened read-only, a note saying it will get one on the first write."""
        where = self.store.where
        if header.get("lease_table") or self.store.events_name_leases(tx):
            raise StoreCorruptError(f"store {where}: its lease table {self.store.t_leases} is missing, but the "
                                    "store was created with one (or its events name leases): the table was "
                                    "dropped; restore the store from a backup")
        if self.store.read_only:
            self.notes.append(f"store {where} has no lease table (written before leases existed); the first "
                              "write adds it (opened read-only: nothing was written)")
            return
        self.store.ensure_lease_table(tx)

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def resume(cls, store: HistoryStore | str | os.PathLike[str], *, tasks: Sequence[Any] | None = None,
               sampler_classes: Sequence[type] = (), graph: Any = None,
               graph_path: str | os.PathLike[str] | None = None, run_file: str | os.PathLike[str] | None = None,
               workers: int = 1, **kwargs: Any) -> DurableSampler:
        """Rebuild a sampler from the store alone: look up its class, construct it with the recorded task
        list (or ``tasks``) and configuration, then replay.

        **A store is data, never instructions.** The class the store names is only ever one of envsched's
        registered sampler classes (:data:`SAMPLER_CLASSES`, :func:`register_sampler_class`) or one of
        ``sampler_classes``; any other name is refused with :class:`StoreError` before anything is imported or
        called. Nothing read from the store chooses a file to read or write, an address to call, or a number
        of processes or threads: those come from the caller --

        * ``graph`` / ``graph_path``: an ``EnvSchedSampler``'s graph (the recorded graph file is never opened;
          without either, the graph is rebuilt from the recorded ``GraphConfig``, which is refused for an LLM
          abstraction -- it would send the pool to the recorded endpoint);
        * ``run_file``: where an ``EnvSchedSampler`` appends explanations (the recorded one is never written);
        * ``workers``: processes and threads of a graph rebuild (default 1; the recorded counts are not used).

        Each recorded field left unused this way is named, with what to pass instead, in :attr:`notes` (one
        line each). The graph must match the recorded fingerprint (``StoreMismatchError`` otherwise).
        Samplers whose configuration holds objects JSON cannot record (a client), or arguments that name a
        file, address or process count, must be constructed by the caller and wrapped instead."""
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 1024:
            raise ValueError(f"workers must be an integer in [1, 1024], got {workers!r}")
        store = store if isinstance(store, HistoryStore) else HistoryStore(store)
        header = store.header()
        if header is None:
            raise StoreError(f"store {store.where} holds no history yet: nothing to resume")
        if not header.get("params_rebuildable", False):
            objs = [k for k, v in header["sampler_params"].items() if not _rebuildable(v)]
            raise StoreError(f"store {store.where}: the {str(header['sampler_class'])[:120]} configuration holds "
                             f"objects the store cannot record ({', '.join(objs)[:200]}); construct the sampler "
                             "yourself and wrap it: DurableSampler(sampler, store)")
        obj = _resolve_sampler_class(header["sampler_class"], store.where, sampler_classes)
        if tasks is None:
            tasks = store.tasks()
        if tasks is None:
            raise StoreError(f"store {store.where} does not hold its task list (the tasks were not JSON); "
                             "pass tasks=...")
        params = dict(header["sampler_params"])
        adapter = _RESUME_ADAPTERS.get(header["sampler_class"])
        notes: list[str] = []
        if adapter is None and header["sampler_class"] not in _BUILTIN_CLASSES:
            for name in params:
                if any(w in name.lower() for w in _CALLER_WORDS):
                    raise StoreError(f"store {store.where}: sampler_params.{name[:60]} of "
                                     f"{header['sampler_class']} may name a file, address or process count, which "
                                     "a store never chooses: construct the sampler yourself and wrap it: "
                                     "DurableSampler(sampler, store)")
        caller = {"graph": graph, "graph_path": graph_path, "run_file": run_file, "workers": workers}
        try:
            if adapter is not None:
                sampler, notes = adapter(obj, tasks, params, header, store.where, caller)
            else:
                sampler = obj(tasks, **params)
        except StoreError:
            raise
        except (MemoryError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # whatever the recorded values make the constructor raise: a clear refusal
            raise StoreError(f"store {store.where}: cannot construct {header['sampler_class']} from the recorded "
                             f"configuration ({type(exc).__name__}: {str(exc)[:300]}); construct the sampler "
                             "yourself and wrap it: DurableSampler(sampler, store)") from None
        kwargs.setdefault("group_size", header.get("group_size"))
        out = cls(sampler, store, **kwargs)
        out.notes = notes + out.notes
        return out

    def _check_header(self, header: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
        where = self.store.where
        if header["sampler_class"] != expected["sampler_class"]:
            raise StoreMismatchError(f"store {where} was written by {header['sampler_class']}, not by "
                                     f"{expected['sampler_class']}: open the store the run wrote with that "
                                     "sampler, or use a new store")
        if header["pool_fingerprint"] != expected["pool_fingerprint"]:
            raise StoreMismatchError(
                f"store {where} was written for another pool: fingerprint {header['pool_fingerprint'][:12]}... "
                f"({header['num_tasks']} tasks, reward range {header.get('reward_range')}), this sampler's "
                f"pool is {expected['pool_fingerprint'][:12]}... ({expected['num_tasks']} tasks, reward range "
                f"{expected['reward_range']})")
        if header["num_tasks"] != expected["num_tasks"]:
            raise StoreCorruptError(f"store {where}: its metadata says num_tasks={header['num_tasks']}, but its pool "
                                    f"fingerprint is that of this sampler's {expected['num_tasks']} tasks: the "
                                    "metadata was edited")
        diffs = _differences(header["sampler_params"], expected["sampler_params"])
        if diffs:
            raise StoreMismatchError(f"store {where} was written with another {expected['sampler_class']} "
                                     f"configuration: {'; '.join(diffs)}")
        mine, theirs = expected.get("graph"), header.get("graph")
        if (isinstance(mine, Mapping) and isinstance(theirs, Mapping)
                and mine["fingerprint"] != theirs.get("fingerprint")):
            raise StoreMismatchError(f"store {where} was written with another graph: fingerprint "
                                     f"{str(theirs.get('fingerprint'))[:12]}... ({theirs.get('num_nodes')} nodes), "
                                     f"this sampler's graph has {mine['fingerprint'][:12]}... "
                                     f"({mine['num_nodes']} nodes)")
        if header.get("group_size") != expected["group_size"]:
            raise StoreMismatchError(f"store {where} was written with group_size={header.get('group_size')}, "
                                     f"this DurableSampler has group_size={expected['group_size']}")

    # ------------------------------------------------------------------ replay
    def _rebuild(self, tx: Any, *, latest: bool) -> None:
        snap = self.store.read_snapshot(tx, latest=latest)
        genesis = genesis_digest(self._store_id)
        if snap.seq == 0:
            if snap.digest != genesis:
                raise StoreCorruptError(f"store {self.store.where}: the initial snapshot does not belong to "
                                        "this store (damaged or copied from another store)")
        elif self.store.digest_at(tx, snap.seq) is None:
            last = self.store.last_event(tx)[0]
            raise StoreCorruptError(f"store {self.store.where}: the event log ends at event {last}, but a snapshot "
                                    f"refers to event {snap.seq}: events at the end of the log were removed; "
                                    "restore the store from a backup")
        elif self.store.digest_at(tx, snap.seq) != snap.digest:
            raise StoreCorruptError(f"store {self.store.where}: the snapshot after event {snap.seq} does not "
                                    "match the event log (damaged store)")
        try:
            self.sampler.load_state_dict(snap.state)
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreCorruptError(f"store {self.store.where}: the snapshot after event {snap.seq} cannot be "
                                    f"loaded into {type(self.sampler).__name__}: {exc}") from None
        self._seq, self._digest = snap.seq, snap.digest
        self._replayed = 0
        self._audit = {} if snap.seq == 0 else None  # a full replay checks the lease index against the events
        try:
            self._catch_up(tx)
            self.store.check_head(tx, self._seq, self._digest)
            self.store.check_tail(tx, self._seq)
            if self._audit is not None and self.store.has_lease_table(tx):
                self._check_lease_index(tx, self._audit)
        finally:
            self._audit = None
        self._stale = False

    def _audit_event(self, ev: Event) -> None:
        """Follow the leases the events name (full replay): each is issued once and consumed at most once."""
        audit = self._audit
        if audit is None:
            return
        p = ev.payload
        if ev.kind == "sample":
            for lid, key in zip(p.get("leases") or [], p["keys"], strict=False):
                if lid in audit:
                    raise StoreCorruptError(f"store {self.store.where}: lease {lid} is issued twice (events "
                                            f"{audit[lid][1]} and {ev.seq})")
                audit[lid] = [key, ev.seq, None, None]
            return
        lid = p.get("lease")
        if lid is None:
            return
        row = audit.get(lid)
        if row is None or row[0] != p["key"]:
            raise StoreCorruptError(f"store {self.store.where}: event {ev.seq} ({ev.kind}) names lease {lid}, "
                                    f"which no earlier draw of task {p['key']!r} issued")
        if row[2] is not None:
            raise StoreCorruptError(f"store {self.store.where}: lease {lid} is consumed twice (events {row[2]} "
                                    f"and {ev.seq}): a duplicated {ev.kind}")
        row[2] = ev.seq
        row[3] = "update" if ev.kind == "update" else ("reclaim" if p.get("reclaimed") else "discard")

    def _check_lease_index(self, tx: Any, audit: dict[str, list[Any]]) -> None:
        table = self.store.all_leases(tx)
        if set(table) != set(audit):
            extra = sorted(set(table) - set(audit))[:3]
            missing = sorted(set(audit) - set(table))[:3]
            raise StoreCorruptError(f"store {self.store.where}: the lease table does not match the events "
                                    f"(rows without a draw: {extra}; drawn leases without a row: {missing})")
        for lid, row in audit.items():
            if tuple(row) != table[lid]:
                raise StoreCorruptError(f"store {self.store.where}: lease {lid} is {table[lid]} in the lease "
                                        f"table but {tuple(row)} by the events")

    def _catch_up(self, tx: Any) -> None:
        while True:
            events = self.store.read_events(tx, self._seq, self._digest, limit=_REPLAY_CHUNK)
            for ev in events:
                self._replay(ev)
                self._audit_event(ev)
                self._seq, self._digest = ev.seq, ev.digest
                self._replayed += 1
            if len(events) < _REPLAY_CHUNK:
                return

    def _replay(self, ev: Event) -> None:
        p = ev.payload
        try:
            if ev.kind == "sample":
                got = [task_key(t) for t in self.sampler.sample(p["n"])]
                if got != p["keys"]:
                    raise ReplayDivergenceError(
                        f"store {self.store.where}: replaying event {ev.seq} (sample n={p['n']}) drew "
                        f"{got[:8]} but the log holds {p['keys'][:8]}: {type(self.sampler).__name__} did not "
                        "reproduce its logged draws (non-deterministic sampler, or its code changed)")
            elif ev.kind == "update":
                if self.group_size is not None and len(p["rewards"]) != self.group_size:
                    self._broken = "replay failed"
                    raise StoreCorruptError(f"store {self.store.where}: event {ev.seq} (update) has "
                                            f"{len(p['rewards'])} rewards, but the store records group_size="
                                            f"{self.group_size}: the metadata or the log was edited")
                self.sampler.update(p["key"], p["rewards"], p["costs"])
            else:
                self.sampler.discard(p["key"])
        except ReplayDivergenceError:
            self._broken = "replay diverged"
            raise
        except (KeyError, ValueError, TypeError) as exc:
            self._broken = "replay failed"
            raise ReplayDivergenceError(f"store {self.store.where}: event {ev.seq} ({ev.kind}) cannot be "
                                        f"replayed into {type(self.sampler).__name__}: {exc}") from None

    # ------------------------------------------------------------------ logged calls
    def _run(self, kind: str, apply: Callable[[], Any], payload: Callable[[Any], dict[str, Any]], *,
             pre: Callable[[Any], Any] | None = None, post: Callable[[Any, int], None] | None = None) -> Any:
        return self._run_many([(kind, apply, payload, pre, post)], batch=False)[0]

    def _run_many(self, ops: list[tuple[Any, ...]], *, batch: bool, prefetch: list[str] | None = None) -> list[Any]:
        """Apply and log ``ops`` -- ``(kind, apply, payload, pre, post)`` each -- in one transaction.

        ``pre(tx)`` (optional) runs first and may answer the op without applying it (e.g. an update whose
        lease the store shows as already applied); ``post(tx, seq)`` runs after its event is appended. Bad
        input (``ValueError``/``KeyError``/``TypeError`` from ``pre`` or ``apply``, which change nothing)
        raises at once when ``batch`` is false; in a batch it becomes that op's result and the others go on.
        """
        if self._broken is not None:
            raise StoreError(f"this DurableSampler is unusable ({self._broken}); fix the cause and resume it "
                             "from the store")
        if self.store.read_only:
            raise StoreError(f"store {self.store.where} is opened read-only: this DurableSampler can be read "
                             "(metrics, state_dict), not sample, update or discard")
        results: list[Any] = []
        with self._lock:
            applied = committed = False
            try:
                with self.store.transaction() as tx:
                    if self._stale:
                        self._rebuild(tx, latest=True)
                    else:
                        self._catch_up(tx)
                    seq, digest = self._seq, self._digest
                    rows: list[tuple[int, str, str, str]] = []
                    self._closing = []
                    self._lease_cache = self.store.leases_bulk(tx, prefetch) if prefetch else None
                    for kind, apply, payload, pre, post in ops:
                        try:
                            early = pre(tx) if pre is not None else _GO
                            if early is not _GO:
                                results.append(early)
                                continue
                            result = apply()  # bad input raises ValueError/KeyError/TypeError, no state change
                        except (ValueError, KeyError, TypeError) as exc:
                            if not batch:
                                raise
                            results.append(exc)
                            continue
                        except BaseException:
                            applied = True  # interrupted mid-call (e.g. KeyboardInterrupt): state may be partial
                            raise
                        applied = True
                        seq += 1
                        text, digest = self.store.chain_event(digest, kind, payload(result))
                        rows.append((seq, kind, text, digest))
                        if post is not None:
                            post(tx, seq)
                        if self.snapshot_every is not None and seq % self.snapshot_every == 0:
                            self.store.write_snapshot(tx, seq, digest, self.sampler.state_dict())
                        results.append(result)
                    if rows:  # the events and the leases they consume, in a few statements
                        self.store.append_many(tx, rows)
                    if self._closing:
                        self.store.close_leases(tx, self._closing)
                committed = True
            finally:
                self._lease_cache = None
                self._closing = []
                self._groups = {}
                if applied and not committed:
                    self._stale = True  # the local state is ahead of the store: rebuild before the next call
            self._seq, self._digest = seq, digest
            return results

    def _close(self, lease: str, seq: int, outcome: str) -> None:
        """Consume ``lease`` with event ``seq`` (written with the events at the end of the transaction)."""
        self._closing.append((lease, seq, outcome))
        if self._lease_cache is not None and lease in self._lease_cache:
            key, issued, _, _ = self._lease_cache[lease]
            self._lease_cache[lease] = (key, issued, seq, outcome)  # a second use in this batch sees it consumed

    def _lease_check(self, tx: Any, lease: str, key: str, action: str, group: tuple[Any, Any] | None = None) -> Any:
        """Pre-check of an update/discard naming ``lease``: ``_GO`` while the lease is open; the answer
        ``"already_applied"`` for an update whose lease an update with the same rewards and costs (``group``)
        already consumed (a retry after a lost reply); otherwise an error naming what is wrong --
        :class:`LeaseConflictError` for an update under a used lease with other rewards."""
        if not isinstance(lease, str) or not lease:
            raise UnknownLeaseError(f"lease must be a non-empty string, got {lease!r}")
        row = self._lease_cache.get(lease) if self._lease_cache is not None else self.store.lease(tx, lease)
        if row is None:
            raise UnknownLeaseError(f"unknown lease {lease!r} for task {key!r}: store {self.store.where} never "
                                    "issued it")
        lkey, _, closed, outcome = row
        if lkey != key:
            raise UnknownLeaseError(f"lease {lease} belongs to task {lkey!r}, not {key!r}")
        if outcome is None:
            return _GO
        if outcome == "update" and action == "update":
            self._same_group(tx, lease, key, closed, group)
            return "already_applied"
        if outcome == "reclaim":
            raise LeaseExpiredError(f"the group of task {key!r} (lease {lease}) was reclaimed (event {closed}) "
                                    "after its lease expired without an update; its rewards are refused (the "
                                    "task can be drawn again)")
        what = "reported by an update" if outcome == "update" else "discarded"
        raise LeaseExpiredError(f"the group of task {key!r} (lease {lease}) was already {what} (event {closed}); "
                                f"this {action} is refused")

    def _same_group(self, tx: Any, lease: str, key: str, closed: int | None, group: tuple[Any, Any] | None) -> None:
        """Raise :class:`LeaseConflictError` unless ``group`` (rewards, costs) equals what the update that
        consumed ``lease`` (event ``closed``) recorded."""
        if group is None:
            return
        mine = logged_group(*group)
        if lease in self._groups:
            logged: Any = self._groups[lease]
        else:
            payload = self.store.event_payload(tx, int(closed)) if closed is not None else None
            logged = None if payload is None else (payload.get("rewards"), payload.get("costs"))
        if logged != mine:
            got = "unreadable" if logged is None else f"rewards {str(logged[0])[:120]}, costs {str(logged[1])[:60]}"
            raise LeaseConflictError(f"lease {lease} of task {key!r} was already used by an update (event {closed}) "
                                     f"with {got}; this update has rewards {str(mine[0])[:120]}, costs "
                                     f"{str(mine[1])[:60]}: it is not a retry of that update and is refused (a "
                                     "lease reports one group, once)")

    # ------------------------------------------------------------------ the protocol
    def sample(self, n: int, *, leases: Sequence[str] | None = None) -> list[Any]:
        """Draw ``n`` tasks (see the wrapped sampler) and log the draw before returning it.

        ``leases``: one new lease id per drawn group (a sampler host passes them); they are recorded with the
        draw, so that an update naming one can be matched exactly, and recognised as already applied when it
        is retried, even by a host restarted on this store.
        """
        return self._run_many([self._sample_op(n, None if leases is None else list(leases))], batch=False)[0]

    def _sample_op(self, n: int, leases: list[str] | None) -> tuple[Any, ...]:
        if leases is not None:
            valid_n = isinstance(n, int) and not isinstance(n, bool) and n > 0
            if valid_n and (len(leases) != n or len(set(leases)) != len(leases)
                            or not all(isinstance(x, str) and x for x in leases)):
                raise ValueError(f"leases must be {n!r} distinct non-empty strings, one per drawn group")

        def pre(tx: Any) -> Any:
            if leases is not None:
                taken = self.store._existing_leases(tx, leases)
                if taken:
                    raise UnknownLeaseError(f"lease id {sorted(taken)[0]!r} was already issued in store "
                                            f"{self.store.where}: lease ids are never reused")
            return _GO

        def payload(tasks: list[Any]) -> dict[str, Any]:
            out: dict[str, Any] = {"n": int(n), "keys": [task_key(t) for t in tasks]}
            if leases is not None:
                out["leases"] = leases
            return out

        def post(tx: Any, seq: int) -> None:
            if leases is not None:
                self.store.issue_leases(tx, seq, list(zip(leases, self._last_keys, strict=True)))

        def apply() -> list[Any]:
            tasks = self.sampler.sample(n)
            self._last_keys = [task_key(t) for t in tasks]
            return tasks

        return ("sample", apply, payload, pre, post)

    def _update_op(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None,
                   lease: str | None) -> tuple[Any, ...]:
        if (self.group_size is not None and hasattr(rewards, "__len__") and not isinstance(rewards, str | bytes)
                and len(rewards) != self.group_size):
            key = task if isinstance(task, str) else _safe_key(task)
            raise ValueError(f"rewards for task {key!r} have {len(rewards)} entries, expected group_size="
                             f"{self.group_size} (one reward per rollout, None for an unscored one)")

        def payload(_: Any) -> dict[str, Any]:
            out: dict[str, Any] = {"key": task if isinstance(task, str) else task_key(task),
                                   "rewards": [None if r is None else float(r) for r in rewards],
                                   "costs": None if costs is None else [float(c) for c in costs]}
            if lease is not None:
                out["lease"] = lease
            return out

        def pre(tx: Any) -> Any:
            key = task if isinstance(task, str) else _safe_key(task)
            return self._lease_check(tx, lease, key, "update", (rewards, costs))  # type: ignore[arg-type]

        def post(tx: Any, seq: int) -> None:
            self._close(lease, seq, "update")  # type: ignore[arg-type]
            self._groups[lease] = logged_group(rewards, costs)  # type: ignore[index]

        def apply() -> str:
            self.sampler.update(task, rewards, costs)
            return "applied"

        return ("update", apply, payload, pre if lease is not None else None, post if lease is not None else None)

    def update(self, task: Any, rewards: Sequence[float | None], costs: Sequence[float] | None = None, *,
               lease: str | None = None) -> str:
        """Report one group; returns once the update is committed to the store (acknowledged).

        ``lease``: the lease id the group was drawn under (see :meth:`sample`). With it the update is
        idempotent: a retry of an update that committed (e.g. its reply was lost) returns
        ``"already_applied"`` and changes nothing; an update for a reclaimed or discarded group raises
        :class:`LeaseExpiredError`; a lease the store never issued, or one of another task, raises
        :class:`UnknownLeaseError`. Returns ``"applied"`` otherwise.

        Raises what the wrapped sampler raises for bad input, and ``ValueError`` when ``group_size`` is set
        and ``rewards`` has another length; on error nothing is logged and no state changes.
        """
        return self._run_many([self._update_op(task, rewards, costs, lease)], batch=False)[0]

    def update_many(self, items: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Report several groups in one transaction: ``items`` are ``(task, rewards, costs, lease)`` tuples
        (``costs`` and ``lease`` may be ``None``).

        Returns one result per item, in order: ``"applied"``, ``"already_applied"``, or the exception that
        refused that item (bad input, :class:`LeaseExpiredError`, :class:`UnknownLeaseError`), which changed
        nothing; the other items are applied and committed together.
        """
        leases = [x[3] for x in items if isinstance(x, tuple | list) and len(x) == 4 and isinstance(x[3], str)]
        return self._run_many(self._update_ops(items), batch=True, prefetch=leases)

    def _update_ops(self, items: Sequence[tuple[Any, ...]]) -> list[Any]:
        ops: list[Any] = []
        for item in items:
            try:
                task, rewards, costs, lease = item
                ops.append(self._update_op(task, rewards, costs, lease))
            except (ValueError, TypeError) as exc:
                ops.append(("update", _raiser(exc), None, None, None))
        return ops

    def update_many_and_sample(self, items: Sequence[tuple[Any, ...]], n: int,
                               leases: Sequence[str]) -> tuple[list[Any], Any]:
        """:meth:`update_many` then :meth:`sample` (``n`` groups under ``leases``) in one transaction.
        Returns the update results and the drawn tasks -- or, for a refused draw, the exception (the updates
        are committed all the same)."""
        ops = self._update_ops(items)
        ops.append(self._sample_op(n, list(leases)))
        results = self._run_many(ops, batch=True,
                                 prefetch=[x[3] for x in items if isinstance(x, tuple | list) and len(x) == 4
                                           and isinstance(x[3], str)])
        return results[:-1], results[-1]

    def run_batch(self, requests: Sequence[tuple[Sequence[tuple[Any, ...]], int | None, list[str] | None]]
                  ) -> list[tuple[list[Any], Any]]:
        """Several callers' work in one transaction (a sampler host's group commit): each request is
        ``(update items, n, leases)`` -- updates as :meth:`update_many`, then, when ``n`` is not ``None``, a
        draw of ``n`` groups under ``leases``. Returns ``(update results, drawn tasks or the exception that
        refused the draw, or None)`` per request, in order."""
        ops: list[Any] = []
        spans: list[tuple[int, int, bool]] = []
        prefetch: list[str] = []
        for items, n, leases in requests:
            start = len(ops)
            ops += self._update_ops(items)
            prefetch += [x[3] for x in items if isinstance(x, tuple | list) and len(x) == 4 and isinstance(x[3], str)]
            if n is not None:
                ops.append(self._sample_op(n, leases))
            spans.append((start, len(ops), n is not None))
        results = self._run_many(ops, batch=True, prefetch=prefetch)
        out: list[tuple[list[Any], Any]] = []
        for start, end, drew in spans:
            part = results[start:end]
            out.append((part[:-1], part[-1]) if drew else (part, None))
        return out

    def discard(self, task: Any, *, reason: str | None = None, lease: str | None = None,
                reclaimed: bool = False) -> None:
        """Release one outstanding dispatch of ``task`` without rewards (logged with ``reason``).

        ``lease``: the lease the group was drawn under (consumed; see :meth:`update`). ``reclaimed``: the
        host gives the group back because its lease expired (counted in ``metrics()["reclaimed_groups"]``).
        """
        key = task if isinstance(task, str) else _safe_key(task)

        def payload(_: Any) -> dict[str, Any]:
            out: dict[str, Any] = {"key": task if isinstance(task, str) else task_key(task), "reason": reason}
            if lease is not None:
                out["lease"] = lease
            if reclaimed:
                out["reclaimed"] = True
            return out

        def pre(tx: Any) -> Any:
            return self._lease_check(tx, lease, key, "discard")  # type: ignore[arg-type]

        def post(tx: Any, seq: int) -> None:
            self._close(lease, seq, "reclaim" if reclaimed else "discard")  # type: ignore[arg-type]

        self._run("discard", lambda: self.sampler.discard(task), payload,
                  pre=pre if lease is not None else None, post=post if lease is not None else None)

    def lease_status(self, lease: str) -> str:
        """Where a lease stands in the store: ``"open"``, ``"applied"`` (an update consumed it),
        ``"discarded"``, ``"reclaimed"``, or ``"unknown"`` (never issued here). Answers, for one update,
        whether it committed."""
        with self.store.transaction() as tx:
            row = self.store.lease(tx, lease) if self.store.has_lease_table(tx) else None
        if row is None:
            return "unknown"
        return {None: "open", "update": "applied", "discard": "discarded", "reclaim": "reclaimed"}[row[3]]

    def open_leases(self) -> list[tuple[str, str]]:
        """``(lease, task key)`` of every lease the store shows as issued and not consumed, oldest first."""
        return self._run_read(self.store.open_leases)

    def refresh(self) -> int:
        """Catch up with events other processes appended; returns the number of logged events."""
        self._run_read()
        return self._seq

    def _run_read(self, read: Callable[[Any], Any] | None = None) -> Any:
        """Catch up with the store (rebuild if stale), then ``read(tx)`` in the same transaction."""
        if self._broken is not None:
            raise StoreError(f"this DurableSampler is unusable ({self._broken})")
        with self._lock, self.store.transaction() as tx:
            if self._stale:
                self._rebuild(tx, latest=True)
            else:
                self._catch_up(tx)
            return read(tx) if read is not None else None

    def metrics(self) -> dict[str, float]:
        """The wrapped sampler's metrics after catching up with the store, plus ``store_events`` and, from
        the store's lease table (so they survive restarts), ``reclaimed_groups`` and ``open_leases``."""
        counts = self._run_read(self.store.lease_counts)
        m = dict(self.sampler.metrics())
        m["store_events"] = float(self._seq)
        m["reclaimed_groups"] = float(counts["reclaim"])
        m["open_leases"] = float(counts["open"])
        return m

    def state_dict(self) -> dict[str, Any]:
        """The wrapped sampler's state after catching up, plus ``durable`` = where it stands in the store.
        It loads into a plain sampler of the same configuration as well."""
        self._run_read()
        state = dict(self.sampler.state_dict())
        state["durable"] = {"store_id": self._store_id, "seq": self._seq, "digest": self._digest}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Accept a state this store produced (a no-op: the store holds that history and what followed).

        A DurableSampler's state comes from its store; loading a foreign state would put the sampler out of
        step with its log, so it raises ``ValueError`` (state unchanged). To restart from an older
        checkpoint, start a new store.
        """
        mark = state.get("durable") if isinstance(state, Mapping) else None
        if not isinstance(mark, Mapping) or mark.get("store_id") != self._store_id:
            raise ValueError("cannot load this state into a DurableSampler: it was not produced by this store "
                             f"({self.store.where}); the sampler's state is rebuilt from its store. To restart "
                             "from another state, load it into a fresh sampler and wrap it on a new store")
        seq = mark.get("seq")
        if not isinstance(seq, int) or seq < 0:
            raise ValueError(f"malformed DurableSampler state: seq {seq!r}")
        self._run_read()
        if seq > self._seq:
            raise ValueError(f"state is at event {seq} but store {self.store.where} holds only {self._seq} "
                             "events: the store lost events (restored from an older copy?)")
        digest = mark.get("digest")
        if seq > 0 and isinstance(digest, str):
            with self._lock, self.store.transaction() as tx:
                logged = self.store.digest_at(tx, seq)
            if logged != digest:
                raise StoreCorruptError(f"store {self.store.where}: event {seq} differs from the one this state "
                                        "was taken after (its digest changed): the log was rewritten since "
                                        "the checkpoint; restore the store from a backup")

    # ------------------------------------------------------------------ introspection
    @property
    def seq(self) -> int:
        """Number of logged events this sampler has applied."""
        return self._seq

    @property
    def replayed_events(self) -> int:
        """Events replayed by the last rebuild and the catch-ups since (0 for a fresh store)."""
        return self._replayed

    @property
    def tasks(self) -> list[Any]:
        return self.sampler.tasks

    @property
    def reward_range(self) -> tuple[float, float]:
        return self.sampler.reward_range

    def outstanding(self) -> dict[str, int]:
        """Outstanding dispatches per task key (local view; call :meth:`refresh` first to include others')."""
        return self.sampler.outstanding()

    def get_params(self) -> dict[str, Any]:
        return {"group_size": self.group_size, "snapshot_every": self.snapshot_every}

    def close(self) -> None:
        """Close the store's connection."""
        self.store.close()

    def __repr__(self) -> str:
        return f"DurableSampler({self.sampler!r}, {self.store!r}, events={self._seq})"


def logged_group(rewards: Any, costs: Any) -> tuple[Any, Any]:
    """The logged form of a group's rewards and costs (as an update event records them), for comparing a
    retry with the update that consumed its lease; input that has no such form compares unequal."""
    try:
        r = [None if x is None else float(x) for x in rewards]
        c = None if costs is None else [float(x) for x in costs]
    except (TypeError, ValueError):
        return ("unreadable", repr(rewards)[:60])
    return r, c


def _raiser(exc: BaseException) -> Callable[[], Any]:
    def go() -> Any:
        raise exc

    return go


def _safe_key(task: Any) -> str:
    try:
        return task_key(task)
    except KeyError:
        return repr(task)[:60]
