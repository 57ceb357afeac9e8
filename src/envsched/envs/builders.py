"""The corpus registry: one pool builder per real corpus, and the combined pool of all of them.

================  =========================================  ===========  ===========================
corpus            builder                                    data         episodes
================  =========================================  ===========  ===========================
``bfcl``          :func:`envsched.envs.bfcl.build_bfcl_pool`  bfcl-eval    yes (:class:`BFCLEnvironment`)
``reasoning_gym`` :func:`~envsched.envs.reasoning_gym.build_reasoning_gym_pool`  reasoning-gym  yes
``tau2``          :func:`envsched.envs.tau2.build_tau2_pool`  a folder     no
``acebench``      :func:`envsched.envs.acebench.build_acebench_pool`  a folder  no
================  =========================================  ===========  ===========================

In a combined pool every environment stays apart: env names are prefixed by their corpus
(``bfcl/GorillaFileSystem``, ``reasoning_gym/chain_sum``, ``tau2/retail``, ``acebench/Travel``); task ids
already carry the corpus prefix, and ``index`` is renumbered 0..N-1 over the whole pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envsched.pool.pool import TaskPool

__all__ = ["CORPORA", "CorpusInfo", "available_corpora", "build_combined_pool", "build_corpus", "prefix_envs"]

Progress = Callable[[int, int], None]


def _bfcl(data_dir: Path | None, on_progress: Progress | None, **options: Any) -> list[dict[str, Any]]:
    from envsched.envs.bfcl import build_bfcl_pool
    return build_bfcl_pool(on_progress=on_progress, **options)


def _rg(data_dir: Path | None, on_progress: Progress | None, **options: Any) -> list[dict[str, Any]]:
    from envsched.envs.reasoning_gym import build_reasoning_gym_pool
    return build_reasoning_gym_pool(on_progress=on_progress, **options)


def _tau2(data_dir: Path | None, on_progress: Progress | None, **options: Any) -> list[dict[str, Any]]:
    from envsched.envs.tau2 import build_tau2_pool
    assert data_dir is not None
    return build_tau2_pool(data_dir, on_progress=on_progress, **options)


def _ace(data_dir: Path | None, on_progress: Progress | None, **options: Any) -> list[dict[str, Any]]:
    from envsched.envs.acebench import build_acebench_pool
    assert data_dir is not None
    return build_acebench_pool(data_dir, on_progress=on_progress, **options)


@dataclass(frozen=True)
class CorpusInfo:
    """One corpus: its builder, whether it needs a data folder, its licence and how to get it."""

    name: str
    build: Callable[..., list[dict[str, Any]]]
    needs_data_dir: bool
    licence: str
    source: str
    episodes: bool


CORPORA: dict[str, CorpusInfo] = {
    "bfcl": CorpusInfo("bfcl", _bfcl, False, "Apache-2.0",
                       "pip install --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0", True),
    "reasoning_gym": CorpusInfo("reasoning_gym", _rg, False, "Apache-2.0",
                                "pip install reasoning-gym (a core dependency of envsched)", True),
    "tau2": CorpusInfo("tau2", _tau2, True, "MIT",
                       "a checkout of https://github.com/sierra-research/tau2-bench (--data-dir)", False),
    "acebench": CorpusInfo("acebench", _ace, True, "MIT",
                           "a checkout of https://github.com/ACEBench/ACEBench (--data-dir)", False),
}


def _corpus(name: str) -> CorpusInfo:
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; choose from {', '.join(CORPORA)}")
    return CORPORA[name]


def build_corpus(name: str, *, data_dir: str | Path | None = None, on_progress: Progress | None = None,
                 **options: Any) -> list[dict[str, Any]]:
    """Build one corpus's task specs (env names as the corpus's builder gives them, unprefixed).

    ``options`` go to the corpus's builder (e.g. ``categories=`` for bfcl, ``datasets=``,
    ``tasks_per_dataset=`` for reasoning_gym, ``domains=`` for tau2, ``subsets=`` for acebench).
    """
    info = _corpus(name)
    if info.needs_data_dir and data_dir is None:
        raise ValueError(f"corpus {name!r} reads its task files from a folder: give data_dir ({info.source})")
    if not info.needs_data_dir and data_dir is not None:
        raise ValueError(f"corpus {name!r} takes no data folder (its data comes from: {info.source})")
    return info.build(Path(data_dir) if data_dir is not None else None, on_progress, **options)


def prefix_envs(specs: Iterable[Mapping[str, Any]], corpus: str) -> list[dict[str, Any]]:
    """Copies of ``specs`` with ``env`` prefixed by ``corpus/`` (unless it already is)."""
    out = []
    for s in specs:
        d = dict(s)
        if not str(d["env"]).startswith(f"{corpus}/"):
            d["env"] = f"{corpus}/{d['env']}"
        d.setdefault("corpus", corpus)
        out.append(d)
    return out


def available_corpora(data_dirs: Mapping[str, str | Path] | None = None) -> list[str]:
    """Corpora that can be built here: bfcl if bfcl-eval imports, reasoning_gym, and every folder corpus
    whose folder is given in ``data_dirs``."""
    from envsched.envs.bfcl import bfcl_available
    names = []
    for name, info in CORPORA.items():
        if name == "bfcl" and not bfcl_available():
            continue
        if info.needs_data_dir and not (data_dirs and name in data_dirs):
            continue
        names.append(name)
    return names


def build_combined_pool(corpora: Iterable[str] | None = None, *,
                        data_dirs: Mapping[str, str | Path] | None = None,
                        options: Mapping[str, Mapping[str, Any]] | None = None,
                        name: str = "combined",
                        on_progress: Callable[[str, int, int], None] | None = None) -> TaskPool:
    """All corpora in one :class:`TaskPool`, every environment kept apart (``corpus/env`` names).

    Args:
        corpora: which corpora (default: :func:`available_corpora` for ``data_dirs``). A corpus asked for
            by name that cannot be built raises (``EnvironmentUnavailable`` for bfcl without bfcl-eval,
            ``ValueError`` for a folder corpus without its folder).
        data_dirs: corpus -> folder, for ``tau2`` and ``acebench``.
        options: corpus -> keyword arguments for its builder.
        name: the pool's name.
        on_progress: called as ``on_progress(corpus, done, total)``.
    """
    data_dirs = dict(data_dirs or {})
    options = dict(options or {})
    for key in list(data_dirs) + list(options):
        _corpus(key)
    names = list(corpora) if corpora is not None else available_corpora(data_dirs)
    if not names:
        raise ValueError("no corpus to build")
    for n in names:
        _corpus(n)
        if n in options and not isinstance(options[n], Mapping):
            raise TypeError(f"options[{n!r}] must be a mapping of builder keyword arguments")
    if len(set(names)) != len(names):
        raise ValueError("a corpus is listed twice")
    specs: list[dict[str, Any]] = []
    for n in names:
        def progress(done: int, total: int, _n: str = n) -> None:
            if on_progress is not None:
                on_progress(_n, done, total)
        part = build_corpus(n, data_dir=data_dirs.get(n), on_progress=progress, **dict(options.get(n, {})))
        specs.extend(prefix_envs(part, n))
    for i, s in enumerate(specs):
        s["index"] = i
    return TaskPool(specs, name=name, source=f"<combined: {', '.join(names)}>")
