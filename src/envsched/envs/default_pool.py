"""The bundled pool: the paper's size (2,550 tasks over 51 environments), built from real task data.

It lives in ``envs/`` (above ``pool/``) because it assembles a :class:`~envsched.pool.TaskPool` from the
environment builders; ``pool/`` is the lowest layer and imports nothing from ``envs/``.

:func:`benchmark_pool` builds it from what the installed dependencies ship, with no network and no files
of the repository:

- **with bfcl-eval** (``pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0``): BFCL's 800
  multi-turn tasks in its 8 environments (``bfcl/<Class>``, see :mod:`envsched.envs.bfcl`) plus the 43
  reasoning-gym datasets of :data:`~envsched.envs.reasoning_gym.BENCHMARK_DATASETS`
  (``reasoning_gym/<dataset>``) sharing the remaining ``2,550 - 800 = 1,750`` tasks as evenly as possible:
  in alphabetical order the first ``1,750 mod 43 = 30`` datasets get 41 tasks and the other 13 get 40.
  51 environments, 2,550 tasks.
- **without bfcl-eval**: a warning, and the 51 reasoning-gym datasets of
  :data:`~envsched.envs.reasoning_gym.DEFAULT_DATASETS` with 50 tasks each (2,550 tasks, 51
  environments), so that ``envsched run`` still works offline.

:func:`default_pool` is that same pool, built on first use and cached as JSONL under
``$ENVSCHED_CACHE_DIR`` (default ``~/.cache/envsched``) in ``pools/``, keyed by this module's format
version, envsched's version and the versions of reasoning-gym and bfcl-eval: a new version of any of them
builds a new file. The file is written atomically (temporary file renamed into place).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envsched.pool.pool import TaskPool
from envsched.pool.spec import TaskSpecError

__all__ = [
    "BENCHMARK_ENVIRONMENTS",
    "BENCHMARK_TASKS",
    "POOL_FORMAT_VERSION",
    "benchmark_pool",
    "benchmark_rg_counts",
    "cache_dir",
    "default_pool",
    "default_pool_path",
]

#: Bump when the content of the default pool changes for the same package versions.
POOL_FORMAT_VERSION = 2
#: The paper's pool size (EnvSched section 3.1).
BENCHMARK_TASKS = 2550
BENCHMARK_ENVIRONMENTS = 51


def cache_dir() -> Path:
    """``$ENVSCHED_CACHE_DIR`` or ``~/.cache/envsched``."""
    env = os.environ.get("ENVSCHED_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "envsched"


def benchmark_rg_counts(n_bfcl: int, datasets: tuple[str, ...] | list[str],
                        total: int = BENCHMARK_TASKS) -> dict[str, int]:
    """Tasks per reasoning-gym dataset so that BFCL's ``n_bfcl`` tasks plus these make ``total``.

    The remainder is spread as evenly as possible; in the order given (alphabetical for the built-in
    lists) the first ``remainder mod len(datasets)`` datasets get one task more.
    """
    rest = total - n_bfcl
    if not datasets:
        raise ValueError("no reasoning-gym dataset given")
    if rest < len(datasets):
        raise ValueError(f"{n_bfcl} BFCL tasks leave {rest} of {total} for {len(datasets)} datasets")
    base, extra = divmod(rest, len(datasets))
    return {d: base + (1 if i < extra else 0) for i, d in enumerate(datasets)}


def benchmark_pool(*, seed: int = 0, require_bfcl: bool = False,
                   on_progress: Callable[[str, int, int], None] | None = None) -> TaskPool:
    """The paper-size pool (2,550 tasks, 51 environments): BFCL multi-turn + 43 reasoning-gym datasets.

    Without bfcl-eval it warns and returns 51 reasoning-gym datasets x 50 tasks instead, unless
    ``require_bfcl`` (then :class:`~envsched.envs.base.EnvironmentUnavailable` is raised). ``seed`` seeds
    the reasoning-gym items. ``on_progress(corpus, done, total)`` reports progress.
    """
    from envsched.envs.bfcl import BFCL_INSTALL, bfcl_available
    from envsched.envs.builders import build_combined_pool
    from envsched.envs.reasoning_gym import BENCHMARK_DATASETS, DEFAULT_DATASETS

    if bfcl_available():
        from envsched.envs.bfcl import build_bfcl_pool
        n_bfcl = len(build_bfcl_pool())
        counts = benchmark_rg_counts(n_bfcl, sorted(BENCHMARK_DATASETS))
        return build_combined_pool(
            ["bfcl", "reasoning_gym"], name="benchmark", on_progress=on_progress,
            options={"reasoning_gym": {"datasets": sorted(BENCHMARK_DATASETS), "tasks_per_dataset": counts,
                                       "seed": seed}})
    if require_bfcl:
        from envsched.envs.base import EnvironmentUnavailable
        raise EnvironmentUnavailable(f"the benchmark pool needs bfcl-eval, which is not installed: {BFCL_INSTALL}")
    warnings.warn(
        "bfcl-eval is not installed, so the bundled pool is reasoning-gym only (51 datasets x 50 tasks = "
        f"2,550 tasks) instead of BFCL multi-turn's 8 environments + 43 reasoning-gym datasets. For the "
        f"paper's pool install BFCL's data and classes without its ML dependencies: {BFCL_INSTALL}",
        RuntimeWarning, stacklevel=2)
    counts = benchmark_rg_counts(0, sorted(DEFAULT_DATASETS))
    return build_combined_pool(
        ["reasoning_gym"], name="benchmark-reasoning-gym-only", on_progress=on_progress,
        options={"reasoning_gym": {"datasets": sorted(DEFAULT_DATASETS), "tasks_per_dataset": counts,
                                   "seed": seed}})


def _cache_key(seed: int) -> dict[str, Any]:
    from envsched._version import __version__
    from envsched.envs.bfcl import _bfcl, bfcl_available
    from envsched.envs.reasoning_gym import rg_version

    return {
        "format": POOL_FORMAT_VERSION,
        "envsched": __version__,
        "reasoning_gym": rg_version(),
        "bfcl_eval": _bfcl().version if bfcl_available() else None,
        "seed": seed,
    }


def default_pool_path(*, seed: int = 0, cache: str | os.PathLike[str] | None = None) -> Path:
    """Where :func:`default_pool` caches the pool for the installed package versions."""
    key = _cache_key(seed)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    kind = "bfcl+rg" if key["bfcl_eval"] else "rg-only"
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    return root / "pools" / f"default-{kind}-{digest}.jsonl"


def default_pool(*, seed: int = 0, cache: str | os.PathLike[str] | None = None, rebuild: bool = False,
                 on_progress: Callable[[str, int, int], None] | None = None) -> TaskPool:
    """The bundled pool (:func:`benchmark_pool`), built on first use and then read from the cache.

    A cache file that cannot be read (corrupt, truncated) is rebuilt with a warning. ``rebuild=True``
    rebuilds unconditionally. ``cache`` overrides the cache folder.
    """
    path = default_pool_path(seed=seed, cache=cache)
    if path.exists() and not rebuild:
        try:
            pool = TaskPool.from_file(path)
            pool.name = "default"
            return pool
        except (TaskSpecError, OSError, ValueError) as exc:
            warnings.warn(f"the cached default pool {path} is unreadable ({exc}); rebuilding it",
                          RuntimeWarning, stacklevel=2)
    pool = benchmark_pool(seed=seed, on_progress=on_progress)
    pool.to_jsonl(path)
    pool.name = "default"
    return pool
