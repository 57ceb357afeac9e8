"""Saving and loading a built :class:`~envsched.method.graph.DualRelationGraph` (versioned format).

One ``.npz`` file (numpy's zip of arrays, written uncompressed, read with ``allow_pickle=False``): the
neighbour arrays, the two sparse feature matrices, the fitted feature space (vocabularies and IDF, so the
graph can still be extended after loading) and a JSON header with the format name and version, the pool
fingerprint, the configuration and the build report.

Loading checks the format name and version and, when a pool is given, that the file was built from that
very pool (same :meth:`TaskPool.fingerprint`); otherwise it raises :class:`GraphFileError` saying what
differs and how to rebuild. The write is atomic (temporary file renamed into place).

A graph file is untrusted input. Before any array is read the loader checks, from the zip directory and
the ``.npy`` headers alone: that the path is a regular file, the number of members, every member's
decompressed size (:data:`DEFAULT_MAX_BYTES` in all, overridable per call or with the environment variable
``ENVSCHED_GRAPH_MAX_BYTES``) and its compression ratio (:data:`MAX_COMPRESSION_RATIO`: a zip bomb is
refused before it is inflated), and that each member's declared shape and dtype match the header and
the member's size. After reading, the format's own rules are checked (docs/graph.md, docs/limits.md):
no self-loops, within-relation neighbours in the node's environment and cross-relation neighbours outside
it, no repeated neighbour in a row, padding (-1) with weight and similarity 0, row weights summing to 1,
similarities of edges in (0, 1], L2-normalised feature rows, and vocabularies
exactly as long as the feature columns they name.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import struct
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from envsched.errors import EnvSchedError, InvalidValueError
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.graph.features import FeatureSpace
from envsched.pool import TaskPool
from envsched.validation import array_problem, is_int, is_number

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_COMPRESSION_RATIO",
    "GraphFileError",
    "load_graph",
    "max_graph_bytes",
    "read_graph_header",
    "save_graph",
]

FORMAT_NAME = "envsched-dual-relation-graph"
FORMAT_VERSION = 1

_ARRAYS = ("env_codes", "within_index", "within_weight", "within_similarity", "cross_index", "cross_weight",
           "cross_similarity")
_KNOWN = frozenset((*_ARRAYS, "within_bandwidth", "cross_bandwidth", "task_ids", "envs",
                    *(f"{m}/{part}" for m in ("full_features", "abstract_features")
                      for part in ("data", "indices", "indptr", "shape"))))


#: Largest graph a file may declare: nodes, neighbours per node, feature columns, stored feature entries.
#: Declared sizes are checked against these before any array is read (a hostile file cannot make the
#: loader allocate without bound). ``MAX_NEIGHBORS`` equals ``GraphConfig``'s bound on ``k_within`` /
#: ``k_cross``, so every graph this package can build can be read back.
MAX_NODES = 50_000_000
MAX_NEIGHBORS = 1024
MAX_FEATURES = 2**31 - 1
MAX_NNZ = 2**31 - 1
#: Default bound on the decompressed size of all arrays of one graph file: 6 GiB. Loading holds the arrays
#: once plus transient copies (sparse matrices, string lists), about twice this at the peak, which fits a
#: 24 GiB machine beside a training process; the largest measured graph (1,000,000 tasks, docs/graph.md)
#: is about 2.3 GiB. Raise it per call (``load_graph(..., max_bytes=)``) or with ``ENVSCHED_GRAPH_MAX_BYTES``.
DEFAULT_MAX_BYTES = 6 * 2**30
MAX_BYTES = DEFAULT_MAX_BYTES  # the name older callers imported
#: Environment variable that overrides :data:`DEFAULT_MAX_BYTES` (a byte count) when a call gives none.
MAX_BYTES_ENV = "ENVSCHED_GRAPH_MAX_BYTES"
#: A member may decompress to at most this many times its stored size once it is above
#: :data:`RATIO_EXEMPT_BYTES` (the writer stores members uncompressed; real numeric arrays compress
#: less than 10:1, while deflate bombs of zeros reach about 1000:1).
MAX_COMPRESSION_RATIO = 50
RATIO_EXEMPT_BYTES = 1 * 2**20
MAX_HEADER_BYTES = 64 * 2**20
#: At most this many members (arrays) in one file and this large a zip directory (a file of millions of
#: empty members would otherwise cost memory before any check).
MAX_MEMBERS = 4096
MAX_DIRECTORY_BYTES = 16 * 2**20
#: Tolerances of the format rules on float32 values (row weight sums, similarities, feature row norms).
_TOL = 1e-3


class GraphFileError(EnvSchedError, ValueError):
    """A graph file cannot be used: not a graph file, another format version, built from another pool, or
    malformed. ``field`` names the offending array or header entry when there is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def save_graph(graph: DualRelationGraph, path: str | os.PathLike[str]) -> Path:
    """Write ``graph`` to ``path`` (conventionally ``*.graph.npz``) atomically; returns the path."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {name: np.asarray(getattr(graph, name)) for name in _ARRAYS}
    for name in ("within_bandwidth", "cross_bandwidth"):
        value = getattr(graph, name)
        if value is not None:
            arrays[name] = np.asarray(value)
    for name in ("full_features", "abstract_features"):
        mat = sp.csr_matrix(getattr(graph, name))
        arrays[f"{name}/data"] = mat.data
        arrays[f"{name}/indices"] = mat.indices
        arrays[f"{name}/indptr"] = mat.indptr
        arrays[f"{name}/shape"] = np.asarray(mat.shape, dtype=np.int64)
    arrays["task_ids"] = np.asarray(graph.task_ids, dtype=np.str_)
    arrays["envs"] = np.asarray(graph.envs, dtype=np.str_)
    space_meta = None
    if graph.feature_space is not None:
        state = graph.feature_space.to_state()
        space_meta = state["meta"]
        arrays.update(state["arrays"])
    from envsched._version import __version__

    header = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "envsched_version": __version__,
        "pool_fingerprint": graph.pool_fingerprint, "num_nodes": graph.num_nodes,
        "num_envs": len(graph.envs), "config": graph.config, "report": graph.report,
        "feature_space": space_meta,
    }
    arrays["__header__"] = np.frombuffer(json.dumps(header, default=str).encode("utf-8"), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def max_graph_bytes(max_bytes: int | None = None) -> int:
    """The decompressed-size bound in force: ``max_bytes`` if given, else ``ENVSCHED_GRAPH_MAX_BYTES``, else
    :data:`DEFAULT_MAX_BYTES`. A malformed value is a ``ValueError`` naming it."""
    if max_bytes is None:
        raw = os.environ.get(MAX_BYTES_ENV)
        if raw is None or not raw.strip():
            return DEFAULT_MAX_BYTES
        try:
            max_bytes = int(raw.strip().replace("_", ""))
        except ValueError:
            raise ValueError(f"{MAX_BYTES_ENV}={raw[:40]!r} is not a whole number of bytes") from None
    if not is_int(max_bytes) or max_bytes < 1:
        raise InvalidValueError(f"max_bytes must be a positive whole number of bytes, got {max_bytes!r}",
                                name="max_bytes", value=max_bytes)
    return int(max_bytes)


def _zip_directory(fh: Any, size: int, path: Path) -> tuple[int, int]:
    """Number of members and size of the zip directory, read from the end records (zip64 included)
    without reading the directory itself."""
    tail_len = min(size, 22 + 65535)
    fh.seek(size - tail_len)
    tail = fh.read(tail_len)
    pos = tail.rfind(b"PK\x05\x06")
    if pos < 0 or pos + 22 > len(tail):
        raise GraphFileError(f"{path}: not an envsched graph file (not a zip archive)")
    _, _, _, _, entries, dir_size, _, _ = struct.unpack("<4s4H2LH", tail[pos:pos + 22])
    if entries == 0xFFFF or dir_size == 0xFFFFFFFF:
        loc = tail.rfind(b"PK\x06\x07", 0, pos)
        if loc < 0 or loc + 20 > len(tail):
            raise GraphFileError(f"{path}: damaged graph file (zip64 end record missing)")
        _, _, offset, _ = struct.unpack("<4sLQL", tail[loc:loc + 20])
        if offset + 56 > size:
            raise GraphFileError(f"{path}: damaged graph file (zip64 end record out of the file)")
        fh.seek(offset)
        rec = fh.read(56)
        if len(rec) < 56 or rec[:4] != b"PK\x06\x06":
            raise GraphFileError(f"{path}: damaged graph file (bad zip64 end record)")
        entries, dir_size = struct.unpack("<QQ", rec[32:48])
    fh.seek(0)
    return entries, dir_size


@contextlib.contextmanager
def _open(path: Path, max_bytes: int) -> Iterator[Any]:
    """The file as a checked ``NpzFile``: a regular file (no FIFO, device or directory: opened without
    blocking and checked on the open descriptor), a bounded zip directory, every member's decompressed
    size and compression ratio within the limits. Nothing is decompressed here."""
    try:
        mode = os.stat(path).st_mode  # a socket cannot even be opened: say what it is first
        if not stat.S_ISREG(mode):
            if stat.S_ISDIR(mode):
                raise GraphFileError(f"{path}: is a directory, not a graph file")
            raise GraphFileError(f"{path}: not a regular file ({_file_kind(mode)}); a graph file is a .npz file "
                                 "on disk")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"graph file not found: {path}") from None
    except IsADirectoryError:
        raise GraphFileError(f"{path}: is a directory, not a graph file") from None
    except OSError as exc:
        raise GraphFileError(f"{path}: cannot be opened ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise GraphFileError(f"{path}: not a regular file ({_file_kind(st.st_mode)}); a graph file is a "
                                 ".npz file on disk")
        entries, dir_size = _zip_directory(fh, st.st_size, path)
        if entries > MAX_MEMBERS or dir_size > MAX_DIRECTORY_BYTES:
            raise GraphFileError(f"{path}: {entries} zip members / {dir_size} directory bytes, more than a graph "
                                 f"file holds (at most {MAX_MEMBERS} members, {MAX_DIRECTORY_BYTES} bytes)")
        try:
            data = np.load(fh, allow_pickle=False)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
            raise GraphFileError(f"{path}: not an envsched graph file ({exc})") from None
        if not isinstance(data, np.lib.npyio.NpzFile):  # a bare .npy array that happens to hold an end record
            raise GraphFileError(f"{path}: not an envsched graph file (a single array, not an .npz archive)")
        with data:
            if not hasattr(data, "files") or "__header__" not in data.files:
                raise GraphFileError(f"{path}: not an envsched graph file (no header)")
            total = 0
            for info in data.zip.infolist():
                total += info.file_size
                if total > max_bytes:
                    raise _bad(path, info.filename.removesuffix(".npy"),
                               f"the arrays decompress to more than the {max_bytes} byte limit of a graph file "
                               f"(raise it with load_graph(max_bytes=) or {MAX_BYTES_ENV})")
                if (info.file_size > RATIO_EXEMPT_BYTES
                        and info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1)):
                    raise _bad(path, info.filename.removesuffix(".npy"),
                               f"compressed {info.file_size / max(info.compress_size, 1):.0f}:1 "
                               f"({info.compress_size} -> {info.file_size} bytes), more than the "
                               f"{MAX_COMPRESSION_RATIO}:1 a graph file may use (a zip bomb?)")
            yield data


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a plain file"


def _header(data: Any, path: Path) -> dict[str, Any]:
    shape, dtype = _member_header(data, "__header__", path)
    if dtype != np.uint8 or len(shape) != 1 or shape[0] > MAX_HEADER_BYTES:
        raise _bad(path, "__header__", f"must be at most {MAX_HEADER_BYTES} bytes of JSON (uint8), got {dtype} "
                                       f"{shape}")
    try:
        header = json.loads(bytes(data["__header__"]).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise GraphFileError(f"{path}: corrupt graph header ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise _bad(path, "__header__", "the header is not a JSON object")
    if header.get("format") != FORMAT_NAME:
        raise GraphFileError(f"{path}: format {header.get('format')!r}, expected {FORMAT_NAME!r}")
    if header.get("version") != FORMAT_VERSION:
        raise GraphFileError(
            f"{path}: graph format version {header.get('version')!r} (written by envsched "
            f"{header.get('envsched_version', '?')}), this envsched reads version {FORMAT_VERSION}; "
            "rebuild the graph with `envsched pool graph POOL_FILE`")
    return header


def read_graph_header(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> dict[str, Any]:
    """The JSON header of a graph file (format, version, pool fingerprint, config, report), checked.

    ``max_bytes`` bounds the file's decompressed size as in :func:`load_graph`."""
    path = Path(path)
    with _open(path, max_graph_bytes(max_bytes)) as data:
        return _header(data, path)


def load_graph(path: str | os.PathLike[str], pool: TaskPool | None = None, *,
               expected_fingerprint: str | None = None, max_bytes: int | None = None) -> DualRelationGraph:
    """Read a graph written by :func:`save_graph`.

    Args:
        path: the file.
        pool: when given, the graph must have been built from this pool (same fingerprint).
        expected_fingerprint: alternatively, the pool fingerprint the graph must carry.
        max_bytes: bound on the decompressed size of all arrays; ``None``: ``ENVSCHED_GRAPH_MAX_BYTES`` if
            set, else :data:`DEFAULT_MAX_BYTES` (6 GiB). Checked from the zip directory before reading.

    Raises:
        FileNotFoundError: no such file.
        GraphFileError: not a regular file, not a graph file, above a size limit, another format version,
            built from another pool, or breaking one of the format's rules (the message names the field).
    """
    path = Path(path)
    limit = max_graph_bytes(max_bytes)
    with _open(path, limit) as data:
        header = _header(data, path)
        _check_header_fields(header, path)
        declared = _check_declared(data, header, path, limit)
        want = pool.fingerprint() if pool is not None else expected_fingerprint
        if want is not None and header.get("pool_fingerprint") != want:
            size = f" ({len(pool)} tasks)" if pool is not None else ""
            raise GraphFileError(
                f"{path}: built from another pool (fingerprint {str(header.get('pool_fingerprint'))[:12]}..., "
                f"{header.get('num_nodes')} tasks) than the one given (fingerprint {want[:12]}...{size}); "
                "rebuild the graph with `envsched pool graph POOL_FILE`")
        try:
            mats = {}
            for name in ("full_features", "abstract_features"):
                mats[name] = _csr(data, name, header["num_nodes"], path)
            arrays = {name: data[name] for name in _ARRAYS}
            bandwidths = {name: (data[name] if name in data.files else None)
                          for name in ("within_bandwidth", "cross_bandwidth")}
            space = None
            if header.get("feature_space") is not None:
                space = FeatureSpace.from_state(header["feature_space"],
                                                {k: data[k] for k in data.files if k.startswith(("vocab/", "idf/"))})
            task_ids = [str(t) for t in data["task_ids"].tolist()]
            envs = [str(e) for e in data["envs"].tolist()]
        except GraphFileError:
            raise
        except KeyError as exc:
            raise GraphFileError(f"{path}: incomplete graph file (missing {exc})") from None
        except (ValueError, TypeError, OSError, zipfile.BadZipFile, EOFError) as exc:
            raise GraphFileError(f"{path}: damaged graph file ({type(exc).__name__}: {exc})") from None
    _check_values(arrays, bandwidths, mats, task_ids, envs, space, header, declared, path)
    if pool is not None and pool.ids != task_ids:
        raise GraphFileError(f"{path}: task ids differ from the pool's")
    return DualRelationGraph(task_ids=task_ids, envs=envs, **arrays, full_features=mats["full_features"],
                             abstract_features=mats["abstract_features"],
                             pool_fingerprint=str(header.get("pool_fingerprint", "")),
                             config=header.get("config") or {}, report=header.get("report") or {},
                             feature_space=space, **bandwidths)


# ---------------------------------------------------------------------------------------------- validation
def _bad(path: Path, field: str, message: str) -> GraphFileError:
    return GraphFileError(f"{path}: field {field!r}: {message}", field=field)


def _member_header(data: Any, name: str, path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype an array member declares, read from its ``.npy`` header without reading the data;
    the declared size must be exactly what the member holds (its decompressed size in the zip directory),
    so the size checks made on declarations bound what reading allocates."""
    fmt = np.lib.format
    try:
        info = data.zip.getinfo(f"{name}.npy")
        with data.zip.open(info) as fh:
            version = fmt.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _, dtype = fmt.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            offset = fh.tell()
    except KeyError:
        raise _bad(path, name, "missing from the file") from None
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, SyntaxError, TypeError) as exc:
        raise _bad(path, name, f"unreadable array header ({exc})") from None
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _bad(path, name, f"bad declared shape {shape!r}")
    dtype = np.dtype(dtype)
    if dtype.hasobject or dtype.fields is not None:
        raise _bad(path, name, f"dtype {dtype} is not allowed (plain numbers and strings only)")
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if offset + declared != info.file_size:
        raise _bad(path, name, f"declares {shape} {dtype} ({declared} bytes) but holds "
                               f"{info.file_size - offset} bytes of data")
    return shape, dtype


def _check_header_fields(header: Any, path: Path) -> None:
    if not isinstance(header, dict):
        raise _bad(path, "__header__", "the header is not a JSON object")
    n = header.get("num_nodes")
    if not is_int(n) or not 0 <= n <= MAX_NODES:
        raise _bad(path, "num_nodes", f"must be an integer in [0, {MAX_NODES}], got {str(n)[:40]}")
    for key in ("config", "report"):
        if header.get(key) is not None and not isinstance(header[key], dict):
            raise _bad(path, key, f"must be an object, got {type(header[key]).__name__}")
    if not isinstance(header.get("pool_fingerprint", ""), str):
        raise _bad(path, "pool_fingerprint", "must be a string")
    space = header.get("feature_space")
    if space is not None:
        if not isinstance(space, list):
            raise _bad(path, "feature_space", "must be a list of views")
        for i, m in enumerate(space):
            ok = (isinstance(m, dict) and m.get("kind") in ("full", "abstract") and isinstance(m.get("name"), str)
                  and isinstance(m.get("fitted"), bool) and is_number(m.get("weight")) and np.isfinite(m["weight"]))
            if not ok:
                raise _bad(path, "feature_space", f"view {i} is malformed (needs kind full/abstract, a name, a "
                                                  "finite weight and a boolean 'fitted')")


def _check_declared(data: Any, header: dict[str, Any], path: Path,
                    max_bytes: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Every member's declared shape and dtype, checked against the header and the size limits."""
    n = header["num_nodes"]
    unknown = [name for name in data.files if name != "__header__" and name not in _KNOWN
               and not name.startswith(("vocab/", "idf/"))]
    if unknown:
        raise _bad(path, unknown[0], "is not an array of the graph format")
    declared = {name: _member_header(data, name, path) for name in data.files if name != "__header__"}
    total = 0
    for name, (shape, dtype) in declared.items():
        total += int(np.prod(shape, dtype=object)) * dtype.itemsize
        if total > max_bytes:
            raise _bad(path, name, f"declared arrays exceed the {max_bytes} byte limit of a graph file "
                                   f"(raise it with load_graph(max_bytes=) or {MAX_BYTES_ENV})")

    def need(name: str, shape: tuple[int | None, ...], kind: str) -> None:
        if name not in declared:
            raise _bad(path, name, "missing from the file")
        got, dtype = declared[name]
        if len(got) != len(shape) or any(w is not None and g != w for g, w in zip(got, shape, strict=False)):
            want = "(" + ", ".join("K" if w is None else str(w) for w in shape) + ")"
            raise _bad(path, name, f"shape {got}, expected {want}")
        if dtype.kind not in kind:
            expected = {"iu": "an integer", "f": "a float", "U": "a string"}[kind]
            raise _bad(path, name, f"dtype {dtype}, expected {expected} array")

    need("env_codes", (n,), "iu")
    need("task_ids", (n,), "U")
    need("envs", (None,), "U")
    for rel in ("within", "cross"):
        need(f"{rel}_index", (n, None), "iu")
        k = declared[f"{rel}_index"][0][1]
        if k > MAX_NEIGHBORS:
            raise _bad(path, f"{rel}_index", f"{k} neighbours per node, more than the limit {MAX_NEIGHBORS}")
        need(f"{rel}_weight", (n, k), "f")
        need(f"{rel}_similarity", (n, k), "f")
        if f"{rel}_bandwidth" in declared:
            need(f"{rel}_bandwidth", (n,), "f")
    for mat in ("full_features", "abstract_features"):
        need(f"{mat}/shape", (2,), "iu")
        need(f"{mat}/indptr", (n + 1,), "iu")
        need(f"{mat}/indices", (None,), "iu")
        nnz = declared[f"{mat}/indices"][0][0]
        if nnz > MAX_NNZ:
            raise _bad(path, f"{mat}/indices", f"{nnz} stored entries, more than the limit {MAX_NNZ}")
        need(f"{mat}/data", (nnz,), "f")
    fitted = {f"{part}/{m['kind']}/{m['name']}" for m in header.get("feature_space") or [] if m["fitted"]
              for part in ("vocab", "idf")}
    for name in declared:
        if name.startswith(("vocab/", "idf/")):
            if name not in fitted:
                raise _bad(path, name, "belongs to no fitted view of the header's feature_space")
            need(name, (None,), "U" if name.startswith("vocab/") else "f")
    for name in sorted(fitted - set(declared)):
        raise _bad(path, name, "missing from the file (the header's feature_space lists it as fitted)")
    return declared


def _check_values(arrays: dict[str, np.ndarray], bandwidths: dict[str, Any], mats: dict[str, Any],
                  task_ids: list[str], envs: list[str], space: Any, header: dict[str, Any],
                  declared: dict[str, Any], path: Path) -> None:
    """Index ranges, finiteness and consistency of the arrays just read (their shapes were checked)."""
    n = header["num_nodes"]
    if len(set(task_ids)) != n:
        raise _bad(path, "task_ids", "task ids are not unique")
    if header.get("num_envs") is not None and header["num_envs"] != len(envs):
        raise _bad(path, "envs", f"{len(envs)} environments, the header declares {header['num_envs']}")
    codes = arrays["env_codes"]
    if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= len(envs)):
        raise _bad(path, "env_codes", f"environment codes must lie in [0, {len(envs)})")
    for rel in ("within", "cross"):
        idx = arrays[f"{rel}_index"]
        if idx.size and (int(idx.min()) < -1 or int(idx.max()) >= n):
            raise _bad(path, f"{rel}_index", f"neighbour indices must lie in [-1, {n}) (-1 pads a row); got "
                                             f"{int(idx.min())}..{int(idx.max())}")
        if (problem := array_problem(arrays[f"{rel}_weight"], low=0.0)) is not None:
            raise _bad(path, f"{rel}_weight", problem)
        if arrays[f"{rel}_weight"].size and float(arrays[f"{rel}_weight"].max()) > 1.0 + 1e-6:
            raise _bad(path, f"{rel}_weight", "neighbour weights must lie in [0, 1]")
        if (problem := array_problem(arrays[f"{rel}_similarity"])) is not None:
            raise _bad(path, f"{rel}_similarity", problem)
        bandwidth = bandwidths.get(f"{rel}_bandwidth")
        if bandwidth is not None and (problem := array_problem(bandwidth, low=0.0)) is not None:
            raise _bad(path, f"{rel}_bandwidth", problem)
        _check_relation(rel, idx, arrays[f"{rel}_weight"], arrays[f"{rel}_similarity"], codes, path)
    if len(set(envs)) != len(envs):
        raise _bad(path, "envs", "environment names are not unique")
    for mat_name, mat in mats.items():
        if mat.shape[0] != n or not 0 <= mat.shape[1] <= MAX_FEATURES:
            raise _bad(path, f"{mat_name}/shape", f"shape {mat.shape}, expected ({n}, <= {MAX_FEATURES})")
        if (problem := array_problem(mat.data)) is not None:
            raise _bad(path, f"{mat_name}/data", problem)
        _check_rows(mat, mat_name, path)
    if space is not None:
        for kind, views, mat_name in (("full", space.full_views, "full_features"),
                                      ("abstract", space.abstract_views, "abstract_features")):
            columns = 0
            for v in views:
                if v.vocabulary is not None:
                    if len(v.idf) != len(v.vocabulary):
                        raise _bad(path, f"idf/{kind}/{v.name}", "length differs from its vocabulary")
                    if len(set(v.vocabulary)) != len(v.vocabulary):
                        raise _bad(path, f"vocab/{kind}/{v.name}", "holds a term twice")
                    if (problem := array_problem(v.idf)) is not None:
                        raise _bad(path, f"idf/{kind}/{v.name}", problem)
                    columns += len(v.vocabulary)
            if columns != mats[mat_name].shape[1]:
                raise _bad(path, f"{mat_name}/shape", f"{mats[mat_name].shape[1]} feature columns, but the "
                                                      f"{kind} vocabularies name {columns}: each column is one "
                                                      "vocabulary term")


def _check_rows(mat: sp.csr_matrix, name: str, path: Path, block: int = 16_384) -> None:
    """Each row of a feature matrix is L2-normalised (norm 1, or 0 when empty). Walked in blocks of rows, so
    the check costs memory in proportion to a block, not to the matrix. (Rows are not sorted by column in
    files this package writes; scipy sums a repeated column, so repeats are not checked.)"""
    n = mat.shape[0]
    indptr = mat.indptr.astype(np.int64, copy=False)
    for a in range(0, n, block):
        b = min(n, a + block)
        lo, hi = int(indptr[a]), int(indptr[b])
        local = np.repeat(np.arange(b - a, dtype=np.int64), np.diff(indptr[a:b + 1]))
        values = mat.data[lo:hi].astype(np.float64)
        norms = np.sqrt(np.bincount(local, weights=values * values, minlength=b - a))
        off = (norms > _TOL) & (np.abs(norms - 1.0) > _TOL)
        if off.any():
            row = a + int(np.flatnonzero(off)[0])
            raise _bad(path, f"{name}/data", f"feature rows must be L2-normalised (norm 1, or 0 for an empty row); "
                                             f"row {row} has norm {norms[row - a]:.6g}")


def _check_relation(rel: str, idx: np.ndarray, weight: np.ndarray, sim: np.ndarray, codes: np.ndarray,
                    path: Path) -> None:
    """The format's rules for one neighbour relation (docs/graph.md): no node is its own neighbour,
    ``within`` neighbours share the node's environment and ``cross`` neighbours do not, a row names a
    neighbour once, padding (-1) carries weight and similarity 0, an edge's similarity lies in (0, 1]
    (pairs sharing no feature are never edges) and a row's weights sum to 1 (0 for a row without edges)."""
    n = idx.shape[0]
    if idx.size == 0:
        return
    idx = idx.astype(np.int64, copy=False)
    valid = idx >= 0
    rows = np.broadcast_to(np.arange(n)[:, None], idx.shape)
    loops = valid & (idx == rows)
    if loops.any():
        node = int(np.flatnonzero(loops.any(axis=1))[0])
        raise _bad(path, f"{rel}_index", f"node {node} is its own neighbour (self-loops are not edges)")
    same = codes[np.where(valid, idx, 0)] == codes[:, None]
    wrong = valid & (~same if rel == "within" else same)
    if wrong.any():
        node = int(np.flatnonzero(wrong.any(axis=1))[0])
        where = "another environment" if rel == "within" else "its own environment"
        raise _bad(path, f"{rel}_index", f"node {node} has a {rel}-relation neighbour in {where} ('within' "
                                         "edges stay inside an environment, 'cross' edges leave it)")
    ordered = np.sort(np.where(valid, idx, -1), axis=1)
    repeat = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    if repeat.any():
        node = int(np.flatnonzero(repeat.any(axis=1))[0])
        raise _bad(path, f"{rel}_index", f"node {node} names the same neighbour twice")
    if (weight[~valid] != 0).any():
        raise _bad(path, f"{rel}_weight", "padding entries (index -1) must have weight 0")
    if (sim[~valid] != 0).any():
        raise _bad(path, f"{rel}_similarity", "padding entries (index -1) must have similarity 0")
    edge_sim = sim[valid]
    if edge_sim.size and (float(edge_sim.min()) <= 0.0 or float(edge_sim.max()) > 1.0 + _TOL):
        raise _bad(path, f"{rel}_similarity", "an edge's similarity must lie in (0, 1] (pairs sharing no "
                                              f"feature are never edges); got {float(edge_sim.min())!r}.."
                                              f"{float(edge_sim.max())!r}")
    totals = weight.astype(np.float64).sum(axis=1)
    has = valid.any(axis=1)
    off = has & (np.abs(totals - 1.0) > _TOL)
    if off.any():
        node = int(np.flatnonzero(off)[0])
        raise _bad(path, f"{rel}_weight", f"node {node}'s weights sum to {totals[node]:.6g}; a row's weights "
                                          "sum to 1 over its neighbours")


def _csr(data: Any, name: str, n: int, path: Path) -> sp.csr_matrix:
    """A sparse feature matrix, its raw arrays checked (monotone ``indptr``, column indices in range)
    before scipy sees them: scipy trusts them and can crash on out-of-range indices."""
    shape = data[f"{name}/shape"]
    rows, cols = int(shape[0]), int(shape[1])
    if rows != n or not 0 <= cols <= MAX_FEATURES:
        raise _bad(path, f"{name}/shape", f"shape ({rows}, {cols}), expected ({n}, <= {MAX_FEATURES})")
    indptr, indices, values = data[f"{name}/indptr"], data[f"{name}/indices"], data[f"{name}/data"]
    if indptr[0] != 0 or indptr[-1] != len(indices) or (np.diff(indptr.astype(np.int64)) < 0).any():
        raise _bad(path, f"{name}/indptr", f"must rise from 0 to {len(indices)} without decreasing")
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= cols):
        raise _bad(path, f"{name}/indices", f"column indices must lie in [0, {cols}); got "
                                          f"{int(indices.min())}..{int(indices.max())}")
    if (problem := array_problem(values)) is not None:
        raise _bad(path, f"{name}/data", problem)
    return sp.csr_matrix((values, indices, indptr), shape=(rows, cols))
