"""The scorer worker's audit-hook guard (envs/_guard.py): process-wide, no off switch, the known bypasses
blocked, harmless stdlib (namedtuple, dataclasses, ast.literal_eval, imports) allowed.

The guard is armed for good in the process that arms it, so each check runs in a child process: one that arms
it and tries every attempt, and the real scorer worker, forked after an audited dataset's scorer was replaced
by one that runs its answer (what a reasoning-gym release that started evaluating answers would do).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

#: name -> code that must raise EvaluationBlocked under the guard (``D`` is a scratch folder, ``F`` a file in
#: it with content, ``PORT``/``UDP`` listeners on 127.0.0.1).
ATTEMPTS: dict[str, str] = {
    "exec of compiled code": "exec(compile('open(D + \"/m1\", \"w\")', 'answer.py', 'exec'))",
    "eval of text": "eval('1 + 1')",
    "exec of text": "exec('x = 1')",
    "compile to code": "compile('1 + 1', 'answer.py', 'eval')",
    "types.FunctionType": "import types; types.FunctionType((lambda: 1).__code__, {})()",
    "FunctionType from marshal": "import marshal, types; types.FunctionType(marshal.loads(CODE), {})()",
    "marshal.loads": "import marshal; marshal.loads(CODE)",
    "code.replace": "(lambda: 1).__code__.replace(co_filename='trusted.py')",
    "assigning __code__": "f = lambda: 0\nf.__code__ = (lambda: 1).__code__",
    "a new thread": ("import threading\nerr = []\ndef run():\n    try:\n        open(D + '/m2', 'w')\n"
                     "    except Exception as e:\n        err.append(e)\n"
                     "t = threading.Thread(target=run); t.start(); t.join()\nraise err[0]"),
    "switching the guard off": "import envsched.envs._guard as g\ng._armed = False\nopen(D + '/m3', 'w')",
    "open for writing": "open(D + '/m4', 'w')",
    "open for appending": "open(F, 'a')",
    "open exclusive": "open(D + '/m5', 'x')",
    "open read-write": "open(F, 'r+')",
    "os.open O_CREAT": "import os; os.open(D + '/m6', os.O_CREAT | os.O_WRONLY)",
    "os.truncate": "import os; os.truncate(F, 0)",
    "os.mkdir": "import os; os.mkdir(D + '/m7')",
    "os.makedirs": "import os; os.makedirs(D + '/m8/a')",
    "os.remove": "import os; os.remove(F)",
    "os.rename": "import os; os.rename(F, D + '/m9')",
    "os.chmod": "import os; os.chmod(F, 0o777)",
    "os.utime": "import os; os.utime(F, (0, 0))",
    "os.symlink": "import os; os.symlink(F, D + '/m10')",
    "os.link": "import os; os.link(F, D + '/m11')",
    "shutil.copyfile": "import shutil; shutil.copyfile(F, D + '/m12')",
    "shutil.rmtree": "import shutil; shutil.rmtree(D)",
    "tempfile.mkstemp": "import tempfile; tempfile.mkstemp(dir=D)",
    "os.system": "import os; os.system('touch ' + D + '/m13')",
    "subprocess": "import subprocess; subprocess.run(['touch', D + '/m14'])",
    "os.fork": "import os; os.fork()",
    "os.kill": "import os; os.kill(os.getppid(), 0)",
    "os.putenv": "import os; os.putenv('X', '1')",
    "resource.setrlimit": "import resource; resource.setrlimit(resource.RLIMIT_CORE, (0, 0))",
    "a socket": "import socket; socket.socket()",
    "TCP connect": "import socket; socket.create_connection(('127.0.0.1', PORT))",
    "UDP sendmsg": ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    "s.sendmsg([b'leak'], [], 0, ('127.0.0.1', UDP))"),
    "urllib": "import urllib.request; urllib.request.urlopen('http://127.0.0.1:%d/' % PORT)",
    "ctypes": "import ctypes; ctypes.CDLL(None)",
    "pickle class lookup": "import pickle; pickle.loads(b'cos\\nsystem\\n(S\"true\"\\ntR.')",
    "mmap of a file": "import mmap; mmap.mmap(open(F, 'rb').fileno(), 0, access=mmap.ACCESS_READ)",
    "sqlite3": "import sqlite3; sqlite3.connect(D + '/m15.db')",
    # CPython drops a new hook (silently) when a hook refuses it: the attempt reports whether it was added
    "a second audit hook": ("import sys\nfrom envsched.envs._guard import EvaluationBlocked\nseen = []\n"
                            "sys.addaudithook(lambda e, a: seen.append(e))\nopen(F).close()\n"
                            "if not seen:\n    raise EvaluationBlocked('the hook was not added')"),
    "gc walk to the hook": "import gc; gc.get_objects()",
    "gc referrers": "import gc; gc.get_referrers(open)",
}

#: name -> code that must work under the guard.
ALLOWED: dict[str, str] = {
    "namedtuple": "import collections; P = collections.namedtuple('P', 'a b'); assert P(1, 2).b == 2",
    "typing.NamedTuple": "import typing; P = typing.NamedTuple('P', [('a', int)]); assert P(3).a == 3",
    "dataclass": ("import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass C:\n    a: int\n    b: str = 'x'\n"
                  "assert C(1) == C(1, 'x') and hash(C(1))"),
    "make_dataclass": "import dataclasses; D = dataclasses.make_dataclass('D', [('a', int)]); assert D(1).a == 1",
    "ast.literal_eval": "import ast; assert ast.literal_eval('[1, (2, 3)]') == [1, (2, 3)]",
    "a fresh import": ("import sys; sys.modules.pop('colorsys', None)\nimport colorsys\n"
                       "assert colorsys.rgb_to_hsv(1, 0, 0)"),
    "reading a file": "assert open(F).read() == 'keep'",
    "anonymous mmap": "import mmap; mmap.mmap(-1, 16).close()",
    "a thread that computes": ("import threading\nout = []\nt = threading.Thread(target=lambda: out.append(6 * 7))\n"
                               "t.start(); t.join(); assert out == [42]"),
    "json and re": "import json, re; assert json.loads('[1]') == [1] and re.findall(r'\\d', 'a1b2') == ['1', '2']",
    "sympy": "import sympy; x = sympy.Symbol('x'); assert sympy.diff(x**2, x) == 2*x",
}

_CHILD = r'''
import json, marshal, sys, types
import collections, dataclasses, sympy  # imported before arming, as the worker imports its scorers first
from envsched.envs import _guard
D, F, PORT, UDP = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
names = {"D": D, "F": F, "PORT": PORT, "UDP": UDP,
         "CODE": marshal.dumps(compile("open(D + '/mc', 'w')", "x", "exec"))}
# every attempt becomes a function before arming (this harness is trusted code): what runs under the guard
# is the attempt's own code, called as a function
def functions(arg):
    return {k: types.FunctionType(compile(v, k, "exec"), dict(names)) for k, v in json.loads(arg).items()}
attempts, allowed = functions(sys.argv[5]), functions(sys.argv[6])
_guard.arm(unpicklers=())
out = {"armed": _guard.armed(), "blocked": {}, "allowed": {}}
for name, fn in attempts.items():
    try:
        fn()
        out["blocked"][name] = "not blocked"
    except _guard.EvaluationBlocked:
        out["blocked"][name] = "blocked"
    except BaseException as exc:
        out["blocked"][name] = f"{type(exc).__name__}: {exc}"
for name, fn in allowed.items():
    try:
        fn()
        out["allowed"][name] = "ok"
    except BaseException as exc:
        out["allowed"][name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
'''


def _listeners() -> tuple[socket.socket, socket.socket]:
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    tcp.settimeout(0.5)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    return tcp, udp


@pytest.fixture(scope="module")
def guarded_run(tmp_path_factory) -> tuple[dict, Path, list]:
    """Every attempt, run in one child process that armed the guard (this process stays unguarded)."""
    d = tmp_path_factory.mktemp("guard")
    f = d / "f.txt"
    f.write_text("keep")
    tcp, udp = _listeners()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(d), str(f), str(tcp.getsockname()[1]),
                           str(udp.getsockname()[1]), json.dumps(ATTEMPTS), json.dumps(ALLOWED)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    received = []
    for sock in (udp, tcp):
        with contextlib.suppress(OSError):
            received.append(sock.recv(100) if sock is udp else sock.accept())
    tcp.close()
    udp.close()
    return json.loads(proc.stdout.strip().splitlines()[-1]), d, received


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ATTEMPTS))
def test_the_guard_blocks_each_bypass(guarded_run, name: str) -> None:
    out, _d, _received = guarded_run
    assert out["armed"] is True
    assert out["blocked"][name] == "blocked"


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_the_guard_lets_harmless_stdlib_run(guarded_run, name: str) -> None:
    out, _d, _received = guarded_run
    assert out["allowed"][name] == "ok"


def test_nothing_was_written_sent_or_changed(guarded_run) -> None:
    _out, d, received = guarded_run
    assert sorted(p.name for p in d.iterdir()) == ["f.txt"]  # no marker, folder, link or copy
    assert (d / "f.txt").read_text() == "keep"  # not truncated, renamed or removed
    assert oct((d / "f.txt").stat().st_mode & 0o777) != oct(0o777)
    assert received == []  # the UDP listener got no datagram, the TCP listener no connection


def test_the_test_process_itself_is_not_guarded() -> None:
    from envsched.envs import _guard

    assert not _guard.armed()
    assert eval("1 + 1") == 2  # arming happens in worker processes only
