"""Run by test_kill.py in a child process (not collected by pytest).

    python _kill_worker.py STORE ACKS KILLS SEED

Forks a worker that resumes a durable sampler from STORE and works on it, checkpointing SQLite's WAL after
every event; SIGKILLs it at a random instant -- every other time right after the worker announced a
checkpoint, so that many kills land inside one -- and repeats KILLS times. Every acknowledged call is
appended to ACKS. A worker that cannot resume the store prints why and the supervisor stops.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

from envsched.pool import TaskPool
from envsched.samplers import UniformSampler
from envsched.store import DurableSampler

SNAPSHOT_EVERY = 3


def make_sampler() -> UniformSampler:
    # a few hundred tasks: the snapshots span many pages, so checkpoints take long enough to be hit
    pool = TaskPool([{"id": f"task-{i:04d}", "env": f"env-{i % 5}"} for i in range(600)])
    return UniformSampler(pool, seed=11)


def worker(store: str, acks: str, signal_fd: int) -> None:
    d = DurableSampler(make_sampler(), store, snapshot_every=SNAPSHOT_EVERY)
    conn = d.store._backend.conn()
    out = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(out, f"start {d.seq}\n".encode())
    while True:
        outstanding = d.sampler.outstanding()
        if outstanding:
            key = sorted(outstanding)[0]
            d.update(key, [1.0, 0.0, float(d.seq % 2)])
            os.write(out, f"ack {d.seq} update {key}\n".encode())
        else:
            keys = [t["id"] for t in d.sample(4)]
            os.write(out, f"ack {d.seq} sample {','.join(keys)}\n".encode())
        os.write(signal_fd, b"C")
        os.write(out, b"checkpoint\n")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        os.write(out, b"checkpointed\n")


def main(store: str, acks: str, kills: int, seed: int) -> int:
    rng = random.Random(seed)
    in_checkpoint = 0
    open(acks, "ab").close()
    for k in range(kills):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(r)
            try:
                worker(store, acks, w)
            except BaseException as exc:
                sys.stderr.write(f"worker failed to run: {type(exc).__name__}: {exc}\n")
                sys.stderr.flush()
                os._exit(3)
            os._exit(0)
        os.close(w)
        if k % 2:  # right after a random checkpoint started
            want = rng.randint(1, 12)
            got = 0
            while got < want:
                chunk = os.read(r, 1)
                if not chunk:
                    break
                got += 1
            time.sleep(rng.uniform(0, 0.002))
        else:  # at a random instant
            time.sleep(rng.uniform(0.02, 0.25))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(r)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            print(f"worker {k} was not killed: it ended with status {status}")
            return 1
        with open(acks, "rb") as fh:
            tail = fh.read()[-40:].split(b"\n")
        if tail[-1] == b"checkpoint" or tail[-2:] == [b"checkpoint", b""]:
            in_checkpoint += 1
    print(f"killed {kills} in_checkpoint {in_checkpoint}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
