"""The audit-hook guard of the scorer worker: a second line behind process isolation.

Nothing envsched scores evaluates a model's answer (:mod:`envsched.envs.safe_scoring`), and every answer is
scored in a separate worker process with a time and memory budget. Inside that worker, :func:`arm` installs an
audit hook (:func:`sys.addaudithook`) for the rest of the process's life: it is process-wide (every thread,
including threads started later), it has no off switch (the events it blocks and the code it trusts are bound
in its closure when it is armed; no module attribute turns it off; assigning a function's ``__code__`` is
blocked), and audit hooks cannot be removed. It raises :class:`EvaluationBlocked` on:

- running code that was not imported: ``exec``/``eval``/``compile`` of text or of a code object, building a
  code object (``code.__new__``, ``code.replace``) or a function from one (``types.FunctionType``),
  ``marshal.loads``/``load``, assigning ``__code__``;
- starting processes and signalling (``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.spawn*``,
  ``os.fork``, ``subprocess.Popen``, ``pty.spawn``, ``os.kill``...), changing resource limits;
- every socket operation (creating one included, so UDP ``sendmsg`` too), ``urllib``, ``webbrowser``;
- ``ctypes``, ``mmap`` of a file, ``sqlite3``/``dbm``, ``pickle`` class lookups, and ``gc``'s object walks
  (the way to reach the hook's own state);
- changing the file system: opening for writing, ``os.remove``/``rmdir``/``rename``/``mkdir``/``truncate``/
  ``chmod``/``chown``/``utime``/``symlink``/``link``, ``shutil``'s copies, moves and archives; environment
  variables (``os.putenv``/``unsetenv``).

What stays allowed, because it runs only trusted code: imports (their module code and ``.pyc`` loading),
``ast.parse`` (it compiles to a syntax tree only; ``ast.literal_eval`` uses it), the compiled templates of
``collections.namedtuple`` and ``dataclasses`` (their text is built from validated identifiers), and the
worker's own unpickling of the trusted caller's request. A stack frame of one of those functions is what makes
an event allowed, and frames cannot be forged by code that cannot compile or build code objects.

Code that does run (a scorer's own, or text a future scorer would evaluate despite the rules above) stays under
every other rule: it can compute and read files, nothing more; the caller trusts only the reward it replies.

With ``allow_evaluation`` (the operator accepted datasets whose scorer may evaluate its answer,
``ENVSCHED_ALLOW_EVALUATING_SCORERS=1``) the code rules are off and the rest holds.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from envsched.errors import EnvSchedError

__all__ = ["EvaluationBlocked", "arm", "armed"]


class EvaluationBlocked(EnvSchedError, RuntimeError):
    """The guard stopped a scorer from running code, starting a process, using the network or writing."""


_CODE_EVENTS = frozenset({"exec", "compile", "code.__new__", "function.__new__", "marshal.loads", "marshal.load"})
_BLOCKED_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "os.startfile", "os.putenv", "os.unsetenv", "subprocess.Popen", "pty.spawn", "signal.pthread_kill",
    "resource.setrlimit", "resource.prlimit", "sys.addaudithook",
    "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.truncate", "os.chmod", "os.chown", "os.chflags",
    "os.lchflags", "os.utime", "os.symlink", "os.link", "os.listxattr", "os.removexattr", "os.setxattr",
    "shutil.rmtree", "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.move",
    "shutil.chown", "shutil.make_archive", "shutil.unpack_archive",
    "webbrowser.open", "urllib.Request", "sqlite3.connect", "sqlite3.connect/handle", "dbm.open",
    "pickle.find_class", "winreg.CreateKey", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
})
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "http.client.", "ftplib.", "smtplib.", "imaplib.", "poplib.",
                     "nntplib.", "telnetlib.", "_winapi.", "msvcrt.")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_armed = False


def armed() -> bool:
    """Whether this process's guard is armed."""
    return _armed


def _trusted_code() -> tuple[frozenset[types.CodeType], frozenset[types.CodeType]]:
    """(code objects whose compile/exec is trusted, code objects allowed to compile to a syntax tree only)."""
    import ast
    import collections
    import dataclasses

    templates = [collections.namedtuple.__code__]
    for owner, attr in ((dataclasses, "_create_fn"), (getattr(dataclasses, "_FuncBuilder", None), "add_fns_to_class")):
        fn = getattr(owner, attr, None) if owner is not None else None
        if isinstance(fn, types.FunctionType):
            templates.append(fn.__code__)
    return frozenset(templates), frozenset({ast.parse.__code__})


def _make_hook(allow_evaluation: bool, unpicklers: frozenset[types.CodeType]) -> Callable[[str, tuple[Any, ...]], None]:
    templates, ast_only = _trusted_code()
    code_events = frozenset() if allow_evaluation else _CODE_EVENTS
    blocked, prefixes, write_flags = _BLOCKED_EVENTS, _BLOCKED_PREFIXES, _WRITE_FLAGS
    getframe = sys._getframe

    def codes(frame: Any) -> Iterable[types.CodeType]:
        while frame is not None:
            yield frame.f_code
            frame = frame.f_back

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in code_events:
            frame = getframe(1)  # the code that raised the event
            first = frame.f_code if frame is not None else None
            if (first in templates or (event == "compile" and first in ast_only)
                    or any(code.co_filename.startswith("<frozen importlib") for code in codes(frame))):
                return
            raise EvaluationBlocked(f"a scorer tried to run code that was not imported ({event})")
        if event == "open":
            mode = args[1] if len(args) > 1 else "r"
            flags = args[2] if len(args) > 2 else 0
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & write_flags):
                raise EvaluationBlocked("a scorer tried to open a file for writing")
        elif event == "object.__setattr__":
            if len(args) > 1 and args[1] == "__code__":
                raise EvaluationBlocked("a scorer tried to replace a function's code")
        elif event == "pickle.find_class":
            if not any(code in unpicklers for code in codes(getframe(1))):
                raise EvaluationBlocked("a scorer tried to unpickle")
        elif event == "mmap.__new__":
            if args and args[0] != -1:
                raise EvaluationBlocked("a scorer tried to map a file")
        elif event in blocked or event.startswith(prefixes):
            raise EvaluationBlocked(f"a scorer tried {event}")

    return hook


def arm(*, allow_evaluation: bool = False, unpicklers: Iterable[Callable[..., Any]] = ()) -> None:
    """Install the guard in this process, for good (a worker calls it once, after its setup).

    ``unpicklers``: functions of the worker that unpickle the trusted caller's requests (a ``pickle`` class
    lookup is allowed below them only). Calling it again does nothing."""
    global _armed
    if _armed:
        return
    codes = frozenset(fn.__code__ for fn in unpicklers)
    sys.addaudithook(_make_hook(allow_evaluation, codes))
    _armed = True
