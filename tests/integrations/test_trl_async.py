"""A real TRL ``AsyncGRPOTrainer`` run on CPU drawing from an envsched sampler.

The real trainer and its real rollout worker (a spawned child process) generate against
:class:`~envsched.integrations.standin.StandInVLLMServer` (a stand-in for ``vllm serve``: the tiny test model
served with transformers over HTTP on 127.0.0.1), which holds some requests back (injected delays), so groups
finish late and out of order and some go stale. Run A trains 4 steps with zero-signal filtering. Run K, the same
run in another process (``async_grpo_run.py``), is killed with SIGKILL once it has written ``checkpoint-2``; run B
resumes K's checkpoint with a fresh trainer and sampler and must draw what the uninterrupted run A drew.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("aiohttp")

from trl.chat_template_utils import qwen3_chat_template  # noqa: E402
from trl.experimental.async_grpo import AsyncGRPOConfig  # noqa: E402

from envsched.integrations._rewards import RewardScale  # noqa: E402
from envsched.integrations.standin import StandInVLLMServer, StandInWeightTransfer, digit_share  # noqa: E402
from envsched.integrations.trl_async import (  # noqa: E402
    SAMPLER_STATE_FILE,
    EnvSchedAsyncGRPOTrainer,
    EnvSchedRolloutLoop,
    EnvSchedRolloutWorker,
    FeedbackQueue,
    GroupHeader,
    _TaskFeed,
    torch_tree_attention,
)
from envsched.samplers.simple import UniformSampler  # noqa: E402

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

RUN_SCRIPT = Path(__file__).with_name("async_grpo_run.py")
_spec = importlib.util.spec_from_file_location("envsched_tests_async_grpo_run", RUN_SCRIPT)
assert _spec is not None and _spec.loader is not None
run_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_mod)
G = run_mod.G
Recording = run_mod.Recording


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_llm):
    root = tmp_path_factory.mktemp("async_grpo")
    pool = run_mod.make_pool()
    model_dir = root / "model"
    tok = tiny_llm(pool, model_dir)
    tok.chat_template = qwen3_chat_template  # TRL's async worker renders chat prompts and parses responses
    tok.save_pretrained(model_dir)
    server = StandInVLLMServer(str(model_dir), delay=run_mod.delay).start()
    yield root, pool, str(model_dir), tok, server
    server.stop()


def _run(setup, out, resume=None):
    _root, pool, model_dir, tok, server = setup
    trainer, sampler = run_mod.make_trainer(pool, model_dir, tok, server, out)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, sampler


class _KilledRun:
    """Run K in its own process group; a watcher thread SIGKILLs the group (trainer and rollout child) as soon as
    checkpoint-2 is complete (the sampler file is the last one written). Runs while run A trains in-process."""

    def __init__(self, setup) -> None:
        root, _pool, model_dir, _tok, _server = setup
        self.out = root / "k"
        self.marker = self.out / "checkpoint-2" / SAMPLER_STATE_FILE
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
        self.proc = subprocess.Popen([sys.executable, str(RUN_SCRIPT), model_dir, str(self.out)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.error: str | None = None
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + 300  # a guard against a hang, not a speed target
        try:
            while not self.marker.exists():
                if self.proc.poll() is not None:
                    self.error = f"run K exited ({self.proc.returncode}) before checkpoint-2: " + \
                        self.proc.stderr.read().decode()[-3000:]
                    return
                if time.monotonic() > deadline:
                    self.error = "run K wrote no checkpoint-2 in 300 s"
                    return
                time.sleep(0.05)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)

    def checkpoint(self) -> Path:
        self.thread.join(timeout=330)
        self.proc.wait(timeout=30)
        self.proc.stderr.close()
        assert self.error is None, self.error
        assert self.proc.returncode == -signal.SIGKILL
        assert not (self.out / "checkpoint-4").exists(), "run K finished before it was killed"
        return self.out / "checkpoint-2"


@pytest.fixture(scope="module")
def runs(setup):
    root = setup[0]
    killed = _KilledRun(setup)
    a = _run(setup, root / "a")
    b = _run(setup, root / "b", resume=str(killed.checkpoint()))
    return a, b


def _accounting(trainer, sampler):
    """Every draw of this run (replays included) is updated, discarded or still unresolved, none twice; the
    sampler's outstanding dispatches are exactly the unresolved draws."""
    draws = trainer.envsched_draw_log
    drawn_ids = {g for g, _ in draws}
    assert len(drawn_ids) == len(draws), "a group id was issued twice"
    log = trainer.envsched_feedback_log
    ids = [e["group_id"] for e in log]
    assert len(ids) == len(set(ids)), "a group was resolved twice"
    assert set(ids) <= drawn_ids
    unresolved = trainer.unresolved_draws
    assert not set(ids) & set(unresolved), "a resolved group is still unresolved"
    assert Counter(k for _, k in draws) == Counter(e["task_id"] for e in log) + \
        Counter(k for g, k in unresolved.items() if g in drawn_ids)
    assert sampler.outstanding() == dict(Counter(unresolved.values()))
    assert [(e["outcome"], e["task_id"]) for e in log] == \
        [(op, k) for op, k in sampler.calls if op in ("update", "discard")]
    return ids


def test_late_out_of_order_feedback_reaches_sampler_once(runs):
    (ta, sa), _ = runs
    ids = _accounting(ta, sa)
    m = ta.envsched_metrics()
    assert m["groups_drawn"] == len([c for c in sa.calls if c[0] == "sample"]) == ta._es_feed.next_id
    assert set(ids) | set(ta.unresolved_draws) == set(range(ta._es_feed.next_id))
    assert ids != sorted(ids), "the delayed groups should have finished after later draws"
    assert m["groups_updated"] >= 8  # 4 steps x 2 groups trained at least
    assert sa.groups == m["groups_updated"] and sa.state_dict()["counters"]["discarded_groups"] == \
        m["groups_discarded_stale"]
    for e in ta.envsched_feedback_log:
        if e["outcome"] == "update":
            assert len(e["rewards"]) == G and all(1 <= c <= 6 for c in e["costs"])


def test_environment_reset_receives_the_drawn_task(runs, setup):
    """With an ``environment_factory``, every rollout's ``reset`` gets the task the sampler drew for its group."""
    (ta, _sa), _ = runs
    resets = Counter((setup[0] / "a" / "resets.txt").read_text().split())
    drawn = {k for _, k in ta.envsched_draw_log}
    assert resets and set(resets) <= drawn
    resolved = Counter(e["task_id"] for e in ta.envsched_feedback_log)
    assert all(resets[k] >= G * n for k, n in resolved.items())


def test_zero_signal_groups_update_the_sampler_but_skip_the_loss(runs, setup):
    (ta, _sa), _ = runs
    constant = {t["id"] for t in setup[1][:4]}
    updates = [e for e in ta.envsched_feedback_log if e["outcome"] == "update"]
    for e in updates:
        scored = [r for r in e["raw_rewards"] if r is not None]
        assert e["zero_signal_dropped"] == (max(scored) == min(scored))
        if e["task_id"] in constant:
            assert e["zero_signal_dropped"]
    dropped = {e["group_id"] for e in updates if e["zero_signal_dropped"]}
    assert not dropped & ta._trained_groups, "a zero-signal group reached the loss"
    m = ta.envsched_metrics()
    assert m["zero_signal_dropped"] == len(dropped)
    assert m["zero_signal_dropped_share"] == pytest.approx(len(dropped) / len(updates))


def test_sampler_metrics_reach_trl_logs(runs):
    (ta, sa), _ = runs
    logged = [h for h in ta.state.log_history if "envsched/groups" in h]
    assert len(logged) >= 4
    last = logged[-1]
    assert last["envsched/groups"] == sa.groups
    assert last["envsched/groups_updated"] == ta.envsched_metrics()["groups_updated"]
    assert "envsched/zero_signal_dropped_share" in last and "envsched/outstanding_groups" in last


def test_checkpoint_holds_sampler_state_and_unresolved_draws(runs, setup):
    state = json.loads((setup[0] / "a" / "checkpoint-2" / SAMPLER_STATE_FILE).read_text())
    assert state["format"] == "envsched.trl_async/1" and state["global_step"] == 2
    ids = [g for g, _ in state["unresolved"]]
    assert ids == sorted(ids) and all(0 <= g < state["next_id"] for g in ids)
    outstanding = Counter(k for _, k in state["unresolved"])
    assert state["sampler"]["outstanding"] == dict(outstanding)


def test_resume_continues_the_same_draws(runs, setup):
    (ta, _sa), (tb, sb) = runs
    state = json.loads((setup[0] / "k" / "checkpoint-2" / SAMPLER_STATE_FILE).read_text())
    log_b = tb.envsched_draw_log
    replayed = [(g, k) for g, k in log_b if g < state["next_id"]]
    assert replayed == [tuple(p) for p in state["unresolved"]][:len(replayed)]
    assert log_b[:len(replayed)] == replayed  # re-issued first, in draw order
    fresh = log_b[len(replayed):]
    assert fresh and all(g >= state["next_id"] for g, _ in fresh)
    a_by_id = dict(ta.envsched_draw_log)
    common = [(g, k) for g, k in fresh if g in a_by_id]
    assert len(common) >= 4
    assert all(a_by_id[g] == k for g, k in common), "the resumed run drew other tasks than the uninterrupted one"
    # the killed run had drawn what run A drew up to its checkpoint, too
    assert all(a_by_id[g] == k for g, k in replayed if g in a_by_id)
    _accounting(tb, sb)


def test_bad_arguments_are_refused(setup, tmp_path):
    _root, pool, model_dir, tok, server = setup
    args = AsyncGRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, max_steps=1,
                           vllm_server_base_url=server.url)
    with pytest.raises(TypeError, match="TaskSampler"):
        EnvSchedAsyncGRPOTrainer(model_dir, reward_funcs=[digit_share], args=args, processing_class=tok,
                                 task_sampler=object(), tasks=pool)
    with pytest.raises(ValueError, match="draw_batch"):
        EnvSchedAsyncGRPOTrainer(model_dir, reward_funcs=[digit_share], args=args, processing_class=tok,
                                 task_sampler=UniformSampler(pool), draw_batch=0)
    with pytest.raises(ValueError, match=r"draw_batch must be an integer >= 1, got True"):  # a bool is no count
        EnvSchedAsyncGRPOTrainer(model_dir, reward_funcs=[digit_share], args=args, processing_class=tok,
                                 task_sampler=UniformSampler(pool), draw_batch=True)
    with pytest.raises(ValueError, match=r"log_size must be an integer >= 0, got 2.0"):
        EnvSchedAsyncGRPOTrainer(model_dir, reward_funcs=[digit_share], args=args, processing_class=tok,
                                 task_sampler=UniformSampler(pool), log_size=2.0)
    args0 = AsyncGRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match="max_steps"):
        EnvSchedAsyncGRPOTrainer(model_dir, reward_funcs=[digit_share], args=args0, processing_class=tok,
                                 task_sampler=UniformSampler(pool))


class _OwnWorker(EnvSchedRolloutWorker):
    """A rollout worker of a trainer subclass's own (``rollout_worker_class``)."""


def test_the_trainer_builds_its_rollout_worker_class_from_trls_arguments(setup, tmp_path):
    """TRL builds its AsyncRolloutWorker; the trainer builds ``rollout_worker_class`` in its place from the same
    arguments plus the draw channel (no object changes class), and refuses a class that cannot draw."""
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

    _root, pool, model_dir, tok, server = setup
    args = AsyncGRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, max_steps=1, num_generations=G,
                           per_device_train_batch_size=G, queue_maxsize=7, max_completion_length=5,
                           vllm_server_base_url=server.url)

    def build(trainer_class):
        return trainer_class(model_dir, reward_funcs=[digit_share], args=args, processing_class=tok,
                             task_sampler=UniformSampler(pool), task_to_row=run_mod.row,
                             weight_transfer=StandInWeightTransfer(server))

    class Own(EnvSchedAsyncGRPOTrainer):
        rollout_worker_class = _OwnWorker

    trainer = build(Own)
    try:
        worker = trainer.rollout_worker
        assert type(worker) is _OwnWorker and worker._loop_cls is EnvSchedRolloutLoop
        kwargs = worker._loop_kwargs
        assert kwargs["envsched_channel"] == (trainer._es_channel.address, trainer._es_channel.authkey)
        # TRL's own arguments, as TRL's trainer passed them
        assert (kwargs["queue_maxsize"], kwargs["num_generations"], kwargs["max_tokens"]) == (7, G, 5)
        assert kwargs["vllm_server_url"] == server.url and kwargs["dataset_start_index"] == 0
        assert [r["task_id"] for r in kwargs["dataset"]] == [t["id"] for t in pool]
        assert worker.rollout_buffer._maxsize == 7
        assert trainer.rollout_queue.inner is worker.rollout_buffer  # the trainer reads the worker's queue
    finally:
        trainer._es_channel.close()
    default = build(EnvSchedAsyncGRPOTrainer)
    default._es_channel.close()
    assert type(default.rollout_worker) is EnvSchedRolloutWorker

    class Plain(EnvSchedAsyncGRPOTrainer):
        rollout_worker_class = AsyncRolloutWorker  # TRL's: no draw loop

    with pytest.raises(TypeError, match=r"Plain\.rollout_worker_class must be EnvSchedRolloutWorker or a subclass "
                                        r"of it, got <class '.*AsyncRolloutWorker'>"):
        build(Plain)


def test_torch_tree_attention_matches_plain_causal_attention():
    """One chain per sample (no shared prefix) is plain causal attention per sample."""
    torch.manual_seed(0)
    n, h, hk, d = 7, 4, 2, 8
    q, k, v = torch.randn(1, h, n, d), torch.randn(1, hk, n, d), torch.randn(1, hk, n, d)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    out, _ = torch_tree_attention(None, q, k, v, None, tree_kv_index=torch.arange(n), tree_cu_seqlens_q=cu,
                                  tree_cu_seqlens_k=cu, tree_max_seqlen_q=4, tree_max_seqlen_k=4)
    ref = []
    for a, b in ((0, 3), (3, 7)):
        kk = k[0, :, a:b].repeat_interleave(2, 0)
        vv = v[0, :, a:b].repeat_interleave(2, 0)
        ref.append(torch.nn.functional.scaled_dot_product_attention(q[0, :, a:b], kk, vv, is_causal=True))
    assert torch.allclose(out[0], torch.cat(ref, 1).transpose(0, 1), atol=1e-6)
    # a branch: segment 2 (tokens 5, 6) continues segment 1's path (tokens 0..2), not segment 1's sibling
    kv = torch.tensor([0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6])
    cq = torch.tensor([0, 3, 5, 7], dtype=torch.int32)
    ck = torch.tensor([0, 3, 8, 13], dtype=torch.int32)
    out, _ = torch_tree_attention(None, q, k, v, None, tree_kv_index=kv, tree_cu_seqlens_q=cq,
                                  tree_cu_seqlens_k=ck, tree_max_seqlen_q=3, tree_max_seqlen_k=5)
    path = [0, 1, 2, 5, 6]
    kk = k[0][:, path].repeat_interleave(2, 0)
    vv = v[0][:, path].repeat_interleave(2, 0)
    full = torch.nn.functional.scaled_dot_product_attention(q[0][:, path], kk, vv, is_causal=True)
    assert torch.allclose(out[0, 5:7], full[:, 3:5].transpose(0, 1), atol=1e-6)


def _sample_row(group_id, version):
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    ids = np.arange(4)
    return RolloutSample(prompt=[], completion=[], input_ids=ids, completion_mask=ids * 0 + 1,
                         old_log_probs=np.zeros(4, dtype=np.float32), advantage=0.0, model_version=version,
                         group_id=group_id, metrics={})


def test_feedback_queue_resolves_each_group_once_by_trl_staleness_rule(setup):
    """The queue logic without the trainer: a group with any row kept is updated, a group whose rows are all stale
    is discarded, a zero-signal group is updated and withheld, a group with no rows is updated at its header, and a
    header for a group that is not an unresolved draw is refused."""
    import queue as q

    pool = setup[1]
    sampler = Recording(pool, seed=0)
    tasks = {t["id"]: t for t in pool}
    feed = _TaskFeed(sampler, tasks, lambda k: {"prompt": [], "task_id": k}, RewardScale((0, 1)), True, 100,
                     draw_batch=2)
    draws = [feed.draw() for _ in range(5)]
    assert [g for g, _ in draws] == [0, 1, 2, 3, 4] and feed.counts["groups_drawn"] == 6  # 3 batches of 2
    version = {"v": 3}
    inner = q.Queue()
    fq = FeedbackQueue(inner, feed, lambda: version["v"], max_staleness=1)
    # group 2 (fresh, mixed rewards), group 0 (all rows stale), group 1 (one row stale, one kept),
    # group 3 (zero signal), group 4 (no rows)
    inner.put(GroupHeader(2, [0.0, 1.0], [3.0, 4.0], 2, 3))
    inner.put(_sample_row(2, 3))
    inner.put(_sample_row(2, 2))
    inner.put(GroupHeader(0, [0.5, 0.0], [1.0, 1.0], 2, 1))
    inner.put(_sample_row(0, 1))
    inner.put(_sample_row(0, 1))
    inner.put(GroupHeader(1, [0.2, 0.7], [2.0, 2.0], 2, 1))
    inner.put(_sample_row(1, 1))
    inner.put(_sample_row(1, 2))
    inner.put(GroupHeader(3, [0.5, 0.5], [2.0, 2.0], 2, 3))
    inner.put(_sample_row(3, 3))
    inner.put(_sample_row(3, 3))
    inner.put(GroupHeader(4, [None, None], [0.0, 0.0], 0, 3))
    got = []
    with pytest.raises(q.Empty):
        while True:
            got.append(fq.get(timeout=0.2))
    # stale rows still go to TRL (it drops and counts them); zero-signal rows do not
    assert [(r.group_id, r.model_version) for r in got] == [(2, 3), (2, 2), (0, 1), (0, 1), (1, 1), (1, 2)]
    outcomes = [(e["group_id"], e["outcome"]) for e in feed.feedback_log]
    assert outcomes == [(2, "update"), (0, "discard"), (1, "update"), (3, "update"), (4, "update")]
    assert [e["zero_signal_dropped"] for e in feed.feedback_log if e["outcome"] == "update"] == \
        [False, False, True, True]
    assert feed.counts["rows_stale"] == 3 and feed.counts["zero_signal_rows_dropped"] == 2
    assert list(feed.unresolved) == [5] and sampler.outstanding_groups == 1
    inner.put(GroupHeader(2, [0.0], [1.0], 1, 3))
    with pytest.raises(RuntimeError, match="not an unresolved draw"):
        fq.get(timeout=0.2)
    state = feed.state()
    assert state["unresolved"] == [[5, feed.unresolved[5]]] and state["next_id"] == 6


def test_changed_trl_hooks_are_refused_naming_the_version(monkeypatch):
    from trl.experimental.async_grpo.async_grpo_trainer import RolloutQueueDataset

    from envsched.integrations.trl_async import check_async_trl_hooks

    check_async_trl_hooks()  # the installed TRL passes

    def drops_nothing(self):
        yield self.queue.get(timeout=1)

    monkeypatch.setattr(RolloutQueueDataset, "__iter__", drops_nothing)
    with pytest.raises(RuntimeError, match=r"supports TRL 1\.16\.0.*staleness rule"):
        check_async_trl_hooks()


def test_bad_sampler_state_is_refused_and_changes_nothing(runs, tmp_path):
    (ta, sa), _ = runs
    with pytest.raises(FileNotFoundError, match=r"envsched_sampler\.json"):
        ta.load_sampler_state(str(tmp_path))
    before = (sa.state_dict(), ta.unresolved_draws, ta._es_feed.next_id)
    state = {"format": "envsched.trl_async/1", "sampler": sa.state_dict(), "unresolved": [[0, "no-such-task"]],
             "next_id": 1}
    (tmp_path / SAMPLER_STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(ValueError, match="no-such-task"):
        ta.load_sampler_state(str(tmp_path))
    state["unresolved"] = [[5, sa.tasks[0]["id"]]]  # an id the saved counter never issued
    (tmp_path / SAMPLER_STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(ValueError, match="next_id"):
        ta.load_sampler_state(str(tmp_path))
    (tmp_path / SAMPLER_STATE_FILE).write_text(json.dumps({"format": "envsched.trl/1"}))
    with pytest.raises(ValueError, match="unsupported format"):
        ta.load_sampler_state(str(tmp_path))
    assert (sa.state_dict(), ta.unresolved_draws, ta._es_feed.next_id) == before


def test_standin_server_speaks_the_routes_trl_uses(setup):
    import urllib.error
    import urllib.request

    server = setup[4]

    def call(path, payload=None):
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(server.url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    assert call("/health") == {}
    assert call("/v1/models")["data"][0]["max_model_len"] == 256
    req = {"model": "m", "prompt": [5, 6, 7], "max_tokens": 5, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
           "repetition_penalty": 1.0, "n": 1, "return_token_ids": True, "logprobs": 0, "seed": 11}
    first, again = call("/v1/completions", req), call("/v1/completions", req)
    choice = first["choices"][0]
    assert 1 <= len(choice["token_ids"]) <= 5 and choice == again["choices"][0]  # seeded
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
    assert all(lp <= 0.0 for lp in choice["logprobs"]["token_logprobs"])
    with pytest.raises(urllib.error.HTTPError) as err:
        call("/v1/completions", {**req, "repetition_penalty": 1.2})
    assert err.value.code == 400


# ---------------------------------------------------------------------------------------------- the draw server
# Any local process can connect to the trainer's draw server before (or while) the rollout child does. Each
# attack below is made with real sockets against a real trainer's server; the legitimate child (the stdlib
# client with the channel's key, as TRL's spawned child holds it) must then be served a real draw.
def _connect_and_close(address):
    socket.create_connection(address).close()
    return []


def _garbage(address):
    s = socket.create_connection(address)
    s.sendall(b"\x00\x00\x00\x10GET / HTTP/1.1\r\n\r\n" + bytes(range(256)))
    return [s]


def _silent(address):
    return [socket.create_connection(address) for _ in range(3)]  # connected, never says a word


def _wrong_key(address):
    from multiprocessing.connection import AuthenticationError, Client

    refused: list[bool] = []

    def attempt() -> None:
        try:
            Client(address, authkey=b"not the key" * 3)
        except AuthenticationError:
            refused.append(True)

    t = threading.Thread(target=attempt, daemon=True)  # the stdlib client has no deadline of its own
    t.start()
    t.join(20)
    assert refused == [True], "the wrong key was not refused"
    return []


@pytest.fixture(scope="module")
def idle_trainer(setup, tmp_path_factory):
    _root, pool, model_dir, tok, server = setup
    trainer, _sampler = run_mod.make_trainer(pool, model_dir, tok, server, tmp_path_factory.mktemp("idle"))
    return trainer


@pytest.mark.parametrize("attack", [_connect_and_close, _garbage, _silent, _wrong_key],
                         ids=["connect_and_close", "garbage", "silent", "wrong_key"])
def test_draw_server_keeps_serving_the_child_after_a_hostile_connection(idle_trainer, attack):
    from multiprocessing.connection import Client

    trainer = idle_trainer
    address, authkey = trainer.rollout_worker._loop_kwargs["envsched_channel"]
    trainer._es_stop.clear()
    serving = threading.Thread(target=trainer._es_serve, daemon=True)
    serving.start()
    held = attack(address)
    result: dict = {}

    def child() -> None:
        try:
            conn = Client(address, authkey=authkey)
            conn.send(1)
            result["reply"] = conn.recv() if conn.poll(30) else "no reply"
            conn.close()
        except Exception as exc:  # reported below
            result["error"] = repr(exc)

    drawn_before = len(trainer.envsched_draw_log)
    worker = threading.Thread(target=child, daemon=True)
    worker.start()
    worker.join(20)  # a guard against a hang: served in milliseconds
    try:
        assert not worker.is_alive(), f"the child was not served after {attack.__name__}: the draw server stalled"
        assert "error" not in result, result
        status, group_id, row = result["reply"][:3]
        assert status == "ok" and len(trainer.envsched_draw_log) == drawn_before + 1
        assert trainer.envsched_draw_log[-1] == (group_id, row["task_id"])  # the draw the trainer recorded
        assert serving.is_alive(), "the serving thread ended"
    finally:
        trainer._es_stop.set()
        serving.join(10)
        for s in held:
            s.close()
    assert not serving.is_alive()


def test_rollout_child_connect_has_a_deadline_and_a_clear_error(monkeypatch):
    from envsched.integrations import _draw_server
    from envsched.integrations._draw_server import DrawChannelError

    monkeypatch.setattr(_draw_server, "CONNECT_TIMEOUT_S", 1.0)
    mute = socket.create_server(("127.0.0.1", 0))  # accepts TCP connections (the backlog), never authenticates
    outcome: dict = {}

    def construct(address) -> None:
        try:
            EnvSchedRolloutLoop(envsched_channel=(address, b"k" * 32))
        except Exception as exc:  # checked below
            outcome["error"] = exc

    try:
        t = threading.Thread(target=construct, args=(mute.getsockname(),), daemon=True)
        t0 = time.monotonic()
        t.start()
        t.join(30)  # a guard against a hang
        assert not t.is_alive(), "the child's connect has no deadline"
        assert time.monotonic() - t0 < 10
        assert isinstance(outcome.get("error"), DrawChannelError)
        assert "did not complete the handshake within 1 s" in str(outcome["error"])
        assert f"127.0.0.1:{mute.getsockname()[1]}" in str(outcome["error"])
    finally:
        mute.close()
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    with pytest.raises(DrawChannelError, match=f"cannot connect to the trainer's draw server at 127.0.0.1:{port}"):
        EnvSchedRolloutLoop(envsched_channel=(("127.0.0.1", port), b"k" * 32))
