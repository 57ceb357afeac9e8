"""A live, read-only web dashboard over a run's history store (and its ``--explain`` run file), and the same
views as a self-contained HTML report: ``envsched dashboard STORE`` and ``envsched report STORE --html FILE``.

Needs the ``dashboard`` extra (Starlette, uvicorn, plotly): ``pip install 'envsched[dashboard]'``.
See docs/dashboard.md for what each view shows and what to look for in it.
"""

from __future__ import annotations

__all__ = ["create_app", "write_report"]


def __getattr__(name: str) -> object:
    if name == "create_app":
        from envsched.dashboard.app import create_app

        return create_app
    if name == "write_report":
        from envsched.dashboard.report import write_report

        return write_report
    raise AttributeError(name)
