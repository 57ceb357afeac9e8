"""``envsched explain RUN_FILE``: why EnvSched selected each task (the paper's case studies F.1-F.3)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from envsched.cli.common import MAX_EXPLAIN_STEP, int_range, visible
from envsched.method.explain import read_run_file
from envsched.validation import is_int

#: the console width from which the selections are shown as one table (narrower: vertical records)
WIDE = 140


def _t(text: str, style: str = "") -> Text:
    """Text for the terminal as it is: run-file values are never read as rich markup, and control characters
    (terminal escape sequences) are shown escaped (:func:`~envsched.cli.common.visible`)."""
    return Text(visible(text), style=style)


def _num(x: Any, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _est(rec: dict[str, Any], relation: str) -> str:
    rel = (rec.get("relations") or {}).get(relation)
    if not rel:
        return "-"
    v = rel["estimate"]["variance"]
    tag = "" if rel["has_observed_neighbors"] else " (ref)"
    return f"{_num(v)}{tag}" + ("" if rel["used"] else " off")


def _relaxed_caps(rec: dict[str, Any]) -> dict[str, str]:
    """Cap name -> how a fill pick relaxed it (``"cold_start_max_per_env->3"`` relaxes that cap to 3)."""
    out = {}
    for item in rec.get("relaxed") or []:
        name, arrow, to = str(item).partition("->")
        out[name] = f"relaxed to {to}" if arrow else "relaxed"
    return out


def _caps(rec: dict[str, Any]) -> str:
    """The caps the pick reached; a cap the pick relaxed to fill the batch is shown as relaxed (its count may
    then exceed its limit without the cap being broken)."""
    relaxed = _relaxed_caps(rec)
    parts = []
    for name, c in rec.get("caps", {}).items():
        if name in relaxed:
            parts.append(f"{name} {relaxed[name]} ({c['count']}/{c['limit']})")
        elif c.get("reached"):
            parts.append(f"{name}={c['count']}/{c['limit']}")
    parts += [f"{name} {how}" for name, how in relaxed.items() if name not in rec.get("caps", {})]
    return ", ".join(parts) if parts else "-"


def _one_based(rec: dict[str, Any], run_file: Path) -> dict[str, Any]:
    """A record with its step counted from 1, as ``envsched run`` counts (run files store 0-based steps);
    ``ValueError`` when its step is not a step number."""
    step = rec.get("step")
    if not is_int(step, numpy=False) or not 0 <= step < MAX_EXPLAIN_STEP:
        raise ValueError(f"{run_file}: a pick record of task {_short(rec.get('task_id'))} has the step "
                         f"{_short(step)}, expected a step number (counted from 0)")
    return {**rec, "step": step + 1}


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _render_all(run_file: Path, records: list[dict[str, Any]], render: Callable[[dict[str, Any]], list[Any]]
                ) -> list[Any]:
    """Every record rendered before anything is printed: a record whose fields are missing or of the wrong type
    (run files are data) is one clear error naming it, never a traceback nor half a table."""
    out: list[Any] = []
    for rec in records:
        try:
            out.extend(render(rec))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            why = f"field {exc.args[0]!r} is missing" if isinstance(exc, KeyError) and exc.args else \
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            raise click.ClickException(f"{run_file}: the record of task {_short(rec.get('task_id'))} at step "
                                       f"{rec.get('step')} is malformed ({_short(why, 160)[1:-1]})") from None
    return out


def _detail(rec: dict[str, Any], width: int) -> list[Any]:
    """What ``--task`` prints for one record (lines and tables), built before anything is printed."""
    out: list[Any] = []
    rest = f" ({rec['env']}) at step {rec['step']}: {rec['phase']} pick, batch rank {rec['rank']}, score " \
        f"{_num(rec['score'])}"
    out.append(Text.assemble((visible(rec["task_id"]), "bold"), visible(rest)))
    pred = rec.get("predicted")
    if pred:
        ref = rec["global_reference"]
        own = rec["own_history"]
        out.append(_t(f"  q = {_num(rec['q'])}, informativeness {_num(rec['informativeness'])}; predicted mean "
                      f"{_num(pred['mean'], 3)}, dispersion {_num(pred['dispersion'], 3)}, variance "
                      f"{_num(pred['variance'])} (reconstructed {_num(pred['variance_reconstructed'])})"))
        out.append(_t(f"  global reference: mean {_num(ref['mean'], 3)}, variance {_num(ref['variance'])}; own "
                      f"history: {own['groups']} groups (weight {_num(own['weight'], 2)})"))
        out.append(_t(f"  decline {_num(rec['decline'])}; long/short half-life scores "
                      f"{_num(rec['half_lives']['long']['score'])} / {_num(rec['half_lives']['short']['score'])}"))
        for relation in ("within", "cross"):
            rel = rec["relations"][relation]
            title = f"{relation}-environment estimate {_est(rec, relation)}"
            if width < WIDE:  # one record per neighbour: no cell cut to an ellipsis
                out.append(_t(f"  {title}:"))
                for nb in rel["neighbors"]:
                    out.append(_t(f"    {nb['id']} ({nb['env']})"))
                    out.append(_t(f"      weight {_num(nb['weight'], 3)}, similarity {_num(nb['similarity'], 3)}, "
                                  f"groups {nb['groups']}, mean {_num(nb['mean'], 3)}, variance "
                                  f"{_num(nb['variance'])}"))
                continue
            t = Table(title=_t(title), title_justify="left")
            for col in ("neighbour", "env", "weight", "similarity", "groups", "mean", "variance"):
                t.add_column(col, justify="left" if col in ("neighbour", "env") else "right", overflow="fold")
            for nb in rel["neighbors"]:
                t.add_row(*(_t(str(x)) for x in (nb["id"], nb["env"], _num(nb["weight"], 3),
                                                   _num(nb["similarity"], 3), nb["groups"], _num(nb["mean"], 3),
                                                   _num(nb["variance"]))))
            out.append(t)
    elif rec.get("novelty") is not None:
        out.append(_t(f"  cold start (no history): novelty {_num(rec['novelty'])}"))
    out.append(_t(f"  similarity to the batch {_num(rec['similarity']['max_similarity'], 3)}; exposure "
                  f"{_num(rec['exposure']['exposure'], 2)} (discount {_num(rec['exposure']['discount'], 3)})"))
    cov = rec["coverage"]
    out.append(_t(f"  environment: {cov['env_selections_before']} earlier selections, {cov['env_batch_count']} in "
                  f"this batch; task: {cov['task_observations_before']} earlier observations"))
    relaxed = _relaxed_caps(rec)
    for name, c in rec["caps"].items():
        state = f" {relaxed[name]} to fill the batch" if name in relaxed else (" reached" if c["reached"] else "")
        out.append(_t(f"  cap {name} ({c['paper']}): {c['count']}/{c['limit']}{state}"))
    prog = rec["filters"]["progress"]
    ident = rec["filters"]["identifier"]
    out.append(_t(f"  progress filter: {prog['transitions']} scorable transitions, residual {_num(prog['residual'])}"
                  f"{' (filtered)' if prog['filtered'] else ''}; identifier filter: "
                  f"{'flagged: ' + ident['reason'] if ident['flagged'] else 'not flagged'}"))
    if rec.get("relaxed"):
        out.append(_t(f"  relaxed to fill the batch: {', '.join(rec['relaxed'])}"))
    return out


@click.command("explain")
@click.argument("run_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--step", type=int_range(1, MAX_EXPLAIN_STEP), default=None,
              help="Only this step (counted from 1, as `envsched run` prints them).")
@click.option("--task", "task_id", default=None, help="Only this task id (a detailed view per step).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the records as a JSON list (steps counted from 1, like the table).")
def explain(run_file: Path, step: int | None, task_id: str | None, as_json: bool) -> None:
    """Print why EnvSched selected each task, from a RUN_FILE written by `envsched run --explain RUN_FILE`
    or EnvSchedSampler(run_file=...).

    One row per selected task: phase, batch rank, q, predicted mean / dispersion / variance, the within-
    and cross-environment estimates ("(ref)": no observed neighbour, the global reference was used) and
    the caps that the pick reached. --task shows the neighbours behind each estimate.
    """
    try:
        records = [_one_based(r, run_file) for r in read_run_file(run_file, step=None if step is None else step - 1,
                                                                  task=task_id)]
    except (OSError, ValueError) as exc:
        hint = ""
        if "not an explanation record" in str(exc):
            hint = (" -- explanation records are written by `envsched run --explain FILE` (or "
                    "EnvSchedSampler(run_file=...)); a run directory's steps.jsonl holds per-step statistics, "
                    "not explanations")
        raise click.ClickException(f"{exc}{hint}") from None
    if as_json:
        click.echo(json.dumps(records, indent=2))
        return
    # a terminal's own width; piped, rich's default (80 columns, or $COLUMNS)
    console = Console(highlight=False)
    if not records:
        what = " and ".join(x for x in (f"step {step}" if step is not None else "",
                                        f"task {task_id!r}" if task_id else "") if x)
        raise click.ClickException(f"no explanation records{' for ' + what if what else ''} in {run_file}")
    if task_id is not None:
        parts = _render_all(run_file, records, lambda rec: _detail(rec, console.width))
    elif console.width < WIDE:
        parts = [_t(f"{run_file}: {len(records)} selections", style="bold"),
                 *_render_all(run_file, records, _record_lines)]
    else:
        table = Table(title=_t(f"{run_file}: {len(records)} selections"))
        for col in ("step", "rank", "task", "env", "phase", "q", "mean", "disp.", "variance", "within", "cross",
                    "caps reached"):
            table.add_column(col, justify="right" if col in ("step", "rank", "q", "mean", "disp.", "variance")
                             else "left", overflow="fold")
        for row in _render_all(run_file, records, _table_row):
            table.add_row(*row)
        parts = [table]
    for part in parts:
        console.print(part)


def _table_row(rec: dict[str, Any]) -> list[list[Text]]:
    """One record as the wide table's cells (plain text: run-file values are never read as markup)."""
    pred = rec.get("predicted") or {}
    cells = [str(rec["step"]), str(rec["rank"]), str(rec["task_id"]), str(rec["env"]), str(rec["phase"]),
             _num(rec.get("q")), _num(pred.get("mean"), 3), _num(pred.get("dispersion"), 3),
             _num(pred.get("variance")), _est(rec, "within"), _est(rec, "cross"), _caps(rec)]
    return [[_t(c) for c in cells]]


def _record_lines(rec: dict[str, Any]) -> list[Text]:
    """One selection as vertical lines (a narrow terminal, or piped): a heading line, then its numbers on
    indented lines that rich wraps at spaces, so that no value is cut."""
    pred = rec.get("predicted") or {}
    return [Text.assemble((visible(f"step {rec['step']} rank {rec['rank']}"), "bold"),
                          visible(f": {rec['task_id']} ({rec['env']}), {rec['phase']} pick")),
            _t(f"  q {_num(rec.get('q'))}; predicted mean {_num(pred.get('mean'), 3)}, dispersion "
               f"{_num(pred.get('dispersion'), 3)}, variance {_num(pred.get('variance'))}"),
            _t(f"  within {_est(rec, 'within')}; cross {_est(rec, 'cross')}; caps reached: {_caps(rec)}")]
