"""``envsched explain RUN_FILE``: why EnvSched selected each task (the paper's case studies F.1-F.3)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from envsched.cli.common import MAX_EXPLAIN_STEP, int_range, visible
from envsched.method.explain import read_run_file
from envsched.validation import is_int

#: the console width from which the selections are shown as one table (narrower: vertical records)
WIDE = 140
#: how much further than its first line a wrapped line's continuation is indented
HANG = 2

#: Every term `envsched explain` prints, once: (what is printed, what it means). The compact views (the table
#: and the vertical records) print the terms of COMPACT_TERMS, ``--task`` those of DETAIL_TERMS.
LEGEND: dict[str, tuple[str, str]] = {
    "step": ("step, rank", "the batch (counted from 1, as `envsched run` counts) and the pick's place in it"),
    "phase": ("phase", "what picked the task: cold_start (no reward scored yet), coverage (spreads the batch "
              "over environments), exploitation (the most informative tasks), fill (caps relaxed to fill the "
              "batch)"),
    "q": ("q", "percentile (0-1) of the task's informativeness among the pool's tasks; 1: the most informative"),
    "predicted": ("predicted mean, dispersion (disp.), variance", "the task's next group on rewards mapped to "
                  "[0, 1]: mean m, dispersion v / (m (1 - m)), variance v (the signal sought; at most 0.25)"),
    "relations": ("within, cross", "the variance estimated from the task's graph neighbours in its own "
                  "environment / in other environments"),
    "ref": ("(ref)", "no neighbour observed yet: the estimate is the stand-in (global reference or environment "
            "estimate)"),
    "off": ("off", "relation switched off in this configuration: shown, not used"),
    "caps": ("caps reached", "name=count/limit of each cap the pick reached; relaxed: a fill pick went past it"),
    "score": ("score", "what the pick maximised in its phase, after the similarity and exposure penalties"),
    "informativeness": ("informativeness", "the task's priority: its predicted variance over the long and short "
                        "half-lives"),
    "reconstructed": ("reconstructed", "the variance rebuilt from the predicted mean and dispersion, d m (1 - m)"),
    "reference": ("global reference", "mean and variance of the latest step's observed groups (exploitation left "
                  "out); every history is centred on it"),
    "own": ("own history", "the task's own groups; weight: their recency weight (long half-life)"),
    "decline": ("decline", "how far the short half-life score lies below the long one (lowers the priority)"),
    "half_lives": ("long/short half-life scores", "the prediction with a long and with a short memory"),
    "neighbours": ("neighbour lines", "its weight in the estimate, similarity to the task, observed groups, "
                   "mean and variance"),
    "novelty": ("novelty", "at cold start, how unlike the batch so far the task is (1: unlike all)"),
    "similarity": ("similarity to the batch", "the largest similarity to a task already picked (lowers the score "
                   "by up to 20 %)"),
    "exposure": ("exposure (discount)", "recency-weighted count of past selections, and the factor "
                 "(1 + exposure) ** -0.1 it applies"),
    "coverage": ("environment/task counts", "what the coverage phase orders by, fewest first"),
    "cap": ("cap NAME (symbol): count/limit", "a batch cap, its symbol in the paper, and the picks counting "
            "against it"),
    "progress": ("progress filter", "a task whose residual is <= 0 after 3 or more scorable transitions leaves "
                 "exploitation"),
    "identifier": ("identifier filter", "a task whose high-reward trajectories look like guessed identifiers "
                   "leaves exploitation"),
    "relaxed": ("relaxed to fill the batch", "the caps and filters a fill pick went past"),
}
COMPACT_TERMS = ("step", "phase", "q", "predicted", "relations", "ref", "off", "caps")
DETAIL_TERMS = ("step", "phase", "score", "q", "informativeness", "predicted", "reconstructed", "reference", "own",
                "decline", "half_lives", "relations", "ref", "off", "neighbours", "novelty", "similarity",
                "exposure", "coverage", "cap", "progress", "identifier", "relaxed")


class Hanging:
    """A line of text indented by ``indent`` spaces; where the terminal is too narrow for it, its continuation
    lines are indented :data:`HANG` further (at spaces; a word wider than the line is folded), so that a
    wrapped value never reads as a line of its own and nothing is cut."""

    def __init__(self, text: Text, indent: int = 0) -> None:
        self.text, self.indent = text, indent

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width - self.indent - HANG, 8)
        for i, line in enumerate(self.text.wrap(console, width, overflow="fold")):
            line.rstrip()
            yield Text(" " * (self.indent if i == 0 else self.indent + HANG)) + line


def _t(text: str, style: str = "") -> Text:
    """Text for the terminal as it is: run-file values are never read as rich markup, and control characters
    (terminal escape sequences) are shown escaped (:func:`~envsched.cli.common.visible`)."""
    return Text(visible(text), style=style)


def _line(text: str | Text, style: str = "") -> Hanging:
    """One printed line (its leading spaces are its indent), wrapped with a hanging indent."""
    if isinstance(text, Text):
        body = text.plain.lstrip(" ")
        return Hanging(text[len(text.plain) - len(body):], len(text.plain) - len(body))
    body = text.lstrip(" ")
    return Hanging(_t(body, style), len(text) - len(body))


def legend(terms: tuple[str, ...]) -> list[Hanging]:
    """The legend of ``terms`` (keys of :data:`LEGEND`): a heading, then one line per term."""
    out = [Hanging(Text("Terms:", style="bold"))]
    for key in terms:
        term, meaning = LEGEND[key]
        out.append(Hanging(Text.assemble((term, "bold"), f": {meaning}"), 2))
    return out


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
    out.append(_line(Text.assemble((visible(rec["task_id"]), "bold"), visible(rest))))
    pred = rec.get("predicted")
    if pred:
        ref = rec["global_reference"]
        own = rec["own_history"]
        out.append(_line(f"  q = {_num(rec['q'])}, informativeness {_num(rec['informativeness'])}; predicted mean "
                      f"{_num(pred['mean'], 3)}, dispersion {_num(pred['dispersion'], 3)}, variance "
                      f"{_num(pred['variance'])} (reconstructed {_num(pred['variance_reconstructed'])})"))
        out.append(_line(f"  global reference: mean {_num(ref['mean'], 3)}, variance {_num(ref['variance'])}; own "
                      f"history: {own['groups']} groups (weight {_num(own['weight'], 2)})"))
        out.append(_line(f"  decline {_num(rec['decline'])}; long/short half-life scores "
                      f"{_num(rec['half_lives']['long']['score'])} / {_num(rec['half_lives']['short']['score'])}"))
        for relation in ("within", "cross"):
            rel = rec["relations"][relation]
            title = f"{relation}-environment estimate {_est(rec, relation)}"
            if width < WIDE:  # one record per neighbour: no cell cut to an ellipsis
                out.append(_line(f"  {title}:"))
                for nb in rel["neighbors"]:
                    out.append(_line(f"    {nb['id']} ({nb['env']})"))
                    out.append(_line(f"      weight {_num(nb['weight'], 3)}, similarity {_num(nb['similarity'], 3)}, "
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
        out.append(_line(f"  cold start (no history): novelty {_num(rec['novelty'])}"))
    out.append(_line(f"  similarity to the batch {_num(rec['similarity']['max_similarity'], 3)}; exposure "
                  f"{_num(rec['exposure']['exposure'], 2)} (discount {_num(rec['exposure']['discount'], 3)})"))
    cov = rec["coverage"]
    out.append(_line(f"  environment: {cov['env_selections_before']} earlier selections, {cov['env_batch_count']} in "
                  f"this batch; task: {cov['task_observations_before']} earlier observations"))
    relaxed = _relaxed_caps(rec)
    for name, c in rec["caps"].items():
        state = f" {relaxed[name]} to fill the batch" if name in relaxed else (" reached" if c["reached"] else "")
        out.append(_line(f"  cap {name} ({c['paper']}): {c['count']}/{c['limit']}{state}"))
    prog = rec["filters"]["progress"]
    ident = rec["filters"]["identifier"]
    out.append(_line(f"  progress filter: {prog['transitions']} scorable transitions, residual {_num(prog['residual'])}"
                  f"{' (filtered)' if prog['filtered'] else ''}; identifier filter: "
                  f"{'flagged: ' + ident['reason'] if ident['flagged'] else 'not flagged'}"))
    if rec.get("relaxed"):
        out.append(_line(f"  relaxed to fill the batch: {', '.join(rec['relaxed'])}"))
    return out


@click.command("explain")
@click.argument("run_file", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--step", type=int_range(1, MAX_EXPLAIN_STEP), default=None,
              help="Only this step (counted from 1, as `envsched run` prints them).")
@click.option("--task", "task_id", default=None, help="Only this task id (a detailed view per step).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the records as a JSON list (steps counted from 1, like the table).")
@click.option("--legend", "legend_only", is_flag=True,
              help="Print what every term explain prints means (both views), and nothing else; no RUN_FILE needed.")
@click.option("--no-legend", is_flag=True, help="Leave out the legend of terms printed after the records.")
def explain(run_file: Path | None, step: int | None, task_id: str | None, as_json: bool, legend_only: bool,
            no_legend: bool) -> None:
    """Print why EnvSched selected each task, from a RUN_FILE written by `envsched run --explain RUN_FILE`
    or EnvSchedSampler(run_file=...).

    One row per selected task: phase, batch rank, q, predicted mean / dispersion / variance, the within-
    and cross-environment estimates ("(ref)": no observed neighbour, the global reference was used) and
    the caps that the pick reached. --task shows the neighbours behind each estimate. The terms the output
    uses are explained once, after the records (--legend: all of them).
    """
    console = Console(highlight=False)  # a terminal's own width; piped, rich's default (80 columns, or $COLUMNS)
    if legend_only:
        for part in legend(tuple(dict.fromkeys((*COMPACT_TERMS, *DETAIL_TERMS)))):
            console.print(part)
        return
    if run_file is None:
        raise click.UsageError("Missing argument 'RUN_FILE' (or give --legend to see what the terms mean).")
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
    if not records:
        what = " and ".join(x for x in (f"step {step}" if step is not None else "",
                                        f"task {task_id!r}" if task_id else "") if x)
        raise click.ClickException(f"no explanation records{' for ' + what if what else ''} in {run_file}")
    if task_id is not None:
        parts = _render_all(run_file, records, lambda rec: _detail(rec, console.width))
    elif console.width < WIDE:
        parts = [_line(f"{run_file}: {len(records)} selections", style="bold"),
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
    if not no_legend:
        parts += [Text(""), *legend(_terms(records, detail=task_id is not None))]
    for part in parts:
        console.print(part)


def _terms(records: list[dict[str, Any]], *, detail: bool) -> tuple[str, ...]:
    """The :data:`LEGEND` keys of the terms the view of ``records`` prints (``detail``: ``--task``'s view)."""
    relations = [rel for rec in records for rel in (rec.get("relations") or {}).values() if isinstance(rel, dict)]
    shown = {"ref": any(not rel.get("has_observed_neighbors") for rel in relations),
             "off": any(not rel.get("used") for rel in relations)}
    if not detail:
        return tuple(k for k in COMPACT_TERMS if shown.get(k, True))
    predicted = any(rec.get("predicted") for rec in records)
    shown.update({k: predicted for k in ("q", "informativeness", "predicted", "reconstructed", "reference", "own",
                                         "decline", "half_lives", "relations", "neighbours")})
    shown["novelty"] = any(not rec.get("predicted") and rec.get("novelty") is not None for rec in records)
    shown["relaxed"] = any(rec.get("relaxed") for rec in records)
    return tuple(k for k in DETAIL_TERMS if shown.get(k, True))


def _table_row(rec: dict[str, Any]) -> list[list[Text]]:
    """One record as the wide table's cells (plain text: run-file values are never read as markup)."""
    pred = rec.get("predicted") or {}
    cells = [str(rec["step"]), str(rec["rank"]), str(rec["task_id"]), str(rec["env"]), str(rec["phase"]),
             _num(rec.get("q")), _num(pred.get("mean"), 3), _num(pred.get("dispersion"), 3),
             _num(pred.get("variance")), _est(rec, "within"), _est(rec, "cross"), _caps(rec)]
    return [[_t(c) for c in cells]]


def _record_lines(rec: dict[str, Any]) -> list[Hanging]:
    """One selection as vertical lines (a narrow terminal, or piped): a heading line, then its numbers on
    indented lines, wrapped at spaces with a hanging indent, so that no value is cut."""
    pred = rec.get("predicted") or {}
    return [_line(Text.assemble((visible(f"step {rec['step']} rank {rec['rank']}"), "bold"),
                                visible(f": {rec['task_id']} ({rec['env']}), {rec['phase']} pick"))),
            _line(f"  q {_num(rec.get('q'))}; predicted mean {_num(pred.get('mean'), 3)}, dispersion "
                  f"{_num(pred.get('dispersion'), 3)}, variance {_num(pred.get('variance'))}"),
            _line(f"  within {_est(rec, 'within')}; cross {_est(rec, 'cross')}; caps reached: {_caps(rec)}")]
