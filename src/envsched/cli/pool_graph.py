"""``envsched pool graph FILE``: build, save and summarise the dual-relation graph of a pool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envsched.cli.common import MAX_EXACT_NODES, MAX_NEIGHBOURS, MAX_TOP, int_range, load_pool, require_extra, shown

__all__ = ["graph", "graph_summary", "task_neighbours"]


def _stats(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"count": 0}
    q = np.quantile(values, [0.0, 0.25, 0.5, 0.75, 1.0])
    return {"count": int(values.size), "mean": round(float(values.mean()), 4), "min": round(float(q[0]), 4),
            "p25": round(float(q[1]), 4), "median": round(float(q[2]), 4), "p75": round(float(q[3]), 4),
            "max": round(float(q[4]), 4)}


def graph_summary(g: Any) -> dict[str, Any]:
    """Neighbour-weight and similarity statistics, per-environment degree and the build report."""
    out: dict[str, Any] = {"nodes": g.num_nodes, "environments": len(g.envs),
                           "pool_fingerprint": g.pool_fingerprint, "relations": {}, "per_environment": []}
    for rel in ("within", "cross"):
        idx = getattr(g, f"{rel}_index")
        valid = idx >= 0
        deg = valid.sum(axis=1)
        out["relations"][rel] = {
            "k": int(idx.shape[1]), "weight": _stats(getattr(g, f"{rel}_weight")[valid]),
            "similarity": _stats(getattr(g, f"{rel}_similarity")[valid]), "degree": _stats(deg.astype(float)),
            "isolated": int((deg == 0).sum()),
        }
    codes = np.asarray(g.env_codes)
    w_deg = (g.within_index >= 0).sum(axis=1)
    c_deg = (g.cross_index >= 0).sum(axis=1)
    for e, name in enumerate(g.envs):
        rows = np.flatnonzero(codes == e)
        nb = g.cross_index[rows]
        nb = nb[nb >= 0]
        out["per_environment"].append({
            "env": name, "tasks": len(rows),
            "within_degree": round(float(w_deg[rows].mean()), 3) if len(rows) else 0.0,
            "cross_degree": round(float(c_deg[rows].mean()), 3) if len(rows) else 0.0,
            "cross_neighbour_envs": len(np.unique(codes[nb])) if len(nb) else 0,
        })
    report = g.report
    out["build"] = {
        "timings_s": report.get("timings_s"), "cross_method": (report.get("cross") or {}).get("method"),
        "cross_recall_at_k": (report.get("cross") or {}).get("recall_at_k"),
        "missing_fields": (report.get("features") or {}).get("missing"),
        "missing_examples": (report.get("features") or {}).get("missing_examples"),
        "feature_dims": {"full": int(g.full_features.shape[1]), "abstract": int(g.abstract_features.shape[1])},
        "sparse_feature_bytes": int(sum(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes
                                        for m in (g.full_features, g.abstract_features))),
    }
    return out


def task_neighbours(g: Any, task_id: str, top: int = 5) -> dict[str, Any]:
    """One task's neighbours of each relation with similarity, weight and the shared features behind them."""
    try:
        node = g.task_ids.index(task_id)
    except ValueError:
        raise KeyError(f"unknown task id {task_id!r} (not in this graph of {g.num_nodes} tasks)") from None
    out: dict[str, Any] = {"task": task_id, "env": g.envs[int(g.env_codes[node])]}
    for rel in ("within", "cross"):
        rows = []
        idx = getattr(g, f"{rel}_index")[node]
        for slot, j in enumerate(idx):
            if j < 0:
                continue
            rows.append({
                "task": g.task_ids[j], "env": g.envs[int(g.env_codes[j])],
                "similarity": round(float(getattr(g, f"{rel}_similarity")[node, slot]), 4),
                "weight": round(float(getattr(g, f"{rel}_weight")[node, slot]), 4),
                "shared_features": [{"feature": f, "contribution": round(v, 4)}
                                    for f, v in g.shared_features(node, int(j), rel, top=top)],
            })
        out[rel] = rows
    return out


def default_graph_path(file: Path, pool: Any) -> Path:
    """Where ``pool graph`` saves a pool's graph unless told: the cache (``$ENVSCHED_CACHE_DIR`` or
    ``~/.cache/envsched``) under ``graphs/``, named by the file and the pool's fingerprint, so that a source
    tree or a read-only data folder is never written to and an edited pool gets a new file."""
    from envsched.envs.default_pool import cache_dir

    return cache_dir() / "graphs" / f"{file.name.split('.')[0]}-{pool.fingerprint()[:16]}.graph.npz"


@click.command("graph")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to save the graph (default: the cache, $ENVSCHED_CACHE_DIR/graphs/NAME-FINGERPRINT"
                   ".graph.npz, so that nothing is written next to FILE).")
@click.option("--no-save", is_flag=True, help="Build and summarise without saving.")
@click.option("--reuse", is_flag=True,
              help="Load the saved graph instead of building when it was built from this very pool.")
@click.option("--task", "task_id", default=None, help="Show this task's neighbours and what they share.")
@click.option("--top", default=5, show_default=True, type=int_range(1, MAX_TOP),
              help="Shared features shown per neighbour.")
@click.option("--k-within", type=int_range(1, MAX_NEIGHBOURS), default=6, show_default=True,
              help="K_within: same-environment neighbours.")
@click.option("--k-cross", type=int_range(1, MAX_NEIGHBOURS), default=12, show_default=True,
              help="K_cross: other-environment neighbours.")
@click.option("--exact-max-nodes", type=int_range(1, MAX_EXACT_NODES), default=None,
              help="Largest pool searched exactly (default 20000); above it, approximate search.")
@click.option("--llm-endpoint", default=None, help="OpenAI-compatible endpoint for the LLM abstraction.")
@click.option("--model", "llm_model", default=None, help="Model name for --llm-endpoint.")
@click.option("--llm-cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Cache of LLM abstractions (default ~/.cache/envsched/abstractions).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def graph(file: Path, output: Path | None, no_save: bool, reuse: bool, task_id: str | None, top: int,
          k_within: int, k_cross: int, exact_max_nodes: int | None, llm_endpoint: str | None,
          llm_model: str | None, llm_cache_dir: Path | None, as_json: bool) -> None:
    """Build the dual-relation graph of a pool FILE, save it and summarise it.

    Each task gets its K_within nearest tasks of its own environment (concrete features, S_full) and
    its K_cross nearest tasks of other environments (abstract structure, S_abs), weighted with adaptive
    bandwidths. The summary gives neighbour-weight statistics, per-environment degree, missing static
    fields and, with --task ID, that task's neighbours and the shared features that made them neighbours.
    """
    from envsched.method.config import GraphConfig
    from envsched.method.graph.build import build_graph
    from envsched.method.graph.io import GraphFileError, load_graph, save_graph

    console = Console(stderr=True)
    if (llm_endpoint is None) != (llm_model is None):
        raise click.UsageError("--llm-endpoint and --model go together")
    task_pool = load_pool(file)
    output = output or default_graph_path(file, task_pool)
    kwargs: dict[str, Any] = {"k_within": k_within, "k_cross": k_cross}
    if exact_max_nodes is not None:
        kwargs["exact_max_nodes"] = exact_max_nodes
    if llm_endpoint is not None:
        kwargs.update(abstraction="llm", llm_endpoint=llm_endpoint, llm_model=llm_model,
                      llm_cache_dir=str(llm_cache_dir) if llm_cache_dir else None)
    try:
        config = GraphConfig(**kwargs)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if llm_endpoint is not None:
        require_extra("graph", "--llm-endpoint (validating LLM abstractions)")
    if len(task_pool) > config.exact_max_nodes and config.ann_backend == "hnswlib":
        require_extra("graph", f"a pool of {len(task_pool):,} tasks (approximate neighbours above "
                               f"{config.exact_max_nodes:,})")
    g = None
    if reuse and output.exists():
        try:
            g = load_graph(output, task_pool)
            if {k: v for k, v in g.config.items() if k in ("k_within", "k_cross", "abstraction")} != \
                    {k: getattr(config, k) for k in ("k_within", "k_cross", "abstraction")}:
                g = None
            else:
                console.print(shown(f"reusing {output}"))
        except (GraphFileError, ValueError) as exc:  # ValueError: a malformed ENVSCHED_GRAPH_MAX_BYTES
            console.print(f"[yellow]{shown(f'not reusing {output}: {exc}')}[/yellow]")
    if g is None:
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console, transient=True, disable=False) as bar:
            tasks: dict[str, Any] = {}

            def progress(stage: str, advance: int, total: int) -> None:
                if stage not in tasks:
                    tasks[stage] = bar.add_task(stage, total=total or None)
                if advance:
                    bar.update(tasks[stage], advance=advance)

            try:
                g = build_graph(task_pool, config, progress=progress)
            except Exception as exc:  # LLM failures and bad configurations: a clean message, exit 1
                from envsched.method.graph.llm_abstraction import LLMAbstractionError

                if isinstance(exc, LLMAbstractionError | ValueError):
                    raise click.ClickException(str(exc)) from None
                raise
        if not no_save:
            output.parent.mkdir(parents=True, exist_ok=True)
            save_graph(g, output)
    summary = graph_summary(g)
    summary["saved_to"] = None if no_save else str(output)
    if task_id is not None:
        try:
            summary["task_neighbours"] = task_neighbours(g, task_id, top=top)
        except KeyError as exc:
            raise click.ClickException(str(exc.args[0])) from None
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    _print(Console(), summary)


def _print(console: Console, s: dict[str, Any]) -> None:
    b = s["build"]
    console.print(f"[bold]dual-relation graph[/bold]: {s['nodes']} tasks, {s['environments']} environments; "
                  f"cross search {b['cross_method']}"
                  + (f", recall@K {b['cross_recall_at_k']['tie_aware']:.3f}" if b.get("cross_recall_at_k") else ""))
    if b.get("timings_s"):
        console.print("build seconds: " + ", ".join(f"{k} {v}" for k, v in b["timings_s"].items()))
    console.print(f"features: {b['feature_dims']['full']} concrete, {b['feature_dims']['abstract']} abstract "
                  f"columns; sparse size {b['sparse_feature_bytes'] / 2**20:.2f} MiB")
    if s.get("saved_to"):
        console.print(shown(f"saved to {s['saved_to']}"))
    t = Table(title="neighbours per relation")
    for col in ("relation", "K", "mean degree", "isolated", "weight mean", "weight median", "weight max",
                "similarity mean", "similarity min"):
        t.add_column(col, justify="right" if col != "relation" else "left")
    for rel, r in s["relations"].items():
        w, sim = r["weight"], r["similarity"]
        t.add_row(rel, str(r["k"]), f"{r['degree'].get('mean', 0):.2f}", str(r["isolated"]),
                  str(w.get("mean", "-")), str(w.get("median", "-")), str(w.get("max", "-")),
                  str(sim.get("mean", "-")), str(sim.get("min", "-")))
    console.print(t)
    envs = s["per_environment"]
    t = Table(title=f"degree per environment ({len(envs)}{', first 30' if len(envs) > 30 else ''})")
    for col in ("environment", "tasks", "within degree", "cross degree", "cross-neighbour envs"):
        t.add_column(col, justify="right" if col != "environment" else "left")
    for e in envs[:30]:
        t.add_row(shown(e["env"]), str(e["tasks"]), f"{e['within_degree']:.2f}", f"{e['cross_degree']:.2f}",
                  str(e["cross_neighbour_envs"]))
    console.print(t)
    missing = {k: v for k, v in (b.get("missing_fields") or {}).items() if v}
    if missing:
        console.print("tasks missing a view (it contributes nothing for them): "
                      + ", ".join(f"{k} {v}" for k, v in missing.items()))
    tn = s.get("task_neighbours")
    if tn:
        for rel in ("within", "cross"):
            t = Table(title=shown(f"{rel} neighbours of {tn['task']} ({tn['env']})"))
            for col in ("task", "env", "similarity", "weight", "shared features"):
                t.add_column(col)
            for r in tn[rel]:
                t.add_row(shown(r["task"]), shown(r["env"]), f"{r['similarity']:.3f}", f"{r['weight']:.3f}",
                          shown(", ".join(f["feature"] for f in r["shared_features"])))
            console.print(t)
