"""The rollout child's side of :class:`~envsched.integrations.trl_async.EnvSchedAsyncGRPOTrainer`: TRL's rollout
loop drawing from the trainer's sampler, and the worker that runs it.

:class:`EnvSchedRolloutLoop` runs in the child process TRL spawns: it asks the trainer for every group's task
over the draw channel (:mod:`envsched.integrations._draw_server`) and announces each scored group with a
:class:`GroupHeader` on the sample queue. :class:`EnvSchedRolloutWorker` is TRL's ``AsyncRolloutWorker`` running
that loop. The trainer (:mod:`envsched.integrations.trl_async`) builds the worker, and TRL's OpenEnv harness
worker (:mod:`envsched.integrations.openenv_harness`) derives from both classes; both import them from here, so
neither module imports the other's child side.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop

from envsched.integrations._draw_server import connect_draw_channel

__all__ = ["DRAW_TIMEOUT_S", "EnvSchedRolloutLoop", "EnvSchedRolloutWorker", "GroupHeader"]

#: Seconds the child waits for the trainer to answer a draw request before failing (the trainer is gone).
DRAW_TIMEOUT_S = 300.0


@dataclass
class GroupHeader:
    """Sent by the child on the sample queue just before a scored group's rows."""

    group_id: int
    rewards: list[float | None]  # per rollout (conversation), the worker's summed reward; None if unscored
    costs: list[float]  # per rollout, completion tokens
    rows: int  # training rows that follow on the queue
    model_version: int
    enqueued_at: float | None = None


class EnvSchedRolloutLoop(_AsyncRolloutLoop):
    """TRL's rollout loop (runs in the spawned child) drawing its prompts from the trainer's task sampler and
    announcing each scored group with a :class:`GroupHeader`. Extra constructor argument: ``envsched_channel``,
    the ``(address, authkey)`` of the trainer's draw server (:mod:`envsched.integrations._draw_server`, a
    ``multiprocessing.connection`` on 127.0.0.1 with HMAC authentication; TRL pickles the loop's arguments,
    which rules out queues). Connecting has a deadline
    (:data:`~envsched.integrations._draw_server.CONNECT_TIMEOUT_S`): a trainer that does not answer is a
    ``DrawChannelError`` naming its address, not a hang."""

    def __init__(self, *, envsched_channel: tuple[Any, bytes], **kwargs: Any) -> None:
        address, authkey = envsched_channel
        self._es_conn = connect_draw_channel(address, authkey)
        self._es_tasks: dict[int, Any] = {}  # group id -> drawn task spec (sent on the harness path only)
        super().__init__(**kwargs)

    def _repeat_iterator(self) -> Iterator[tuple[int, dict[str, Any]]]:
        while True:
            t0 = time.perf_counter()
            self._es_conn.send(1)
            if not self._es_conn.poll(DRAW_TIMEOUT_S):
                raise RuntimeError(f"envsched: the trainer did not answer a draw request within "
                                   f"{DRAW_TIMEOUT_S:.0f}s")
            reply = self._es_conn.recv()
            # the round trip blocks this child's event loop: logged as envsched/draw_wait_s (mean per draw)
            rate = self._rates["envsched/draw_wait_s"]
            rate[0] += time.perf_counter() - t0
            rate[1] += 1
            if reply[0] != "ok":
                raise RuntimeError(f"envsched: drawing a task failed in the trainer: {reply[1]}")
            group_id, row = reply[1], reply[2]
            if len(reply) > 3:  # the harness path: the drawn task spec, for the session factory
                self._es_tasks[group_id] = reply[3]
            for _ in range(self.num_generations):
                yield group_id, row

    async def _score_group(self, group: Any) -> list[Any]:
        samples = await super()._score_group(group)
        rewards: list[float | None] = []
        i = 0
        for sequences in group.completions_sequences:
            r = samples[i].metrics.get("reward") if sequences else None
            rewards.append(None if r is None or not math.isfinite(float(r)) else float(r))
            i += len(sequences)
        header = GroupHeader(group_id=int(group.group_id), rewards=rewards,
                             costs=[float(len(c)) for c in group.completions_ids], rows=len(samples),
                             model_version=int(group.model_version), enqueued_at=time.time())
        while True:  # same back-pressure as TRL's own pushes
            try:
                self.rollout_buffer.put_nowait(header)
                break
            except queue.Full:
                await asyncio.sleep(0.1)
        return samples


class EnvSchedRolloutWorker(AsyncRolloutWorker):
    """TRL's rollout worker running :class:`EnvSchedRolloutLoop`; ``stop()`` drains the sample queue while the child
    exits (a child whose queue feeder still holds unread samples cannot exit, and TRL would wait 15 s and then
    terminate it). Drained groups stay unresolved: the sampler keeps them as outstanding."""

    _loop_cls = EnvSchedRolloutLoop

    def stop(self) -> None:
        done = threading.Event()

        def drain() -> None:
            while not done.is_set():
                with contextlib.suppress(queue.Empty, OSError, EOFError, ValueError):
                    self.rollout_buffer.get(timeout=0.1)

        t = threading.Thread(target=drain, name="envsched-drain", daemon=True)
        t.start()
        try:
            super().stop()
        finally:
            done.set()
            t.join(timeout=5)
