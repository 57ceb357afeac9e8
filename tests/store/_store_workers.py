"""Helpers run in child processes by the crash and concurrency tests (not collected by pytest).

    python _store_workers.py crash STORE ACKS KILLS SEED [PREFIX]  # supervisor: fork a worker, SIGKILL it, repeat
    python _store_workers.py writer STORE PREFIX ACKS WORKER ROUNDS WRITERS  # one of many concurrent writers
    python _store_workers.py opener STORE START PREFIX [PREFIX ...]  # open fresh stores at the same instant
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
import time

from envsched.pool import TaskPool
from envsched.samplers import CurriculumSampler
from envsched.store import DurableSampler, HistoryStore

GROUP_SIZE = 4
SNAPSHOT_EVERY = 7


def make_pool() -> TaskPool:
    return TaskPool([{"id": f"task-{i:02d}", "env": f"env-{i % 4}", "difficulty": i % 5} for i in range(24)])


def make_sampler(pool: TaskPool | None = None) -> CurriculumSampler:
    return CurriculumSampler(pool or make_pool(), group_size=GROUP_SIZE, seed=7)


def rewards_for(key: str, groups: int) -> list[float | None]:
    """Deterministic rewards of the ``groups``-th reported group of ``key`` (some unscored)."""
    h = hashlib.sha256(f"{key}/{groups}".encode()).digest()
    out: list[float | None] = []
    for b in h[:GROUP_SIZE]:
        out.append(None if b % 11 == 0 else float(b % 2))
    return out


def step(sampler: DurableSampler) -> tuple[str, str]:
    """One deterministic step of the workload, a function of the sampler's state only: report the oldest
    outstanding group if any (discarding every fifth), else draw a batch of 3."""
    out = sampler.sampler.outstanding()
    if out:
        key = sorted(out)[0]
        groups = sampler.sampler.groups
        done = groups + int(sampler.sampler.metrics()["discarded_groups"])
        if done % 6 == 5:
            sampler.discard(key)
            return "discard", key
        sampler.update(key, rewards_for(key, groups), [1.0] * GROUP_SIZE)
        return "update", key
    tasks = sampler.sample(3)
    return "sample", ",".join(t["id"] for t in tasks)


def _worker(store_path: str, ack_path: str, prefix: str, snap_fd: int) -> None:
    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    store = HistoryStore(store_path, table_prefix=prefix)
    real_write_snapshot = store.write_snapshot
    snapshots = [0]

    def write_snapshot(tx: object, seq: int, digest: str, state: dict, **kwargs: object) -> None:
        # announce the snapshot save (inside the transaction that logs the event), so that the supervisor can
        # kill the worker while it writes the snapshot; a "snap" line is not an acknowledgement
        os.write(fd, f"snap {seq}\n".encode())
        os.write(snap_fd, b"S")
        real_write_snapshot(tx, seq, digest, state, **kwargs)  # type: ignore[arg-type]
        snapshots[0] += 1
        if snapshots[0] == _AIM["at_snapshot"]:
            # an aimed kill: the snapshot row is written, the transaction not yet committed; wait here so that
            # the supervisor's kill lands inside the save however loaded the machine is
            os.write(snap_fd, b"W")
            time.sleep(30.0)

    store.write_snapshot = write_snapshot  # type: ignore[method-assign]
    sampler = DurableSampler(make_sampler(), store, snapshot_every=SNAPSHOT_EVERY)
    os.write(fd, f"start {sampler.seq}\n".encode())
    while True:
        kind, what = step(sampler)
        # acknowledged: the call returned, so its event is committed; record its number
        os.write(fd, f"ack {sampler.seq} {kind} {what}\n".encode())


def _starts(ack_path: str) -> int:
    return _count(ack_path, "start ")


def _count(ack_path: str, prefix: str) -> int:
    try:
        with open(ack_path, encoding="utf-8") as fh:
            return sum(1 for line in fh if line.startswith(prefix))
    except FileNotFoundError:
        return 0


def _last_line(ack_path: str) -> bytes:
    with open(ack_path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(ack_path) - 200))
        lines = [x for x in fh.read().split(b"\n") if x]
    return lines[-1] if lines else b""


#: set by the supervisor before each fork: the n-th snapshot save the worker waits in to be killed (0: none)
_AIM = {"at_snapshot": 0}


def crash(store_path: str, ack_path: str, kills: int, seed: int, prefix: str = "envsched") -> None:
    """Fork a worker and SIGKILL it at a random point, ``kills`` times. A third of the kills land right after
    the worker wrote its n-th snapshot row (n from 1 to 3; the worker then waits, inside the transaction that
    writes the snapshot, to be killed);
    of the others, a quarter land at a random time from the fork (often while the worker opens or rebuilds
    the store) and the rest at a random time after the worker reported that it is running and had three calls
    acknowledged (so the run makes progress however loaded the machine is). Prints the kills and how many
    landed inside a snapshot save (the worker's last word was "snap")."""
    rng = random.Random(seed)
    killed = in_snapshot = 0
    open(ack_path, "ab").close()
    for k in range(kills):
        started, acked = _starts(ack_path), _count(ack_path, "ack ")
        r, w = os.pipe()
        # read by the forked worker's snapshot hook: the n-th snapshot save to wait in (0: none)
        _AIM["at_snapshot"] = rng.randint(1, 3) if k % 3 == 2 else 0
        pid = os.fork()
        if pid == 0:  # child: run the sampler until killed
            os.close(r)
            try:
                _worker(store_path, ack_path, prefix, w)
            finally:
                os._exit(3)
        os.close(w)
        if _AIM["at_snapshot"]:  # inside a snapshot save: after the worker's n-th snapshot row, before its commit
            while (byte := os.read(r, 1)) and byte != b"W":
                pass
            time.sleep(rng.uniform(0.0, 0.003))
        elif rng.random() < 0.25:
            time.sleep(rng.uniform(0.0, 0.05))
        else:
            deadline = time.time() + 20
            # running, and a few calls acknowledged: the run makes progress however loaded the machine is
            while (_starts(ack_path) == started or _count(ack_path, "ack ") < acked + 3) and time.time() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(r)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            killed += 1
            in_snapshot += _last_line(ack_path).startswith(b"snap ")
        else:
            print(f"worker {pid} ended with status {status} before it was killed", flush=True)
    print(f"killed {killed} in_snapshot {in_snapshot}", flush=True)


def writer(store: str, prefix: str, ack_path: str, worker: int, rounds: int, writers: int) -> None:
    sampler = DurableSampler(make_sampler(), HistoryStore(store, table_prefix=prefix), snapshot_every=SNAPSHOT_EVERY)
    # barrier: start together so that the writers really run concurrently
    barrier = f"{ack_path}.ready"
    with open(barrier, "a", encoding="utf-8") as fh:
        fh.write(f"{worker}\n")
    deadline = time.time() + 120
    while time.time() < deadline:
        with open(barrier, encoding="utf-8") as fh:
            if len(fh.read().split()) >= writers:
                break
        time.sleep(0.01)
    rng = random.Random(worker)
    with open(ack_path, "a", encoding="utf-8") as fh:
        for r in range(rounds):
            time.sleep(rng.uniform(0.0, 0.005))  # give the others a chance at the lock between rounds
            tasks = sampler.sample(2)
            for t in tasks:
                rewards = rewards_for(t["id"], worker * 1000 + r)
                sampler.update(t, rewards)
                fh.write(f"{worker} {sampler.seq} {t['id']} {json.dumps(rewards)}\n")
                fh.flush()
    sampler.close()


def opener(store: str, prefixes: list[str]) -> None:
    """Round ``r`` opens a sampler on the (not yet created) store ``prefixes[r]`` at ``start + r * 0.5`` s,
    the instant every other opener does, and prints the id of the store it joined. ``start`` is read from
    stdin after this process has printed ``ready`` (imports done, the first round's handle made): the parent
    sends it once every opener is ready."""
    start = 0.0
    for r, prefix in enumerate(prefixes):
        target = store.replace("{prefix}", prefix)
        handle = HistoryStore(target, table_prefix=prefix)
        if r == 0:
            print("ready", flush=True)
            start = float(sys.stdin.readline())
        while time.time() < start + 0.5 * r:
            time.sleep(0.0005)
        sampler = DurableSampler(make_sampler(), handle, snapshot_every=SNAPSHOT_EVERY)
        print(prefix, sampler.store.header()["store_id"], flush=True)
        sampler.close()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "crash":
        crash(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:7])
    elif mode == "writer":
        writer(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))
    elif mode == "opener":
        opener(sys.argv[2], sys.argv[3:])
    else:
        raise SystemExit(f"unknown mode {mode}")
