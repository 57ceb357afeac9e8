"""The live dashboard: a Starlette app over one store (and optionally its run file), read-only.

Routes (no route takes a path: the only files served are the page's own script and style from this package
and plotly.js from the installed ``plotly`` package):

``GET /``                     the page;
``GET /static/<fixed name>``  ``dashboard.js``, ``dashboard.css``, ``plotly.min.js``;
``GET /api/state``            where the log stands (polled twice a second by the page);
``GET /api/views``            every figure, the metrics and a summary (cached until the log changes);
``GET /api/picks``            rows of the picks table (``?task=`` substring of a task id, ``?step=``, ``?limit=``).

A background thread reads new events every ``poll_s`` seconds and recomputes the views, so requests are
answered from memory. Responses carry a Content-Security-Policy that allows scripts from this origin only,
and the Host header must name a loopback address (or the host the dashboard was started on), which keeps
other web pages from reading the dashboard through DNS rebinding.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.resources
import ipaddress
import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from envsched.dashboard.model import RUN_FILE_CHUNK_BYTES, RunIndex
from envsched.dashboard.reader import StoreReader
from envsched.dashboard.views import build_views, pick_rows
from envsched.errors import EnvSchedError

__all__ = ["CSP", "Dashboard", "PortUnavailableError", "bind", "create_app", "is_loopback", "page_html",
           "plotly_js_path", "serve", "static_text", "url_of"]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_STATIC = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}


class PortUnavailableError(EnvSchedError, OSError):
    """The dashboard cannot listen where it was asked to (the port is taken, the address is not this
    machine's, or the port needs privileges)."""


#: what to add to the system's reason, by errno
_BIND_HINTS = {
    errno.EADDRINUSE: "another program listens there; choose another --port, or --port 0 for any free one",
    errno.EACCES: "ports below 1024 need privileges; choose a port from 1024, or --port 0 for any free one",
    errno.EADDRNOTAVAIL: "that address is not one of this machine's",
}


def url_of(host: str, port: int) -> str:
    """The page's URL on ``host`` (an IPv6 address in brackets) and ``port``."""
    host = host.strip("[]")
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host``:``port`` (``port`` 0: a free port the system picks; read it from
    ``getsockname()``). :class:`PortUnavailableError` in one line when it cannot be had."""
    where = url_of(host, port)[len("http://"):-1]
    sock: socket.socket | None = None
    try:  # as uvicorn binds: IPv6 for an address with a colon, IPv4 for anything else ("localhost": 127.0.0.1)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a closed port's TIME_WAIT
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as exc:
        if sock is not None:
            sock.close()
        hint = _BIND_HINTS.get(exc.errno or 0)
        raise PortUnavailableError(f"cannot serve on {where}: {(exc.strerror or str(exc)).lower()}"
                                   + (f" ({hint})" if hint else "")) from None
    return sock


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plotly_js_path() -> Path:
    """plotly.js as shipped inside the installed ``plotly`` Python package (the page works offline)."""
    try:
        import plotly
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("the dashboard needs plotly: pip install 'envsched[dashboard]'") from None
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():  # pragma: no cover - a broken plotly install
        raise FileNotFoundError(f"plotly.min.js not found in the installed plotly package ({path})")
    return path


def static_text(name: str) -> str:
    """The text of one of the page's own files (``dashboard.js``, ``dashboard.css``)."""
    return importlib.resources.files("envsched.dashboard").joinpath("static", name).read_text(encoding="utf-8")


def json_for_script(value: Any) -> str:
    """JSON that is safe inside a ``<script type="application/json">`` element (no ``<``, ``>`` or ``&``)."""
    text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_html(*, title: str, inline: dict[str, str] | None = None, data: Any = None) -> str:
    """The page. Live: scripts and style from ``/static``. Report (``inline`` given): everything inlined,
    the views embedded as JSON (``data``)."""
    from html import escape

    if inline is None:
        head = ('<link rel="stylesheet" href="/static/dashboard.css">\n'
                '<script src="/static/plotly.min.js"></script>\n'
                '<script src="/static/dashboard.js" defer></script>')
        mode, embedded = "live", ""
    else:
        plotly_js, own_js = (inline[k].replace("</script", "<\\/script") for k in ("plotly.min.js", "dashboard.js"))
        head = f"<style>{inline['dashboard.css']}</style>\n<script>{plotly_js}</script>"
        mode = "report"
        embedded = (f'<script type="application/json" id="envsched-data">{json_for_script(data)}</script>\n'
                    f"<script>{own_js}</script>")
    rows = [
        (("coverage",), "Environment coverage",
         "Which environments each batch covers as training goes on (the share of each batch per environment). A "
         "row that goes dark means the scheduler stopped drawing that environment; a few bright rows mean "
         "coverage collapsed onto them."),
        (("envs_per_batch", "signal"), "Environments per batch and signal over time",
         "Left: distinct environments per batch against what uniform sampling over the same pool would give. "
         "Right: groups with signal (rollouts whose rewards differ) are the ones GRPO learns from."),
        (("signal_env",), "Signal per environment",
         "The share of each environment's groups that had signal; an environment that stays pale gives no "
         "gradient however often it is drawn."),
        (("reliability", "async"), "Prediction against outcome and asynchronous state",
         "Left: bins of picks, the variance EnvSched predicted against the variance the group's rollouts gave "
         "(points far from the diagonal: the predictions stopped coming true). Right: groups drawn but not "
         "reported, reported late, or given back."),
    ]
    body = []
    for names, heading, note in rows:
        cells = "".join(f'<div class="figure" id="fig-{name}"></div>' for name in names)
        body.append(f"<h2>{escape(heading)}</h2><p class='note'>{escape(note)}</p>"
                    f'<div class="row row-{len(names)}">{cells}</div>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
{head}
</head>
<body data-mode="{mode}">
<header><h1>envsched dashboard</h1><span id="status" class="status">loading...</span></header>
<section id="summary" class="cards"></section>
<main>
{''.join(body)}
<h2>Latest batches</h2>
<p class="note">Each pick's environment, phase, batch rank, prediction, outcome and the reasons recorded by
<code>envsched run --explain</code>. Search by task id (substring) or step.</p>
<form id="search" class="search">
<input id="search-task" type="search" placeholder="task id contains..." autocomplete="off">
<input id="search-step" type="number" min="1" placeholder="step"><button type="submit">Search</button>
<button type="button" id="search-clear">Latest</button></form>
<div class="table-wrap"><table id="picks"><thead><tr><th>step</th><th>rank</th><th>task</th><th>env</th><th>phase</th>
<th>predicted var.</th><th>status</th><th>mean reward</th><th>observed var.</th><th>signal</th><th>reasons</th>
</tr></thead>
<tbody></tbody></table></div>
<h2>Sampler metrics</h2>
<p class="note">The sampler's <code>metrics()</code> counters, recomputed from the store's log.</p>
<table id="metrics" class="metrics"><tbody></tbody></table>
</main>
{embedded}
</body></html>
"""


class Dashboard:
    """The state behind the app: the index, the cached views and the thread that keeps them fresh."""

    def __init__(self, store: str | os.PathLike[str], *, run_file: str | os.PathLike[str] | None = None,
                 table_prefix: str = "envsched", poll_s: float = 0.25, chunk: int = 50_000) -> None:
        self.reader = StoreReader(store, table_prefix=table_prefix)
        self.index = RunIndex(self.reader, run_file)
        self.poll_s = poll_s
        self.chunk = chunk
        self.error: str | None = None
        self._views: tuple[int, bytes] | None = None
        self._views_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        """Read new events (one chunk of events and of the run file: bounded work whatever the store holds)
        and, once caught up, recompute the views if anything changed. An error is kept for the page (one line,
        naming the event or line) and the next tick tries again from where the index stands."""
        try:
            self.index.refresh(max_events=self.chunk, chunk=self.chunk, max_run_bytes=RUN_FILE_CHUNK_BYTES)
            self.error = None
            if self.index.caught_up:
                self.views_json()
        except Exception as exc:  # shown on the page; the thread keeps polling
            text = str(exc).splitlines()[0] if str(exc) else ""
            self.error = f"{type(exc).__name__}: {text}"
            with contextlib.suppress(Exception):
                self.views_json()  # what was read before the error

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick()
            if self.index.caught_up or self.error is not None:  # an error: wait before trying again
                self._stop.wait(self.poll_s)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="envsched-dashboard-index", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.reader.close()

    def views_json(self) -> bytes:
        """The views of the current index, as JSON bytes (recomputed only when the index changed)."""
        with self._views_lock:
            version = self.index.version
            if self._views is None or self._views[0] != version:
                self._views = (version, json.dumps(build_views(self.index), allow_nan=False,
                                                   separators=(",", ":")).encode())
            return self._views[1]

    def state(self) -> dict[str, Any]:
        out = self.index.state()
        out["error"] = self.error
        return out

    def picks(self, *, task: str | None, step: int | None, limit: int) -> list[dict[str, Any]]:
        return pick_rows(self.index, self.index.snapshot(), task=task, step=step, limit=limit)


def create_app(store: str | os.PathLike[str], *, run_file: str | os.PathLike[str] | None = None,
               table_prefix: str = "envsched", host: str = "127.0.0.1", poll_s: float = 0.25,
               start: bool = True) -> Any:
    """The Starlette application of a dashboard over ``store`` (and ``run_file``); ``host`` is the address
    it will be served on (the Host header must name it or a loopback address)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, Response
    from starlette.routing import Route

    dash = Dashboard(store, run_file=run_file, table_prefix=table_prefix, poll_s=poll_s)
    plotly_js = plotly_js_path()
    page = page_html(title=f"envsched dashboard: {dash.reader.where}").encode()
    static = {name: static_text(name).encode() for name in _STATIC}
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
               "Cache-Control": "no-store"}

    async def index(request: Request) -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=headers)

    async def static_file(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "plotly.min.js":
            return FileResponse(plotly_js, media_type="text/javascript; charset=utf-8",
                                headers={**headers, "Cache-Control": "max-age=3600"})
        if name not in static:
            return Response("not found", status_code=404, headers=headers)
        return Response(static[name], media_type=_STATIC[name], headers=headers)

    async def favicon(request: Request) -> Response:
        return Response(status_code=204, headers=headers)

    async def state(request: Request) -> Response:
        return JSONResponse(dash.state(), headers=headers)

    async def views(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        body = await run_in_threadpool(dash.views_json)
        return Response(body, media_type="application/json", headers=headers)

    async def picks(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        q = request.query_params
        try:
            step = int(q["step"]) if q.get("step") else None
            limit = int(q.get("limit") or 500)
        except ValueError:
            return JSONResponse({"error": "step and limit must be integers"}, status_code=400, headers=headers)
        task = (q.get("task") or "")[:200] or None
        rows = await run_in_threadpool(dash.picks, task=task, step=step, limit=limit)
        return JSONResponse({"rows": rows}, headers=headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if start:
            dash.start()
        try:
            yield
        finally:
            dash.stop()

    allowed = ["127.0.0.1", "localhost", "[::1]", "::1"]
    if host in ("0.0.0.0", "::"):  # every interface (only with --allow-remote): any name may reach it
        allowed = ["*"]
    elif host not in allowed:
        allowed.append(host if ":" not in host else f"[{host}]")
    app = Starlette(routes=[Route("/", index), Route("/static/{name}", static_file), Route("/favicon.ico", favicon),
                            Route("/api/state", state), Route("/api/views", views), Route("/api/picks", picks)],
                    middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=allowed)], lifespan=lifespan)
    app.state.dashboard = dash
    return app


def serve(store: str, *, run_file: str | None = None, table_prefix: str = "envsched", host: str = "127.0.0.1",
          port: int = 8080, allow_remote: bool = False, poll_s: float = 0.25,
          ready: Callable[[str], None] | None = None) -> None:
    """Run the dashboard with uvicorn until interrupted. Refuses a non-loopback ``host`` unless
    ``allow_remote`` (the page shows task ids and instructions of the pool to whoever can reach it).

    In this order, so that nothing claims to serve what it cannot: the store is opened (a store that cannot
    be read raises :class:`~envsched.dashboard.reader.DashboardError`), the port is bound
    (:class:`PortUnavailableError`), then ``ready`` is called with the URL actually served (with ``port`` 0,
    the port the system picked) and uvicorn serves on that socket."""
    import uvicorn

    if not is_loopback(host) and not allow_remote:
        raise ValueError(f"refusing to serve the dashboard on {host}, which is not a loopback address: anyone who "
                         "can reach it would see the run; pass --allow-remote to do it anyway")
    app = create_app(store, run_file=run_file, table_prefix=table_prefix, host=host, poll_s=poll_s)
    try:
        sock = bind(host, port)
    except PortUnavailableError:
        app.state.dashboard.stop()
        raise
    with sock:
        if ready is not None:
            ready(url_of(host, sock.getsockname()[1]))
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn has shut down and re-raises it
            uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
