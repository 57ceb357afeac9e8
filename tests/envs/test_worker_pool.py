"""The bounded workers start from a daemonic process (TRL's asynchronous rollout worker is one, and it scores
answers there) and never outlive the process that started them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

_DAEMONIC_SCORING = """
import multiprocessing as mp, sys

def child(queue):
    from envsched.envs.reasoning_gym import build_reasoning_gym_pool, regenerate_item, score_task_answer
    from envsched.envs.safe_scoring import _ScorerWorker

    task = next(iter(build_reasoning_gym_pool(["chain_sum"], tasks_per_dataset=2)))
    reference = str(regenerate_item(task)["answer"])
    queue.put([score_task_answer(task, reference), score_task_answer(task, "nan"), len(_ScorerWorker.idle),
               mp.current_process().daemon])

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,), daemon=True)
    proc.start()
    print(queue.get(timeout=240))
    proc.join(30)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_daemonic_process_scores_through_the_bounded_worker(method: str, tmp_path: Path) -> None:
    """multiprocessing refuses to start a process from a daemonic one; the worker starts anyway, the answer is
    scored in it (right 1.0, "nan" 0.0) and the daemonic process keeps its daemon mark."""
    import subprocess
    import sys

    script = tmp_path / "daemonic_scoring.py"
    script.write_text(_DAEMONIC_SCORING)
    out = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=300,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "[1.0, 0.0, 1, True]", out


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped (a container's init may not reap)."""
    status = Path(f"/proc/{pid}/status")
    try:
        text = status.read_text()
    except OSError:
        return True
    return "\nState:\tZ" in text or "\nState:\tX" in text


_SCORE_THEN_WAIT = """
import sys, time
from envsched.envs.reasoning_gym import build_reasoning_gym_pool, regenerate_item, score_task_answer
from envsched.envs.safe_scoring import _ScorerWorker

task = next(iter(build_reasoning_gym_pool(["chain_sum"], tasks_per_dataset=2)))
assert score_task_answer(task, str(regenerate_item(task)["answer"])) == 1.0
print(" ".join(str(w.proc.pid) for w in _ScorerWorker.idle), flush=True)
time.sleep(120)  # until the test kills it
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_worker_stops_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """SIGKILL gives the parent no chance to stop its workers, and each worker holds a copy of the parent's end
    of its pipe, so no EOF ever comes: the worker notices that its parent is gone and exits instead of waiting
    forever."""
    import subprocess
    import sys

    script = tmp_path / "score_then_wait.py"
    script.write_text(_SCORE_THEN_WAIT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in proc.stdout.readline().split()]  # type: ignore[union-attr]
        assert workers, "the answer was not scored in a worker"
        assert not any(_gone(pid) for pid in workers)
    finally:
        proc.kill()
        proc.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(_gone(pid) for pid in workers):
        time.sleep(0.2)
    assert all(_gone(pid) for pid in workers), "a scorer worker outlived the process that started it"


_FORKED_POOL = """
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from envsched.envs.reasoning_gym import build_reasoning_gym_pool, regenerate_item, score_task_answer
from envsched.envs.safe_scoring import _ScorerWorker

task = next(iter(build_reasoning_gym_pool(["chain_sum"], tasks_per_dataset=2)))
reference = str(regenerate_item(task)["answer"])

def score(_):
    seen = [w.proc.pid for w in _ScorerWorker.idle]
    return seen, score_task_answer(task, reference)

if __name__ == "__main__":
    assert score_task_answer(task, reference) == 1.0 and _ScorerWorker.idle  # this process has an idle worker
    mine = {w.proc.pid for w in _ScorerWorker.idle}
    with ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as ex:
        results = list(ex.map(score, range(4)))
    print([value for _, value in results], any(pid in mine for seen, _ in results for pid in seen))
"""


def test_a_forked_child_starts_its_own_workers(tmp_path: Path) -> None:
    """A process forked while its parent holds idle workers (the benchmark's process pool) inherits none of them:
    they are the parent's, and multiprocessing refuses to even ask whether they are alive."""
    import subprocess
    import sys

    script = tmp_path / "forked_pool.py"
    script.write_text(_FORKED_POOL)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.strip().splitlines()[-1] == "[1.0, 1.0, 1.0, 1.0] False", out


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="reads /proc")
def test_a_worker_holds_no_socket_of_its_parent_but_its_pipe() -> None:
    """A server's listening socket open when a scorer worker is forked is closed in the worker: once the server
    closes it, the port is free again (an idle worker kept it bound, so a stopped OpenEnv server could not be
    started again on its port, and clients connecting meanwhile were queued instead of refused)."""
    import os
    import socket

    from envsched.envs.reasoning_gym import build_reasoning_gym_pool, regenerate_item, score_task_answer
    from envsched.envs.safe_scoring import _ScorerWorker

    _ScorerWorker.clear_idle()  # the next score forks a fresh worker, while the socket below is open
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        task = next(iter(build_reasoning_gym_pool(["chain_sum"], tasks_per_dataset=2)))
        assert score_task_answer(task, str(regenerate_item(task)["answer"])) == 1.0
        (worker,) = _ScorerWorker.idle
        sockets = [fd for fd in os.listdir(f"/proc/{worker.proc.pid}/fd")
                   if os.readlink(f"/proc/{worker.proc.pid}/fd/{fd}").startswith("socket:")]
        assert len(sockets) == 1  # its pipe
    finally:
        listener.close()
    again = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        again.bind(("127.0.0.1", port))  # refused with EADDRINUSE while the worker held the listener
    finally:
        again.close()
        _ScorerWorker.clear_idle()


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="reads /proc")
def test_a_released_socket_number_is_not_reused_under_a_stale_socket_object() -> None:
    """The inherited sockets are pointed at /dev/null, not closed: a socket object the child inherited (here one
    kept alive by a reference cycle until a collection) closes its number when collected, and that number must
    not be a file the worker opened since."""
    import gc
    import os
    import socket

    from envsched.envs._worker_pool import close_inherited_sockets

    gc.disable()
    try:
        holder: list = []
        holder.append(holder)
        holder.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        del holder
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: release, open a file, collect, read it
            status = 1
            try:
                close_inherited_sockets(write)
                with open("/proc/self/status", encoding="ascii") as fh:
                    gc.collect()
                    status = 0 if fh.read().startswith("Name:") else 2
            finally:
                os.write(write, bytes([status]))
                os._exit(0)
        os.close(write)
        assert os.read(read, 1) == b"\x00"
        os.close(read)
        os.waitpid(pid, 0)
    finally:
        gc.enable()
        gc.collect()
