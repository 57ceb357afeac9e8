"""``envsched report``: the dashboard's views in one self-contained HTML file (plotly.js, the page's script and
style inlined, the views embedded as JSON), to attach to an issue or a paper's appendix. It opens offline and
loads nothing from anywhere."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from envsched.dashboard.app import page_html, plotly_js_path, static_text
from envsched.dashboard.model import RunIndex
from envsched.dashboard.reader import StoreReader
from envsched.dashboard.views import build_views, pick_rows

__all__ = ["write_report"]


def write_report(store: str | os.PathLike[str], out: str | os.PathLike[str], *,
                 run_file: str | os.PathLike[str] | None = None, table_prefix: str = "envsched",
                 last_steps: int = 5, max_picks: int = 2000) -> Path:
    """Write the report of ``store`` (and ``run_file``) to ``out``; returns its path. The picks table holds the
    latest ``last_steps`` batches (at most ``max_picks`` rows). The file is written to a temporary name and
    moved into place, so a failed run leaves no partial report."""
    reader = StoreReader(store, table_prefix=table_prefix)
    try:
        index = RunIndex(reader, run_file)
        index.refresh()
        snap = index.snapshot()
        views = build_views(index, snap)
        picks = pick_rows(index, snap, last_steps=last_steps, limit=max_picks)
    finally:
        reader.close()
    written = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    inline = {"plotly.min.js": plotly_js_path().read_text(encoding="utf-8"),
              "dashboard.js": static_text("dashboard.js"), "dashboard.css": static_text("dashboard.css")}
    html = page_html(title=f"envsched report: {reader.where}", inline=inline,
                     data={"views": views, "picks": picks, "written": written})
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
