"""`envsched report STORE --html FILE`: one self-contained file, checked by parsing it."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from click.testing import CliRunner

from envsched.cli.main import cli

from .conftest import HOSTILE_ID, HOSTILE_INSTRUCTION


class _Scan(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.scripts: list[dict[str, str | None]] = []
        self.data_json: str | None = None
        self._in_data = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for name in ("src", "href", "action", "data", "poster"):
            if a.get(name):
                self.urls.append((tag, name, a[name]))
        if tag == "script":
            self.scripts.append(a)
            self._in_data = a.get("id") == "envsched-data"

    def handle_data(self, data):
        if self._in_data:
            self.data_json = (self.data_json or "") + data

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_data = False


def test_report_is_self_contained_and_shows_the_run(tmp_path, run_writer):
    store, run_file, out = tmp_path / "run.sqlite", tmp_path / "run.jsonl", tmp_path / "out" / "report.html"
    w = run_writer(store, run_file, batch_size=49).run(3)  # every task each step: the hostile one too
    res = CliRunner().invoke(cli, ["report", str(store), "--run-file", str(run_file), "--html", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text(encoding="utf-8")
    scan = _Scan()
    scan.feed(text)
    assert scan.urls == []  # no src, no href: nothing is loaded from anywhere
    assert all("src" not in s for s in scan.scripts) and len(scan.scripts) == 3  # plotly.js, data, dashboard.js
    assert "Plotly" in text and text.count("<script") == text.count("</script>")
    assert "<script>window.__pwned" not in text and HOSTILE_INSTRUCTION not in text
    data = json.loads(scan.data_json or "")
    assert data["views"]["steps"] == 3 and data["views"]["summary"]["explained_picks"] == 3 * 49
    assert data["views"]["figures"]["coverage"]["data"][0]["x"] == [1, 2, 3]
    hostile = [r for r in data["picks"] if r["task_id"] == HOSTILE_ID]
    assert [r["instruction"] for r in hostile] == [HOSTILE_INSTRUCTION] * 3  # as data, shown with textContent
    assert {r["step"] for r in data["picks"]} == {1, 2, 3}
    w.close()


def test_report_refuses_a_missing_store_and_writes_nothing(tmp_path):
    out = tmp_path / "report.html"
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "none.sqlite"), "--html", str(out)])
    assert res.exit_code == 1 and "store not found" in res.output
    assert not out.exists() and not (tmp_path / "none.sqlite").exists()
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "none.sqlite")])
    assert res.exit_code == 2 and "--html" in res.output
