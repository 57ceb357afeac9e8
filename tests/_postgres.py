"""A throw-away PostgreSQL server for the store tests, started by the test suite itself when it can be.

The steps are those of ``.ci/postgres.sh`` (which CI runs before pytest): ``initdb`` a cluster with trust
authentication, start it on 127.0.0.1 with its socket in the cluster's folder, create the database, and
export ``ENVSCHED_TEST_POSTGRES_URL``. Unlike the CI script it never installs packages: it uses server
binaries already on the machine (``initdb`` on ``PATH`` or under ``/usr/lib/postgresql/*/bin``), runs
them as the ``postgres`` user when the tests run as root (PostgreSQL refuses to run as root), and removes
the cluster when the tests end (a session killed before it could clean up leaves an ``owner.pid`` naming a
dead process; the next session stops and removes that cluster). When no server can be started, the
PostgreSQL tests skip and say why.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DB = "envsched_test"


@dataclass
class Server:
    """A running throw-away server: its URL, and how to stop it."""

    url: str
    bindir: Path
    root: Path
    user: str | None

    def stop(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            _run(self.user, [str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                             "-w", "-t", "30", "stop"], timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


def find_bindir() -> Path | None:
    """The folder holding initdb, pg_ctl and pg_isready, or None."""
    which = shutil.which("initdb")
    candidates = [Path(os.path.realpath(which)).parent] if which else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name, reverse=True)
    for d in candidates:
        if all((d / exe).is_file() for exe in ("initdb", "pg_ctl", "createdb")):
            return d
    return None


def _run(user: str | None, argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PREFIX = "envsched-test-pg-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale(bindir: Path, user: str | None) -> list[Path]:
    """Stop and remove the throw-away clusters of earlier test sessions that were killed before they could
    clean up (their ``owner.pid`` names a process that no longer runs). Returns the folders removed."""
    removed = []
    for root in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = int((root / "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being set up
        if owner == os.getpid() or _alive(owner):
            continue
        Server("", bindir, root, user).stop()
        removed.append(root)
    return removed


def start() -> tuple[Server | None, str]:
    """Start a server; returns (server, "") or (None, the reason it could not be started)."""
    bindir = find_bindir()
    if bindir is None:
        return None, "no PostgreSQL server binaries (initdb) on this machine"
    user: str | None = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return None, "running as root and there is no 'postgres' user to run the server (.ci/postgres.sh makes one)"
        if shutil.which("runuser") is None:
            return None, "running as root without runuser to start the server as 'postgres'"
        user = "postgres"
    reap_stale(bindir, user)
    root = Path(tempfile.mkdtemp(prefix=PREFIX))
    (root / "owner.pid").write_text(str(os.getpid()))
    if user is not None:
        pw = pwd.getpwnam(user)
        os.chown(root, pw.pw_uid, pw.pw_gid)
    os.chmod(root, 0o700)
    port = _free_port()
    data = root / "data"
    try:
        _run(user, [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                    "--no-locale"], timeout=180)
        _run(user, [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60",
                    "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c max_connections=100 -c fsync=off",
                    "start"], timeout=120)
        server = Server(f"postgresql+psycopg://postgres@127.0.0.1:{port}/{DB}", bindir, root, user)
        deadline = time.monotonic() + 30
        while True:
            try:
                _run(user, [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", DB],
                     timeout=30)
                break
            except subprocess.CalledProcessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            _run(user, [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], timeout=30)
        shutil.rmtree(root, ignore_errors=True)
        return None, f"could not start a PostgreSQL server with {bindir}: {exc} {detail.strip()[-300:]}"
    return server, ""
